r"""What the engine's writes cost beside a full rebuild, measured in one run.

Every shard keeps the encoder's raw vectors, so changing the searched space (``recalibrate``) or
dropping deleted rows (``compact``) needs no encoder: this script measures how much cheaper
that is than rebuilding the index (``build_index --overwrite``, which re-encodes), and what an
``upsert`` and a ``delete`` of a few rows cost. Corpus: unique STS-B sentences from
``$FLOWSEARCH_DATA`` (default ``../shared/data``), bundled model, ``mean`` pooling, ``auto``
calibration (searched space as auto decides), hybrid index (BM25 included).

Writes ``benchmarks/bench_writes.json`` and its section of ``benchmarks/RESULTS.md``.

Usage:
    python benchmarks/bench_writes.py [--rows 3000] [--changed 100]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from results_md import write_section

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    """Run the measurements and write the JSON and the RESULTS.md section."""
    from flowsearch import build_index, compact, delete, recalibrate, upsert
    from flowsearch.evaluation.datasets import load_stsb, unique_texts

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--changed", type=int, default=100)
    args = parser.parse_args()
    data = os.environ.get("FLOWSEARCH_DATA", str(ROOT.parent / "shared" / "data"))
    pairs = [load_stsb(data, split) for split in ("train", "dev", "test")]
    texts = unique_texts([t for p in pairs for t in (*p.s1, *p.s2)])[: args.rows]
    work = ROOT / "benchmarks" / "_work" / "writes"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus = work / "corpus.parquet"
    ids = [f"s{i}" for i in range(len(texts))]
    pq.write_table(pa.table({"id": ids, "text": texts}), corpus)
    index = work / "index"
    build_index(corpus, index)  # warm-up: model load, caches
    seconds: dict[str, float] = {}
    seconds["build (re-encodes)"], _ = _timed(lambda: build_index(corpus, index, overwrite=True))
    n = args.changed
    changed = [{"id": ids[i], "text": texts[-1 - i]} for i in range(n)]
    seconds[f"upsert {n} rows"], _ = _timed(lambda: upsert(index, changed))
    seconds[f"delete {n} ids"], _ = _timed(lambda: delete(index, ids[n : 2 * n]))
    seconds["compact"], freed = _timed(lambda: compact(index))
    seconds["recalibrate (whitening)"], _ = _timed(
        lambda: recalibrate(index, calibration="whitening")
    )
    seconds["recalibrate (auto: whitening-flow)"], _ = _timed(lambda: recalibrate(index))
    build = seconds["build (re-encodes)"]
    doc = {
        "rows": len(texts),
        "changed": n,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "vs_build": {k: round(v / build, 4) for k, v in seconds.items()},
        "compact": freed,
        "load_average": os.getloadavg()[0],
    }
    (ROOT / "benchmarks" / "bench_writes.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "## Writes beside a rebuild (`benchmarks/bench_writes.py`)",
        "",
        f"{len(texts):,} unique STS-B sentences, bundled model, `mean`, `auto`, hybrid index; "
        f"one run, load average {doc['load_average']:.1f} on 2 cores. `recalibrate` refits on the "
        "raw vectors the shards keep and rewrites the searched space without the encoder.",
        "",
        "| operation | seconds | x build |",
        "|---|---:|---:|",
    ]
    for name, value in seconds.items():
        lines.append(f"| {name} | {value:.2f} | {value / build:.3f} |")
    lines.append("")
    lines.append(
        f"compact dropped {freed['dropped']} rows and freed {freed['bytes_freed'] / 2**20:.2f} MiB."
    )
    write_section(ROOT / "benchmarks" / "RESULTS.md", "\n".join(lines), "bench_writes")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
