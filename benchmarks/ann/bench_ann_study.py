r"""Which vector index pays on a calibrated space, and what ``auto``'s tuning promises (issue 30).

200,000 rows of the speed corpus (``speed_corpus``: real sentences topped up with splices of two
real sentences) encoded with ``static`` pooling and projected into the space ``auto`` fits for it
(``gaussian``, partial whitening). Queries the corpus never saw: QNLI test questions, and
*partial* held-out sentences (a seeded contiguous 40-70% of the words of a real sentence held out
of the corpus): the hard case issue 30 measured. Truth: exact top-10 in the same space.

Stages (cached under ``benchmarks/_work/ann_study``):

- ``prepare``: corpus, encoding, calibrator fit, projections, truth.
- ``study``: each index structure on the searched (calibrated) space, the same structures on the
  raw (normalised) space, and the *identity* index for a linear calibrator: inner product over
  ``v = (x - mu) / |W(x - mu)|`` with queries ``u = W^T W (x_q - mu)`` (the raw space's
  geometry, cosine ranking of the calibrated space); per knob value: recall@10 on the real
  queries, single-query p50 (one FAISS thread, one query at a time) and its speed-up on
  ``Flat``'s.
- ``tune``: ``auto``'s tuner (:func:`flowsearch.ann.build.tune_search`) on the index ``auto``
  builds: the knob it picks, the recall it records (on its held-out check queries), and the
  recall real queries get at that knob.

Run: ``python -m benchmarks run ann_study --stage all`` (``--smoke``: 20k rows).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness, tables
from benchmarks.common.corpora import partial_sentence
from flowsearch.ann.policy import AnnPolicy

WORK = harness.WORK / "ann_study"
LATENCY_QUERIES = 300
#: FAISS and torch (and the tokenizer's) threads of the 1M stages' encoding and builds
#: (``--threads``); their searches run on one thread (a single query searches so in the
#: product: ``flowsearch.search.shards.ONE_THREAD_MAX_QUERIES``).
THREADS = 1


def workdir(rows: int, pooling: str = "static") -> Path:
    """The stages' folder for ``rows`` rows encoded with ``pooling``."""
    return WORK / (str(rows) if pooling == "static" else f"{pooling}_{rows}")


def prepare(data: Path, rows: int, n_queries: int, pooling: str = "static") -> dict[str, Any]:
    import pyarrow.parquet as pq

    from benchmarks.common.corpora import corpus_and_queries
    from flowsearch.encode.encoder import Encoder
    from flowsearch.space.fitting import fit_for_index
    from flowsearch.space.search_space import SearchSpace

    work = workdir(rows, pooling)
    if (work / "prepare.json").exists():
        return dict(json.loads((work / "prepare.json").read_text()))
    work.mkdir(parents=True, exist_ok=True)
    corpus, queries, counts = corpus_and_queries(data, work, rows, n_queries)
    half = n_queries // 2
    rng = np.random.default_rng(7)
    questions, held = queries[: n_queries - half], queries[n_queries - half :]
    partial = [partial_sentence(s, rng) for s in held]
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
    enc = Encoder(None, pooling=pooling)
    t = time.perf_counter()
    U = enc.encode(texts, batch_size=256, progress=False).astype(np.float32)
    encode_s = time.perf_counter() - t
    Uq = enc.encode(questions + partial, batch_size=256, progress=False).astype(np.float32)
    cal, spec = fit_for_index(U, "auto", pooling=pooling)
    space = SearchSpace(cal, spec)
    Z = space.project(U, want_density=False)[0]
    Zq = space.project(Uq, want_density=False)[0]
    np.save(work / "raw.npy", U)
    np.save(work / "raw_q.npy", Uq)
    np.save(work / "z.npy", Z)
    np.save(work / "z_q.npy", Zq)
    state = {k: np.asarray(v) for k, v in cal.state().items()} if hasattr(cal, "state") else {}
    np.savez(work / "calibrator.npz", **state)
    out = {
        "rows": len(U),
        "dim": int(U.shape[1]),
        "counts": counts,
        "queries": {"questions": len(questions), "partial_sentences": len(partial)},
        "examples": partial[:3],
        "encode_s": encode_s,
        "pooling": pooling,
        "calibrator": spec.calibrator,
        "space": spec.space,
    }
    (work / "prepare.json").write_text(json.dumps(out, indent=1))
    return out


def _knob(index: Any, name: str, value: int) -> None:
    import faiss

    if name == "efSearch":
        inner = faiss.downcast_index(index)
        inner = faiss.downcast_index(inner.base_index) if hasattr(inner, "k_factor") else inner
        inner.hnsw.efSearch = value
    elif name == "nprobe":
        faiss.extract_index_ivf(index).nprobe = value
    elif name == "k_factor":
        faiss.downcast_index(index).k_factor = value


def _single_ms(index: Any, q: np.ndarray) -> float:
    for i in range(min(10, len(q))):  # warm-up: caches, lazy set-up
        index.search(q[i : i + 1], 10)
    times = []
    for i in range(len(q)):
        t = time.perf_counter()
        index.search(q[i : i + 1], 10)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000)


def _truth(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    return harness.exact_top(q, x, 10)[1]


def _identity(work: Path) -> tuple[np.ndarray, np.ndarray]:
    """(v, u): corpus and queries of the exact inner-product twin of a linear calibrator."""
    st = np.load(work / "calibrator.npz")
    U, Uq = np.load(work / "raw.npy"), np.load(work / "raw_q.npy")
    mu, rot, s = st["mu"], st["rotation"], st["scales"]  # z = ((x - mu) @ rot) / s
    v = (U - mu) / np.linalg.norm(((U - mu) @ rot) / s, axis=1, keepdims=True)
    zq = ((Uq - mu) @ rot) / s
    u = ((zq / s) @ rot.T) / np.linalg.norm(zq, axis=1, keepdims=True)
    return v.astype(np.float32), u.astype(np.float32)


def _grid(**knobs: tuple[int, ...]) -> list[dict[str, int]]:
    """Every combination of the knob values, the first knob varying slowest."""
    points: list[dict[str, int]] = [{}]
    for name, values in knobs.items():
        points = [{**p, name: v} for p in points for v in values]
    return points


NPROBE = (16, 32, 64, 128, 256, 512)
#: (label, factory, metric, spaces, knob points). ``L2``: HNSW-RaBitQ supports only L2 (the
#: searched and raw vectors are unit rows, where L2 and inner product rank alike).
STRUCTURES: list[tuple[str, str, str, tuple[str, ...], list[dict[str, int]]]] = [
    ("IVF1,RaBitQfs,RFlat", "IVF1,RaBitQfs,RFlat", "IP", ("searched", "identity", "raw"),
     _grid(k_factor=(4, 8, 16, 32))),
    ("RaBitQfs,RFlat", "RaBitQfs,RFlat", "IP", ("searched", "identity", "raw"),
     _grid(k_factor=(4, 8, 16, 32, 64))),
    ("IVF1024,RaBitQfs,RFlat", "IVF1024,RaBitQfs,RFlat", "IP", ("searched", "identity"),
     _grid(k_factor=(8, 32), nprobe=(32, 64, 128, 256, 512))),
    ("IVF4096,RaBitQfs,RFlat", "IVF4096,RaBitQfs,RFlat", "IP", ("searched", "identity"),
     _grid(k_factor=(8, 32), nprobe=(64, 128, 256, 512, 1024, 2048))),
    ("IVF1024,RaBitQfs,RFlat (L2)", "IVF1024,RaBitQfs,RFlat", "L2", ("searched", "raw"),
     _grid(k_factor=(8, 32), nprobe=(32, 64, 128, 256, 512))),
    ("IVF1024,Flat", "IVF1024,Flat", "IP", ("searched", "identity"), _grid(nprobe=NPROBE)),
    ("IVF4096,Flat", "IVF4096,Flat", "IP", ("searched", "identity"),
     _grid(nprobe=(64, 128, 256, 512, 1024, 2048))),
    ("HNSW32", "HNSW32", "IP", ("searched", "raw"), _grid(efSearch=(64, 128, 256, 512))),
    ("HNSW32 efConstruction 16", "HNSW32@efC16", "IP", ("searched",),
     _grid(efSearch=(128, 256, 512, 1024))),
    ("HNSW32 efConstruction 80", "HNSW32@efC80", "IP", ("searched",),
     _grid(efSearch=(128, 256, 512, 1024))),
    ("HNSW32,RaBitQ,RFlat", "HNSW32,RaBitQ,RFlat", "L2", ("searched",),
     _grid(k_factor=(4, 16), efSearch=(64, 128, 256, 512))),
    ("IVF1024,PQ48,RFlat", "IVF1024,PQ48,RFlat", "IP", ("searched",),
     _grid(k_factor=(8, 32), nprobe=(64, 128, 256, 512))),
]  # fmt: skip


def _build(factory: str, x: np.ndarray, metric: str = "IP") -> tuple[Any, float]:
    """``factory`` over ``x`` as ingest builds it (:mod:`flowsearch.ann.build`: bounded
    training sample, chunked adds), on the threads FAISS has: ``(index, seconds)``."""
    index, seconds, _ = _build_within(factory, x, metric)
    return index, seconds


def _build_within(
    factory: str, x: np.ndarray, metric: str = "IP", limit_s: float | None = None
) -> tuple[Any, float, int]:
    """:func:`_build`, stopped after the first chunk of rows that ends past ``limit_s`` seconds
    (a time-box that keeps the process): ``(index, seconds, rows added)``. ``@efC<n>`` after a
    factory sets its graph's ``efConstruction`` (under a re-rank too)."""
    import faiss

    kind = faiss.METRIC_L2 if metric == "L2" else faiss.METRIC_INNER_PRODUCT
    factory, _, reduced = factory.partition("@PCA")  # e.g. HNSW32@efC40@PCA256
    if reduced:
        return _reduced_graph(factory, x, int(reduced), kind, limit_s)
    factory, _, ef_construction = factory.partition("@efC")  # e.g. HNSW32@efC16
    index = faiss.index_factory(x.shape[1], factory, kind)
    if ef_construction:
        graph = faiss.downcast_index(index)
        if isinstance(graph, faiss.IndexRefine):
            graph = faiss.downcast_index(graph.base_index)
        graph.hnsw.efConstruction = int(ef_construction)
    t = time.perf_counter()
    added = _train_and_add(index, x, factory, t, limit_s)
    return index, time.perf_counter() - t, added


def _train_and_add(index: Any, x: np.ndarray, factory: str, t: float, limit_s: float | None) -> int:
    """Train ``index`` on ``x`` and add it in chunks of 65,536 rows, stopping once a chunk
    ends ``limit_s`` seconds past ``t``: the rows added."""
    from flowsearch.ann import build as ann_build

    ann_build.train(index, x, factory)
    added = 0
    for start in range(0, len(x), 65_536):
        ann_build.add(index, x[start : start + 65_536], factory)
        added = min(len(x), start + 65_536)
        if limit_s is not None and time.perf_counter() - t > limit_s and added < len(x):
            break
    return added


def _reduced_graph(
    factory: str, x: np.ndarray, dims: int, kind: int, limit_s: float | None
) -> tuple[Any, float, int]:
    """An ``HNSW<M>[@efC<n>]`` graph built as ``auto`` builds a large segment's
    (:class:`flowsearch.ann.build.ProjectedGraph`): over the rows' first ``dims`` principal
    components (PCA fitted on ``fourth-release projected_graph_sample_rows`` seeded rows, timed with
    the build), then an ``IndexHNSWFlat`` of the full rows (searches read them). Inner product
    only. ``(index, seconds, rows added)`` as :func:`_build_within`."""
    raise SystemExit(  # the product's ProjectedGraph left the package (flowsearch/ann/build.py
        # before the fifth release, in git history): this study's figures stay in RESULTS.md
        "the projected graph left flowsearch in its fifth release; see git history"
    )


def _cached(
    work: Path, factory: str, space: str, x: np.ndarray, metric: str = "IP"
) -> tuple[Any, float]:
    """The index of ``factory`` over ``x``, built once and kept in ``work``:
    ``(index, build seconds of the build that made it)``."""
    import faiss

    path = work / f"index_{factory.replace(',', '_')}_{space}.faiss"
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        return faiss.read_index(str(path)), float(json.loads(meta.read_text())["build_s"])
    index, build_s = _build(factory, x, metric)
    faiss.write_index(index, str(path))
    meta.write_text(json.dumps({"build_s": build_s}))
    return index, build_s


def _spaces(work: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    Z, Zq = np.load(work / "z.npy"), np.load(work / "z_q.npy")
    U, Uq = np.load(work / "raw.npy"), np.load(work / "raw_q.npy")
    R = U / np.linalg.norm(U, axis=1, keepdims=True)
    Rq = Uq / np.linalg.norm(Uq, axis=1, keepdims=True)
    out = {"searched": (Z, Zq), "raw": (R, Rq)}
    with contextlib.suppress(KeyError):  # not a linear calibrator: no identity twin
        out["identity"] = _identity(work)
    return out


def _curve(
    index: Any,
    q: np.ndarray,
    truth: np.ndarray,
    lat: np.ndarray,
    flat_ms: float,
    points: list[dict[str, int]],
    row: dict[str, Any],
) -> list[dict[str, Any]]:
    """recall@10 (all queries, and each half) and single-query p50 at each knob point."""
    out = []
    half = len(q) // 2
    for point in points:
        for name, value in point.items():
            _knob(index, name, value)
        found = index.search(q, 10)[1]
        ms = _p50_ms(index, q[lat])
        out.append({
            **row,
            "knob": ",".join(f"{k}={v}" for k, v in point.items()),
            "recall": harness.recall(found, truth),
            "recall_questions": harness.recall(found[:half], truth[:half]),
            "recall_partial": harness.recall(found[half:], truth[half:]),
            "p50_ms": ms, "qps": 1000.0 / ms, "speedup": flat_ms / ms,
            "load": harness.load_average()[0],
        })  # fmt: skip
        print(json.dumps(out[-1]), flush=True)
    return out


def study(work: Path, only: str | None, before: dict[str, Any] | None) -> dict[str, Any]:
    """Each structure of :data:`STRUCTURES` (``only``: those of these ``;``-separated labels)
    on one FAISS thread (builds included); curves of earlier runs are kept (``before``) unless
    re-measured here."""
    import faiss

    faiss.omp_set_num_threads(1)
    spaces = _spaces(work)
    Z, Zq = spaces["searched"]
    truth = _truth(Zq, Z)
    truth_raw = _truth(spaces["raw"][1], spaces["raw"][0])
    twin = spaces.get("identity")
    agree = harness.recall(_truth(twin[1], twin[0]), truth) if twin else None
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    flat = faiss.IndexFlatIP(Z.shape[1])
    flat.add(Z)
    flat_ms = _single_ms(flat, Zq[lat])
    del flat
    chosen = set(only.split(";")) if only else {s[0] for s in STRUCTURES}
    results = [r for r in (before or {}).get("curves", []) if r["structure"] not in chosen]
    for label, factory, metric, names, points in STRUCTURES:
        if label not in chosen:
            continue
        for space_name in [n for n in names if n in spaces]:
            x, q = spaces[space_name]
            t = truth_raw if space_name == "raw" else truth  # identity: the searched ranking
            index, build_s = _build(factory, x, metric)
            row = {"structure": label, "space": space_name, "build_s": build_s}
            results += _curve(index, q, t, lat, flat_ms, points, row)
            del index
    return {
        "flat_p50_ms": flat_ms, "identity_top10_agreement": agree, "curves": results,
        "rows": len(Z), "load_end": harness.load_average(),
    }  # fmt: skip


SCALE_COPIES = 4  # 200k real rows + 4 jittered copies of each = 1M (bench_scale's 1M)
#: (label, factory, metric, knob points) measured at 1M.
SCALE_STRUCTURES: list[tuple[str, str, str, list[dict[str, int]]]] = [
    ("IVF1,RaBitQfs,RFlat", "IVF1,RaBitQfs,RFlat", "IP", _grid(k_factor=(4, 8, 16, 32))),
    ("RaBitQfs,RFlat", "RaBitQfs,RFlat", "IP", _grid(k_factor=(4, 8, 16, 32))),
    ("IVF1024,RaBitQfs,RFlat", "IVF1024,RaBitQfs,RFlat", "IP",
     _grid(k_factor=(8, 32), nprobe=(64, 128, 256, 512))),
    ("IVF1024,RaBitQfs,RFlat (L2)", "IVF1024,RaBitQfs,RFlat", "L2",
     _grid(k_factor=(8, 32), nprobe=(64, 128, 256, 512))),
    ("IVF1024,PQ48,RFlat", "IVF1024,PQ48,RFlat", "IP",
     _grid(k_factor=(8, 32), nprobe=(128, 256, 512))),
    ("HNSW32,RaBitQ,RFlat", "HNSW32,RaBitQ,RFlat", "L2",
     _grid(k_factor=(4, 16), efSearch=(128, 256, 512))),
    ("HNSW32", "HNSW32", "IP", _grid(efSearch=(64, 128, 256, 512, 1024))),
]  # fmt: skip


def scale_prepare(data: Path, rows: int) -> dict[str, Any]:
    """bench_scale's 1M construction from the 200k ``static`` rows of :func:`prepare`: the real
    rows plus :data:`SCALE_COPIES` jittered copies of each (``speed_ann.jitter``), projected into
    the space ``auto`` fits on the real rows; the same real queries; exact truth. Untimed."""
    import faiss

    from benchmarks.ann.speed_ann import jitter, jitter_scale
    from flowsearch.space.fitting import fit_for_index
    from flowsearch.space.search_space import SearchSpace

    src, work = workdir(rows), WORK / f"scale_{rows * (SCALE_COPIES + 1)}"
    if (work / "prepare.json").exists():
        return dict(json.loads((work / "prepare.json").read_text()))
    work.mkdir(parents=True, exist_ok=True)
    faiss.omp_set_num_threads(1)
    U, Uq = np.load(src / "raw.npy"), np.load(src / "raw_q.npy")
    cal, spec = fit_for_index(U, "auto", pooling="static")
    space = SearchSpace(cal, spec)
    scale = jitter_scale(U)
    big = jitter(U, SCALE_COPIES, scale)
    Z = np.lib.format.open_memmap(work / "z.npy", "w+", np.float32, big.shape)
    for start in range(0, len(big), 65_536):
        Z[start : start + 65_536] = space.project(big[start : start + 65_536], want_density=False)[
            0
        ]
    Z.flush()
    del big
    Zq = space.project(Uq, want_density=False)[0]
    np.save(work / "z_q.npy", Zq)
    truth = harness.exact_top(Zq, Z, 10, chunk_rows=65_536)[1]
    np.save(work / "truth.npy", truth)
    out = {
        "rows": int(len(Z)), "real_rows": int(len(U)), "jitter_scale": scale,
        "top10_jittered_share": float((truth >= len(U)).mean()), "calibrator": spec.calibrator,
    }  # fmt: skip
    (work / "prepare.json").write_text(json.dumps(out, indent=1))
    return out


def scale_encode_s(data: Path, rows: int) -> float:
    """Seconds to encode ``rows * (SCALE_COPIES + 1)`` rows with ``static`` here (the corpus's
    texts, each ``SCALE_COPIES + 1`` times), on the threads torch has."""
    import pyarrow.parquet as pq

    from flowsearch.encode.encoder import Encoder

    corpus = workdir(rows) / f"corpus_{rows}.parquet"
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
    enc = Encoder(None, pooling="static")
    enc.encode(texts[:512], batch_size=256, progress=False)  # warm-up: model load, caches
    t = time.perf_counter()
    for _ in range(SCALE_COPIES + 1):
        enc.encode(texts, batch_size=256, progress=False)
    return time.perf_counter() - t


def _threads(n: int) -> None:
    """FAISS's and torch's threads (the tokenizer's are set by ``main``, before it starts)."""
    import faiss
    import torch

    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


def _scale_rows(data: Path, rows: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray]:
    """The 1M stages' common start: :data:`THREADS` torch and FAISS threads, the prepared rows
    (:func:`scale_prepare`): its record, the searched vectors in RAM, the queries, the truth."""
    prep = scale_prepare(data, rows)
    work = WORK / f"scale_{prep['rows']}"
    _threads(THREADS)
    Z = np.ascontiguousarray(np.load(work / "z.npy", mmap_mode="r"))
    return prep, Z, np.load(work / "z_q.npy"), np.load(work / "truth.npy")


def scale(data: Path, rows: int, only: str | None, before: dict[str, Any] | None) -> dict[str, Any]:
    """The best structures of the study at 1M rows (:func:`scale_prepare`), built and searched
    on one thread, beside ``static`` encoding of as many rows on the same thread."""
    import faiss

    prep, Z, Zq, truth = _scale_rows(data, rows)
    out = dict(before or {})
    out["prepare"] = prep
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    if "encode_s" not in out or not only:
        out["encode_s"] = scale_encode_s(data, rows)
        flat = faiss.IndexFlatIP(Z.shape[1])
        flat.add(Z)
        out["flat_p50_ms"] = _single_ms(flat, Zq[lat])
        del flat
        print(json.dumps({"encode_s": out["encode_s"], "flat": out["flat_p50_ms"]}), flush=True)
    chosen = set(only.split(";")) if only else {s[0] for s in SCALE_STRUCTURES}
    results = [r for r in out.get("curves", []) if r["structure"] not in chosen]
    for label, factory, metric, points in SCALE_STRUCTURES:
        if label not in chosen:
            continue
        index, build_s = _build(factory, Z, metric)
        row = {"structure": label, "space": "searched", "build_s": build_s,
               "build_x_encode": build_s / out["encode_s"]}  # fmt: skip
        results += _curve(index, Zq, truth, lat, out["flat_p50_ms"], points, row)
        del index
    out["curves"] = results
    out["load_end"] = harness.load_average()
    return out


EF_1M = (128, 256, 512, 1024, 2048)
#: (label, factory, metric, knob points): graphs whose build might fit issue 30's 1M budget
#: (<= 3x encoding the rows with ``static``), cheapest build first. ``_SQ8``: the graph's
#: vectors as 8-bit scalar codes (a quarter of the bytes each build distance reads); ``,RFlat``:
#: the candidates re-ranked exactly (``k_factor`` 1: the graph's own top 10 re-scored).
GRAPH_STRUCTURES: list[tuple[str, str, str, list[dict[str, int]]]] = [
    ("HNSW16_SQ8,RFlat efC40", "HNSW16_SQ8,RFlat@efC40", "IP",
     _grid(k_factor=(1, 4), efSearch=EF_1M)),
    ("HNSW16 efC40", "HNSW16@efC40", "IP", _grid(efSearch=EF_1M)),
    ("HNSW32_SQ8,RFlat efC40", "HNSW32_SQ8,RFlat@efC40", "IP",
     _grid(k_factor=(1, 4), efSearch=EF_1M)),
    ("HNSW24 efC40", "HNSW24@efC40", "IP", _grid(efSearch=EF_1M)),
    ("HNSW16 efC80", "HNSW16@efC80", "IP", _grid(efSearch=EF_1M)),
    ("HNSW16_SQ8,RFlat efC80", "HNSW16_SQ8,RFlat@efC80", "IP",
     _grid(k_factor=(1, 4), efSearch=EF_1M)),
    ("HNSW32 efC40", "HNSW32@efC40", "IP", _grid(efSearch=EF_1M)),
    ("HNSW32 efC40 over PCA192", "HNSW32@efC40@PCA192", "IP", _grid(efSearch=EF_1M)),
    ("HNSW32 efC40 over PCA128", "HNSW32@efC40@PCA128", "IP", _grid(efSearch=EF_1M)),
    ("HNSW32 efC40 over PCA256", "HNSW32@efC40@PCA256", "IP", _grid(efSearch=EF_1M)),
    ("HNSW32 efC24 over PCA192", "HNSW32@efC24@PCA192", "IP", _grid(efSearch=EF_1M)),
    ("HNSW32 efC32 over PCA192", "HNSW32@efC32@PCA192", "IP", _grid(efSearch=EF_1M)),
    ("HNSW32 efC28 over PCA128", "HNSW32@efC28@PCA128", "IP",
     _grid(efSearch=(256, 512, 768, 1024, 2048))),
]  # fmt: skip
#: The product's projected graph (``flowsearch.ann.build.ProjectedGraph``: the components of
#: the rows' second moments) around the study's closest point (the rows above labelled "over
#: PCA" came from the study's own copy, a PCA centred on the rows' mean).
EF_PROJECTED = (512, 768, 1024, 1280)
GRAPH_STRUCTURES += [
    (f"projected HNSW{m} efC{ef} PCA{dims}", f"HNSW{m}@efC{ef}@PCA{dims}", "IP",
     _grid(efSearch=EF_PROJECTED))
    for m, ef, dims in ((32, 28, 128), (32, 24, 128), (32, 32, 128), (32, 28, 96), (32, 32, 96),
                        (32, 36, 96), (24, 36, 128), (24, 32, 96))
]  # fmt: skip


def _p50_ms(index: Any, q: np.ndarray, repeats: int = 2) -> float:
    """Single-query p50 (ms) over ``repeats`` passes of ``q`` (each after its warm-up), the
    passes' timings pooled."""
    for i in range(min(10, len(q))):
        index.search(q[i : i + 1], 10)
    times = []
    for _ in range(repeats):
        for i in range(len(q)):
            t = time.perf_counter()
            index.search(q[i : i + 1], 10)
            times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000)


def graph_scale(
    data: Path,
    rows: int,
    only: str | None,
    before: dict[str, Any] | None,
    save: Any,
    limit_x: float = 5.0,
    tag: str = "",
) -> dict[str, Any]:
    """:data:`GRAPH_STRUCTURES` at 1M rows (:func:`scale_prepare`), each run measuring, on
    the same core and thread, encoding 1M rows with ``static`` (at its start and its end),
    ``Flat``'s p50 and each structure's build (time-boxed at ``limit_x`` times the encoding:
    a build past it stops and is recorded with the rows it had added) and curve. ``save``
    publishes the report after each structure. Runs of other structures are kept
    (``before``); each row carries its run's encoding and ``Flat`` figures. ``tag``: added to
    this run's labels (a repeat kept beside the earlier run's rows)."""
    import faiss

    prep, Z, Zq, truth = _scale_rows(data, rows)
    out = dict(before or {})
    out["prepare"] = prep
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    # glibc's malloc asked for transparent huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1):
    # FAISS's vectors and graph then sit on 2 MB pages (fewer TLB misses in a graph's random
    # reads); such a run's structures are labelled apart
    huge = "hugetlb=1" in os.environ.get("GLIBC_TUNABLES", "")
    run: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "build_limit_x": limit_x,
        "huge_pages": huge, "threads": THREADS,
    }  # fmt: skip
    run["encode_s"] = [scale_encode_s(data, rows)]
    _threads(1)
    flat = faiss.IndexFlatIP(Z.shape[1])
    flat.add(Z)
    run["flat_p50_ms"] = _p50_ms(flat, Zq[lat], repeats=1)  # 142 ms a query: steady
    del flat
    run["load_start"] = harness.load_average()
    out["runs"] = [*out.get("runs", []), run]  # saved with each structure, completed at the end
    print(json.dumps(run), flush=True)
    chosen = set(only.split(";")) if only else {s[0] for s in GRAPH_STRUCTURES}
    curves, stopped = list(out.get("curves", [])), list(out.get("stopped", []))
    encode_s = run["encode_s"][0]
    for label, factory, metric, points in GRAPH_STRUCTURES:
        if label not in chosen:
            continue
        label += ", huge pages" if huge else ""
        label += f", {THREADS} threads" if THREADS > 1 else ""
        label += f", {tag}" if tag else ""
        curves = [r for r in curves if r["structure"] != label]
        stopped = [r for r in stopped if r["structure"] != label]
        _threads(THREADS)
        index, build_s, added = _build_within(factory, Z, metric, limit_x * encode_s)
        _threads(1)
        row = {"structure": label, "space": "searched", "build_s": build_s,
               "build_x_encode": build_s / encode_s, "encode_s": encode_s,
               "flat_p50_ms": run["flat_p50_ms"], "run": run["started"]}  # fmt: skip
        if added < len(Z):
            stopped.append({**row, "rows_added": added, "load": harness.load_average()[0]})
            print(json.dumps(stopped[-1]), flush=True)
        else:
            curve = _curve(index, Zq, truth, lat, run["flat_p50_ms"], points, row)
            curves += curve
        del index
        out.update(curves=curves, stopped=stopped)
        save(out)
    _threads(THREADS)
    run["encode_s"].append(scale_encode_s(data, rows))
    run["load_end"] = harness.load_average()
    print(json.dumps(run), flush=True)
    return out


def _settings_used() -> dict[str, Any]:
    """The settings that decide a 1M segment's graph (as in force: ``--set`` included)."""

    from flowsearch.ann import tune as ann_tune

    p = POLICY
    return {"graph_factory": p.graph_factory, "hnsw_ef_construction": p.ef_construction,
            "max_ef_search": p.max_ef_search, "target_recall": p.target_recall,
            "query_noise": ann_tune.QUERY_NOISE}  # fmt: skip


def _distinct_rows(
    data: Path, rows: int, n_queries: int
) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_scale_rows` for ``rows`` distinct texts (:func:`prepare`'s corpus, every row a
    text of its own) instead of the jittered copies: the record, vectors, queries, truth."""
    prep = prepare(data, rows, n_queries)
    work = workdir(rows)
    _threads(THREADS)
    Z = np.ascontiguousarray(np.load(work / "z.npy", mmap_mode="r"))
    Zq = np.load(work / "z_q.npy")
    truth_path = work / "truth.npy"
    if not truth_path.exists():
        np.save(truth_path, harness.exact_top(Zq, Z, 10, chunk_rows=65_536)[1])
    return prep, Z, Zq, np.load(truth_path)


_MAKERS: dict[tuple[int, str], Any] = {}


def text_queries(rows: int, pooling: str = "static") -> Any:
    """The tuner study's text probes for :func:`prepare`'s ``rows`` rows: row positions (int64
    (q,)) -> float32 (q, d) unit queries, each part of the row's text
    (:func:`benchmarks.common.corpora.partial_text`, seeded per call) embedded as a query is,
    with ``pooling``'s encoder and the calibrator :func:`prepare` fitted (fitted again on the
    same raw rows: the same space). Kept per process."""
    if (rows, pooling) in _MAKERS:
        return _MAKERS[rows, pooling]
    import pyarrow.parquet as pq

    from benchmarks.common.corpora import partial_text
    from flowsearch.encode.encoder import Encoder
    from flowsearch.space.fitting import fit_for_index
    from flowsearch.space.search_space import SearchSpace

    work = workdir(rows, pooling)
    texts = pq.read_table(work / f"corpus_{rows}.parquet", columns=["text"])
    texts = texts.column("text").to_pylist()
    raw = np.ascontiguousarray(np.load(work / "raw.npy", mmap_mode="r"))
    cal, spec = fit_for_index(raw, "auto", pooling=pooling)
    del raw
    space = SearchSpace(cal, spec, Encoder(None, pooling=pooling))

    def make(at: np.ndarray) -> np.ndarray:
        rng = np.random.default_rng(0)
        q = space.embed([partial_text(texts[int(i)] or "", rng) for i in at])[0]
        q = np.asarray(q, dtype=np.float32)
        return q / (np.linalg.norm(q, axis=1, keepdims=True) + 1e-12)

    _MAKERS[rows, pooling] = make
    return make


def distinct_encode_s(rows: int) -> float:
    """Seconds to encode :func:`prepare`'s ``rows`` distinct texts with ``static`` here, on the
    threads torch has (after a warm-up)."""
    import pyarrow.parquet as pq

    from flowsearch.encode.encoder import Encoder

    texts = pq.read_table(workdir(rows) / f"corpus_{rows}.parquet", columns=["text"])
    texts = texts.column("text").to_pylist()
    enc = Encoder(None, pooling="static")
    enc.encode(texts[:512], batch_size=256, progress=False)
    t = time.perf_counter()
    enc.encode(texts, batch_size=256, progress=False)
    return time.perf_counter() - t


def scale_tune(
    data: Path, rows: int, distinct: bool = False, n_queries: int = 2_000, user: bool = False
) -> dict[str, Any]:
    """What ``auto`` does with one segment of the 1M rows (:func:`scale_prepare`'s jittered
    copies, or with ``distinct`` :func:`prepare`'s ``rows`` distinct texts), on
    :data:`THREADS` threads: its index made as a segment's is
    (:func:`flowsearch.ann.build.segment_index` under the run's policy; trained, chunked adds),
    then tuned as a segment is (4,096 rows sampled, held-out queries; a graph short of its
    target searched exactly, as the product stores it); then real queries at the knob chosen
    (searches on one thread). Encoding the rows with ``static`` and ``Flat``'s p50 are
    measured in the same run (encoding before and after). With ``user``, the tuner is given a
    seeded half of the real queries as the users' own (``compact(tune_queries=...)``) and the
    recall and speed are measured on the other half only."""
    import faiss

    from flowsearch.ann import build as ann_build
    from flowsearch.ann import tune as ann_tune

    if distinct:
        prep, Z, Zq, truth = _distinct_rows(data, rows, n_queries)
        encode_s = lambda: distinct_encode_s(rows)  # noqa: E731
    else:
        prep, Z, Zq, truth = _scale_rows(data, rows)
        encode_s = lambda: scale_encode_s(data, rows)  # noqa: E731
    given, half = None, len(Zq) // 2  # the real queries: questions, then partial sentences
    if user:  # a seeded half tunes (the users' log), the other half is measured
        order = np.random.default_rng(11).permutation(len(Zq))
        tuning_half, measured = order[: len(Zq) // 2], np.sort(order[len(Zq) // 2 :])
        half = int((measured < half).sum())  # the measured questions, first
        given, Zq, truth = Zq[tuning_half], Zq[measured], truth[measured]
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    out: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "threads": THREADS, "settings": _settings_used(),
                           "rows": "distinct texts" if distinct else "jittered copies",
                           "tuned_on": "real queries" if user else "held-out rows",
                           "n_rows": len(Z)}  # fmt: skip
    out["encode_s"] = [encode_s()]
    _threads(1)
    flat = faiss.IndexFlatIP(Z.shape[1])
    flat.add(Z)
    out["flat_p50_ms"] = _p50_ms(flat, Zq[lat], repeats=1)
    del flat
    out["load_start"] = harness.load_average()
    _threads(THREADS)
    t = time.perf_counter()  # as a segment's build: segment_index, train, chunked adds
    building, factory = ann_build.segment_index(Z.shape[1], "auto", len(Z), None, POLICY)
    projection = None  # the projected graph left the package
    ann_build.train(building, Z, factory)
    for start in range(0, len(Z), 65_536):
        ann_build.add(building, Z[start : start + 65_536], factory)
    index = building
    del building
    out["build_s"] = time.perf_counter() - t
    rng = np.random.default_rng(0)
    pos = np.sort(rng.choice(len(Z), size=4096, replace=False))
    chunks = lambda: (Z[i : i + 65_536] for i in range(0, len(Z), 65_536))  # noqa: E731
    t = time.perf_counter()
    tuned = ann_tune.tune(index, Z[pos], chunks, sample_rows=pos, policy=POLICY,
                          queries=given)  # fmt: skip
    graph = faiss.downcast_index(index)
    built = index
    if tuned.exact:  # the product stores such a segment exactly (its graph's own vectors)
        index = ann_tune.exact_index(index)
    out["tune_s"] = time.perf_counter() - t
    out["exact"] = tuned.exact
    _threads(1)
    found = index.search(Zq, 10)[1]
    ms = _p50_ms(index, Zq[lat])
    out.update({
        "factory": factory, "params": tuned.params,
        "ef_construction": int(graph.hnsw.efConstruction) if hasattr(graph, "hnsw") else None,
        "projection": None if projection is None else {
            "dims": projection.dims, "ef_construction": projection.ef_construction,
            "sample_rows": projection.sample_rows},
        "tuning": {"recall": tuned.recall, "tuned_recall": tuned.tuned_recall,
                   "queries": tuned.queries},
        "real_recall": harness.recall(found, truth),
        "real_recall_questions": harness.recall(found[:half], truth[:half]),
        "real_recall_partial": harness.recall(found[half:], truth[half:]),
        "p50_ms": ms, "speedup": out["flat_p50_ms"] / ms,
    })  # fmt: skip
    if distinct and hasattr(graph, "hnsw") and not user:  # the graph's curve
        out["curve"] = _efsearch_curve(built, Z, Zq, truth, lat, pos, out["flat_p50_ms"], rows)
    del index, graph, built
    _threads(THREADS)
    out["encode_s"].append(encode_s())
    mean_encode = float(np.mean(out["encode_s"]))
    out["build_x_encode"] = out["build_s"] / mean_encode
    out["build_tune_x_encode"] = (out["build_s"] + out["tune_s"]) / mean_encode
    out["load_end"] = harness.load_average()
    print(json.dumps(out), flush=True)
    return out


#: ``efSearch`` values and probe noises of :func:`_efsearch_curve`.
EF_CURVE = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)
CURVE_NOISES = (0.8, 1.0, 1.2, 2.0)


def _efsearch_curve(
    index: Any,
    Z: np.ndarray,
    Zq: np.ndarray,
    truth: np.ndarray,
    lat: np.ndarray,
    pos: np.ndarray,
    flat_ms: float,
    rows: int,
) -> list[dict[str, Any]]:
    """Per ``efSearch`` of :data:`EF_CURVE`: real queries' recall@10, single-query p50 and its
    speed-up on ``Flat``, beside the recall of the tuner's probes (512 held-out rows of the
    tuning sample ``pos`` moved by each noise of :data:`CURVE_NOISES`, their own rows left out;
    and at the tuner's noise with their own rows kept, its easier variant; and partial texts of
    512 held-out rows, :func:`text_queries`): which probes are as hard as real queries at this
    size. One thread."""
    import faiss

    from flowsearch.ann import tune as ann_tune

    probes = {}
    for noise in CURVE_NOISES:
        q, pick = ann_tune.held_out_queries(Z[pos], 512, noise=noise, seed=1)
        src = pos[pick]
        tr = ann_tune._drop_source(harness.exact_top(q, Z, 11, chunk_rows=65_536)[1], src, 10)
        probes[noise] = (q, src, tr)
    # the tuner's easier variant: each probe's own row kept in the index and the truth
    kept_q, _ = ann_tune.held_out_queries(Z[pos], 512, noise=ann_tune.QUERY_NOISE, seed=1)
    kept_truth = harness.exact_top(kept_q, Z, 10, chunk_rows=65_536)[1]
    pick = np.random.default_rng(1).choice(len(pos), size=512, replace=False)
    text_q = text_queries(rows)(pos[pick])
    text_truth = ann_tune._drop_source(
        harness.exact_top(text_q, Z, 11, chunk_rows=65_536)[1], pos[pick], 10
    )
    inner = faiss.downcast_index(index)
    rows = []
    for ef in EF_CURVE:
        inner.hnsw.efSearch = ef
        row: dict[str, Any] = {"efSearch": ef,
                               "real": harness.recall(index.search(Zq, 10)[1], truth)}  # fmt: skip
        row["p50_ms"] = _p50_ms(index, Zq[lat], repeats=1)
        row["speedup"] = flat_ms / row["p50_ms"]
        for noise, (q, src, tr) in probes.items():
            found = ann_tune._drop_source(index.search(q, 11)[1], src, 10)
            row[f"noise {noise:g}"] = harness.recall(found, tr)
        row[f"noise {ann_tune.QUERY_NOISE:g}, own row kept"] = harness.recall(
            index.search(kept_q, 10)[1], kept_truth
        )
        found = ann_tune._drop_source(index.search(text_q, 11)[1], pos[pick], 10)
        row["partial texts"] = harness.recall(found, text_truth)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


NOISES = (0.0, 0.5, 0.8, 1.0, 1.2)
EFS = (16, 32, 64, 128, 256, 512)


def tune(
    rows: int, factory: str | None = None, curves: bool = True, work: Path | None = None
) -> dict[str, Any]:
    """``auto``'s index over the searched vectors and its tuner; then real queries at the knob
    it chose, and, knob by knob, recall of real queries beside the tuner's held-out queries at
    several noise norms (which noise makes the tuner's queries as hard as real ones).
    ``work``: the stages' folder (default: ``rows`` rows of ``static``)."""
    import faiss

    from flowsearch.ann import build as ann_build
    from flowsearch.ann import tune as ann_tune
    from flowsearch.ann.factory import auto_factory

    work = work or WORK / str(rows)
    Z, Zq = np.load(work / "z.npy"), np.load(work / "z_q.npy")
    truth = _truth(Zq, Z)
    faiss.omp_set_num_threads(THREADS)  # the build on --threads (1 by default)
    factory = factory or auto_factory(len(Z), POLICY, dim=Z.shape[1])
    t = time.perf_counter()  # built as a segment's index is (Settings' graph and its build)
    building, _ = ann_build.segment_index(Z.shape[1], "auto", len(Z), factory, POLICY)
    projection = None  # the projected graph left the package
    ann_build.train(building, Z, factory)
    ann_build.add(building, Z, factory)
    index = building
    del building
    build_s = time.perf_counter() - t
    faiss.omp_set_num_threads(1)  # tuning and queries on one thread
    rng = np.random.default_rng(0)
    pos = np.sort(rng.choice(len(Z), size=min(4096, len(Z)), replace=False))
    chunks = lambda: (Z[i : i + 65_536] for i in range(0, len(Z), 65_536))  # noqa: E731
    t = time.perf_counter()
    tuned = ann_tune.tune(index, Z[pos], chunks, sample_rows=pos)
    tune_s = time.perf_counter() - t
    found = index.search(Zq, 10)[1]
    half = len(Zq) // 2
    faiss.omp_set_num_threads(1)
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    flat = faiss.IndexFlatIP(Z.shape[1])
    flat.add(Z)
    flat_ms = _single_ms(flat, Zq[lat])
    ms = _single_ms(index, Zq[lat])
    faiss.omp_set_num_threads(1)
    knob = ann_tune.search_knob(index)
    curves: list[dict[str, Any]] = []
    if curves and knob is not None and knob[0] == "efSearch":
        probes = {}
        for noise in NOISES:
            q, pick = ann_tune.held_out_queries(Z[pos], 1024, noise=noise, seed=1)
            src = pos[pick]
            tr = ann_tune._drop_source(harness.exact_top(q, Z, 11)[1], src, 10)
            probes[noise] = (q, src, tr)
        for ef in EFS:
            faiss.downcast_index(index).hnsw.efSearch = ef
            row: dict[str, Any] = {
                "efSearch": ef,
                "real": harness.recall(index.search(Zq, 10)[1], truth),
            }
            for noise, (q, src, tr) in probes.items():
                f = ann_tune._drop_source(index.search(q, 11)[1], src, 10)
                row[f"noise {noise:g}"] = harness.recall(f, tr)
            curves.append(row)
            print(json.dumps(row), flush=True)
    return {
        "factory": factory,
        "projection": None if projection is None else projection.__dict__,
        "params": tuned.params,
        "build_s": build_s,
        "build_threads": THREADS,
        "tune_s": tune_s,
        "noise": ann_tune.QUERY_NOISE,
        "tuning": {
            "recall": tuned.recall,
            "tuned_recall": tuned.tuned_recall,
            "queries": tuned.queries,
        },
        "real_recall": harness.recall(found, truth),
        "real_recall_questions": harness.recall(found[:half], truth[:half]),
        "real_recall_partial": harness.recall(found[half:], truth[half:]),
        "p50_ms": ms,
        "flat_p50_ms": flat_ms,
        "speedup": flat_ms / ms,
        "noise_curves": curves,
    }


def segments(rows: int, n_segments: int = 10) -> dict[str, Any]:
    """The FAISS part of a dense query over ``n_segments`` equal segments (contiguous slices of
    the rows) against one segment: each segment indexed as ``auto`` indexes it (by its size)
    and, beside it, exactly (``Flat``); a query searches every segment for its top 10 and
    keeps the best 10 (as the searcher merges segments). p50 of one query at a time on one
    FAISS thread (builds too, tuning included); recall@10 against exact search over all rows,
    real queries."""
    import faiss

    from flowsearch.ann import build as ann_build

    work = WORK / str(rows)
    Z, Zq = np.load(work / "z.npy"), np.load(work / "z_q.npy")
    truth = _truth(Zq, Z)
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    bounds = np.linspace(0, len(Z), n_segments + 1).astype(int)
    faiss.omp_set_num_threads(1)
    t = time.perf_counter()
    one, one_factory, one_params = ann_build.build(
        Z, "auto", POLICY
    )  # one segment, as auto builds it
    one_build_s = time.perf_counter() - t
    families: dict[str, list[tuple[Any, int]]] = {}
    built: dict[str, Any] = {}
    for family in ("auto", "Flat"):
        t = time.perf_counter()
        idx, chosen, factory = [], set(), ""
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            index, factory, params = ann_build.build(Z[lo:hi], family, POLICY)
            idx.append((index, int(lo)))
            chosen.add(params)
        built[family] = {
            "build_s": time.perf_counter() - t, "factory": factory, "params": sorted(chosen)
        }  # fmt: skip
        families[family] = idx

    def search_all(idx: list[tuple[Any, int]], q: np.ndarray) -> np.ndarray:
        heap = faiss.ResultHeap(len(q), 10, keep_max=True)
        for index, lo in idx:
            d, i = index.search(q, 10)
            heap.add_result(d, np.where(i >= 0, i + lo, -1))
        heap.finalize()
        return np.asarray(heap.I)

    faiss.omp_set_num_threads(1)
    out: dict[str, Any] = {"segments": n_segments, "rows_per_segment": int(bounds[1])}
    one_ms = _single_ms(one, Zq[lat])
    out["one"] = {
        "factory": one_factory, "params": one_params, "build_s": one_build_s, "p50_ms": one_ms,
        "recall": harness.recall(one.search(Zq, 10)[1], truth),
    }  # fmt: skip
    for family, idx in families.items():
        times = []
        for i in lat:
            t = time.perf_counter()
            search_all(idx, Zq[i : i + 1])
            times.append(time.perf_counter() - t)
        ms = float(np.median(times) * 1000)
        out[family] = {
            **built[family], "p50_ms": ms, "ratio": ms / one_ms,
            "recall": harness.recall(search_all(idx, Zq), truth),
        }  # fmt: skip
        print(json.dumps(out[family]), flush=True)
    out["load"] = harness.load_average()
    return out


def _curves_table(curves: list[dict[str, Any]], encode: bool = False) -> list[str]:
    """One row per knob point: recall, p50, QPS, speed-up on ``Flat``, build, load."""
    head = "| structure | space | knob | recall@10 (questions / partial) | p50 ms | QPS | x Flat "
    head += "| build s | build / encode | load |" if encode else "| build s | load |"
    rows = [head, "|---|---|---|---|---:|---:|---:|---:|" + ("---:|---:|" if encode else "---:|")]
    for r in curves:
        cells = [
            r["structure"], r["space"], r["knob"],
            f"{r['recall']:.3f} ({r['recall_questions']:.3f} / {r['recall_partial']:.3f})",
            f"{r['p50_ms']:.2f}", f"{1000 / r['p50_ms']:.0f}", f"{r['speedup']:.1f}",
            f"{r['build_s']:.0f}",
        ]  # fmt: skip
        if encode:
            cells.append(f"{r['build_x_encode']:.2f}")
        cells.append(f"{r['load']:.1f}")
        rows.append("| " + " | ".join(cells) + " |")
    return [*rows, ""]


def _best(curves: list[dict[str, Any]], structure: str, target: float) -> dict[str, Any] | None:
    """The fastest knob point of ``structure`` whose recall reaches ``target``."""
    ok = [r for r in curves if r["structure"] == structure and r["recall"] >= target]
    return min(ok, key=lambda r: r["p50_ms"]) if ok else None


def _graph_section(g: dict[str, Any] | None) -> list[str]:
    """The 1M graph-build study (:func:`graph_scale`): runs, a verdict per structure against
    issue 30's 1M goal, the curves."""
    if not g or not (g.get("curves") or g.get("stopped")):
        return []
    body = [
        "### 1M rows: graphs against the build budget (one thread: encoding, builds, queries)",
        "",
        "The 1M rows above; each run measured on one core (`taskset -c 1`, one FAISS and one "
        "torch thread), in this order: encoding 1M rows with `static`, `Flat`'s p50, then "
        "each structure's build (stopped past the run's limit, in multiples of its encoding, "
        "once a chunk of 65,536 rows ends past it) and its curve (p50: 300 "
        "queries twice after a 10-query warm-up, pooled), then the encoding again. Goal: "
        ">= 20x `Flat` at recall@10 >= 0.95 (2,000 real queries) with the build <= 3x the "
        "encoding. Runs:",
        "",
    ]
    listed = {r["started"] for r in g.get("runs", [])}
    for r in g.get("curves", []) + g.get("stopped", []):  # runs from before runs were kept
        if r["run"] not in listed:
            listed.add(r["run"])
            body.append(
                f"- {r['run']}: encoding {r['encode_s']:.1f} s; `Flat` p50 "
                f"{r['flat_p50_ms']:.1f} ms (stopped by hand after its last curve)"
            )
    for r in g.get("runs", []):
        enc = " then ".join(f"{e:.1f} s" for e in r["encode_s"])
        enc += "" if len(r["encode_s"]) > 1 else " (stopped by hand before the second)"
        body.append(
            f"- {r['started']}{' (huge pages)' if r.get('huge_pages') else ''}: "
            f"encoding {enc}; build limit {r['build_limit_x']:g}x; `Flat` p50 "
            f"{r['flat_p50_ms']:.1f} ms; load {r['load_start']} at the start"
            + (f", {r['load_end']} at the end" if r.get("load_end") else "")
        )
    body += ["", "| structure | build s | build / encode | fastest point at recall >= 0.95 "
             "| p50 ms | x Flat | best recall at >= 20x | goal met |",
             "|---|---:|---:|---|---:|---:|---|---|"]  # fmt: skip
    seen: list[str] = []
    for r in g.get("curves", []):
        if r["structure"] in seen:
            continue
        seen.append(r["structure"])
        b = _best(g["curves"], r["structure"], 0.95)
        met = b is not None and b["speedup"] >= 20 and r["build_x_encode"] <= 3
        point = f"{b['knob']}: {b['recall']:.3f}" if b else "none (max " + (
            f"{max(x['recall'] for x in g['curves'] if x['structure'] == r['structure']):.3f})"
        )  # fmt: skip
        fast = [x for x in g["curves"] if x["structure"] == r["structure"] and x["speedup"] >= 20]
        top = max(fast, key=lambda x: x["recall"]) if fast else None
        body.append(
            f"| {r['structure']} | {r['build_s']:.0f} | {r['build_x_encode']:.2f} | {point} | "
            + (f"{b['p50_ms']:.2f} | {b['speedup']:.1f}" if b else "- | -")
            + (f" | {top['recall']:.3f} ({top['knob']})" if top else " | -")
            + f" | {'**yes**' if met else 'no'} |"
        )
    for r in g.get("stopped", []):
        body.append(
            f"| {r['structure']} | > {r['build_s']:.0f} (stopped: {r['rows_added']:,} of 1M "
            f"rows added) | > {r['build_x_encode']:.2f} | - | - | - | - | no |"
        )
    body.append("")
    if g.get("curves"):
        body += ["Curves:", "", *_curves_table(g["curves"], encode=True)]
    return body


def _scale_tunes(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Every :func:`scale_tune` run kept (the first was kept alone under ``scale_tune``)."""
    return list(out.get("scale_tunes") or ([out["scale_tune"]] if out.get("scale_tune") else []))


def _scale_tune_section(runs: list[dict[str, Any]]) -> list[str]:
    """``auto`` on one 1M-row segment (:func:`scale_tune`), one row per run."""
    if not runs:
        return []
    body = [
        "### `auto` on one segment of the 1M rows (encoding, build, tuning on the run's threads; "
        "queries on one)",
        "",
        "`auto`'s index for the 1M rows made as a segment's is "
        "(`flowsearch.ann.build.segment_index`, trained, chunked adds, finished), tuned by its "
        "own tuner (`flowsearch.ann.build.tune`: 4,096 rows sampled, held-out rows + noise, half "
        "to choose the knob, half to check it, the knob capped at `AnnPolicy.max_ef_search`), "
        "then the 2,000 real queries at the knob it chose. Encoding 1M rows with `static` before "
        "and after the build, on the same threads; build / encode is against their mean.",
        "",
        "| run | threads | graph | encoding s | build s | tuning s | build / encode | "
        "(build + tuning) / encode | knob chosen | recall@10 tuning half / recorded (check half) "
        "| recall@10 real queries (questions / partial) | p50 ms | `Flat` p50 ms | x Flat |",
        "|---|---:|---|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for t in runs:
        pr = t.get("projection")
        graph = f"`{t['factory']}`, efConstruction {t['ef_construction']}"
        if t.get("rows") == "distinct texts":
            graph += ", distinct texts"
        if t.get("n_rows", 1_000_000) != 1_000_000:
            graph += f" ({t['n_rows']:,} rows, not 1M)"
        if t.get("exact"):
            graph += " (short of the target: searched exactly)"
        if t.get("tuned_on") == "real queries":
            graph += "; tuned on half the real queries (`--user-queries`), measured on the rest"
        if t.get("note"):
            graph += f" ({t['note']})"
        if pr:
            graph = (
                f"`{t['factory']}` over {pr['dims']} principal components, efConstruction "
                f"{pr['ef_construction']}"
            )
        body.append(
            f"| {t['started']} (load {t['load_start'][0]:.1f} / {t['load_end'][0]:.1f}) | "
            f"{t.get('threads', 1)} | {graph} | "
            + " then ".join(f"{e:.1f}" for e in t["encode_s"])
            + f" | {t['build_s']:.0f} | {t['tune_s']:.0f} | {t['build_x_encode']:.2f} | "
            f"{t['build_tune_x_encode']:.2f} | `{t['params']}` | "
            f"{t['tuning']['tuned_recall']:.3f} / {t['tuning']['recall']:.3f} | "
            f"**{t['real_recall']:.3f}** ({t['real_recall_questions']:.3f} / "
            f"{t['real_recall_partial']:.3f}) | {t['p50_ms']:.2f} | {t['flat_p50_ms']:.1f} | "
            f"**{t['speedup']:.1f}x** |"
        )
    body.append("")
    for t in runs:
        if t.get("curve"):
            body += _curve_section(t)
    return body


def _curve_section(t: dict[str, Any]) -> list[str]:
    """One :func:`scale_tune` run's efSearch curve (:func:`_efsearch_curve`)."""
    noises = [k for k in t["curve"][0] if k.startswith(("noise ", "partial texts"))]
    intro = (
        f"The graph of the {t['started']} run (efConstruction {t['ef_construction']}, "
        f"{t.get('rows', 'jittered copies')}), knob by knob: real queries' recall@10, p50 and "
        "speed-up on `Flat`, beside the recall of the tuner's probes (512 held-out rows moved "
        "by noise of each norm"
        + (
            "; and partial texts of 512 held-out rows"
            if any(n.startswith("partial") for n in noises)
            else ""
        )  # fmt: skip
        + "):"
    )
    columns = ["efSearch", "recall@10 real", "p50 ms", "x Flat", *(f"probes, {n}" for n in noises)]
    body = ([r["efSearch"], f"{r['real']:.3f}", f"{r['p50_ms']:.2f}", f"{r['speedup']:.1f}",
             *(f"{r[n]:.3f}" for n in noises)] for r in t["curve"])  # fmt: skip
    return [intro, "", *tables.table(columns, body, "r" * len(columns))]


def _study_keys(out: dict[str, Any], pooling: str, rows: int) -> tuple[str, str]:
    """``(study key, prepare key)`` of a study of ``rows`` rows encoded with ``pooling``: one
    pair per row count, so that a run at another size does not replace (or merge its curves
    into) another size's. ``static``: ``study`` / ``prepare_static``; other poolings
    ``study_<pooling>_<rows>``, except the first such run (``mean`` at 50,000 rows), kept
    under ``study_<pooling>`` / ``prepare_<pooling>``."""
    if pooling == "static":
        return "study", "prepare_static"
    if out.get(f"study_{pooling}", {}).get("rows") in (None, rows):
        return f"study_{pooling}", f"prepare_{pooling}"
    return f"study_{pooling}_{rows}", f"prepare_{pooling}_{rows}"


def _pooled_studies(out: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(study, prepare)`` of each study of a pooling other than ``static``, smallest first."""
    pairs = [
        (v, out.get("prepare_" + k.removeprefix("study_"), {}))
        for k, v in out.items()
        if k.startswith("study_") and isinstance(v, dict) and "curves" in v
    ]
    return sorted(pairs, key=lambda p: (p[1].get("pooling", ""), p[0]["rows"]))


def _pooled_section(m: dict[str, Any], pm: dict[str, Any]) -> list[str]:
    """One study of :func:`_pooled_studies`: how its rows were encoded, ``auto``'s choices
    for them, ``Flat``, the curves."""
    pooling = pm.get("pooling", "mean")
    why = (
        f" (why not 200k: that is ~{4 * pm.get('encode_s', float('nan')) / 60:.0f} min more of "
        "the timed core)"
        if m["rows"] < 200_000
        else ""
    )
    chosen = (
        f"; `auto`'s index at this size: `{m['auto_factory']}`" if m.get("auto_factory") else ""
    )
    if m.get("auto_factory") == "HNSW32":
        chosen += " (built at `Settings`' `efConstruction` 80: the `HNSW32 efConstruction 80` rows)"
    body = [
        f"### The same at {m['rows']:,} rows, `{pooling}` pooling (one thread)",
        "",
        f"`{pooling}` (the bundled model's transformer pooling) encoded {m['rows']:,} rows of "
        f"the same kind of corpus in {pm.get('encode_s', float('nan')):.0f} s on one core{why}; "
        f"calibrator `{pm.get('calibrator')}` ({pm.get('space')}){chosen}. "
        f"`Flat` p50 **{m['flat_p50_ms']:.2f} ms**.",
        "",
        *_curves_table(m["curves"]),
    ]
    t = m.get("tune")
    if t:
        body += [
            f"`auto`'s tuner on its `{t['factory']}` over these rows (built {t['build_s']:.0f} s, "
            f"tuned {t['tune_s']:.0f} s, one thread; held-out rows + noise {t['noise']:g}) chose "
            f"`{t['params']}`: recall@10 {t['tuning']['tuned_recall']:.3f} on its tuning half, "
            f"recorded **{t['tuning']['recall']:.3f}** (check half); the real queries at that knob "
            f"**{t['real_recall']:.3f}** ({t['real_recall_questions']:.3f} / "
            f"{t['real_recall_partial']:.3f}), p50 {t['p50_ms']:.2f} ms against `Flat`'s "
            f"{t['flat_p50_ms']:.1f} ms = **{t['speedup']:.1f}x**.",
            "",
        ]
    return body


def _distinct_section(out: dict[str, Any]) -> list[str]:
    """``auto``'s projected graph on a corpus of distinct texts of another size
    (``--stage tune-projected --rows N``): one table row per size."""
    runs = sorted(
        (k for k in out if k.startswith(("tune_projected_", "tune_full_"))),
        key=lambda k: (int(k.rsplit("_", 1)[1]), k),
    )
    if not runs:
        return []
    body = [
        "### `auto`'s graphs on distinct texts (one thread)",
        "",
        "The speed corpus at this size (real sentences topped up with splices of two real "
        "sentences: every row a distinct text, unlike the 1M rows above, whose copies make 57% "
        "of the true top 10), encoded with `static` and projected as `auto` fits it; `auto`'s "
        "projected graph built as a segment's is, tuned by its own tuner, then the 2,000 real "
        "queries at the knob it chose; beside it the full graph (`--stage tune --set "
        "projected_graph_min_rows=...` above the rows). The encoding ran on the machine's "
        "threads, the builds, tuning and queries on one.",
        "",
        "| rows (real / splices) | graph | encoding s | build s | tuning s | knob chosen | "
        "recall@10 tuning half / recorded | recall@10 real (questions / partial) | p50 ms | "
        "`Flat` p50 ms | x Flat |",
        "|---|---|---:|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for key in runs:
        t = out[key]
        c, pr = t["prepare"]["counts"], t["projection"]
        graph = (
            f"`{t['factory']}` over {pr['dims']} components, efConstruction {pr['ef_construction']}"
            if pr
            else f"`{t['factory']}` over all dimensions, efConstruction {t['ef_construction']}"
        ) + (f", built on {t['build_threads']} threads" if t.get("build_threads", 1) > 1 else "")
        body.append(
            f"| {t['prepare']['rows']:,} ({c['real_sentences']:,} / {c['splices']:,}) | "
            f"{graph} | {t['prepare']['encode_s']:.1f} | {t['build_s']:.0f} | "
            f"{t['tune_s']:.0f} | `{t['params']}` | {t['tuning']['tuned_recall']:.3f} / "
            f"{t['tuning']['recall']:.3f} | **{t['real_recall']:.3f}** "
            f"({t['real_recall_questions']:.3f} / {t['real_recall_partial']:.3f}) | "
            f"{t['p50_ms']:.2f} | {t['flat_p50_ms']:.1f} | {t['speedup']:.1f} |"
        )
    return [*body, "", *(f"(`{out[k]['command']}`)" for k in runs), ""]


GRAPH_BUILDS = "full@40;full@80;fp16@40;sq8@40;pca192@40;pca128@40;pca96@32"
BUILD_EFS = (64, 128, 256, 512, 1024)
#: ``pcaNr``: candidates re-ranked exactly, per hit asked for.
REFINE_FACTOR = 4


def graph_builds(
    rows: int, labels: str | None, prior: dict[str, Any] | None = None, source: int = 1_000_000
) -> dict[str, Any]:
    """``--stage graph-builds``: what a cheaper HNSW32 build costs in graph quality, on the
    first ``rows`` rows of the ``source``-row distinct-text corpus (``--stage tune-projected
    --rows 1000000`` prepares it), all on one thread. Each label is ``kind@efConstruction``:
    ``full`` the graph over the full vectors; ``fp16`` / ``sq8`` the graph built over the rows
    stored as half floats / 8-bit scalars (each distance reads 2x / 4x fewer bytes); ``pcaN``
    over the rows' first N principal components (as :class:`flowsearch.ann.build.
    ProjectedGraph`); ``m0-N`` HNSW32 whose bottom level keeps N links per row, not 64 (fewer
    links to prune at each insertion); ``ordered`` HNSW32 inserted cluster by cluster (1,024
    spherical k-means lists trained on a seeded sample, each list's rows added together, so the
    rows an insertion visits were visited just before; the k-means and the assignment are timed
    with the build). Every graph is then moved into an ``IndexHNSWFlat`` of the full vectors,
    as ``auto`` saves it, so scores are exact; recall@10 of the 2,000 real queries and the p50
    of one query per efSearch. ``pcaNr`` instead searches the graph in the projected space and
    re-ranks its ``REFINE_FACTOR`` x 10 best exactly over the full vectors (cheaper hops, the
    same graph). ``nsgR@GK``: FAISS's NSG of degree R over an NN-descent graph of GK
    neighbours (its search list length in the efSearch column). ``hnswlibM``: hnswlib's own
    builder (M links added per row, up to 2M on the bottom level, inner product) searched by
    hnswlib at ef = efSearch (an optional package built from source: ``pip install
    'flowsearch[graph-study]'``). Builds run on ``--threads`` (1 by default), searches on one.
    With ``labels``, the builds are added to ``prior``'s (the same rows' earlier run)."""
    import faiss

    work = WORK / str(source)
    Z = np.ascontiguousarray(np.load(work / "z.npy", mmap_mode="r")[:rows])
    Zq = np.load(work / "z_q.npy")
    faiss.omp_set_num_threads(1)
    truth = _truth(Zq, Z)
    d = Z.shape[1]

    def moved(low: Any, rows_in_order: np.ndarray) -> Any:
        full = faiss.IndexHNSWFlat(d, low.hnsw.nb_neighbors(1), faiss.METRIC_INNER_PRODUCT)
        full.storage.add(rows_in_order)
        full.hnsw, full.ntotal = low.hnsw, low.ntotal
        return full

    def graph(dims: int, efc: int, level0: int = 64) -> Any:
        low = faiss.IndexHNSWFlat(dims, 32, faiss.METRIC_INNER_PRODUCT)
        low.hnsw.efConstruction = efc
        low.hnsw.set_nb_neighbors(0, level0)
        return low

    found: dict[str, Any] = dict(prior["builds"]) if prior and labels else {}
    for label in (labels or GRAPH_BUILDS).split(";"):
        kind, _, efc = label.partition("@")
        faiss.omp_set_num_threads(THREADS)
        order = None  # the rows' order in the index, when not theirs
        t = time.perf_counter()
        if kind == "full" or kind.startswith("m0-"):
            low = graph(d, int(efc), int(kind.removeprefix("m0-")) if kind != "full" else 64)
            low.add(Z)
        elif kind == "ordered":
            order, bounds = _cluster_order(Z)
            low = graph(d, int(efc))
            for lo, hi in itertools.pairwise(bounds):
                low.add(Z[order[lo:hi]])
        elif kind.startswith("hnswlib"):
            low = _hnswlib_build(Z, int(kind.removeprefix("hnswlib")), int(efc))
        elif kind.startswith("nsg"):  # NSG over an NN-descent k-NN graph of GK neighbours
            low = faiss.IndexNSGFlat(d, int(kind.removeprefix("nsg")))  # L2: unit rows, same order
            low.build_type, low.GK = 1, int(efc)
            low.add(Z)
        elif kind in ("fp16", "sq8"):
            qt = faiss.ScalarQuantizer.QT_fp16 if kind == "fp16" else faiss.ScalarQuantizer.QT_8bit
            low = faiss.IndexHNSWSQ(d, qt, 32, faiss.METRIC_INNER_PRODUCT)
            low.hnsw.efConstruction = int(efc)
            low.train(Z[:65_536])
            low.add(Z)
        else:
            dims = int(kind.removeprefix("pca").removesuffix("r"))
            pca = faiss.PCAMatrix(d, dims)
            sample = Z[
                np.sort(np.random.default_rng(0).choice(rows, min(rows, 65_536), replace=False))
            ]
            pca.train(np.concatenate([sample, -sample]))  # second moments, as auto's
            low = graph(dims, int(efc))
            for i in range(0, rows, 65_536):
                low.add(pca.apply(np.ascontiguousarray(Z[i : i + 65_536])))
        if kind.startswith(("nsg", "hnswlib")):  # searched as built (search list as efSearch)
            index, keep = low, (low,)
        elif kind.endswith("r"):  # the graph searched where it was built, then re-ranked
            pre = faiss.IndexPreTransform(pca, low)
            exact = faiss.IndexFlatIP(d)
            exact.add(Z)  # the graph already holds the rows: only the re-rank's are added
            index = faiss.IndexRefine(pre, exact)
            index.k_factor = REFINE_FACTOR
            keep = (pca, low, pre, exact)  # FAISS holds them by pointer only
        else:
            index, keep = moved(low, Z if order is None else Z[order]), ()
        build_s = time.perf_counter() - t
        faiss.omp_set_num_threads(1)
        curve = []
        for ef in BUILD_EFS:
            params = faiss.SearchParametersHNSW()
            params.efSearch = ef
            if kind.startswith("hnswlib"):
                low.set_ef(ef)
                search = lambda q, x=low: x.knn_query(q, k=10)[::-1]  # noqa: E731  (D, I)
            else:
                if kind.startswith("nsg"):
                    low.nsg.search_L, params = ef, None
                elif keep:
                    low.hnsw.efSearch, params = ef, None
                search = lambda q, p=params, x=index: x.search(q, 10, params=p)  # noqa: E731
            hits = search(Zq)[1]
            hits = hits if order is None else order[hits]
            lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
            times = []
            for i in lat:
                c = time.perf_counter()
                search(Zq[i : i + 1])
                times.append(time.perf_counter() - c)
            curve.append({"efSearch": ef, "recall": harness.recall(hits, truth),
                          "p50_ms": float(np.median(times)) * 1e3})  # fmt: skip
        found[label] = {"build_s": build_s, "curve": curve, "threads": THREADS,
                        "load": harness.load_average(),
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
        del keep
        print(label, json.dumps(found[label]), flush=True)
    run = {"rows": rows, "source": source, "load": harness.load_average(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    if prior and labels:  # the first run's header (date, load, note) stays
        run = {**run, **{k: v for k, v in prior.items() if k != "builds"}}
    return {**run, "builds": found}


def _cluster_order(Z: np.ndarray, lists: int = 1_024) -> tuple[np.ndarray, list[int]]:
    """``ordered``'s insertion order: the rows sorted by their nearest of ``lists`` spherical
    k-means centroids (trained on 64 seeded rows per list), and the bounds of the chunks added
    together (whole lists, at least 2,048 rows each)."""
    import faiss

    rng = np.random.default_rng(1)
    sample = Z[np.sort(rng.choice(len(Z), min(len(Z), 64 * lists), replace=False))]
    kmeans = faiss.Kmeans(Z.shape[1], lists, niter=10, seed=1, spherical=True)
    kmeans.train(np.ascontiguousarray(sample))
    nearest = kmeans.index.search(Z, 1)[1][:, 0]
    order = np.argsort(nearest, kind="stable")
    bounds = [0]
    for end in np.cumsum(np.bincount(nearest, minlength=lists)):
        if end - bounds[-1] >= 2_048 or end == len(Z):
            bounds.append(int(end))
    return order, bounds


def _hnswlib_build(Z: np.ndarray, m: int, ef_construction: int) -> Any:
    """hnswlib's graph over ``Z`` (inner product), built on :data:`THREADS` threads."""
    try:
        import hnswlib
    except ImportError:
        raise SystemExit(
            "hnswlib is not installed: pip install 'flowsearch[graph-study]' "
            "(it builds from source and needs a C++ compiler)"
        ) from None
    index = hnswlib.Index(space="ip", dim=Z.shape[1])
    index.init_index(max_elements=len(Z), M=m, ef_construction=ef_construction, random_seed=100)
    index.set_num_threads(THREADS)
    index.add_items(Z, np.arange(len(Z)))
    index.set_num_threads(1)
    return index


def _graph_builds_section(runs: dict[str, Any] | None) -> list[str]:
    """``--stage graph-builds``: one row per build, recall / p50 per efSearch."""
    if not runs:
        return []
    body = [
        "### What a cheaper graph build costs (distinct texts, one thread)",
        "",
        "HNSW32 built over the first rows of the 1M distinct-text corpus (`--stage graph-builds`):"
        " over the full vectors, over the rows stored as half floats or 8-bit scalars, or over "
        "their first principal components (as `auto`'s projected graph); `m0-N`: the bottom "
        "level keeps N links per row, not 64; `ordered`: rows inserted cluster by cluster (1,024"
        " k-means lists, timed with the build); `hnswlibM`: hnswlib's builder and search. Every "
        "FAISS graph is then moved into an `IndexHNSWFlat` of the full vectors (exact scores). "
        "recall@10 of the 2,000 real queries / p50 ms of one query, per efSearch; build seconds "
        "on one thread.",
        "",
    ]
    for key in sorted(runs, key=int):
        run = runs[key]
        efs = [c["efSearch"] for c in next(iter(run["builds"].values()))["curve"]]
        body += [
            f"{run['rows']:,} rows ({run['date']}, load {run['load'][0]}):",
            "",
            "| graph (kind@efConstruction) | build s | / full@40 | "
            + " | ".join(f"efSearch {e}" for e in efs)
            + " |",
            "|---|---:|---:|" + "---|" * len(efs),
        ]
        base = run["builds"].get("full@40", {}).get("build_s")
        for label, b in run["builds"].items():
            rel = f"{b['build_s'] / base:.2f}" if base else "-"
            body.append(
                f"| `{label}` | {b['build_s']:.1f} | {rel} | "
                + " | ".join(f"{c['recall']:.3f} / {c['p50_ms']:.2f}" for c in b["curve"])
                + " |"
            )
        later = [f"`{label}` {b['date']}, load {b['load'][0]}" for label, b in
                 run["builds"].items() if b.get("date") and b["date"] != run["date"]]  # fmt: skip
        if later:
            body.append(f"\n(added by later runs with `--only`: {'; '.join(later)})")
        if run.get("note"):
            body.append(f"\n({run['note']})")
        body.append("")
    return body


def render(out: dict[str, Any]) -> str:
    p = out["prepare"]
    body = [
        f"{p['rows']:,} rows of dim {p['dim']} (the speed corpus: {p['counts']}) encoded with "
        f"`static`, projected into the space `auto` fits (`{p['calibrator']}`, "
        f"{p['space']}); queries never in the corpus: {p['queries']['questions']} QNLI test "
        f"questions and {p['queries']['partial_sentences']} partial held-out sentences (a seeded "
        f"contiguous 40-70% of the words, e.g. {p['examples'][0]!r}). Truth: exact top-10 in "
        "the space searched. Latency: p50 of one query at a time on one FAISS thread, "
        f"{LATENCY_QUERIES} queries; speed-up = `Flat`'s p50 in the searched space / the "
        f"index's. x86_64, 2 cores shared with other jobs (1-minute load per row). "
        f"{out['machine']}",
        "",
    ]
    s = out.get("study")
    if s:
        agree = s.get("identity_top10_agreement")
        body += [
            "### The structures at 200k rows, `static` (one thread: builds and queries)",
            "",
            f"`Flat` (exact, searched space): p50 **{s['flat_p50_ms']:.2f} ms** in the last run "
            "(each row's x Flat is against the `Flat` p50 its own run measured). Identity twin "
            f"(`v = (x - mu)/|W(x - mu)|`, `u = W^T W (x_q - mu)`, exact inner product): top-10 "
            "agreement with the searched space's exact top-10 = "
            f"**{agree:.4f}**. Spaces: `searched` (the calibrated space, truth its exact top-10), "
            "`identity` (the twin; truth the searched space's), `raw` (normalised raw vectors, "
            "truth their own exact top-10). `(L2)`: built with FAISS's L2 metric on the unit "
            "rows (the same ranking as inner product).",
            "",
            *_curves_table(s["curves"]),
        ]
    for m, pm in _pooled_studies(out):
        body += _pooled_section(m, pm)
    c = out.get("scale")
    if c and c.get("curves"):
        cp = c["prepare"]
        body += [
            "### 1M rows (`static`; one thread: encoding, builds and queries)",
            "",
            f"bench_scale's 1M construction: the {cp['real_rows']:,} rows above plus 4 jittered "
            f"copies of each (scale {cp['jitter_scale']:.3f}; "
            f"{100 * cp['top10_jittered_share']:.0f}% of the true top-10 are copies), projected "
            "into the space `auto` fits on the real rows; the same 2,000 real queries. Encoding "
            f"1M rows with `static` (the corpus's texts 5 times) here: **{c['encode_s']:.1f} s**; "
            f"`Flat` p50 **{c['flat_p50_ms']:.1f} ms**. Goal: >= 20x `Flat` at recall@10 >= 0.95 "
            "with the build <= 3x the encoding.",
            "",
            *_curves_table(c["curves"], encode=True),
        ]
    body += _graph_section(out.get("scale_graph"))
    body += _scale_tune_section(_scale_tunes(out))
    names = {"tune": "default", "tune_efc40": "before (efConstruction 40)", "tune_scan": "scan",
             "tune_projected": "projected graph"}  # fmt: skip
    body += _distinct_section(out)
    body += _graph_builds_section(out.get("graph_builds"))
    tunes = [{**out[k], "label": v} for k, v in names.items() if out.get(k)]
    if tunes:
        t = tunes[0]
        body += [
            "### `auto`'s tuning against real queries (200k, one thread)",
            "",
            "`auto`'s factory over the searched vectors (by default: HNSW32 built at "
            "`efConstruction` 80; as before this change: 40; with the scan tier on: "
            "`fourth-release scan_max_rows`), built and tuned by `flowsearch.ann.build.tune` "
            f"(held-out rows + noise {t['noise']:g}, each left out of its own answer; half to "
            "choose the knob, half to check it), then the real queries at the knob it chose.",
            "",
            "| figure | " + " | ".join(f"{x['label']}: `{x['factory']}`" for x in tunes) + " |",
            "|---|" + "---|" * len(tunes),
            "| params chosen | " + " | ".join(f"`{x['params']}`" for x in tunes) + " |",
            "| build / tuning s | "
            + " | ".join(f"{x['build_s']:.0f} / {x['tune_s']:.0f}" for x in tunes) + " |",
            "| recall@10 on the tuning half / recorded (check half) | "
            + " | ".join(
                f"{x['tuning']['tuned_recall']:.3f} / **{x['tuning']['recall']:.3f}**"
                for x in tunes
            ) + " |",
            "| recall@10, real queries (questions / partial sentences) | "
            + " | ".join(
                f"**{x['real_recall']:.3f}** ({x['real_recall_questions']:.3f} / "
                f"{x['real_recall_partial']:.3f})" for x in tunes
            ) + " |",
            "| single-query p50, index / Flat | "
            + " | ".join(
                f"{x['p50_ms']:.2f} / {x['flat_p50_ms']:.1f} ms = **{x['speedup']:.1f}x**"
                for x in tunes
            ) + " |",
            "",
        ]  # fmt: skip
        if t.get("noise_curves"):
            keys = [k for k in t["noise_curves"][0] if k.startswith("noise")]
            body += [
                "recall@10 by `efSearch`: real queries beside the tuner's held-out rows moved by "
                "noise of each norm (1,024 each; the noise that makes them no easier than real "
                "queries is the one to tune with):",
                "",
                "| efSearch | real queries | " + " | ".join(f"held-out, {k}" for k in keys) + " |",
                "|---:|---:|" + "---:|" * len(keys),
            ]
            for r in t["noise_curves"]:
                cells = " | ".join(f"{r[k]:.3f}" for k in keys)
                body.append(f"| {r['efSearch']} | {r['real']:.3f} | {cells} |")
            body.append("")
    layouts = [out[k] for k in ("segments", "segments_efc40", "segments_scan") if out.get(k)]
    if layouts:
        g = layouts[0]
        body += [
            f"### {g['segments']} segments of {g['rows_per_segment']:,} rows against one segment",
            "",
            "The FAISS part of a dense query: every segment searched for its top 10, the best 10 "
            "kept (as the searcher merges segments); p50 of one query at a time on one FAISS "
            "thread (builds and tuning on one thread too); recall@10 against exact search over "
            "all rows, real queries. The encoder, the join and the lexical side are the same "
            "work for both layouts and are not in these figures. `auto` by default (HNSW32 at "
            "`efConstruction` 80), as before (40), then with its scan tier on "
            "(`fourth-release scan_max_rows` = 200k). Load at the end: "
            + ", ".join(str(x["load"]) for x in layouts)
            + ".",
            "",
            "| layout | index per segment | params | build s | p50 ms | / one | recall@10 |",
            "|---|---|---|---:|---:|---:|---:|",
        ]
    for g in layouts:
        body.append(
            f"| one segment | {g['one']['factory']} | `{g['one']['params']}` | "
            f"{g['one']['build_s']:.0f} | {g['one']['p50_ms']:.3f} | 1.00 | "
            f"{g['one']['recall']:.3f} |"
        )
        for family in ("auto", "Flat"):
            r = g[family]
            body.append(
                f"| {g['segments']} segments, `{family}` | {r['factory']} | "
                f"`{', '.join(p for p in r['params'] if p) or '-'}` | {r['build_s']:.0f} | "
                f"{r['p50_ms']:.3f} | {r['ratio']:.2f} | {r['recall']:.3f} |"
            )
    if layouts:
        body.append("")
    for line in out.get("notes", []):
        body.append(line)
    return harness.markdown(
        "ANN study: calibrated vs raw space, and tuning on real-like queries "
        "(`benchmarks/ann/bench_ann_study.py`, issue 30)",
        body,
        out,
        "python -m benchmarks run ann_study --stage all",
    )


def main() -> int:
    parser = harness.arguments(__doc__, "20,000 rows, 400 queries", "bench_ann_study")
    parser.add_argument(
        "--stage",
        default="all",
        choices=(
            "prepare",
            "study",
            "tune",
            "tune-scan",
            "tune-projected",
            "graph-builds",
            "segments",
            "scale-prepare",
            "scale",
            "scale-graph",
            "scale-tune",
            "all",
        ),
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--pooling", default="static", help="the bundled model's pooling")
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument(
        "--only", default=None, help="only these structures (labels, ';'-separated)"
    )
    parser.add_argument(
        "--build-limit", type=float, default=5.0,
        help="scale-graph: stop a build past this many times the encoding's seconds",
    )  # fmt: skip
    parser.add_argument(
        "--tag",
        default="",
        help="scale-graph: added to this run's labels (a repeat); tune-projected: to its key",
    )
    parser.add_argument(
        "--threads", type=int, default=1,
        help="scale stages: FAISS, torch and tokenizer threads of encoding and builds (searches "
             "stay on one thread)",
    )  # fmt: skip
    parser.add_argument(
        "--set", dest="settings", action="append", default=[], metavar="NAME=INT",
        help="a field of flowsearch.AnnPolicy (an integer) for the run's auto builds, e.g. "
             "ef_construction=40 (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--user-queries", action="store_true",
        help="scale-tune: tune on a seeded half of the real queries (as `compact "
             "--tune-queries` does), measure on the other half",
    )  # fmt: skip
    parser.add_argument(
        "--distinct", action="store_true",
        help="scale-tune: the rows are --rows distinct texts (prepare's corpus), not jittered "
             "copies of 200k",
    )  # fmt: skip
    parser.add_argument(
        "--no-curves", dest="curves", action="store_false",
        help="keep the saved noise curves of the tune stage (they do not depend on the tuner)",
    )  # fmt: skip
    args = harness.parse(parser, rows=20_000, queries=400)
    if harness.rendered(args, render):
        return 0
    global THREADS
    THREADS = max(1, args.threads)
    if THREADS > 1:  # the tokenizer's threads start with its first batch: set them before
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ["RAYON_NUM_THREADS"] = str(THREADS)
    global POLICY
    changes = {k: int(v) for k, _, v in (x.partition("=") for x in args.settings)}
    POLICY = AnnPolicy(**changes)
    return _run(args, data=harness.data_dir(args.data))


def _run(args: Any, data: Path) -> int:
    """:func:`main` after the options: the stages asked for."""

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out_path = Path(args.out + ".json")
    out: dict[str, Any] = {}
    if out_path.exists() and not args.smoke:
        out = json.loads(out_path.read_text())
    out["machine"] = harness.machine()
    this = harness.command_line()
    if out.get("command") and args.stage != "all":
        # a stage adds to the section: keep how its earlier figures were made
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        this = f"{out['command']}; then {this} ({when})"
    out["command"] = this
    prep = prepare(data, args.rows, args.queries, args.pooling)
    other = (
        args.stage in ("tune-projected", "scale-tune")
        and out.get("prepare", {}).get("rows", args.rows) != args.rows
    )
    if args.pooling == "static" and not other:  # the study's corpus (another size: kept apart)
        out["prepare"] = prep
    if args.stage == "tune" and args.pooling != "static":  # kept beside that study
        key = _study_keys(out, args.pooling, args.rows)[0]
        work = workdir(args.rows, args.pooling)
        out[key]["tune"] = tune(args.rows, curves=False, work=work)
        harness.finish(args, render, out)
        return 0
    if args.stage in ("tune", "all"):
        before = out.get("tune", {}).get("noise_curves", [])
        out["tune"] = tune(args.rows, curves=args.curves or not before)
        out["tune"]["noise_curves"] = out["tune"]["noise_curves"] or before
        harness.finish(args, render, out)
    if args.stage == "tune-projected":  # the projected graph left the package (release 5)
        raise SystemExit("the projected graph left flowsearch in its fifth release")
    if args.stage == "graph-builds":  # cheaper graph builds on distinct texts (1M's first rows)
        runs = out.setdefault("graph_builds", {})
        runs[str(args.rows)] = graph_builds(args.rows, args.only, runs.get(str(args.rows)))
        harness.finish(args, render, out)
    if args.stage == "tune-scan":  # auto with its scan tier on, at this size
        out["tune_scan"] = tune(args.rows, factory="RaBitQfs,RFlat", curves=False)
        harness.finish(args, render, out)
    if args.stage in ("segments", "all"):
        out["segments"] = segments(args.rows)
        harness.finish(args, render, out)
    if args.stage == "scale-prepare":
        out.setdefault("scale", {})["prepare"] = scale_prepare(data, args.rows)
    if args.stage == "scale":
        out["scale"] = scale(data, args.rows, args.only, out.get("scale"))
    if args.stage == "scale-graph":

        def save(graph: dict[str, Any]) -> None:
            harness.publish(args.out, render, {**out, "scale_graph": graph},
                            smoke=args.smoke)  # fmt: skip

        out["scale_graph"] = graph_scale(
            data, args.rows, args.only, out.get("scale_graph"), save, args.build_limit, args.tag
        )
    if args.stage == "scale-tune":
        run = scale_tune(data, args.rows, distinct=args.distinct, n_queries=args.queries,
                         user=args.user_queries)  # fmt: skip
        out["scale_tunes"] = [*_scale_tunes(out), run]
        out.pop("scale_tune", None)  # the first run's key, now the list's first
    if args.stage in ("study", "all"):
        key, prep_key = _study_keys(out, args.pooling, args.rows)
        out[prep_key] = prep
        out[key] = study(workdir(args.rows, args.pooling), args.only, out.get(key))
        if args.pooling != "static":
            from flowsearch.ann.factory import auto_factory

            out[key]["auto_factory"] = auto_factory(prep["rows"], POLICY, dim=prep["dim"])
    harness.finish(args, render, out)
    return 0


if __name__ == "__main__":
    harness.script(main)
