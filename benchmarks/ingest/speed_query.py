r"""Query latency of a built index, step by step, beside its encoder and beside the peer.

One query at a time, every step timed inside the same loop iteration on the same query (so they
share the machine's state): the whole ``Searcher.search(q, k=10, mode="dense")``, then its pieces
called directly: ``space.encoder.encode([q])`` (the encoder), ``space.project(raw,
want_density=False)`` (calibrator + normalise), ``space.project(raw)`` minus that (the flow's
log-density), the FAISS search (on one OpenMP thread, as ``Searcher`` runs a single query, and
again with FAISS's default thread count, for comparison), and the Parquet join
(``RowReader.records``, with the row groups the search decoded dropped from the reader's cache
again, so the join is not timed warm from the search's own reads). The pieces use the one segment
of the Searcher's pinned version (``Searcher.version.segments[0]``: its ``rows`` and ``ann``): a
benchmark may look inside.

The peer (sentence-transformers ``encode`` + ``faiss.IndexFlatIP`` + a dict from row to text) is
timed in a second pass of each round, alternating with ``Searcher.search`` query by query (which
goes first flips each query), so neither model starts on caches the other filled more often.
Besides each step's p50 / p95, the paired ratios ``search/encoder`` (main pass) and
``search/peer`` (``search beside peer`` / ``peer``, second pass) are summarised the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common.harness import exact_top, recall, segment_of, timed
from flowsearch import Searcher
from flowsearch.ann import io as ann_io

__all__ = ["latency", "recall_of_index", "batch_qps"]


def _ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    out, seconds = timed(fn)
    return out, seconds * 1e3


def latency(
    s: Searcher,
    queries: list[str],
    rounds: int = 3,
    peer: Callable[[str], Any] | None = None,
    extra: dict[str, Callable[[str], Any]] | None = None,
) -> dict[str, dict[str, float]]:
    """p50 / p95 ms of each step over ``rounds`` x ``queries`` (after a warm-up); ``extra``:
    more named steps, each timed on the same query in the same iteration."""
    seg = segment_of(s)
    cache = seg.reader._cache._cache  # the searcher's row-group cache (an LRU mapping)
    steps: dict[str, list[float]] = {}

    def note(name: str, ms: float) -> None:
        steps.setdefault(name, []).append(ms)

    for q in queries[:20]:  # warm-up: caches, lazy imports, allocator
        s.search(q, k=10, mode="dense")
        if peer is not None:
            peer(q)
    for _ in range(rounds):
        for q in queries:
            # the join below must meet the row-group cache as the search met it, not warmed by it
            before = set(cache)
            note("search", _ms(lambda q=q: s.search(q, k=10, mode="dense"))[1])
            raw, ms = _ms(lambda q=q: s.space.encoder.encode([q], progress=False))
            note("encoder", ms)
            (Z, _), ms = _ms(lambda raw=raw: s.space.project(raw, want_density=False))
            note("calibrator", ms)
            note("calibrator+density", _ms(lambda raw=raw: s.space.project(raw))[1])
            (_, rows), ms = _ms(
                lambda Z=Z: ann_io.single_threaded(lambda: ann_io.search(seg.ann, Z, 10))
            )
            note("faiss", ms)  # as Searcher runs one query: FAISS on the calling thread alone
            note("faiss, all OpenMP threads", _ms(lambda Z=Z: ann_io.search(seg.ann, Z, 10))[1])
            valid = np.unique(rows[rows >= 0])
            for key in [key for key in cache if key not in before]:
                del cache[key]
            note("join", _ms(lambda valid=valid: seg.reader.records(valid))[1])
            for name, fn in (extra or {}).items():
                note(name, _ms(lambda q=q, fn=fn: fn(q))[1])
        # the headline ratio in its own pass: in the loop above the search goes first on caches
        # the previous steps filled and the encoder right after it, warm from it; here the two
        # alternate who goes first, query by query
        for i, q in enumerate(queries):
            pair = [("search, alternating", lambda q=q: s.search(q, k=10, mode="dense")),
                    ("encoder, alternating",
                     lambda q=q: s.space.encoder.encode([q], progress=False))]  # fmt: skip
            for name, fn in pair if i % 2 else pair[::-1]:
                note(name, _ms(fn)[1])
        if peer is None:
            continue
        # the peer in its own pass: its model between ours would leave our search to start on
        # caches the peer filled, and the encoder step (run right after it) would not pay that;
        # here ours and the peer's alternate who goes first, query by query
        for i, q in enumerate(queries):
            pair = [("search beside peer", lambda q=q: s.search(q, k=10, mode="dense")),
                    ("peer", lambda q=q: peer(q))]  # fmt: skip
            for name, fn in pair if i % 2 else pair[::-1]:
                note(name, _ms(fn)[1])
    out = {
        name: {"p50": float(np.percentile(t, 50)), "p95": float(np.percentile(t, 95))}
        for name, t in steps.items()
    }
    dens = np.asarray(steps["calibrator+density"]) - np.asarray(steps["calibrator"])
    out["density"] = {"p50": float(np.percentile(dens, 50)), "p95": float(np.percentile(dens, 95))}
    # paired: each query's search time over its own encoder (and peer) time, same iteration
    search = np.asarray(steps["search"])
    for name in extra or {}:  # search with its FAISS step swapped for the extra one, per query
        swapped = search - np.asarray(steps["faiss"]) + np.asarray(steps[name])
        r = swapped / np.asarray(steps["encoder"])
        out[f"search with {name}"] = {
            "p50": float(np.percentile(swapped, 50)),
            "p95": float(np.percentile(swapped, 95)),
        }
        out[f"search with {name}/encoder"] = {
            "p50": float(np.percentile(r, 50)),
            "p95": float(np.percentile(r, 95)),
        }
    pairs = (("encoder, alternating", "search, alternating"), ("peer", "search beside peer"))
    for other, mine in pairs:
        if other in steps:
            r = np.asarray(steps[mine]) / np.asarray(steps[other])
            out[f"search/{other.split(',')[0]}"] = {
                "p50": float(np.percentile(r, 50)),
                "p95": float(np.percentile(r, 95)),
            }
    return out


def recall_of_index(s: Searcher, Z: np.ndarray, k: int = 10) -> dict[str, Any]:
    """The index's own FAISS index (as configured) against exact search over the stored
    vectors, for query vectors ``Z`` in the searched space: ``{"recall", "found", "exact"}``
    (recall@k over all queries; the rows, int64 (q, k), to score any subset with ``recall``)."""
    exact = exact_top(Z, s.vectors(), k)[1]
    _, found = ann_io.search(segment_of(s).ann, Z, k)
    return {"recall": recall(found, exact, k), "found": found, "exact": exact}


def batch_qps(s: Searcher, queries: list[str], batch: int = 64) -> float:
    """Queries per second through ``Searcher.search`` with ``batch`` queries per call."""
    s.search(queries[:batch], k=10, mode="dense")
    n, start = 0, time.perf_counter()
    for i in range(0, len(queries) - batch + 1, batch):
        s.search(queries[i : i + batch], k=10, mode="dense")
        n += batch
    return n / (time.perf_counter() - start)
