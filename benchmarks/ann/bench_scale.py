"""Figures for docs/SCALE.md: encoder rows/s, and ``auto``'s IVF-PQ path at 1M real-ish vectors.

Writes ``bench_scale.json`` and ``bench_scale.md`` beside it.

The 1M vectors: the 200k real sentences of ``speed_corpus.py``'s corpus (built under
``benchmarks/_work`` from the evaluation data when missing) encoded with the bundled model's
``static`` pooling, plus four jittered copies of every row (``speed_ann.jitter``: noise shaped by
the data's covariance, half the median distance to a row's 10th neighbour), all projected into
the space ``calibration="auto"`` fits on the 200k real rows (what ingest searches). Queries: the
corpus file's 2,000 real queries (1,000 QNLI questions, 1,000 held-out sentences). Truth: exact
top-10 (faiss.contrib's brute force) in the same space.

Stages (each cached in ``benchmarks/_work/scale``; ``build`` and ``serve`` run in child
processes so their RSS is theirs alone):

- ``prepare``: encode, calibrate, jitter, project; exact truth (timed: Flat's batch QPS).
- ``build``: what ingest does with ``index_factory="auto"`` past ``AnnPolicy.graph_max_rows``, at
  1M (:mod:`flowsearch.ann.build`: train on a bounded sample, add in chunks, tune ``nprobe``
  and ``k_factor`` on probe queries, write): seconds per step, peak RSS, bytes on disk.
- ``serve``: open the index memory-mapped as ``Searcher.open(mmap=True)`` does, RSS after open
  and after 1,000 single queries, p50 latency, batch QPS, recall@10 vs Flat on the 2,000 real
  queries, and a recall grid over ``nprobe`` x ``k_factor`` (500 queries).

    python -m benchmarks run scale [--data DIR] [--stage all|prepare|build|serve] [--encoders]
    python -m benchmarks run scale --smoke     # 2,000 real rows x 5; figures untouched
    python -m benchmarks run scale --render    # the report again from bench_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import corpora, harness

sys.path.insert(0, str(harness.ROOT / "tests"))  # corpus_helpers: the encoder-speed passages
#: The stages' folder (``--smoke``: a folder of its own).
WORK = harness.WORK / "scale"
COPIES = 4  # 200k real rows + 4 jittered copies of each = 1M
CHUNK = 65_536


def _status() -> dict[str, float]:
    """Current and peak RSS, and its anonymous (heap) and file-backed (mapped) parts, in MB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    names = {"rss": "VmRSS", "peak_rss": "VmHWM", "anon": "RssAnon", "file": "RssFile"}
    return {k: int(fields[v].split()[0]) / 1024 for k, v in names.items()}


class _PeakAnon:
    """Samples the anonymous RSS every 0.1 s in a thread: its peak (VmHWM counts mapped files)."""

    def __enter__(self) -> _PeakAnon:
        self.peak = _status()["anon"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, _status()["anon"])

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _status()["anon"])


def encoders(n: int) -> dict[str, float]:
    import torch
    from corpus_helpers import sentences
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from flowsearch.encode.encoder import Encoder

    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    # passages of 40-80 words (~60-110 tokens): the length of a typical retrieval passage
    texts = [" ".join(sentences(int(rng.integers(5, 10)), seed=i)) for i in range(n)]
    out: dict[str, float] = {}
    for name, pooling in (("bundled mean", "mean"), ("bundled static", "static")):
        enc = Encoder(None, pooling=pooling)
        enc.encode(texts[:16], progress=False)
        t = time.perf_counter()
        enc.encode(texts, batch_size=64, progress=False)
        out[f"{name} rows/s"] = n / (time.perf_counter() - t)
    # BERT-base shape (12 layers, 768 hidden, 110M parameters), random weights: speed only
    folder = Path("/tmp/bench_scale_bert_base")
    if not (folder / "config.json").exists():
        vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])}
        from corpus_helpers import WORDS

        for w in ["the", *WORDS]:
            vocab.setdefault(w, len(vocab))
        BertTokenizerFast(vocab=vocab, do_lower_case=True).save_pretrained(folder)
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=30522)).eval().save_pretrained(folder)
    enc = Encoder(str(folder), pooling="mean", max_length=256)
    m = max(32, n // 4)
    enc.encode(texts[:8], progress=False)
    t = time.perf_counter()
    enc.encode(texts[:m], batch_size=32, progress=False)
    out["bert-base-size mean rows/s"] = m / (time.perf_counter() - t)
    out["mean tokens per passage"] = float(
        np.mean([len(ids) for ids in enc._tokens.ids(texts[:200], max_length=1 << 30)])
    )
    return out


# --- prepare -----------------------------------------------------------------------------------


def prepare(corpus: Path, queries: list[str]) -> dict[str, Any]:
    import faiss
    import pyarrow.parquet as pq

    from benchmarks.ann.speed_ann import jitter, jitter_scale
    from flowsearch.encode.encoder import Encoder
    from flowsearch.space.fitting import fit_for_index
    from flowsearch.space.search_space import SearchSpace

    faiss.omp_set_num_threads(2)
    WORK.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    raw, raw_q = WORK / "raw_200k.npy", WORK / "raw_queries.npy"
    if not raw.exists() or not raw_q.exists():
        texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
        enc = Encoder(None, pooling="static")
        t = time.perf_counter()
        U = enc.encode(texts, batch_size=256, progress=False).astype(np.float32)
        out["encode_200k_s"] = time.perf_counter() - t
        np.save(raw_q, enc.encode(queries, batch_size=256, progress=False).astype(np.float32))
        np.save(raw, U)
    U, Uq = np.load(raw), np.load(raw_q)
    t = time.perf_counter()
    cal, spec = fit_for_index(U, "auto", pooling="static")  # as build_index does
    space = SearchSpace(cal, spec)
    out["calibration"] = {"name": spec.calibrator, "space": spec.space, "fit_s": 0.0}
    out["calibration"]["fit_s"] = time.perf_counter() - t
    scale = jitter_scale(U)
    u1m = jitter(U, COPIES, scale)
    out["jitter_scale"] = scale
    Z = np.lib.format.open_memmap(WORK / "z_1m.npy", "w+", np.float32, u1m.shape)
    for start in range(0, len(u1m), CHUNK):
        Z[start : start + CHUNK] = space.project(u1m[start : start + CHUNK], want_density=False)[0]
    Z.flush()
    del u1m
    Zq = space.project(Uq, want_density=False)[0]
    np.save(WORK / "z_queries.npy", Zq)
    t = time.perf_counter()
    _, truth = harness.exact_top(Zq, Z, 10, chunk_rows=CHUNK)
    out["flat_batch_qps"] = len(Zq) / (time.perf_counter() - t)
    out["top10_jittered_share"] = float((truth >= len(U)).mean())
    np.save(WORK / "truth.npy", truth)
    out["rows"], out["dim"], out["queries"] = int(len(Z)), int(Z.shape[1]), int(len(Zq))
    (WORK / "prepare.json").write_text(json.dumps(out, indent=1))
    return out


# --- build -------------------------------------------------------------------------------------


def build() -> dict[str, Any]:
    import faiss

    from flowsearch.ann import build as ann_build
    from flowsearch.ann import io as ann_io
    from flowsearch.ann import tune as ann_tune
    from flowsearch.ann.factory import auto_factory, new_index
    from flowsearch.ann.policy import AnnPolicy

    faiss.omp_set_num_threads(2)
    if not (WORK / "z_1m.npy").is_file():
        raise SystemExit(f"no vectors in {WORK}: run --stage prepare (or --stage all) first")
    Z = np.load(WORK / "z_1m.npy", mmap_mode="r")
    chunks = lambda: (np.asarray(Z[i : i + CHUNK]) for i in range(0, len(Z), CHUNK))  # noqa: E731
    seconds: dict[str, float] = {}
    with _PeakAnon() as peak:
        # what auto builds past AnnPolicy.graph_max_rows (2M), measured at 1M
        # (Flat up to the default 100k rows; a --smoke run is below that too, so its limit is
        # lowered as well and the smoke run takes the same path)
        lowered = AnnPolicy(flat_max_rows=min(len(Z) - 1, 100_000), graph_max_rows=len(Z) - 1)
        factory = auto_factory(len(Z), lowered, dim=Z.shape[1])
        t = time.perf_counter()
        index = new_index(Z.shape[1], factory)
        # as ann.build.training_sample: a seeded uniform sample, then train() bounds it further
        size = min(len(Z), 262_144)
        pick = np.sort(np.random.default_rng(0).choice(len(Z), size=size, replace=False))
        sample = np.asarray(Z[pick])
        ann_build.train(index, sample, factory)
        seconds["train"] = time.perf_counter() - t
        print(factory, "trained", seconds, flush=True)
        t = time.perf_counter()
        for part in chunks():
            ann_build.add(index, part, factory)
        seconds["add"] = time.perf_counter() - t
        print("added", seconds, flush=True)
        t = time.perf_counter()
        params, tuned = ann_tune.tune_search(index, sample, chunks)
        seconds["tune"] = time.perf_counter() - t
        print("tuned", params, tuned, seconds, flush=True)
        t = time.perf_counter()
        ann_io.write_index(index, WORK / "index.faiss")
        seconds["write"] = time.perf_counter() - t
    out = {
        "factory": factory,
        "params": params,
        "tuning_recall@10": tuned,
        "seconds": seconds,
        "build_s": sum(seconds.values()),
        "peak_anon_mb": peak.peak,
        "peak_rss_mb": _status()["peak_rss"],
        "index_bytes": (WORK / "index.faiss").stat().st_size,
        "train_rows": min(len(sample), ann_build.IVF_TRAIN_PER_LIST * _nlist(factory)),
    }
    (WORK / "build.json").write_text(json.dumps(out, indent=1))
    return out


def _nlist(factory: str) -> int:
    return int(factory.split(",")[0][3:])


# --- serve -------------------------------------------------------------------------------------


def serve() -> dict[str, Any]:
    import faiss

    from flowsearch.ann import io as ann_io

    faiss.omp_set_num_threads(2)
    if not (WORK / "build.json").is_file():
        raise SystemExit(f"no index built in {WORK}: run --stage build (or --stage all) first")
    built = json.loads((WORK / "build.json").read_text())
    Zq, truth = np.load(WORK / "z_queries.npy"), np.load(WORK / "truth.npy")
    out: dict[str, Any] = {"before_open": _status()}
    t = time.perf_counter()
    index = ann_io.read_index(WORK / "index.faiss", built["params"], mmap=built["factory"])
    out["open_s"] = time.perf_counter() - t
    out["after_open"] = _status()
    lat = []
    for q in Zq[:1000]:
        t = time.perf_counter()
        ann_io.search(index, q[None], 10)
        lat.append(time.perf_counter() - t)
    out["after_1000_queries"] = _status()
    out["single_query_p50_ms"] = 1000 * float(np.median(lat))
    out["single_query_qps"] = len(lat) / float(np.sum(lat))
    t = time.perf_counter()
    _, found = ann_io.search(index, Zq, 10)
    out["batch_qps"] = len(Zq) / (time.perf_counter() - t)
    out["recall@10"] = harness.recall(found, truth, 10)
    half = len(Zq) // 2  # the corpus file lists 1,000 questions, then 1,000 held-out sentences
    out["recall@10_questions"] = harness.recall(found[:half], truth[:half], 10)
    out["recall@10_sentences"] = harness.recall(found[half:], truth[half:], 10)
    out["after_batch"] = _status()
    grid = {}
    ivf = faiss.extract_index_ivf(index)
    refine = faiss.downcast_index(index)
    for nprobe in (16, 64, 256, 512):
        for k_factor in (1, 4, 16, 64):
            ivf.nprobe, refine.k_factor = nprobe, k_factor
            t = time.perf_counter()
            _, got = index.search(Zq[:500], 10)
            grid[f"nprobe={nprobe},k_factor={k_factor}"] = {
                "recall@10": harness.recall(got, truth[:500], 10),
                "batch_qps": 500 / (time.perf_counter() - t),
            }
    out["grid_500_queries"] = grid
    out["after_grid"] = _status()
    (WORK / "serve.json").write_text(json.dumps(out, indent=1))
    return out


# --- driver ------------------------------------------------------------------------------------


def _child(stage: str, args: argparse.Namespace) -> dict[str, Any]:
    """Runs one stage in a child process (its RSS is its own); the stage's JSON."""
    cmd = [sys.executable, __file__, "--stage", stage, "--child"]
    cmd += ["--rows", str(args.rows), "--queries", str(args.queries)]
    cmd += (["--data", args.data] if args.data else []) + (["--smoke"] if args.smoke else [])
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(harness.ROOT)})
    return json.loads((WORK / f"{stage}.json").read_text())


def _mb(x: float) -> str:
    return f"{x:,.0f} MB"


def report(out: dict[str, Any]) -> str:
    p, b, s = out["prepare"], out["build"], out["serve"]
    load = out["load"]
    lines = [
        "## Scale: `auto`'s IVF-PQ path at 1M (`benchmarks/ann/bench_scale.py`)",
        "",
        f"{p['rows']:,} vectors of dim {p['dim']}: the 200k real sentences encoded with `static`, "
        f"plus {COPIES} jittered copies of each (scale {p['jitter_scale']:.4f}), projected into "
        f"the space `auto` fits ({p['calibration']['name']}, space {p['calibration']['space']}); "
        f"{p['queries']:,} real queries; truth = exact top-10 (Flat). "
        f"{100 * p['top10_jittered_share']:.0f}% of the true top-10 are jittered copies. "
        f"x86_64, 2 cores shared with other jobs, load average {load['start']} at the start, "
        f"{load['end']} at the end.",
        "",
        "| figure | measured |",
        "|---|---:|",
        f"| factory `auto` chose / tuned params | `{b['factory']}` / `{b['params']}` |",
        f"| build: train / add / tune / write (s) | {b['seconds']['train']:.0f} / "
        f"{b['seconds']['add']:.0f} / {b['seconds']['tune']:.0f} / {b['seconds']['write']:.0f} |",
        f"| training rows (k-means and PQ) | {b['train_rows']:,} |",
        f"| build peak RSS / peak anonymous RSS | {_mb(b['peak_rss_mb'])} / "
        f"{_mb(b['peak_anon_mb'])} |",
        f"| index.faiss on disk | {b['index_bytes'] / 2**20:,.0f} MiB |",
        f"| anonymous RSS after mmap open / after 1,000 queries | "
        f"{_mb(s['after_open']['anon'] - s['before_open']['anon'])} / "
        f"{_mb(s['after_1000_queries']['anon'] - s['before_open']['anon'])} (above the process "
        "before opening) |",
        f"| mapped file RSS after 1,000 queries | "
        f"{_mb(s['after_1000_queries']['file'] - s['before_open']['file'])} |",
        f"| single-query p50 / batch QPS (2 threads) | {s['single_query_p50_ms']:.2f} ms / "
        f"{s['batch_qps']:,.0f} |",
        f"| Flat (exact) batch QPS, same queries | {p['flat_batch_qps']:,.1f} |",
        f"| recall@10 vs Flat, {p['queries']:,} real queries (questions / sentences) | "
        f"**{s['recall@10']:.3f}** ({s['recall@10_questions']:.3f} / "
        f"{s['recall@10_sentences']:.3f}) |",
        f"| recall@10 on the tuning (probe) queries | {b['tuning_recall@10']:.3f} |",
        "",
        "recall@10 (batch QPS) by `nprobe` x `k_factor`, first 500 queries:",
        "",
        "| nprobe | k_factor 1 | 4 | 16 | 64 |",
        "|---:|---:|---:|---:|---:|",
    ]
    for nprobe in (16, 64, 256, 512):
        cells = []
        for kf in (1, 4, 16, 64):
            g = s["grid_500_queries"][f"nprobe={nprobe},k_factor={kf}"]
            cells.append(f"{g['recall@10']:.3f} ({g['batch_qps']:,.0f})")
        lines.append(f"| {nprobe} | " + " | ".join(cells) + " |")
    if out.get("note"):  # how the run was placed (cores, other jobs)
        lines += ["", str(out["note"])]
    lines += ["", harness.produced_by(out, "python -m benchmarks run scale --stage all")]
    return "\n".join(lines) + "\n"


def _args() -> argparse.Namespace:
    parser = harness.arguments(__doc__, "2,000 real rows x 5", "bench_scale")
    parser.add_argument("--stage", default="all", choices=["all", "prepare", "build", "serve"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=200_000, help="real rows (x5 with copies)")
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--encoders", action="store_true", help="re-measure encoder rows/s")
    parser.add_argument("--passages", type=int, default=256)
    return harness.parse(parser, rows=2_000, queries=200, passages=16)


def render(out: dict[str, Any]) -> str:
    """The section, from the whole JSON (its ``ivfpq_1m`` part)."""
    return report(out["ivfpq_1m"])


def main() -> None:
    global WORK
    args = _args()
    if harness.rendered(args, render):
        return
    if args.smoke:
        WORK = harness.WORK / "smoke" / "scale"
    if args.child:
        corpus, queries, _ = corpora.real_corpus(
            harness.data_dir(args.data), args.rows, args.queries
        )
        stages = {"prepare": lambda: prepare(corpus, queries), "build": build, "serve": serve}
        stages[args.stage]()
        return
    corpora.real_corpus(
        harness.data_dir(args.data), args.rows, args.queries
    )  # built once, before the children
    out: dict[str, Any] = {}
    saved = Path(args.out + ".json")
    if saved.exists() and not args.smoke:
        out = json.loads(saved.read_text())
    out.pop("faiss", None)  # the Gaussian-mixture figures of the first version
    out.pop("partial", None)
    start = [round(v, 1) for v in os.getloadavg()]
    if args.encoders:
        out["encoders"] = encoders(args.passages)
        out["encoders_load_at_start"] = start
    stages = ["prepare", "build", "serve"] if args.stage == "all" else [args.stage]
    ivf = out.setdefault("ivfpq_1m", {})
    for stage in stages:
        ivf[stage] = _child(stage, args)
        print(stage, json.dumps(ivf[stage])[:400], flush=True)
    ivf["load"] = {"start": start, "end": [round(v, 1) for v in os.getloadavg()]}
    ivf["date"] = time.strftime("%Y-%m-%d %H:%M")
    ivf["command"] = harness.command_line()
    out["machine"] = f"{os.uname().machine} {os.cpu_count()} cores"
    if all(k in ivf for k in ("prepare", "build", "serve")):
        harness.finish(args, render, out)
    elif not args.smoke:  # a stage alone: keep its figures, the section waits for all three
        saved.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
