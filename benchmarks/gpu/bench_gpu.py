"""The GPU path on a GPU: the CUDA encoder and faiss-gpu (Flat, CAGRA into HNSW) against the CPU.

Runs in under 8 minutes on a CUDA machine with the defaults (issue 44):

1. faiss with GPU support: when the installed ``faiss`` has none, the ``gpu`` extra's
   requirements (``pyproject.toml``; ``faiss-gpu-cu12``) are installed with pip, replacing
   ``faiss-cpu`` (the two wheels ship the same ``faiss`` module), and the script starts again.
2. Encoding: real texts (unique QNLI, SNLI, STS-B and SICK sentences and the retrieval corpora
   of ``$FLOWSEARCH_DATA``) encoded by the default ``Encoder()`` on CUDA (torch, fp16) and a
   sample of them by the CPU's default (ONNX Runtime fp32): rows/s of each, and the sample's
   unit vectors compared (max absolute difference, min cosine; fp16 is not bit-exact, so the
   check is a cosine >= 0.999).
3. Vector search on the encoded corpus (or ``--vectors FILE.npy``, e.g. a 1M-row set): exact
   top 10 by the CPU's ``IndexFlatIP`` (the truth, and the CPU's Flat speed); the same on a
   ``GpuIndexFlatIP``; an HNSW32 graph built on the CPU (efConstruction 80, as ``auto``) against
   a CAGRA graph built on the GPU and copied into a CPU ``IndexHNSWCagra``
   (``GpuIndexCagra.copyTo``) that the CPU then searches, both at several efSearch: recall@10
   and queries/s (one batch, all threads), build seconds, and their ratios.

Prints one line per measurement and writes ``bench_gpu.json`` and ``.md`` (``--out``).

``--cpu-only`` (also ``--smoke``, with small sizes) runs the same code with CPU substitutes: the
"CUDA" encoder is torch on the CPU, the GPU Flat is the CPU's, the CAGRA graph is an
``IndexHNSWCagra`` built on the CPU; every CUDA part says, in one line, that it was skipped. The
default test suite runs it so (``tests/test_bench_gpu.py``). Figures from a ``--cpu-only`` run
are no GPU figures: its report says ``"cuda": false``.

Usage:
    python -m benchmarks run gpu [--rows 0] [--queries 1000] [--cpu-sample 2000]
        [--vectors FILE.npy] [--no-install]
    python -m benchmarks run gpu --cpu-only [--rows 3000]
    python -m benchmarks run gpu --smoke
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from benchmarks.common import harness

ROOT = harness.ROOT
K = 10
#: efSearch values both HNSW graphs are searched at.
EF_SEARCH = (32, 64, 128, 256)
#: The CPU graph ``auto`` builds: HNSW32, efConstruction 80.
HNSW_M, EF_CONSTRUCTION = 32, 80
#: CUDA vectors (fp16) against the CPU's (fp32): smallest cosine accepted.
MIN_COSINE = 0.999
SKIP = "skipped (no CUDA: --cpu-only)"


def say(line: str) -> None:
    """One progress line on stdout, at once."""
    print(line, flush=True)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


# -- set-up -----------------------------------------------------------------------------------


def cuda_ready() -> tuple[bool, str]:
    """Whether torch sees a CUDA device, and what it is."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, torch.cuda.get_device_name(0)


def gpu_extra() -> list[str]:
    """The ``gpu`` extra's requirements, as ``pyproject.toml`` names them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return list(project["project"]["optional-dependencies"]["gpu"])


def faiss_has_gpu() -> bool:
    import faiss

    return hasattr(faiss, "GpuIndexCagra") and faiss.get_num_gpus() > 0


def install_gpu_faiss() -> None:
    """Replaces faiss-cpu by the ``gpu`` extra's faiss and starts this script again (a loaded
    ``faiss`` module cannot be swapped in place).

    Raises:
        SystemExit: pip failed (one line: what to install by hand).
    """
    wanted = gpu_extra()
    say(f"faiss has no GPU support here: installing {' '.join(wanted)}")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "uninstall", "-y", "faiss-cpu"], check=False)
    done = subprocess.run([*pip, "install", *wanted], check=False)
    if done.returncode != 0:
        raise SystemExit(f"could not install {' '.join(wanted)}: install it, then run again")
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.gpu.bench_gpu", *sys.argv[1:]])


# -- data -------------------------------------------------------------------------------------


def text_pool(data: Path) -> list[str]:
    """Unique real texts of the evaluation data, in a fixed order (see the module docstring)."""
    seen: dict[str, None] = {}

    def take(texts: Any) -> None:
        seen.update(dict.fromkeys(t.strip() for t in texts if t and t.strip()))

    for split in ("dev", "test"):
        lines = (data / "qnli" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
        take(c for line in lines for c in line.split("\t")[1:3])
        for side in ("s1", "s2"):
            take((data / "snli" / f"{side}.{split}").read_text(encoding="utf-8").splitlines())
    for name in ("sts-train.csv", "sts-dev.csv", "sts-test.csv"):
        lines = (data / "stsb" / name).read_text(encoding="utf-8").splitlines()
        take(c for line in lines for c in line.split("\t")[5:7])
    for corpus in sorted((data / "retrieval").glob("*/corpus.jsonl")):
        for line in corpus.read_text(encoding="utf-8").splitlines():
            take([json.loads(line).get("text", "")])
    return list(seen)


def split_texts(pool: list[str], rows: int, queries: int) -> tuple[list[str], list[str]]:
    """Held-out queries and the corpus (``rows`` 0: all the rest), from a seeded shuffle."""
    order = np.random.default_rng(0).permutation(len(pool))
    shuffled = [pool[i] for i in order]
    held_out, rest = shuffled[:queries], shuffled[queries:]
    return held_out, rest[:rows] if rows else rest


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# -- encoding ---------------------------------------------------------------------------------


def encode_check(
    corpus: list[str], queries: list[str], sample: int, cuda: bool, batch: int,
    model: str | None = None,
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:  # fmt: skip
    """The corpus and queries encoded on CUDA (``cuda`` false: torch on the CPU in its place),
    a sample re-encoded by the CPU's default; rows/s, the sample's agreement, the unit vectors."""
    from flowsearch.encode.encoder import Encoder

    fast = Encoder(model) if cuda else Encoder(model, backend="torch", device="cpu")
    if cuda and fast.device != "cuda":
        raise SystemExit(f"the default encoder runs on {fast.device}, not CUDA")
    cpu = Encoder(model, device="cpu")
    fast.encode(corpus[:batch], batch_size=batch, progress=False)  # warm-up (CUDA kernels)
    xb, seconds = timed(lambda: fast.encode(corpus, batch_size=batch, progress=False))
    xq = fast.encode(queries, batch_size=batch, progress=False)
    part = corpus[:sample]
    cpu.encode(part[:batch], batch_size=batch, progress=False)
    on_cpu, cpu_seconds = timed(lambda: cpu.encode(part, batch_size=batch, progress=False))
    a, b = unit(xb[: len(part)]), unit(on_cpu)
    cosine = (a * b).sum(1)
    row = {
        "encoder": repr(fast),
        "device": fast.device,
        "rows": len(corpus),
        "rows_per_s": len(corpus) / seconds,
        "cpu_encoder": repr(cpu),
        "cpu_rows": len(part),
        "cpu_rows_per_s": len(part) / cpu_seconds,
        "max_unit_difference": float(np.abs(a - b).max()),
        "min_cosine": float(cosine.min()),
    }
    row["speedup"] = row["rows_per_s"] / row["cpu_rows_per_s"]
    row["agrees"] = row["min_cosine"] >= MIN_COSINE
    return row, unit(xb), unit(xq)


# -- vector search ----------------------------------------------------------------------------


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    hits = sum(len(set(f[f >= 0]) & set(t)) for f, t in zip(found[:, :K], truth[:, :K]))
    return hits / truth[:, :K].size


def searched(index: Any, xq: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """One batch search: queries/s and recall@10 against ``truth`` (after one warm-up)."""
    index.search(xq[: min(len(xq), 32)], K)
    (_, ids), seconds = timed(lambda: index.search(xq, K))
    return {"qps": len(xq) / seconds, "recall": recall_at_k(ids, truth)}


def hnsw_sweep(index: Any, xq: np.ndarray, truth: np.ndarray) -> dict[str, dict[str, float]]:
    out = {}
    for ef in EF_SEARCH:
        index.hnsw.efSearch = ef
        out[str(ef)] = searched(index, xq, truth)
    return out


def cagra_graph(xb: np.ndarray, cuda: bool) -> tuple[Any, float, str]:
    """A CAGRA graph built on the GPU and copied into a CPU ``IndexHNSWCagra``; without CUDA,
    an ``IndexHNSWCagra`` built on the CPU in its place. (index, build seconds, how)."""
    import faiss

    d = xb.shape[1]
    if not cuda:
        cpu = faiss.IndexHNSWCagra(d, HNSW_M // 2, faiss.METRIC_INNER_PRODUCT)
        cpu.hnsw.efConstruction = EF_CONSTRUCTION
        _, seconds = timed(lambda: cpu.add(xb))
        return cpu, seconds, "IndexHNSWCagra built on the CPU (substitute)"
    res = faiss.StandardGpuResources()
    config = faiss.GpuIndexCagraConfig()
    config.graph_degree = HNSW_M
    config.intermediate_graph_degree = 2 * HNSW_M
    # L2 on unit vectors ranks as inner product does
    gpu = faiss.GpuIndexCagra(res, d, faiss.METRIC_L2, config)
    _, build = timed(lambda: gpu.train(xb))
    cpu = faiss.IndexHNSWCagra(d, HNSW_M // 2, faiss.METRIC_L2)
    cpu.base_level_only = True
    cpu.num_base_level_search_entrypoints = 32
    _, copy = timed(lambda: gpu.copyTo(cpu))
    return cpu, build + copy, "GpuIndexCagra.train, copyTo(IndexHNSWCagra), searched on the CPU"


def ann_check(xb: np.ndarray, xq: np.ndarray, cuda: bool) -> dict[str, Any]:
    import faiss

    d = xb.shape[1]
    out: dict[str, Any] = {"rows": len(xb), "queries": len(xq), "dim": d}
    flat = faiss.IndexFlatIP(d)
    flat.add(xb)
    (_, truth), flat_seconds = timed(lambda: flat.search(xq, K))
    out["cpu_flat"] = {"qps": len(xq) / flat_seconds, "recall": 1.0}
    say(f"CPU Flat: {out['cpu_flat']['qps']:,.0f} queries/s (the truth)")
    if cuda:
        res = faiss.StandardGpuResources()
        gpu_flat = faiss.GpuIndexFlatIP(res, d)
        gpu_flat.add(xb)
        out["gpu_flat"] = searched(gpu_flat, xq, truth)
        out["gpu_flat"]["vs_cpu"] = out["gpu_flat"]["qps"] / out["cpu_flat"]["qps"]
        say(
            f"GPU Flat: {out['gpu_flat']['qps']:,.0f} queries/s "
            f"({out['gpu_flat']['vs_cpu']:.1f}x the CPU), recall@10 {out['gpu_flat']['recall']:.4f}"
        )
    else:
        out["gpu_flat"] = None
        say(f"GPU Flat: {SKIP}")
    hnsw = faiss.IndexHNSWFlat(d, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efConstruction = EF_CONSTRUCTION
    _, hnsw_build = timed(lambda: hnsw.add(xb))
    out["cpu_hnsw"] = {"build_s": hnsw_build, "search": hnsw_sweep(hnsw, xq, truth)}
    graph, graph_build, how = cagra_graph(xb, cuda)
    out["cagra_hnsw"] = {"how": how, "build_s": graph_build, "search": hnsw_sweep(graph, xq, truth)}
    out["cagra_hnsw"]["build_speedup"] = hnsw_build / graph_build
    say(
        f"graph build: CPU HNSW{HNSW_M} {hnsw_build:.1f} s; {how}: {graph_build:.1f} s "
        f"({out['cagra_hnsw']['build_speedup']:.1f}x)"
    )
    for ef in EF_SEARCH:
        a, b = out["cpu_hnsw"]["search"][str(ef)], out["cagra_hnsw"]["search"][str(ef)]
        b["qps_vs_cpu_hnsw"] = b["qps"] / a["qps"]
        say(
            f"efSearch {ef}: CPU HNSW recall {a['recall']:.3f} at {a['qps']:,.0f} q/s; "
            f"CAGRA->HNSW on the CPU recall {b['recall']:.3f} at {b['qps']:,.0f} q/s "
            f"({b['qps_vs_cpu_hnsw']:.2f}x)"
        )
    return out


# -- the run ----------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    """The markdown report."""
    enc, ann = report["encoding"], report["ann"]
    where = report["device"] if report["cuda"] else "no CUDA device: CPU substitutes only"
    lines = [
        f"{where}; {report['cpus']} CPUs, load {report['load_before']} before and "
        f"{report['load_after']} after.",
        "",
        f"Encoding {enc['rows']:,} texts: {enc['encoder']} {enc['rows_per_s']:,.0f} rows/s; "
        f"CPU default {enc['cpu_encoder']} {enc['cpu_rows_per_s']:,.0f} rows/s on "
        f"{enc['cpu_rows']:,} of them ({enc['speedup']:.1f}x); their unit vectors differ by at "
        f"most {enc['max_unit_difference']:.1e}, min cosine {enc['min_cosine']:.6f} "
        f"(>= {MIN_COSINE}: {'yes' if enc['agrees'] else 'no'}).",
        "",
        f"Search, {ann['rows']:,} rows x {ann['dim']}, {ann['queries']:,} held-out queries, "
        f"recall@10 against the CPU's exact Flat ({ann['cpu_flat']['qps']:,.0f} q/s).",
    ]
    if ann["gpu_flat"]:
        g = ann["gpu_flat"]
        lines.append(
            f"GPU Flat: {g['qps']:,.0f} q/s ({g['vs_cpu']:.1f}x), recall {g['recall']:.4f}."
        )
    else:
        lines.append(f"GPU Flat: {SKIP}.")
    c, h = ann["cagra_hnsw"], ann["cpu_hnsw"]
    lines += [
        "",
        f"Graphs: CPU HNSW{HNSW_M} (efConstruction {EF_CONSTRUCTION}) built in "
        f"{h['build_s']:.1f} s; {c['how']}: {c['build_s']:.1f} s ({c['build_speedup']:.1f}x).",
        "",
        "| efSearch | CPU HNSW recall | q/s | CAGRA->HNSW recall | q/s | q/s ratio |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for ef in EF_SEARCH:
        a, b = h["search"][str(ef)], c["search"][str(ef)]
        lines.append(
            f"| {ef} | {a['recall']:.3f} | {a['qps']:,.0f} | {b['recall']:.3f} | "
            f"{b['qps']:,.0f} | {b['qps_vs_cpu_hnsw']:.2f}x |"
        )
    default = "python -m benchmarks run gpu"
    return harness.markdown("The GPU path (`bench_gpu.py`)", lines, report, default)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = harness.arguments(__doc__, "--cpu-only on 1,500 texts", "bench_gpu")
    parser.add_argument("--cpu-only", action="store_true", help="CPU substitutes, no CUDA")
    parser.add_argument("--rows", type=int, default=0, help="corpus texts (0: all)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--cpu-sample", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vectors", type=Path, help="search these unit rows (.npy) instead")
    parser.add_argument("--no-install", action="store_true", help="never pip install")
    parser.add_argument("--model", default=None, help="encoder model (default: the bundled one)")
    args = harness.parse(
        parser, argv, cpu_only=True, rows=1500, queries=100, cpu_sample=200, batch=64
    )
    args.smoke = args.smoke or args.cpu_only  # CPU substitutes never replace the recorded report
    cuda, device = (False, "") if args.cpu_only else cuda_ready()
    if not args.cpu_only and not cuda:
        raise SystemExit(f"no CUDA here ({device}): run on a CUDA machine, or pass --cpu-only")
    if cuda and not faiss_has_gpu():
        if args.no_install:
            raise SystemExit(f"faiss has no GPU support: pip install {' '.join(gpu_extra())}")
        install_gpu_faiss()
    say(f"CUDA: {device}" if cuda else "CUDA: none; every CUDA part runs a CPU substitute")
    report: dict[str, Any] = {
        "cuda": cuda,
        "device": device,
        "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "command": harness.command_line(),
    }
    pool = text_pool(harness.data_dir(args.data))
    queries, corpus = split_texts(pool, args.rows, args.queries)
    say(f"texts: {len(corpus):,} corpus rows, {len(queries):,} held-out queries")
    row, xb, xq = encode_check(corpus, queries, args.cpu_sample, cuda, args.batch, args.model)
    report["encoding"] = row
    say(
        f"encoding: {row['rows_per_s']:,.0f} rows/s on {row['device']} vs CPU default "
        f"{row['cpu_rows_per_s']:,.0f} ({row['speedup']:.1f}x); min cosine {row['min_cosine']:.6f}"
        f" ({'agrees' if row['agrees'] else 'DISAGREES'})"
    )
    if args.vectors is not None:
        xb = unit(np.load(args.vectors))
    report["ann"] = ann_check(np.ascontiguousarray(xb), np.ascontiguousarray(xq), cuda)
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    harness.finish(args, render, report)
    return report


if __name__ == "__main__":
    main()
