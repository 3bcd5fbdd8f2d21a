r"""How stable is ``auto``'s choice of ``efSearch``, and what do more tuning queries buy (issue 30)?

One ``auto`` index (HNSW32 at ``AnnPolicy.ef_construction``) over ``bench_ann_study``'s
200,000 ``static`` rows in the space ``auto`` searches (its ``prepare`` stage, cached), built
once. Then :func:`flowsearch.ann.build.tune` is run again and again on it, as a segment's write
runs it, with a different seed each time (the 4,096 sampled rows and the held-out queries drawn
from them change; the index does not), for several numbers of tuning queries (half choose the
knob, half check it). Per run: the ``efSearch`` chosen, the recall recorded (check half), and
the recall@10 of the 2,000 real queries (QNLI questions, partial held-out sentences) at that
``efSearch``, beside the real queries' own curve. The spread of the chosen knob is what a user
sees as "the same corpus tuned twice answers at 2-4x different speeds".

Run: ``python -m benchmarks run tuner`` (``--smoke``: 20,000 rows, two sizes, two seeds).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness

LADDER = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
NOISES = (0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0)


def _index(work: Any, z: np.ndarray) -> tuple[Any, str, float]:
    """``auto``'s index over ``z``, built once and kept in ``work``:
    ``(index, factory, build seconds of the build that made it)``."""
    import faiss

    from flowsearch.ann import build as ann_build
    from flowsearch.ann.factory import auto_factory, new_index
    from flowsearch.ann.policy import AnnPolicy

    factory = auto_factory(len(z), dim=z.shape[1])
    name = f"tuner_{factory}_efc{AnnPolicy().ef_construction}"
    path, meta = work / f"{name}.faiss", work / f"{name}.json"
    if path.exists() and meta.exists():
        return faiss.read_index(str(path)), factory, float(json.loads(meta.read_text())["build_s"])
    t = time.perf_counter()
    index = new_index(z.shape[1], factory)
    ann_build.train(index, z, factory)
    ann_build.add(index, z, factory)
    build_s = time.perf_counter() - t
    faiss.write_index(index, str(path))
    meta.write_text(json.dumps({"build_s": build_s}))
    return index, factory, build_s


def run(
    rows: int,
    n_queries: int,
    sizes: list[int],
    seeds: int,
    data: Any,
    noises: list[float],
    noise: float | None = None,
    kind: str = "noise",
    out_of_graph: bool = False,
) -> dict[str, Any]:
    import faiss

    from benchmarks.ann.bench_ann_study import prepare, text_queries, workdir
    from flowsearch.ann import tune as ann_tune
    from flowsearch.ann.policy import AnnPolicy

    faiss.omp_set_num_threads(1)
    prep = prepare(data, rows, n_queries)
    work = workdir(rows)
    z, zq = np.load(work / "z.npy"), np.load(work / "z_q.npy")
    truth = harness.exact_top(zq, z, 10)[1]
    index, factory, build_s = _index(work, z)
    knob = ann_tune.search_knob(index)
    if knob is None or knob[0] != "efSearch":
        raise SystemExit(f"auto built {factory} here; this benchmark studies an HNSW efSearch")
    hnsw = faiss.downcast_index(index).hnsw
    rng = np.random.default_rng(99)
    pos = np.sort(rng.choice(len(z), size=min(4096, len(z)), replace=False))
    probes: dict[float | str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for level in noises:  # held-out rows moved by each noise, as the tuner draws them
        q, pick = ann_tune.held_out_queries(z[pos], 2048, noise=level, seed=1)
        src = pos[pick]
        probes[level] = (q, src, ann_tune._drop_source(harness.exact_top(q, z, 11)[1], src, 10))
    make = text_queries(rows) if kind == "texts" else None
    if make is not None:  # partial texts of held-out rows (the study's other kind of probe)
        pick = np.random.default_rng(1).choice(len(pos), size=min(2048, len(pos)), replace=False)
        src = pos[pick]
        q = make(src)
        probes["texts"] = (q, src, ann_tune._drop_source(harness.exact_top(q, z, 11)[1], src, 10))
    apart = _out_of_graph(z, zq, probes["texts"]) if make is not None and out_of_graph else None
    real_curve = []
    for ef in LADDER:
        hnsw.efSearch = ef
        point = {"efSearch": ef, "recall": harness.recall(index.search(zq, 10)[1], truth)}
        for level, (q, src, tr) in probes.items():
            found = ann_tune._drop_source(index.search(q, 11)[1], src, 10)
            label = "partial texts" if level == "texts" else f"noise {level:g}"
            point[label] = harness.recall(found, tr)
        if apart is not None:
            point.update(apart(ef))
        real_curve.append(point)
    chunks = lambda: (z[i : i + 65_536] for i in range(0, len(z), 65_536))  # noqa: E731
    runs = []
    for size in sizes:
        for seed in range(seeds):
            rng = np.random.default_rng(1000 + seed)
            pos = np.sort(rng.choice(len(z), size=min(4096, len(z)), replace=False))
            t = time.perf_counter()
            with _text_probes(ann_tune, make, pos):
                tuned = ann_tune.tune(
                    index, z[pos], chunks, sample_rows=pos, n_queries=size, seed=seed, noise=noise
                )
            tune_s = time.perf_counter() - t
            ef = int(tuned.params.split("=")[1])
            hnsw.efSearch = ef
            real = harness.recall(index.search(zq, 10)[1], truth)
            row = {
                "queries": size,
                "seed": seed,
                "efSearch": ef,
                "noise": None if make else tuned.noise,
                "probes": kind,
                "recorded": tuned.recall,
                "tuned": tuned.tuned_recall,
                "real": real,
                "tune_s": tune_s,
            }
            runs.append(row)
            print(json.dumps(row), flush=True)
    return {
        "rows": len(z),
        "factory": factory,
        "ef_construction": AnnPolicy().ef_construction,
        "target": AnnPolicy().target_recall,
        "build_s": build_s,
        "prepare": {k: prep[k] for k in ("rows", "calibrator", "space") if k in prep},
        "real_queries": len(zq),
        "noise": noise,
        "probes": kind,
        "real_curve": real_curve,
        "runs": runs,
        # how flowsearch.ann.build.tune chose: the larger of two thirds' picks, a third checks
        "rule": "thirds",
    }


def _out_of_graph(z: np.ndarray, zq: np.ndarray, texts: tuple[np.ndarray, ...]) -> Any:
    """A second graph (as ``auto`` builds it) over ``z`` *without* the text probes' source rows,
    so each probe's row is out of the graph itself, not only out of its answer (the tuner's
    held-out rows stay in the graph): ``efSearch -> {"partial texts, rows out of the graph",
    "real, graph without them"}`` recall@10 against exact search over the same rows."""
    import faiss

    from flowsearch.ann import build as ann_build
    from flowsearch.ann.factory import auto_factory, new_index

    q, src, _ = texts
    keep = np.setdiff1d(np.arange(len(z)), src)
    kept = np.ascontiguousarray(z[keep])
    factory = auto_factory(len(kept), dim=z.shape[1])
    index = new_index(z.shape[1], factory)
    ann_build.train(index, kept, factory)
    ann_build.add(index, kept, factory)
    truth = {"partial texts, rows out of the graph": (q, harness.exact_top(q, kept, 10)[1]),
             "real, graph without them": (zq, harness.exact_top(zq, kept, 10)[1])}  # fmt: skip

    def curve(ef: int) -> dict[str, float]:
        faiss.downcast_index(index).hnsw.efSearch = ef
        return {name: harness.recall(index.search(x, 10)[1], t) for name, (x, t) in truth.items()}

    return curve


@contextlib.contextmanager
def _text_probes(ann_tune: Any, make: Any, positions: np.ndarray) -> Iterator[None]:
    """With ``make`` (:func:`benchmarks.ann.bench_ann_study.text_queries`), the tuner's
    held-out queries are the partial texts of the rows it draws (the same seeded draw of the
    sample, the same rows left out) instead of their vectors moved by noise: the study's
    question "what would the tuner pick on text probes" asked of the product's own ``tune``.
    None: the tuner as it is."""
    if make is None:
        yield
        return
    real = ann_tune.held_out_queries

    def texts(sample: np.ndarray, n_queries: int = 512, noise: Any = None, seed: int = 0) -> Any:
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(sample), size=min(n_queries, len(sample)), replace=False)
        return make(positions[pick]), pick.astype(np.int64)

    ann_tune.held_out_queries = texts
    try:
        yield
    finally:
        ann_tune.held_out_queries = real


def render(out: dict[str, Any]) -> str:
    body: list[str] = []
    for rows in sorted(out["by_rows"], key=lambda key: (int(key.split()[0]), key)):
        body += _rows_section(out["by_rows"][rows])
    return harness.markdown(
        "Stability of `auto`'s tuning (`benchmarks/studies/ann/bench_tuner.py`, issue 30)",
        body,
        out,
        "python -m benchmarks run tuner",
    )


def _rows_section(report: dict[str, Any]) -> list[str]:
    curve = ", ".join(f"{c['efSearch']}: {c['recall']:.3f}" for c in report["real_curve"])
    body = [
        f"### {report['rows']:,} rows, "
        + (
            "the tuner's queries partial texts of held-out rows"
            if report.get("probes") == "texts"
            else "the tuner's noise "
            + (
                f"{report['noise']:g}"
                if report.get("noise") is not None
                else "as `auto` chooses it"
            )
        )  # fmt: skip
        + (f" ({report['label']})" if report.get("label") else ""),
        "",
        f"`auto`'s index over {report['rows']:,} `static` rows in the searched space "
        f"({report['prepare'].get('calibrator', '?')} / {report['prepare'].get('space', '?')}): "
        f"`{report['factory']}` at `efConstruction` {report['ef_construction']}, built once "
        f"({report['build_s']:.0f} s, one thread). `flowsearch.ann.build.tune` then re-run on it "
        "with a different seed each time (new 4,096-row sample and held-out queries; "
        + (
            "a third and a third each choose, the larger knob is set, the last third checks"
            if report.get("rule") == "thirds"
            else "half choose, half check"
        )
        + f"), target {report['target']:g}. *real*: recall@10 of "
        f"{report['real_queries']:,} real queries (QNLI questions, partial held-out sentences) "
        "at the chosen `efSearch`.",
        "",
        f"Real queries by `efSearch`: {curve}.",
        "",
        "| tuning queries | efSearch chosen (by seed) | spread (max / min) | recorded recall "
        "(min-max) | real recall (min-max) | runs with real < target | tune s (median) |",
        "|---:|---|---:|---|---|---:|---:|",
    ]
    sizes = sorted({r["queries"] for r in report["runs"]})
    for size in sizes:
        rs = [r for r in report["runs"] if r["queries"] == size]
        efs = [r["efSearch"] for r in rs]
        rec = [r["recorded"] for r in rs]
        real = [r["real"] for r in rs]
        below = sum(x < report["target"] for x in real)
        body.append(
            f"| {size:,} | {', '.join(map(str, efs))} | {max(efs) / min(efs):.2f}x | "
            f"{min(rec):.3f}-{max(rec):.3f} | {min(real):.3f}-{max(real):.3f} | "
            f"{below} of {len(rs)} | {statistics.median(r['tune_s'] for r in rs):.1f} |"
        )
    noises = [k for k in report["real_curve"][0]
              if k.startswith(("noise", "partial texts", "real, graph"))]  # fmt: skip
    if noises:
        body += [
            "",
            "Recall@10 by `efSearch`: real queries beside the tuner's kind of probe (2,048 "
            "held-out rows moved by noise of the norm given, the tuner's being "
            "`flowsearch.ann.tune.noise_for_rows`; partial texts: 2,048 held-out rows' texts cut "
            "and embedded as queries, `--probes texts`; with `--out-of-graph`, the same probes on "
            "a second graph built without their rows, beside real queries on it):",
            "",
            "| efSearch | real | " + " | ".join(noises) + " |",
            "|---:|---:|" + "---:|" * len(noises),
        ]
        for c in report["real_curve"]:
            cells = " | ".join(f"{c[n]:.3f}" for n in noises)
            body.append(f"| {c['efSearch']} | {c['recall']:.3f} | {cells} |")
    return [*body, "", f"({report['command']}; load {report['machine']['load']})", ""]


def main() -> int:
    parser = harness.arguments(__doc__, "20,000 rows, 2 sizes x 2 seeds", "bench_tuner")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=2_000, help="real queries")
    parser.add_argument("--sizes", default="512,1024,2048", help="tuning queries to compare")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument(
        "--noise", type=float, default=None,
        help="the tuner's noise (default: as the product chooses it for the rows)",
    )  # fmt: skip
    parser.add_argument(
        "--noises", default=",".join(map(str, NOISES)),
        help="noise norms whose held-out probes' recall curves to measure beside real queries'",
    )  # fmt: skip
    parser.add_argument(
        "--probes", choices=("texts", "noise"), default="noise",
        help="the tuner's queries: held-out rows moved by noise (the product's), or partial "
        "texts of held-out rows (a study: the product's tune run with them instead)",
    )  # fmt: skip
    parser.add_argument(
        "--out-of-graph", action="store_true",
        help="with --probes texts: also a second graph without the text probes' rows, their curve",
    )  # fmt: skip
    args = harness.parse(parser, rows=20_000, queries=400, sizes="256,512", seeds=2)
    if harness.rendered(args, render):
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sizes = [int(s) for s in args.sizes.split(",")]
    noises = [float(s) for s in args.noises.split(",") if s]
    data = harness.data_dir(args.data)
    report = run(args.rows, args.queries, sizes, args.seeds, data, noises, args.noise,
                 args.probes, args.out_of_graph)  # fmt: skip
    report["machine"] = harness.machine()
    report["command"] = harness.command_line()
    saved = Path(args.out + ".json")
    out = json.loads(saved.read_text()) if saved.exists() and not args.smoke else {}
    key = str(report["rows"])
    if args.noise is not None:
        key += f" noise {args.noise:g}"
    if args.probes == "texts":
        key += " texts"
    before = out.setdefault("by_rows", {}).get(key, {})
    if not report["runs"] and before.get("runs"):  # --seeds 0: only the curves re-measured
        report["runs"], report["tuned_command"] = before["runs"], before.get("command")
    out["by_rows"][key] = report
    out["command"] = "python -m benchmarks run tuner --rows N (one run per row count)"
    harness.finish(args, render, out)
    return 0


if __name__ == "__main__":
    harness.script(main)
