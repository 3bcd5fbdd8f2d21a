"""Figures for docs/SCALE.md: encoder rows/s on this machine, FAISS memory and QPS at 1M.

Writes benchmarks/bench_scale.json. Small on purpose (the machine is 2 shared cores): encoders
are timed on a few hundred passages, HNSW on 200k vectors (its memory per row is exact; its
build time is what stops a 1M run here).

    python benchmarks/bench_scale.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def _rss_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20


def encoders(n: int) -> dict[str, float]:
    import torch
    from corpus_helpers import sentences
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from flowsearch.encoder import Encoder

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
        np.mean([len(enc._tokenizer(x)["input_ids"]) for x in texts[:200]])
    )
    return out


def faiss_figures(rows: int, dim: int = 384) -> dict[str, dict[str, float]]:
    import faiss

    faiss.omp_set_num_threads(2)
    rng = np.random.default_rng(0)
    # clustered data (a Gaussian mixture), so IVF lists are realistic, not uniform noise
    centers = rng.normal(size=(1000, dim)).astype(np.float32)
    x = np.empty((rows, dim), dtype=np.float32)
    for s in range(0, rows, 100_000):
        k = min(100_000, rows - s)
        x[s : s + k] = centers[rng.integers(0, 1000, k)] + 0.7 * rng.normal(size=(k, dim))
    faiss.normalize_L2(x)
    q = x[rng.choice(rows, 200, replace=False)] + 0.05 * rng.normal(size=(200, dim)).astype(
        np.float32
    )
    faiss.normalize_L2(q)
    flat = faiss.IndexFlatIP(dim)
    flat.add(x)
    truth = flat.search(q, 10)[1]
    results: dict[str, dict[str, float]] = {}

    def measure(name: str, index: faiss.Index, n: int, build_s: float) -> None:
        path = f"/tmp/bench_scale_{os.getpid()}.faiss"
        faiss.write_index(index, path)
        size = os.path.getsize(path)
        os.remove(path)
        t = time.perf_counter()
        _, found = index.search(q, 10)
        qps = len(q) / (time.perf_counter() - t)
        tr = truth if n == rows else faiss.IndexFlatIP(dim)
        if n != rows:
            tr.add(x[:n])
            tr = tr.search(q, 10)[1]
        recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, tr)]))
        results[name] = {
            "rows": n,
            "bytes": size,
            "bytes_per_row": size / n,
            "qps_2_threads": qps,
            "recall@10": recall,
            "build_s": build_s,
        }
        print(name, results[name], flush=True)

    measure("Flat", flat, rows, 0.0)
    for factory, nprobe in (("IVF4096,PQ64", 32), ("OPQ64,IVF4096,PQ64", 32)):
        t = time.perf_counter()
        ix = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        ix.train(x[rng.choice(rows, min(rows, 150_000), replace=False)])
        ix.add(x)
        faiss.extract_index_ivf(ix).nprobe = nprobe
        measure(f"{factory} nprobe={nprobe}", ix, rows, time.perf_counter() - t)
    n_h = min(rows, 200_000)
    t = time.perf_counter()
    hnsw = faiss.index_factory(dim, "HNSW32", faiss.METRIC_INNER_PRODUCT)
    hnsw.add(x[:n_h])
    hnsw.hnsw.efSearch = 64
    measure("HNSW32 efSearch=64", hnsw, n_h, time.perf_counter() - t)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--passages", type=int, default=256)
    args = parser.parse_args()
    load = os.getloadavg()
    out = {
        "machine": f"{os.uname().machine} {os.cpu_count()} cores",
        "load_at_start": [round(v, 1) for v in load],
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "encoders": encoders(args.passages),
    }
    print(out["encoders"], flush=True)
    out["faiss"] = faiss_figures(args.rows)
    (HERE / "bench_scale.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
