r"""Metadata filters: a SQL ``where`` predicate, evaluated by DuckDB, as a FAISS pre-filter.

One :class:`MetadataFilter` per Searcher holds one in-memory DuckDB database, locked down when it
is made: no file, network or extension access, no configuration change, no temporary directory
(nothing spills to disk), and a ``memory_limit`` that bounds the segments' tables and the
queries' working memory together. It knows *segments*: each segment's filterable columns
(``id``, ``text``, metadata; never vectors) are read once, on the first filtered query that needs
them, from an Arrow table the caller's ``load`` returns (read through file handles the caller
holds open, so a pinned reader keeps working after a later write's cleanup deleted the files),
copied into a DuckDB table, and kept while a live version uses them
(:mod:`flowsearch.search.filter_segments`). :meth:`MetadataFilter.version` gives a
:class:`VersionFilter` for one version: the UNION ALL of its segments, each row numbered
``__row`` = segment offset + local row (the global row), every column of the version's schema
present (NULL, typed, where a segment lacks it). A filter's row is a document: a long
document's passages are one row, its whole text, and match together
(:mod:`flowsearch.search.filter_segments`).

:meth:`VersionFilter.rows` turns a predicate (checked first on DuckDB's syntax tree, see
:mod:`flowsearch.search.predicate`) into the sorted global rows it matches;
:func:`flowsearch.ann.prefilter.filtered_search` then searches only those rows, so the answer is
the true top-k among matching rows. A predicate runs at most ``timeout`` seconds (interrupted
between DuckDB's vectors, by the filter's own watchdog thread), builds at most a quarter of
``memory_limit`` per vector of rows (what its functions may build is bounded by their output size,
:mod:`flowsearch.search.predicate_sizes`, and refused above that before it runs), and DuckDB
returns the memory it used to the system within about a second (its allocator's background
threads). A query that leaves DuckDB's database invalidated (a FATAL or INTERNAL error) is
answered with its error and the filter opens a fresh database: the next filter answers (its
segments' tables are made again on first use).

Example:
    >>> import pyarrow as pa
    >>> table = pa.table({"id": ["a", "b", "c"], "year": [2019, 2021, 2024]})
    >>> flt = MetadataFilter()
    >>> version = flt.version([SegmentRef("s1", 0, 3, lambda: table)],
    ...                       [("id", pa.string()), ("year", pa.int64())])
    >>> version.rows("year >= 2020").tolist()
    [1, 2]
    >>> flt.close()
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import cachetools
import duckdb
import numpy as np
import pyarrow as pa

from flowsearch.errors import BadInput
from flowsearch.search.filter_segments import (
    LOCAL,
    SPAN,
    Segment,
    SegmentRef,
    create_table,
    filterable,
    load_segment,
    quote,
    row_bytes,
)
from flowsearch.search.options import SearchOptions
from flowsearch.search.predicate import (
    MAX_WHERE_CHARS,
    ROW,
    TABLE,
    Predicate,
    PredicateCheck,
    allowed_functions,
    first_line,
    refused,
)
from flowsearch.search.predicate_sizes import VECTOR_ROWS
from flowsearch.search.watchdog import Watchdog

__all__ = ["MAX_WHERE_CHARS", "MetadataFilter", "SegmentRef", "VersionFilter"]

LOG = logging.getLogger(__name__)

#: DuckDB threads per filter: filters of concurrent queries already run side by side.
THREADS = 1
#: Bytes of matched row numbers a version's filter keeps, most recently used first (a tenant
#: filter repeats on every query).
ROWS_CACHE_BYTES = 64 * 2**20
#: The share of ``memory_limit`` a predicate may build per vector of rows (the rest holds the
#: segments' tables, and concurrent filters).
WORK_SHARE = 4
_DEFAULTS = SearchOptions()


class MetadataFilter:
    """One locked in-memory DuckDB database holding the filterable columns of segments.

    Safe to share between threads: each query runs on a cursor of its own.

    Args:
        threads: DuckDB threads per query (default: :data:`THREADS`).
        timeout: seconds a predicate may run (default: ``SearchOptions.filter_timeout``).
        memory_limit: bytes DuckDB's buffer manager may hold (default:
            ``SearchOptions.filter_memory_bytes``).
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        timeout: float | None = None,
        memory_limit: int | None = None,
    ) -> None:
        self.timeout = float(_DEFAULTS.filter_timeout if timeout is None else timeout)
        limit = int(_DEFAULTS.filter_memory_bytes if memory_limit is None else memory_limit)
        self.memory_limit = limit
        self.threads = int(THREADS if threads is None else threads)
        self._lock = threading.Lock()
        self._segments: dict[str, Segment] = {}
        self._idle: list[Any] = []  # cursors between queries (of the current database)
        self._ids = itertools.count()
        self._closed = False
        #: Interrupts this filter's late queries (its own: one Searcher's filters never wait
        #: on another's, and closing it stops the thread).
        self.watchdog = Watchdog()
        #: Counts the databases opened (a fresh one after DuckDB invalidated the last).
        self.generation = 0
        self._con = self._connect()
        self.functions = allowed_functions(self._con)

    def _connect(self) -> Any:
        """A new locked in-memory database."""
        config: dict[str, str | bool | int | float | list[str]] = {
            "threads": self.threads,
            "memory_limit": f"{max(1, self.memory_limit // 2**20)}MiB",  # DuckDB's MB is 10**6
            "temp_directory": "",  # never spill to disk: a filter's memory is its bound
            "max_temp_directory_size": "0KiB",
            # return freed memory to the system (without: a 1 GB filter's pages stay resident)
            "allocator_background_threads": True,
        }
        con = duckdb.connect(":memory:", config=config)
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        return con

    def _reopen(self, generation: int) -> None:
        """DuckDB invalidated database ``generation``: open a fresh one (once, whoever sees it
        first); every segment's table is made again on its next use."""
        with self._lock:
            if self._closed or generation != self.generation:
                return
            LOG.warning("the filter database was invalidated by a failed query; opening a new one")
            old, self._idle = self._con, []
            for seg in self._segments.values():
                seg.types = None
            self._con = self._connect()
            self.generation += 1
        with contextlib.suppress(duckdb.Error):
            old.close()

    def version(
        self, segments: Sequence[SegmentRef], schema: Sequence[tuple[str, pa.DataType]]
    ) -> VersionFilter:
        """The filter of one version: its segments, in row order, and its columns' types.

        Args:
            segments: the version's segments (offsets ascending, rows contiguous from 0).
            schema: every filterable column (``id``, ``text`` and the metadata columns) with
                its Arrow type; a segment lacking one gives NULLs of that type.

        A column the engine keeps for itself (``vector``, ``raw``, a name starting with
        ``__``) or differing only in case from an earlier one is left out of the filter
        (:func:`~flowsearch.search.filter_segments.filterable`): an index an earlier release
        let store such a metadata column answers filters on its other columns.
        """
        kept = set(filterable([name for name, _ in schema]))
        left_out = [name for name, _ in schema if name not in kept]
        if left_out:
            LOG.warning(
                "columns %s cannot be filtered on: reserved, or differing only in case from "
                "another (an earlier release stored them)",
                left_out,
            )
        schema = [(name, kind) for name, kind in schema if name in kept]
        with self._lock:
            used = []
            for ref in segments:
                seg = self._segments.get(ref.name)
                if seg is None:
                    seg = Segment(f"s{next(self._ids)}", ref)
                    self._segments[ref.name] = seg
                seg.users += 1
                used.append((seg, ref))
        return VersionFilter(self, f"v{next(self._ids)}", used, list(schema))

    def close(self) -> None:
        """Release the DuckDB database and every segment's table."""
        with self._lock:
            self._closed = True
            for cursor in self._idle:
                with contextlib.suppress(duckdb.Error):
                    cursor.close()
            self._idle.clear()
            self._segments.clear()
        self.watchdog.close()
        self._con.close()

    def __enter__(self) -> MetadataFilter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what versions share ----------------------------------------------------------------

    def _release(self, view: str, used: Sequence[tuple[Segment, SegmentRef]]) -> None:
        """A version closed: drop its view, and the tables no live version uses any more."""
        with self._lock:
            if self._closed:
                return
            drop = [f"DROP VIEW IF EXISTS {view}", f"DROP TABLE IF EXISTS e{view}"]
            for seg, ref in used:
                seg.users -= 1
                if seg.users <= 0 and self._segments.get(ref.name) is seg:
                    del self._segments[ref.name]
                    drop.append(f"DROP TABLE IF EXISTS {seg.key}")
            cursor = self._con.cursor()
        try:
            for sql in drop:
                cursor.execute(sql)
        except duckdb.Error:  # an invalidated database: its next query opens a fresh one
            pass
        finally:
            with contextlib.suppress(duckdb.Error):
                cursor.close()

    def _load(self, seg: Segment) -> dict[str, pa.DataType]:
        """The segment's table, made on first use (once, whoever asks first): its types."""
        with seg.lock:
            if seg.types is None:
                table = load_segment(seg.ref)
                with self._cursor() as cursor:
                    create_table(cursor, seg.key, table, self.memory_limit)
                seg.types = {f.name: f.type for f in table.schema}
                seg.sizes = row_bytes(table)
            return seg.types

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        """A cursor for one query, back to the pool after it; after an error, kept only if it
        still answers (a database DuckDB invalidated is replaced, :meth:`_reopen`)."""
        with self._lock:
            if self._closed:
                raise BadInput("this Searcher is closed", "open the index again")
            generation = self.generation
            cursor = self._idle.pop() if self._idle else self._con.cursor()
        ok = False
        try:
            yield cursor
            ok = True
        except BaseException:
            ok = self._answers(cursor, generation)
            raise
        finally:
            with self._lock:
                if ok and not self._closed and generation == self.generation:
                    self._idle.append(cursor)
                else:
                    with contextlib.suppress(duckdb.Error):
                        cursor.close()

    def _answers(self, cursor: Any, generation: int) -> bool:
        """Whether ``cursor`` still runs a query (after one failed on it); when its database
        is invalidated, a fresh one is opened."""
        try:
            cursor.execute("SELECT 1").fetchall()
            return True
        except duckdb.Error as exc:
            if isinstance(exc, (duckdb.FatalException, duckdb.InternalException)) or (
                "invalidated" in str(exc)
            ):
                self._reopen(generation)
            return False


class VersionFilter:
    """The filter of one pinned version (see :meth:`MetadataFilter.version`).

    Attributes:
        columns: the columns a predicate may name.
        ntotal: the version's rows (global rows are ``0 <= row < ntotal``).
    """

    def __init__(
        self,
        owner: MetadataFilter,
        key: str,
        used: list[tuple[Segment, SegmentRef]],
        schema: list[tuple[str, pa.DataType]],
    ) -> None:
        self._owner = owner
        self._key = key
        self._used = used
        self._schema = pa.schema([pa.field(name, kind) for name, kind in schema])
        self.columns: tuple[str, ...] = tuple(self._schema.names)
        self.ntotal = int(sum(ref.n_rows for _, ref in used))
        self._check = PredicateCheck(self.columns, owner.functions)
        self._checked: cachetools.LRUCache[str, Predicate | None] = cachetools.LRUCache(256)
        self._rows: cachetools.LRUCache[str, np.ndarray] = cachetools.LRUCache(
            ROWS_CACHE_BYTES, getsizeof=lambda rows: int(rows.nbytes)
        )
        self._cache_lock = threading.Lock()
        self._view_lock = threading.Lock()
        self._types: dict[str, str] | None = None  # the schema's DuckDB types, once made
        self._generation = -1  # the owner's database its view and typed table are made in
        self._column_bytes: dict[str, float] = {}  # bytes of a vector of each column, at most
        self._viewed = False
        self._spans = False  # whether a segment has a document of several rows (its view)
        self._closed = False

    def close(self) -> None:
        """Release this version's hold on its segments' tables (idempotent)."""
        if not self._closed:
            self._closed = True
            self._owner._release(self._key, self._used)

    def __enter__(self) -> VersionFilter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self, where: str | None) -> str | None:
        """The validated predicate (None when ``where`` is empty: no filter).

        Raises:
            BadInput: anything but one boolean expression over :attr:`columns`.
        """
        predicate = self._predicate(where)
        return None if predicate is None else predicate.sql

    def rows(self, where: str | None) -> np.ndarray:
        """Sorted global row numbers matching ``where`` (all rows when it is empty).

        Args:
            where: a SQL boolean expression over :attr:`columns`, e.g.
                ``"year >= 2020 AND lang = 'en'"``; ``None``, ``""`` or blanks: no filter.

        Returns:
            int64 array (m,), ascending, 0 <= row < :attr:`ntotal`; read-only when cached.

        Raises:
            BadInput: a predicate that is not one boolean expression over the columns, fails
                on the data (e.g. a bad cast), or runs longer than the timeout.
        """
        predicate = self._predicate(where)
        if predicate is None:
            return np.arange(self.ntotal, dtype=np.int64)
        with self._cache_lock:
            found = self._rows.get(predicate.sql)
        if found is not None:
            return found
        found = self._run(predicate)
        # a version is a snapshot, so a predicate's rows never change (unless it reads the clock)
        if not predicate.volatile:
            found.setflags(write=False)
            with self._cache_lock, contextlib.suppress(ValueError):  # larger than the cache
                self._rows[predicate.sql] = found
        return found

    def _predicate(self, where: str | None) -> Predicate | None:
        if where is None:
            return None
        if not isinstance(where, str):
            raise BadInput(f"where must be a SQL string, got {type(where).__name__}", param="where")
        with self._cache_lock:
            if where in self._checked:
                return self._checked[where]
        with self._owner._cursor() as cursor:
            checked = self._check(cursor, where, self._typed(cursor))
        with self._cache_lock:
            self._checked[where] = checked
        return checked

    def _typed(self, cursor: Any) -> str:
        """An empty table of the version's schema (to type predicates on), made once."""
        name = f"e{self._key}"
        with self._view_lock:
            if self._generation != self._owner.generation:  # a fresh database: make again
                self._types, self._viewed = None, False
                self._generation = self._owner.generation
            if self._types is None:
                create_table(cursor, name, self._schema.empty_table(), self._owner.memory_limit)
                described = cursor.execute(f"DESCRIBE {name}").fetchall()
                self._types = {row[0]: row[1] for row in described}
        return name

    def _view(self, cursor: Any) -> str:
        """The version's rows: its segments' tables, UNION ALL, ``__row`` global; made once,
        on the first filtered query (which makes the segments' tables it lacks)."""
        self._typed(cursor)
        with self._view_lock:
            if self._viewed:
                return self._key
        assert self._types is not None
        parts = []
        spans = False
        sizes: dict[str, float] = {}
        for seg, ref in self._used:
            have = self._owner._load(seg)
            for name, nbytes in (seg.sizes or {}).items():
                sizes[name] = max(sizes.get(name, 0.0), nbytes)
            spans = spans or SPAN in have
            span = SPAN if SPAN in have else f"CAST(1 AS BIGINT) AS {SPAN}"  # one row each
            columns = [f"CAST({ref.offset} AS BIGINT) + {LOCAL} AS {ROW}", span]
            for name, kind in self._types.items():
                if name in have and have[name] == self._schema.field(name).type:
                    columns.append(quote(name))
                else:  # missing (NULL) or typed otherwise by an older write: the schema's type
                    source = quote(name) if name in have else "NULL"
                    columns.append(f"CAST({source} AS {kind}) AS {quote(name)}")
            parts.append(f"SELECT {', '.join(columns)} FROM {seg.key}")
        if not parts:  # a version without rows
            parts.append(
                f"SELECT CAST(NULL AS BIGINT) AS {ROW}, CAST(NULL AS BIGINT) AS {SPAN}, * "
                f"FROM e{self._key}"
            )
        with self._view_lock:
            if not self._viewed:
                cursor.execute(f"CREATE VIEW {self._key} AS {' UNION ALL '.join(parts)}")
                self._spans = spans
                self._column_bytes = sizes
                self._viewed = True
        return self._key

    def _run(self, checked: Predicate) -> np.ndarray:
        """Execute a checked predicate on documents: the sorted rows of those it matches (a
        document cut into passages matches as a whole, with every row it spans)."""
        if self._closed:
            raise BadInput("this version's filter is closed", "search a version that is open")
        predicate = checked.sql
        owner = self._owner
        with owner._cursor() as cursor:
            view = self._view(cursor)
            self._check_work(checked)
            spans = self._spans  # else every document is one row: its first row is all
            wanted = f"{ROW}, {SPAN}" if spans else ROW
            sql = f"SELECT {wanted} FROM {view} AS {TABLE} WHERE (\n{predicate}\n)"
            token = owner.watchdog.watch(cursor, owner.timeout)
            try:
                found = cursor.execute(sql).fetchnumpy()
            except duckdb.InterruptException:
                raise refused(
                    predicate, f"ran longer than {owner.timeout:g} s", "simplify it"
                ) from None
            except duckdb.OutOfMemoryException:
                raise refused(
                    predicate,
                    f"needs more than the filter's {owner.memory_limit // 2**20} MiB",
                    "simplify it, or raise SearchOptions(filter_memory_bytes=...)",
                ) from None
            except duckdb.Error as exc:
                raise refused(predicate, first_line(exc), "fix the condition") from None
            finally:
                owner.watchdog.forget(token)
        first = np.asarray(found[ROW], np.int64)
        if not spans:
            return np.sort(first)
        return _spanned(first, np.asarray(found[SPAN], np.int64))

    def _check_work(self, checked: Predicate) -> None:
        """Refuse a predicate that could build more than its share of the filter's memory per
        vector of rows (its work, at the version's largest values)."""
        budget = self._owner.memory_limit / WORK_SHARE
        work = checked.work.bytes(self._column_bytes) * VECTOR_ROWS
        if work > budget:
            raise refused(
                checked.sql,
                f"could build {work / 2**20:,.0f} MiB per {VECTOR_ROWS} rows of this index, "
                f"more than the filter's {budget / 2**20:,.0f} MiB",
                "use fewer growing functions on long columns, or raise "
                "SearchOptions(filter_memory_bytes=...)",
            )


def _spanned(first: np.ndarray, span: np.ndarray) -> np.ndarray:
    """Sorted rows of the documents starting at rows ``first`` and spanning ``span`` rows each.

    Example:
        >>> _spanned(np.array([5, 0]), np.array([1, 3])).tolist()
        [0, 1, 2, 5]
    """
    order = np.argsort(first, kind="stable")
    first, span = first[order], span[order]
    if not len(span) or int(span.max()) == 1:
        return first
    starts = np.repeat(first - np.cumsum(span) + span, span)
    out: np.ndarray = starts + np.arange(int(span.sum()), dtype=np.int64)
    return out
