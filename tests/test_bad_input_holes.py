"""Bad input a new user met that used to end in a traceback or was silently taken: each is now
one line (exit 2 on the CLI, 4xx over HTTP) and nothing stored changes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
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
from flowsearch.writes.compact import compact, recalibrate
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import add_to_index, upsert

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


# --- no write publishes over damage (issue 41) ----------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (the lock excepted) with its bytes."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """An index with a calibrator of its own, a reference sample, postings and two segments."""
    root = tmp_path_factory.mktemp("calibrated") / "idx"
    rows = [{"id": f"r{i}", "text": f"row {i} of the sea and the tide {i % 7}"} for i in range(80)]
    build_index(rows, root, model=str(model_dir), calibration="whitening")
    upsert(root, [{"id": "n1", "text": "a new row about the sea"}])
    return root


def _flip_same_size(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 3] ^= 0x01
    path.write_bytes(bytes(data))


def _weights(root: Path) -> Path:
    return root / mf.read(root).calibration.path / "weights.safetensors"


def _segment(root: Path) -> Path:
    return root / mf.read(root).segments[0].dir


DAMAGES = {
    "weights deleted": lambda root: _weights(root).unlink(),
    "weights flipped": lambda root: _flip_same_size(_weights(root)),
    "keys flipped": lambda root: _flip_same_size(_segment(root) / "keys.npy"),
    "part flipped": lambda root: _flip_same_size(_segment(root) / "rows-00000.parquet"),
    "postings flipped": lambda root: _flip_same_size(_segment(root) / "postings" / "vocab.json"),
}
WRITES = {
    "delete": lambda root: delete(root, ["r1"]),
    "upsert": lambda root: upsert(root, [{"id": "r2", "text": "the sea again"}]),
    "add": lambda root: add_to_index(root, [{"id": "x", "text": "ice"}]),
    "compact": lambda root: compact(root, full=True),
    "recalibrate": lambda root: recalibrate(root, "whitening"),
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("write", WRITES)
def test_no_write_publishes_over_damage(calibrated, tmp_path, damage, write):
    from flowsearch.errors import IndexDamaged

    root = Path(shutil.copytree(calibrated, tmp_path / "idx"))
    DAMAGES[damage](root)
    before = _tree(root)
    with pytest.raises(IndexDamaged) as info:
        WRITES[write](root)
    message = str(info.value)
    assert "\n" not in message and ("missing" in message or "checksum" in message), message
    assert _tree(root) == before  # nothing published, nothing staged left


def test_the_cli_refuses_a_write_over_damage_in_one_line(calibrated, tmp_path):
    root = Path(shutil.copytree(calibrated, tmp_path / "idx"))
    _weights(root).unlink()
    before = _tree(root)
    result = runner.invoke(app, ["delete", "r1", "--index", str(root)])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: index file missing: ") and "weights" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert _tree(root) == before


# --- strays: reported, ignored, tidied away -------------------------------------------------

STRAYS = {
    "segment": lambda root: _segment(root) / "notes.txt",
    "postings": lambda root: _segment(root) / "postings" / "extra.pkl",
    "calibrator": lambda root: _weights(root).parent / "model.pt",
    "reference": lambda root: next((root / "references").iterdir()) / "stray.npz",
    "segments folder": lambda root: root / "segments" / "README",
    "index root": lambda root: root / "notes.md",
    "nested folder": lambda root: _segment(root) / "junk" / "deeper" / "x.bin",
}


@pytest.mark.parametrize("where", STRAYS)
def test_a_stray_is_reported_ignored_and_removed_by_the_next_write(calibrated, tmp_path, where):
    from flowsearch.search.version import index_info

    root = Path(shutil.copytree(calibrated, tmp_path / "idx"))
    with closing(Searcher.open(root)) as s:
        expected = [h.id for h in s.search("the sea", k=5)]
    stray = STRAYS[where](root)
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"not part of the index")
    with closing(Searcher.open(root)) as s:  # ignored by search
        assert [h.id for h in s.search("the sea", k=5)] == expected
    assert index_info(root, verify=True).verified.strays == (str(stray),)
    result = runner.invoke(app, ["info", "--index", str(root), "--verify"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("warning: 1 stray file in the index") and stray.name in (
        result.stderr
    )
    delete(root, ["r3"])  # the next write tidies up
    assert not stray.exists()
    assert not (root / "segments" / "s000001" / "junk").exists()
    checked = index_info(root, verify=True).verified
    assert checked.strays == () and checked.n_files > 0
    with closing(Searcher.open(root, verify=True)) as s:
        assert "r3" not in [h.id for h in s.search("row 3", k=80)]


def test_a_staged_folder_left_by_a_dead_writer_is_no_stray_and_the_next_write_removes_it(
    calibrated, tmp_path
):
    from flowsearch.search.version import index_info

    root = Path(shutil.copytree(calibrated, tmp_path / "idx"))
    stage = root / "segments" / ".stage-0123456789ab"
    stage.mkdir()
    (stage / "rows-00000.parquet").write_bytes(b"half written")
    assert index_info(root, verify=True).verified.strays == ()
    delete(root, ["r4"])
    assert not stage.exists()


def test_a_writers_tidy_up_is_not_cut_by_ctrl_c():
    import signal

    from flowsearch.storage.writer import _interrupts_deferred

    done = []
    with pytest.raises(KeyboardInterrupt), _interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("tidied")  # reached: the signal waits for the block's end
    assert done == ["tidied"]


# --- corpora --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "twice"), [("id,text,topic,topic", "topic"), ("id,text,text", "text")]
)
def test_a_csv_with_a_column_named_twice_is_one_line(tmp_path, header, twice):
    path = tmp_path / "c.csv"
    path.write_text(header + "\n" + ",".join(["1", "the sea", "x", "y"][: header.count(",") + 1]))
    with pytest.raises(BadInput, match=f"has two columns named '{twice}'; give every column"):
        scan_corpus(path)


def test_a_parquet_file_with_a_column_named_twice_is_one_line(tmp_path):
    import pyarrow.parquet as pq

    table = pa.table([[1], ["the sea"], ["x"], ["y"]], names=["id", "text", "topic", "topic"])
    pq.write_table(table, tmp_path / "c.parquet")
    with pytest.raises(BadInput, match="has two columns named 'topic'"):
        scan_corpus(tmp_path / "c.parquet")


def _nested(depth: int) -> object:
    value: object = 1
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


def test_json_lines_nested_5000_levels_is_one_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"id": "a", "text": "the sea", "m": ' + "[" * 5000 + "]" * 5000 + "}\n")
    result = runner.invoke(app, ["index", str(path), "--index", str(tmp_path / "idx")])
    assert result.exit_code == 2, result.output
    assert "column 'm' nests 5000 levels deep, more than the 32" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_metadata_nesting_is_refused_past_the_limit_and_stored_up_to_it(tmp_path, model_dir):
    from flowsearch.ingest.readers import MAX_NESTING

    deep = [{"id": "a", "text": "the sea", "m": _nested(MAX_NESTING + 1)}]
    with pytest.raises(BadInput, match=f"nests more than the {MAX_NESTING} levels"):
        build_index(deep, tmp_path / "refused", model=str(model_dir), calibration="none")
    assert not (tmp_path / "refused").exists()
    rows = [{"id": i, "text": t, "m": _nested(MAX_NESTING)} for i, t in enumerate(["sea", "ice"])]
    build_index(rows, tmp_path / "idx", model=str(model_dir), calibration="none")
    with closing(Searcher.open(tmp_path / "idx", verify=True)) as s:
        assert s.search("sea", k=1)[0].metadata["m"] == _nested(MAX_NESTING)


def test_an_index_where_no_directory_can_be_made_is_one_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "the sea"}\n')
    result = runner.invoke(app, ["index", str(corpus), "--index", "/proc/nope"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: cannot make the index directory /proc/nope")
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_ids_file_is_read_up_to_its_cap(index):
    result = runner.invoke(app, ["delete", "--ids-file", "/dev/zero", "--index", str(index)])
    assert result.exit_code == 2, result.output
    assert "holds more than 64 MiB" in result.stderr and "--ids-file" not in result.stdout


def test_a_corpus_line_longer_than_the_cap_is_refused_not_read_whole(tmp_path, monkeypatch):
    from flowsearch.ingest import readers

    monkeypatch.setattr(readers, "MAX_BLOCK", 1024)
    path = tmp_path / "long.jsonl"
    path.write_text('{"id": "a", "text": "' + "x" * 5000 + '"\n')
    with pytest.raises(BadInput, match="has a line longer than 0 MiB, the most a corpus line"):
        readers._json_problem(path)


# --- the Python API's arguments -------------------------------------------------------------


def _api_cases(index: Path, model: str) -> dict[str, object]:
    import flowsearch as fs

    one = [{"id": "z", "text": "x"}]
    out: dict[str, object] = {}
    for label, bad in (("None", None), ("int", 3), ("bytes", b"idx"), ("list", [str(index)])):
        out |= {
            f"Searcher.open({label})": lambda b=bad: fs.Searcher.open(b),
            f"build_index({label})": lambda b=bad: fs.build_index(one, b, model=model),
            f"upsert({label})": lambda b=bad: fs.upsert(b, one),
            f"add_to_index({label})": lambda b=bad: fs.add_to_index(b, one),
            f"compact({label})": lambda b=bad: fs.compact(b),
            f"index_info({label})": lambda b=bad: fs.index_info(b),
            f"index_history({label})": lambda b=bad: fs.index_history(b),
            f"load_calibrator({label})": lambda b=bad: fs.load_calibrator(b),
            f"snapshot({label})": lambda b=bad: fs.snapshot(b, index.parent / "new"),
            f"snapshot(dest={label})": lambda b=bad: fs.snapshot(index, b),
            f"restore({label})": lambda b=bad: fs.restore(b, index.parent / "new"),
            f"restore(index_dir={label})": lambda b=bad: fs.restore(index, b),
            f"export_index({label})": lambda b=bad: fs.export_index(b, index.parent / "x.parquet"),
            f"export_index(dest={label})": lambda b=bad: fs.export_index(index, b),
        }
    new = str(index.parent / "new")
    return out | {
        "Searcher.open(encoder='x')": lambda: fs.Searcher.open(index, encoder="x"),
        "upsert(encoder='x')": lambda: fs.upsert(index, one, encoder="x"),
        "build_index(batch_size='64')": lambda: fs.build_index(one, new, batch_size="64"),
        "build_index(fit_sample=None)": lambda: fs.build_index(one, new, fit_sample=None),
        "recalibrate(fit_sample='5')": lambda: fs.recalibrate(index, fit_sample="5"),
        "delete(lone surrogate)": lambda: fs.delete(index, ["\ud800"]),
        "encode(lone surrogate)": lambda: fs.Encoder(model, pooling="static").encode(["\ud800"]),
        "search_vectors('x')": lambda: fs.Searcher.open(index).search_vectors("x"),
        "search after close()": lambda: _closed(fs.Searcher.open(index)).search("sea"),
        "build_index(overwrite='no')": lambda: fs.build_index(one, index, overwrite="no"),
        "build_index(lexical=1)": lambda: fs.build_index(one, new, lexical=1),
        "export_index(overwrite='no')": lambda: fs.export_index(
            index, index.parent / "x.parquet", overwrite="no"
        ),
        "export_index(vectors='yes')": lambda: fs.export_index(
            index, index.parent / "x.parquet", vectors="yes"
        ),
        "build_index(strict='yes')": lambda: fs.build_index(one, new, strict="yes"),
        "upsert(merge_segments='no')": lambda: fs.upsert(index, one, merge_segments="no"),
        "upsert(strict=0)": lambda: fs.upsert(index, one, strict=0),
        "compact(full='yes')": lambda: fs.compact(index, full="yes"),
        "index_info(verify='no')": lambda: fs.index_info(index, verify="no"),
        "Searcher.open(verify='no')": lambda: fs.Searcher.open(index, verify="no"),
        "Searcher.open(mmap='no')": lambda: fs.Searcher.open(index, mmap="no"),
        "index_info(NUL)": lambda: fs.index_info("a\x00b"),
        "index_info(lone surrogate)": lambda: fs.index_info("a\ud800b"),
        "upsert(lone surrogate text)": lambda: fs.upsert(index, [{"id": "z", "text": "\ud800"}]),
        "Encoder(trust_remote_code='yes')": lambda: fs.Encoder(
            model, pooling="static", trust_remote_code="yes"
        ),
        "encode(batch_size='8')": lambda: fs.Encoder(model, pooling="static").encode(
            ["a"], batch_size="8"
        ),
        "encode(progress='no')": lambda: fs.Encoder(model, pooling="static").encode(
            ["a"], progress="no"
        ),
    }


def _closed(searcher: Searcher) -> Searcher:
    searcher.close()
    return searcher


def test_the_python_api_refuses_wrong_argument_types_in_one_line(index, model_dir):
    before = _tree(index)
    raw = {}
    for name, call in _api_cases(index, str(model_dir)).items():
        try:
            call()  # type: ignore[operator]
        except BadInput as exc:
            assert "\n" not in str(exc), (name, str(exc))
        except Exception as exc:  # noqa: BLE001 - what the test is about
            raw[name] = f"{type(exc).__name__}: {exc}"
        else:
            raw[name] = "accepted"
    assert raw == {}
    assert _tree(index) == before  # overwrite="no" replaced nothing
    assert not (index.parent / "new").exists() and not (index.parent / "x.parquet").exists()
