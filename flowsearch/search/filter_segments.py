r"""What a filter database holds: segments' tables, and the cursors they are registered on.

A segment's filterable columns are read once (:func:`load_segment`) and registered, zero-copy,
on each DuckDB cursor that queries them: a registered Arrow table, like a temporary view, is
seen by its own connection only, so every cursor (:class:`Worker`) keeps track of its own.

Example:
    >>> import pyarrow as pa
    >>> ref = SegmentRef("s1", 0, 2, lambda: pa.table({"id": ["a", "b"]}))
    >>> load_segment(ref).column_names
    ['id', '__local']
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from flowsearch.errors import IndexDamaged
from flowsearch.search.predicate import ROW

__all__ = ["LOCAL", "RESERVED", "Segment", "SegmentRef", "Worker", "forget", "load_segment"]

#: The column of a segment's table holding its local row numbers.
LOCAL = "__local"
#: Names a filterable column may not have.
RESERVED = frozenset({ROW, LOCAL, "vector", "raw"})


@dataclass(frozen=True)
class SegmentRef:
    """One segment of a version, as the filter sees it.

    Attributes:
        name: the segment's name, unique in the index (its tables are shared by name).
        offset: its first global row in the version.
        n_rows: how many rows it holds.
        load: returns its filterable columns (``id``, ``text``, metadata) as an Arrow table of
            ``n_rows`` rows in local row order; called once, on first use.
    """

    name: str
    offset: int
    n_rows: int
    load: Callable[[], pa.Table]


@dataclass
class Segment:
    """A segment's table (loaded on first use) and how many live versions use it."""

    key: str
    ref: SegmentRef
    users: int = 0
    table: pa.Table | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Worker:
    """A DuckDB cursor (its own connection) and what is registered on it: a registered Arrow
    table and a temporary view are seen by their connection only."""

    cursor: Any
    tables: dict[str, pa.Table] = field(default_factory=dict)
    views: set[str] = field(default_factory=set)


def forget(worker: Worker, live: set[str]) -> None:
    """Drop what a worker registered for segments no live version uses (their memory)."""
    for key in [k for k in worker.tables if k not in live and not k.startswith("e")]:
        for view in list(worker.views):
            with contextlib.suppress(duckdb.Error):
                worker.cursor.execute(f"DROP VIEW IF EXISTS {view}")
        worker.views.clear()
        with contextlib.suppress(duckdb.Error):
            worker.cursor.unregister(key)
        del worker.tables[key]


def load_segment(ref: SegmentRef) -> pa.Table:
    """A segment's columns from its ``load``, checked, with its local row numbers."""
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
    keep = [name for name in table.column_names if name not in RESERVED]
    table = table.select(keep)
    return table.append_column(LOCAL, pa.array(np.arange(ref.n_rows, dtype=np.int64)))
