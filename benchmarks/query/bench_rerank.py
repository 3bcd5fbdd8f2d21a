r"""Latency a cross-encoder rerank adds per query, at rerank depths 20, 50 and 100.

No cross-encoder weights exist on these machines (and none can be fetched), so the models are
randomly initialised BERT classifiers of two shapes, saved and loaded as sentence-transformers'
``CrossEncoder`` loads any model (the code path of a real one; the cost of a forward pass does
not depend on the weights' values):

- ``tiny``: hidden 32, 2 layers (the tests' shape), over the bundled model's vocabulary;
- ``MiniLM-L6``: the shape of ``cross-encoder/ms-marco-MiniLM-L6-v2`` (hidden 384, 6 layers, 12
  heads, intermediate 1536, the 30,522-word BERT vocabulary, window 512 tokens).

Corpus: the TREC DL 2019 passages of the evaluation data (``retrieval/trec-dl19-passage``:
MS MARCO passages, real lengths), indexed with the bundled model; queries: its 43 questions.
One query at a time through ``Searcher.search(q, k=10)``: without a reranker (the first stage),
and with each model at each depth. Every configuration answers a query before the next query
(interleaved, so the shared machine's load falls on all alike), after a warm-up pass; the
figure is each configuration's p50 and its p50 less the first stage's. Quality is not measured:
random weights rank at random.

Writes ``benchmarks/query/bench_rerank.json`` and ``.md`` (also printed); ``--render`` only
rewrites the markdown from the saved JSON.

Usage (about 5 minutes on 2 loaded cores)::

    python -m benchmarks run rerank [--data ../shared/data] [--rows 4297] [--queries 43]
        [--repeats 3] [--warmup 3] [--depths 20 50 100]
    python -m benchmarks run rerank --smoke     # 300 rows, 5 queries, depth 20 only
    python -m benchmarks run rerank --cross-encoder-only   # the cross-encoder alone, no index
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness

DEPTHS = (20, 50, 100)
#: The two cross-encoder shapes: (hidden, layers, heads, intermediate, window).
SHAPES = {"tiny": (32, 2, 2, 37, 512), "MiniLM-L6": (384, 6, 12, 1536, 512)}


def _bundled_tokenizer_dir() -> Path:
    from flowsearch.encode.model_files import bundled_model_dir

    return Path(bundled_model_dir())


def random_cross_encoder(out: Path, shape: tuple[int, int, int, int, int], seed: int = 0) -> Path:
    """A randomly initialised one-label BERT classifier of ``shape``, saved at ``out`` with the
    bundled model's tokenizer (a directory ``CrossEncoder`` loads)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    hidden, layers, heads, intermediate, window = shape
    tokenizer = AutoTokenizer.from_pretrained(_bundled_tokenizer_dir())
    tokenizer.model_max_length = window
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate,
                        max_position_embeddings=window, num_labels=1)  # fmt: skip
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _corpus(data: Path, rows: int) -> tuple[list[dict[str, Any]], list[str]]:
    folder = data / "retrieval" / "trec-dl19-passage"
    if not folder.is_dir():
        raise SystemExit(f"no {folder}: the evaluation data's retrieval collections are needed")
    with (folder / "corpus.jsonl").open(encoding="utf-8") as f:
        docs = [json.loads(line) for _, line in zip(range(rows), f, strict=False)]
    with (folder / "queries.jsonl").open(encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for line in f]
    return [{"id": d["_id"], "text": d["text"]} for d in docs], queries


def measure_scores(args: argparse.Namespace) -> dict[str, Any]:
    """``--cross-encoder-only``: the cross-encoder's own time for one query's ``depth`` pairs
    (the query and real passages; no index, so no first stage): what a rerank adds, less the
    first stage's deeper search."""
    from flowsearch.search.rerank import Reranker

    data = Path(args.data) if args.data else harness.data_dir()
    records, queries = _corpus(data, args.rows)
    queries = queries[: args.queries]
    texts = [r["text"] for r in records]
    work = Path(tempfile.mkdtemp(prefix="bench_rerank-", dir=harness.WORK))
    try:
        models = {name: Reranker.load(random_cross_encoder(work / name, shape))
                  for name, shape in SHAPES.items()}  # fmt: skip
        calls = {f"{name} @{d}": (model, d) for name, model in models.items() for d in args.depths}
        rng = np.random.default_rng(0)
        times: dict[str, list[float]] = {label: [] for label in calls}
        for round_ in range(args.repeats + 1):  # the first round is the warm-up
            for q in queries:
                picked = [texts[i] for i in rng.choice(len(texts), max(args.depths), False)]
                for label, (model, depth) in calls.items():
                    t = time.perf_counter()
                    model.scores([(q, p) for p in picked[:depth]])
                    if round_:
                        times[label].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    p50 = {label: float(np.median(ts)) * 1000 for label, ts in times.items()}
    return {
        "command": harness.command_line(),
        "cross_encoder_only": True,
        "rows": len(records),
        "queries": len(queries),
        "repeats": args.repeats,
        "p50_ms": p50,
        "p95_ms": {label: float(np.percentile(ts, 95)) * 1000 for label, ts in times.items()},
        "machine": harness.machine(),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from flowsearch.search.rerank import Reranker
    from flowsearch.search.searcher import Searcher
    from flowsearch.writes.build import build_index

    data = Path(args.data) if args.data else harness.data_dir()
    records, queries = _corpus(data, args.rows)
    queries = queries[: args.queries]
    work = Path(tempfile.mkdtemp(prefix="bench_rerank-", dir=harness.WORK))
    try:
        start = time.perf_counter()
        build_index(records, work / "idx")
        build_s = time.perf_counter() - start
        models = {name: Reranker.load(random_cross_encoder(work / name, shape))
                  for name, shape in SHAPES.items()}  # fmt: skip
        base = Searcher.open(work / "idx")
        searchers = {"first stage": base}
        for name, model in models.items():
            for depth in args.depths:
                searchers[f"{name} @{depth}"] = Searcher.open(
                    work / "idx", encoder=base.encoder, reranker=model, rerank_depth=depth
                )
        for s in searchers.values():  # warm-up: the first queries once
            for q in queries[: args.warmup]:
                s.search(q, k=10)
        times: dict[str, list[float]] = {label: [] for label in searchers}
        for _ in range(args.repeats):
            for q in queries:
                for label, s in searchers.items():
                    t = time.perf_counter()
                    s.search(q, k=10)
                    times[label].append(time.perf_counter() - t)
        for s in searchers.values():
            s.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    p50 = {label: float(np.median(ts)) * 1000 for label, ts in times.items()}
    return {
        "command": harness.command_line(),
        "rows": len(records),
        "queries": len(queries),
        "repeats": args.repeats,
        "warmup": args.warmup,
        "build_s": build_s,
        "p50_ms": p50,
        "p95_ms": {label: float(np.percentile(ts, 95)) * 1000 for label, ts in times.items()},
        "added_ms": {label: p50[label] - p50["first stage"] for label in p50},
        "machine": harness.machine(),
    }


def render_scores(report: dict[str, Any]) -> str:
    lines = [
        f"The cross-encoder alone: one query's `depth` (query, passage) pairs of TREC DL 2019 "
        f"passages, {report['queries']} queries x {report['repeats']} rounds after a warm-up "
        f"round; randomly initialised cross-encoders; load {report['machine']['load']}.",
        "",
        "| cross-encoder @ depth | p50 per query | p95 |",
        "|---|---:|---:|",
    ]
    for label, p50 in report["p50_ms"].items():
        lines.append(f"| {label} | {p50:.1f} ms | {report['p95_ms'][label]:.1f} ms |")
    default = "python -m benchmarks run rerank --cross-encoder-only"
    return harness.markdown("Rerank latency (cross-encoder only)", lines, report, default)


def render(report: dict[str, Any]) -> str:
    if report.get("cross_encoder_only"):
        return render_scores(report)
    base = report["p50_ms"]["first stage"]
    lines = [
        f"{report['rows']:,} TREC DL 2019 passages, {report['queries']} queries x "
        f"{report['repeats']} rounds, one at a time, `search(q, k=10)`; randomly initialised "
        f"cross-encoders (no weights on this machine); load {report['machine']['load']}.",
        "",
        "| configuration | p50 | p95 | added per query (p50) | / first stage |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, p50 in report["p50_ms"].items():
        lines.append(
            f"| {label} | {p50:.1f} ms | {report['p95_ms'][label]:.1f} ms | "
            f"{report['added_ms'][label]:+.1f} ms | {p50 / base:.1f}x |"
        )
    return harness.markdown("Rerank latency", lines, report, "python -m benchmarks run rerank")


def main() -> None:
    parser = harness.arguments(__doc__, "300 rows, 5 queries, depth 20", "bench_rerank")
    parser.add_argument("--rows", type=int, default=4297, help="passages indexed")
    parser.add_argument("--queries", type=int, default=43, help="queries timed")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the queries")
    parser.add_argument("--warmup", type=int, default=3, help="queries run once untimed")
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    parser.add_argument(
        "--cross-encoder-only", action="store_true",
        help="time the cross-encoder alone (no index; report: bench_rerank_scores)",
    )  # fmt: skip
    args = harness.parse(parser, rows=300, queries=5, repeats=1, warmup=1, depths=[20])
    if args.cross_encoder_only and args.out.endswith("bench_rerank"):
        args.out += "_scores"
    if harness.rendered(args, render):
        return
    harness.WORK.mkdir(parents=True, exist_ok=True)
    harness.finish(args, render, (measure_scores if args.cross_encoder_only else measure)(args))


if __name__ == "__main__":
    harness.script(main)
