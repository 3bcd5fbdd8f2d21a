r"""Approximate search on raw and calibrated vectors: the index-type study of ``bench_speed.py``.

For one set of unit vectors (one searched space) and its real queries: exact truth by ``Flat``,
then ``HNSW32``, ``IVF{nlist},Flat`` and ``IVF{nlist},PQ48`` (bare, and with an exact re-rank of
4k candidates, ``IndexRefineFlat``), each at a sweep of its search parameter: build seconds,
serialized bytes, recall@10 against ``Flat`` in the same space, batch QPS (all queries in one
call) and single-query p50 (one OpenMP thread, as ``Searcher`` runs one query). Also the
re-scoring idea of issue 16: candidates from an index on another space's vectors, re-scored
exactly in this one.

Everything here is plain FAISS; the IVF quantizer is trained once per vector set and shared by
IVF-Flat and IVF-PQ (their build times count it once each: each reports what it would cost alone).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import faiss
import numpy as np
from faiss.contrib.ivf_tools import add_preassigned

from benchmarks.common.harness import exact_top, recall, single_query_ms
from flowsearch.ann import io as ann_io

__all__ = ["IVF_NPROBES", "HNSW_EFS", "jitter", "rescored", "study", "truth"]

IVF_NPROBES = (4, 8, 16, 32, 64, 128, 256)
HNSW_EFS = (16, 32, 64, 128, 256)
PQ_M = 48
REFINE_FACTOR = 4
_CHUNK = 65_536
_LATENCY_QUERIES = 200


def _now() -> float:
    return time.perf_counter()


def truth(x: np.ndarray, q: np.ndarray, k: int = 10) -> tuple[np.ndarray, float]:
    """Exact top-k rows (int64 (q, k)) and the Flat scan's batch QPS."""
    start = _now()
    rows = exact_top(q, x, k, chunk_rows=_CHUNK * 4)[1]
    return rows, len(q) / (_now() - start)


def _p50_ms(index: faiss.Index, q: np.ndarray, k: int) -> float:
    """Single-query p50 ms on one OpenMP thread (as ``Searcher`` runs one query)."""
    search = lambda row: index.search(row[None], k)  # noqa: E731
    return float(ann_io.single_threaded(lambda: single_query_ms(search, q[:_LATENCY_QUERIES])))


def _sweep(
    index: faiss.Index,
    q: np.ndarray,
    gt: np.ndarray,
    values: tuple[int, ...],
    apply: Callable[[int], None],
    k: int = 10,
) -> list[dict[str, float]]:
    points = []
    for value in values:
        apply(value)
        start = _now()
        _, found = index.search(q, k)
        qps = len(q) / (_now() - start)
        points.append(
            {
                "param": value,
                "recall": recall(found, gt, k),
                "qps": qps,
                "p50_ms": _p50_ms(index, q, k),
            }
        )
    return points


def _fill(index: faiss.Index, x: np.ndarray) -> None:
    for start in range(0, len(x), _CHUNK):
        index.add(x[start : start + _CHUNK])


def _size(index: faiss.Index) -> int:
    return int(faiss.serialize_index(index).nbytes)


def quantizer(x: np.ndarray, nlist: int, niter: int, per_list: int, seed: int = 0) -> Any:
    """A trained coarse quantizer (IndexFlatIP of k-means centroids on a seeded sample of
    ``per_list * nlist`` rows, spherical) and its training seconds."""
    start = _now()
    rng = np.random.default_rng(seed)
    m = min(len(x), per_list * nlist)
    sample = x[np.sort(rng.choice(len(x), size=m, replace=False))]
    km = faiss.Kmeans(x.shape[1], nlist, niter=niter, spherical=True, seed=seed,
                      max_points_per_centroid=per_list)  # fmt: skip
    km.train(sample)
    q = faiss.IndexFlatIP(x.shape[1])
    q.add(km.centroids)
    return q, _now() - start, sample


def study(
    x: np.ndarray,
    q: np.ndarray,
    gt: np.ndarray,
    *,
    nlist: int,
    niter: int = 10,
    per_list: int = 64,
    hnsw: bool = True,
    pq: bool = True,
    keep: bool = False,
) -> dict[str, Any]:
    """Every index type on unit vectors ``x`` (float32 (n, d)) with queries ``q`` and exact truth
    ``gt``: ``{"types": {name: {"build_s", "bytes", "points": [...]}}, "built": {...}}`` (the
    HNSW and IVF-Flat indexes kept in ``built`` only when ``keep``)."""
    d = x.shape[1]
    out: dict[str, Any] = {}
    built: dict[str, faiss.Index] = {}
    out["Flat"] = {"build_s": 0.0, "bytes": int(x.nbytes), "points": []}
    if hnsw:
        start = _now()
        h = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        _fill(h, x)
        build = _now() - start

        def set_ef(v: int) -> None:
            h.hnsw.efSearch = v

        points = _sweep(h, q, gt, HNSW_EFS, set_ef)
        out["HNSW32"] = {"build_s": build, "bytes": _size(h), "points": points}
        if keep:
            built["HNSW32"] = h
        del h
    cq, train_s, sample = quantizer(x, nlist, niter, per_list)
    start = _now()
    _, assign = cq.search(x, 1)  # one assignment, shared by IVF-Flat and IVF-PQ
    assign = np.ascontiguousarray(assign[:, 0])
    assign_s = _now() - start

    def set_nprobe(target: faiss.Index) -> Callable[[int], None]:
        def apply(v: int) -> None:
            faiss.extract_index_ivf(target).nprobe = v

        return apply

    start = _now()
    ivf = faiss.IndexIVFFlat(cq, d, nlist, faiss.METRIC_INNER_PRODUCT)
    add_preassigned(ivf, x, assign)
    probes = tuple(p for p in IVF_NPROBES if p <= nlist)
    out[f"IVF{nlist},Flat"] = {
        "build_s": train_s + assign_s + _now() - start,
        "bytes": _size(ivf),
        "points": _sweep(ivf, q, gt, probes, set_nprobe(ivf)),
    }
    if keep:
        built["IVF"] = ivf
    del ivf
    if not pq:
        return {"types": out, "built": built}
    start = _now()
    ivfpq = faiss.IndexIVFPQ(cq, d, nlist, PQ_M, 8, faiss.METRIC_INNER_PRODUCT)
    ivfpq.do_polysemous_training = False  # minutes of code reordering we never use
    ivfpq.train(sample[: 256 * 256])  # the quantizer is trained already: this trains the PQ only
    refine = faiss.IndexRefineFlat(ivfpq)  # must wrap the PQ while it is empty
    refine.k_factor = REFINE_FACTOR
    add_preassigned(ivfpq, x, assign)
    build = train_s + assign_s + _now() - start
    refine.refine_index.add(x)
    refine.ntotal = ivfpq.ntotal
    pq_probes = tuple(p for p in (16, 64, 256) if p <= nlist)
    out[f"IVF{nlist},PQ{PQ_M}"] = {
        "build_s": build,
        "bytes": _size(ivfpq),
        "points": _sweep(ivfpq, q, gt, pq_probes, set_nprobe(ivfpq)),
    }
    out[f"IVF{nlist},PQ{PQ_M},RFlat"] = {
        "build_s": build,
        "bytes": _size(refine),
        "points": _sweep(refine, q, gt, pq_probes, set_nprobe(ivfpq)),
    }
    return {"types": out, "built": built}


def rescored(
    candidates: faiss.Index | None,
    cand_queries: Any,
    z: np.ndarray,
    zq: np.ndarray,
    gt: np.ndarray,
    depths: tuple[int, ...] = (10, 20, 50, 100, 200),
    k: int = 10,
) -> list[dict[str, float]]:
    """Candidates (top ``depth``) from ``candidates`` searched with ``cand_queries`` (another
    space, e.g. raw), re-scored exactly with this space's vectors ``z`` / queries ``zq``;
    recall@k against ``gt`` (exact top-k in this space), batch QPS of both steps (all queries in
    one call) and single-query p50 ms of both steps (the first 200 queries, one at a time).

    ``candidates=None``: exact candidates, ``cand_queries`` = (queries, vectors) of the other
    space (the idea's ceiling; the Flat index's build is not charged)."""
    if candidates is None:
        flat = faiss.IndexFlatIP(cand_queries[1].shape[1])
        flat.add(cand_queries[1])
        index, cq = flat, cand_queries[0]
    else:
        index, cq = candidates, cand_queries

    def run(qc: np.ndarray, qz: np.ndarray, depth: int) -> np.ndarray:
        _, cand = index.search(qc, depth)
        scores = np.einsum("qd,qcd->qc", qz, z[np.maximum(cand, 0)])
        scores[cand < 0] = -np.inf
        return np.take_along_axis(cand, np.argsort(-scores, axis=1)[:, :k], axis=1)

    points = []
    for depth in depths:
        start = _now()
        top = run(cq, zq, depth)
        qps = len(zq) / (_now() - start)

        def single(depth: int = depth) -> list[float]:
            for i in range(10):  # warm-up
                run(cq[i : i + 1], zq[i : i + 1], depth)
            times = []
            for i in range(min(_LATENCY_QUERIES, len(zq))):
                start = _now()
                run(cq[i : i + 1], zq[i : i + 1], depth)
                times.append(_now() - start)
            return times

        times = ann_io.single_threaded(single)  # one query on one thread, as Searcher runs it
        points.append(
            {
                "depth": depth,
                "recall": recall(top, gt, k),
                "qps": qps,
                "p50_ms": float(np.median(times) * 1e3),
            }
        )
    return points


def jitter(u: np.ndarray, copies: int, scale: float, seed: int = 0) -> np.ndarray:
    """``u`` (float32 (n, d), raw vectors) followed by ``copies`` jittered copies of every row:
    ``u + scale * N(0, Cov(u))`` (noise shaped by the data's own covariance, so it is the same
    size relative to the spread in every direction, raw or whitened)."""
    rng = np.random.default_rng(seed)
    cov = np.cov(u[: min(len(u), 100_000)], rowvar=False)
    vals, vecs = np.linalg.eigh(cov)
    root = (vecs * np.sqrt(np.clip(vals, 0, None))).astype(np.float32)  # Cov = root @ root.T
    out = np.empty(((copies + 1) * len(u), u.shape[1]), dtype=np.float32)
    out[: len(u)] = u
    for c in range(copies):
        block = out[(c + 1) * len(u) : (c + 2) * len(u)]
        for start in range(0, len(u), _CHUNK):
            g = rng.standard_normal((min(_CHUNK, len(u) - start), u.shape[1]), dtype=np.float32)
            block[start : start + len(g)] = u[start : start + len(g)] + scale * (g @ root.T)
    return out


def jitter_scale(u: np.ndarray, fraction: float = 0.5, m: int = 500, seed: int = 0) -> float:
    """The ``scale`` for :func:`jitter` that moves a row by ``fraction`` of the median distance
    from a row to its 10th nearest neighbour, both in the whitened (Mahalanobis) metric."""
    rng = np.random.default_rng(seed)
    cov = np.cov(u[: min(len(u), 100_000)], rowvar=False)
    vals, vecs = np.linalg.eigh(cov)
    w = (vecs / np.sqrt(np.clip(vals, 1e-12, None))).astype(np.float32)
    white = (u - u.mean(0)) @ w
    pick = rng.choice(len(u), size=m, replace=False)
    d2, _ = faiss.knn(white[pick], white, 11, metric=faiss.METRIC_L2)
    d10 = float(np.median(np.sqrt(np.maximum(d2[:, 10], 0))))
    return fraction * d10 / math.sqrt(u.shape[1])  # E|N(0, I_d)| ~ sqrt(d) in whitened units
