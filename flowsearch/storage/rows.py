r"""Parquet shards: the rows of an index version, written in order and read back by position.

A shard holds ``id``, ``text``, the corpus's other columns (metadata) as given, ``vector`` (a
``fixed_size_list<float32>``: the searched space) and ``raw`` (a ``fixed_size_list<float16>``: the
encoder's own output, kept so a calibrator can be refitted without re-encoding). Shards have a
bounded number of rows and small row groups, so one hit is joined to its row by decoding one row
group of one memory-mapped shard, never the whole corpus.

What the shards of a version are, and their checksums, is the manifest's business
(:mod:`flowsearch.storage.manifest`); this module only writes and reads them.

Example:
    >>> writer = ShardWriter(root)  # doctest: +SKIP
    >>> writer.write(shard_table(ids, texts, None, vectors, raw))  # doctest: +SKIP
    >>> shards = writer.close()  # doctest: +SKIP
    >>> RowReader(root, shards).rows([3, 0])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.errors import FlowsearchError
from flowsearch.storage import manifest as mf
from flowsearch.storage.manifest import SHARDS_DIR, TOMBSTONES_FILE, Shard

__all__ = [
    "RESERVED_COLUMNS",
    "ROW_CACHE_BYTES",
    "ROW_GROUP_ROWS",
    "SHARD_ROWS",
    "RowReader",
    "ShardWriter",
    "live_ids",
    "read_tombstones",
    "shard_table",
    "vector_column",
    "write_deleted",
    "write_tombstones",
]

LOG = logging.getLogger(__name__)

#: Columns every shard has; a corpus's metadata columns may not take these names.
RESERVED_COLUMNS = ("id", "text", "vector", "raw")
#: Rows per shard file (about 150 MB at dim 384 with short passages).
SHARD_ROWS = 50_000
#: Rows per Parquet row group: the unit decoded to join one hit to its row.
ROW_GROUP_ROWS = 1024
#: Bytes (Arrow size) of decoded row groups (ids, texts, metadata) a reader keeps for the join.
ROW_CACHE_BYTES = 128 * 2**20


def vector_column(values: np.ndarray) -> pa.FixedSizeListArray:
    """The ``vector`` column (``fixed_size_list<float32>``) of a float (n, d) array."""
    return _fixed_list(values, np.float32)


def _fixed_list(values: np.ndarray, dtype: type) -> pa.FixedSizeListArray:
    """A ``fixed_size_list<dtype>`` column from a 2-D array of shape (n, dim)."""
    values = np.ascontiguousarray(values, dtype=dtype)
    flat = pa.array(values.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


def shard_table(
    ids: pa.Array | Sequence[Any],
    texts: pa.Array | Sequence[str],
    metadata: pa.Table | None,
    vectors: np.ndarray,
    raw: np.ndarray,
) -> pa.Table:
    """Assemble the rows of a shard.

    Args:
        ids: row ids, int64 or string, length n.
        texts: the passages, length n.
        metadata: the corpus's other columns (n rows) or None.
        vectors: float32 (n, d) in the searched space (L2-normalised).
        raw: (n, dim) encoder output, stored as float16.

    Returns:
        A table with columns id, text, metadata..., vector, raw.
    """
    columns: dict[str, pa.Array] = {
        "id": ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(ids),
        "text": texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts),
    }
    if metadata is not None:
        for name in metadata.column_names:
            columns[name] = metadata.column(name)
    columns["vector"] = _fixed_list(vectors, np.float32)
    columns["raw"] = _fixed_list(raw, np.float16)
    return pa.table(columns)


class ShardWriter:
    """Writes shard tables to ``root/shards/part-NNNNN.parquet``, at most ``shard_rows`` each.

    Args:
        root: the index directory being built.
        first_part: number of the first part file (``add`` continues after the existing ones).
        shard_rows: row bound per file (default :data:`SHARD_ROWS`).
        row_group_rows: rows per Parquet row group (default :data:`ROW_GROUP_ROWS`).
    """

    def __init__(
        self,
        root: Path,
        *,
        first_part: int = 0,
        shard_rows: int | None = None,
        row_group_rows: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.part = first_part
        self.shard_rows = shard_rows or SHARD_ROWS
        self.row_group_rows = min(row_group_rows or ROW_GROUP_ROWS, self.shard_rows)
        self._paths: list[str] = []
        self._counts: list[int] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows = 0
        (self.root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)

    def _open(self, schema: pa.Schema) -> None:
        relpath = f"{SHARDS_DIR}/part-{self.part:05d}.parquet"
        while (self.root / relpath).exists():  # a shard linked from the previous version
            self.part += 1
            relpath = f"{SHARDS_DIR}/part-{self.part:05d}.parquet"
        self.part += 1
        self._writer = pq.ParquetWriter(self.root / relpath, schema, compression="zstd")
        self._paths.append(relpath)
        self._counts.append(0)
        self._rows = 0

    def _close_current(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._counts[-1] = self._rows

    def write(self, table: pa.Table) -> None:
        """Append rows, starting a new part when the current one is full or its schema differs."""
        start = 0
        while start < table.num_rows:
            if self._writer is not None and not self._writer.schema.equals(table.schema):
                self._close_current()
            if self._writer is None:
                self._open(table.schema)
            take = min(table.num_rows - start, self.shard_rows - self._rows)
            assert self._writer is not None
            self._writer.write_table(table.slice(start, take), row_group_size=self.row_group_rows)
            self._rows += take
            start += take
            if self._rows >= self.shard_rows:
                self._close_current()

    def close(self) -> list[Shard]:
        """Finish the last part; returns a :class:`~flowsearch.storage.manifest.Shard` per part
        written."""
        self._close_current()
        return [Shard(p, n) for p, n in zip(self._paths, self._counts, strict=True) if n > 0]


class RowReader:
    """Random access to shard rows by global row number (the FAISS id).

    Every shard is opened memory-mapped when the reader is made (so it keeps reading that index
    even if the directory is republished); a lookup decodes only the row groups holding the
    requested rows (without the vector columns), and keeps recently decoded groups up to a byte
    budget. Single queries hit row groups at random, so a budget that holds the decoded id, text
    and metadata of a whole index of a few hundred thousand rows (what the peer keeps in a dict)
    turns the join into a lookup once warm (``benchmarks/bench_speed.md``: the join was the largest
    step beside the encoder at 200k rows with a 64-group cache).

    Args:
        root: the index directory.
        shards: the version's shards, in row order (paths relative to ``root``).
        cache_bytes: how many bytes of decoded row groups to keep, counted as their Arrow size
            (the Python objects kept take a few times more); least recently used out.
    """

    def __init__(self, root: Path, shards: Sequence[Shard], cache_bytes: int | None = None):
        self.root = Path(root)
        self.shards = list(shards)
        # Every shard is opened now, not on first use: a reader keeps reading the files of the
        # index it was opened on even after that directory is replaced (republished by rename
        # and deleted; open files outlive their directory entry).
        self._files: list[pq.ParquetFile] = []
        self._group_starts: list[np.ndarray] = []
        try:
            for shard in self.shards:
                handle = pq.ParquetFile(self.root / shard.path, memory_map=True)
                meta = handle.metadata
                sizes = [meta.row_group(i).num_rows for i in range(handle.num_row_groups)]
                self._files.append(handle)
                self._group_starts.append(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        except FileNotFoundError:
            self.close()
            raise  # the version was removed under us: the caller may reopen the current one
        except (OSError, pa.ArrowException) as exc:
            self.close()
            raise FlowsearchError(
                f"cannot open index shard under {self.root} ({exc}); rebuild the index"
            ) from None
        counts = [int(s.rows) for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # (shard, group) -> (its Arrow size, its columns as Python lists)
        self._cache: OrderedDict[tuple[int, int], tuple[int, dict[str, list[Any]]]] = OrderedDict()
        self._cache_bytes = ROW_CACHE_BYTES if cache_bytes is None else cache_bytes
        self._cached = 0  # bytes in the cache

    def close(self) -> None:
        """Release the shard files (also done when the reader is garbage-collected)."""
        for handle in self._files:
            with contextlib.suppress(Exception):
                handle.close()
        self._files = []

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _file(self, shard: int) -> tuple[pq.ParquetFile, np.ndarray]:
        return self._files[shard], self._group_starts[shard]

    def _group(self, shard: int, group: int) -> dict[str, list[Any]]:
        """A row group's id, text and metadata columns as Python lists (decoded once, cached)."""
        key = (shard, group)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached[1]
        handle, _ = self._file(shard)
        names = [n for n in handle.schema_arrow.names if n not in ("vector", "raw")]
        table = handle.read_row_group(group, columns=names)
        columns = {name: table.column(name).to_pylist() for name in names}
        self._cache[key] = (table.nbytes, columns)
        self._cached += table.nbytes
        while self._cached > self._cache_bytes and len(self._cache) > 1:
            self._cached -= self._cache.popitem(last=False)[1][0]
        return columns

    def rows(self, rows: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """Rows at global positions ``rows`` as ``{"id", "text", "metadata"}``, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row out of range 0..{len(self) - 1}")
        out: list[dict[str, Any] | None] = [None] * len(rows)
        shard_of = np.searchsorted(self.starts, rows, side="right") - 1
        for shard in np.unique(shard_of):
            _, gstarts = self._file(int(shard))
            pos = np.flatnonzero(shard_of == shard)
            local = rows[pos] - self.starts[shard]
            group_of = np.searchsorted(gstarts, local, side="right") - 1
            for group in np.unique(group_of):
                sel = pos[group_of == group]
                columns = self._group(int(shard), int(group))
                meta = [name for name in columns if name not in ("id", "text")]
                for i, at in zip(sel, rows[sel] - self.starts[shard] - gstarts[group], strict=True):
                    out[i] = {
                        "id": columns["id"][at],
                        "text": columns["text"][at],
                        # the caller owns what it gets: list/struct values are copied
                        "metadata": {name: _own(columns[name][at]) for name in meta},
                    }
        return out  # type: ignore[return-value]

    def column(self, name: str) -> np.ndarray | list[Any]:
        """A whole column over all shards: ``vector``/``raw`` as float32 (n, d), else a list."""
        parts = list(self.column_chunks(name))
        if name in ("vector", "raw"):
            if not parts:
                return np.zeros((0, 0), dtype=np.float32)
            return np.concatenate(parts)
        return [value for part in parts for value in part]

    def column_chunks(self, name: str) -> Iterator[Any]:
        """A column shard by shard (memory: one shard's column): ``vector``/``raw`` as float32
        (rows, d) arrays, other columns as lists."""
        for handle in self._files:
            col = handle.read(columns=[name]).column(name)
            if name in ("vector", "raw"):
                yield _matrix(col)
            else:
                yield col.to_pylist()


def _matrix(col: pa.ChunkedArray) -> np.ndarray:
    """A ``fixed_size_list`` column as a float32 (n, d) array."""
    dim = col.type.list_size
    if not col.num_chunks:
        return np.zeros((0, dim), dtype=np.float32)
    flat = [a.flatten().to_numpy(zero_copy_only=False) for a in col.chunks]
    return np.concatenate(flat).astype(np.float32).reshape(-1, dim)


def write_tombstones(path: Path, rows: np.ndarray) -> None:
    """Store deleted rows (int64, sorted unique) as a ``.npy`` file (no pickle)."""
    rows = np.unique(np.asarray(rows, dtype=np.int64))
    with open(path, "wb") as handle:
        np.save(handle, rows, allow_pickle=False)


def read_tombstones(path: Path, ntotal: int) -> np.ndarray:
    """The deleted rows of a version as a bool mask (ntotal,) (True = deleted).

    Raises:
        FlowsearchError: a file that is not an int64 row list within ``[0, ntotal)``.
    """
    try:
        rows = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise FlowsearchError(f"{path} is unreadable ({exc}); the index is damaged") from None
    if (
        rows.dtype != np.int64
        or rows.ndim != 1
        or (rows.size and (rows.min() < 0 or rows.max() >= ntotal))
    ):
        raise FlowsearchError(f"{path} does not list rows of this index; the index is damaged")
    mask = np.zeros(ntotal, dtype=bool)
    mask[rows] = True
    return mask


def live_ids(index_dir: Path, manifest: mf.Manifest) -> tuple[list[Any], np.ndarray | None]:
    """``(ids of every row, in row order; bool mask of deleted rows or None)`` of a version."""
    reader = RowReader(manifest.path(index_dir), manifest.shards)
    try:
        ids = list(reader.column("id"))
    finally:
        reader.close()
    deleted = None
    if manifest.tombstones is not None:
        deleted = read_tombstones(manifest.path(index_dir, manifest.tombstones), len(ids))
    return ids, deleted


def write_deleted(
    version_dir: Path, deleted: np.ndarray | None, rows: np.ndarray
) -> tuple[str, int]:
    """Write a version's tombstones: ``deleted`` (bool mask or None) plus ``rows``.

    Returns:
        ``(the file's path relative to the version, how many rows are deleted)``.
    """
    old = np.flatnonzero(deleted) if deleted is not None else np.zeros(0, dtype=np.int64)
    dead = np.union1d(old, rows)
    write_tombstones(version_dir / TOMBSTONES_FILE, dead)
    return TOMBSTONES_FILE, int(len(dead))


def _own(value: Any) -> Any:
    """``value``, copied when mutable (a list or struct metadata value the cache shares)."""
    return copy.deepcopy(value) if isinstance(value, (list, dict)) else value
