"""The flowsearch CLI: verbs, --json purity, agreement with the API, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import sentences, siblings, write_corpus
from typer.testing import CliRunner

from flowsearch.cli import app, main
from flowsearch.errors import BadInput
from flowsearch.search.searcher import Searcher
from flowsearch.space.reports import describe_space
from flowsearch.storage import manifest as mf

runner = CliRunner()
#: What every hit holds, in every mode (a side that did not score a hit gives null).
HIT_FIELDS = {"rank", "id", "score", "text", "metadata", "dense_score", "lexical_score",
              "rerank_score", "highlight", "marks"}  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("cli")
    corpus = write_corpus(root / "c.parquet", n=80, seed=4)
    out = root / "idx"
    result = runner.invoke(app, ["index", str(corpus), "--index", str(out), "--model",
                                 str(model_dir), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


def test_index_json_summary(built):
    out, summary = built
    m = mf.read(out)
    assert summary["kind"] == "build" and summary["index"] == str(out)
    assert summary["n_live"] == summary["n_written"] == m.n_live == 80
    assert summary["calibration"] == m.calibration.name == "auto"
    assert summary["n_segments"] == len(m.segments) == 1
    factory = m.segments[0].ann.factory
    assert summary["factory"] == factory == "Flat" and summary["version"] == m.version == 1
    # 80 rows < 3 x dim 32: auto keeps the encoder's space (see test_calibrated_space_...)
    assert summary["space"] == m.calibration.space == "encoder"


def test_query_json_matches_api_and_brute_force(built):
    out, _ = built
    query = sentences(1, seed=21)[0]
    args = ["query", query, "--index", str(out), "-k", "7", "--mode", "dense", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # stdout is exactly one JSON document
    assert set(doc) == {"query", "hits", "report"} and doc["query"] == query
    assert all(set(h) == HIT_FIELDS for h in doc["hits"])  # the same fields in every mode
    # dense mode: the raw cosine beside the score, and BM25 scored nothing
    assert all(h["dense_score"] is not None and h["lexical_score"] is None for h in doc["hits"])
    searcher = Searcher.open(out)
    result = searcher.query(query, k=7, mode="dense")
    assert doc["report"] == json.loads(json.dumps(result.report.to_dict()))
    # 80 rows < 3 x dim 32: the flow's figures mean nothing, so none is shown, nor a verdict
    assert doc["report"]["log_density"] is None and doc["report"]["verdict"] == "not judged"
    assert doc["report"]["top_score"] == pytest.approx(doc["hits"][0]["dense_score"])
    api = searcher.search(query, k=7, mode="dense")
    Z, _ = searcher.embed([query])
    vec = searcher.search_vectors(Z, k=7)[0]
    brute = Z[0] @ searcher.vectors().T
    order = np.argsort(-brute, kind="stable")[:7]
    assert [h["id"] for h in doc["hits"]] == [h.id for h in api] == [h.id for h in vec]
    assert [h["id"] for h in doc["hits"]] == [f"d{i}" for i in order]
    assert [h["score"] for h in doc["hits"]] == [h.score for h in api] == [h.score for h in vec]
    scores = [h["score"] for h in doc["hits"]]
    assert scores == sorted(scores, reverse=True)  # the score orders as the cosine does
    np.testing.assert_allclose([h["dense_score"] for h in doc["hits"]], brute[order], rtol=1e-5)
    assert [h["rank"] for h in doc["hits"]] == list(range(1, 8))


def test_query_table_and_env_default(built, tmp_path):
    out, _ = built
    env = {"FLOWSEARCH_INDEX": str(out), "COLUMNS": "160"}
    result = CliRunner(env=env).invoke(app, ["query", "the cat", "-k", "3"])
    assert result.exit_code == 0, result.output
    assert "rank" in result.stdout and "score" in result.stdout and "d" in result.stdout
    # 80 tiny-BERT rows searched raw: an anisotropic encoder space, where no verdict is given
    assert "not judged: in this space every passage is close" in " ".join(result.stdout.split())
    # the one-line legend under the table says what score, cosine and BM25 are
    from flowsearch.cli.search import SCORE_LEGEND

    assert SCORE_LEGEND in " ".join(result.stdout.split())
    assert len(SCORE_LEGEND) <= 160 and "cosine" in SCORE_LEGEND and "BM25" in SCORE_LEGEND
    cwd = os.getcwd()
    try:  # without --index or $FLOWSEARCH_INDEX: ./flowsearch_index
        os.chdir(tmp_path)
        result = CliRunner(env={"FLOWSEARCH_INDEX": None}).invoke(app, ["info"])
        assert result.exit_code == 2 and "flowsearch_index" in result.stderr
    finally:
        os.chdir(cwd)


def test_info(built):
    out, _ = built
    result = runner.invoke(app, ["info", "--index", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    m = mf.read(out)
    manifest_doc = json.loads(json.dumps(m.to_json_dict()))
    stored = json.loads((out / mf.MANIFEST_NAME).read_text())
    assert {key: stored[key] for key in manifest_doc} == manifest_doc
    assert {key: doc[key] for key in manifest_doc} == manifest_doc  # the manifest, as stored
    assert doc["path"] == str(out.resolve()) and doc["n_live"] == m.n_live == 80
    assert doc["n_rows"] == 80 and doc["n_deleted"] == 0
    assert doc["bytes"]["total"] > doc["bytes"]["segments"] > 0
    n_files = sum(len(s.files) for s in m.segments) + len(m.calibration.files)
    n_files += len(m.reference.sample.files)  # the reference sample
    assert doc["verified"]["n_files"] == n_files
    assert doc["verified"]["n_hashed"] + len(doc["verified"]["not_hashed"]) == n_files
    text = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["info", "--index", str(out)]).stdout
    flat = " ".join(text.split())
    assert "1 (80 live rows; vector index Flat)" in flat  # segments
    assert "topic string, year int32" in flat  # the schema
    assert describe_space(m.calibration, "mean") in flat
    assert "80 rows are too few to calibrate 32 dimensions" in text
    assert "80 of the corpus's own passages" in text  # judged against (leave-one-out)


def test_add_then_duplicate_add(built, tmp_path):
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(built[0], out)
    extra = write_corpus(tmp_path / "extra.parquet", n=10, seed=8, id_prefix="x")
    result = runner.invoke(app, ["add", str(extra), "--index", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "add" and doc["n_written"] == doc["n_inserted"] == 10
    assert doc["n_live"] == 90 and doc["n_segments"] == 2 and doc["version"] == 2
    assert doc["drift"]["n_judged"] == 10 and doc["drift"]["verdict"] != "not judged"
    again = runner.invoke(app, ["add", str(extra), "--index", str(out)])
    assert again.exit_code == 2 and again.stdout == ""
    assert again.stderr.startswith("error: 10 id(s) are already in the index")


def _bad_cases(tmp_path, built_dir):
    good = write_corpus(tmp_path / "good.parquet", n=5)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), empty)
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"id": [1, 1, 2], "text": ["a cat", "a dog", "a sun"]}), dup)
    blank = tmp_path / "blank.parquet"
    pq.write_table(pa.table({"text": ["a cat", ""]}), blank)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x.txt").write_text("x")
    new = str(tmp_path / "new_idx")
    return {
        "missing file": ([str(tmp_path / "none.parquet"), "--index", new], "corpus not found"),
        "not parquet": ([str(junk), "--index", new], "not a Parquet file"),
        "text column": ([str(good), "--index", new, "--text-column", "body"],
                        "(columns: id, text, topic, year)"),
        "empty": ([str(empty), "--index", new], "no rows"),
        "duplicate ids": ([str(dup), "--index", new], "1 id(s) occur more than once"),
        "strict": ([str(blank), "--index", new, "--strict"], "1 row(s) have a null or blank"),
        "foreign dir": ([str(good), "--index", str(foreign), "--overwrite"], "not a flowsearch"),
        "exists": ([str(good), "--index", str(built_dir)], "pass --overwrite"),
        "calibration": ([str(good), "--index", new, "--calibration", "magic"], "unknown calib"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    ["missing file", "not parquet", "text column", "empty", "duplicate ids", "strict",
     "foreign dir", "exists", "calibration"],
)  # fmt: skip
def test_bad_index_input(tmp_path, built, model_dir, case):
    args, message = _bad_cases(tmp_path, built[0])[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = runner.invoke(app, ["index", *args, "--model", str(model_dir)])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    assert siblings(built[0]) == []


def test_usage_errors_exit_2(capsys):
    assert main(["query"]) == 2  # missing argument
    assert main(["query", "x", "--bogus"]) == 2
    assert main(["eval", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 3 and "Traceback" not in err


def test_console_script_runs(built, tmp_path):
    """The real entry point in a subprocess: JSON on stdout, nothing else; errors exit 2."""
    out, _ = built
    cmd = [sys.executable, "-c", "import sys; from flowsearch.cli import main; sys.exit(main())"]
    ok = subprocess.run([*cmd, "query", "the dog", "--index", str(out), "--json", "-k", "2"],
                        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert len(json.loads(ok.stdout)["hits"]) == 2
    bad = subprocess.run([*cmd, "query", "x", "--index", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and bad.stderr.startswith("error: no index")


def test_eval_passes_options_and_prints_json(monkeypatch):
    from flowsearch import evaluation

    calls = {}

    def fake_sts(**kwargs):
        calls.update(kwargs)
        return {"model": "m", "pooling": kwargs["pooling"], "calibration": "flow",
                "max_length": 64, "results": {"STSB": {"spearman": 80.5}}, "avg": 80.5}  # fmt: skip

    monkeypatch.setattr(evaluation, "run_sts", fake_sts)
    args = ["eval", "sts", "--pooling", "cls", "--calibration", "flow", "--max-length", "64",
            "--tasks", "STSB, SICKR", "--data", "/data", "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"]["STSB"]["spearman"] == 80.5
    assert calls["tasks"] == ["STSB", "SICKR"] and calls["max_length"] == 64
    assert str(calls["data_dir"]) == "/data" and calls["pooling"] == "cls"
    table = CliRunner(env={"COLUMNS": "120"}).invoke(app, args[:-1])
    assert table.exit_code == 0 and "STSB" in table.stdout and "80.5000" in table.stdout


@pytest.mark.parametrize(
    "part",
    ["segments/s000001/ann.faiss", "calibrators/c000001", "segments/s000001/rows-00000.parquet",
     "segments/s000001/postings", "segments/s000001/keys.npy"],
)  # fmt: skip
def test_info_on_an_incomplete_index_is_one_line(built, tmp_path, part):
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(built[0], out)
    m = mf.read(out)
    assert m.segments[0].dir == "segments/s000001" and m.calibration.path == "calibrators/c000001"
    target = out / part
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    for args in (["info", "--index", str(out)], ["info", "--index", str(out), "--json"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and result.stdout == "", result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: index file missing")
        assert "Traceback" not in result.output


def test_json_output_is_valid_json_with_nan_metadata(tmp_path, model_dir):
    from flowsearch.writes.build import build_index

    n = 12
    score = [float("nan"), float("inf"), float("-inf"), *np.linspace(0, 1, n - 3)]
    corpus = write_corpus(tmp_path / "c.parquet", n=n, seed=2, score=score)
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")

    def strict_json(text):
        def refuse(name):
            raise ValueError(f"{name} is not JSON")

        return json.loads(text, parse_constant=refuse)

    result = runner.invoke(app, ["query", "the cat", "--index", str(out), "-k", str(n), "--json"])
    assert result.exit_code == 0, result.output
    doc = strict_json(result.stdout)
    by_id = {h["id"]: h["metadata"]["score"] for h in doc["hits"]}
    assert by_id["d0"] is None and by_id["d1"] is None and by_id["d2"] is None
    assert by_id["d3"] == 0.0 and by_id[f"d{n - 1}"] == 1.0
    result = runner.invoke(app, ["info", "--index", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert strict_json(result.stdout)["n_live"] == n


@pytest.fixture(scope="module")
def whitened(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("cli-white")
    corpus = write_corpus(root / "c.parquet", n=60, seed=6)
    out = root / "idx"
    args = ["index", str(corpus), "--index", str(out), "--model", str(model_dir),
            "--calibration", "whitening", "--no-lexical", "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_calibrated_space_is_searched_and_verified(whitened, model_dir):
    """Built with --calibration whitening: the query and the stored vectors are whitened, and
    the hits are the brute-force top-k in that space (not in the encoder's)."""
    from flowsearch.calibration import load_calibrator
    from flowsearch.encode.encoder import Encoder
    from flowsearch.storage.rows import RowReader

    m = mf.read(whitened)
    assert m.calibration.calibrator == "whitening" and m.calibration.space == "calibrated"
    cal = load_calibrator(whitened / m.calibration.path)
    (segment,) = m.segments
    reader = RowReader(whitened / segment.dir, segment.parts)
    raw, stored = reader.vectors("raw"), reader.vectors("vector")
    ids = [i for chunk in reader.column_chunks("id") for i in chunk]
    reader.close()

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    np.testing.assert_allclose(stored, unit(cal.transform(raw)), atol=5e-3)  # raw is float16
    queries = sentences(5, seed=31)
    U = Encoder(str(model_dir)).encode(queries)
    differs = 0
    for query, u in zip(queries, U, strict=True):
        result = runner.invoke(app, ["query", query, "--index", str(whitened), "-k", "8", "--json"])
        assert result.exit_code == 0, result.output
        hits = json.loads(result.stdout)["hits"]
        brute = (unit(cal.transform(u[None]))[0] @ stored.T).astype(np.float64)
        order = np.argsort(-brute, kind="stable")[:8]
        assert [h["id"] for h in hits] == [ids[i] for i in order]
        cosines = [h["dense_score"] for h in hits]
        np.testing.assert_allclose(cosines, brute[order], rtol=1e-4, atol=1e-5)
        raw_order = np.argsort(-(unit(u[None])[0] @ unit(raw).T), kind="stable")[:8]
        differs += [ids[i] for i in raw_order] != [h["id"] for h in hits]
    assert differs > 0  # the encoder's own space would have ranked them otherwise
    for args in (["--verify", "--json"], ["--verify"]):
        result = runner.invoke(app, ["info", "--index", str(whitened), *args])
        assert result.exit_code == 0, result.output
    verified = json.loads(runner.invoke(app, ["info", "--index", str(whitened), "--verify",
                                              "--json"]).stdout)["verified"]  # fmt: skip
    n_files = len(segment.files) + len(m.calibration.files) + len(m.reference.sample.files)
    assert verified == {"n_files": n_files, "n_hashed": n_files, "not_hashed": [],
                        "history_records": 1, "strays": []}  # fmt: skip
    # a corrupted file is caught by --verify
    faiss_file = whitened / segment.dir / segment.ann.path
    original = faiss_file.read_bytes()
    try:
        data = bytearray(original)
        data[-1] ^= 0xFF
        faiss_file.write_bytes(bytes(data))
        bad = runner.invoke(app, ["info", "--index", str(whitened), "--verify"])
        assert bad.exit_code == 2 and bad.stderr.startswith("error: checksum mismatch")
    finally:
        faiss_file.write_bytes(original)


def test_user_strings_are_printed_literally(tmp_path, model_dir):
    """Rich markup in a query or a passage is text, and an ESC sequence is shown, not obeyed."""
    texts = ["the [bold]x[/bold] cat", "the \x1b[31mred\x1b[0m dog", "the [/] bird", "a tree"]
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["[b]markup[/b]", "esc", "slash", "plain"], "text": texts}),
                   corpus)  # fmt: skip
    out = tmp_path / "idx"
    result = runner.invoke(app, ["index", str(corpus), "--index", str(out), "--model",
                                 str(model_dir), "--calibration", "none"])  # fmt: skip
    assert result.exit_code == 0, result.output
    wide = CliRunner(env={"COLUMNS": "200"})
    for query in ("[/]", "[bold]x[/bold]", "\x1b[2J"):
        result = wide.invoke(app, ["query", query, "--index", str(out), "-k", "4"])
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output and "\x1b" not in result.stdout
        flat = " ".join(result.stdout.split())
        assert "the [bold]x[/bold] cat" in flat and "[b]markup[/b]" in flat
        assert "the \\x1b[31mred\\x1b[0m dog" in flat  # the escape, visible
        assert "the [/] bird" in flat
    assert "'[/]'" in " ".join(
        wide.invoke(app, ["query", "[/]", "--index", str(out)]).stdout.split()
    )  # the title echoes the query literally
    doc = json.loads(runner.invoke(app, ["query", "[/]", "--index", str(out), "-k", "4",
                                         "--json"]).stdout)  # fmt: skip
    assert doc["query"] == "[/]"
    assert sorted(h["text"] for h in doc["hits"]) == sorted(texts)  # JSON: the exact strings


def test_empty_query_is_a_user_error(built):
    out, _ = built
    for query in ("", "   "):
        result = runner.invoke(app, ["query", query, "--index", str(out)])
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.startswith("error: the query is empty")
        assert "Traceback" not in result.output


def test_moved_model_is_given_with_model(tmp_path, model_dir):
    import shutil

    first = tmp_path / "models" / "bert"
    shutil.copytree(model_dir, first)
    corpus = write_corpus(tmp_path / "c.parquet", n=20, seed=9)
    out = tmp_path / "idx"
    result = runner.invoke(app, ["index", str(corpus), "--index", str(out), "--model", str(first),
                                 "--calibration", "none"])  # fmt: skip
    assert result.exit_code == 0, result.output
    query = ["query", "the cat", "--index", str(out), "-k", "3", "--json"]
    want = json.loads(runner.invoke(app, query).stdout)["hits"]
    moved = first.rename(tmp_path / "elsewhere")
    lost = runner.invoke(app, query)
    assert lost.exit_code == 2 and lost.stdout == ""
    assert "pass --model" in lost.stderr and "model=" not in lost.stderr  # flags, not kwargs
    found = runner.invoke(app, [*query, "--model", str(moved)])
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["hits"] == want
    extra = write_corpus(tmp_path / "extra.parquet", n=3, seed=10, id_prefix="x")
    added = runner.invoke(app, ["add", str(extra), "--index", str(out), "--model", str(moved)])
    assert added.exit_code == 0, added.output
    assert mf.read(out).encoder.source == str(moved)  # remembered: no --model needed now
    assert runner.invoke(app, query).exit_code == 0


# -- the surface: help, empty results, --wait, error mapping ---------------------------------


def _help_words(args: list[str]) -> tuple[str, set[str]]:
    """``--help`` at 80 columns: its text and the words of its help column (panel borders and
    punctuation stripped)."""
    result = CliRunner(env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"}).invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert max(len(line) for line in text.splitlines()) <= 80
    words = {w.strip(",.;:()[]") for w in text.replace("│", " ").split()}
    return text, words


@pytest.mark.parametrize(
    "args,lists",
    [
        (["index"], ["CALIBRATIONS", "POOLINGS", "BACKENDS", "ENGINES", "QUANTIZATIONS"]),
        (["recalibrate"], ["CALIBRATIONS"]),
        (["query"], ["MODES"]),
        (["eval"], ["CALIBRATIONS", "POOLINGS", "BACKENDS", "MODES"]),
    ],
)
def test_help_at_80_columns_prints_every_choice(args, lists):
    from flowsearch.calibration import names
    from flowsearch.cli import options
    from flowsearch.encode.encoder import POOLINGS
    from flowsearch.search.searcher import MODES

    text, words = _help_words(args)
    uncut = text.replace("[BEIR_DIR]...", "")  # click's mark of a variadic argument (eval)
    assert "…" not in text and "..." not in uncut  # nothing cut
    for name in lists:
        missing = [c for c in getattr(options, name) if c not in words]
        assert not missing, (name, missing, text)
    # the lists are the owners' own
    assert set(options.CALIBRATIONS) == {"auto", *names()} and options.POOLINGS == POOLINGS
    assert options.MODES == MODES
    flags = [line for line in text.splitlines() if "<bool>" in line]
    assert all("--help" in line for line in flags), flags  # flags take no value


def test_every_write_command_has_wait():
    for command in ("index", "add", "upsert", "delete", "compact", "recalibrate"):
        text, words = _help_words([command])
        assert "--wait" in words and "SECONDS" in words, command


def test_empty_result_prints_the_report_on_one_line(built):
    out, _ = built
    args = ["query", "the cat", "--index", str(out), "--where", "year > 3000"]
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    report = Searcher.open(out).query("the cat", where="year > 3000").report
    from flowsearch.cli.output import report_caption

    caption = report_caption(report)
    assert len(caption) > 30  # long enough that a narrow column would have folded it
    assert result.stdout.splitlines() == ["'the cat': 0 hits", caption]


WRITES = {
    "index": ("flowsearch.writes.build", "build", ["index", "c.parquet"]),
    "add": ("flowsearch.writes.upsert", "write", ["add", "c.parquet"]),
    "upsert": ("flowsearch.writes.upsert", "write", ["upsert", "c.parquet"]),
    "delete": ("flowsearch.writes.delete", "delete", ["delete", "d1"]),
    "compact": ("flowsearch.writes.compact", "compact", ["compact"]),
    "recalibrate": ("flowsearch.writes.compact", "recalibrate", ["recalibrate"]),
}


@pytest.mark.parametrize("command", sorted(WRITES))
def test_wait_is_passed_to_the_library_only_when_given(monkeypatch, tmp_path, command):
    import importlib

    from flowsearch.errors import IndexLocked

    module, name, args = WRITES[command]
    calls: list[dict] = []

    def fake(*a, **kwargs):
        request = next((x for x in a if hasattr(x, "wait")), None)  # a BuildRequest, a WriteRequest
        calls.append(kwargs if request is None else {"wait": request.wait})
        raise IndexLocked("another flowsearch process is writing idx", "retry with {wait=60}",
                          param="wait")  # fmt: skip

    monkeypatch.setattr(importlib.import_module(module), name, fake)
    base = [*args, "--index", str(tmp_path / "idx")]
    for extra, expected in (([], None), (["--wait", "2.5"], 2.5)):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert result.stderr == (
            "error: another flowsearch process is writing idx; retry with --wait 60\n"
        )
        assert calls.pop().get("wait") == expected
    assert main([*base, "--wait", "-1"]) == 2  # a usage error, before any write


def test_wait_outlasts_another_writer(built, tmp_path):
    import fcntl
    import shutil
    import threading

    from flowsearch.storage.layout import LOCK_NAME

    out = tmp_path / "idx"
    shutil.copytree(built[0], out)
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's write, for 1 s
    threading.Timer(1.0, os.close, args=(fd,)).start()
    result = runner.invoke(app, ["delete", "d1", "--index", str(out), "--wait", "30", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["n_deleted"] == 1


def test_errors_render_their_cli_fix(monkeypatch):
    from flowsearch.errors import BadInput, FlowsearchError, IndexDamaged
    from flowsearch.writes import compact as compact_module

    cases = [
        (BadInput("index at x", "pass {overwrite=True} to replace it", param="overwrite"),
         "index at x; pass --overwrite to replace it"),
        (FlowsearchError("plain library error"), "plain library error"),
        (IndexDamaged("index file missing: f", "rebuild it", cli="run flowsearch index again"),
         "index file missing: f; run flowsearch index again"),
        (BadInput("bad \x1b[31m id\nhere"), "bad \\x1b[31m id here"),
    ]  # fmt: skip
    for exc, line in cases:

        def fail(*args, exc=exc, **kwargs):
            raise exc

        monkeypatch.setattr(compact_module, "compact", fail)
        result = runner.invoke(app, ["compact", "--index", "x"])
        assert result.exit_code == exc.exit_code == 2
        assert result.stderr == f"error: {line}\n" and result.stdout == ""


@pytest.fixture(scope="module")
def int_ids(tmp_path_factory, model_dir):
    from flowsearch.writes.build import build_index

    root = tmp_path_factory.mktemp("int-ids")
    corpus = root / "c.parquet"
    pq.write_table(pa.table({"id": list(range(10)), "text": sentences(10, seed=3)}), corpus)
    build_index(corpus, root / "idx", model=str(model_dir), calibration="none")
    return root / "idx"


def test_delete_a_digit_that_is_not_a_number_is_one_line(int_ids):
    before = mf.read(int_ids)
    result = runner.invoke(app, ["delete", "²", "--index", str(int_ids)])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "'²'" in result.stderr  # names the id at fault
    assert mf.read(int_ids) == before  # nothing written
    assert result.exception is None or isinstance(result.exception, SystemExit)


# -- the third release's verbs and options: compact --full, info --history, --min-score ---------


def test_compact_full_and_the_history(built, tmp_path):
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(built[0], out)
    extra = write_corpus(tmp_path / "extra.parquet", n=10, seed=8, id_prefix="x")
    assert runner.invoke(app, ["add", str(extra), "--index", str(out)]).exit_code == 0
    deleted = runner.invoke(app, ["delete", "d1", "x2", "--index", str(out), "--json"])
    assert json.loads(deleted.stdout)["n_deleted"] == 2
    before = mf.read(out)
    assert len(before.segments) == 2 and before.n_deleted == 2
    query = ["query", "the cat", "--index", str(out), "-k", "90", "--mode", "dense", "--json"]
    hits = json.loads(runner.invoke(app, query).stdout)["hits"]

    result = runner.invoke(app, ["compact", "--full", "--index", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "compact" and doc["n_segments"] == 1 and doc["n_merged"] == 2
    assert doc["n_dropped"] == 2 and doc["n_live"] == 88 and doc["bytes_freed"] > 0
    m = mf.read(out)
    assert len(m.segments) == 1 and m.n_deleted == 0 and m.n_rows == 88
    assert json.loads(runner.invoke(app, query).stdout)["hits"] == hits  # the same answers
    again = json.loads(runner.invoke(app, ["compact", "--full", "--index", str(out),
                                           "--json"]).stdout)  # fmt: skip
    assert again["n_merged"] == 0 and again["version"] == m.version  # nothing to do: no write

    history = runner.invoke(app, ["info", "--history", "--index", str(out), "--json"])
    records = json.loads(history.stdout)
    assert [(r["version"], r["kind"]) for r in records] == [
        (1, "build"), (2, "add"), (3, "delete"), (4, "compact")
    ]  # fmt: skip
    assert records[3]["detail"] == {"merged": 2, "dropped": 2}
    text = CliRunner(env={"COLUMNS": "60"}).invoke(app, ["info", "--history", "--index", str(out)])
    lines = text.stdout.splitlines()  # one line per write, whatever the width
    assert (
        len(lines) == 4 and lines[1].startswith("v2 ") and " add: 10 passages written " in lines[1]
    )
    assert "merged 2" in lines[3] and "dropped 2" in lines[3]


def test_min_score_and_explain(built):
    out, _ = built
    base = ["query", "the cat and the dog", "--index", str(out), "-k", "20", "--json"]
    every = json.loads(runner.invoke(app, base).stdout)["hits"]
    cut = every[len(every) // 2]["score"]
    kept = json.loads(runner.invoke(app, [*base, "--min-score", str(cut)]).stdout)["hits"]
    assert kept == [h for h in every if h["score"] >= cut] and 0 < len(kept) < len(every)
    api = Searcher.open(out).search("the cat and the dog", k=20, min_score=cut)
    assert [h["id"] for h in kept] == [h.id for h in api]
    assert main([*base, "--min-score", "high"]) == 2  # a usage error
    explained = CliRunner(env={"COLUMNS": "100"}).invoke(
        app, ["query", "the cat", "--index", str(out), "-k", "2", "--explain"]
    )
    assert explained.exit_code == 0, explained.output
    assert "best dense score" in explained.stdout.splitlines()[-1]


@pytest.mark.parametrize("cut", ["2", "-1", "20", "nan"])
def test_min_score_outside_the_score_range_is_refused(built, cut):
    """A cut outside [0, 1] (scores' range) is a slip, e.g. a percentage: refused, not obeyed
    (above 1 used to drop every hit silently, below 0 none)."""
    out, _ = built
    args = ["query", "the cat", "--index", str(out), "--min-score", cut, "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: min_score")
    if cut != "nan":
        assert "[0, 1]" in result.stderr and "--min-score" in result.stderr
    with pytest.raises(BadInput) as caught:
        Searcher.open(out).search("the cat", min_score=float(cut))
    assert caught.value.param == "min_score"
    assert runner.invoke(app, [*args[:-3], "--min-score", "1", "--json"]).exit_code == 0


def test_unknown_calibration_lists_every_name_a_write_takes(built, tmp_path):
    """`index` and `recalibrate` take `auto`: the error's list of choices names it too."""
    out, _ = built
    before = (out / mf.MANIFEST_NAME).read_text()
    corpus = write_corpus(tmp_path / "c.parquet", n=10, seed=1)
    for args in (
        ["index", str(corpus), "--index", str(tmp_path / "new"), "--calibration", "bogus"],
        ["recalibrate", "--index", str(out), "--calibration", "bogus"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert result.stderr.startswith("error: unknown calibration 'bogus'; choose one of auto, ")
        assert "whitening" in result.stderr and "none" in result.stderr
    assert not (tmp_path / "new").exists() and (out / mf.MANIFEST_NAME).read_text() == before


def test_text_that_is_not_text_gets_the_command_line_fix(built, tmp_path):
    """The advice for a text column of numbers names the flag, not the Python keyword."""
    out, _ = built
    before = (out / mf.MANIFEST_NAME).read_text()
    bad = tmp_path / "numtext.jsonl"
    bad.write_text('{"id": "t6", "text": 5}\n')
    result = runner.invoke(app, ["upsert", str(bad), "--index", str(out)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert "holds numbers (int64), not text; name the column of passages with --text-column" in (
        result.stderr
    )
    assert "text_column=" not in result.stderr
    assert (out / mf.MANIFEST_NAME).read_text() == before


def test_summaries_count_in_words(built, tmp_path):
    """One row is "1 row", one segment "1 segment"; compact says what it did (or that there
    was nothing to do) in lines that fit 80 columns."""
    import shutil

    out = tmp_path / "idx"
    shutil.copytree(built[0], out)
    wide = CliRunner(env={"COLUMNS": "80"})
    deleted = wide.invoke(app, ["delete", "d1", "--index", str(out)])
    assert deleted.stderr == f"deleted 1 document from {out}\n"
    compacted = wide.invoke(app, ["compact", "--index", str(out)])
    assert compacted.exit_code == 0, compacted.output
    said = " ".join(compacted.stderr.split())
    assert said.startswith(f"compacted {out} (version 3): 79 live passages in 1 segment; ")
    assert "rewrote 1 segment (79 passages written), dropped 1 deleted passage, freed " in said
    assert all(len(line) <= 80 for line in compacted.stderr.splitlines())
    again = wide.invoke(app, ["compact", "--index", str(out)])
    assert " ".join(again.stderr.split()) == (
        f"nothing to compact in {out} (version 3): 79 live passages in 1 segment"
    )
    history = wide.invoke(app, ["info", "--history", "--index", str(out)]).stdout.splitlines()
    # the history counts what the summaries count, in the same words
    assert history[1].endswith(" delete: 1 passage deleted"), history
    assert " compact: 79 passages written (" in history[2], history
    query = wide.invoke(app, ["query", "the cat", "--index", str(out), "-k", "1"])
    assert query.stdout.splitlines()[0] == "'the cat': 1 hit"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--engine", "ray", "--shards", "0"], "shards"),
        (["--engine", "spark"], "engine"),
        (["--shards", "2"], "--engine ray"),
    ],  # fmt: skip
)
def test_serve_checks_engine_and_shards(built, extra, says):
    pytest.importorskip("fastapi")
    result = runner.invoke(app, ["serve", "--index", str(built[0]), "--port", "8765", *extra])
    assert result.exit_code == 2 and says in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1


def _cli_index(tmp_path, model_dir, records, *extra):
    corpus = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(records), corpus)
    out = tmp_path / "idx"
    args = ["index", str(corpus), "--index", str(out), "--model", str(model_dir), *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_the_table_shows_a_long_text_where_the_query_words_are(tmp_path, model_dir):
    """A long text is cut around the words that matched (Hit.window), not from its start."""
    long = "the " + "cat dog " * 40 + "piano guitar"
    records = [{"id": "long", "text": long}] + [
        {"id": f"s{i}", "text": t} for i, t in enumerate(sentences(6, seed=9))
    ]
    out = _cli_index(tmp_path, model_dir, records)
    args = ["query", "guitar", "--index", str(out), "-k", "1", "--mode", "lexical"]
    table = CliRunner(env={"COLUMNS": "160"}).invoke(app, args)
    assert table.exit_code == 0, table.output
    row = next(line for line in table.stdout.splitlines() if "long" in line)
    assert "piano guitar" in row and "…" in row, table.stdout
    hit = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["hits"][0]
    assert [long[a:b] for a, b in hit["marks"]] == ["guitar"]


def test_explain_says_not_judged_once(built):
    args = ["query", "the cat", "--index", str(built[0]), "-k", "2", "--mode", "lexical"]
    explained = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*args, "--explain"])
    assert explained.exit_code == 0, explained.output
    assert explained.stdout.count("not judged") == 1, explained.stdout


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_corpus_that_is_not_a_regular_file_says_so(tmp_path, model_dir, kind):
    path = "/dev/null"
    if kind == "fifo":
        path = str(tmp_path / "pipe")
        os.mkfifo(path)
    result = runner.invoke(app, ["index", path, "--index", str(tmp_path / "idx")])
    assert result.exit_code == 2, result.output
    assert f"error: {path} is not a regular file" in result.stderr
    assert "not found" not in result.stderr


def test_an_id_column_beside_the_corpus_id_names_both(built, tmp_path, model_dir):
    corpus = write_corpus(tmp_path / "c.parquet", n=5, seed=3)  # has id and text
    args = ["index", str(corpus), "--index", str(tmp_path / "idx"), "--id-column", "text"]
    result = runner.invoke(app, [*args, "--model", str(model_dir)])
    assert result.exit_code == 2, result.output
    said = result.stderr
    assert "has a column 'id', but the ids are read from 'text'" in said
    assert "pass --id-column id" in said and "clashes" not in said


def test_ids_longer_than_the_limit_are_refused_by_every_write(built, tmp_path, model_dir):
    from flowsearch.ingest.columns import MAX_ID_CHARS
    from flowsearch.writes.delete import delete
    from flowsearch.writes.upsert import upsert

    too_long = "x" * (MAX_ID_CHARS + 1)
    corpus = tmp_path / "long_id.parquet"
    pq.write_table(pa.table({"id": [too_long], "text": ["the cat"]}), corpus)
    model = ["--model", str(model_dir)]
    for verb, index, extra in (("index", tmp_path / "new", model), ("upsert", built[0], [])):
        result = runner.invoke(app, [verb, str(corpus), "--index", str(index), *extra])
        assert result.exit_code == 2 and f"at most {MAX_ID_CHARS:,}" in result.stderr, verb
    deleted = runner.invoke(app, ["delete", too_long, "--index", str(built[0])])
    assert deleted.exit_code == 2 and f"at most {MAX_ID_CHARS:,}" in deleted.stderr
    with pytest.raises(BadInput, match="at most"):
        upsert(built[0], [{"id": too_long, "text": "the cat"}])
    with pytest.raises(BadInput, match="at most"):
        delete(built[0], [too_long])
    assert mf.read(built[0]).version == 1  # nothing written


def test_serve_help_prefers_the_environment_for_the_key():
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["serve", "--help"])
    assert "Prefer setting FLOWSEARCH_API_KEY" in " ".join(result.stdout.split())
