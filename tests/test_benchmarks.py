"""The benchmarks as a suite: one package with no import cycle, the suite apart from the
studies, every script registered in the entry point, and reports written beside their script."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT))

from benchmarks import catalog  # noqa: E402
from benchmarks.common import harness  # noqa: E402


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in BENCH.rglob("*.py") if "_work" not in p.parts}


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (at any depth, functions included), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, node.lineno))
            out += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return out


def _graph() -> dict[str, set[str]]:
    return {
        name: {m for m, _ in _imports(path) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }


def test_no_script_imports_another_by_a_bare_name():
    stems = {p.stem for p in MODULES.values()} - {"__init__"}
    bare = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in MODULES.values()
        for name, line in _imports(path)
        if name.split(".")[0] in stems
    ]
    assert not bare, "import benchmarks by their package name (benchmarks.area.module):\n" + (
        "\n".join(bare)
    )


def test_benchmark_imports_have_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_common_and_the_suite_do_not_import_the_studies():
    graph = _graph()
    leaks = [
        f"{name} imports {dep}"
        for name, deps in graph.items()
        if not name.startswith("benchmarks.studies")
        for dep in deps
        if dep.startswith("benchmarks.studies")
    ]
    assert not leaks, leaks
    common = [
        f"{name} imports {dep}"
        for name, deps in graph.items()
        if name.startswith("benchmarks.common")
        for dep in deps
        if not dep.startswith("benchmarks.common")
    ]
    assert not common, common


def test_every_benchmark_script_is_registered():
    registered = {b.module for b in catalog.BENCHMARKS}
    scripts = {
        name
        for name, path in MODULES.items()
        if path.stem.startswith(("bench_", "run_")) and not path.stem.endswith("_report")
    }
    assert scripts - registered == set(), "add these to benchmarks/catalog.py"
    for bench in catalog.BENCHMARKS:
        assert bench.path.is_file(), bench
        assert bench.module in MODULES, bench
        assert bench.suite == (not bench.area.startswith(("studies", "common"))), bench
        assert bench.suite is False or bench.area in catalog.AREAS, bench
    names = [b.name for b in catalog.BENCHMARKS]
    assert len(names) == len(set(names))
    assert {b.area for b in catalog.BENCHMARKS if b.suite} == set(catalog.AREAS)


def test_find_by_name_or_stem_and_a_clear_line_otherwise():
    assert catalog.find("ann_study") is catalog.find("bench_ann_study")
    with pytest.raises(SystemExit, match="python -m benchmarks list"):
        catalog.find("no-such-benchmark")


def _entry(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_list_names_every_benchmark_with_its_area_and_kind():
    done = _entry("list")
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line.split()[1:3] for line in done.stdout.splitlines()}
    for bench in catalog.BENCHMARKS:
        assert lines[bench.name][0] == bench.area
        assert lines[bench.name][1] == ("suite" if bench.suite else lines[bench.name][1])


def test_run_refuses_a_smoke_a_study_lacks_in_one_line():
    done = _entry("run", "fusion", "--smoke")
    assert done.returncode != 0
    assert done.stderr.strip() == "fusion has no --smoke (a study run in full only)"


def test_publish_writes_the_report_beside_the_stem_and_never_results_md(tmp_path, monkeypatch):
    results = BENCH / "RESULTS.md"
    before = results.read_bytes() if results.is_file() else None
    monkeypatch.setattr(harness, "WORK", tmp_path / "work")
    body = harness.publish(tmp_path / "bench_x", lambda r: f"## x\n\n{r['n']}", {"n": 3})
    assert body == "## x\n\n3"
    assert (tmp_path / "bench_x.json").read_text().strip() == '{\n "n": 3\n}'
    assert (tmp_path / "bench_x.md").read_text() == "## x\n\n3\n"
    harness.publish(tmp_path / "bench_x", lambda r: f"smoke {r['n']}", {"n": 4}, smoke=True)
    assert (tmp_path / "work" / "smoke" / "bench_x.md").read_text() == "smoke 4\n"
    assert (tmp_path / "bench_x.md").read_text() == "## x\n\n3\n"
    assert harness.publish(tmp_path / "bench_x", lambda r: str(r["n"]), None) == "3"
    assert (results.read_bytes() if results.is_file() else None) == before


def test_a_script_report_defaults_beside_the_script_and_its_command_is_the_entry_point():
    parser = harness.arguments("Doc.", "tiny", "bench_y", data=False)
    assert Path(parser.parse_args([]).out) == Path(__file__).resolve().parent / "bench_y"
    line = harness.command_line([str(BENCH / "ann" / "bench_ann_study.py"), "--rows", "5"])
    assert line == "python -m benchmarks run ann_study --rows 5"


def test_plots_are_drawn_from_the_recorded_reports(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import figures

    assert figures.main(["--out", str(tmp_path)]) == 0
    for name in ("ann_recall_speedup", "encoder_rows_per_s", "sts_spearman_by_calibration"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="unknown plot 'nope'"):
        figures.main(["--only", "nope"])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_benchmark_module_imports(name: str) -> None:
    """A module that names a package function or module that left (a moved or deleted name)
    fails here, not on the next benchmark run."""
    importlib.import_module(name)


def test_published_fusion_rules_rank_as_published() -> None:
    """The studies' min-max and RRF baselines (benchmarks/common/published_fusion.py)."""
    import numpy as np

    from benchmarks.common.published_fusion import minmax_fusion, rrf_fusion

    dense = (np.array([[0.9, 0.5, 0.1]]), np.array([[1, 2, 3]]))
    lexical = (np.array([[8.0, 4.0, -1.0]]), np.array([[3, 2, -1]]))
    # min-max: dense 1 -> 1.0, 2 -> 0.5, 3 -> 0.0; lexical 3 -> 1.0, 2 -> 0.0
    out = minmax_fusion(dense, lexical, 3, weight=0.5)
    assert out.rows.tolist() == [[1, 3, 2]]
    assert np.allclose(out.scores, [[0.5, 0.5, 0.25]])
    rrf = rrf_fusion(dense, lexical, 3)
    # 3: 1/63 + 1/61 (third and first) just above 2: 1/62 + 1/62, then 1: 1/61
    assert rrf.rows.tolist() == [[3, 2, 1]]
    assert np.allclose(rrf.scores, [[1 / 63 + 1 / 61, 2 / 62, 1 / 61]])
