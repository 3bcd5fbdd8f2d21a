"""The README's examples, run as written: its ``flowsearch`` commands (through the CLI, in
order, in one directory) and its Python blocks, on the sample corpus ``data/sample.parquet``
with the bundled model; and the ``flowsearch`` commands of ``docs/GUIDE.md``'s ``shell`` blocks,
the same way in a directory of their own (blocks without the ``shell`` tag are illustrations,
not run). The ``curl`` line is run against a real server in ``test_server``."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flowsearch.cli import app

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
GUIDE = (REPO / "docs" / "GUIDE.md").read_text(encoding="utf-8")


def blocks(language: str, doc: str = README) -> list[str]:
    """The fenced code blocks of ``doc`` (the README by default) in ``language``, in order."""
    return [m.group(2) for m in re.finditer(r"```(\w*)\n(.*?)```", doc, re.S)
            if m.group(1) == language]  # fmt: skip


def commands(doc: str = README) -> list[str]:
    """Every ``flowsearch`` command of the shell blocks but ``serve`` (it runs until stopped)."""
    lines = [line.strip() for block in blocks("shell", doc) for line in block.splitlines()]
    return [line for line in lines if line.startswith("flowsearch ") and " serve " not in line]


def _layout(root: Path) -> Path:
    """``root`` laid out as the README and the guide assume: data/sample.parquet, and the files
    their writes name (more.parquet: new rows; changed.jsonl: new texts of existing ids;
    ids.txt)."""
    (root / "data").mkdir()
    shutil.copy(REPO / "data" / "sample.parquet", root / "data" / "sample.parquet")
    sample = pq.read_table(root / "data" / "sample.parquet")
    more = sample.slice(0, 4).set_column(0, "id", pa.array([f"p80{i:02d}" for i in range(4)]))
    pq.write_table(more, root / "more.parquet")
    changed = sample.slice(4, 2).to_pylist()
    for row in changed:
        row["text"] = "Revised: " + row["text"]
    (root / "changed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
    (root / "ids.txt").write_text("p0019\np0020\n")
    return root


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's directory."""
    return _layout(tmp_path_factory.mktemp("readme"))


@pytest.fixture(scope="module")
def guide_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guide's directory (its commands build indexes of their own)."""
    return _layout(tmp_path_factory.mktemp("guide"))


def test_the_readme_has_examples() -> None:
    assert len(commands()) >= 10 and len(blocks("python")) == 2
    assert all(shlex.split(c, comments=True)[0] == "flowsearch" for c in commands())


@pytest.mark.parametrize("line", commands())
def test_readme_command_runs(workdir: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> None:
    monkeypatch.chdir(workdir)
    args = shlex.split(line, comments=True)[1:]
    result = CliRunner(env={"COLUMNS": "100"}).invoke(app, args)
    assert result.exit_code == 0, (line, result.output)
    if "--json" in args:
        doc = json.loads(result.stdout)
        assert len(doc["hits"]) == 3 and doc["hits"][0]["metadata"].keys() == {"topic", "source"}


def test_the_guide_has_examples() -> None:
    assert len(commands(GUIDE)) >= 10
    assert all(shlex.split(c, comments=True)[0] == "flowsearch" for c in commands(GUIDE))


@pytest.mark.parametrize("line", commands(GUIDE))
def test_guide_command_runs(guide_dir: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> None:
    monkeypatch.chdir(guide_dir)
    args = shlex.split(line, comments=True)[1:]
    result = CliRunner(env={"COLUMNS": "100"}).invoke(app, args)
    assert result.exit_code == 0, (line, result.output)
    if "--json" in args:
        json.loads(result.stdout)  # one JSON document on stdout, nothing else


def test_readme_python_search_example_runs(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(workdir)
    namespace: dict = {}
    exec(compile(blocks("python")[0], "README.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    hits = [line for line in printed if line[:1].isdigit()]
    assert len(hits) == 3 and all("'topic': 'physics'" in line for line in hits)
    assert printed[-1] == "['no-such-id']"
    searcher = namespace["s"]
    assert searcher.info().to_dict()["n_live"] == 300  # 300 + 1 upserted - 1 deleted
    assert [h.id for h in searcher.search("Heat pumps move heat uphill.", k=1)] == ["p9001"]


def test_readme_calibrator_example_runs(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    monkeypatch.chdir(workdir)
    namespace: dict = {}
    exec(compile(blocks("python")[1], "README.md", "exec"), namespace)
    assert namespace["U_corpus"].shape == (300, 384)
    assert namespace["Z"].shape == (2, 384) and namespace["lp"].shape == (2,)
    flow, Z, U = namespace["flow"], namespace["Z"], namespace["U"]
    np.testing.assert_allclose(flow.inverse(Z), U, atol=1e-3)
