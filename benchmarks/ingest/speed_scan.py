r"""Cheap figures from the 200k indexes as ingest built them (no new training): exact ``Flat``
single-query latency by corpus size (prefixes of the stored vectors: where ``auto`` should stop
scanning), and the ingest-built approximate index's recall@10 and single-query p50 by its search
parameter (``efSearch`` for HNSW, ``nprobe`` for IVF: whatever ``auto`` built, read from the
index) on real queries, beside ``auto``'s tuning queries (noisy self-queries,
``index.probe_queries``) at several noise norms: does the proxy ``auto`` tunes on predict real
recall?"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from benchmarks.common.harness import exact_top, recall, segment_of, single_query_ms
from flowsearch import Searcher
from flowsearch.ann import io as ann_io
from flowsearch.ann import tune as ann_tune

__all__ = ["stage_scan"]

SIZES = (10_000, 20_000, 50_000, 100_000, 150_000, 200_000)
NOISES = (0.25, 0.5, 1.0)
EFS = (16, 32, 64, 128, 256, 512, 1024)


def _p50_ms(index: faiss.Index, q: np.ndarray, k: int = 10) -> float:
    """Single-query p50 ms on one OpenMP thread (as ``Searcher`` runs one query)."""
    return float(
        ann_io.single_threaded(
            lambda: single_query_ms(lambda row: index.search(row[None], k), q, 5)
        )
    )


def _set(index: faiss.Index, knob: str, value: int) -> None:
    if knob == "nprobe":
        faiss.extract_index_ivf(index).nprobe = value
    else:
        faiss.downcast_index(index).hnsw.efSearch = value


def knob_curves(s: Searcher, zq: np.ndarray, x: np.ndarray, n_lat: int = 200) -> dict[str, Any]:
    """recall@10 and p50 by the index's search parameter, real vs tuning queries."""
    seg = segment_of(s)
    index, ann = seg.ann, seg.record.ann
    knob = ann_tune.search_knob(index)
    if knob is None:
        return {"factory": ann.factory, "_skipped": "exact index: nothing to tune"}
    name, largest = knob
    values = [v for v in (EFS if name == "efSearch" else (8, 16, 32, 64, 128, 256, 512, 1024))]
    values = [v for v in values if v <= largest]
    gt = exact_top(zq, x, 10)[1]
    half = len(zq) // 2
    curves: dict[str, list[float]] = {"real": [], "real questions": [], "real sentences": []}
    p50: list[float] = []
    for v in values:
        _set(index, name, v)
        found = index.search(zq, 10)[1]
        curves["real"].append(recall(found, gt))
        curves["real questions"].append(recall(found[:half], gt[:half]))
        curves["real sentences"].append(recall(found[half:], gt[half:]))
        p50.append(_p50_ms(index, zq[:n_lat]))
    for noise in NOISES:
        pq = ann_tune.probe_queries(x, 256, noise=noise, seed=0)
        pgt = exact_top(pq, x, 10)[1]
        curve = []
        for v in values:
            _set(index, name, v)
            curve.append(recall(index.search(pq, 10)[1], pgt))
        curves[f"tuning queries, noise {noise}"] = curve
    ann_io.set_params(index, ann.params)  # back to what auto chose
    return {
        "factory": ann.factory,
        "params": ann.params,
        "calibrator": s.manifest.calibration.calibrator,
        "space": s.manifest.calibration.space,
        "knob": name,
        "values": values,
        "curves": curves,
        "p50_ms": p50,
        "auto_noise": ann_tune.QUERY_NOISE,
    }


def stage_scan(work: Path, queries: list[str]) -> dict[str, Any]:
    s = Searcher.open(work / "static_200k")
    x = s.vectors()
    zq = s.embed(queries)[0]
    out: dict[str, Any] = {"flat_p50_ms": {}, "load_start": os.getloadavg()}
    for n in SIZES:
        flat = faiss.IndexFlatIP(x.shape[1])
        flat.add(x[:n])
        out["flat_p50_ms"][n] = _p50_ms(flat, zq[:200])
        del flat
    out["static_200k"] = knob_curves(s, zq, x)
    s.close()
    if (work / "mean_200k" / "manifest.json").exists():
        s = Searcher.open(work / "mean_200k")
        out["mean_200k"] = knob_curves(s, s.embed(queries)[0], s.vectors())
        s.close()
    out["load_end"] = os.getloadavg()
    return out
