"""Shards and row lookup of flowsearch.storage.rows, on synthetic rows (the manifest:
test_manifest)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowsearch.errors import FlowsearchError
from flowsearch.storage import rows as store
from flowsearch.storage.manifest import Shard


def _rows(n: int, dim: int = 8, start: int = 0, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = [f"doc-{i}" for i in range(start, start + n)]
    texts = [f"passage number {i}" for i in range(start, start + n)]
    meta = pa.table({"year": pa.array(np.arange(start, start + n) % 7 + 2000)})
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    raw = rng.normal(size=(n, dim)).astype(np.float32)
    return ids, texts, meta, vectors, raw


def test_shards_are_bounded_and_typed(tmp_path):
    writer = store.ShardWriter(tmp_path, shard_rows=40, row_group_rows=16)
    ids, texts, meta, vectors, raw = _rows(100)
    for lo in range(0, 100, 30):  # batches that straddle shard boundaries
        sl = slice(lo, lo + 30)
        writer.write(
            store.shard_table(ids[sl], texts[sl], meta.slice(lo, 30), vectors[sl], raw[sl])
        )
    shards = writer.close()
    assert shards == [Shard(f"shards/part-{i:05d}.parquet", n) for i, n in enumerate([40, 40, 20])]
    schema = pq.read_schema(tmp_path / shards[0].path)
    assert schema.names == ["id", "text", "year", "vector", "raw"]
    assert schema.field("vector").type == pa.list_(pa.float32(), 8)
    assert schema.field("raw").type == pa.list_(pa.float16(), 8)
    assert pq.ParquetFile(tmp_path / shards[0].path).num_row_groups == 3


def test_rows_by_global_number_and_columns(tmp_path):
    writer = store.ShardWriter(tmp_path, shard_rows=40, row_group_rows=16)
    ids, texts, meta, vectors, raw = _rows(100)
    writer.write(store.shard_table(ids, texts, meta, vectors, raw))
    reader = store.RowReader(tmp_path, writer.close(), cache_bytes=1)  # keeps one group
    assert len(reader) == 100
    want = [99, 0, 41, 40, 39, 57, 0]
    got = reader.rows(want)
    assert [r["id"] for r in got] == [ids[i] for i in want]
    assert [r["text"] for r in got] == [texts[i] for i in want]
    assert got[2]["metadata"] == {"year": 41 % 7 + 2000}
    np.testing.assert_array_equal(reader.column("vector"), vectors)
    np.testing.assert_allclose(reader.column("raw"), raw, atol=2e-3, rtol=1e-3)
    assert reader.column("id") == ids
    with pytest.raises(IndexError):
        reader.rows([100])


def test_the_row_cache_keeps_to_its_byte_budget(tmp_path):
    writer = store.ShardWriter(tmp_path, shard_rows=40, row_group_rows=8)
    ids, texts, meta, vectors, raw = _rows(80)
    writer.write(store.shard_table(ids, texts, meta, vectors, raw))
    shards = writer.close()
    whole = store.RowReader(tmp_path, shards)  # the default budget holds every group here
    assert [r["id"] for r in whole.rows(range(80))] == ids
    sizes = [size for size, _ in whole._cache.values()]
    assert len(sizes) == 10 and whole._cached == sum(sizes)
    budget = 3 * min(sizes)
    small = store.RowReader(tmp_path, shards, cache_bytes=budget)
    for start in range(0, 80, 8):
        assert [r["id"] for r in small.rows(range(start, start + 8))] == ids[start : start + 8]
        assert small._cached <= budget and 1 <= len(small._cache) <= 3
    assert list(small._cache)[-1] == (1, 4) and (0, 0) not in small._cache  # least recent out


def test_rows_from_the_cache_are_the_callers_own(tmp_path):
    writer = store.ShardWriter(tmp_path)
    table = store.shard_table(
        ["a", "b"], ["x", "y"], pa.table({"tags": [["p", "q"], ["r"]]}),
        np.eye(2, 4, dtype=np.float32), np.eye(2, 4, dtype=np.float32),
    )  # fmt: skip
    writer.write(table)
    reader = store.RowReader(tmp_path, writer.close())
    first = reader.rows([0])[0]
    first["metadata"]["tags"].append("mutated")
    assert reader.rows([0, 1]) == [
        {"id": "a", "text": "x", "metadata": {"tags": ["p", "q"]}},
        {"id": "b", "text": "y", "metadata": {"tags": ["r"]}},
    ]


def test_schema_change_starts_a_new_part(tmp_path):
    writer = store.ShardWriter(tmp_path, shard_rows=1000)
    ids, texts, meta, vectors, raw = _rows(10)
    writer.write(store.shard_table(ids[:5], texts[:5], meta.slice(0, 5), vectors[:5], raw[:5]))
    writer.write(store.shard_table(ids[5:], texts[5:], None, vectors[5:], raw[5:]))
    shards = writer.close()
    assert [s.rows for s in shards] == [5, 5]
    rows = store.RowReader(tmp_path, shards).rows([4, 5])
    assert rows[0]["metadata"] == {"year": 2004} and rows[1]["metadata"] == {}


def test_reader_keeps_the_files_it_opened_after_the_directory_is_replaced(tmp_path):
    import shutil

    root = tmp_path / "idx"
    writer = store.ShardWriter(root, shard_rows=30, row_group_rows=8)
    ids, texts, meta, vectors, raw = _rows(90)
    writer.write(store.shard_table(ids, texts, meta, vectors, raw))
    shards = writer.close()
    reader = store.RowReader(root, shards)  # nothing read yet
    # republish: the old directory moves aside, a new one (same layout, other rows) takes its
    # name, the old one is deleted
    root.rename(tmp_path / "old")
    writer = store.ShardWriter(root, shard_rows=30, row_group_rows=8)
    ids2, texts2, meta2, vectors2, raw2 = _rows(90, start=1000, seed=1)
    writer.write(store.shard_table(ids2, texts2, meta2, vectors2, raw2))
    assert writer.close() == shards
    shutil.rmtree(tmp_path / "old")
    want = [89, 0, 45, 31]
    got = reader.rows(want)
    assert [(r["id"], r["text"]) for r in got] == [(ids[i], texts[i]) for i in want]
    assert reader.column("id") == ids
    np.testing.assert_array_equal(reader.column("vector"), vectors)


def test_first_part_continues_after_linked_shards(tmp_path):
    """What add does: shards of the previous version are linked in, new parts follow them."""
    ids, texts, meta, vectors, raw = _rows(30)
    first = store.ShardWriter(tmp_path, shard_rows=20)
    first.write(store.shard_table(ids[:20], texts[:20], meta.slice(0, 20), vectors[:20], raw[:20]))
    old = first.close()
    more = store.ShardWriter(tmp_path, first_part=len(old), shard_rows=20)
    more.write(store.shard_table(ids[20:], texts[20:], meta.slice(20), vectors[20:], raw[20:]))
    new = more.close()
    assert [s.path for s in (*old, *new)] == [
        "shards/part-00000.parquet",
        "shards/part-00001.parquet",
    ]
    reader = store.RowReader(tmp_path, [*old, *new])
    assert [r["id"] for r in reader.rows([29, 0, 20, 19])] == [
        "doc-29",
        "doc-0",
        "doc-20",
        "doc-19",
    ]


def test_reader_on_a_missing_or_broken_shard(tmp_path):
    # a missing file is FileNotFoundError: a reader racing a writer that removed the version
    # re-reads the manifest and retries (directory.open_version turns it into a user error)
    with pytest.raises(FileNotFoundError):
        store.RowReader(tmp_path, [Shard("shards/part-00000.parquet", 3)])
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(FlowsearchError, match="cannot open index shard"):
        store.RowReader(tmp_path, [Shard("shards/part-00000.parquet", 3)])
