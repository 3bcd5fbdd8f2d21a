"""Fuzzed ``where`` filters: nested calls over the filter grammar, the size-growing functions
most of all (issue 41). Each answers rows or one line of BadInput, within the filter's time
and memory, and the filter answers an ordinary predicate after it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowsearch.errors import FlowsearchError
from flowsearch.search.filters import MetadataFilter, SegmentRef, VersionFilter
from flowsearch.search.predicate_sizes import FUNCTIONS, REFUSED
from fuzz.fuzz_limits import FILTER_MEMORY, FILTER_TIMEOUT

ROWS = 2400
#: Seconds past the filter's timeout a refused or interrupted filter may take (a vector's work,
#: the watchdog's period, a loaded machine).
SLACK = 4.0
GROWING = ["hex", "bin", "to_base64", "url_encode", "lower", "upper", "reverse", "translate",
           "nfc_normalize", "strip_accents", "md5", "trim", "unhex", "from_base64",
           "string_split", "repeat", "lpad", "rpad", "bitstring", "printf", "format",
           "to_base"]  # fmt: skip


@pytest.fixture(scope="module")
def flt() -> Iterator[VersionFilter]:
    rng = np.random.default_rng(41)
    words = np.array(["tide", "moon", "sea", "heat", "pump", "é", "ß", "\u0130", "%", "'"])
    table = pa.table(
        {
            "id": [f"d{i}" for i in range(ROWS)],
            "text": [" ".join(rng.choice(words, int(rng.integers(1, 400)))) for _ in range(ROWS)],
            "year": pa.array(1990 + np.arange(ROWS) % 30, pa.int32()),
            "score": rng.normal(size=ROWS),
            "tags": [list(rng.choice(words, 3)) for _ in range(ROWS)],
        }
    )
    schema = [(name, table.schema.field(name).type) for name in table.column_names]
    db = MetadataFilter(timeout=FILTER_TIMEOUT, memory_limit=FILTER_MEMORY)
    version = db.version([SegmentRef("s", 0, ROWS, lambda: table)], schema)
    assert version.rows("year = 1990").size == ROWS // 30
    yield version
    version.close()
    db.close()


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


LEAVES = st.one_of(
    st.sampled_from(["text", "id", "year", "score", "tags", "meta.text", "current_date"]),
    st.integers(-(2**40), 2**40).map(str),
    st.sampled_from(["2147483647", "-1", "0", "1e308", "NULL", "TRUE", "1000000000"]),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8).map(_quoted),
    st.sampled_from(["'" + "x" * 200 + "'", "''", "'%'", "'1'", "'[1,2]'", "'\\xAA'"]),
    st.sampled_from(["[1, 2]", "['a', 'b']", "{'a': 1}", "DATE '2020-01-01'", "INTERVAL 1 DAY"]),
)
ODD = ["nope", "read_csv", "getenv", "uuid", "random", "now"]
NAMES = st.sampled_from(sorted(FUNCTIONS) + sorted(REFUSED) + ODD)


def _expressions(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    call = st.builds(
        lambda name, args: f"{name}({', '.join(args)})", NAMES, st.lists(children, max_size=3)
    )
    binary = st.builds(
        lambda a, op, b: f"({a} {op} {b})",
        children, st.sampled_from(["||", "+", "*", "=", "AND", "LIKE", "IN"]), children,
    )  # fmt: skip
    cast = st.builds(
        lambda a, kind: f"CAST({a} AS {kind})",
        children, st.sampled_from(["VARCHAR", "VARCHAR[]", "BLOB", "BIT", "INTEGER", "DOUBLE"]),
    )  # fmt: skip
    case = st.builds(lambda a, b, c: f"CASE WHEN {a} THEN {b} ELSE {c} END", children, children,
                     children)  # fmt: skip
    index = st.builds(lambda a: f"{a}[1]", children)
    return st.one_of(call, binary, cast, case, index)


EXPRESSIONS = st.recursive(LEAVES, _expressions, max_leaves=12)
#: Deep chains of the functions that can grow a value (hex doubles it, bin makes it 8-fold).
CHAINS = st.builds(
    lambda names, inner: "".join(f"{n}(" for n in names) + inner + ")" * len(names),
    st.lists(st.sampled_from(GROWING), min_size=1, max_size=20),
    st.sampled_from(["text", "id", "CAST(year AS VARCHAR)", "'abc'", "bitstring('1', 2147483647)"]),
)
UNARY_TEXT = ["lower", "upper", "hex", "to_base64", "reverse", "trim", "md5", "url_encode",
              "strip_accents", "nfc_normalize", "bin", "ucase", "to_hex", "ltrim"]  # fmt: skip
TEXT_CALLS = ["{} || {}", "concat({}, {})", "concat_ws({}, {}, {})", "replace({}, 'e', 'bbb')",
              "regexp_replace({}, 'e', 'xx', 'g')", "left({}, N)", "substring({}, 2, N)",
              "repeat({}, N)", "lpad({}, N, 'x')", "rpad({}, N, {})", "translate({}, 'ae', 'éß')",
              "CAST(string_split({}, ' ') AS VARCHAR)", "CASE WHEN year > 2000 THEN {} ELSE {} END",
              "CAST(CAST({} AS BLOB) AS VARCHAR)", "coalesce({}, {})",
              "CAST(bitstring({}, N) AS VARCHAR)", "printf('%0Nd', year)"]  # fmt: skip
#: Counts and widths: small, large, and the largest a 32-bit argument takes.
COUNTS = st.sampled_from(["3", "100", "100000", "2147483647"])


def _text_calls(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    unary = st.builds(lambda f, a: f"{f}({a})", st.sampled_from(UNARY_TEXT), children)
    call = st.builds(
        lambda form, args, n: form.replace("N", n).format(*args[: form.count("{}")]),
        st.sampled_from(TEXT_CALLS), st.lists(children, min_size=3, max_size=3), COUNTS,
    )  # fmt: skip
    return st.one_of(unary, call)


#: Text-typed expressions (they bind, so they run or meet the size bounds).
TEXTS = st.recursive(st.sampled_from(["text", "id", "'1'", "CAST(year AS VARCHAR)"]),
                     _text_calls, max_leaves=10)  # fmt: skip
WRAPS = st.sampled_from(["length({}) > 0", "{} IS NOT NULL", "{} = 'x'", "{}", "len({}) > 1",
                         "CAST({} AS VARCHAR) <> ''"])  # fmt: skip
WHERES = st.builds(lambda wrap, e: wrap.format(e), WRAPS, st.one_of(EXPRESSIONS, CHAINS, TEXTS))


def _answers_or_refuses(flt: VersionFilter, where: str) -> None:
    started = time.monotonic()
    try:
        rows = flt.rows(where)
    except FlowsearchError as exc:
        text = str(exc)
        assert text and "\n" not in text and "Traceback" not in text, text
        # bounded before it runs: a filter that met the memory limit built too much per vector
        assert "Out of Memory" not in text and "needs more than the filter" not in text, text
    else:
        assert rows.dtype == np.int64 and (rows.size == 0 or 0 <= rows[0] <= rows[-1] < ROWS)
    elapsed = time.monotonic() - started
    assert elapsed < FILTER_TIMEOUT + SLACK, (where, elapsed)
    assert flt.rows("year = 1991").size == ROWS // 30  # the engine answers after it


@settings(parent=settings.get_profile("fuzz"), max_examples=200)
@given(where=WHERES)
def test_fuzzed_filters_answer_or_refuse_in_one_line(flt: VersionFilter, where: str) -> None:
    _answers_or_refuses(flt, where)


@settings(parent=settings.get_profile("fuzz"), max_examples=100)
@given(where=st.builds(lambda wrap, e: wrap.format(e), WRAPS, st.one_of(CHAINS, TEXTS)))
def test_growing_chains_stay_within_the_filter_limits(flt: VersionFilter, where: str) -> None:
    _answers_or_refuses(flt, where)


#: Arguments at the edges: a count or width of 2**31 - 1, the longest column twice.
EXTREME_ARGUMENTS = ["'1', 2147483647", "text, 2147483647, 'x'", "text, text"]


def test_every_known_function_with_extreme_arguments_stays_within_the_limits(
    flt: VersionFilter,
) -> None:
    """A sweep, not a sample: each function the filter allows or refuses by name, called with
    arguments at the edges (``bitstring('1', 2147483647)`` ran 90 s over a 10 s limit)."""
    names = sorted(set(FUNCTIONS) | REFUSED)
    for name in names:
        if not name.isidentifier():
            continue  # operators: their arguments are on each side, tried above
        for arguments in EXTREME_ARGUMENTS:
            _answers_or_refuses(flt, f"length(CAST({name}({arguments}) AS VARCHAR)) > 0")
