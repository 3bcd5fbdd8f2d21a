"""The engine's writes: upsert, delete, compact, recalibrate; filters and modes over them."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import sentences, write_corpus

from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.storage import manifest as mf
from flowsearch.storage import rows as store
from flowsearch.writes.build import build_index
from flowsearch.writes.rewrite import compact, delete, recalibrate
from flowsearch.writes.upsert import upsert

MODES = ("dense", "lexical", "hybrid")


@pytest.fixture()
def index(tmp_path, model_dir):
    out = tmp_path / "idx"
    build_index(
        write_corpus(tmp_path / "c.parquet", n=80),
        out,
        model=str(model_dir),
        calibration="whitening",
    )
    return out


def _ids(searcher, query, k, **kw):
    return [h.id for h in searcher.search(query, k=k, **kw)]


def test_upsert_inserts_and_replaces(index):
    texts = sentences(3, seed=9)
    summary = upsert(
        index,
        [
            {"id": "d3", "text": "piano piano piano song", "topic": "t", "year": 2030},
            {"id": "new", "text": texts[0], "topic": "t", "year": 2031},
        ],
    )
    assert (summary["upserted"], summary["inserted"], summary["replaced"]) == (2, 1, 1)
    s = Searcher.open(index)
    assert len(s) == 81 and s.manifest.deleted == 1 and s.manifest.rows == 82
    hits = {h.id: h for h in s.search("piano piano piano song", k=81, mode="lexical")}
    assert hits["d3"].text == "piano piano piano song" and hits["d3"].metadata["year"] == 2030
    for mode in MODES:  # exactly one d3 in every mode, the new one
        found = [h for h in s.search("the piano song", k=81, mode=mode) if h.id == "d3"]
        assert len(found) <= 1 and all(h.text == "piano piano piano song" for h in found)


def test_upsert_refuses_duplicate_ids_in_one_batch(index):
    before = (index / mf.MANIFEST_NAME).read_text()
    with pytest.raises(FlowsearchError, match="more than once"):
        upsert(index, [{"id": "x", "text": "a cat"}, {"id": "x", "text": "a dog"}])
    assert (index / mf.MANIFEST_NAME).read_text() == before


def test_deleted_rows_never_come_back(index):
    gone = [f"d{i}" for i in range(0, 80, 3)]  # 27 rows
    result = delete(index, [*gone, "nope", "d0"])
    assert result.deleted == 27 and result.missing == ["nope", "d0"]  # d0 only once
    s = Searcher.open(index)
    assert len(s) == 53
    for mode in MODES:
        for where in (None, "year >= 1990", "topic = 'cat'", "id IN ('d0', 'd1', 'd3')"):
            for k in (1, 10, 200):
                got = _ids(s, "the cat and the dog ran", k, mode=mode, where=where)
                assert not set(got) & set(gone), (mode, where, k)
    dense = _ids(s, "the cat and the dog ran", 200, mode="dense")
    assert len(dense) == 53  # never fewer than k when k rows are live
    assert _ids(s, "the cat", 5, mode="dense", where="id IN ('d0', 'd1', 'd3')") == ["d1"]
    assert delete(index, ["nope"]).deleted == 0 and mf.read(index).version == 2


def test_compact_drops_dead_rows_and_keeps_answers(index):
    delete(index, [f"d{i}" for i in range(40)])
    s = Searcher.open(index)
    before = {m: s.search("the red car", k=10, mode=m) for m in MODES}
    result = compact(index)
    assert result["dropped"] == 40 and result["rows"] == 40 and result["bytes_freed"] > 0
    m = mf.read(index)
    assert (m.rows, m.deleted, m.tombstones) == (40, 0, None)
    s2 = Searcher.open(index, verify=True)
    for mode in MODES:
        after = s2.search("the red car", k=10, mode=mode)
        assert [h.id for h in after] == [h.id for h in before[mode]]
        assert [h.score for h in after] == pytest.approx([h.score for h in before[mode]], abs=1e-5)
    assert compact(index)["dropped"] == 0  # nothing to do: no new version
    assert mf.read(index).version == m.version


def test_recalibrate_refits_on_stored_raw_vectors(index):
    from flowsearch.calibration import make_calibrator
    from flowsearch.space.search_space import normalise

    result = recalibrate(index, calibration="sn")
    assert result["calibration"] == "sn" and result["space"] == "calibrated"
    m = mf.read(index)
    assert m.calibration.calibrator == "sn" and m.history[-1].kind == "recalibrate"
    table = pq.read_table(m.path(index, m.shards[0].path))
    raw = np.stack(table.column("raw").to_numpy(zero_copy_only=False)).astype(np.float32)
    want = normalise(make_calibrator("sn").fit(raw).transform(raw))
    got = np.stack(table.column("vector").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(got, want, atol=1e-5)
    s = Searcher.open(index, verify=True)
    q, _ = s.embed(["the cat"])
    exact = np.argsort(-(want @ q[0]))[:5]
    assert _ids(s, "the cat", 5, mode="dense") == [
        table.column("id")[int(i)].as_py() for i in exact
    ]


def test_recalibrate_refuses_unknown_names_before_work(index):
    before = (index / mf.MANIFEST_NAME).read_text()
    with pytest.raises(FlowsearchError, match="unknown calibration"):
        recalibrate(index, calibration="nonsense")
    assert (index / mf.MANIFEST_NAME).read_text() == before


def test_tombstones_are_checked(index, tmp_path):
    path = tmp_path / "t.npy"
    store.write_tombstones(path, np.array([5, 1, 5]))
    assert np.flatnonzero(store.read_tombstones(path, 10)).tolist() == [1, 5]
    with pytest.raises(FlowsearchError, match="does not list rows"):
        store.read_tombstones(path, 3)
    np.save(path, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FlowsearchError, match="unreadable"):
        store.read_tombstones(path, 10)


def test_modes_and_filters(index):
    s = Searcher.open(index)
    assert s.default_mode == "hybrid"
    hits = s.search("the cat", k=5)
    assert all(h.dense_score is not None or h.lexical_score is not None for h in hits)
    for where in ("year >= 2010", "topic = 'dog' AND year < 2000"):
        rows = pa.concat_tables(
            pq.read_table(s.manifest.path(index, sh.path)) for sh in s.manifest.shards
        ).select(["id", "topic", "year"])
        con = duckdb.connect()
        con.register("rows_", rows)
        want = set(con.execute(f"SELECT id FROM rows_ WHERE {where}").fetchnumpy()["id"].tolist())
        for mode in MODES:
            got = _ids(s, "the cat", 80, mode=mode, where=where)
            assert set(got) <= want
        assert set(_ids(s, "the cat", 80, mode="dense", where=where)) == want
    with pytest.raises(FlowsearchError, match="unknown mode"):
        s.search("the cat", mode="fuzzy")
    with pytest.raises(FlowsearchError, match="colour"):
        s.search("the cat", where="colour = 'red'")
    with pytest.raises(FlowsearchError):
        s.search("the cat", where="1=1; DROP TABLE meta")


def test_dense_only_index_refuses_lexical_modes(tmp_path, model_dir):
    out = tmp_path / "idx"
    build_index(
        write_corpus(tmp_path / "c.parquet", n=30), out, model=str(model_dir), lexical=False
    )
    s = Searcher.open(out)
    assert s.default_mode == "dense" and mf.read(out).lexical is None
    with pytest.raises(FlowsearchError, match="built without one"):
        s.search("the cat", mode="hybrid")
