r"""What a filter database holds: one native DuckDB table per segment, made once and shared.

A segment's filterable columns are read once, on the first filtered query that needs them
(:func:`load_segment` calls the caller's ``load``), copied into a DuckDB table of the shared
catalog (:func:`create_table`; every cursor sees it), and dropped when no live version uses the
segment. Native tables, not registered Arrow tables: a registered table is scanned through
pyarrow with a fixed cost per table and query (the benchmark ``filter_segments``,
benchmarks/RESULTS.md), and native ones count against
DuckDB's ``memory_limit``, which so bounds the data and the queries' working memory together.

A filter's row is a **document**, not a passage: a segment whose long documents are cut into
passages (:mod:`flowsearch.storage.passages`) gets one table row per document, its ``text`` the
document's whole text (rebuilt from its passages, :func:`documents_of`), with its first
passage's local row (``__local``) and how many rows it spans (``__span``; a segment where every
document is one row has no such column: it would cost 8 bytes a row, and every query would fetch
and expand a column of ones). A predicate on ``text`` so sees what
the user stored (``text LIKE '%a%' AND text LIKE '%b%'`` with ``a`` and ``b`` in different
passages, ``length(text)``), and a matched document gives all its rows. Its cost is bounded as
before: the table holds each document's text once (less than its passages, which overlap).

Example:
    >>> import pyarrow as pa
    >>> ref = SegmentRef("s1", 0, 2, lambda: pa.table({"id": ["a", "b"]}))
    >>> load_segment(ref).column_names
    ['id', '__local']
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowsearch.errors import FlowsearchError, IndexDamaged
from flowsearch.ingest.passages import joined
from flowsearch.search.predicate import ROW, first_line
from flowsearch.storage.passages import PASSAGE, PASSAGE_END, PASSAGE_START, PASSAGES

__all__ = [
    "LOCAL",
    "RESERVED",
    "SPAN",
    "Segment",
    "SegmentRef",
    "create_table",
    "documents_of",
    "filterable",
    "load_segment",
    "quote",
    "row_bytes",
]

#: The column of a segment's table holding each document's first local row.
LOCAL = "__local"
#: The column of a segment's table holding how many rows (passages) each document spans.
SPAN = "__span"
#: Names a filterable column may not have (and every name starting with ``__``).
RESERVED = frozenset({ROW, LOCAL, SPAN, "vector", "raw"})


def filterable(names: list[str]) -> list[str]:
    """The names a filter keeps, in order: not the engine's own (``vector``, ``raw``, names
    starting with ``__``), and not one that differs only in case from an earlier name (DuckDB
    names ignore case: the first is the one a predicate names).

    An index written before the writes refused such metadata columns (``storage.schema``)
    keeps answering filters on its other columns.

    Example:
        >>> filterable(["id", "text", "__row", "topic", "Topic", "vector"])
        ['id', 'text', 'topic']
    """
    kept: dict[str, str] = {}
    for name in names:
        if name in RESERVED or name.startswith("__") or name.lower() in kept:
            continue
        kept[name.lower()] = name
    return list(kept.values())


@dataclass(frozen=True)
class SegmentRef:
    """One segment of a version, as the filter sees it.

    Attributes:
        name: the segment's name, unique in the index (its table is shared by name).
        offset: its first global row in the version.
        n_rows: how many rows it holds.
        load: returns its filterable columns (``id``, ``text``, metadata, and the passage
            columns when it has them) as an Arrow table of ``n_rows`` rows in local row order;
            called once, on first use.
    """

    name: str
    offset: int
    n_rows: int
    load: Callable[[], pa.Table]


@dataclass
class Segment:
    """A segment's DuckDB table (made on first use), its columns' Arrow types, its users."""

    key: str
    ref: SegmentRef
    users: int = 0
    types: dict[str, pa.DataType] | None = None  # set once the table exists
    sizes: dict[str, float] | None = None  # its columns' bytes per row (:func:`row_bytes`)
    lock: threading.Lock = field(default_factory=threading.Lock)


def quote(name: str) -> str:
    """``name`` as a DuckDB identifier."""
    return '"' + name.replace('"', '""') + '"'


def load_segment(ref: SegmentRef) -> pa.Table:
    """A segment's columns from its ``load``, checked, one row per document
    (:func:`documents_of`), with each document's first local row (``__local``) and, when a
    document spans several rows, each one's row count (``__span``; absent: one row each)."""
    try:
        table = ref.load()
    except (OSError, pa.ArrowException) as exc:
        raise IndexDamaged(
            f"cannot read the filter columns of segment {ref.name} ({exc})",
            "check the index with flowsearch info --verify",
        ) from None
    if table.num_rows != ref.n_rows:
        raise IndexDamaged(
            f"segment {ref.name} holds {table.num_rows} rows, its version says {ref.n_rows}",
            "check the index with flowsearch info --verify",
        )
    table, first, span = documents_of(table, ref.name)
    table = table.select(filterable(table.column_names))
    table = table.append_column(LOCAL, pa.array(first))
    if not len(span) or int(span.max()) == 1:
        return table  # every document one row: no column to store, fetch and expand
    return table.append_column(SPAN, pa.array(span))


def documents_of(table: pa.Table, name: str = "") -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """A segment's rows as documents: ``(one row per document, its first row, its row count)``
    (int64 arrays). Rows that are each a whole document (a segment without the passage
    columns) stand as they are; a document cut into passages keeps its first passage's row
    (the metadata is the same on each), its ``text`` rebuilt whole
    (:func:`~flowsearch.encode.passages.joined`).

    Raises:
        IndexDamaged: passage columns that do not number consecutive rows per document.

    Example:
        >>> rows = pa.table({"text": ["the cat. ", "cat. a dog.", "hi"], "__passage": [0, 1, 0],
        ...                  "__passages": [2, 2, 1], "__passage_start": [0, 4, 0],
        ...                  "__passage_end": [9, 15, 2]})
        >>> docs, first, span = documents_of(rows)
        >>> docs.column("text").to_pylist(), first.tolist(), span.tolist()
        (['the cat. a dog.', 'hi'], [0, 2], [2, 1])
    """
    n = table.num_rows
    if PASSAGE not in table.column_names:
        return table, np.arange(n, dtype=np.int64), np.ones(n, dtype=np.int64)
    number = table.column(PASSAGE).to_numpy().astype(np.int64)
    count = table.column(PASSAGES).to_numpy().astype(np.int64)
    first = np.flatnonzero(number == 0)
    span = count[first]
    if int(span.sum()) != n or not np.array_equal(number, np.arange(n) - np.repeat(first, span)):
        raise IndexDamaged(
            f"segment {name}'s passage columns do not number each document's rows in order",
            "rebuild the index",
        )
    docs = table.take(pa.array(first))
    cut = np.flatnonzero(span > 1)
    if len(cut):
        texts = docs.column("text").to_pylist()
        passages = table.column("text").to_pylist()
        starts = table.column(PASSAGE_START).to_pylist()
        ends = table.column(PASSAGE_END).to_pylist()
        for d in cut.tolist():
            a, b = int(first[d]), int(first[d] + span[d])
            texts[d] = joined(passages[a:b], starts[a:b], ends[a:b])
        at = docs.column_names.index("text")
        docs = docs.set_column(at, docs.field(at), pa.array(texts, docs.field(at).type))
    return docs, first.astype(np.int64), span


def row_bytes(table: pa.Table, vector: int = 2048) -> dict[str, float]:
    """Bytes per row a vector of ``vector`` rows of each column can take at most, in the
    DuckDB table made of ``table``: a string's longest value (and its 16-byte header), or the
    whole column spread over one vector, whichever is less; nested values count the whole column.

    Example:
        >>> row_bytes(pa.table({"t": ["a" * 100] * 4096, "n": [1] * 4096}))
        {'t': 116.0, 'n': 9.0}
    """
    sizes: dict[str, float] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        spread = column.nbytes / vector
        kind = column.type
        if (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
        ):
            longest = pc.max(pc.binary_length(column)).as_py() if len(column) else 0
            sizes[name] = min(spread, float(longest or 0) + 16.0) if len(column) else 0.0
        elif kind.num_fields == 0 and kind.bit_width > 0:
            sizes[name] = min(spread, kind.bit_width / 8 + 1)
        else:
            sizes[name] = spread  # nested: a vector may hold the whole column
    return sizes


def create_table(cursor: Any, key: str, table: pa.Table, memory_limit: int) -> None:
    """Copy ``table`` into the DuckDB table ``key`` (of the catalog every cursor sees).

    Raises:
        FlowsearchError: the filter database's memory limit cannot hold it.
    """
    source = f"{key}_source"
    cursor.register(source, table)
    try:
        cursor.execute(f"CREATE TABLE {key} AS SELECT * FROM {source}")
    except duckdb.OutOfMemoryException as exc:
        raise FlowsearchError(
            f"the filter columns need more than the filter database's {memory_limit // 2**20} "
            f"MiB ({first_line(exc)})",
            "open the searcher with a larger SearchOptions(filter_memory_bytes=...)",
        ) from None
    except duckdb.Error as exc:
        raise FlowsearchError(
            f"cannot load filter columns {table.column_names[:-1]} into DuckDB ({first_line(exc)})",
            "rename or drop the offending metadata column",
        ) from None
    finally:
        cursor.unregister(source)
