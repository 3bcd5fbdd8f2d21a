"""Metadata filters: where= against a pyarrow evaluation, refusals, and the FAISS pre-filter."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from pathlib import Path

import duckdb
import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowsearch.ann.prefilter import allowed_rows, filtered_search, prepare_index
from flowsearch.errors import FlowsearchError
from flowsearch.search.filters import MetadataFilter, SegmentRef
from flowsearch.search.watchdog import Watchdog
from flowsearch.storage import rows as store

ROWS, SHARD_ROWS, DIM = 900, 300, 16
COLUMNS = ["year", "lang", "score", "flag", "ts", "tag"]
LANGS = ["en", "de", "fr", None]


def _metadata(rng: np.random.Generator, n: int) -> pa.Table:
    """int, str, float, bool, timestamp and mostly-null columns, each with nulls."""
    year = rng.integers(1990, 2030, n)
    base = dt.datetime(2020, 1, 1)
    stamps = [base + dt.timedelta(days=int(d)) for d in rng.integers(0, 1500, n)]
    return pa.table(
        {
            "year": pa.array(year, mask=rng.random(n) < 0.1),
            "lang": pa.array([LANGS[i] for i in rng.integers(0, 4, n)]),
            "score": pa.array(rng.normal(size=n), mask=rng.random(n) < 0.1),
            "flag": pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.1),
            "ts": pa.array(stamps, type=pa.timestamp("us"), mask=rng.random(n) < 0.1),
            "tag": pa.array([None if r < 0.9 else "rare" for r in rng.random(n)], pa.string()),
        }
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three parts written by the store's own writer, their full table and vectors."""
    root = tmp_path_factory.mktemp("filters")
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    meta = _metadata(rng, ROWS)
    texts = [f"passage {i} about {'tides' if i % 7 == 0 else 'heat pumps'}" for i in range(ROWS)]
    writer = store.PartWriter(root, part_rows=SHARD_ROWS, row_group_rows=128)
    writer.write(store.rows_table([f"doc{i}" for i in range(ROWS)], texts, meta, vectors, vectors))
    shards = writer.close()
    assert len(shards) == 3
    table = meta.append_column("id", pa.array([f"doc{i}" for i in range(ROWS)]))
    table = table.append_column("text", pa.array(texts))
    db = MetadataFilter()
    flt = db.version(_segments(root, shards), _schema(table))
    yield {"filter": flt, "db": db, "table": table, "vectors": vectors}
    flt.close()
    db.close()


def _segments(root: Path, shards: list) -> list[SegmentRef]:
    """The shards as filter segments, each read (once, on first use) from its Parquet file."""
    refs, offset = [], 0
    for shard in shards:
        path = root / shard.path
        refs.append(SegmentRef(shard.path, offset, shard.n_rows, lambda p=path: pq.read_table(p)))
        offset += shard.n_rows
    return refs


def _schema(table: pa.Table) -> list[tuple[str, pa.DataType]]:
    return [(name, table.schema.field(name).type) for name in ["id", "text", *COLUMNS]]


def _expected(table: pa.Table, mask: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Rows where a pyarrow (Kleene) evaluation is TRUE, as SQL's WHERE keeps them."""
    return np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))


# -- predicates -----------------------------------------------------------------------------------

CASES = [
    ("year >= 2020 AND lang = 'en'", lambda t: pc.and_kleene(pc.greater_equal(t["year"], 2020),
                                                               pc.equal(t["lang"], "en"))),
    ("lang IN ('de', 'fr')", lambda t: pc.is_in(t["lang"], pa.array(["de", "fr"]))),
    ("lang IS NULL", lambda t: pc.is_null(t["lang"])),
    ("tag IS NOT NULL OR score > 1.5", lambda t: pc.or_kleene(pc.is_valid(t["tag"]),
                                                               pc.greater(t["score"], 1.5))),
    ("flag", lambda t: t["flag"]),
    ("NOT flag", lambda t: pc.invert(t["flag"])),
    ("ts >= TIMESTAMP '2022-06-01'", lambda t: pc.greater_equal(
        t["ts"], pa.scalar(dt.datetime(2022, 6, 1), pa.timestamp("us")))),
    ("text LIKE '%tides%'", lambda t: pc.match_substring(t["text"], "tides")),
    ("id = 'doc42'", lambda t: pc.equal(t["id"], "doc42")),
    ("year BETWEEN 2000 AND 2005", lambda t: pc.and_kleene(pc.greater_equal(t["year"], 2000),
                                                          pc.less_equal(t["year"], 2005))),
    ("lower(lang) = 'en' AND year % 2 = 0", lambda t: pc.and_kleene(
        pc.equal(t["lang"], "en"), pc.equal(pc.bit_wise_and(t["year"], 1), 0))),
    ("NULL", lambda t: pa.nulls(len(t), pa.bool_())),
    ("year > 3000", lambda t: pc.greater(t["year"], 3000)),
]  # fmt: skip


@pytest.mark.parametrize(("where", "expected"), CASES, ids=[c[0] for c in CASES])
def test_rows_match_a_pyarrow_evaluation(corpus: dict, where: str, expected) -> None:
    got = corpus["filter"].rows(where)
    assert got.dtype == np.int64
    assert np.array_equal(got, _expected(corpus["table"], expected(corpus["table"])))


@pytest.mark.parametrize("where", [None, "", "   ", "\n\t"])
def test_empty_where_is_no_filter(corpus: dict, where: str | None) -> None:
    assert np.array_equal(corpus["filter"].rows(where), np.arange(ROWS))


def test_filter_loads_no_vectors_and_counts_rows(corpus: dict) -> None:
    flt = corpus["filter"]
    assert flt.ntotal == ROWS
    assert flt.columns == ("id", "text", *COLUMNS)
    with pytest.raises(FlowsearchError, match="unknown column 'vector'"):
        flt.rows("vector IS NULL")


REFUSED = [
    ("1=1; DROP TABLE meta", "character 3"),
    ("1=1); DROP TABLE meta; SELECT (1", "more than one statement"),
    ("read_csv('/etc/passwd') IS NOT NULL", "read_csv"),
    ("year > (SELECT 1 FROM read_parquet('x'))", "subquery"),
    ("year IN (SELECT year FROM meta)", "subquery"),
    ("EXISTS (SELECT 1 FROM glob('/*'))", "subquery"),
    ("getenv('HOME') = ''", "getenv"),
    ("current_setting('threads') = '1'", "current_setting"),
    ("1=1); COPY meta TO '/tmp/flowsearch-x.csv'; SELECT (1", "COPY"),
    ("1=1); ATTACH '/tmp/flowsearch-x.db'; SELECT (1", "ATTACH"),
    ("1=1); INSTALL httpfs; SELECT (1", "more than one statement"),
    ("1=1); LOAD httpfs; SELECT (1", "more than one statement"),
    ("1=1); PRAGMA version; SELECT (1", "more than one statement"),
    ("1=1); SET enable_external_access = true; SELECT (1", "more than one statement"),
    ("COPY meta TO 'x'", "syntax error"),
    ("1=1 -- ; DROP TABLE meta", "comment"),
    ("1=1 /* ; DROP TABLE meta */", "comment"),
    ("1=1) UNION ALL SELECT (1", "adds SQL"),
    ("1=1) GROUP BY (year", "adds SQL"),
    ("1=1) ORDER BY (year", "adds SQL"),
    ("count(*) > 0", "count_star"),
    ("random() < 0.5", "random"),
    ("list_filter([year], x -> x > 0) = [1]", "lambda"),
    ("year = ?", "parameter"),
    ("main.lower(lang) = 'en'", "not allowed"),
    ("__row < 10", "unknown column '__row'"),
    ("year", "BIGINT expression, not a condition"),
    ("'yes'", "VARCHAR expression, not a condition"),
    ("year = 'abc'", "Could not convert"),
    ("\ud800 = 1", "surrogate"),
    ("lang = 'a\x00'", "NUL"),
    ("(" * 2000 + "1" + ")" * 2000, "nested too deeply"),
    ("x" * 9000, "longer than"),
]


@pytest.mark.parametrize(("where", "message"), REFUSED, ids=[r[0][:40] for r in REFUSED])
def test_refused_predicates_are_one_line_errors(corpus: dict, where: str, message: str) -> None:
    with pytest.raises(FlowsearchError) as info:
        corpus["filter"].rows(where)
    text = str(info.value)
    assert message in text
    assert "\n" not in text and text.startswith("where=")
    assert not Path("/tmp/flowsearch-x.csv").exists() and not Path("/tmp/flowsearch-x.db").exists()
    assert corpus["filter"].rows("year IS NULL OR year IS NOT NULL").size == ROWS  # table intact


def test_unknown_column_names_it_and_lists_the_columns(corpus: dict) -> None:
    with pytest.raises(FlowsearchError, match=r"unknown column 'yeer'; use one of id, text, year"):
        corpus["filter"].rows("yeer >= 2020")


def test_syntax_error_gives_position_and_near_text(corpus: dict) -> None:
    with pytest.raises(FlowsearchError, match=r"at character 14 \(near \"lang = 'en'\"\)"):
        corpus["filter"].rows("year >= 2020  lang = 'en'")
    with pytest.raises(FlowsearchError, match="at the end"):
        corpus["filter"].rows("year >= 2020 AND")


def test_connection_is_locked(corpus: dict) -> None:
    # A second wall behind the syntax checks: even raw SQL on the connection can't reach out.
    con = corpus["db"]._con.cursor()
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        con.execute("SELECT * FROM read_csv('/etc/passwd')")
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET enable_external_access = true")
    with pytest.raises(duckdb.Error):
        con.execute("INSTALL httpfs")


def test_concurrent_rows_equal_serial(corpus: dict) -> None:
    flt = corpus["filter"]
    wheres = [f"year >= {1990 + i} AND flag" for i in range(40)]
    serial = [flt.rows(w) for w in wheres]
    results: dict[int, list[np.ndarray]] = {}

    def work(t: int) -> None:
        results[t] = [flt.rows(w) for w in wheres]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for t in range(4):
        assert all(np.array_equal(a, b) for a, b in zip(results[t], serial, strict=True))


# -- property tests ---------------------------------------------------------------------------

_OPS = {"=": pc.equal, "<>": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
        ">=": pc.greater_equal}  # fmt: skip


def _sql_in(column: pa.ChunkedArray, values: list[str]) -> pa.ChunkedArray:
    """SQL's IN: NULL (not false) for a NULL value."""
    found = pc.is_in(column, pa.array(values))
    return pc.if_else(pc.is_null(column), pa.scalar(None, pa.bool_()), found)


def _atom() -> st.SearchStrategy:
    ints = st.builds(
        lambda op, v: (f"year {op} {v}", lambda t: _OPS[op](t["year"], v)),
        st.sampled_from(sorted(_OPS)),
        st.integers(1985, 2035),
    )
    floats = st.builds(
        lambda op, v: (f"score {op} {v!r}", lambda t: _OPS[op](t["score"], v)),
        st.sampled_from(sorted(_OPS)),
        st.floats(-3, 3, allow_nan=False).map(lambda x: round(x, 3)),
    )
    langs = st.builds(
        lambda vs: (
            "lang IN (" + ", ".join(f"'{v}'" for v in vs) + ")",
            lambda t: _sql_in(t["lang"], vs),
        ),
        st.lists(st.sampled_from(["en", "de", "fr", "xx"]), min_size=1, max_size=3),
    )
    nulls = st.builds(
        lambda col, neg: (
            f"{col} IS {'NOT ' if neg else ''}NULL",
            lambda t: pc.is_valid(t[col]) if neg else pc.is_null(t[col]),
        ),
        st.sampled_from(COLUMNS),
        st.booleans(),
    )
    flags = st.just(("flag", lambda t: t["flag"]))
    days = st.builds(
        lambda d: (
            f"ts < TIMESTAMP '{(dt.datetime(2020, 1, 1) + dt.timedelta(days=d)).isoformat()}'",
            lambda t: pc.less(
                t["ts"], pa.scalar(dt.datetime(2020, 1, 1) + dt.timedelta(days=d), t["ts"].type)
            ),
        ),
        st.integers(0, 1500),
    )
    return st.one_of(ints, floats, langs, nulls, flags, days)


def _combine(children: st.SearchStrategy) -> st.SearchStrategy:
    def both(op: str, a: tuple, b: tuple) -> tuple:
        fn = pc.and_kleene if op == "AND" else pc.or_kleene
        return (f"({a[0]}) {op} ({b[0]})", lambda t: fn(a[1](t), b[1](t)))

    negated = children.map(lambda a: (f"NOT ({a[0]})", lambda t: pc.invert(a[1](t))))
    return st.one_of(st.builds(both, st.sampled_from(["AND", "OR"]), children, children), negated)


PREDICATES = st.recursive(_atom(), _combine, max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PREDICATES)
def test_property_rows_equal_pyarrow(corpus: dict, predicate: tuple) -> None:
    where, evaluate = predicate
    table = corpus["table"]
    assert np.array_equal(corpus["filter"].rows(where), _expected(table, evaluate(table)))


SQLISH = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "year",
                "lang",
                "text",
                "meta",
                "__row",
                "SELECT",
                "FROM",
                "WHERE",
                "AND",
                "OR",
                "NOT",
                "(",
                ")",
                ";",
                "--",
                "/*",
                "*/",
                "'",
                '"',
                "=",
                "<",
                ">",
                "IN",
                "LIKE",
                "NULL",
                "IS",
                "read_csv",
                "getenv",
                "COPY",
                "ATTACH",
                "DROP",
                "TABLE",
                ",",
                "1",
                "2.5",
                "'en'",
                "CAST",
                "AS",
                "INTEGER",
                "::",
                "[",
                "]",
                "{",
                "}",
                "->",
                "x",
                "$1",
                "?",
                "\\",
                "\x00",
            ]
        ),  # fmt: skip
        st.text(max_size=5),
    ),
    max_size=12,
).map(" ".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=40), SQLISH))
def test_property_any_string_is_rows_or_flowsearch_error(corpus: dict, where: str) -> None:
    try:
        rows = corpus["filter"].rows(where)
    except FlowsearchError as exc:
        assert "\n" not in str(exc)
    else:
        assert rows.dtype == np.int64 and np.all(np.diff(rows) > 0)
        assert rows.size == 0 or (rows[0] >= 0 and rows[-1] < ROWS)


# -- search -----------------------------------------------------------------------------------


def _truth(vectors: np.ndarray, queries: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k scores among ``rows`` (numpy), best first."""
    scores = queries @ vectors[rows].T
    return -np.sort(-scores, axis=1)[:, :k]


@pytest.fixture(scope="module")
def flat(corpus: dict) -> faiss.Index:
    index = faiss.IndexFlatIP(DIM)
    index.add(corpus["vectors"])
    return index


@pytest.mark.parametrize("exact_below", [0, 10_000])  # the selector path, the brute-force path
@pytest.mark.parametrize("where", ["year >= 2020 AND lang = 'en'", "flag", "tag = 'rare'"])
def test_flat_filtered_search_is_the_exact_top_k(
    corpus: dict, flat: faiss.Index, where: str, exact_below: int
) -> None:
    rows = corpus["filter"].rows(where)
    queries = np.random.default_rng(1).normal(size=(8, DIM)).astype(np.float32)
    scores, found = filtered_search(flat, queries, 10, rows, exact_below=exact_below)
    assert found.shape == (8, 10) and found.dtype == np.int64
    assert np.isin(found, rows).all()
    np.testing.assert_allclose(scores, _truth(corpus["vectors"], queries, rows, 10), atol=1e-5)
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", queries, corpus["vectors"][found]),
                               atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("exact_below", [0, 10_000])
def test_matching_rows_far_from_the_query_still_fill_k(
    corpus: dict, flat: faiss.Index, exact_below: int
) -> None:
    # The 12 rows least like the query match: an unfiltered top-k would hold none of them.
    vectors = corpus["vectors"]
    query = vectors[:1]
    far = np.sort(np.argsort(vectors @ query[0])[:12])
    scores, found = filtered_search(flat, query, 10, far, exact_below=exact_below)
    assert (found >= 0).all() and set(found[0]) <= set(far)
    np.testing.assert_allclose(scores, _truth(vectors, query, far, 10), atol=1e-5)


@pytest.mark.parametrize("exact_below", [0, 10_000])
def test_k_above_matches_and_no_matches(corpus: dict, flat: faiss.Index, exact_below: int) -> None:
    rows = corpus["filter"].rows("id IN ('doc3', 'doc500', 'doc899')")
    assert rows.tolist() == [3, 500, 899]
    queries = corpus["vectors"][:2]
    scores, found = filtered_search(flat, queries, 5, rows, exact_below=exact_below)
    assert [sorted(r[:3]) for r in found.tolist()] == [[3, 500, 899]] * 2
    assert (found[:, 3:] == -1).all() and np.isfinite(scores[:, :3]).all()
    none = corpus["filter"].rows("year > 3000")
    scores, found = filtered_search(flat, queries, 5, none, exact_below=exact_below)
    assert none.size == 0 and (found == -1).all() and scores.shape == (2, 5)


@pytest.mark.parametrize("exact_below", [0, 10_000])
def test_deleted_rows_are_never_returned(corpus: dict, flat: faiss.Index, exact_below: int) -> None:
    vectors = corpus["vectors"]
    queries = vectors[:20]  # each query's best row is itself
    deleted = np.zeros(ROWS, dtype=bool)
    deleted[:10] = True
    deleted[np.random.default_rng(2).choice(ROWS, 200, replace=False)] = True
    for rows in (None, corpus["filter"].rows("flag OR NOT flag OR flag IS NULL")):
        for excluded in (deleted, np.flatnonzero(deleted)):
            scores, found = filtered_search(
                flat, queries, 15, rows, excluded=excluded, exact_below=exact_below
            )
            assert not np.isin(found, np.flatnonzero(deleted)).any()
            keep = np.flatnonzero(~deleted)
            np.testing.assert_allclose(scores, _truth(vectors, queries, keep, 15), atol=1e-5)


def test_allowed_rows() -> None:
    assert allowed_rows(5) is None
    assert allowed_rows(5, np.arange(5)) is None  # matches everything: no selector needed
    assert allowed_rows(5, None, np.zeros(5, bool)) is None
    assert allowed_rows(5, np.array([1, 3, 4]), np.array([3])).tolist() == [1, 4]
    assert allowed_rows(5, None, np.array([0, 2])).tolist() == [1, 3, 4]


def test_ivf_keeps_recall_and_never_returns_fewer_than_k() -> None:
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(32, DIM))
    vectors = centres[rng.integers(0, 32, 4000)] + 0.3 * rng.normal(size=(4000, DIM))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    quantizer = faiss.IndexFlatIP(DIM)
    index = faiss.IndexIVFFlat(quantizer, DIM, 32, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    index.nprobe = 4
    queries = vectors[rng.choice(4000, 50, replace=False)] + 0.05 * rng.normal(size=(50, DIM))
    queries = queries.astype(np.float32)
    rows = np.flatnonzero(rng.random(4000) < 0.1)
    # IVF with the selector keeps the index's nprobe: recall@10 against exact filtered search.
    _, found = filtered_search(index, queries, 10, rows, exact_below=0)
    truth = np.argsort(-(queries @ vectors[rows].T), axis=1)[:, :10]
    truth = rows[truth]
    recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)])
    assert recall >= 0.85, recall
    assert np.isin(found[found >= 0], rows).all()
    # Rows of one list only, queried from another: nprobe=4 finds none, the fallback finds all.
    lists = faiss.extract_index_ivf(index).quantizer.search(vectors, 1)[1][:, 0]
    one = np.flatnonzero(lists == lists[0])[:15]
    far_query = -vectors[one[:1]]
    scores, found = filtered_search(index, far_query, 10, one, exact_below=0)
    assert (found >= 0).all() and set(found[0]) <= set(one)
    np.testing.assert_allclose(scores, _truth(vectors, far_query, one, 10), atol=1e-5)


def test_ivf_with_a_direct_map_is_exact_for_selective_filters() -> None:
    rng = np.random.default_rng(4)
    vectors = rng.normal(size=(3000, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, 16, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    index.nprobe = 1
    prepare_index(index)
    rows = np.flatnonzero(rng.random(3000) < 0.05)
    queries = rng.normal(size=(10, DIM)).astype(np.float32)
    scores, found = filtered_search(index, queries, 10, rows)
    np.testing.assert_allclose(scores, _truth(vectors, queries, rows, 10), atol=1e-5)
    assert np.isin(found, rows).all()


def test_watchdog_interrupts_only_late_cursors() -> None:
    class Cursor:
        interrupted = 0

        def interrupt(self) -> None:
            self.interrupted += 1

    dog = Watchdog(period=0.01)
    late, done = Cursor(), Cursor()
    dog.watch(late, 0.0)
    dog.forget(dog.watch(done, 0.0))
    for _ in range(200):
        if late.interrupted:
            break
        threading.Event().wait(0.01)
    assert late.interrupted and not done.interrupted


def test_repeated_predicates_are_answered_from_the_version_cache(corpus: dict) -> None:
    flt = corpus["filter"]
    first = flt.rows("year >= 2015 AND lang = 'en'")
    again = flt.rows("year >= 2015 AND lang = 'en'")
    assert again is first and not first.flags.writeable  # shared, so callers cannot alter it
    clock = flt.rows("ts < now()")
    assert flt.rows("ts < now()") is not clock  # depends on the clock: run every time
    np.testing.assert_array_equal(flt.rows("ts < now()"), clock)


# -- time functions and value growth, read from the parsed tree ------------------------------


@pytest.mark.parametrize(
    "where",
    ["ts < now ()", "ts < today\t()", "ts < now()", "current_date > DATE '2000-01-01'",
     "CURRENT_TIMESTAMP > ts", "ts < localtimestamp AND year > 0"],
)  # fmt: skip
def test_clock_predicates_are_run_every_time(corpus: dict, where: str) -> None:
    flt = corpus["filter"]
    first = flt.rows(where)
    assert first.size > 0 and flt.rows(where) is not first  # not cached: the clock moves
    np.testing.assert_array_equal(flt.rows(where), first)


def test_current_date_is_a_time_keyword_unless_a_column_has_its_name() -> None:
    table = pa.table({"id": ["a", "b"], "current_date": [dt.date(1999, 1, 1), dt.date(2030, 1, 1)]})
    with MetadataFilter() as db:
        schema = [("id", pa.string()), ("current_date", pa.date32())]
        flt = db.version([SegmentRef("s", 0, 2, lambda: table)], schema)
        assert flt.rows("current_date > DATE '2000-01-01'").tolist() == [1]  # the column
        again = flt.rows("current_date > DATE '2000-01-01'")
        assert again is flt.rows("current_date > DATE '2000-01-01'")  # a column: cached


GROWING = [
    ("length(repeat(text, 100000)) > 0", "repeat() is not allowed"),
    ("lpad(lang, 1000000000, 'x') = ''", "lpad() is not allowed"),
    ("len(range(0, 1000000000)) > 0", "range() is not allowed"),
    ("printf('%0999999999d', year) = ''", "printf() is not allowed"),
    ("length(replace(text, 'e', '" + "x" * 65 + "')) > 0", "65 times longer"),
    ("replace(replace(replace(text, 'a', 'bbbbb'), 'b', 'ccccc'), 'c', 'dddd') = ''",
     "100 times longer"),
    ("regexp_replace(text, '', '" + "y" * 64 + "', 'g') = ''", "65 times longer"),
    ("replace(text, 'e', text) = ''", "replaces with a computed value"),
    ("length(" + " || ".join(["text"] * 33) + ") > 0", "names columns 33 times"),
]  # fmt: skip


@pytest.mark.parametrize(("where", "message"), GROWING, ids=[g[1] for g in GROWING])
def test_predicates_that_grow_values_without_bound_are_refused(
    corpus: dict, where: str, message: str
) -> None:
    started = time.monotonic()
    with pytest.raises(FlowsearchError, match=re.escape(message)):
        corpus["filter"].rows(where)
    assert time.monotonic() - started < 2  # refused from the tree, never run


def test_bounded_rewrites_are_allowed(corpus: dict) -> None:
    flt, table = corpus["filter"], corpus["table"]
    got = flt.rows("replace(lang, 'e', 'E') = 'En' AND regexp_replace(id, '[0-9]+', '#') = 'doc#'")
    np.testing.assert_array_equal(got, _expected(table, pc.equal(table["lang"], "en")))


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_a_heavy_filter_stops_on_time_and_gives_its_memory_back() -> None:
    """A filter heavy in total (each vector's work is small: DuckDB stops between vectors)."""
    rng = np.random.default_rng(7)
    n = 100_000
    words = np.array(["tide", "moon", "sea", "heat", "pump", "bread", "yeast", "salt"])
    texts = [" ".join(rng.choice(words, 60)) for _ in range(n)]
    table = pa.table({"id": [f"d{i}" for i in range(n)], "text": texts})
    schema = [("id", pa.string()), ("text", pa.string())]
    concat = " || ".join(["text"] * 16)
    heavy = f"length({concat}) > 0 AND levenshtein(text, 'tide moon sea heat pump bread') > 0"
    segment = SegmentRef("s", 0, n, lambda: table)
    with MetadataFilter(timeout=1.0) as db, db.version([segment], schema) as flt:
        assert flt.rows("id = 'd1'").tolist() == [1]  # loaded and warm
        time.sleep(1.0)
        before, peak = _rss_mb(), [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss_mb())
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()
        try:
            with pytest.raises(FlowsearchError, match="ran longer than 1 s"):
                flt.rows(heavy)
            elapsed = time.monotonic() - started
        finally:
            done.set()
            sampler.join()
        assert 0.9 < elapsed < 1.0 + 1.0, elapsed
        assert peak[0] > before + 40, (before, peak)  # it did take memory (intermediates)...
        deadline = time.monotonic() + 5
        while _rss_mb() > before + 30 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _rss_mb() <= before + 30, (before, peak, _rss_mb())  # ...and gave it back
        assert flt.rows("id = 'd2'").tolist() == [2]  # the filter still answers


# -- segments: loaded once, shared by versions, typed by the version's schema ----------------


def _counted(table: pa.Table, calls: list[str], name: str):
    def load() -> pa.Table:
        calls.append(name)
        return table

    return load


def test_versions_share_segments_and_number_rows_globally() -> None:
    a = pa.table(
        {"id": ["a0", "a1"], "text": ["x", "y"], "year": pa.array([2001, 2002], pa.int32())}
    )
    b = pa.table({"id": ["b0", "b1", "b2"], "text": ["x", "y", "z"]})  # written before `year`
    c = pa.table({"id": ["c0"], "text": ["w"], "year": pa.array([2030], pa.int64()),
                  "lang": ["en"]})  # fmt: skip
    calls: list[str] = []
    seg_a = SegmentRef("a", 0, 2, _counted(a, calls, "a"))
    seg_b = SegmentRef("b", 2, 3, _counted(b, calls, "b"))
    base = [("id", pa.string()), ("text", pa.string()), ("year", pa.int64())]
    with MetadataFilter() as db:
        v1 = db.version([seg_a, seg_b], base)
        assert calls == []  # nothing is read before a filtered query
        assert v1.rows("year IS NULL").tolist() == [2, 3, 4]  # b lacks year: NULL
        assert v1.rows("year > 2001").tolist() == [1]
        assert sorted(calls) == ["a", "b"]
        # the next version drops b, keeps a at another offset, adds c and a column
        v2 = db.version(
            [SegmentRef("c", 0, 1, _counted(c, calls, "c")),
             SegmentRef("a", 1, 2, _counted(a, calls, "a"))],
            [*base, ("lang", pa.string())],
        )  # fmt: skip
        assert v2.rows("year > 2001").tolist() == [0, 2]
        assert v2.rows("lang = 'en'").tolist() == [0]
        assert v2.rows("lang IS NULL").tolist() == [1, 2]
        assert sorted(calls) == ["a", "b", "c"]  # a was read once for both versions
        with pytest.raises(FlowsearchError, match="unknown column 'lang'"):
            v1.rows("lang = 'en'")  # v1's schema has no lang
        assert v1.rows("id LIKE 'b%'").tolist() == [2, 3, 4]  # v1 still answers
        v1.close()
        assert "b" not in db._segments and "a" in db._segments  # b had no other user
        assert v2.rows("id = 'a1'").tolist() == [2]
        v2.close()
        assert db._segments == {}


def _columns(db: MetadataFilter, name: str) -> list[str]:
    """The columns of segment ``name``'s DuckDB table."""
    key = db._segments[name].key
    return [row[0] for row in db._con.execute(f"DESCRIBE {key}").fetchall()]


def test_only_segments_with_cut_documents_store_their_spans() -> None:
    """A document cut into passages matches with all its rows; a segment where every document
    is one row stores no ``__span`` column (8 bytes a row, fetched and expanded by every
    query for nothing), beside one that has it, and a version of plain segments alone
    fetches the rows only."""
    plain = pa.table({"id": ["a0", "a1", "a2"], "text": ["red sky", "blue sea", "red sun"]})
    cut = pa.table({
        "id": ["b0", "b0", "b0", "b1"],
        "text": ["red fox. ", "fox. a dog", "dog. bird", "red owl"],
        "__passage": [0, 1, 2, 0], "__passages": [3, 3, 3, 1],
        "__passage_start": [0, 5, 11, 0], "__passage_end": [9, 15, 20, 7],
    })  # fmt: skip
    schema = [("id", pa.string()), ("text", pa.string())]
    with MetadataFilter() as db:
        both = db.version([SegmentRef("p", 0, 3, lambda: plain),
                           SegmentRef("c", 3, 4, lambda: cut)], schema)  # fmt: skip
        assert both.rows("text LIKE 'red%'").tolist() == [0, 2, 3, 4, 5, 6]
        assert both.rows("text LIKE '%fox%bird%'").tolist() == [3, 4, 5]  # across passages
        assert both.rows("id = 'a1' OR id = 'b1'").tolist() == [1, 6]
        assert "__span" not in _columns(db, "p") and "__span" in _columns(db, "c")
        alone = db.version([SegmentRef("p", 0, 3, lambda: plain)], schema)
        assert alone.rows("text LIKE 'red%'").tolist() == [0, 2]
        assert not alone._spans and both._spans
        reversed_ = db.version([SegmentRef("c", 0, 4, lambda: cut),
                                SegmentRef("p", 4, 3, lambda: plain)], schema)  # fmt: skip
        assert reversed_.rows("text LIKE 'red%'").tolist() == [0, 1, 2, 3, 4, 6]


def test_a_pinned_version_reads_through_open_handles(tmp_path: Path) -> None:
    """The design's point: load() reads through a handle its caller holds, so deleting the
    file (a later write's cleanup) does not break a version that has not filtered yet."""
    path = tmp_path / "seg.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"], "n": [1, 2]}), path)
    handle = pq.ParquetFile(path, memory_map=True)
    path.unlink()
    with MetadataFilter() as db:
        load = lambda: handle.read(columns=["id", "text", "n"])  # noqa: E731
        schema = [("id", pa.string()), ("text", pa.string()), ("n", pa.int64())]
        flt = db.version([SegmentRef("s", 0, 2, load)], schema)
        assert flt.rows("n > 1").tolist() == [1]


def test_a_segment_that_breaks_its_promise_is_damage() -> None:
    from flowsearch.errors import IndexDamaged

    short = pa.table({"id": ["a"], "text": ["x"]})
    with MetadataFilter() as db:
        flt = db.version([SegmentRef("s", 0, 2, lambda: short)],
                         [("id", pa.string()), ("text", pa.string())])  # fmt: skip
        with pytest.raises(IndexDamaged, match="holds 1 rows, its version says 2"):
            flt.rows("id = 'a'")


def test_a_searchers_options_bound_its_filter() -> None:
    from flowsearch.search.backend import LocalBackend
    from flowsearch.search.options import SearchOptions

    options = SearchOptions(filter_timeout=3.5, filter_memory_bytes=64 * 2**20)
    backend = LocalBackend(Path("unused"), options)
    with backend.filter_database() as db:
        assert db.timeout == 3.5 and db is backend.filter_database()
        limit = db._con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        assert limit == "64.0 MiB", limit  # the bytes asked for ("64MB" was 61 MiB: 10**6)
        assert db._con.execute("SELECT current_setting('temp_directory')").fetchone()[0] == ""
    with MetadataFilter() as db:  # a filter of its own: the options' defaults
        assert db.timeout == SearchOptions().filter_timeout
        assert db.memory_limit == SearchOptions().filter_memory_bytes
