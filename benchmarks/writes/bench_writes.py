r"""What the engine's writes cost beside a full rebuild, measured in one run.

Every shard keeps the encoder's raw vectors, so changing the searched space (``recalibrate``) or
dropping deleted rows (``compact``) needs no encoder: this script measures how much cheaper
that is than rebuilding the index (``build_index --overwrite``, which re-encodes), and what an
``upsert`` and a ``delete`` of a few rows cost. Corpus: unique STS-B sentences from
``$FLOWSEARCH_DATA`` (default ``../shared/data``), bundled model, ``mean`` pooling, ``auto``
calibration (searched space as auto decides), hybrid index (BM25 included).

Writes ``benchmarks/writes/bench_writes.json`` and ``.md`` beside it.

Usage:
    python -m benchmarks run writes [--data DIR] [--rows 3000] [--changed 100]
    python -m benchmarks run writes --smoke    # tiny sizes, recorded report untouched
    python -m benchmarks run writes --render   # only rewrite the report from the JSON
"""

from __future__ import annotations

import shutil
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import harness
from benchmarks.common.harness import WORK, command_line, data_dir, load_average, markdown, timed

__all__ = ["main", "render"]


def measure(data: Any, rows: int, n: int) -> dict[str, Any]:
    """Seconds of a rebuild, an upsert and a delete of ``n`` rows, compact and recalibrate."""
    from flowsearch import build_index, compact, delete, recalibrate, upsert
    from flowsearch.evaluation.datasets import load_stsb, unique_texts

    pairs = [load_stsb(data, split) for split in ("train", "dev", "test")]
    texts = unique_texts([t for p in pairs for t in (*p.s1, *p.s2)])[:rows]
    work = WORK / "writes"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus = work / "corpus.parquet"
    ids = [f"s{i}" for i in range(len(texts))]
    pq.write_table(pa.table({"id": ids, "text": texts}), corpus)
    index = work / "index"
    build_index(corpus, index)  # warm-up: model load, caches
    seconds: dict[str, float] = {}
    seconds["build (re-encodes)"] = timed(lambda: build_index(corpus, index, overwrite=True))[1]
    changed = [{"id": ids[i], "text": texts[-1 - i]} for i in range(n)]
    seconds[f"upsert {n} rows"] = timed(lambda: upsert(index, changed))[1]
    seconds[f"delete {n} ids"] = timed(lambda: delete(index, ids[n : 2 * n]))[1]
    compacted, seconds["compact"] = timed(lambda: compact(index))
    freed = {
        "version": compacted.version,
        "rows": compacted.n_live,
        "dropped": compacted.n_dropped,
        "bytes_freed": compacted.bytes_freed,
    }
    seconds["recalibrate (whitening)"] = timed(lambda: recalibrate(index, calibration="whitening"))[
        1
    ]
    seconds["recalibrate (auto: whitening-flow)"] = timed(lambda: recalibrate(index))[1]
    build = seconds["build (re-encodes)"]
    return {
        "rows": len(texts),
        "changed": n,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "vs_build": {k: round(v / build, 4) for k, v in seconds.items()},
        "compact": freed,
        "load_average": load_average()[0],
        "command": command_line(),
    }


def render(doc: dict[str, Any]) -> str:
    """The markdown report, from the JSON document :func:`measure` returns."""
    lines = [
        f"{doc['rows']:,} unique STS-B sentences, bundled model, `mean`, `auto`, hybrid index; "
        f"one run, load average {doc['load_average']:.1f} on 2 cores, the third release's "
        "segments. `upsert` and `delete` go through the library without a loaded encoder (the "
        "upsert's time includes loading the model); `recalibrate` refits on the raw vectors "
        "every segment keeps and rewrites the searched space without the encoder.",
        "",
        "| operation | seconds | x build |",
        "|---|---:|---:|",
    ]
    for name, value in doc["seconds"].items():
        lines.append(f"| {name} | {value:.2f} | {doc['vs_build'][name]:.3f} |")
    freed = doc["compact"]
    lines += [
        "",
        f"compact dropped {freed['dropped']} rows and freed "
        f"{freed['bytes_freed'] / 2**20:.2f} MiB.",
    ]
    return markdown(
        "Writes beside a rebuild (`benchmarks/writes/bench_writes.py`)",
        lines,
        doc,
        f"python -m benchmarks run writes --rows {doc['rows']} --changed {doc['changed']}",
    )


def main() -> None:
    """Run the measurements and write the JSON and the markdown report."""
    parser = harness.arguments(__doc__, "300 rows, 20 changed", "bench_writes")
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--changed", type=int, default=100)
    args = harness.parse(parser, rows=300, changed=20)
    if harness.rendered(args, render):
        return
    harness.finish(args, render, measure(data_dir(args.data), args.rows, args.changed))


if __name__ == "__main__":
    main()
