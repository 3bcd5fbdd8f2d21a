"""What the server's metrics cost a search: the same queries with and without being counted.

Builds (once, under ``benchmarks/_work/metrics_<rows>``) the serving benchmark's index (a
static-encoder index calibrated by whitening, ``--rows`` synthetic passages, one segment), then
answers ``--queries`` single queries per mode (hybrid, dense) in interleaved rounds, two ways:
``Searcher.query_batch`` alone, and inside ``Metrics.searching`` as ``POST /search`` runs it
(stage timings collected, the counter and the histograms of the request and its stages
updated). The figures: the ratio of the per-search times (median and best round), and the
recording's own cost, timed apart around an empty search, as a share of a search (the goal:
at most 2%).

    python -m benchmarks run metrics
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

from benchmarks.common import corpora, harness
from benchmarks.serving.bench_serving import build

LOG = logging.getLogger("bench_metrics")


def arguments(argv: list[str] | None) -> Any:
    parser = harness.arguments(__doc__, "2k rows, 10 queries, 2 rounds", "bench_metrics",
                               data=False)  # fmt: skip
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=15)
    return harness.parse(parser, argv, rows=2_000, queries=10, repeats=2)


def recording_us(metrics: Any, n: int = 20_000) -> float:
    """Microseconds one counted search adds, around a search that does nothing but mark its
    four stages."""
    from flowsearch.search.timings import stage

    def one() -> None:
        with metrics.searching("bench", "hybrid"):
            for name in ("encode", "search", "fuse", "rows"):
                with stage(name):
                    pass

    def bare() -> None:
        for name in ("encode", "search", "fuse", "rows"):
            with stage(name):
                pass

    times = []
    for fn in (one, bare, one, bare):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n)
    return (min(times[0], times[2]) - min(times[1], times[3])) * 1e6


def measure(searcher: Any, metrics: Any, queries: list[str], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("hybrid", "dense"):

        def plain(m: str = mode) -> None:
            for q in queries:
                searcher.query_batch([q], mode=m)

        def counted(m: str = mode) -> None:
            for q in queries:
                with metrics.searching("bench", m):
                    searcher.query_batch([q], mode=m)

        times = harness.rounds({"plain": plain, "counted": counted}, repeats)
        p = statistics.median(times["plain"]) / len(queries)
        c = statistics.median(times["counted"]) / len(queries)
        # the least loaded round of each: the load of a shared machine only ever adds time
        p_min, c_min = min(times["plain"]) / len(queries), min(times["counted"]) / len(queries)
        out[mode] = {"plain_ms": p * 1e3, "counted_ms": c * 1e3, "ratio": c / p,
                     "plain_min_ms": p_min * 1e3, "counted_min_ms": c_min * 1e3,
                     "ratio_min": c_min / p_min}  # fmt: skip
        LOG.info("%s: %s", mode, out[mode])
    return out


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Per-search time with and without the server's metrics ({report['rows']:,} rows, "
        f"{report['queries']} single queries per round, median of {report['repeats']} "
        f"interleaved rounds; load {report['load'][0]:.1f}-{report['load'][1]:.1f}):",
        "",
        "| mode | plain (median / best round) | counted (median / best round) | ratio "
        "(median / best) | recording's share |",
        "|---|---:|---:|---:|---:|",
    ]
    us = report["recording_us"]
    for mode, f in report["modes"].items():
        lines.append(f"| {mode} | {f['plain_ms']:.2f} / {f['plain_min_ms']:.2f} ms | "
                     f"{f['counted_ms']:.2f} / {f['counted_min_ms']:.2f} ms | "
                     f"{f['ratio']:.3f} / {f['ratio_min']:.3f} | "
                     f"{us / 1e3 / f['plain_ms']:.2%} |")  # fmt: skip
    lines += [
        "",
        f"The recording itself (counter, request and four stage histograms, stage timers) "
        f"costs {us:.1f} µs a search, timed apart around an empty search; its share is that "
        "over the plain median.",
        "",
        harness.produced_by(report, "python -m benchmarks run metrics"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if harness.rendered(args, render):
        return 0
    from flowsearch import Searcher
    from flowsearch.server.metrics import Metrics

    work = harness.WORK / ("smoke/" if args.smoke else "") / f"metrics_{args.rows}"
    work.mkdir(parents=True, exist_ok=True)
    load = [harness.load_average()[0]]
    index = build(work, args.rows, 1)
    searcher = Searcher.open(index)
    metrics = Metrics(lambda: [("bench", searcher)])
    try:
        queries = corpora.sample_queries(args.queries)
        report: dict[str, Any] = {"rows": args.rows, "queries": args.queries,
                                  "repeats": args.repeats}  # fmt: skip
        report["modes"] = measure(searcher, metrics, queries, args.repeats)
        report["recording_us"] = recording_us(metrics)
    finally:
        searcher.close()
    report["load"] = [load[0], harness.load_average()[0]]
    report["machine"] = harness.machine()
    report["command"] = harness.command_line()
    harness.finish(args, render, report)
    return 0


if __name__ == "__main__":
    harness.script(main)
