"""The manifest: typed round trip, legacy formats (1 and 2) read and converted, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowsearch.errors import FlowsearchError
from flowsearch.storage import manifest as mf

ASSETS = Path(__file__).parent / "assets"


def _segment(**over):
    seg = {
        "name": "s000001",
        "dir": "segments/s000001",
        "n_rows": 3,
        "parts": [{"path": "rows-00000.parquet", "n_rows": 3}],
        "ann": {"path": "ann.faiss", "factory": "Flat"},
        "files": {"ann.faiss": {"bytes": 1, "sha256": "0" * 64}},
    }
    seg.update(over)
    return seg


def _minimal(**over):
    raw = {
        "format": mf.FORMAT,
        "format_version": mf.FORMAT_VERSION,
        "version": 2,
        "encoder": {"model": "m", "revision": "r", "pooling": "mean", "max_length": 8, "dim": 4},
        "dim": 4,
        "calibration": {"name": "none", "calibrator": "none", "space": "encoder"},
        "columns": {"text": "text", "id": "id"},
        "segments": [_segment()],
    }
    raw.update(over)
    return raw


def _write(folder: Path, raw: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    raw = dict(raw, checksum=mf.checksum(raw))
    (folder / mf.MANIFEST_NAME).write_text(json.dumps(raw))


def test_round_trip_is_identity(tmp_path):
    m = mf.from_json(_minimal())
    enc = m.encoder.model_copy(update={"options": {"backend": "onnx", "quantize": "int8"}})
    m = m.model_copy(update={"encoder": enc})
    _write(tmp_path, m.to_json_dict())
    assert mf.is_index_dir(tmp_path)
    back = mf.read(tmp_path)
    assert back == m
    assert back.encoder.identity()["backend"] == "onnx"
    assert back.n_rows == 3 and back.n_live == 3 and back.segments[0].n_live == 3


def test_the_json_schema_names_every_part():
    schema = mf.Manifest.model_json_schema(by_alias=True)
    assert {"segments", "schema", "calibration", "encoder"} <= set(schema["properties"])


def test_a_hand_edit_is_detected(tmp_path):
    _write(tmp_path, _minimal())
    text = (tmp_path / mf.MANIFEST_NAME).read_text().replace('"version": 2', '"version": 3')
    (tmp_path / mf.MANIFEST_NAME).write_text(text)
    with pytest.raises(FlowsearchError, match="changed after it was written"):
        mf.read(tmp_path)


def test_first_release_manifest_is_read_as_one_legacy_segment():
    raw = json.loads((ASSETS / "index_v1" / "manifest.json").read_text())
    assert raw["format_version"] == 1 and raw["encoder"]["pooling"] == "static"
    m = mf.read(ASSETS / "index_v1")
    assert m.format_version == 1 and m.version == 1
    # the first release's static pooling read the embedding layer's output (positions included)
    assert m.encoder.pooling == "embedding_layer"
    (seg,) = m.segments
    assert seg.dir == "." and seg.ann.factory == raw["index"]["factory"]
    assert seg.n_rows == raw["rows"] == m.n_live
    assert m.calibration.calibrator == "flow" and m.calibration.calibrated
    assert m.calibration.path == "calibrator"
    assert m.density is not None and m.density.n_rows == raw["density"]["rows"]
    assert [p.path for p in seg.parts] == [s["path"] for s in raw["shards"]]
    assert [c.name for c in m.schema_] == raw["columns"]["metadata"]


def test_second_release_manifest_is_read_as_one_legacy_segment():
    raw = json.loads((ASSETS / "index_v2" / "manifest.json").read_text())
    m = mf.read(ASSETS / "index_v2")
    assert m.format_version == 2 and m.version == raw["version"]
    (seg,) = m.segments
    assert seg.dir == raw["root"] and seg.postings == "lexical"
    assert seg.deletions == raw["tombstones"] and seg.n_deleted == raw["deleted"] == 3
    assert m.n_live == raw["rows"] - raw["deleted"]
    assert m.calibration.path == f"{raw['root']}/calibrator"


@pytest.mark.parametrize("asset", ["index_v1", "index_v2"])
def test_the_assets_manifests_round_trip(asset, tmp_path):
    """An earlier release's manifest, read, writes a manifest that reads back equal and writes
    the same JSON again (what the first write on it publishes)."""
    m = mf.read(ASSETS / asset)
    raw = m.to_json_dict()
    again = mf.from_json(json.loads(json.dumps(raw)))
    assert again == m and again.to_json_dict() == raw
    published = m.model_copy(update={"format_version": mf.FORMAT_VERSION})  # as a write does
    _write(tmp_path, published.to_json_dict())
    assert mf.read(tmp_path) == published
    assert mf.read(tmp_path).to_json_dict() == published.to_json_dict()


_FILE = {"bytes": 10, "sha256": "0" * 64}
_REFERENCE = {
    "method": "held-out",
    "n_measured": 60,
    "n_corpus": 600,
    "space": "calibrated",
    "percents": [0.0, 50.0, 100.0],
    "scores": [0.1, 0.5, 0.9],
    "mean_cosine": None,
    "log_density_median": -3.5,
}
_BASE = {"path": "references/r000001", "files": {"sample.npz": _FILE}, "rows": 40, "probes": 20}
_DELTA = {"path": "references/r000002", "files": {"delta.npz": _FILE}}


@pytest.mark.parametrize(
    "reference",
    [
        {**_REFERENCE, "sample": _BASE},  # a build's: a base alone has no "deltas" key
        {**_REFERENCE, "sample": {**_BASE, "deltas": [_DELTA, {**_DELTA, "path": "r/3"}]}},
        {**_REFERENCE, "sample": None},  # a corpus of one row: no sample
        _REFERENCE,  # a release before samples: no "sample" key, and none written back
        {**_REFERENCE, "method": "leave-one-out", "space": None, "percents": [], "scores": []},
    ],
)
def test_the_reference_is_typed_and_written_as_it_was_read(reference, tmp_path):
    raw = _minimal(reference=reference)
    m = mf.from_json(json.loads(json.dumps(raw)))
    assert isinstance(m.reference, mf.ReferenceRecord)
    assert m.to_json_dict()["reference"] == reference
    carried = m.model_copy(update={"version": 3})  # a write that keeps the reference
    assert carried.to_json_dict()["reference"] == reference
    _write(tmp_path, m.to_json_dict())
    assert mf.read(tmp_path) == m
    sample = m.reference.sample
    if sample is not None:
        assert [p.path for p in sample.pieces][0] == "references/r000001"
        assert sample.pieces[0].files["sample.npz"] == mf.FileRecord(**_FILE)


@pytest.mark.parametrize(
    "sample",
    [
        {**_BASE, "path": "../elsewhere"},
        {**_BASE, "files": {"../x": _FILE}},
        {**_BASE, "deltas": [{**_DELTA, "path": "/abs"}]},
        {**_BASE, "files": "sample.npz"},
        {"files": {"sample.npz": _FILE}},
    ],
)
def test_a_malformed_reference_sample_is_damage(sample):
    with pytest.raises(FlowsearchError, match="malformed|leaves the index|not a relative"):
        mf.from_json(_minimal(reference={**_REFERENCE, "sample": sample}))


@pytest.mark.parametrize(
    "segment",
    [
        {"dir": "../elsewhere"},
        {"dir": "/etc"},
        {"parts": [{"path": "../../etc/passwd", "n_rows": 3}]},
        {"parts": [{"path": "/abs/part.parquet", "n_rows": 3}]},
    ],
)
def test_paths_leaving_the_index_are_refused(segment):
    with pytest.raises(FlowsearchError, match="leaves the index|not a relative path|malformed"):
        mf.from_json(_minimal(segments=[_segment(**segment)]))


@pytest.mark.parametrize(
    "raw, message",
    [
        (_minimal(format_version=99), "newer than this flowsearch"),
        (_minimal(format_version="3"), "bad format_version"),
        ({k: v for k, v in _minimal().items() if k != "encoder"}, "malformed"),
        (_minimal(encoder={"model": "m"}), "malformed"),
        (_minimal(segments=[_segment(), _segment()]), "names a segment twice"),
        (_minimal(segments=[_segment(n_rows=-1)]), "malformed"),
        (_minimal(calibration={"name": "x", "calibrator": "x", "space": "elsewhere"}), "malformed"),
    ],
)
def test_bad_manifests_are_refused(tmp_path, raw, message):
    _write(tmp_path, raw)
    with pytest.raises(FlowsearchError, match=message):
        mf.read(tmp_path)


def test_read_errors_are_one_line(tmp_path):
    with pytest.raises(FlowsearchError, match="no index at"):
        mf.read(tmp_path / "missing")
    with pytest.raises(FlowsearchError, match="not a flowsearch index"):
        mf.read(tmp_path)
    (tmp_path / mf.MANIFEST_NAME).write_text("{not json")
    with pytest.raises(FlowsearchError, match="not valid JSON"):
        mf.read(tmp_path)
    (tmp_path / mf.MANIFEST_NAME).write_bytes(b"\xff\xfe")
    with pytest.raises(FlowsearchError, match="unreadable"):
        mf.read(tmp_path)
    (tmp_path / mf.MANIFEST_NAME).write_text("[]")
    with pytest.raises(FlowsearchError, match="not a flowsearch manifest"):
        mf.read(tmp_path)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(_minimal())), value=_json)
def test_any_corrupted_field_is_a_flowsearch_error_or_accepted(tmp_path_factory, key, value):
    """Whatever a hand-edited manifest holds, reading it never raises anything else."""
    folder = tmp_path_factory.mktemp("m")
    _write(folder, _minimal(**{key: value}))
    try:
        m = mf.read(folder)
    except FlowsearchError:
        return
    assert isinstance(m, mf.Manifest)


@settings(max_examples=200, deadline=None)
@given(raw=_json)
def test_arbitrary_json_is_a_flowsearch_error(tmp_path_factory, raw):
    folder = tmp_path_factory.mktemp("j")
    (folder / mf.MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(FlowsearchError):
        mf.read(folder)


def _expected(name: str) -> dict:
    return json.loads((ASSETS / f"{name}_hits.json").read_text())


def test_first_release_index_opens_answers_and_converts(tmp_path):
    """The first release's index (a committed asset, model moved since) answers the same hits,
    before and after the write that converts it."""
    import pyarrow as pa

    from flowsearch import Searcher, add_to_index

    index = shutil.copytree(ASSETS / "index_v1", tmp_path / "old")
    model = shutil.copytree(ASSETS / "tiny_bert", tmp_path / "moved_model")
    expected = _expected("index_v1")
    searcher = Searcher.open(index, model=model, verify=True)
    assert searcher.manifest.encoder.pooling == "embedding_layer"
    for query, hits in expected.items():
        got = searcher.search(query, k=5)
        assert [h.id for h in got] == [h[0] for h in hits]
        assert [h.score for h in got] == pytest.approx([h[1] for h in hits], abs=1e-5)
    extra = pa.table({"id": ["n1"], "text": ["the ship sails"], "topic": ["x"],
                      "year": pa.array([2000], pa.int32())})  # fmt: skip
    add_to_index(index, extra, model=model)
    m = mf.read(index)
    assert m.format_version == mf.FORMAT_VERSION and m.version == 2 and m.n_live == 121
    assert [s.dir for s in m.segments] == ["segments/s000001", "segments/s000002"]
    assert m.encoder.source == str(model.resolve())
    again = Searcher.open(index, verify=True)
    for query, hits in expected.items():
        assert [h.id for h in again.search(query, k=5)] == [h[0] for h in hits]
    # the old files go once no version uses them (the previous one still may)
    assert (index / "shards").exists()
    add_to_index(index, [{"id": "n2", "text": "a boat", "topic": "y", "year": 2001}])
    assert not (index / "shards").exists() and not (index / "index.faiss").exists()


@pytest.mark.parametrize("mode", ["dense", "lexical", "where"])
def test_second_release_index_answers_identically_and_converts(tmp_path, mode):
    """An index built by the second release (format 2: versions/, tombstones, BM25 with live
    rows) answers every mode and filter as it did, before and after its first write: the same
    hits in the same order, with the same raw cosine or BM25 (``Hit.score`` is this release's
    score with a meaning, :mod:`flowsearch.search.scores`)."""
    from flowsearch import Searcher, upsert

    index = shutil.copytree(ASSETS / "index_v2", tmp_path / "old")
    model = ASSETS / "tiny_bert"
    expected = {k.split("|")[1]: v for k, v in _expected("index_v2").items()
                if k.startswith(f"{mode}|")}  # fmt: skip

    def answers(searcher: Searcher) -> dict:
        where = "year >= 2000" if mode == "where" else None
        search_mode = "dense" if mode == "where" else mode
        raw = "lexical_score" if mode == "lexical" else "dense_score"
        return {q: [[h.id, getattr(h, raw)] for h in searcher.search(q, k=8, where=where,
                                                                    mode=search_mode)]
                for q in expected}  # fmt: skip

    before_write = Searcher.open(index, model=model, verify=True)
    assert before_write.version.fusion() is None  # no recorded sums: a background of 0
    before = answers(before_write)
    for query, hits in expected.items():
        assert [h[0] for h in before[query]] == [h[0] for h in hits]
        assert [h[1] for h in before[query]] == pytest.approx([h[1] for h in hits], abs=1e-6)
    upsert(index, [{"id": "q1", "text": "zzz unrelated", "topic": "q", "year": 1900}],
           model=model)  # fmt: skip
    m = mf.read(index)
    assert m.format_version == mf.FORMAT_VERSION and m.n_deleted == 3
    assert m.reference.sample.rows == m.n_live  # drawn once (every row: it fits), q1 added
    if mode == "dense":  # converted: every segment's vector sum recorded: the live rows' background
        converted = Searcher.open(index, model=model)
        dead = [np.zeros(s.record.n_rows, bool) if d is None else d
                for s, d in zip(converted.version.segments, converted.version.deleted)]  # fmt: skip
        Z = converted.vectors().astype(np.float64)[~np.concatenate(dead)]
        brute = ((Z @ Z.T).sum() - len(Z)) / (len(Z) * (len(Z) - 1))
        assert converted.version.fusion().dense_background == pytest.approx(brute, abs=1e-6)
    if mode == "lexical":  # the new row changes BM25's corpus statistics
        return
    after = answers(Searcher.open(index, model=model, verify=True))
    for query, hits in expected.items():
        got = [h for h in after[query] if h[0] != "q1"]
        assert [h[0] for h in got] == [h[0] for h in hits][: len(got)]


def test_second_release_hybrid_fuses_the_same_sides(tmp_path):
    """Hybrid ranks by this release's fusion; each hit's dense and BM25 figures are the ones
    the second release's dense and lexical answers gave that row."""
    from flowsearch import Searcher

    index = shutil.copytree(ASSETS / "index_v2", tmp_path / "old")
    recorded = _expected("index_v2")
    s = Searcher.open(index, model=ASSETS / "tiny_bert")
    for key in recorded:
        mode, query = key.split("|")
        if mode != "hybrid":
            continue
        dense = dict(map(tuple, recorded[f"dense|{query}"]))
        lexical = dict(map(tuple, recorded[f"lexical|{query}"]))
        hits = s.search(query, k=8, mode="hybrid")
        assert len(hits) == 8 and all(0 <= h.score <= 1 for h in hits)
        for hit in hits:
            if hit.id in dense:
                assert hit.dense_score == pytest.approx(dense[hit.id], abs=1e-6)
            if hit.id in lexical:
                assert hit.lexical_score == pytest.approx(lexical[hit.id], abs=1e-6)


@pytest.mark.parametrize("name", ["index_v1", "index_v2"])
def test_a_converted_index_history_counts_the_build_rows(tmp_path, name):
    """The first write moves an old index's history to history.jsonl; its build wrote the rows
    no later write added (``info --history`` said "build 0 rows")."""
    from flowsearch import upsert
    from flowsearch.search.version import index_history

    index = shutil.copytree(ASSETS / name, tmp_path / "old")
    old = json.loads((index / "manifest.json").read_text())
    upsert(index, [{"id": "q1", "text": "zzz unrelated"}], model=ASSETS / "tiny_bert")
    records = index_history(index)
    assert records[0].kind == "build" and records[0].n_rows == 120
    added = sum(r.n_rows for r in records if r.kind in ("add", "upsert"))
    assert records[0].n_rows + added - 1 == old["rows"]  # minus the row this write added
