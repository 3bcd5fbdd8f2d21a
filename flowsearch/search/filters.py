r"""Metadata filters: a SQL ``where`` predicate, evaluated by DuckDB, as a FAISS pre-filter.

:class:`MetadataFilter` loads the filterable columns of an index version (``id``, ``text`` and the
metadata columns; never ``vector``/``raw``) into an in-memory DuckDB database once, then locks it
down: no file, network or extension access and no configuration change is possible afterwards.
:meth:`MetadataFilter.rows` turns a predicate into the sorted global row numbers (FAISS ids) it
matches; :func:`flowsearch.ann.prefilter.filtered_search` searches only those rows (minus deleted
ones), so the answer is the true top-k among matching rows, not a post-filtered top-k.

A predicate is data. Before it runs, DuckDB's own parser must read
``SELECT __row FROM meta WHERE (<where>)`` as exactly one plain SELECT of that shape, and the
predicate's syntax tree may hold only column references to the index's columns, constants,
operators, casts, CASE and deterministic built-in scalar functions: no subquery, table function,
aggregate, window, parameter, comment or ``;``. What the locked database would stop anyway (files,
``COPY``, ``ATTACH``, ``INSTALL``) is refused before it gets there.

Example:
    >>> flt = MetadataFilter(shard_paths, ["year", "lang"])  # doctest: +SKIP
    >>> rows = flt.rows("year >= 2020 AND lang = 'en'")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.errors import FlowsearchError

__all__ = [
    "MAX_WHERE_CHARS",
    "MetadataFilter",
]

LOG = logging.getLogger(__name__)

# faiss's bundled stubs lack the search-parameter and selector classes' keyword constructors.
_faiss: Any = faiss

#: Memory for the rows of recent predicates (per opened version).
ROWS_CACHE_BYTES = 64 * 2**20
#: Longest predicate accepted (a filter, not a program).
MAX_WHERE_CHARS = 8192

_TABLE = "meta"
_ROW = "__row"
_PREFIX = f"SELECT {_ROW} FROM {_TABLE} WHERE (\n"
_SUFFIX = "\n)"
# Time functions are not "CONSISTENT" in DuckDB's catalogue (they change between queries) but are
# what "since 30 days ago" filters need, and read no state worth hiding.
_TIME_FUNCTIONS = frozenset(
    {"now", "current_date", "current_time", "current_timestamp", "get_current_time"}
    | {"get_current_timestamp", "today", "transaction_timestamp", "localtimestamp", "localtime"}
)
# Built-in scalar macros that only compute on their arguments (others read the catalogue).
_PURE_MACROS = frozenset(
    {"if", "nullif", "split_part", "date_add", "fdiv", "fmod", "days_in_month", "array_to_string"}
)
# Expression node classes a predicate may contain (DuckDB's json_serialize_sql names).
_NODE_CLASSES = frozenset(
    {"COLUMN_REF", "CONSTANT", "COMPARISON", "CONJUNCTION", "OPERATOR", "FUNCTION", "CAST"}
    | {"CASE", "BETWEEN", "COLLATE", "TYPE"}
)


def _fail(where: str, problem: str, fix: str) -> FlowsearchError:
    shown = where if len(where) <= 80 else where[:77] + "..."
    # One line whatever the predicate holds, each character kept in place (positions refer to it).
    shown = "".join(c if c.isprintable() else " " for c in shown)
    return FlowsearchError(f"where={shown!r}: {problem}; {fix}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    for prefix in ("Parser Error: ", "Binder Error: ", "Conversion Error: ", "Catalog Error: "):
        line = line.removeprefix(prefix)
    return line[:200]


class _Watchdog:
    """Interrupts DuckDB cursors that outlive their deadline.

    One daemon thread polling a few times a second, started on first use: a timer thread per
    predicate costs a thread start on every query, which on a busy machine waits for the
    scheduler (measured: milliseconds at p95).
    """

    def __init__(self, period: float = 0.2) -> None:
        self.period = period
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[float, Any]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    def watch(self, cursor: Any, timeout: float) -> int:
        with self._lock:
            self._next += 1
            self._watched[self._next] = (time.monotonic() + timeout, cursor)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flowsearch-where-watchdog")
                self._thread.daemon = True
                self._thread.start()
            return self._next

    def forget(self, token: int) -> None:
        with self._lock:
            self._watched.pop(token, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.period)
            now = time.monotonic()
            with self._lock:
                late = [c for deadline, c in self._watched.values() if deadline <= now]
            for cursor in late:
                with contextlib.suppress(Exception):
                    cursor.interrupt()


_WATCHDOG = _Watchdog()


def _read_columns(shard_paths: Sequence[Path], names: Sequence[str]) -> pa.Table:
    """``__row`` plus the named columns of every shard, in global row order."""
    tables: list[pa.Table] = []
    start = 0
    for path in shard_paths:
        try:
            handle = pq.ParquetFile(path)
            present = [n for n in names if n in handle.schema_arrow.names]
            table = handle.read(columns=present)
        except (OSError, pa.ArrowException) as exc:
            raise FlowsearchError(f"cannot read shard {path} ({exc}); rebuild the index") from None
        rows = pa.array(np.arange(start, start + table.num_rows, dtype=np.int64))
        tables.append(table.add_column(0, _ROW, rows))
        start += table.num_rows
    if not tables:
        fields = [pa.field(_ROW, pa.int64())] + [pa.field(n, pa.null()) for n in names]
        return pa.schema(fields).empty_table()
    # Shards written by later `add`s may lack a column or type it differently: unify.
    table = pa.concat_tables(tables, promote_options="permissive")
    missing = [n for n in names if n not in table.column_names]
    for name in missing:
        table = table.append_column(name, pa.nulls(table.num_rows))
    return table.select([_ROW, *names])


class MetadataFilter:
    """The filterable columns of one index version in a locked, in-memory DuckDB database.

    Made once per opened index version (it is a snapshot: later writes need a new one). Safe to
    share between threads: every :meth:`rows` call runs on its own DuckDB cursor.

    Args:
        shard_paths: the version's Parquet shards, in row order (global row = FAISS id).
        columns: the metadata columns a predicate may use (besides ``id`` and ``text``).
        text: also load ``text``, for predicates like ``text LIKE '%tide%'`` (costs about the
            corpus's text size in memory; False keeps only ids and metadata).
        threads: DuckDB threads per predicate (1: queries run concurrently anyway).
        timeout: seconds a predicate may run before it is interrupted.

    Raises:
        FlowsearchError: an unreadable shard, or a column DuckDB cannot hold.
    """

    def __init__(
        self,
        shard_paths: Sequence[str | Path],
        columns: Sequence[str],
        *,
        text: bool = True,
        threads: int = 1,
        timeout: float = 10.0,
    ) -> None:
        names = [
            "id",
            *(["text"] if text else []),
            *[c for c in columns if c not in ("id", "text")],
        ]
        bad = [n for n in names if n in (_ROW, "vector", "raw")]
        if bad:
            raise FlowsearchError(f"column {bad[0]!r} cannot be filtered on; leave it out")
        self.columns: tuple[str, ...] = tuple(names)
        self.timeout = float(timeout)
        self._cache: OrderedDict[str, str | None] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._rows_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._rows_bytes = 0
        self._rows_lock = threading.Lock()
        table = _read_columns([Path(p) for p in shard_paths], names)
        self.ntotal = int(table.num_rows)
        # The table plus headroom: a predicate like length(repeat(text, 10^9)) > 0 fails with
        # an out-of-memory error instead of taking the process down.
        limit_mb = (2 * table.nbytes) // 2**20 + 512
        config: dict[str, str | bool | int | float | list[str]] = {
            "threads": int(threads),
            "memory_limit": f"{limit_mb}MB",
        }
        self._con = duckdb.connect(":memory:", config=config)
        try:
            self._con.register("__source", table)
            self._con.execute(f"CREATE TABLE {_TABLE} AS SELECT * FROM __source")
            self._con.unregister("__source")
            self._functions = self._allowed_functions()
            self._con.execute("SET TimeZone = 'UTC'")
            self._con.execute("SET autoinstall_known_extensions = false")
            self._con.execute("SET autoload_known_extensions = false")
            self._con.execute("SET enable_external_access = false")
            self._con.execute("SET lock_configuration = true")
        except duckdb.Error as exc:
            self._con.close()
            raise FlowsearchError(
                f"cannot load filter columns {list(names)} into DuckDB ({_first_line(exc)}); "
                "rename or drop the offending metadata column"
            ) from None
        self._lower = {c.lower(): c for c in self.columns}
        LOG.debug("filter table: %d rows, columns %s", self.ntotal, self.columns)

    def _allowed_functions(self) -> frozenset[str]:
        """Deterministic built-in scalar functions and operators, plus the time functions."""
        found = self._con.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() WHERE internal AND "
            "function_type = 'scalar' AND stability = 'CONSISTENT' AND NOT has_side_effects"
        ).fetchall()
        return frozenset(r[0].lower() for r in found) | _TIME_FUNCTIONS | _PURE_MACROS

    def close(self) -> None:
        """Release the DuckDB database."""
        self._con.close()

    def __enter__(self) -> MetadataFilter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- validation ---------------------------------------------------------------------------

    def check(self, where: str | None) -> str | None:
        """The validated predicate (None when ``where`` is empty: no filter).

        Raises:
            FlowsearchError: anything but one boolean expression over the columns.
        """
        if where is None:
            return None
        if not isinstance(where, str):
            raise FlowsearchError(f"where= must be a SQL string, got {type(where).__name__}")
        with self._cache_lock:
            if where in self._cache:
                self._cache.move_to_end(where)
                return self._cache[where]
        checked = self._check(where)
        with self._cache_lock:
            self._cache[where] = checked
            if len(self._cache) > 256:
                self._cache.popitem(last=False)
        return checked

    def _check(self, where: str) -> str | None:
        if not where.strip():
            return None
        if len(where) > MAX_WHERE_CHARS:
            raise _fail(where, f"longer than {MAX_WHERE_CHARS} characters", "shorten it")
        try:
            where.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail(where, "not valid text (lone surrogate)", "pass a plain string") from None
        if "\x00" in where:
            raise _fail(where, "contains a NUL character", "remove it")
        sql = _PREFIX + where + _SUFFIX
        tree = self._parse(where, sql)
        self._check_shape(where, tree)
        self._check_expression(where, tree["where_clause"])
        self._check_boolean(where)
        return where

    def _parse(self, where: str, sql: str) -> dict[str, Any]:
        try:
            tokens = duckdb.tokenize(sql)
        except Exception as exc:  # the tokenizer's errors are not one family
            raise _fail(where, f"cannot be read ({_first_line(exc)})", "fix the syntax") from None
        for start, kind in tokens:
            if kind == duckdb.token_type.comment:
                pos = start - len(_PREFIX)
                raise _fail(where, f"comment at character {pos}", "remove SQL comments")
        try:
            answer = self._con.cursor().execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
            parsed = json.loads(answer[0] if answer else "{}")
        except (duckdb.Error, ValueError, RecursionError, TypeError) as exc:
            raise _fail(where, f"cannot be read ({_first_line(exc)})", "simplify it") from None
        message = str(parsed.get("error_message") or "syntax error")
        if parsed.get("error"):
            if "depth" in message.lower():
                raise _fail(where, "nested too deeply", "simplify it")
            if parsed.get("position") is not None:  # a syntax error, with its position
                raise self._syntax_error(where, message, parsed["position"])
        # The serializer reads SELECTs only; the statement splitter names anything else.
        try:
            statements = duckdb.extract_statements(sql)
        except duckdb.Error as exc:
            raise self._syntax_error(where, exc) from None
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            # e.g. "1=1); COPY meta TO 'f'; SELECT (1": name what was smuggled in.
            kinds = [str(st.type).rsplit(".", 1)[-1] for st in statements[1:] or statements]
            raise _fail(
                where,
                f"holds more than one statement ({', '.join(kinds)} after ';')",
                "write one SQL condition, without ';'",
            )
        statements_json = parsed.get("statements") or []
        if parsed.get("error") or len(statements_json) != 1:
            raise _fail(where, f"cannot be read ({message})", "write one SQL condition")
        return statements_json[0]["node"]

    def _syntax_error(
        self, where: str, error: BaseException | str, position: Any = None
    ) -> FlowsearchError:
        message = error if isinstance(error, str) else _first_line(error)
        message = message.splitlines()[0] if message else "syntax error"
        try:
            pos = int(position) - len(_PREFIX)
        except (TypeError, ValueError):
            pos = -1
        if 0 <= pos <= len(where):
            near = " ".join(where[pos : pos + 20].split()) or "the end"
            where_at = f"at character {pos} (near {near!r})"
        else:
            where_at = "at the end" if pos > len(where) else ""
        return _fail(
            where,
            f"{message} {where_at}".strip(),
            "write one SQL condition, e.g. where=\"year >= 2020 AND lang = 'en'\"",
        )

    def _check_shape(self, where: str, node: dict[str, Any]) -> None:
        """The statement is still the one we wrote around the predicate, nothing added."""
        source = node.get("from_table") or {}
        select = node.get("select_list") or []
        extras = ("group_expressions", "group_sets", "modifiers", "having", "qualify", "sample")
        if (
            node.get("type") != "SELECT_NODE"
            or (node.get("cte_map") or {}).get("map")
            or source.get("type") != "BASE_TABLE"
            or source.get("table_name") != _TABLE
            or source.get("schema_name")
            or len(select) != 1
            or select[0].get("column_names") != [_ROW]
            or any(node.get(key) for key in extras)
            or node.get("where_clause") is None
        ):
            raise _fail(where, "closes the condition and adds SQL", "write one SQL condition")

    def _check_expression(self, where: str, root: dict[str, Any]) -> None:
        """Walk the predicate's syntax tree (iteratively: trees may be deep)."""
        stack: list[Any] = [root]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
                continue
            if not isinstance(item, dict):
                continue
            kind = item.get("class")
            if kind is None:
                stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
                continue
            if kind == "SUBQUERY":
                raise _fail(where, "contains a subquery", "filter on the index's columns only")
            if kind not in _NODE_CLASSES:
                raise _fail(where, f"uses {kind.lower()} expressions", "use plain conditions")
            if kind == "COLUMN_REF":
                self._check_column(where, item.get("column_names") or [])
            elif kind == "FUNCTION":
                self._check_function(where, item)
            elif kind == "TYPE" and (item.get("catalog") or item.get("schema")):
                raise _fail(where, "names a type in a schema", "use built-in types only")
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))

    def _check_column(self, where: str, parts: list[str]) -> None:
        if len(parts) >= 2 and parts[0].lower() == _TABLE and parts[1].lower() in self._lower:
            return
        if parts and parts[0].lower() in self._lower and parts[0] != _ROW:
            return  # a column, or a field of a struct column
        name = ".".join(parts)
        raise _fail(
            where,
            f"unknown column {name!r}",
            f"use one of {', '.join(self.columns)} (quote names with spaces in double quotes)",
        )

    def _check_function(self, where: str, item: dict[str, Any]) -> None:
        name = str(item.get("function_name", "")).lower()
        qualified = item.get("schema") or item.get("catalog")
        aggregate = (
            item.get("filter")
            or item.get("distinct")
            or item.get("export_state")
            or (item.get("order_bys") or {}).get("orders")
        )
        if qualified or aggregate or name not in self._functions:
            raise _fail(
                where,
                f"function {name}() is not allowed in a filter",
                "use comparisons, LIKE, IN, IS NULL and deterministic scalar functions",
            )

    def _check_boolean(self, where: str) -> None:
        sql = f"DESCRIBE SELECT (\n{where}\n) AS m FROM {_TABLE}"
        try:
            described = self._con.cursor().execute(sql).fetchall()
        except duckdb.Error as exc:
            raise _fail(where, _first_line(exc), "fix the condition") from None
        kind = str(described[0][1]).upper()
        if kind not in ("BOOLEAN", '"NULL"', "NULL"):
            raise _fail(
                where,
                f"is a {kind} expression, not a condition",
                'compare it, e.g. where="year >= 2020"',
            )

    # -- evaluation ---------------------------------------------------------------------------

    def rows(self, where: str | None) -> np.ndarray:
        """Sorted global row numbers matching ``where`` (all rows when it is empty).

        Args:
            where: a SQL boolean expression over :attr:`columns`, e.g.
                ``"year >= 2020 AND lang = 'en'"``; ``None``, ``""`` or blanks: no filter.

        Returns:
            int64 array (m,), ascending, 0 <= row < :attr:`ntotal`.

        Raises:
            FlowsearchError: a predicate that is not one boolean expression over the columns,
                fails on the data (e.g. a bad cast), or runs longer than ``timeout``.
        """
        predicate = self.check(where)
        if predicate is None:
            return np.arange(self.ntotal, dtype=np.int64)
        with self._rows_lock:
            hit = self._rows_cache.get(predicate)
            if hit is not None:
                self._rows_cache.move_to_end(predicate)
                return hit
        found = self._run(predicate)
        # a version is a snapshot, so a predicate's rows never change: keep the most recent ones
        # (a tenant filter repeats on every query), unless they depend on the clock
        if not any(f + "(" in predicate.lower() for f in _TIME_FUNCTIONS):
            found.setflags(write=False)
            with self._rows_lock:
                self._rows_cache[predicate] = found
                self._rows_bytes += found.nbytes
                while self._rows_bytes > ROWS_CACHE_BYTES and self._rows_cache:
                    self._rows_bytes -= self._rows_cache.popitem(last=False)[1].nbytes
        return found

    def _run(self, predicate: str) -> np.ndarray:
        """Execute a checked predicate: its sorted rows."""
        cursor = self._con.cursor()
        token = _WATCHDOG.watch(cursor, self.timeout)
        try:
            found = cursor.execute(_PREFIX + predicate + _SUFFIX).fetchnumpy()[_ROW]
        except duckdb.InterruptException:
            raise _fail(predicate, f"ran longer than {self.timeout:g} s", "simplify it") from None
        except duckdb.Error as exc:
            raise _fail(predicate, _first_line(exc), "fix the condition") from None
        finally:
            _WATCHDOG.forget(token)
            cursor.close()
        return np.sort(np.asarray(found, dtype=np.int64))
