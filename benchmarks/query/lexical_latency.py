"""bench_lexical's query latency: configurations timed query by query, interleaved, and the table.

Every query runs on every configuration before the next query, starting with a different
configuration each time, so the machine's load and the caches' warmth fall on all alike; ratios
are to the ``1 segment`` configuration of the same pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BASE", "latency_table", "render_latency", "timed_pass"]

#: The configuration every ratio is taken against.
BASE = "1 segment"
Search = Callable[[str], Any]


def timed_pass(configs: dict[str, Search], queries: list[str], rounds: int) -> dict[str, Any]:
    """p50/p95 wall time and p50 thread CPU time (ms) of each configuration, one query at a
    time, ``rounds`` times over ``queries``."""
    names = list(configs)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for i, query in enumerate(queries):
            shift = (i + r) % len(names)
            for name in names[shift:] + names[:shift]:
                w0, c0 = time.perf_counter(), time.thread_time()
                configs[name](query)
                c1, w1 = time.thread_time(), time.perf_counter()
                wall[name].append(w1 - w0)
                cpu[name].append(c1 - c0)
    return {
        n: {
            "p50_ms": float(np.percentile(wall[n], 50) * 1e3),
            "p95_ms": float(np.percentile(wall[n], 95) * 1e3),
            "cpu_p50_ms": float(np.percentile(cpu[n], 50) * 1e3),
            "queries": len(wall[n]),
        }
        for n in names
    }


def latency_table(
    make: Callable[[bool], dict[str, Any]], queries: list[str], repeats: int
) -> dict[str, Any]:
    """Each regime's pass. ``make(cache)`` gives fresh searchers (Bm25 objects and the release
    index, by name), with or without the block cache."""
    passes: dict[str, Any] = {}
    cold = make(False)
    for k in (10, 100):
        searches = {n: _search(b, k) for n, b in cold.items()}
        timed_pass(searches, queries[:50], 1)  # warm-up: code paths, tokeniser, page cache
        passes[f"cache off, k={k}"] = timed_pass(searches, queries, repeats)
    fresh = make(True)
    passes["first pass after open, k=10"] = timed_pass(
        {n: _search(b, 10) for n, b in fresh.items()}, queries, 1
    )
    for k in (10, 100):  # the first pass warmed the caches for k=10, and k does not matter
        searches = {n: _search(b, k) for n, b in fresh.items()}
        passes[f"warm, k={k}"] = timed_pass(searches, queries, repeats)
    allowed = np.random.default_rng(1).random(fresh[BASE].n_rows) < 0.10
    filtered = {n: _search(fresh[n], 10, allowed) for n in (BASE, "10 segments")}
    passes["warm, k=10, where 10% of rows"] = timed_pass(filtered, queries, repeats)
    return passes


def _search(searcher: Any, k: int, allowed: Any = None) -> Search:
    def run(query: str) -> Any:
        return searcher.search([query], k, allowed=allowed)

    return run


def render_latency(passes: dict[str, Any]) -> list[str]:
    """Markdown rows: per pass, each configuration's p50 / p95 and its ratios to 1 segment."""
    lines = [
        "| pass | configuration | p50 ms | p95 ms | p50 / 1 segment | CPU p50 / 1 segment |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for pass_name, configs in passes.items():
        base = configs[BASE]
        for name, ms in configs.items():
            ratio = ms["p50_ms"] / base["p50_ms"]
            cpu = ms["cpu_p50_ms"] / base["cpu_p50_ms"]
            lines.append(
                f"| {pass_name} | {name} | {ms['p50_ms']:.2f} | {ms['p95_ms']:.2f} "
                f"| {ratio:.2f}x | {cpu:.2f}x |"
            )
    return lines
