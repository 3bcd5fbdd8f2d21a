"""Bad input a new user met that used to end in a traceback or was silently taken: each is now
one line (exit 2 on the CLI, 4xx over HTTP) and nothing stored changes."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pytest
from corpus_helpers import scan_corpus
from typer.testing import CliRunner

from flowsearch.cli import app
from flowsearch.errors import BadInput
from flowsearch.search.searcher import Searcher
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import LOCK_NAME
from flowsearch.writes.build import build_index
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import upsert

runner = CliRunner()


@pytest.mark.parametrize("port", ["99999", "65536", "0", "-1"])
def test_serve_refuses_a_port_out_of_range_in_one_line(tmp_path, port):
    # the range is checked before the index is opened: no index needed to see it
    result = runner.invoke(app, ["serve", "--index", str(tmp_path / "none"), "--port", port])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: port must be a TCP port number from 1 to 65535")
    assert "--port 8000" in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


# --- an index to write to ------------------------------------------------------------------

ROWS = [
    {"id": "a", "text": "the sea is calm", "topic": "sea"},
    {"id": "b", "text": "a heat wave", "topic": "heat"},
    {"id": "c", "text": "snow and ice", "topic": "cold"},
]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("holes") / "idx"
    build_index(ROWS, root, model=str(model_dir), calibration="none")
    return root


@contextlib.contextmanager
def _another_writer(index_dir: Path) -> Iterator[None]:
    """Hold the index's writer lock as another flowsearch process would."""
    fd = os.open(index_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def test_search_refuses_a_lone_surrogate_in_one_line(index):
    with closing(Searcher.open(index)) as s:
        for query in ("heat \ud800", ["sea", "wave \udfff here"]):
            with pytest.raises(BadInput, match=r"lone surrogate") as info:
                s.search(query)
            assert "\n" not in str(info.value)
        assert s.search("heat")  # the searcher still answers


@pytest.mark.parametrize("corpus", [[None], [None, None], [ROWS[0], None], [3]])
def test_upsert_refuses_records_that_are_not_dicts(index, corpus):
    before = mf.read(index).version
    with pytest.raises(BadInput, match=r"(not null|not int|is null, not an object)"):
        upsert(index, corpus)
    assert mf.read(index).version == before


@pytest.mark.parametrize("wait", [-1, -0.5, float("nan"), float("inf"), "5", True])
def test_writes_refuse_a_wait_that_is_not_seconds(index, wait):
    before = mf.read(index).version
    for write in (
        lambda: upsert(index, [{"id": "z", "text": "new"}], wait=wait),
        lambda: delete(index, ["a"], wait=wait),
    ):
        with pytest.raises(BadInput, match=r"wait must be a number of seconds >= 0"):
            write()
    assert mf.read(index).version == before


def test_http_409_advises_a_wait_that_upsert_and_delete_accept(index):
    from fastapi.testclient import TestClient

    from flowsearch.server import create_app

    new = {"records": [{"id": "w", "text": "warm wind", "topic": "heat"}]}
    with TestClient(create_app(index), raise_server_exceptions=False) as client:
        with _another_writer(index):
            locked = client.post("/upsert", json=new)
            assert locked.status_code == 409 and '"wait": SECONDS' in locked.json()["detail"]
            for path, body in (("/upsert", new), ("/delete", {"ids": ["a"]})):
                waited = client.post(path, json={**body, "wait": 0.2})
                assert waited.status_code == 409, waited.text  # taken, and waited for
                assert "waited for 0.2 s" in waited.json()["detail"]
        for bad in (-1, "1", 601):
            assert client.post("/upsert", json={**new, "wait": bad}).status_code == 422
        done = client.post("/upsert", json={**new, "wait": 5})
        assert done.status_code == 200 and done.json()["n_inserted"] == 1
        gone = client.post("/delete", json={"ids": ["w"], "wait": 0})
        assert gone.status_code == 200 and gone.json()["n_deleted"] == 1


# --- numbers JSON cannot hold ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": 1, "text": "a", "w": NaN}'], r"line 1 holds NaN, which is not JSON"),
        (['{"id": 1, "text": "a", "w": 1.5}', "", '{"id": 2, "text": "b", "w": -Infinity}'],
         r"line 3 holds -Infinity"),
        (['{"id": 1, "text": "a", "w": [0.5, Infinity]}'], r"line 1 holds Infinity"),
        (['{"id": 1, "text": "a", "v": 5}', '{"id": 2, "text": "b", "v": 99999999999999999999}'],
         r"line 2 \(id 2\): 'v' is an integer beyond 64 bits"),
        (['{"id": 1, "text": "a", "v": {"x": 1.5, "y": -9223372036854775809}}'],
         r"line 1 \(id 1\): 'v.y' is an integer beyond 64 bits"),
        (['{"id": 18446744073709551616, "text": "a"}'], r"line 1: 'id' is an integer beyond"),
    ],
)  # fmt: skip
def test_jsonl_nan_literals_and_integers_beyond_int64_are_refused(tmp_path, lines, message):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInput, match=message) as info:
        scan_corpus(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_jsonl_floats_that_json_can_write_still_go_in(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = ['{"id": 1, "text": "a", "v": 5, "w": 1e20}', '{"id": 2, "text": "b", "v": 2.5}']
    path.write_text("\n".join(rows) + "\n")
    plan = scan_corpus(path)
    assert plan.metadata_schema.field("v").type == pa.float64()  # int + float: numbers
    assert [m.to_pylist() for _, _, m in plan.batches()][0][0]["w"] == 1e20


def test_records_with_an_integer_beyond_int64_name_the_record_and_key(index):
    with pytest.raises(BadInput, match=r"records\[1\]\['big'\] holds an integer beyond 64"):
        upsert(index, [{"id": "x", "text": "a", "big": 1}, {"id": "y", "text": "b", "big": 2**64}])


def test_http_upsert_refuses_nan_literals_with_422(index):
    from fastapi.testclient import TestClient

    from flowsearch.server import create_app

    before = mf.read(index).version
    with TestClient(create_app(index), raise_server_exceptions=False) as client:
        for literal in (b"NaN", b"Infinity", b"[1.0, -Infinity]"):
            body = b'{"records": [{"id": "n", "text": "x", "v": ' + literal + b"}]}"
            answer = client.post("/upsert", content=body)
            detail = answer.json()["detail"]
            assert answer.status_code == 422 and "records[0]['v']" in detail and "JSON" in detail
    assert mf.read(index).version == before


# --- ids that would print alike ---------------------------------------------------------------


def test_cli_shows_ids_that_would_print_alike_quoted_with_escapes(tmp_path, model_dir):
    ids = ["tide", "tide ", " tide", "ti\u202ede", "ti\u200bde", "'tide'"]
    rows = [{"id": i, "text": f"the tide rises {n}"} for n, i in enumerate(ids)]
    build_index(rows, tmp_path / "idx", model=str(model_dir), calibration="none")
    result = runner.invoke(app, ["query", "tide", "--index", str(tmp_path / "idx"), "-k", "6"])
    assert result.exit_code == 0, result.output
    shown = [line.split("│")[4].strip() for line in result.stdout.splitlines() if "rises" in line]
    assert sorted(shown) == sorted(
        ["tide", "'tide '", "' tide'", "'ti\\u202ede'", "'ti\\u200bde'", "\"'tide'\""]
    )
    assert "\u202e" not in result.stdout and "\u200b" not in result.stdout
    # the ids are as given: --json keeps them, and a delete of the plain one leaves the others
    result = runner.invoke(app, ["delete", "tide", "tide  ", "--index", str(tmp_path / "idx")])
    assert result.exit_code == 0 and "not found: 'tide  '" in result.stderr
    with closing(Searcher.open(tmp_path / "idx")) as s:
        assert sorted(h.id for h in s.search("tide", k=10)) == sorted(ids[1:])


# --- info --verify ------------------------------------------------------------------------


def test_info_verify_warns_of_a_stray_file_in_the_calibrator_directory(tmp_path, model_dir):
    rows = [{"id": f"r{i}", "text": f"row {i} of the sea and the tide"} for i in range(40)]
    build_index(rows, tmp_path / "idx", model=str(model_dir), calibration="whitening")
    folder = tmp_path / "idx" / mf.read(tmp_path / "idx").calibration.path
    assert folder.is_dir() and folder != tmp_path / "idx"
    args = ["info", "--index", str(tmp_path / "idx"), "--verify"]
    assert runner.invoke(app, args).exit_code == 0
    (folder / "notes.txt").write_text("mine")
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and "verified" in result.stdout
    assert result.stderr.startswith("warning: 1 stray file in the index")
    assert "notes.txt" in result.stderr
    (folder / "notes.txt").unlink()
    (folder / ".weights.safetensors.tmp-1234").write_text("a killed write's leftover")
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and "stray" not in result.stderr


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_csv_integers_beyond_int64_are_refused_and_floats_kept(tmp_path, fmt):
    sep = "," if fmt == "csv" else "\t"
    path = tmp_path / f"c.{fmt}"
    lines = ["id,text,v", "1,a,5", "2,b,99999999999999999999"]
    path.write_text("\n".join(line.replace(",", sep) for line in lines) + "\n")
    with pytest.raises(BadInput, match=r"line 3 \(id '2'\): column 'v' holds an integer beyond"):
        scan_corpus(path)
    path.write_text("\n".join(line.replace(",", sep) for line in [*lines[:2], "2,b,1e20"]) + "\n")
    assert scan_corpus(path).metadata_schema.field("v").type == pa.float64()
