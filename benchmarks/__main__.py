"""The benchmarks' one entry point (run from the repository root).

Usage::

    python -m benchmarks list                       # every benchmark: name, area, suite or study
    python -m benchmarks run NAME [--smoke] [ARGS]  # one benchmark; ARGS as its docstring says
    python -m benchmarks run --suite --smoke        # every suite benchmark's smoke, in turn
    python -m benchmarks plots                      # benchmarks/figures/*.png from the reports
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks.catalog import BENCHMARKS, Benchmark, find

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _kind(bench: Benchmark) -> str:
    if bench.suite:
        return "suite"
    return "tool" if bench.area == "common" else "study"


def _list() -> int:
    rows = [
        (b.name, b.area, "suite" if b.suite else "study", b.smoke, b.summary()) for b in BENCHMARKS
    ]
    width = max(len(r[0]) for r in rows)
    area_width = max(len(r[1]) for r in rows)
    for name, area, kind, smoke, summary in rows:
        mark = "smoke" if smoke else "     "
        print(f"{name:<{width}}  {area:<{area_width}}  {kind:<5}  {mark}  {summary}")
    return 0


def _environment() -> dict[str, str]:
    """The child's environment: this checkout first on the path, no network for models."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": ROOT + (os.pathsep + path if path else "")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _run_one(bench: Benchmark, args: Sequence[str]) -> int:
    """Runs ``bench`` in this process, as ``python -m MODULE ARGS`` would."""
    if "--smoke" in args and not bench.smoke:
        raise SystemExit(f"{bench.name} has no --smoke (a study run in full only)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.argv = [str(bench.path), *args]
    try:
        runpy.run_module(bench.module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


def _run_suite(args: Sequence[str]) -> int:
    """Runs every suite benchmark in its own process, in turn; a summary at the end."""
    if list(args) != ["--smoke"]:
        raise SystemExit("run --suite takes --smoke only (the full suite is run one by one)")
    outcomes: list[tuple[str, int, float]] = []
    for bench in (b for b in BENCHMARKS if b.suite):
        print(f"== {bench.name} ({bench.module}) --smoke", file=sys.stderr, flush=True)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", bench.module, "--smoke"], cwd=ROOT, env=_environment()
        )
        outcomes.append((bench.name, done.returncode, time.perf_counter() - started))
    for name, code, seconds in outcomes:
        print(f"{'ok' if code == 0 else 'FAILED':<6} {name:<16} {seconds:7.1f} s")
    return 0 if all(code == 0 for _, code, _ in outcomes) else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "list":
        return _list()
    if command == "plots":
        from benchmarks import figures

        return figures.main(rest)
    if command == "run":
        if "--suite" in rest:
            return _run_suite([a for a in rest if a != "--suite"])
        if not rest or rest[0].startswith("-"):
            raise SystemExit("run NAME [--smoke] [ARGS], or run --suite --smoke")
        return _run_one(find(rest[0]), rest[1:])
    raise SystemExit(f"unknown command {command!r}: list, run or plots")


if __name__ == "__main__":
    raise SystemExit(main())
