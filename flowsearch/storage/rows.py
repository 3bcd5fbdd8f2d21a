r"""A segment's rows: Parquet parts written in order, read back by local row number.

A part holds ``id``, ``text``, the segment's metadata columns, ``vector`` (a
``fixed_size_list<float32>``: the searched space) and ``raw`` (a ``fixed_size_list<float16>``:
the encoder's own output, kept so a calibrator can be refitted without re-encoding). Parts have
at most :data:`PART_ROWS` rows, in row groups of :data:`ROW_GROUP_ROWS` (the unit a hit's join
decodes).

:class:`RowReader` opens every part of a segment when it is made (memory-mapped): it keeps
reading them after a later write's cleanup unlinked them (an open file outlives its directory
entry), which is how a pinned reader keeps its version. Decoded row groups are kept in a cache
shared by the readers of one searcher, bounded in bytes.

Example:
    >>> writer = PartWriter(segment_dir)  # doctest: +SKIP
    >>> writer.write(rows_table(ids, texts, None, vectors, raw))  # doctest: +SKIP
    >>> parts = writer.close()  # doctest: +SKIP
    >>> RowReader(segment_dir, parts).records([3, 0])  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import cachetools
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# typing.NotRequired is 3.11+, and typing.TypedDict of 3.10 ignores it
from typing_extensions import NotRequired, TypedDict

from flowsearch.errors import IndexDamaged
from flowsearch.storage.layout import part_file
from flowsearch.storage.passages import PASSAGE_COLUMNS, has_passages
from flowsearch.storage.records import PartRecord

__all__ = [
    "RowRecord",
    "RESERVED_COLUMNS",
    "VECTOR_COLUMNS",
    "PartWriter",
    "RowCache",
    "RowReader",
    "matrix",
    "rows_table",
    "vector_column",
]

_T = TypeVar("_T")


class RowRecord(TypedDict):
    """A row as the search reads it (:meth:`RowReader.records`)."""

    #: The document's id (one type per index).
    id: int | str
    #: The row's text (a passage's own text when the document is cut).
    text: str
    #: The metadata columns' values, as Arrow gives them to Python.
    metadata: dict[str, object]
    #: A passage of a segment with passages: (number, count, start, end).
    passage: NotRequired[tuple[int, ...]]


#: Columns every part has; a corpus's metadata columns may not take these names.
RESERVED_COLUMNS = ("id", "text", "vector", "raw")
#: The vector columns (never loaded to join a hit or to filter).
VECTOR_COLUMNS = ("vector", "raw")

#: Rows per Parquet part of a segment: bounds a part file's size, whatever the segment holds.
PART_ROWS = 50_000
#: Rows per Parquet row group: the unit decoded to join one hit to its row, so small enough
#: that a join decodes little beside the hit.
ROW_GROUP_ROWS = 1024


def vector_column(values: np.ndarray, dtype: type = np.float32) -> pa.FixedSizeListArray:
    """A ``fixed_size_list<dtype>`` column from a 2-D array of shape (n, dim)."""
    values = np.ascontiguousarray(values, dtype=dtype)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def matrix(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A ``fixed_size_list`` column as a float32 (n, d) array."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    dim = col.type.list_size
    flat = [c.flatten().to_numpy(zero_copy_only=False) for c in chunks if len(c)]
    if not flat:
        return np.zeros((0, dim), dtype=np.float32)
    return np.concatenate(flat).astype(np.float32).reshape(-1, dim)


def rows_table(
    ids: pa.Array | Sequence[Any],
    texts: pa.Array | Sequence[str],
    metadata: pa.Table | None,
    vectors: np.ndarray,
    raw: np.ndarray,
    passages: dict[str, pa.Array] | None = None,
) -> pa.Table:
    """Assemble rows: ``id``, ``text``, metadata..., the passage columns when given
    (:mod:`flowsearch.storage.passages`), ``vector`` (float32 (n, d), unit rows in the searched
    space), ``raw`` ((n, dim) encoder output, stored as float16)."""
    columns: dict[str, Any] = {
        "id": ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(ids),
        "text": texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts),
    }
    if metadata is not None:
        for name in metadata.column_names:
            columns[name] = metadata.column(name)
    if passages is not None:
        columns.update(passages)
    columns["vector"] = vector_column(vectors, np.float32)
    columns["raw"] = vector_column(raw, np.float16)
    return pa.table(columns)


class PartWriter:
    """Writes row tables to ``directory/rows-NNNNN.parquet``, at most ``part_rows`` each.

    Args:
        directory: the segment's directory (being staged).
        part_rows: row bound per part (default :data:`PART_ROWS`).
        row_group_rows: rows per Parquet row group (default :data:`ROW_GROUP_ROWS`).
    """

    def __init__(
        self, directory: Path, *, part_rows: int | None = None, row_group_rows: int | None = None
    ) -> None:
        self.directory = Path(directory)
        self.part_rows = part_rows or PART_ROWS
        self.row_group_rows = min(row_group_rows or ROW_GROUP_ROWS, self.part_rows)
        self._parts: list[PartRecord] = []
        self._writer: pq.ParquetWriter | None = None
        self._path = ""
        self._n = 0
        self.directory.mkdir(parents=True, exist_ok=True)

    def _open(self, schema: pa.Schema) -> None:
        self._path = part_file(len(self._parts))
        self._writer = pq.ParquetWriter(self.directory / self._path, schema, compression="zstd")
        self._n = 0

    def _close_current(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._parts.append(PartRecord(path=self._path, n_rows=self._n))

    def write(self, table: pa.Table) -> None:
        """Append rows (every table of one segment must have the same schema)."""
        start = 0
        while start < table.num_rows:
            if self._writer is None:
                self._open(table.schema)
            assert self._writer is not None
            take = min(table.num_rows - start, self.part_rows - self._n)
            self._writer.write_table(table.slice(start, take), row_group_size=self.row_group_rows)
            self._n += take
            start += take
            if self._n >= self.part_rows:
                self._close_current()

    def close(self) -> tuple[PartRecord, ...]:
        """Finish the last part; the parts written, in row order."""
        self._close_current()
        return tuple(p for p in self._parts if p.n_rows > 0)


#: A row cache's default budget in bytes (a searcher's is its ``SearchOptions.row_cache_bytes``).
ROW_CACHE_BYTES = 128 * 2**20


class RowCache:
    """Decoded row groups (id, text, metadata as Python lists), least recently used out,
    bounded by their Arrow size in bytes; shared by the readers of one searcher."""

    def __init__(self, max_bytes: int = ROW_CACHE_BYTES) -> None:
        size = max_bytes
        self._cache: cachetools.LRUCache[tuple[Any, ...], tuple[int, dict[str, list[Any]]]]
        self._cache = cachetools.LRUCache(maxsize=max(size, 1), getsizeof=lambda v: max(v[0], 1))
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> dict[str, list[Any]] | None:
        with self._lock:
            hit = self._cache.get(key)
        return None if hit is None else hit[1]

    def put(self, key: tuple[Any, ...], size: int, columns: dict[str, list[Any]]) -> None:
        with self._lock, contextlib.suppress(ValueError):  # larger than the whole cache
            self._cache[key] = (size, columns)


class RowReader:
    """Random access to one segment's rows by local row number.

    Args:
        directory: the segment's directory.
        parts: its Parquet parts, in row order.
        cache: the decoded-row-group cache to use (a private one by default).

    Raises:
        FileNotFoundError: a part vanished (a version removed meanwhile: the caller may retry
            with the current one).
        IndexDamaged: a part that is not Parquet.
    """

    def __init__(
        self, directory: Path, parts: Sequence[PartRecord], cache: RowCache | None = None
    ) -> None:
        self.directory = Path(directory)
        self.parts = tuple(parts)
        self._cache = cache if cache is not None else RowCache()
        self._files: list[pq.ParquetFile] = []
        #: a ParquetFile's reader is not safe to read from two threads at once (concurrent
        #: read_row_group calls on one file crashed the process: a searcher's pinned version
        #: serves its joins from every thread that searches it), so reads take turns per segment
        self._read_lock = threading.Lock()
        self._group_starts: list[np.ndarray] = []
        try:
            for part in self.parts:
                handle = pq.ParquetFile(self.directory / part.path, memory_map=True)
                meta = handle.metadata
                sizes = [meta.row_group(i).num_rows for i in range(handle.num_row_groups)]
                self._files.append(handle)
                self._group_starts.append(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        except FileNotFoundError:
            self.close()
            raise
        except (OSError, pa.ArrowException) as exc:
            self.close()
            raise IndexDamaged(
                f"cannot open the rows of {self.directory} ({exc})", "rebuild the index"
            ) from None
        counts = [p.n_rows for p in self.parts]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # the same bounds as Python ints: a search's few rows are placed with bisect
        self._starts_list: list[int] = self.starts.tolist()
        self._group_starts_lists: list[list[int]] = [g.tolist() for g in self._group_starts]
        self.schema = self._files[0].schema_arrow if self._files else pa.schema([])
        own = ("id", "text", *VECTOR_COLUMNS, *PASSAGE_COLUMNS)
        self.metadata_columns = tuple(n for n in self.schema.names if n not in own)
        #: the passage columns, when the segment's documents have several passages
        self.passage_columns = PASSAGE_COLUMNS if has_passages(self.schema) else ()

    def close(self) -> None:
        """Release the part files (also done when the reader is garbage-collected)."""
        for handle in self._files:
            with contextlib.suppress(Exception):
                handle.close()
        self._files = []

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _group(self, part: int, group: int) -> dict[str, list[Any]]:
        key = (str(self.directory), part, group)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        names = ["id", "text", *self.metadata_columns, *self.passage_columns]
        with self._read_lock:
            table = self._files[part].read_row_group(group, columns=names)
        columns = {name: table.column(name).to_pylist() for name in names}
        self._cache.put(key, table.nbytes, columns)
        return columns

    def records(self, rows: Sequence[int] | np.ndarray) -> list[RowRecord]:
        """Rows at local positions ``rows`` as ``{"id", "text", "metadata"}``, in that order
        (and ``"passage"``: (number, count, start, end) when the segment has passages)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) <= _FEW_ROWS:  # a search's hits: placed one by one, no array work
            placed = [self._place(row) for row in rows.tolist()]
            # each row group read once, even where the cache cannot keep it
            groups = {key: self._group(*key) for key in {(p, g) for p, g, _ in placed}}
            return [self._record(groups[p, g], at) for p, g, at in placed]
        out: list[RowRecord | None] = [None] * len(rows)
        for part, group, positions, offsets in self._row_groups_of(rows):
            columns = self._group(part, group)
            for i, at in zip(positions.tolist(), offsets.tolist(), strict=True):
                out[i] = self._record(columns, at)
        return out  # type: ignore[return-value]

    def _place(self, row: int) -> tuple[int, int, int]:
        """Local ``row``'s (part, row group, offset in the group).

        Raises:
            IndexError: a row outside the segment.
        """
        if not 0 <= row < self._starts_list[-1]:
            raise IndexError(f"row out of range 0..{len(self) - 1}")
        part = bisect.bisect_right(self._starts_list, row) - 1
        local = row - self._starts_list[part]
        starts = self._group_starts_lists[part]
        group = bisect.bisect_right(starts, local) - 1
        return part, group, local - starts[group]

    def _record(self, columns: dict[str, list[Any]], at: int) -> RowRecord:
        """The record at offset ``at`` of a row group's ``columns`` (see :meth:`records`)."""
        record: RowRecord = {
            "id": columns["id"][at],
            "text": columns["text"][at],
            # the caller owns what it gets: list/struct values are copied
            "metadata": {n: _own(columns[n][at]) for n in self.metadata_columns},
        }
        if self.passage_columns:
            record["passage"] = tuple(columns[n][at] for n in PASSAGE_COLUMNS)
        return record

    def _row_groups_of(self, rows: np.ndarray) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """``rows`` (local, any order) grouped by the Parquet row group holding them:
        ``(part, group, positions in rows, offsets in the group)`` per group touched.

        Raises:
            IndexError: a row outside the segment.
        """
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row out of range 0..{len(self) - 1}")
        if len(self._group_starts) == 1:  # one part: every group found at once
            gstarts = self._group_starts[0]
            group_of = np.searchsorted(gstarts, rows, side="right") - 1
            groups, inverse = np.unique(group_of, return_inverse=True)
            order = np.argsort(inverse, kind="stable")
            cuts = np.cumsum(np.bincount(inverse, minlength=len(groups)))[:-1]
            for group, pos in zip(groups.tolist(), np.split(order, cuts), strict=True):
                yield 0, group, pos, rows[pos] - gstarts[group]
            return
        part_of = np.searchsorted(self.starts, rows, side="right") - 1
        for part in np.unique(part_of):
            gstarts = self._group_starts[int(part)]
            pos = np.flatnonzero(part_of == part)
            local = rows[pos] - self.starts[part]
            group_of = np.searchsorted(gstarts, local, side="right") - 1
            for group in np.unique(group_of):
                sel = group_of == group
                yield int(part), int(group), pos[sel], local[sel] - gstarts[group]

    def vectors_at(self, rows: Sequence[int] | np.ndarray, name: str = "vector") -> np.ndarray:
        """A vector column at local ``rows`` (in that order), float32 (len(rows), d): reads only
        the row groups holding them (not cached: the join's cache holds the other columns)."""
        rows = np.asarray(rows, dtype=np.int64)
        dim = self.schema.field(name).type.list_size if name in self.schema.names else 0
        out = np.zeros((len(rows), dim), dtype=np.float32)
        for part, group, positions, offsets in self._row_groups_of(rows):
            with self._read_lock:
                table = self._files[part].read_row_group(group, columns=[name])
            out[positions] = matrix(table.column(name))[offsets]
        return out

    def values_at(self, rows: Sequence[int] | np.ndarray, name: str = "id") -> list[Any]:
        """A scalar column at local ``rows`` (in that order), as Python values: reads only that
        column of the row groups holding them, in one read per part (not cached). What an id
        lookup confirms its candidates with: reading the rows' other columns (the text) would
        cost far more on a large segment (benchmarks/RESULTS.md, "Figures behind the defaults")."""
        rows = np.asarray(rows, dtype=np.int64)
        out: list[Any] = [None] * len(rows)
        touched: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        for part, group, positions, offsets in self._row_groups_of(rows):
            touched.setdefault(part, []).append((group, positions, offsets))
        for part, groups in touched.items():
            sizes = np.diff(self._group_starts[part])
            wanted = [g for g, _, _ in groups]
            with self._read_lock:
                column = self._files[part].read_row_groups(wanted, columns=[name])
            start, at, where = 0, [], []
            for group, positions, offsets in groups:
                at.append(start + offsets)
                where.append(positions)
                start += int(sizes[group])
            values = column.column(name).take(pa.array(np.concatenate(at))).to_pylist()
            for i, value in zip(np.concatenate(where), values, strict=True):
                out[int(i)] = value
        return out

    def column_chunks(self, name: str) -> Iterator[Any]:
        """A column part by part: ``vector``/``raw`` as float32 (n, d), others as lists."""
        for handle in self._files:
            with self._read_lock:
                col = handle.read(columns=[name]).column(name)
            yield matrix(col) if name in VECTOR_COLUMNS else col.to_pylist()

    def vectors(self, name: str = "vector") -> np.ndarray:
        """A vector column over the whole segment, float32 (n, d)."""
        parts = list(self.column_chunks(name))
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)

    def table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The segment's rows as one table (all but the vector columns by default)."""
        names = list(columns) if columns is not None else ["id", "text", *self.metadata_columns]
        with self._read_lock:
            tables = [handle.read(columns=names) for handle in self._files]
        if not tables:
            return self.schema.empty_table().select(names)
        # parts of an older release's segment may type a column differently (int32, int64)
        return pa.concat_tables(tables, promote_options="permissive")

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """The segment's rows part by part (all columns by default)."""
        for handle in self._files:
            with self._read_lock:
                part = handle.read(columns=list(columns) if columns is not None else None)
            yield part


#: Up to this many rows, :meth:`RowReader.records` places each row with ``bisect`` (a
#: search's hits); past it, the rows are grouped by row group with numpy.
_FEW_ROWS = 64


def _own(value: _T) -> _T:
    """``value``, copied when mutable (a list or struct metadata value the cache shares)."""
    return copy.deepcopy(value) if isinstance(value, (list, dict)) else value
