r"""What a dense query costs beyond its encoder and its vector index (issue 44).

``--rows`` rows of the speed corpus (real sentences topped up with splices of two, the
``ann_study`` corpus) indexed twice with ``static`` pooling, no lexical side: as ``auto`` builds
it (``HNSW32`` tuned) and as ``Flat`` (its exact twin). Queries: the corpus's held-out real
queries (QNLI questions, partial sentences), one at a time, ``k = 10``, dense mode.

Per query, in turn (interleaved, so the machine's load falls on all alike), after a warm-up:

- ``Searcher.search(q, k=10, mode="dense")`` on the ``auto`` index and on its ``Flat`` twin;
- the encoder and calibrator alone (``Searcher.embed``);
- the segment's FAISS index alone, on the embedded query (``search`` with the stored knob).

Times are the calling thread's CPU time (``thread_time``; every search here runs on it, FAISS on
one thread), which a loaded shared machine inflates far less than wall time; wall medians are
kept in the JSON. *Ours* is the search's median minus the encoder's and FAISS's medians: the
Searcher's own cost (checks, merging, records, hits). ``x Flat``: the Flat twin's search median
over ``auto``'s. recall@10: the ``auto`` Searcher's hits against its Flat twin's (exact in the
searched space).

Indexes are built once into ``--work`` (default ``/tmp/flowsearch_searcher_cost``) and reused;
``--smoke``: 12,000 rows, 60 queries.

Usage::

    python -m benchmarks run searcher_cost [--rows 200000] [--queries 300] [--rounds 3]
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness


def _index(corpus: Path, root: Path, factory: str) -> float:
    """Build ``root`` (unless it exists) as ``factory``; the seconds it took (0 when reused)."""
    import flowsearch

    if (root / "manifest.json").exists():
        return 0.0
    start = time.perf_counter()
    flowsearch.build_index(str(corpus), root, pooling="static", lexical=False,
                           index_factory=factory, overwrite=True)  # fmt: skip
    return time.perf_counter() - start


def measure(rows: int, n_queries: int, n_rounds: int, work: Path, data: Path) -> dict[str, Any]:
    import faiss

    from benchmarks.common.corpora import real_corpus
    from flowsearch import Searcher

    faiss.omp_set_num_threads(1)
    corpus, queries, _ = real_corpus(data, rows, n_queries)
    built = {name: _index(corpus, work / f"{name}_{rows}", name) for name in ("auto", "Flat")}
    auto, flat = (Searcher.open(work / f"{name}_{rows}") for name in ("auto", "Flat"))
    seg = harness.segment_of(auto)
    vectors = [auto.embed([q])[0] for q in queries]
    contenders = {
        "search": lambda i: auto.search(queries[i], k=10, mode="dense"),
        "embed": lambda i: auto.embed([queries[i]]),
        "faiss": lambda i: seg.ann.search(vectors[i], 10),
        "flat_search": lambda i: flat.search(queries[i], k=10, mode="dense"),
    }
    for i in range(min(20, len(queries))):  # warm-up: caches, lazy set-up
        for fn in contenders.values():
            fn(i)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(n_rounds):
        for i in range(len(queries)):
            for name, fn in contenders.items():
                start, start_cpu = time.perf_counter(), time.thread_time()
                fn(i)
                cpu[name].append(time.thread_time() - start_cpu)
                times[name].append(time.perf_counter() - start)
    p50 = {name: float(np.median(t) * 1e3) for name, t in cpu.items()}
    wall = {name: float(np.median(t) * 1e3) for name, t in times.items()}
    found = [[h.id for h in auto.search(q, k=10, mode="dense")] for q in queries]
    truth = [[h.id for h in flat.search(q, k=10, mode="dense")] for q in queries]
    recall = float(np.mean([len(set(f) & set(t)) / max(len(t), 1)
                            for f, t in zip(found, truth, strict=True)]))  # fmt: skip
    report = {
        "rows": rows, "queries": len(queries), "rounds": n_rounds,
        "factory": seg.record.ann.factory, "params": seg.record.ann.params,
        "p50_ms": p50, "wall_p50_ms": wall,
        "ours_ms": p50["search"] - p50["embed"] - p50["faiss"],
        "x_flat": p50["flat_search"] / p50["search"], "recall_at_10": recall,
        "build_s": built, "load": harness.load_average(), "machine": harness.machine(),
    }  # fmt: skip
    auto.close()
    flat.close()
    return report


def render(r: dict[str, Any]) -> str:
    p = r["p50_ms"]
    body = [
        f"{r['rows']:,} rows (`static`, `auto`: `{r['factory']}` `{r['params']}`), "
        f"{r['queries']} real queries x {r['rounds']} rounds, one at a time, k = 10, dense, "
        f"interleaved; medians of the thread's CPU time (load {r['load']}).",
        "",
        "| Searcher.search | encoder | FAISS | ours | Flat twin's search | x Flat | recall@10 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {p['search']:.3f} ms | {p['embed']:.3f} ms | {p['faiss']:.3f} ms | "
        f"{r['ours_ms']:.3f} ms | {p['flat_search']:.2f} ms | {r['x_flat']:.1f} | "
        f"{r['recall_at_10']:.3f} |",
    ]
    return harness.markdown("Searcher cost of one dense query", body, r,
                            "python -m benchmarks run searcher_cost")  # fmt: skip


def main() -> int:
    parser = harness.arguments(__doc__, "12,000 rows, 60 queries", "bench_searcher_cost")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default="/tmp/flowsearch_searcher_cost")
    args = harness.parse(parser, rows=12_000, queries=60, rounds=1)
    if harness.rendered(args, render):
        return 0
    report = measure(args.rows, args.queries, args.rounds, Path(args.work),
                     harness.data_dir(args.data))  # fmt: skip
    report["command"] = harness.command_line()
    harness.finish(args, render, report)
    return 0


if __name__ == "__main__":
    harness.script(main)
