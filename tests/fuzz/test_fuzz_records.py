"""Fuzzing what users hand a write: records (ids, texts with lone surrogates, metadata of any
nesting and type) and small corpus files (CSV, JSON Lines, Parquet with odd columns).

The property, for every input: a clear library error (one :class:`FlowsearchError` line) or
a correct result, never a raw exception, and never damage to an index that was there before.
Each test is bounded (``max_examples``, no per-example deadline: the machine is shared), the
tiny random BERT of ``tests/conftest.py`` encodes with its ``static`` pooling (no model runs),
and Hypothesis keeps no example database in the repository.
"""

from __future__ import annotations

import csv
import json
import shutil
from contextlib import closing
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import scan_corpus
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.search.version import index_info
from flowsearch.storage import manifest as mf
from flowsearch.writes.build import build_index
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import upsert

#: Examples per test; their sum is what one run of this file tries (RESULTS.md says it).
EXAMPLES = {"records": 150, "files": 120, "upsert": 25, "delete": 30}

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# --- strategies -----------------------------------------------------------------------------

#: Text of any code point, lone surrogates included (what a Python str may hold).
any_text = st.text(st.characters(codec=None, min_codepoint=0), max_size=12)
words = st.sampled_from(["the sea", "ice", "a heat wave", "", "   ", "tide \ud800", "x" * 300])
good_texts = st.lists(st.sampled_from(["the", "sea", "tide", "ice", "wave"]), min_size=1).map(
    " ".join
)
texts = st.one_of(good_texts, good_texts, words, any_text, st.none(), st.just(["sea"]))
good_ids = st.one_of(st.integers(0, 10_000), st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True))
ids = st.one_of(
    good_ids,
    good_ids,
    st.integers(-(2**64), 2**64),
    st.text(max_size=8),
    any_text,
    st.none(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.just("x" * 1100),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    any_text,
    st.binary(max_size=4),
)
#: Metadata values: scalars nested in lists and dicts up to about 40 levels (past the limit).
metadata_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abk"), inner, max_size=2)
    ),
    max_leaves=40,
)
keys = st.one_of(
    st.sampled_from(["topic", "year", "Topic", "__row", "_row", "vector", "id ", "", "a.b"]),
    any_text,
)


@st.composite
def deep_values(draw: st.DrawFn) -> Any:
    """A value nested a drawn number of levels (around the stored limit, or far past it)."""
    depth = draw(st.sampled_from([1, 31, 32, 33, 60, 400]))
    value: Any = draw(scalars)
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


#: True about one time in ten.
rarely = st.sampled_from([False] * 9 + [True])


@st.composite
def records(draw: st.DrawFn) -> list[Any]:
    """1-4 records sharing one set of metadata keys (sometimes not: a record lacks one)."""
    names = draw(st.lists(keys, max_size=3, unique=True))
    # one kind of value per key, mostly (a key of mixed kinds is refused: tried too)
    kinds = [st.integers(0, 99), good_texts, st.floats(-1, 1), st.lists(st.integers(0, 5))]
    kinds += [st.dictionaries(st.sampled_from("ab"), st.integers(0, 5), min_size=2)]
    per_key = {n: draw(st.sampled_from([*kinds, metadata_values, deep_values()])) for n in names}
    # mostly one kind of id per batch (mixing kinds is refused: tried too, less often)
    kind = draw(st.sampled_from([st.integers(0, 10_000), st.text("abcxyz", min_size=1), ids]))
    out: list[Any] = []
    for _ in range(draw(st.integers(1, 4))):
        record: dict[Any, Any] = {"id": draw(kind), "text": draw(texts)}
        record.update({name: draw(per_key[name]) for name in names})
        if draw(rarely):
            record.pop(draw(st.sampled_from(sorted(record, key=repr))))
        out.append(record)
    if draw(rarely):
        out.append(draw(st.sampled_from([None, 3, "text", ["a"]])))
    return out


#: Column names for files: duplicates, blanks and look-alikes on purpose.
columns = st.lists(
    st.sampled_from(["id", "text", "topic", "topic", "", " id", "TEXT", "__x", "n", "id"]),
    min_size=1,
    max_size=5,
)
cells = st.one_of(
    good_texts,
    st.sampled_from(["the sea", "", "1", "99999999999999999999", "NaN", '"', "a,b", "1e20"]),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6),
)


@st.composite
def corpus_files(draw: st.DrawFn) -> tuple[str, list[str], list[list[Any]]]:
    """(format, column names, rows) for a small CSV, JSON Lines or Parquet file."""
    fmt = draw(st.sampled_from(["csv", "jsonl", "parquet"]))
    more = st.lists(st.sampled_from(["topic", "n", "year", "TEXT"]), max_size=2, unique=True)
    usual = more.map(lambda extra: ["id", "text", *extra])
    names = draw(st.one_of(usual, usual, columns))
    n_rows = draw(st.integers(1 if names[:2] == ["id", "text"] else 0, 3))
    cell = cells if fmt != "jsonl" else st.one_of(cells, metadata_values, deep_values())
    rows = [[draw(cell) for _ in names] for _ in range(n_rows)]
    return fmt, names, rows


def _write_file(folder: Path, fmt: str, names: list[str], rows: list[list[Any]]) -> Path:
    path = folder / f"corpus.{fmt}"
    if fmt == "csv":
        with open(path, "w", encoding="utf-8", newline="") as handle:
            csv.writer(handle).writerows([names, *([str(c) for c in row] for row in rows)])
    elif fmt == "jsonl":
        # duplicate keys in one JSON object: written as is (the last one wins when read)
        body = [
            "{" + ", ".join(f"{json.dumps(n)}: {_json(c)}" for n, c in zip(names, row)) + "}"
            for row in rows
        ]
        path.write_text("\n".join(body) + "\n", encoding="utf-8")
    else:
        arrays = [pa.array([str(row[i]) for row in rows], pa.string()) for i in range(len(names))]
        pq.write_table(pa.table(arrays, names=names), path)
    return path


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return json.dumps(str(value))
    except UnicodeEncodeError:  # a lone surrogate: escaped, as a JSON writer may
        return json.dumps(value)


# --- the property ---------------------------------------------------------------------------


def _clear(exc: FlowsearchError) -> None:
    """A library error as users see it: one line with something in it."""
    event(f"refused: {type(exc).__name__}")
    text = str(exc)
    assert text.strip() and "\n" not in text, text


def _state(root: Path) -> tuple[bytes, int]:
    return (root / mf.MANIFEST_NAME).read_bytes(), mf.read(root).version


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("fuzz") / "idx"
    rows = [{"id": f"d{i}", "text": f"the sea and the tide {i}", "topic": "sea"} for i in range(8)]
    build_index(
        rows, root, model=str(model_dir), pooling="static", calibration="none",
        index_factory="Flat", lexical=False,
    )  # fmt: skip
    return root


@settings(FUZZ, max_examples=EXAMPLES["records"])
@given(batch=records())
def test_records_are_read_or_refused_in_one_line(batch):
    try:
        plan = scan_corpus(batch)
    except FlowsearchError as exc:
        _clear(exc)
        return
    event("read")
    assert 0 < plan.n_rows + plan.n_skipped <= len(batch)


@settings(FUZZ, max_examples=EXAMPLES["files"])
@given(spec=corpus_files())
def test_corpus_files_are_read_or_refused_in_one_line(tmp_path_factory, spec):
    fmt, names, rows = spec
    folder = tmp_path_factory.mktemp("file")
    try:
        path = _write_file(folder, fmt, names, rows)
    except (pa.ArrowException, ValueError):
        return  # pyarrow would not write such a table: not an input a user can give
    try:
        plan = scan_corpus(path)
    except FlowsearchError as exc:
        _clear(exc)
    else:
        event("read")
        assert len(set(names)) == len(names), "a column named twice was read"
        assert plan.n_rows + plan.n_skipped == len(rows)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@settings(FUZZ, max_examples=EXAMPLES["upsert"])
@given(batch=records())
def test_an_upsert_writes_the_rows_or_changes_nothing(index, batch):
    before = _state(index)
    with closing(Searcher.open(index)) as s:
        n_before = len(s)
    try:
        result = upsert(index, batch)
    except FlowsearchError as exc:
        _clear(exc)
        assert _state(index) == before  # nothing published over the index
    else:
        event("written")
        assert mf.read(index).version == before[1] + 1
        with closing(Searcher.open(index)) as s:
            assert len(s) == n_before + result.n_inserted
    assert index_info(index, verify=True).verified.n_files > 0  # never damaged


@settings(FUZZ, max_examples=EXAMPLES["delete"])
@given(wanted=st.lists(ids, min_size=0, max_size=4))
def test_a_delete_removes_the_ids_or_changes_nothing(index, wanted):
    before = _state(index)
    try:
        result = delete(index, wanted)
    except FlowsearchError as exc:
        _clear(exc)
        assert _state(index) == before
    else:
        event("deleted" if result.n_deleted else "none found")
        assert result.n_deleted + len(result.missing) <= len(wanted)
        if result.n_deleted == 0:
            assert _state(index) == before
    assert index_info(index, verify=True).verified.n_files > 0
