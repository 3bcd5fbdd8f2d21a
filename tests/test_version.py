"""A version described (index_info, sizes) and opened (load, open_current): its segments
checked against the manifest, pinned together, and reused by the next version."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from corpus_helpers import write_corpus

from flowsearch.encode.encoder import Encoder
from flowsearch.errors import IndexDamaged
from flowsearch.search.version import Opened, index_info, load, open_current, sizes
from flowsearch.storage import manifest as mf
from flowsearch.writes.build import build_index
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import add_to_index


@pytest.fixture(scope="module")
def encoder(model_dir):
    return Encoder(str(model_dir))


@pytest.fixture(scope="module")
def index(tmp_path_factory, model_dir):
    """60 rows in one segment (d1, d2 deleted), then 5 more in a second."""
    tmp = tmp_path_factory.mktemp("version")
    out = tmp / "idx"
    build_index(write_corpus(tmp / "c.parquet", n=60), out, model=str(model_dir),
                calibration="none")  # fmt: skip
    delete(out, ["d1", "d2"])
    add_to_index(out, write_corpus(tmp / "a.parquet", n=5, id_prefix="a", seed=1))
    return out


def test_load_pins_every_segment_of_the_current_version(index, encoder):
    m = mf.read(index)
    v = load(index, m, Opened(), verify_all=True, encoder=encoder)
    assert v.manifest == m and v.space.encoder is encoder and v.n_rows == m.n_rows == 65
    assert [s.ann.ntotal for s in v.segments] == [60, 5] and v.offsets.tolist() == [0, 60, 65]
    assert [s.record.name for s in v.segments] == [s.name for s in m.segments]
    assert np.flatnonzero(v.deleted[0]).tolist() == [1, 2] and v.deleted[1] is None
    assert v.lexical is not None and v.lexical.n_rows == 65 and v.lexical.n_live == 63
    assert v.verified.history_records == 3  # verify_all: every checksum and the log
    seg, local = v.locate(np.array([0, 59, 60, 64]))
    assert seg.tolist() == [0, 0, 1, 1] and local.tolist() == [0, 59, 0, 4]
    split = v.split(np.array([2, 59, 61, 64]))
    assert [s.tolist() for s in split] == [[2, 59], [1, 4]]
    assert v.split(None) == [None, None]
    assert [r["id"] for r in v.segments[1].reader.records([0, 4])] == ["a0", "a4"]


def test_a_versions_filter_gives_global_rows(index, encoder):
    from flowsearch.search.searcher import Searcher

    s = Searcher.open(index, encoder=encoder)
    where = "id IN ('d3', 'd4', 'a1', 'd1')"
    rows = s.version.metadata_filter(s._backend.filter_database()).rows(where)  # what a search uses
    assert rows is not None and rows.tolist() == [1, 3, 4, 61]  # across both segments
    for mode in ("dense", "lexical", "hybrid"):  # d1 matches but is deleted: never returned
        hits = s.search("the cat a1 d3 d4", k=10, where=where, mode=mode)
        assert {h.id for h in hits} <= {"d3", "d4", "a1"}
    assert {h.id for h in s.search("the cat", k=10, where=where, mode="dense")} == {
        "d3",
        "d4",
        "a1",
    }


def test_the_next_version_reuses_what_is_unchanged(index, encoder, tmp_path):
    copy = shutil.copytree(index, tmp_path / "idx")
    opened = Opened()
    v1 = load(copy, mf.read(copy), opened, encoder=encoder)
    delete(copy, ["a0"])  # a new deletion file for the second segment only
    v2 = load(copy, mf.read(copy), opened, encoder=encoder)
    assert v2.segments[0] is v1.segments[0] and v2.segments[1] is v1.segments[1]
    assert v2.deleted[0] is v1.deleted[0]  # same deletion file: same mask
    assert v1.deleted[1] is None and np.flatnonzero(v2.deleted[1]).tolist() == [0]
    assert v2.space is v1.space  # the calibrator and encoder are not loaded again
    assert v2.verified.n_files < v1.verified.n_files  # only what it had not seen
    assert opened.keep_only(v2.manifest) == []
    from flowsearch.writes.compact import compact

    compact(copy, full=True)
    v3 = load(copy, mf.read(copy), opened, encoder=encoder)
    gone = opened.keep_only(v3.manifest)
    assert {id(r) for r in gone} == {id(r) for r in v1.segments}
    assert len(v3.segments) == 1 and v3.segments[0] not in v1.segments
    assert v3.n_rows == 62 and v3.deleted == [None]


def test_a_vector_index_that_disagrees_with_the_manifest_is_refused(index, encoder):
    m = mf.read(index)
    seg = m.segments[0]
    wrong = seg.model_copy(
        update={"n_rows": 61, "parts": (seg.parts[0].model_copy(update={"n_rows": 61}),)}
    )
    bad = m.model_copy(update={"segments": (wrong, *m.segments[1:])})
    with pytest.raises(
        IndexDamaged, match="holds 60 rows of dim 32, the manifest says 61 of dim 32"
    ):
        load(index, bad, Opened(), encoder=encoder)
    with pytest.raises(IndexDamaged, match="the manifest says 60 of dim 31"):
        load(index, m.model_copy(update={"dim": 31}), Opened(), encoder=encoder)


def test_open_current_retries_when_a_write_removed_the_files_meanwhile(index, tmp_path):
    copy = shutil.copytree(index, tmp_path / "idx")
    seen = []

    def opener(manifest):
        seen.append(manifest.version)
        if len(seen) == 1:  # a writer publishes between reading the manifest and opening
            delete(copy, ["a2"])
            raise FileNotFoundError("segments/s000001/rows-00000.parquet")
        return manifest.version

    assert open_current(copy, opener) == 4 and seen == [3, 4]

    def always_missing(manifest):
        raise FileNotFoundError("gone for good")

    with pytest.raises(IndexDamaged, match="index file missing .*gone for good"):
        open_current(copy, always_missing)


def test_sizes_and_info_describe_the_version_without_loading_a_model(index):
    m = mf.read(index)
    got = sizes(index, m)
    seg_bytes = sum(r.bytes for s in m.segments for r in s.files.values())
    cal_bytes = sum(r.bytes for r in m.calibration.files.values())
    assert got == {"segments": seg_bytes, "calibrator": cal_bytes, "total": seg_bytes + cal_bytes}
    info = index_info(index)
    assert info.manifest == m and info.bytes == got and info.path == str(index.resolve())
    doc = info.to_dict()
    assert (doc["n_live"], doc["n_rows"], doc["n_deleted"]) == (63, 65, 2)
    assert doc["verified"]["not_hashed"] == [] and doc["version"] == 3
    assert [s["name"] for s in doc["segments"]] == ["s000001", "s000002"]
    assert doc["schema"][0]["name"] == "topic" and "checksum" not in doc
