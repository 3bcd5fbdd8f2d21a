"""The engine's writes: upsert, delete, compact, recalibrate; filters and modes over them."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import sentences, write_corpus

from flowsearch.errors import BadInput, FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.storage import deletions, history
from flowsearch.storage import manifest as mf
from flowsearch.writes.build import build_index
from flowsearch.writes.compact import compact, recalibrate
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import add_to_index, upsert

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
    assert len(s) == 81 and s.manifest.n_deleted == 1 and s.manifest.n_rows == 82
    assert len(s.manifest.segments) == 2  # the build's and the upsert's
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
    assert result.n_deleted == 27 and result.missing == ["nope", "d0"]  # d0 only once
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
    assert delete(index, ["nope"]).n_deleted == 0 and mf.read(index).version == 2


def test_compact_drops_dead_rows_and_keeps_answers(index):
    delete(index, [f"d{i}" for i in range(40)])
    s = Searcher.open(index)
    before = {m: s.search("the red car", k=10, mode=m) for m in MODES}
    result = compact(index)
    assert result["dropped"] == 40 and result["rows"] == 40 and result["bytes_freed"] > 0
    m = mf.read(index)
    assert (m.n_rows, m.n_deleted) == (40, 0)
    assert all(s.deletions is None for s in m.segments)
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
    assert m.calibration.calibrator == "sn" and history.read(index)[-1].kind == "recalibrate"
    (seg,) = m.segments
    table = pq.read_table(index / seg.dir / seg.parts[0].path)
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


def test_deletion_files_are_checked(tmp_path):
    path = tmp_path / "t.npy"
    deletions.write(path, np.array([5, 1, 5]))
    assert np.flatnonzero(deletions.read(path, 10)).tolist() == [1, 5]
    with pytest.raises(FlowsearchError, match="does not list rows"):
        deletions.read(path, 3)
    np.save(path, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FlowsearchError, match="unreadable"):
        deletions.read(path, 10)


def test_modes_and_filters(index):
    s = Searcher.open(index)
    assert s.default_mode == "hybrid"
    hits = s.search("the cat", k=5)
    assert all(h.dense_score is not None or h.lexical_score is not None for h in hits)
    for where in ("year >= 2010", "topic = 'dog' AND year < 2000"):
        rows = pa.concat_tables(
            pq.read_table(index / seg.dir / part.path)
            for seg in s.manifest.segments
            for part in seg.parts
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


def _unchanged(index):
    return (index / mf.MANIFEST_NAME).read_text(), sorted(p.name for p in index.rglob("*"))


@pytest.mark.parametrize(
    "record, message",
    [
        (
            {"id": "t1", "text": "tides", "topic": 5, "year": 2000},
            "'t1'.*'topic' expects string, got int64",
        ),
        (
            {"id": "t1", "text": "tides", "topic": "sea", "year": 2000.5},
            "'year' expects int32, got double",
        ),
        (
            {"id": "t1", "text": "tides", "topic": "sea", "year": "2000"},
            "'year' expects int32, got string",
        ),
        ({"id": "t1", "text": "tides", "topic": "sea", "year": 2**40}, "'year' expects int32"),
        (
            {"id": "t1", "text": "tides", "topic": "sea", "year": 2000, "m": {1: 2}},
            "non-string key|cannot",
        ),
        ({"id": 7, "text": "tides", "topic": "sea", "year": 2000}, None),  # an int id: "7"
    ],
)
def test_a_mistyped_record_is_refused_and_nothing_changes(index, record, message):
    """A value that cannot be cast losslessly to its column's type is refused naming the id,
    the column, the expected and the given type; nothing stored changes."""
    before = _unchanged(index)
    if message is None:  # integers go into a string-id index as their text
        upsert(index, [record])
        assert Searcher.open(index).search("tides", k=1, mode="lexical")[0].id == "7"
        return
    with pytest.raises(BadInput, match=message):
        upsert(index, [record])
    assert _unchanged(index) == before
    s = Searcher.open(index)
    assert len(s.search("the cat", k=5, mode="dense")) == 5


def test_a_whole_float_goes_into_an_integer_column(index):
    upsert(index, [{"id": "t1", "text": "tides", "topic": "sea", "year": 2001.0}])
    hit = Searcher.open(index).search("tides", k=1, mode="lexical")[0]
    assert hit.id == "t1" and hit.metadata["year"] == 2001 and isinstance(hit.metadata["year"], int)


def test_a_new_column_is_added_null_for_older_rows(index):
    upsert(index, [{"id": "t1", "text": "tides and sea", "topic": "sea", "year": 2001,
                    "lang": "en", "tags": ["a", "b"]}])  # fmt: skip
    m = mf.read(index)
    assert [c.name for c in m.schema_] == ["topic", "year", "lang", "tags"]
    assert [c.type for c in m.schema_][2:] == ["string", "list<item: string>"]
    s = Searcher.open(index)
    hits = {h.id: h for h in s.search("the sea", k=81, mode="dense")}
    assert hits["t1"].metadata["lang"] == "en" and hits["t1"].metadata["tags"] == ["a", "b"]
    assert hits["d1"].metadata["lang"] is None and set(hits["d1"].metadata) == set(
        hits["t1"].metadata
    )
    # a later write may not change the new column's type either
    with pytest.raises(BadInput, match="'lang' expects string"):
        upsert(index, [{"id": "t2", "text": "x", "topic": "s", "year": 1, "lang": 3, "tags": []}])


def test_a_new_column_is_filterable_at_once(index):
    upsert(index, [{"id": "t1", "text": "tides and sea", "topic": "sea", "year": 2001,
                    "lang": "en"}])  # fmt: skip
    s = Searcher.open(index)
    assert [h.id for h in s.search("the sea", k=5, where="lang = 'en'")] == ["t1"]
    assert len(s.search("the sea", k=100, where="lang IS NULL", mode="dense")) == 80


def test_nested_values_that_cannot_be_typed_are_refused(index):
    before = _unchanged(index)
    with pytest.raises(BadInput, match="records"):
        upsert(index, [{"id": "t1", "text": "x", "topic": "s", "year": 1, "bag": [1, "a"]}])
    assert _unchanged(index) == before


def test_ids_keep_the_index_type(tmp_path, model_dir):
    """An integer-id index refuses string ids (a number in one file, a string in the next)."""
    out = tmp_path / "ints"
    build_index([{"id": i, "text": t} for i, t in enumerate(sentences(30))], out,
                model=str(model_dir))  # fmt: skip
    before = _unchanged(out)
    with pytest.raises(BadInput, match="integer ids, this corpus has string ids"):
        upsert(out, [{"id": "31", "text": "a cat"}])
    assert _unchanged(out) == before
    with pytest.raises(BadInput, match="not an integer"):
        delete(out, ["²"])
    assert delete(out, ["3", 4]).n_deleted == 2


def test_add_refuses_ids_already_there_and_takes_the_old_argument_order(index, tmp_path):
    with pytest.raises(BadInput, match="already in the index"):
        add_to_index(index, [{"id": "d1", "text": "x", "topic": "s", "year": 1}])
    extra = write_corpus(tmp_path / "e.parquet", n=3, id_prefix="e")
    with pytest.warns(DeprecationWarning, match="add_to_index"):
        result = add_to_index(extra, index)
    assert result.n_written == 3 and mf.read(index).n_live == 83


def test_writes_cost_what_they_write(index):
    """An upsert writes one small segment and a deletion file; the build's segment is not
    rewritten (its files are the same inodes)."""
    m = mf.read(index)
    big = m.segments[0]
    inodes = {rel: (index / big.dir / rel).stat().st_ino for rel in big.files}
    upsert(index, [{"id": "d3", "text": "new text", "topic": "t", "year": 1}])
    after = mf.read(index)
    assert [s.n_rows for s in after.segments] == [80, 1]
    kept = after.segments[0]
    assert {rel: (index / kept.dir / rel).stat().st_ino for rel in big.files} == inodes
    assert kept.deletions is not None and kept.n_deleted == 1
