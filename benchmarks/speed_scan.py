r"""Cheap figures from the static 200k index as ingest built it (no new training): exact ``Flat``
single-query latency by corpus size (prefixes of the stored vectors), and the ingest-built IVF's
recall@10 by ``nprobe`` on real queries beside ``auto``'s tuning queries (noisy self-queries)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from flowsearch import Searcher
from flowsearch import index as fx

__all__ = ["stage_scan"]

SIZES = (10_000, 20_000, 50_000, 100_000, 200_000)
NOISES = (0.25, 0.5, 1.0)


def _p50_ms(index: faiss.Index, q: np.ndarray, k: int = 10) -> float:
    for row in q[:5]:
        index.search(row[None], k)
    times = []
    for row in q:
        start = time.perf_counter()
        index.search(row[None], k)
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def stage_scan(work: Path, queries: list[str]) -> dict[str, Any]:
    s = Searcher.open(work / "static_200k")
    x = s.vectors()
    zq = s.embed(queries)[0]
    out: dict[str, Any] = {"flat_p50_ms": {}}
    for n in SIZES:
        flat = faiss.IndexFlatIP(x.shape[1])
        flat.add(x[:n])
        out["flat_p50_ms"][n] = _p50_ms(flat, zq[:100])
        del flat
    index = s._version.faiss_index
    ivf = faiss.extract_index_ivf(index)
    gt = fx.exact_knn(zq, [x], 10)[1]
    half = len(queries) // 2
    probes = [p for p in (8, 16, 32, 64, 128, 256, 512, 1024) if p <= ivf.nlist]
    curves: dict[str, list[float]] = {"real": [], "real questions": [], "real sentences": []}
    p50: list[float] = []
    for p in probes:
        ivf.nprobe = p
        found = index.search(zq, 10)[1]
        curves["real"].append(fx.recall_at_k(found, gt))
        curves["real questions"].append(fx.recall_at_k(found[:half], gt[:half]))
        curves["real sentences"].append(fx.recall_at_k(found[half:], gt[half:]))
        p50.append(_p50_ms(index, zq[:100]))
    for noise in NOISES:
        pq = fx.probe_queries(x, 256, noise=noise, seed=0)
        pgt = fx.exact_knn(pq, [x], 10)[1]
        curves[f"tuning queries, noise {noise}"] = []
        for p in probes:
            ivf.nprobe = p
            curves[f"tuning queries, noise {noise}"].append(
                fx.recall_at_k(index.search(pq, 10)[1], pgt)
            )
    out["ivf"] = {"factory": s.manifest.faiss.factory, "params": s.manifest.faiss.params,
                  "nprobe": probes, "curves": curves, "p50_ms": p50}  # fmt: skip
    s.close()
    return out
