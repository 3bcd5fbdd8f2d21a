r"""Figures at 200k rows (performance issue): memory, fit cost, query latency, ANN on calibrated
spaces, and the tuning of ``index_factory="auto"``.

Stages (each writes ``benchmarks/_work/stage_<name>.json``, so a later stage can be rerun
without repeating the heavy ones; ``--only a,b`` reruns the named stages, ``--fresh`` all):

0. corpus: 200k real texts (``speed_corpus.py`` says how) and 2,000 held-out real queries.
1. ingest: ``flowsearch index --pooling static`` on 200k and 20k rows, ``--pooling mean`` on
   20k rows, each in a child process (peak RSS from ``os.wait4``).
2. ingest_mean: ``flowsearch index`` with the default pooling (``mean``, torch, the bundled
   model) on all 200k rows: the index where the latency target is meaningful (tens of
   CPU-minutes: the transformer over every row).
3. fit: what ``auto`` fitted for the static 200k index (read from its manifest, e.g. partial
   whitening ``gaussian`` power 0.25), whitening-flow, the paper's flow and whitening on the
   200k x 384 static raw vectors, against encoding 200k rows with ``mean`` (measured by stage 2
   when it ran; else a 2k sample, extrapolated).
4. query: ``Searcher.search`` latency by step at 20k / 200k for static and ``mean``, with the
   peer (sentence-transformers + ``IndexFlatIP``) on the ``mean`` indexes, batch QPS, recall@10
   of the ``auto`` index against exact search on real queries (``speed_query.py``).
5. scan: exact ``Flat`` p50 by row count, and the ingest-built 200k indexes' recall and p50 by
   their search parameter, real queries vs ``auto``'s tuning queries (``speed_scan.py``).
6. ann: Flat / HNSW32 / IVF-Flat / IVF-PQ on raw, the index's own calibrated space and full
   whitening at 200k and at 1M (jittered copies of the real vectors, ``speed_ann.jitter``);
   candidates from raw re-scored in the index's space (``speed_ann_stage.py``).

Writes ``bench_speed.json`` and ``bench_speed.md`` beside it.

Usage:
    nice python -m benchmarks run speed [--data DIR] [--rows 200000] [--fresh] [--only a,b]
    python -m benchmarks run speed --smoke     # 1,000 rows, no 1M part; figures untouched
    python -m benchmarks run speed --render    # the report again from bench_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness
from benchmarks.common.corpora import real_corpus
from benchmarks.common.harness import command_line, data_dir, recall
from benchmarks.ingest.speed_ingest import run_ingest

#: Where the stages keep their indexes and JSON (``--smoke``: a folder of its own).
WORK = harness.WORK
N_LATENCY = 200  # queries timed one at a time (half questions, half sentences), x ROUNDS
ROUNDS = 3


def _stage(name: str, fresh: bool, fn: Any) -> Any:
    path = WORK / f"stage_{name}.json"
    if path.exists() and not fresh:
        return json.loads(path.read_text())
    start = time.perf_counter()
    cpu = time.process_time()
    load_start = os.getloadavg()
    out = fn()
    out["_load_start"] = load_start
    out["_stage_wall_s"] = time.perf_counter() - start
    out["_stage_cpu_s"] = time.process_time() - cpu
    out["_finished"] = time.strftime("%Y-%m-%d %H:%M")
    out["_load"] = os.getloadavg()
    path.write_text(json.dumps(out, indent=1, default=_jsonable))
    return json.loads(path.read_text())


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))


def latency_queries(queries: list[str]) -> list[str]:
    half = len(queries) // 2
    return queries[: N_LATENCY // 2] + queries[half : half + N_LATENCY // 2]


def stage_ingest(corpus: Path, small: Path) -> dict[str, Any]:
    return {
        "static_200k": run_ingest(corpus, WORK / "static_200k", "--pooling", "static"),
        "static_20k": run_ingest(small, WORK / "static_20k", "--pooling", "static"),
        "mean_20k": run_ingest(small, WORK / "mean_20k", "--pooling", "mean"),
    }


def stage_ingest_mean(corpus: Path) -> dict[str, Any]:
    """The default pooling (``mean``, torch, the bundled model) at full size: the index where the
    latency target (search p50 <= 1.2x the encoder) is meaningful. Its own stage: it is the one
    long job (the whole transformer over every row)."""
    return {"mean_200k": run_ingest(corpus, WORK / "mean_200k", "--pooling", "mean")}


def _raw(s: Any) -> np.ndarray:
    return np.asarray(harness.segment_of(s).reader.vectors("raw"), dtype=np.float32)


def _auto_calibrator(s: Any) -> tuple[str, dict[str, Any]]:
    """The calibrator the index's manifest says ingest fitted (name, config), to refit as is."""
    spec = s.manifest.calibration
    config = {k: v for k, v in spec.config.items() if k != "seed"}
    if spec.calibrator in ("flow", "whitening-flow"):
        config["seed"] = 0
    return spec.calibrator, config


def stage_fit(corpus: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from flowsearch import Encoder, Searcher
    from flowsearch.calibration import make_calibrator

    def peak() -> float:  # this process's peak RSS so far, GB (ru_maxrss is KiB on Linux)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9

    s = Searcher.open(WORK / "static_200k")
    U = _raw(s)
    auto_name, auto_config = _auto_calibrator(s)
    peaks = {"raw vectors loaded": peak()}
    out: dict[str, Any] = {
        "rows": len(U),
        "dim": U.shape[1],
        "auto_chose": auto_name,
        "auto_config": auto_config,
        "auto_space": s.manifest.calibration.space,
    }
    s.close()
    fits: dict[str, tuple[str, dict[str, Any]]] = {
        f"{auto_name} (auto)": (auto_name, auto_config),
        "whitening": ("whitening", {}),
    }
    if os.environ.get("BENCH_SPEED_FLOW_FITS") == "1":  # minutes of CPU on a shared machine
        fits["whitening-flow"] = ("whitening-flow", {"seed": 0})
        fits["flow"] = ("flow", {"seed": 0})
    out["fits"] = list(fits)
    for label, (name, config) in fits.items():
        cal = make_calibrator(name, **config)
        start, cpu = time.perf_counter(), time.process_time()
        cal.fit(U)
        out[f"fit_s_{label}"] = time.perf_counter() - start
        out[f"fit_cpu_s_{label}"] = time.process_time() - cpu
        peaks[f"after fitting {label}"] = peak()
        del cal
    out["peak_rss_gb"] = peaks
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
    rng = np.random.default_rng(0)
    n = min(2_000, len(texts))  # 2k, or all of a --smoke corpus
    sample = [texts[i] for i in rng.choice(len(texts), size=n, replace=False)]
    enc = Encoder(pooling="mean")
    enc.encode(sample[:64], progress=False)  # warm-up
    start, cpu = time.perf_counter(), time.process_time()
    enc.encode(sample, batch_size=64, progress=False)
    out["mean_encode_2k_s"] = time.perf_counter() - start
    out["mean_encode_2k_cpu_s"] = time.process_time() - cpu
    out["mean_encode_200k_s_extrapolated"] = out["mean_encode_2k_s"] * len(U) / n
    out["mean_encode_200k_cpu_s_extrapolated"] = out["mean_encode_2k_cpu_s"] * len(U) / n
    return out


def _peer(s: Any) -> Any:
    """The peer's query: sentence-transformers encode + IndexFlatIP over the same (stored raw)
    vectors + a dict from row to text."""
    import faiss
    from sentence_transformers import SentenceTransformer

    from flowsearch.encode.model_files import bundled_model_dir

    st = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    flat = faiss.IndexFlatIP(s.manifest.dim)
    raw = _raw(s)
    flat.add(raw / np.linalg.norm(raw, axis=1, keepdims=True))
    texts = dict(enumerate(harness.segment_of(s).reader.table(["text"]).column("text").to_pylist()))

    def peer(q: str) -> list[str]:
        e = st.encode([q], normalize_embeddings=True, convert_to_numpy=True)
        _, rows = flat.search(e.astype(np.float32), 10)
        return [texts[int(r)] for r in rows[0]]

    return peer


def _faiss_200k(queries: list[str]) -> dict[str, Any]:
    """An extra step for the ``mean`` 20k loop when no ``mean`` 200k index exists: the static
    200k index's FAISS search (HNSW32 at its tuned efSearch, one OpenMP thread, as Searcher runs
    it) for the same query, so a 200k search with the ``mean`` encoder can be composed per query
    in one iteration. Both are 384-d unit vectors; HNSW's cost follows efSearch and dim."""
    from flowsearch import Searcher
    from flowsearch.ann import io as ann_io

    s200 = Searcher.open(WORK / "static_200k")
    Z = dict(zip(queries, s200.embed(queries)[0], strict=True))
    index = harness.segment_of(s200).ann

    def step(q: str) -> Any:
        return ann_io.single_threaded(lambda: ann_io.search(index, Z[q][None], 10))

    return {"faiss 200k (static 200k index's HNSW32)": step}


def stage_query(queries: list[str]) -> dict[str, Any]:
    from benchmarks.ingest.speed_query import batch_qps, latency, recall_of_index
    from flowsearch import Searcher

    lat_q = latency_queries(queries)
    out: dict[str, Any] = {"latency_queries": len(lat_q), "rounds": ROUNDS}
    out["all_queries"] = len(queries)
    # BENCH_SPEED_QUERY_INDEXES=a,b: measure only those now, keep the others' figures from the
    # last run of this stage (each index's figures are self-contained: its own loop and load)
    only = set(filter(None, os.environ.get("BENCH_SPEED_QUERY_INDEXES", "").split(",")))
    before = WORK / "stage_query.json"
    last = json.loads(before.read_text()) if only and before.exists() else {}
    for name in ("static_20k", "mean_20k", "static_200k", "mean_200k"):
        if only and name not in only and name in last:
            out[name] = last[name]
            continue
        if not (WORK / name / "manifest.json").exists():
            out[name] = {"_skipped": "index not built"}
            continue
        s = Searcher.open(WORK / name)
        peer = _peer(s) if name.startswith("mean") else None
        extra = _faiss_200k(lat_q) if name == "mean_20k" else None
        rec = recall_of_index(s, s.embed(queries)[0])
        found, exact = rec["found"], rec["exact"]
        half = len(queries) // 2
        ann = harness.segment_of(s).record.ann
        out[name] = {
            "factory": ann.factory,
            "params": ann.params,
            "space": s.manifest.calibration.space,
            "calibration": s.manifest.calibration.name,
            "calibrator": s.manifest.calibration.calibrator,
            "calibrator_config": s.manifest.calibration.config,
            "recall": rec["recall"],
            "recall_questions": recall(found[:half], exact[:half]),
            "recall_sentences": recall(found[half:], exact[half:]),
            "load_before": os.getloadavg(),
            "latency": latency(s, lat_q, rounds=ROUNDS, peer=peer, extra=extra),
            "load_after_latency": os.getloadavg(),
            "batch_qps": batch_qps(s, queries),
        }
        s.close()
    return out


def _args() -> argparse.Namespace:
    parser = harness.arguments(__doc__, "1,000 rows, no 1M part", "bench_speed")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--million", type=int, default=1_000_000)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated stages to run now (the others are read from _work)",
    )
    return harness.parse(parser, rows=1_000, queries=200, million=0, fresh=True)


def main() -> None:
    global WORK, N_LATENCY, ROUNDS
    from benchmarks.ingest.speed_report import write_report

    args = _args()
    if harness.rendered(args, write_report):
        return
    import pyarrow.parquet as pq

    from benchmarks.ingest.speed_ann_stage import stage_ann
    from benchmarks.ingest.speed_scan import stage_scan

    data = data_dir(args.data)
    corpus, queries, counts = real_corpus(data, args.rows, args.queries)
    if args.smoke:
        WORK, N_LATENCY, ROUNDS = harness.WORK / "smoke" / "speed", 40, 1
    WORK.mkdir(parents=True, exist_ok=True)
    small = WORK / "corpus_20000.parquet"
    if args.smoke or not small.exists():
        pq.write_table(pq.read_table(corpus).slice(0, 20_000), small, row_group_size=16_384)
    only = set(filter(None, args.only.split(",")))

    def fresh(name: str) -> bool:
        return args.fresh or name in only

    results: dict[str, Any] = {
        "machine": {
            "platform": platform.machine(),
            "cpus": os.cpu_count(),
            "load_at_start": os.getloadavg(),
        },
        "corpus": counts,
        "command": command_line(),
    }
    stages = {
        "ingest": lambda: stage_ingest(corpus, small),
        "ingest_mean": lambda: stage_ingest_mean(corpus),
        "fit": lambda: stage_fit(corpus),
        "query": lambda: stage_query(queries),
        "scan": lambda: stage_scan(WORK, queries),
        "ann": lambda: stage_ann(WORK, queries, args.million),
    }
    for name, fn in stages.items():
        if not only or name in only:
            results[name] = _stage(name, fresh(name), fn)
    for name in stages:
        path = WORK / f"stage_{name}.json"
        if not path.exists():
            print(f"stage {name} not run yet: run with --only {name} (or without --only)")
            return
        results[name] = json.loads(path.read_text())
    harness.finish(args, write_report, results)


if __name__ == "__main__":
    main()
