r"""The flow rebuilt from small steps against the code before it: same files, speed as ratios.

Issue 23 rebuilt the flow calibrators from small steps (``flowsearch/calibration/steps.py``)
with one inference path (the steps frozen to float64 numpy, run in chunks of rows). This script
checks that it is not slower than the code it replaced (the fused torch / numpy forms of
``--baseline``, by default the commit before the rebuild), in one run:

1. fits ``flow`` and ``whitening-flow`` (default hyper-parameters) once on ``--rows`` synthetic
   vectors of dimension 384 (a rotated cone with a decaying spectrum and three constant
   dimensions, as all-MiniLM-L6-v2's mean vectors have) and saves them;
2. extracts ``--baseline``'s ``flowsearch`` package with ``git archive``;
3. ``--rounds`` times, alternating which goes first, starts one process per side (each
   imports its own package, loads the same saved calibrators, warms up, then times
   ``--repeats`` calls) and records the medians: ``transform`` of all rows, ``log_prob`` of all
   rows, ``inverse`` of all rows, and ``transform`` of one row (a query, median of 200 calls);
   each round runs both sides with the default thread counts (what a user gets) and with every
   thread pool at one thread (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``:
   the work itself, without the waiting of threads on a shared machine);
4. reports each side's median over rounds and the ratio new / old (below 1: faster), with the
   load average before and after;
5. times the new side's ``flow`` transform of all rows by ``calibration.stepmath.CHUNK_MACS``
   (the largest matrix product of a chunk of the flow's steps; in this process, default
   threads, interleaved), the evidence for that setting.

Both sides also transform the same rows and the script checks that they agree (max abs
difference), so a ratio is never bought with other numbers.

Usage:
    python -m benchmarks run flow_steps [--rows 20000] [--rounds 5] [--repeats 3]
        [--baseline f95c3dd] [--render]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[3]
OUT = str(Path(__file__).resolve().with_suffix(""))
SECTION = "bench_flow_steps"
NAMES = ("flow", "whitening-flow")
METRICS = ("transform", "log_prob", "inverse", "query")
THREADS = ("default", "1")
CHUNK_MACS = (100_000, 250_000, 500_000, 1_000_000, 4_000_000, 30_000_000)


def vectors(rows: int, dim: int = 384, seed: int = 0) -> Any:
    """A rotated cone: a common offset, a steeply decaying spectrum, three constant dims."""
    import numpy as np

    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.normal(size=(dim, dim)))[0]
    U = (rng.normal(size=(rows, dim)) * np.geomspace(1.0, 0.02, dim)) @ q + 0.5 * q[0]
    U[:, [10, 200, 300]] = 1e-32
    return U.astype(np.float32)


def worker(work: Path, repeats: int) -> dict[str, Any]:
    """One side: load each saved calibrator, warm up, time every metric (seconds)."""
    import numpy as np

    import flowsearch
    from flowsearch.calibration import load_calibrator

    U = np.load(work / "U.npy", allow_pickle=False)
    out: dict[str, Any] = {"package": str(Path(flowsearch.__file__).parent)}
    for name in NAMES:
        cal = load_calibrator(work / name)
        Z = cal.transform(U)
        np.save(work / f"Z-{name}-{os.getpid()}.npy", Z)
        calls = {
            "transform": lambda cal=cal: cal.transform(U),
            "log_prob": lambda cal=cal: cal.log_prob(U),
            "inverse": lambda cal=cal, Z=Z: cal.inverse(Z),
        }
        times: dict[str, float] = {}
        cal.log_prob(U[:1000]), cal.inverse(Z[:1000])  # warm-up
        for metric, call in calls.items():
            times[metric] = statistics.median(_timed(call) for _ in range(repeats))
        one = U[:1]
        cal.transform(one)
        times["query"] = statistics.median(
            _timed(lambda c=cal, q=one: c.transform(q)) for _ in range(200)
        )
        out[name] = times
    return out


def _timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _side(tree: Path, work: Path, repeats: int, threads: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    if threads != "default":
        env.update(
            {k: threads for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        )
    cmd = [sys.executable, __file__, "--worker", str(work), "--repeats", str(repeats)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def _chunk_sweep(work: Path, U: Any, repeats: int) -> dict[str, list[float]]:
    """The new flow's transform of all rows by ``stepmath.CHUNK_MACS`` (seconds per repeat,
    interleaved); keys are the chunk's rows for 384-d vectors (192 x 32 multiply-adds a row)."""
    from unittest import mock

    from flowsearch.calibration import load_calibrator, stepmath

    cal = load_calibrator(work / "flow")
    out: dict[str, list[float]] = {str(macs // (192 * 32)): [] for macs in CHUNK_MACS}
    for _ in range(repeats):
        for macs in CHUNK_MACS:
            with mock.patch.object(stepmath, "CHUNK_MACS", macs):
                out[str(macs // (192 * 32))].append(_timed(lambda: cal.transform(U)))
    return out


def _prepare(args: argparse.Namespace, work: Path, old_tree: Path) -> dict[str, float]:
    """Saves the vectors and both fitted calibrators into ``work``, the baseline package into
    ``old_tree``; returns the fit times (s)."""
    import numpy as np

    from flowsearch.calibration import make_calibrator

    U = vectors(args.rows)
    np.save(work / "U.npy", U)
    fit_s = {}
    for name in NAMES:
        started = time.perf_counter()
        make_calibrator(name, seed=0).fit(U).save(work / name)
        fit_s[name] = time.perf_counter() - started
    archive = subprocess.run(["git", "archive", args.baseline, "flowsearch"], cwd=ROOT,
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
    return fit_s


def _agreement(work: Path) -> dict[str, float]:
    """Max abs difference between every side's float32 transform of all rows."""
    import numpy as np

    agree = {}
    for name in NAMES:
        Zs = sorted(work.glob(f"Z-{name}-*.npy"))
        first = np.load(Zs[0])
        agree[name] = max(float(np.abs(np.load(z) - first).max()) for z in Zs)
    return agree


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole comparison (see the module); a scratch directory is removed after."""
    import numpy as np

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-flow-steps-") as scratch:
        work, old_tree = Path(scratch) / "work", Path(scratch) / "baseline"
        work.mkdir()
        old_tree.mkdir()
        fit_s = _prepare(args, work, old_tree)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            t: {"old": [], "new": []} for t in THREADS
        }
        trees = {"old": old_tree, "new": ROOT}
        for r in range(args.rounds):
            for threads in THREADS:
                for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    runs[threads][side].append(_side(trees[side], work, args.repeats, threads))
        sweep = _chunk_sweep(work, np.load(work / "U.npy"), args.repeats)
        agree = _agreement(work)
    return {
        "rows": args.rows,
        "dim": 384,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "baseline": args.baseline,
        "packages": {side: done[0]["package"] for side, done in runs["default"].items()},
        "fit_s": fit_s,
        "max_abs_diff": agree,
        "results": {
            threads: {
                side: [{n: one[n] for n in NAMES} for one in done] for side, done in by.items()
            }
            for threads, by in runs.items()
        },
        "chunk_sweep": sweep,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
        "command": "python -m benchmarks run flow_steps "
        f"--rows {args.rows} --rounds {args.rounds} --repeats {args.repeats} "
        f"--baseline {args.baseline}",
    }


def _table(res: dict[str, Any], threads: str) -> list[str]:
    lines = [
        "| calibrator | call | old | new | new / old | per-round ratios |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name in NAMES:
        for metric in METRICS:
            old = [one[name][metric] for one in res["results"][threads]["old"]]
            new = [one[name][metric] for one in res["results"][threads]["new"]]
            scale, unit = (1e3, "ms") if metric == "query" else (1.0, "s")
            label = "transform, 1 row" if metric == "query" else f"{metric}, {res['rows']:,} rows"
            per_round = ", ".join(f"{n / o:.2f}" for o, n in zip(old, new))
            lines.append(
                f"| {name} | {label} | {statistics.median(old) * scale:.3g} {unit} | "
                f"{statistics.median(new) * scale:.3g} {unit} | "
                f"{statistics.median(new) / statistics.median(old):.2f} | {per_round} |"
            )
    return lines


def render(res: dict[str, Any]) -> str:
    lines = [
        "## The flow as small steps: speed against the code it replaced",
        "",
        f"`{res['command']}` ({res['machine']}, load average {res['load'][0]} before and "
        f"{res['load'][1]} after; the machine is shared). Each side is a fresh process importing "
        f"its own package (old: `{res['baseline']}`, new: this branch), loading the same saved "
        f"calibrators (default hyper-parameters, fitted on {res['rows']:,} synthetic 384-d "
        f"vectors with three constant dimensions); {res['rounds']} rounds alternating which side "
        f"goes first, each the median of {res['repeats']} timed calls after a warm-up (one row: "
        "of 200). Times are the medians over rounds; ratio = new / old (below 1: faster).",
        "",
        "Default thread counts (what a user gets):",
        "",
        *_table(res, "default"),
        "",
        "Every thread pool at one thread (the work itself):",
        "",
        *_table(res, "1"),
    ]
    diff = ", ".join(f"{k} {v:.1e}" for k, v in res["max_abs_diff"].items())
    sweep = res["chunk_sweep"]
    lines += [
        "",
        f"Both sides' float32 outputs of `transform` on all rows agree to {diff} (max abs).",
        "",
        f"The new `flow`'s transform of the {res['rows']:,} rows by the rows of a chunk of its "
        "steps (`calibration.stepmath.CHUNK_MACS` / (192 x 32); default 500,000: 81 rows; default "
        f"threads, median of {res['repeats']}, interleaved): "
        + ", ".join(f"{c} rows {statistics.median(v):.2f} s" for c, v in sweep.items())
        + ".",
    ]
    return "\n".join(lines)


def main() -> None:
    """Run the comparison (or one side of it, with ``--worker``) and publish it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default="f95c3dd")
    parser.add_argument("--render", action="store_true", help="re-render the stored JSON")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.repeats)))
        return
    from benchmarks.common.harness import publish  # not in --worker: its PYTHONPATH is a tree

    print(publish(OUT, render, None if args.render else run(args)))


if __name__ == "__main__":
    main()
