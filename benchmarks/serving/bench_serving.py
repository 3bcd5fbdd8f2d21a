"""Serving an index from Ray shards against the local Searcher on the same index and machine.

Builds (once, under ``benchmarks/_work/serving_<rows>``) a static-encoder index calibrated by
whitening, of ``--rows`` synthetic passages in ``--segments`` equal segments (one build, then
adds that keep their segments). Then, for each shard count, a Searcher opened with
``engine="ray"`` on a local Ray (this machine's CPUs) and the local one answer the same queries
in turn (so the shared machine's load falls on both alike): single-query p50 (hybrid, the
default mode, and dense) and batch throughput (``--batch`` queries per call). Every answer is
checked against the local one (same ids). Last, ``--upsert`` rows are upserted and the time
each searcher takes to ``refresh()`` to the new version is measured (for Ray: every shard
moved, opening only the new segment).

2 cores cannot run shards in parallel: the figures are the overhead of the scatter-gather (the
goal: at most 1.5x the local p50), not the gain, which needs a core (or node) per shard; the
per-node model is in docs/SCALE.md.

    python -m benchmarks run serving                    # 200k rows, 8 segments, 1/2/4 shards
    python -m benchmarks run serving --rows 1000000     # the issue's size, given the time
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks.common import corpora, harness

LOG = logging.getLogger("bench_serving")


def arguments(argv: list[str] | None) -> Any:
    parser = harness.arguments(__doc__, "20k rows, 4 segments, 1 and 2 shards", "bench_serving",
                               data=False)  # fmt: skip
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--upsert", type=int, default=1000)
    # Flat: exact segments, where the Ray answer must equal the local one (issue 29's setting)
    parser.add_argument("--factory", default="Flat")
    return harness.parse(parser, argv, rows=20_000, segments=4, shards="1,2", queries=20,
                         repeats=2)  # fmt: skip


def build(work: Path, rows: int, segments: int, factory: str = "Flat") -> Path:
    """The index (made once): one build and adds, ``segments`` equal segments."""
    from flowsearch import add_to_index, build_index

    index = work / "index"
    if (index / "manifest.json").exists():
        return index
    corpus = corpora.synthetic_corpus(work / "corpus.parquet", rows)
    table = pq.read_table(corpus)
    size = -(-rows // segments)
    for i in range(segments):
        part = work / f"part{i}.parquet"
        pq.write_table(table.slice(i * size, size), part)
        start = time.perf_counter()
        if i == 0:
            build_index(part, index, pooling="static", calibration="whitening",
                        index_factory=factory, overwrite=True)  # fmt: skip
        else:
            add_to_index(index, part, merge_segments=False)
        LOG.info("segment %d of %d: %.1f s", i + 1, segments, time.perf_counter() - start)
    return index


def same_ids(a: list[list[Any]], b: list[list[Any]]) -> bool:
    return [[h.id for h in x] for x in a] == [[h.id for h in x] for x in b]


def measure(local: Any, on_ray: Any, queries: list[str], batch: list[str], repeats: int) -> dict:
    out: dict[str, Any] = {}
    for mode in ("hybrid", "dense"):
        want = local.search(queries, k=10, mode=mode)
        got = on_ray.search(queries, k=10, mode=mode)
        out[f"{mode}_same_ids"] = same_ids(got, want)
        for q in queries[:5]:  # warm both
            local.search(q, mode=mode)
            on_ray.search(q, mode=mode)
        times: dict[str, list[float]] = {"local": [], "ray": []}
        for q in queries:  # in turn: the machine's load falls on both alike
            times["local"].append(harness.timed(lambda q=q, m=mode: local.search(q, mode=m))[1])
            times["ray"].append(harness.timed(lambda q=q, m=mode: on_ray.search(q, mode=m))[1])
        for name, seconds in times.items():
            out[f"{mode}_{name}"] = harness.percentiles_ms(seconds)
        out[f"{mode}_p50_ratio"] = out[f"{mode}_ray"]["p50_ms"] / out[f"{mode}_local"]["p50_ms"]
    rounds = harness.rounds(
        {"local": lambda: local.search(batch, k=10), "ray": lambda: on_ray.search(batch, k=10)},
        repeats=repeats,
    )
    for name, seconds in rounds.items():
        out[f"batch_qps_{name}"] = len(batch) / float(np.median(seconds))
    out["batch_qps_ratio"] = out["batch_qps_ray"] / out["batch_qps_local"]
    return out


def refresh_time(index: Path, local: Any, on_ray: Any, rows: int, work: Path) -> dict:
    """Upsert ``rows`` existing rows (new texts), then time each searcher's refresh."""
    import pyarrow as pa

    from flowsearch import upsert

    table = pq.read_table(work / "corpus.parquet").slice(0, rows)
    texts = [t + " again" for t in table.column("text").to_pylist()]
    changed = work / "upsert.parquet"
    pq.write_table(pa.table({"id": table.column("id"), "text": texts}), changed)
    start = time.perf_counter()
    upsert(index, changed)
    wrote = time.perf_counter() - start
    ray_s = harness.timed(on_ray.refresh)
    local_s = harness.timed(local.refresh)
    assert ray_s[0] and local_s[0]
    q = corpora.sample_queries(20)
    return {
        "upsert_seconds": wrote,
        "ray_refresh_seconds": ray_s[1],
        "local_refresh_seconds": local_s[1],
        "same_ids_after": same_ids(on_ray.search(q, k=10), local.search(q, k=10)),
        "segments_after": len(local.manifest.segments),
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        "## Serving on Ray shards (`bench_serving.py`)",
        "",
        f"{report['rows']:,} rows (static encoder, whitening) in {report['segments']} Flat "
        f"segments; a local Ray on this machine ({report['machine'].get('cpus', '?')} cores, "
        f"shared: load {report['load'][0]:.1f} -> {report['load'][1]:.1f}); single queries "
        "k=10 asked in turn of the local Searcher and the Ray one; batch: "
        f"{report['batch']} queries per call, median of {report['repeats']} rounds.",
        "",
        "| shards | same ids | hybrid p50 local / ray (ms) | ratio | dense p50 local / ray "
        "(ms) | ratio | batch QPS local / ray | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, r in report["shards"].items():
        same = "yes" if r["hybrid_same_ids"] and r["dense_same_ids"] else "NO"
        lines.append(
            f"| {n} | {same} | {r['hybrid_local']['p50_ms']:.1f} / {r['hybrid_ray']['p50_ms']:.1f}"
            f" | {r['hybrid_p50_ratio']:.2f}x | {r['dense_local']['p50_ms']:.1f} / "
            f"{r['dense_ray']['p50_ms']:.1f} | {r['dense_p50_ratio']:.2f}x | "
            f"{r['batch_qps_local']:.0f} / {r['batch_qps_ray']:.0f} | {r['batch_qps_ratio']:.2f}x |"
        )
    f = report.get("refresh")
    if f:
        lines += [
            "",
            f"Upsert of {report['upsert']:,} rows: {f['upsert_seconds']:.1f} s to write; then "
            f"`refresh()` moved every one of {f['shards']} shards to the new version in "
            f"{f['ray_refresh_seconds']:.2f} s (the local Searcher: "
            f"{f['local_refresh_seconds']:.2f} s); same ids afterwards: "
            f"{'yes' if f['same_ids_after'] else 'NO'}.",
        ]
    lines += ["", harness.produced_by(report, "python -m benchmarks run serving")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if harness.rendered(args, render):
        return 0
    from flowsearch import Searcher

    work = harness.WORK / ("smoke/" if args.smoke else "") / f"serving_{args.rows}"
    work.mkdir(parents=True, exist_ok=True)
    load = [harness.load_average()[0]]
    index = build(work, args.rows, args.segments, args.factory)
    local = Searcher.open(index)
    queries = corpora.sample_queries(args.queries)
    batch = corpora.sample_queries(args.batch, seed=2)
    report: dict[str, Any] = {
        "rows": args.rows, "segments": args.segments, "batch": args.batch,
        "repeats": args.repeats, "upsert": args.upsert, "factory": args.factory, "shards": {},
    }  # fmt: skip
    shard_counts = [int(n) for n in args.shards.split(",")]
    on_ray = None
    try:
        for n in shard_counts:
            if on_ray is not None:
                on_ray.close()
            start = time.perf_counter()
            on_ray = Searcher.open(index, engine="ray", shards=n)
            LOG.info("%d shards opened in %.1f s", n, time.perf_counter() - start)
            report["shards"][str(n)] = measure(local, on_ray, queries, batch, args.repeats)
            report["shards"][str(n)]["open_seconds"] = time.perf_counter() - start
            LOG.info("%d shards: %s", n, report["shards"][str(n)])
        assert on_ray is not None
        if args.upsert:
            report["refresh"] = refresh_time(index, local, on_ray, args.upsert, work)
            report["refresh"]["shards"] = shard_counts[-1]
    finally:
        if on_ray is not None:
            on_ray.close()
    report["load"] = [load[0], harness.load_average()[0]]
    report["machine"] = harness.machine()
    report["command"] = harness.command_line()
    harness.finish(args, render, report)
    return 0


if __name__ == "__main__":
    harness.script(main)
