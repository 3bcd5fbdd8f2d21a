r"""The ANN stage of ``bench_speed.py``: index types per space at 200k and 1M, re-scoring, and how
well ``auto``'s tuning queries predict real-query recall.

Spaces, all from the static 200k index: ``raw`` (the stored encoder vectors, normalised), the
space the index's manifest says it searched (``s.manifest.calibration``: for static, ``auto``
fits partial whitening, ``gaussian`` with ``power`` 0.25; the index's own searched vectors and
its own fitted calibrator, read from the index, never assumed), and full ``whitening`` (fitted
here on the raw vectors). ``whitening-flow`` (fitted here) only with
``BENCH_SPEED_WHITENING_FLOW=1``. Queries: the 2,000 held-out real queries, encoded by the
index's encoder and projected into each space.

Re-scoring: candidates from an index on the raw vectors (exact, IVF-Flat, HNSW32), re-scored
exactly in the index's searched space, against exact search in that space.

1M: the 200k raw vectors and 4 jittered copies of each (``speed_ann.jitter``), then each space's
own map (the same fitted calibrators) applied to all 1M.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import faiss
import numpy as np

from benchmarks.ann.speed_ann import IVF_NPROBES, jitter, jitter_scale, rescored, study, truth
from benchmarks.common.harness import exact_top, recall, segment_of
from flowsearch import Searcher
from flowsearch.ann import tune as ann_tune
from flowsearch.ann.factory import ivf_factory
from flowsearch.calibration import make_calibrator
from flowsearch.space.search_space import normalise

__all__ = ["stage_ann"]

PROXY_NOISES = (0.25, 0.5, 0.75, 1.0)
HNSW_1M_MAX_200K_BUILD_S = 150.0  # skip HNSW at 1M when 200k took longer (CPU budget)


def _project(fn: Any, u: np.ndarray, chunk: int = 65_536) -> np.ndarray:
    out = np.empty((len(u), u.shape[1]), dtype=np.float32)
    for i in range(0, len(u), chunk):
        out[i : i + chunk] = normalise(fn(u[i : i + chunk]))
    return out


def proxy_agreement(
    index: faiss.Index, x: np.ndarray, real: list[dict[str, float]], k: int = 10
) -> dict[str, Any]:
    """recall@k per ``nprobe`` of ``auto``'s tuning queries (noisy self-queries at several noise
    norms, and leave-one-out self-queries) beside the real queries' recall (``real``)."""
    ivf = faiss.extract_index_ivf(index)
    probes = [int(p["param"]) for p in real]
    curves: dict[str, list[float]] = {"real": [p["recall"] for p in real]}
    for noise in PROXY_NOISES:
        q = ann_tune.probe_queries(x, 256, noise=noise, seed=0)
        gt = exact_top(q, x, k)[1]
        rec = []
        for p in probes:
            ivf.nprobe = p
            rec.append(recall(index.search(q, k)[1], gt, k))
        curves[f"noise {noise}"] = rec
    rng = np.random.default_rng(0)
    pick = rng.choice(len(x), size=256, replace=False)
    gt = exact_top(x[pick], x, k + 1)[1]
    rec = []
    for p in probes:
        ivf.nprobe = p
        found = index.search(x[pick], k + 1)[1]
        drop = [(f[f != r][:k], t[t != r][:k]) for f, t, r in zip(found, gt, pick, strict=True)]
        rec.append(recall(np.array([a for a, _ in drop]), np.array([b for _, b in drop]), k))
    curves["leave-one-out"] = rec
    return {"nprobe": probes, "curves": curves}


def _label(spec: Any) -> str:
    """A space's name from the manifest's calibration spec: calibrator and its strength."""
    extra = "".join(f" {k}={v}" for k, v in spec.config.items() if k in ("power", "shrinkage"))
    return f"{spec.calibrator}{extra}"


def stage_ann(work: Any, queries: list[str], million: int) -> dict[str, Any]:
    s = Searcher.open(work / "static_200k")
    U = np.asarray(segment_of(s).reader.vectors("raw"), dtype=np.float32)
    Uq = s.space.encoder.encode(queries, progress=False)
    spec = s.manifest.calibration
    own = _label(spec) + (" (index)" if spec.calibrated else " (index, encoder space)")
    own_fn = s.space.calibrator.transform if spec.calibrated else (lambda u: u)
    maps: dict[str, Any] = {"raw": lambda u: u, own: own_fn}
    if spec.calibrator != "whitening" or spec.config.get("power", 0.5) != 0.5:
        maps["whitening"] = make_calibrator("whitening").fit(U).transform
    if os.environ.get("BENCH_SPEED_WHITENING_FLOW") == "1":
        maps["whitening-flow"] = make_calibrator("whitening-flow", seed=0).fit(U).transform
    n = len(U)
    nlist = ivf_factory(n).split(",")[0]
    out: dict[str, Any] = {
        "rows": n,
        "queries": len(queries),
        "index_space": own,
        "index_calibration": {"calibrator": spec.calibrator, "config": spec.config,
                              "space": spec.space, "decision": spec.decision},
        "sizes": {},
    }  # fmt: skip
    res200: dict[str, Any] = {}
    keep: dict[str, Any] = {}
    vecs: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    deadline = float(os.environ.get("BENCH_SPEED_DEADLINE", "inf"))  # epoch seconds
    partial = work / "stage_ann.partial.json"
    for name, fn in maps.items():
        if name not in ("raw", own) and time.time() > deadline - 1800:
            res200[name] = {"_skipped": "time box"}
            continue
        start = time.perf_counter()
        load = os.getloadavg()
        x = s.vectors() if name == own else _project(fn, U)
        q = _project(fn, Uq)
        gt, flat_qps = truth(x, q)
        r = study(x, q, gt, nlist=int(nlist[3:]), keep=name in ("raw", own))
        r["types"]["Flat"]["points"] = [{"param": 0, "recall": 1.0, "qps": flat_qps}]
        keep[name] = r.pop("built")
        res200[name] = {**r, "wall_s": time.perf_counter() - start, "load": [load, os.getloadavg()]}
        vecs[name] = (x, q, gt)
        print(f"ann 200k {name}: {time.perf_counter() - start:.0f}s", flush=True)
        partial.write_text(json.dumps(res200, default=float))
    out["sizes"][str(n)] = res200

    # candidates from raw vectors, re-scored exactly in the index's searched space
    xr, qr, _ = vecs["raw"]
    z, zq, gtz = vecs[own]
    resc: dict[str, Any] = {"exact raw (ceiling)": rescored(None, (qr, xr), z, zq, gtz)}
    ivf_raw = keep["raw"]["IVF"]
    for p in (16, 32, 64):
        faiss.extract_index_ivf(ivf_raw).nprobe = p
        resc[f"raw {nlist},Flat nprobe {p}"] = rescored(ivf_raw, qr, z, zq, gtz)
    for ef in (64, 128, 256):
        keep["raw"]["HNSW32"].hnsw.efSearch = ef
        resc[f"raw HNSW32 efSearch {ef}"] = rescored(keep["raw"]["HNSW32"], qr, z, zq, gtz)
    out["rescored"] = {"space": own, "load": os.getloadavg(), "candidates": resc}
    partial.write_text(json.dumps({**res200, "_rescored": resc}, default=float))
    out["proxy"] = {
        name: proxy_agreement(keep[name]["IVF"], vecs[name][0], _ivf_points(res200[name]))
        for name in ("raw", own)
    }
    del keep, vecs, xr, z

    # 1M: jittered copies of the real raw vectors
    copies = max(0, round(million / n) - 1)
    if copies and time.time() > deadline:
        out["sizes"]["1M"] = {"_skipped": "time box reached before the 1M part started"}
    elif copies:
        scale = jitter_scale(U)
        u1m = jitter(U, copies, scale)
        hnsw_ok = res200["raw"]["types"]["HNSW32"]["build_s"] <= HNSW_1M_MAX_200K_BUILD_S
        nlist1m = int(ivf_factory(len(u1m)).split(",")[0][3:])
        res1m: dict[str, Any] = {"_jitter_scale": scale, "_copies": copies, "_hnsw": hnsw_ok}
        for name in ("raw", own):
            if time.time() > deadline:
                res1m[name] = {"_skipped": "time box"}
                continue
            start = time.perf_counter()
            load = os.getloadavg()
            x = _project(maps[name], u1m)
            q = _project(maps[name], Uq)
            gt, flat_qps = truth(x, q)
            r = study(x, q, gt, nlist=nlist1m, per_list=32, hnsw=hnsw_ok, pq=False)
            r["types"]["Flat"]["points"] = [{"param": 0, "recall": 1.0, "qps": flat_qps}]
            r.pop("built")
            # how much of a query's exact top-10 are jittered copies
            r["top10_jittered_share"] = float((gt >= n).mean())
            res1m[name] = {**r, "wall_s": time.perf_counter() - start,
                           "load": [load, os.getloadavg()]}  # fmt: skip
            del x
            print(f"ann 1M {name}: {time.perf_counter() - start:.0f}s", flush=True)
        out["sizes"][str(len(u1m))] = res1m
    s.close()
    return out


def _ivf_points(res: dict[str, Any]) -> list[dict[str, float]]:
    name = next(t for t in res["types"] if t.startswith("IVF") and t.endswith(",Flat"))
    pts = res["types"][name]["points"]
    return [p for p in pts if p["param"] in IVF_NPROBES]
