"""A segment's rows (flowsearch.storage.rows): Parquet parts written in order, read back by
local row number through a shared, byte-bounded cache, on synthetic rows."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowsearch.errors import IndexDamaged
from flowsearch.storage import rows as store
from flowsearch.storage.manifest import PartRecord


def _rows(n: int, dim: int = 8, start: int = 0, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = [f"doc-{i}" for i in range(start, start + n)]
    texts = [f"passage number {i}" for i in range(start, start + n)]
    meta = pa.table({"year": pa.array(np.arange(start, start + n) % 7 + 2000)})
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    raw = rng.normal(size=(n, dim)).astype(np.float32)
    return ids, texts, meta, vectors, raw


def _segment(folder, n: int, part_rows: int, row_group_rows: int, **kw):
    """Write ``n`` synthetic rows into ``folder`` in one call; (parts, the rows written)."""
    ids, texts, meta, vectors, raw = data = _rows(n, **kw)
    writer = store.PartWriter(folder, part_rows=part_rows, row_group_rows=row_group_rows)
    writer.write(store.rows_table(ids, texts, meta, vectors, raw))
    return writer.close(), data


def test_parts_are_bounded_and_typed(tmp_path):
    writer = store.PartWriter(tmp_path, part_rows=40, row_group_rows=16)
    ids, texts, meta, vectors, raw = _rows(100)
    for lo in range(0, 100, 30):  # batches that straddle part boundaries
        sl = slice(lo, lo + 30)
        writer.write(store.rows_table(ids[sl], texts[sl], meta.slice(lo, 30), vectors[sl], raw[sl]))
    parts = writer.close()
    assert parts == tuple(
        PartRecord(path=f"rows-{i:05d}.parquet", n_rows=n) for i, n in enumerate([40, 40, 20])
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.path for p in parts]
    schema = pq.read_schema(tmp_path / parts[0].path)
    assert schema.names == ["id", "text", "year", "vector", "raw"]
    assert schema.field("vector").type == pa.list_(pa.float32(), 8)
    assert schema.field("raw").type == pa.list_(pa.float16(), 8)
    # row groups never exceed row_group_rows: 16 + 14 from the first batch, 10 from the second
    first = pq.ParquetFile(tmp_path / parts[0].path).metadata
    assert [first.row_group(i).num_rows for i in range(first.num_row_groups)] == [16, 14, 10]


def test_part_bounds_default_to_the_module_constants(tmp_path, monkeypatch):
    with monkeypatch.context() as patched:
        patched.setattr(store, "PART_ROWS", 25)
        patched.setattr(store, "ROW_GROUP_ROWS", 10)
        parts, _ = _segment(tmp_path, 60, part_rows=None, row_group_rows=None)
    assert [p.n_rows for p in parts] == [25, 25, 10]
    assert pq.ParquetFile(tmp_path / parts[0].path).num_row_groups == 3
    assert store.PartWriter(tmp_path / "empty").close() == ()  # no rows: no part


def test_rows_by_local_number_and_columns(tmp_path):
    parts, (ids, texts, meta, vectors, raw) = _segment(tmp_path, 100, 40, 16)
    reader = store.RowReader(tmp_path, parts, store.RowCache(max_bytes=1))  # caches nothing
    assert len(reader) == 100 and reader.metadata_columns == ("year",)
    want = [99, 0, 41, 40, 39, 57, 0]
    got = reader.records(want)
    assert [r["id"] for r in got] == [ids[i] for i in want]
    assert [r["text"] for r in got] == [texts[i] for i in want]
    assert got[2]["metadata"] == {"year": 41 % 7 + 2000}
    assert reader.records([]) == []
    np.testing.assert_array_equal(reader.vectors("vector"), vectors)
    np.testing.assert_allclose(reader.vectors("raw"), raw, atol=2e-3, rtol=1e-3)  # float16
    assert [len(c) for c in reader.column_chunks("id")] == [40, 40, 20]
    assert [i for c in reader.column_chunks("id") for i in c] == ids
    table = reader.table()
    assert table.column_names == ["id", "text", "year"] and table.column("id").to_pylist() == ids
    assert [b.num_rows for b in reader.batches(["id"])] == [40, 40, 20]
    for bad in ([100], [-1]):
        with pytest.raises(IndexError):
            reader.records(bad)


@pytest.mark.parametrize("n_rows", [7, 150])  # a search's few rows (bisect), and many (numpy)
def test_records_read_each_row_group_once_whatever_the_cache(tmp_path, n_rows):
    parts, (ids, *_) = _segment(tmp_path, 200, 80, 16)
    reader = store.RowReader(tmp_path, parts, store.RowCache(max_bytes=0))  # keeps nothing
    reads: list[tuple[int, int]] = []
    for p, handle in enumerate(reader._files):

        def counted(group, *args, _read=handle.read_row_group, _p=p, **kwargs):
            reads.append((_p, group))
            return _read(group, *args, **kwargs)

        handle.read_row_group = counted
    want = np.random.default_rng(n_rows).integers(0, 200, size=n_rows)
    assert [r["id"] for r in reader.records(want)] == [ids[i] for i in want]
    assert len(reads) == len(set(reads))  # no row group read twice in one call


def test_the_row_cache_keeps_to_its_byte_budget_and_is_shared(tmp_path):
    parts, (ids, *_) = _segment(tmp_path, 80, 40, 8)
    reader = store.RowReader(tmp_path, parts)  # a private cache, large enough for all groups
    assert [r["id"] for r in reader.records(range(80))] == ids
    keys = [(str(tmp_path), part, group) for part in (0, 1) for group in range(5)]
    assert all(reader._cache.get(key) is not None for key in keys)
    size = pq.ParquetFile(tmp_path / parts[0].path).read_row_group(0, ["id", "text", "year"]).nbytes
    budget = 3 * size + size // 2  # three groups fit, a fourth does not
    shared = store.RowCache(max_bytes=budget)
    first = store.RowReader(tmp_path, parts, shared)
    for start in range(0, 80, 8):  # group by group, each read once
        assert [r["id"] for r in first.records(range(start, start + 8))] == ids[start : start + 8]
    kept = [key for key in keys if shared.get(key) is not None]
    assert kept == keys[-3:]  # least recently used out
    # a second reader of the same segment answers from the shared cache: its files unread
    second = store.RowReader(tmp_path, parts, shared)

    def unread(*args, **kwargs):
        raise AssertionError("read a row group the cache holds")

    for handle in second._files:
        handle.read_row_group = unread
    assert [r["id"] for r in second.records(range(56, 80))] == ids[56:80]
    with pytest.raises(AssertionError, match="cache holds"):
        second.records([0])
    # one entry larger than the whole budget is not kept (and evicts nothing)
    tiny = store.RowCache(max_bytes=10)
    tiny.put(("x", 0, 0), 11, {"id": ["a"]})
    assert tiny.get(("x", 0, 0)) is None
    assert store.RowCache()._cache.maxsize == store.ROW_CACHE_BYTES  # the default budget


def test_rows_from_the_cache_are_the_callers_own(tmp_path):
    writer = store.PartWriter(tmp_path)
    table = store.rows_table(
        ["a", "b"], ["x", "y"],
        pa.table({"tags": [["p", "q"], ["r"]], "where": [{"city": "Oslo"}, {"city": "Rome"}]}),
        np.eye(2, 4, dtype=np.float32), np.eye(2, 4, dtype=np.float32),
    )  # fmt: skip
    writer.write(table)
    reader = store.RowReader(tmp_path, writer.close())
    first = reader.records([0])[0]
    first["metadata"]["tags"].append("mutated")
    first["metadata"]["where"]["city"] = "mutated"
    assert reader.records([0, 1]) == [
        {"id": "a", "text": "x", "metadata": {"tags": ["p", "q"], "where": {"city": "Oslo"}}},
        {"id": "b", "text": "y", "metadata": {"tags": ["r"], "where": {"city": "Rome"}}},
    ]


def test_a_reader_keeps_the_files_it_opened_after_they_are_unlinked(tmp_path):
    """What a pinned searcher relies on: a cleanup removes a segment's files, another segment
    later takes the same path, and the open reader still answers its own rows."""
    folder = tmp_path / "s000001"
    parts, (ids, texts, _, vectors, _) = _segment(folder, 90, 30, 8)
    reader = store.RowReader(folder, parts)  # opened; nothing read yet
    shutil.rmtree(folder)
    other, (ids2, *_) = _segment(folder, 90, 30, 8, start=1000, seed=1)
    assert other == parts and ids2 != ids  # the same names, other rows
    want = [89, 0, 45, 31]
    got = reader.records(want)
    assert [(r["id"], r["text"]) for r in got] == [(ids[i], texts[i]) for i in want]
    assert [i for c in reader.column_chunks("id") for i in c] == ids
    np.testing.assert_array_equal(reader.vectors(), vectors)
    found = store.RowReader(folder, other).records(want)
    assert [r["id"] for r in found] == [ids2[i] for i in want]


def test_a_closed_reader_releases_its_files(tmp_path):
    parts, _ = _segment(tmp_path, 10, 10, 10)
    reader = store.RowReader(tmp_path, parts)
    reader.close()
    assert reader._files == []
    reader.close()  # twice: harmless


def test_reader_on_a_missing_or_broken_part(tmp_path):
    # a missing file is FileNotFoundError: a reader racing a cleanup re-reads the manifest and
    # retries (flowsearch.search.version.open_current turns a lasting one into IndexDamaged)
    parts, _ = _segment(tmp_path / "ok", 10, 5, 5)
    (tmp_path / "ok" / parts[1].path).unlink()
    with pytest.raises(FileNotFoundError):
        store.RowReader(tmp_path / "ok", parts)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rows-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(IndexDamaged, match="cannot open the rows of .*bad"):
        store.RowReader(tmp_path / "bad", [PartRecord(path="rows-00000.parquet", n_rows=3)])


def test_matrix_and_vector_column_round_trip():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    col = store.vector_column(x)
    assert col.type == pa.list_(pa.float32(), 3)
    np.testing.assert_array_equal(store.matrix(pa.chunked_array([col.slice(0, 1), col[1:]])), x)
    empty = store.matrix(pa.chunked_array([], type=pa.list_(pa.float32(), 3)))
    assert empty.shape == (0, 3) and empty.dtype == np.float32


def test_vectors_at_reads_rows_in_any_order_across_parts_and_groups(tmp_path):
    parts, (_, _, _, vectors, raw) = _segment(tmp_path, 100, 40, 16)
    reader = store.RowReader(tmp_path, parts)
    want = np.array([99, 0, 41, 40, 39, 17, 17, 63])  # part and group edges, a repeat
    np.testing.assert_array_equal(reader.vectors_at(want), vectors[want])
    np.testing.assert_array_equal(reader.vectors_at(want, "raw"), reader.vectors("raw")[want])
    assert reader.vectors_at([]).shape == (0, vectors.shape[1])
    with pytest.raises(IndexError):
        reader.vectors_at([100])


def test_values_at_reads_one_column_in_any_order_across_parts_and_groups(tmp_path):
    parts, (ids, texts, _, _, _) = _segment(tmp_path, 100, 40, 16)
    reader = store.RowReader(tmp_path, parts)
    want = [99, 0, 41, 40, 39, 17, 17, 63, 15, 16]  # part and group edges, a repeat
    assert reader.values_at(want) == [ids[i] for i in want]
    assert reader.values_at(want, "text") == [texts[i] for i in want]
    assert reader.values_at([]) == []
    with pytest.raises(IndexError):
        reader.values_at([100])


class _Watched:
    """A part file's stand-in that records how many threads read it at once."""

    def __init__(self, handle, seen):
        self._handle, self._seen = handle, seen

    def __getattr__(self, name):
        attr = getattr(self._handle, name)
        if not name.startswith("read"):
            return attr

        def read(*args, **kwargs):
            import time

            self._seen["now"] += 1
            self._seen["most"] = max(self._seen["most"], self._seen["now"])
            time.sleep(0.002)  # long enough for another thread to come in
            try:
                return attr(*args, **kwargs)
            finally:
                self._seen["now"] -= 1

        return read


def test_threads_read_a_segments_files_in_turn(tmp_path):
    """A ParquetFile's reader is not safe from two threads at once (concurrent row-group reads
    of one file crashed a test process): a segment's reads take turns, whatever reads them."""
    import threading

    parts, (ids, _, _, vectors, _) = _segment(tmp_path, 400, part_rows=200, row_group_rows=16)
    reader = store.RowReader(tmp_path, parts, cache=store.RowCache(max_bytes=0))
    seen = {"now": 0, "most": 0}
    reader._files = [_Watched(h, seen) for h in reader._files]
    rng = np.random.default_rng(0)
    got: list[bool] = []

    def work(seed: int) -> None:
        pick = np.random.default_rng(seed).choice(400, size=40, replace=False)
        ok = [r["id"] for r in reader.records(pick)] == [ids[i] for i in pick]
        ok &= np.array_equal(reader.vectors_at(pick), vectors[pick])
        ok &= reader.values_at(pick) == [ids[i] for i in pick]
        got.append(bool(ok))

    threads = [threading.Thread(target=work, args=(int(s),)) for s in rng.integers(0, 1e6, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [True] * 6 and seen["most"] == 1
