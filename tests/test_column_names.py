"""Metadata column names the index cannot keep apart are refused at every write entry (build,
add, upsert; files and lists of dicts; the CLI; ``POST /upsert``), and an index an earlier
release let store one keeps answering ``where`` on its other columns."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flowsearch.cli import app
from flowsearch.errors import BadInput
from flowsearch.search.searcher import Searcher
from flowsearch.storage import manifest as mf
from flowsearch.writes.build import build_index
from flowsearch.writes.compact import compact
from flowsearch.writes.corpus import IndexColumns
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import add_to_index, upsert

ROWS = [
    {"id": "a", "text": "the sea is calm", "topic": "sea"},
    {"id": "b", "text": "a heat wave", "topic": "heat"},
    {"id": "c", "text": "snow and ice", "topic": "cold"},
]

# (a bad name, words its one-line error holds)
BAD_NAMES = [
    ("__row", "reserved"),  # the filter engine's own
    ("__local", "reserved"),
    ("__doc", "reserved"),  # any name starting with __: kept for later internal columns
    ("ID", "'id'"),  # the index's own columns, in any case
    ("Text", "'text'"),
    ("vector", "'vector'"),
    ("RAW", "'raw'"),
    ("", "empty or blank name"),
    ("  ", "empty or blank name"),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("names") / "idx"
    build_index(ROWS, root, model=str(model_dir), calibration="none")
    return root


def _with(name: str, value: object = 1) -> list[dict[str, object]]:
    return [{**row, "id": f"n{i}", name: value} for i, row in enumerate(ROWS)]


@pytest.mark.parametrize(("name", "words"), BAD_NAMES)
def test_build_refuses_a_reserved_or_empty_column_name(tmp_path, model_dir, name, words):
    with pytest.raises(BadInput, match=words) as info:
        build_index(_with(name), tmp_path / "idx", model=str(model_dir), calibration="none")
    assert "\n" not in str(info.value) and (repr(name) in str(info.value) or not name.strip())
    assert not (tmp_path / "idx").exists()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
@pytest.mark.parametrize(("name", "words"), BAD_NAMES[:4])
def test_upsert_and_add_refuse_it_from_files_and_records(tmp_path, index, name, words, fmt):
    path = tmp_path / f"new.{fmt}"
    table = pa.Table.from_pylist(_with(name))
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in table.to_pylist()))
    elif fmt == "csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    before = mf.read(index).version
    for write in (upsert, add_to_index):
        for corpus in (path, _with(name), table):
            with pytest.raises(BadInput, match=words):
                write(index, corpus)
    assert mf.read(index).version == before


@pytest.mark.parametrize("new", ["Topic", "TOPIC"])
def test_a_new_column_differing_only_in_case_from_one_of_the_index_is_refused(index, new):
    before = mf.read(index).version
    with pytest.raises(BadInput) as info:
        upsert(index, _with(new, "x"))
    line = str(info.value)
    assert f"{new!r}" in line and "'topic'" in line and "only in case" in line
    assert mf.read(index).version == before


def test_two_new_columns_differing_only_in_case_are_refused(tmp_path, model_dir):
    rows = [{**r, "lang": "en", "Lang": "fr"} for r in ROWS]
    with pytest.raises(BadInput, match=r"'Lang' differs only in case from column 'lang'"):
        build_index(rows, tmp_path / "idx", model=str(model_dir), calibration="none")


def test_the_cli_refuses_it_in_one_line_with_exit_2(tmp_path, index):
    path = tmp_path / "new.jsonl"
    path.write_text(json.dumps({"id": "z", "text": "new", "__row": 7}) + "\n")
    result = CliRunner().invoke(app, ["upsert", str(path), "--index", str(index)])
    assert result.exit_code == 2 and result.stdout == ""
    assert "'__row' is reserved" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2  # the line and its fix


def test_http_upsert_refuses_it_with_a_4xx_line(index):
    from fastapi.testclient import TestClient

    from flowsearch.server import create_app

    before = mf.read(index).version
    with TestClient(create_app(index), raise_server_exceptions=False) as client:
        body = {"records": [{"id": "z", "text": "new", "__row": 7}]}
        answer = client.post("/upsert", json=body)
        assert 400 <= answer.status_code < 500, answer.text
        assert "'__row' is reserved" in answer.text
        found = client.post("/search", json={"query": "sea", "where": "topic = 'sea'"})
        assert found.status_code == 200 and [h["id"] for h in found.json()["hits"]] == ["a"]
    assert mf.read(index).version == before


@pytest.fixture
def damaged(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An index as an earlier release let it be written: a ``__row`` metadata column, and
    ``Topic`` beside ``topic``."""
    monkeypatch.setattr(IndexColumns, "check_names", lambda self, names: None)
    rows = [{**r, "__row": 100 + i, "Topic": r["topic"].upper()} for i, r in enumerate(ROWS)]
    build_index(rows, tmp_path / "idx", model=str(model_dir), calibration="none")
    upsert(tmp_path / "idx", [{"id": "d", "text": "warm sea", "topic": "sea", "__row": 9,
                               "Topic": "SEA"}])  # fmt: skip
    monkeypatch.undo()
    assert {"__row", "Topic"} <= set(mf.read(tmp_path / "idx").metadata_columns)
    return tmp_path / "idx"


def test_an_index_with_a_reserved_column_still_answers_where(damaged):
    def ids(where: str) -> list[str]:
        with closing(Searcher.open(damaged)) as s:
            return sorted(h.id for h in s.search("sea", k=10, where=where))

    assert ids("topic = 'sea'") == ["a", "d"]
    assert ids("id IN ('b', 'c')") == ["b", "c"]
    # the user's __row is not filterable (nor the engine's): refused as unknown, in one line
    unknown = pytest.raises(BadInput, match="unknown column '__row'")
    with closing(Searcher.open(damaged)) as s, unknown:
        s.search("sea", where="__row = 1")
    # the first of two columns differing only in case is the one filters name
    assert ids("Topic = 'sea'") == ["a", "d"]
    # the stored values are kept and returned
    with closing(Searcher.open(damaged)) as s:
        hit = next(h for h in s.search("sea", k=10) if h.id == "d")
    assert hit.metadata["__row"] == 9 and hit.metadata["Topic"] == "SEA"
    # deleting and compacting keep it working, and new writes without those keys go in
    delete(damaged, ["a"])
    compact(damaged, full=True)
    upsert(damaged, [{"id": "e", "text": "sea salt", "topic": "sea"}])
    assert ids("topic = 'sea'") == ["d", "e"]
