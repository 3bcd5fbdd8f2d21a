r"""Metadata filters: a SQL ``where`` predicate, evaluated by DuckDB, as a FAISS pre-filter.

One :class:`MetadataFilter` per Searcher holds one in-memory DuckDB database, locked down when it
is made: no file, network or extension access, no configuration change, no temporary directory
(nothing spills to disk), a ``memory_limit`` for what its buffer manager holds. It knows
*segments*: each segment's filterable columns (``id``, ``text``, metadata; never vectors) are
read once, on the first filtered query that needs them, from an Arrow table the caller's
``load`` returns (read through file handles the caller holds open, so a pinned reader keeps
working after a later write's cleanup deleted the files), and kept while a live version uses
them. :meth:`MetadataFilter.version` gives a :class:`VersionFilter` for one version: the UNION
ALL of its segments, each row numbered ``__row`` = segment offset + local row (the global row),
every column of the version's schema present (NULL, typed, where a segment lacks it).

:meth:`VersionFilter.rows` turns a predicate (checked first on DuckDB's syntax tree, see
:mod:`flowsearch.search.predicate`) into the sorted global rows it matches;
:func:`flowsearch.ann.prefilter.filtered_search` then searches only those rows, so the answer is
the true top-k among matching rows. A predicate runs at most ``timeout`` seconds (interrupted
between DuckDB's vectors), and DuckDB returns the memory it used to the system within about a
second (its allocator's background threads).

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

import cachetools
import duckdb
import numpy as np
import pyarrow as pa

from flowsearch import settings
from flowsearch.errors import BadInput, IndexDamaged
from flowsearch.search.filter_segments import (
    LOCAL,
    RESERVED,
    Segment,
    SegmentRef,
    Worker,
    forget,
    load_segment,
)
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
from flowsearch.search.watchdog import Watchdog

__all__ = ["MAX_WHERE_CHARS", "MetadataFilter", "SegmentRef", "VersionFilter"]

LOG = logging.getLogger(__name__)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_WATCHDOG = Watchdog()


class MetadataFilter:
    """One locked in-memory DuckDB database holding the filterable columns of segments.

    Safe to share between threads: each query runs on a cursor of its own.

    Args:
        threads: DuckDB threads per query (default: ``settings.filter_threads``).
        timeout: seconds a predicate may run (default: ``settings.filter_timeout``).
        memory_limit: bytes DuckDB's buffer manager may hold (default:
            ``settings.filter_memory_bytes``).
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        timeout: float | None = None,
        memory_limit: int | None = None,
    ) -> None:
        tuned = settings.current()
        self.timeout = float(tuned.filter_timeout if timeout is None else timeout)
        limit = tuned.filter_memory_bytes if memory_limit is None else memory_limit
        config: dict[str, str | bool | int | float | list[str]] = {
            "threads": int(tuned.filter_threads if threads is None else threads),
            "memory_limit": f"{max(1, int(limit) // 2**20)}MB",
            "temp_directory": "",  # never spill to disk: a filter's memory is its bound
            # return freed memory to the system (without: a 1 GB filter's pages stay resident)
            "allocator_background_threads": True,
        }
        self._con = duckdb.connect(":memory:", config=config)
        self._con.execute("SET TimeZone = 'UTC'")
        self._con.execute("SET autoinstall_known_extensions = false")
        self._con.execute("SET autoload_known_extensions = false")
        self._con.execute("SET enable_external_access = false")
        self._con.execute("SET lock_configuration = true")
        self.functions = allowed_functions(self._con)
        self._lock = threading.Lock()
        self._segments: dict[str, Segment] = {}
        self._idle: list[Worker] = []
        self._ids = itertools.count()
        self._closed = False

    def version(
        self, segments: Sequence[SegmentRef], schema: Sequence[tuple[str, pa.DataType]]
    ) -> VersionFilter:
        """The filter of one version: its segments, in row order, and its columns' types.

        Args:
            segments: the version's segments (offsets ascending, rows contiguous from 0).
            schema: every filterable column (``id``, ``text`` and the metadata columns) with
                its Arrow type; a segment lacking one gives NULLs of that type.

        Raises:
            BadInput: a column that cannot be filtered on (``vector``, ``raw``, ``__row``).
        """
        bad = [name for name, _ in schema if name in RESERVED]
        if bad:
            raise BadInput(f"column {bad[0]!r} cannot be filtered on", "leave it out")
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
            for worker in self._idle:
                with contextlib.suppress(duckdb.Error):
                    worker.cursor.close()
            self._idle.clear()
            self._segments.clear()
        self._con.close()

    def __enter__(self) -> MetadataFilter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what versions share ----------------------------------------------------------------

    def _release(self, used: Sequence[tuple[Segment, SegmentRef]]) -> None:
        """A version closed: drop the segments no live version uses any more."""
        with self._lock:
            for seg, ref in used:
                seg.users -= 1
                if seg.users <= 0 and self._segments.get(ref.name) is seg:
                    del self._segments[ref.name]
            live = {seg.key for seg in self._segments.values()}
            for worker in self._idle:
                forget(worker, live)

    def _table(self, seg: Segment) -> pa.Table:
        """The segment's table, loaded on first use (once, whoever asks first)."""
        with seg.lock:
            if seg.table is None:
                seg.table = load_segment(seg.ref)
            return seg.table

    @contextlib.contextmanager
    def _worker(self) -> Iterator[Worker]:
        """A cursor for one query; back to the pool after it (closed if the query broke it)."""
        with self._lock:
            if self._closed:
                raise BadInput("this Searcher is closed", "open the index again")
            worker = self._idle.pop() if self._idle else Worker(self._con.cursor())
            live = {seg.key for seg in self._segments.values()}
        forget(worker, live)
        ok = False
        try:
            yield worker
            ok = True
        except (BadInput, IndexDamaged):
            ok = True  # the caller's problem, not the cursor's: keep it
            raise
        finally:
            with self._lock:
                if ok and not self._closed:
                    self._idle.append(worker)
                else:
                    with contextlib.suppress(duckdb.Error):
                        worker.cursor.close()


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
            settings.current().filter_rows_cache_bytes, getsizeof=lambda rows: int(rows.nbytes)
        )
        self._cache_lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Release this version's hold on its segments' tables (idempotent)."""
        if not self._closed:
            self._closed = True
            self._owner._release(self._used)

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
        found = self._run(predicate.sql)
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
        with self._owner._worker() as worker:
            checked = self._check(worker.cursor, where, self._empty(worker))
        with self._cache_lock:
            self._checked[where] = checked
        return checked

    def _empty(self, worker: Worker) -> str:
        """An empty table of the version's schema on ``worker`` (to type predicates on)."""
        name = f"e{self._key}"
        if name not in worker.tables:
            worker.tables[name] = self._schema.empty_table()
            worker.cursor.register(name, worker.tables[name])
        return name

    def _view(self, worker: Worker) -> str:
        """The version's rows on ``worker``: its segments' tables, UNION ALL, ``__row`` global."""
        if self._key in worker.views:
            return self._key
        described = worker.cursor.execute(f"DESCRIBE {self._empty(worker)}").fetchall()
        types = {row[0]: row[1] for row in described}
        parts = []
        for seg, ref in self._used:
            table = self._owner._table(seg)
            if seg.key not in worker.tables:
                worker.cursor.register(seg.key, table)
                worker.tables[seg.key] = table
            columns = [f"CAST({ref.offset} AS BIGINT) + {LOCAL} AS {ROW}"]
            for name, kind in types.items():
                have = name in table.column_names
                source = _quote(name) if have else "NULL"
                same = have and table.schema.field(name).type == self._schema.field(name).type
                columns.append(
                    f"{source} AS {_quote(name)}" if same else
                    f"CAST({source} AS {kind}) AS {_quote(name)}"
                )  # fmt: skip
            parts.append(f"SELECT {', '.join(columns)} FROM {seg.key}")
        if not parts:  # a version without rows
            parts.append(f"SELECT CAST(NULL AS BIGINT) AS {ROW}, * FROM {self._empty(worker)}")
        worker.cursor.execute(f"CREATE TEMP VIEW {self._key} AS {' UNION ALL '.join(parts)}")
        worker.views.add(self._key)
        return self._key

    def _run(self, predicate: str) -> np.ndarray:
        """Execute a checked predicate: its sorted rows."""
        if self._closed:
            raise BadInput("this version's filter is closed", "search a version that is open")
        with self._owner._worker() as worker:
            view = self._view(worker)
            sql = f"SELECT {ROW} FROM {view} AS {TABLE} WHERE (\n{predicate}\n)"
            token = _WATCHDOG.watch(worker.cursor, self._owner.timeout)
            try:
                found = worker.cursor.execute(sql).fetchnumpy()[ROW]
            except duckdb.InterruptException:
                raise refused(
                    predicate, f"ran longer than {self._owner.timeout:g} s", "simplify it"
                ) from None
            except duckdb.Error as exc:
                raise refused(predicate, first_line(exc), "fix the condition") from None
            finally:
                _WATCHDOG.forget(token)
        return np.sort(np.asarray(found, dtype=np.int64))
