r"""A ``where`` predicate checked on DuckDB's own syntax tree before it runs.

A predicate is data. Before it runs, DuckDB's parser must read
``SELECT __row FROM meta WHERE (<where>)`` as exactly one plain SELECT of that shape, and the
predicate's syntax tree may hold only column references to the index's columns, constants,
operators, casts, CASE and deterministic built-in scalar functions: no subquery, table function,
aggregate, window, lambda, parameter, comment or ``;``. What the locked database would stop anyway
(files, ``COPY``, ``ATTACH``, ``INSTALL``) is refused before it gets there.

Two things are read from the tree rather than the text:

- whether the predicate reads the clock (``now()``, ``today ()``, and the SQL keywords
  ``current_date``, ``current_timestamp``, ..., which DuckDB parses as column references and binds
  to the time functions when no column has that name): such a predicate's rows are not cached;
- how large it can make a value. Functions are allowed by the size of what they return
  (:mod:`flowsearch.search.predicate_sizes`: an allow-list; ``repeat``, ``lpad``,
  ``bitstring``, ``range``, ... are refused, ``hex`` counts twice its input), a predicate's
  largest value may be at most :data:`MAX_GROWTH` times the columns it reads, and it names
  columns at most :data:`MAX_COLUMN_REFS` times. The checked :class:`Predicate` carries its
  *work* (the sizes of every value it builds, summed), which the filter turns into bytes per
  vector of rows once it knows the columns' sizes, and refuses above its memory bound.

Example:
    >>> import duckdb
    >>> con = duckdb.connect()
    >>> _ = con.execute("CREATE TABLE meta (__row BIGINT, year INTEGER, ts TIMESTAMP)")
    >>> check = PredicateCheck(["year", "ts"], allowed_functions(con))
    >>> check(con, "year >= 2020", "meta")
    Predicate(sql='year >= 2020', volatile=False)
    >>> check(con, "ts > current_date - INTERVAL 30 DAY", "meta").volatile
    True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb

from flowsearch.errors import BadInput
from flowsearch.jsonable import JSONObject, JSONValue
from flowsearch.search.predicate_sizes import (
    CAST_GROWTH,
    FIXED_BYTES,
    FUNCTIONS,
    MAX_GROWTH,
    PAIRWISE,
    PATTERNS,
    REFUSED,
    REWRITES,
    Size,
    sized,
)

__all__ = [
    "MAX_COLUMN_REFS",
    "MAX_GROWTH",
    "MAX_WHERE_CHARS",
    "PREFIX",
    "ROW",
    "SUFFIX",
    "TABLE",
    "Predicate",
    "PredicateCheck",
    "allowed_functions",
    "first_line",
    "refused",
]

#: Longest predicate accepted (a filter, not a program).
MAX_WHERE_CHARS = 8192
#: How many column references a predicate may hold: ``text || text || ...`` costs the square
#: of its length per row, within one vector of rows, which no timeout interrupts.
MAX_COLUMN_REFS = 32

TABLE = "meta"
ROW = "__row"
PREFIX = f"SELECT {ROW} FROM {TABLE} WHERE (\n"
SUFFIX = "\n)"
# Time functions are not "CONSISTENT" in DuckDB's catalogue (they change between queries) but are
# what "since 30 days ago" filters need, and read no state worth hiding.
_TIME_FUNCTIONS = frozenset(
    {"now", "current_date", "current_time", "current_timestamp", "get_current_time"}
    | {"get_current_timestamp", "today", "transaction_timestamp", "localtimestamp", "localtime"}
)
# SQL's time keywords: parsed as column references, bound to the functions of the same name.
_TIME_KEYWORDS = frozenset(
    {"current_date", "current_time", "current_timestamp", "localtime", "localtimestamp"}
)
# Expression node classes a predicate may contain (DuckDB's json_serialize_sql names).
_NODE_CLASSES = frozenset(
    {"COLUMN_REF", "CONSTANT", "COMPARISON", "CONJUNCTION", "OPERATOR", "FUNCTION", "CAST"}
    | {"CASE", "BETWEEN", "COLLATE", "TYPE"}
)
# Expression nodes whose value is a boolean (or another fixed-size value).
_FIXED_NODES = frozenset({"COMPARISON", "CONJUNCTION", "BETWEEN"})
_FIXED_OPERATORS = frozenset(
    {"OPERATOR_NOT", "OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL", "COMPARE_IN", "COMPARE_NOT_IN"}
)
_EXAMPLE = "write one SQL condition, e.g. {where=\"year >= 2020 AND lang = 'en'\"}"


@dataclass(frozen=True)
class Predicate:
    """A checked predicate: its SQL, whether it reads the clock (its rows change), and its work
    (bytes per row of every value it builds, summed: :mod:`flowsearch.search.predicate_sizes`)."""

    sql: str
    volatile: bool
    work: Size = field(default=Size(), repr=False, compare=False)


def refused(where: str, problem: str, fix: str) -> BadInput:
    """The one-line error for a refused predicate (``where='...': problem; fix``)."""
    shown = where if len(where) <= 80 else where[:77] + "..."
    # One line whatever the predicate holds, each character kept in place (positions refer to it).
    shown = "".join(c if c.isprintable() else " " for c in shown)
    return BadInput(f"where={shown!r}: {problem}", fix, param="where")


def first_line(exc: BaseException) -> str:
    """A DuckDB error's first line, without its class prefix."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    for prefix in ("Parser Error: ", "Binder Error: ", "Conversion Error: ", "Catalog Error: "):
        line = line.removeprefix(prefix)
    return line[:200]


def allowed_functions(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """The functions a predicate may call: the allow-list by output size
    (:data:`~flowsearch.search.predicate_sizes.FUNCTIONS`) that ``con``'s DuckDB knows."""
    found = con.execute(
        "SELECT DISTINCT lower(function_name) FROM duckdb_functions() WHERE internal"
    ).fetchall()
    return frozenset(FUNCTIONS) & frozenset(r[0] for r in found)


class PredicateCheck:
    """Checks predicates over a fixed set of columns.

    Args:
        columns: the columns a predicate may name (``id``, ``text`` and the metadata columns).
        functions: the functions it may call (:func:`allowed_functions`).
    """

    def __init__(self, columns: Sequence[str], functions: frozenset[str]) -> None:
        self.columns = tuple(columns)
        self.functions = functions
        self._lower = {c.lower(): c for c in self.columns}

    def __call__(self, con: duckdb.DuckDBPyConnection, where: str, table: str) -> Predicate | None:
        """The checked predicate (None when ``where`` is blank: no filter).

        Args:
            con: a DuckDB connection to parse with.
            where: the predicate.
            table: a table or view of ``con`` with the columns, to type the predicate on.

        Raises:
            BadInput: anything but one boolean expression over the columns.
        """
        if not where.strip():
            return None
        if len(where) > MAX_WHERE_CHARS:
            raise refused(where, f"longer than {MAX_WHERE_CHARS} characters", "shorten it")
        try:
            where.encode("utf-8")
        except UnicodeEncodeError:
            raise refused(where, "not valid text (lone surrogate)", "pass a plain string") from None
        if "\x00" in where:
            raise refused(where, "contains a NUL character", "remove it")
        tree = self._parse(con, where)
        self._check_shape(where, tree)
        volatile, work = self._check_expression(where, _object(tree["where_clause"]))
        self._check_boolean(con, where, table)
        return Predicate(where, volatile, work)

    # -- parsing --------------------------------------------------------------------------------

    def _parse(self, con: duckdb.DuckDBPyConnection, where: str) -> JSONObject:
        sql = PREFIX + where + SUFFIX
        try:
            tokens = duckdb.tokenize(sql)
        except Exception as exc:  # the tokenizer's errors are not one family
            raise refused(where, f"cannot be read ({first_line(exc)})", "fix the syntax") from None
        for start, kind in tokens:
            if kind == duckdb.token_type.comment:
                pos = start - len(PREFIX)
                raise refused(where, f"comment at character {pos}", "remove SQL comments")
        try:
            answer = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
            parsed = _object(json.loads(answer[0] if answer else "{}"))
        except (duckdb.Error, ValueError, RecursionError, TypeError) as exc:
            raise refused(where, f"cannot be read ({first_line(exc)})", "simplify it") from None
        message = str(parsed.get("error_message") or "syntax error")
        if parsed.get("error"):
            if "depth" in message.lower():
                raise refused(where, "nested too deeply", "simplify it")
            if parsed.get("position") is not None:  # a syntax error, with its position
                raise _syntax_error(where, message, parsed["position"])
        # The serializer reads SELECTs only; the statement splitter names anything else.
        try:
            statements = duckdb.extract_statements(sql)
        except duckdb.Error as exc:
            raise _syntax_error(where, first_line(exc)) from None
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            # e.g. "1=1); COPY meta TO 'f'; SELECT (1": name what was smuggled in.
            kinds = [str(st.type).rsplit(".", 1)[-1] for st in statements[1:] or statements]
            raise refused(
                where,
                f"holds more than one statement ({', '.join(kinds)} after ';')",
                "write one SQL condition, without ';'",
            )
        statements_json = _list(parsed.get("statements"))
        if parsed.get("error") or len(statements_json) != 1:
            raise refused(where, f"cannot be read ({message})", "write one SQL condition")
        return _object(_object(statements_json[0]).get("node"))

    def _check_shape(self, where: str, node: JSONObject) -> None:
        """The statement is still the one we wrote around the predicate, nothing added."""
        source = _object(node.get("from_table"))
        select = _list(node.get("select_list"))
        extras = ("group_expressions", "group_sets", "modifiers", "having", "qualify", "sample")
        if (
            node.get("type") != "SELECT_NODE"
            or _object(node.get("cte_map")).get("map")
            or source.get("type") != "BASE_TABLE"
            or source.get("table_name") != TABLE
            or source.get("schema_name")
            or len(select) != 1
            or _object(select[0]).get("column_names") != [ROW]
            or any(node.get(key) for key in extras)
            or node.get("where_clause") is None
        ):
            raise refused(where, "closes the condition and adds SQL", "write one SQL condition")

    # -- the expression -------------------------------------------------------------------------

    def _check_expression(self, where: str, root: JSONObject) -> tuple[bool, Size]:
        """Walk the predicate's syntax tree (iteratively: trees may be deep), checking each node
        and sizing it from its children: whether it reads the clock, and its work."""
        volatile = False
        references = 0
        largest = work = Size()
        sizes: dict[int, Size] = {}
        stack: list[tuple[JSONObject, bool]] = [(root, False)]
        while stack:
            item, done = stack.pop()
            kind = str(item.get("class"))
            if not done:
                if kind == "SUBQUERY":
                    raise refused(
                        where, "contains a subquery", "filter on the index's columns only"
                    )
                if kind not in _NODE_CLASSES:
                    raise refused(where, f"uses {kind.lower()} expressions", "use plain conditions")
                if kind == "COLUMN_REF":
                    volatile |= self._check_column(where, _names(item.get("column_names")))
                    references += 1
                elif kind == "TYPE" and (item.get("catalog") or item.get("schema")):
                    raise refused(where, "names a type in a schema", "use built-in types only")
                stack.append((item, True))
                stack.extend((child, False) for child in _children(item))
                continue
            if kind == "FUNCTION":  # after its arguments: a lambda is named as such
                volatile |= self._check_function(where, item)
            size, extra = self._size(where, item, [sizes.pop(id(c)) for c in _children(item)])
            sizes[id(item)] = size
            if kind not in ("COLUMN_REF", "CONSTANT", "TYPE"):
                work = work + size + extra
            largest = largest.most(size)
            if largest.growth() > MAX_GROWTH:
                raise refused(
                    where,
                    f"can make a value {largest.growth():g} times longer than the columns it reads",
                    f"use fewer growing functions (hex, replace, ...: at most {MAX_GROWTH}-fold)",
                )
        if references > MAX_COLUMN_REFS:
            raise refused(
                where,
                f"names columns {references} times",
                f"name at most {MAX_COLUMN_REFS} (a filter, not a program)",
            )
        return volatile, work

    def _size(self, where: str, item: JSONObject, children: list[Size]) -> tuple[Size, Size]:
        """A node's bytes per row, from its children's (in :func:`_children`'s order), and the
        work it does beyond building its value (bytes it reads again and again)."""
        return self._value_size(where, item, children), _work(where, item, children)

    def _value_size(self, where: str, item: JSONObject, children: list[Size]) -> Size:
        kind = item.get("class")
        if kind == "COLUMN_REF":
            name = self._column_of(_names(item.get("column_names")))
            return Size.constant(FIXED_BYTES) if name is None else Size.column(name)
        if kind == "CONSTANT":
            literal = item.get("value") or item.get("literal") or {}
            return Size.constant(len(json.dumps(literal)))
        if kind == "TYPE":
            return Size()
        total = Size()
        for child in children:
            total = total + child
        if kind in _FIXED_NODES or (kind == "OPERATOR" and item.get("type") in _FIXED_OPERATORS):
            return Size.constant(FIXED_BYTES)
        if kind == "CAST":
            return total.times(CAST_GROWTH) + Size.constant(FIXED_BYTES)
        if kind != "FUNCTION":  # CASE, COLLATE, COALESCE, list and struct access: the parts
            return total
        name = str(item.get("function_name", "")).lower()
        if name in REWRITES:
            return _rewritten(where, name, item, children)
        return sized(name, children)

    def _column_of(self, parts: list[str]) -> str | None:
        """The column a (checked) reference reads; None for a time keyword."""
        if len(parts) >= 2 and parts[0].lower() == TABLE and parts[1].lower() in self._lower:
            return self._lower[parts[1].lower()]
        if parts and parts[0].lower() in self._lower:
            return self._lower[parts[0].lower()]
        return None

    def _check_column(self, where: str, parts: list[str]) -> bool:
        """Refuse an unknown column; True for a time keyword (``current_date``, ...)."""
        if len(parts) >= 2 and parts[0].lower() == TABLE and parts[1].lower() in self._lower:
            return False
        if parts and parts[0].lower() in self._lower and parts[0] != ROW:
            return False  # a column, or a field of a struct column
        if len(parts) == 1 and parts[0].lower() in _TIME_KEYWORDS:
            return True  # no column of that name: DuckDB binds the time function
        name = ".".join(parts)
        raise refused(
            where,
            f"unknown column {name!r}",
            f"use one of {', '.join(self.columns)} (quote names with spaces in double quotes)",
        )

    def _check_function(self, where: str, item: JSONObject) -> bool:
        """Refuse a function that is not allowed; True for a time function."""
        name = str(item.get("function_name", "")).lower()
        qualified = item.get("schema") or item.get("catalog")
        aggregate = (
            item.get("filter")
            or item.get("distinct")
            or item.get("export_state")
            or _object(item.get("order_bys")).get("orders")
        )
        if name in REFUSED:
            raise refused(
                where,
                f"function {name}() is not allowed in a filter (it makes values of any size)",
                "compare the values as they are",
            )
        at = PATTERNS.get(name)
        arguments = _list(item.get("arguments"))
        if at is not None and len(arguments) > at and _constant_text(arguments[at]) is None:
            raise refused(
                where,
                f"{name}() takes a computed pattern (compiled again on every row)",
                "use a constant pattern",
            )
        if qualified or aggregate or name not in self.functions:
            raise refused(
                where,
                f"function {name}() is not allowed in a filter",
                "use comparisons, LIKE, IN, IS NULL and deterministic scalar functions",
            )
        return name in _TIME_FUNCTIONS

    def _check_boolean(self, con: duckdb.DuckDBPyConnection, where: str, table: str) -> None:
        sql = f"DESCRIBE SELECT (\n{where}\n) AS m FROM {table} AS {TABLE}"
        try:
            described = con.execute(sql).fetchall()
        except duckdb.Error as exc:
            raise refused(where, first_line(exc), "fix the condition") from None
        kind = str(described[0][1]).upper()
        if kind not in ("BOOLEAN", '"NULL"', "NULL"):
            raise refused(
                where,
                f"is a {kind} expression, not a condition",
                'compare it, e.g. {where="year >= 2020"}',
            )


def _object(value: JSONValue | None) -> JSONObject:
    """``value`` when it is a JSON object (a node of the tree), else an empty one."""
    return value if isinstance(value, dict) else {}


def _list(value: JSONValue | None) -> list[JSONValue]:
    """``value`` when it is a JSON list, else an empty one."""
    return value if isinstance(value, list) else []


def _names(value: JSONValue | None) -> list[str]:
    """A column reference's ``column_names`` (``[table, column, field...]``)."""
    return [str(part) for part in _list(value)]


def _children(item: JSONObject) -> list[JSONObject]:
    """The expression nodes directly under ``item``, in order (through argument wrappers and
    lists, e.g. a function's ``{name, expression}`` arguments or CASE's checks)."""
    found: list[JSONObject] = []
    stack: list[JSONValue] = [
        v for v in reversed(list(item.values())) if isinstance(v, (dict, list))
    ]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(reversed(value))
        elif isinstance(value, dict):
            if "class" in value:
                found.append(value)
            else:
                stack.extend(
                    v for v in reversed(list(value.values())) if isinstance(v, (dict, list))
                )
    return found


def _rewritten(where: str, name: str, item: JSONObject, children: list[Size]) -> Size:
    """A string rewrite's size: its input times its constant replacement's length (+1 for a
    regular expression's empty matches)."""
    at, empty_matches = REWRITES[name]
    arguments = _list(item.get("arguments"))
    value = _constant_text(arguments[at]) if len(arguments) > at else None
    if value is None or not children:
        raise refused(
            where,
            f"{name}() replaces with a computed value",
            "replace with a constant string",
        )
    return children[0].times(max(1, len(value)) + empty_matches)


def _work(where: str, item: JSONObject, children: list[Size]) -> Size:
    """The work of a similarity of two values (none for other nodes): one must be a constant of
    at most ``MAX_GROWTH`` characters, its work the product of the two lengths."""
    name = str(item.get("function_name", "")).lower()
    if item.get("class") != "FUNCTION" or name not in PAIRWISE:
        return Size()
    constants = [_constant_text(a) for a in _list(item.get("arguments"))]
    short = [len(c) for c in constants if c is not None and len(c) <= MAX_GROWTH]
    if len(children) != 2 or not short:
        raise refused(
            where,
            f"{name}() compares two values of any length (its work is their product)",
            f"compare with a constant string of at most {MAX_GROWTH} characters",
        )
    other = (
        children[1] if constants[0] is not None and len(constants[0]) <= MAX_GROWTH else children[0]
    )
    return other.times(max(1, min(short)))


def _constant_text(node: JSONValue | None) -> str | None:
    """The text of a constant (or a cast of one), else None."""
    if isinstance(node, dict) and "class" not in node:  # a named argument: {name, expression}
        node = node.get("expression")
    while isinstance(node, dict) and node.get("class") == "CAST":
        node = node.get("child")
    if not isinstance(node, dict) or node.get("class") != "CONSTANT":
        return None
    literal = node.get("value") or node.get("literal") or {}
    if isinstance(literal, dict):
        text = literal.get("text", literal.get("value"))
        return None if text is None else str(text)
    return str(literal)


def _syntax_error(where: str, message: str, position: JSONValue = None) -> BadInput:
    message = message.splitlines()[0] if message else "syntax error"
    try:
        number = position if isinstance(position, (int, float, str)) else None
        pos = -1 if number is None else int(number) - len(PREFIX)
    except ValueError:
        pos = -1
    if 0 <= pos <= len(where):
        near = " ".join(where[pos : pos + 20].split()) or "the end"
        at = f"at character {pos} (near {near!r})"
    else:
        at = "at the end" if pos > len(where) else ""
    return refused(where, f"{message} {at}".strip(), _EXAMPLE)
