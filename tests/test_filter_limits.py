"""The filter sandbox's bounds (issue 41): what a predicate may build, its watchdog, and a fresh
database after DuckDB invalidates one. Small limits throughout (64 MiB, 1-2 s): a hole here
must fail a test, not exhaust the machine the tests run on."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from flowsearch.errors import BadInput, FlowsearchError
from flowsearch.search.filters import MetadataFilter, SegmentRef, VersionFilter
from flowsearch.search.predicate_sizes import FUNCTIONS, REFUSED

MIB = 2**20
ROWS = 3000


def _nested(function: str, depth: int, inner: str = "text") -> str:
    return f"{function}(" * depth + inner + ")" * depth


@pytest.fixture(scope="module")
def small() -> Iterator[dict[str, Any]]:
    """A filter of 64 MiB and 2 s over 3,000 documents of 2 KB (4 MiB per vector of text)."""
    table = pa.table(
        {
            "id": [f"d{i}" for i in range(ROWS)],
            "text": [("tide moon sea " * 150)[: 2000 + i % 7] for i in range(ROWS)],
            "year": pa.array([1990 + i % 30 for i in range(ROWS)], pa.int32()),
        }
    )
    schema = [("id", pa.string()), ("text", pa.string()), ("year", pa.int32())]
    db = MetadataFilter(timeout=2.0, memory_limit=64 * MIB)
    flt = db.version([SegmentRef("s", 0, ROWS, lambda: table)], schema)
    assert flt.rows("year = 1990").size == ROWS // 30  # loaded
    yield {"db": db, "filter": flt}
    flt.close()
    db.close()


def _refused_fast(flt: VersionFilter, where: str, message: str) -> None:
    started = time.monotonic()
    with pytest.raises(BadInput) as info:
        flt.rows(where)
    assert re.search(message, str(info.value)), str(info.value)
    assert "\n" not in str(info.value) and str(info.value).startswith("where=")
    assert time.monotonic() - started < 2  # refused before it ran
    assert flt.rows("year = 1991").size == ROWS // 30  # and the filter still answers


def test_nested_hex_of_the_issue_is_refused(small: dict) -> None:
    # 14 levels answered at 3.3 GB with a 2 GiB limit: each hex() doubles its input
    _refused_fast(small["filter"], f"length({_nested('hex', 14)}) > 0", "times longer")
    _refused_fast(small["filter"], f"length({_nested('hex', 7)}) > 0", "128 times longer")


def test_bitstring_of_any_width_is_refused(small: dict) -> None:
    # ran 90 s at 12.7 GB with a 10 s limit: one value, built within one vector
    where = "length(hex(bitstring('1', 2147483647)::VARCHAR)) > 0"
    _refused_fast(small["filter"], where, r"bitstring\(\) is not allowed")


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("length(lpad(id, 2147483647, 'x')) > 0", r"lpad\(\) is not allowed"),
        ("length(rpad(id, 99999999, 'x')) > 0", r"rpad\(\) is not allowed"),
        ("length(repeat(id, 1000000)) > 0", r"repeat\(\) is not allowed"),
        ("len(generate_series(1, 1000000000)) > 0", r"generate_series\(\) is not allowed"),
        ("length(string_agg(text, ',')) > 0", r"string_agg\(\) is not allowed"),
        ("len(list_resize([1], 1000000000)) > 0", r"list_resize\(\) is not allowed"),
        ("length(array_to_string(string_split(text, ''), text)) > 0", "array_to_string"),
        ("levenshtein(text, text) > 0", "compares two values of any length"),
        ("length(to_base(year, 2, 2147483647)) > 0", r"to_base\(\) is not allowed"),
        ("length(format('{:>2000000000}', id)) > 0", r"format\(\) is not allowed"),
        ("len(range(year)) > 0", r"range\(\) is not allowed"),
        ("length(uuid()) > 0", r"uuid\(\) is not allowed"),
    ],
)
def test_functions_whose_output_a_count_sizes_are_refused(
    small: dict, where: str, message: str
) -> None:
    _refused_fast(small["filter"], where, message)


def test_growth_within_the_bound_is_refused_by_the_data_it_would_build(small: dict) -> None:
    flt = small["filter"]
    # 62 times 4 MiB of text per vector of rows: more than a quarter of the filter's 64 MiB
    built = r"could build [0-9,]+ MiB per 2048 rows"
    _refused_fast(flt, f"length({_nested('hex', 5)}) > 0", built)
    # the same on the short ids is a few MiB: it runs
    assert flt.rows(f"length({_nested('hex', 5, 'id')}) > 0").size == ROWS
    assert flt.rows("length(hex(text)) >= 4000").size == ROWS  # one level of hex on text runs


def test_allowed_and_refused_do_not_overlap() -> None:
    assert not set(FUNCTIONS) & REFUSED


def test_each_filter_owns_its_watchdog_and_close_stops_it(small: dict) -> None:
    with MetadataFilter(timeout=1.0) as a, MetadataFilter(timeout=1.0) as b:
        assert a.watchdog is not b.watchdog
        table = pa.table({"id": ["x"]})
        with a.version([SegmentRef("s", 0, 1, lambda: table)], [("id", pa.string())]) as flt:
            assert flt.rows("id = 'x'").tolist() == [0]
        thread = a.watchdog._thread
        assert thread is not None and thread.is_alive()
    thread.join(2)
    assert not thread.is_alive() and a.watchdog._thread is None


def test_an_interrupt_after_forget_never_reaches_the_cursor() -> None:
    """The watchdog interrupts under its lock: after forget() returns, the pooled cursor's next
    query is safe from the earlier deadline."""
    from flowsearch.search.watchdog import Watchdog

    class Cursor:
        interrupted = 0

        def interrupt(self) -> None:
            self.interrupted += 1

    dog = Watchdog(period=0.001)
    cursors = [Cursor() for _ in range(200)]
    for cursor in cursors:
        token = dog.watch(cursor, 0.0)
        threading.Event().wait(0.0005)
        dog.forget(token)
        seen = cursor.interrupted
        threading.Event().wait(0.003)
        assert cursor.interrupted == seen <= 1
    dog.close()


# -- a database DuckDB invalidated is replaced ---------------------------------------------------

INVALIDATED = (
    "FATAL Error: Failed: database has been invalidated because of a previous fatal error. "
    "The database must be restarted prior to being used again."
)


class _Invalidated:
    """What DuckDB's connection and every cursor of it do once the database is invalidated."""

    def cursor(self) -> _Invalidated:
        return self

    def execute(self, *args: object) -> Any:
        raise duckdb.FatalException(INVALIDATED)

    def register(self, *args: object) -> None:
        raise duckdb.FatalException(INVALIDATED)

    def unregister(self, *args: object) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def close(self) -> None:
        pass


def invalidate(db: MetadataFilter) -> None:
    """Leave ``db`` as a FATAL error leaves DuckDB's database: every query on it fails."""
    with db._lock:
        db._con = _Invalidated()
        db._idle = [_Invalidated() for _ in db._idle]


def test_an_invalidated_database_is_replaced_and_the_next_filter_answers() -> None:
    table = pa.table({"id": ["a", "b", "c"], "year": [2019, 2021, 2024]})
    calls: list[int] = []

    def load() -> pa.Table:
        calls.append(1)
        return table

    with MetadataFilter(memory_limit=64 * MIB) as db:
        flt = db.version([SegmentRef("s", 0, 3, load)], [("id", pa.string()), ("year", pa.int64())])
        assert flt.rows("year >= 2020").tolist() == [1, 2]
        invalidate(db)
        with pytest.raises(FlowsearchError, match="invalidated"):
            flt.rows("year < 2020")  # the query that meets the invalidated database fails...
        assert flt.rows("year < 2020").tolist() == [0]  # ...the next one answers
        assert flt.rows("year >= 2020").tolist() == [1, 2]  # (cached) and so do repeats
        assert flt.rows("id = 'c'").tolist() == [2]
        assert len(calls) == 2  # the segment's table was made again in the fresh database
        flt.close()


def test_a_hostile_then_an_ordinary_filter_on_one_searcher_and_one_server(
    tmp_path: Path, model_dir: Path
) -> None:
    from corpus_helpers import write_corpus
    from fastapi.testclient import TestClient

    from flowsearch.search.options import SearchOptions
    from flowsearch.search.searcher import Searcher
    from flowsearch.server import create_app
    from flowsearch.writes.build import build_index

    index = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=40, seed=3), index, model=str(model_dir))
    options = SearchOptions(filter_memory_bytes=64 * MIB, filter_timeout=2.0)
    hostile = f"length({_nested('hex', 14)}) > 0"
    s = Searcher.open(index, options=options)
    try:
        with pytest.raises(BadInput, match="times longer"):
            s.search("tide", where=hostile)
        assert s.search("tide", k=3, where="year >= 2000")
        invalidate(s._backend.filter_database())  # as a FATAL error leaves it
        with pytest.raises(FlowsearchError):
            s.search("tide", k=3, where="year >= 2001")
        assert s.search("tide", k=3, where="year >= 2001")
    finally:
        s.close()
    with TestClient(create_app(index, options=options), raise_server_exceptions=False) as c:
        r = c.post("/search", json={"query": "tide", "where": hostile})
        assert r.status_code == 400 and "times longer" in r.json()["detail"], r.text
        searcher = c.app.state.service.searcher  # type: ignore[attr-defined]
        invalidate(searcher._backend.filter_database())
        first = c.post("/search", json={"query": "tide", "where": "year >= 2002"})
        assert first.status_code < 500, first.text
        r = c.post("/search", json={"query": "tide", "k": 3, "where": "year >= 2002"})
        assert r.status_code == 200 and r.json()["hits"], r.text


@pytest.mark.parametrize(
    "where",
    ["length(regexp_extract(text, text)) > 0", "regexp_matches(id, text)",
     "regexp_replace(id, text, 'x') = ''", "len(regexp_split_to_array(id, text)) > 1"],
)  # fmt: skip
def test_a_computed_regular_expression_is_refused(small: dict, where: str) -> None:
    # found by the fuzz suite: a pattern from a column is compiled on every row (9 s per vector)
    _refused_fast(small["filter"], where, "takes a computed pattern")
