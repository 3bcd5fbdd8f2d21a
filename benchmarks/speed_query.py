r"""Query latency of a built index, step by step, beside its encoder and beside the peer.

One query at a time, every step timed inside the same loop iteration on the same query (so they
share the machine's state): the whole ``Searcher.search(q, k=10, mode="dense")``, then its pieces
called directly: ``space.encoder.encode([q])`` (the encoder), ``space.project(raw,
want_density=False)`` (calibrator + normalise), ``space.project(raw)`` minus that (the flow's
log-density), the FAISS search, and the Parquet join (``RowReader.rows``). The pieces use the
Searcher's pinned version (``_version``): a benchmark may look inside.

The peer (sentence-transformers ``encode`` + ``faiss.IndexFlatIP`` + a dict from row to text) is
timed in the same iteration when given.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from flowsearch import Searcher
from flowsearch import index as fx

__all__ = ["latency", "recall_of_index", "batch_qps"]


def _ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - start) * 1e3


def latency(
    s: Searcher, queries: list[str], rounds: int = 3, peer: Callable[[str], Any] | None = None
) -> dict[str, dict[str, float]]:
    """p50 / p95 ms of each step over ``rounds`` x ``queries`` (after a warm-up)."""
    v = s._version
    steps: dict[str, list[float]] = {}

    def note(name: str, ms: float) -> None:
        steps.setdefault(name, []).append(ms)

    for q in queries[:20]:  # warm-up: caches, lazy imports, allocator
        s.search(q, k=10, mode="dense")
        if peer is not None:
            peer(q)
    for _ in range(rounds):
        for q in queries:
            note("search", _ms(lambda q=q: s.search(q, k=10, mode="dense"))[1])
            raw, ms = _ms(lambda q=q: s.space.encoder.encode([q], progress=False))
            note("encoder", ms)
            (Z, _), ms = _ms(lambda raw=raw: s.space.project(raw, want_density=False))
            note("calibrator", ms)
            note("calibrator+density", _ms(lambda raw=raw: s.space.project(raw))[1])
            (_, rows), ms = _ms(lambda Z=Z: fx.search(v.faiss_index, Z, 10))
            note("faiss", ms)
            valid = np.unique(rows[rows >= 0])
            note("join", _ms(lambda valid=valid: v.reader.rows(valid))[1])
            if peer is not None:
                note("peer", _ms(lambda q=q: peer(q))[1])
    out = {
        name: {"p50": float(np.percentile(t, 50)), "p95": float(np.percentile(t, 95))}
        for name, t in steps.items()
    }
    dens = np.asarray(steps["calibrator+density"]) - np.asarray(steps["calibrator"])
    out["density"] = {"p50": float(np.percentile(dens, 50)), "p95": float(np.percentile(dens, 95))}
    return out


def recall_of_index(s: Searcher, Z: np.ndarray, k: int = 10) -> dict[str, Any]:
    """recall@k of the index's own FAISS index (as configured) against exact search over the
    stored vectors, for query vectors ``Z`` in the searched space."""
    x = s.vectors()
    exact = fx.exact_knn(Z, [x], k)[1]
    _, found = fx.search(s._version.faiss_index, Z, k)
    per_query = np.array([len(set(f) & set(t)) / k for f, t in zip(found, exact, strict=True)])
    return {"recall": float(per_query.mean()), "per_query": per_query, "exact": exact}


def batch_qps(s: Searcher, queries: list[str], batch: int = 64) -> float:
    """Queries per second through ``Searcher.search`` with ``batch`` queries per call."""
    s.search(queries[:batch], k=10, mode="dense")
    n, start = 0, time.perf_counter()
    for i in range(0, len(queries) - batch + 1, batch):
        s.search(queries[i : i + batch], k=10, mode="dense")
        n += batch
    return n / (time.perf_counter() - start)
