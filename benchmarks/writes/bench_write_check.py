r"""What the check a write makes of the index before it writes (no publishing over damage) costs.

Every write first checks the version it starts from as a reader's open does: each file of the
segments, the calibrator and the reference sample present with its recorded size, and the
files up to 16 MiB with their sha256. Before issue 41 a write only stat'ed the segments' files.
This script builds one index (bundled model, ``static`` pooling, whitening, BM25) and times a
``delete`` of a few ids with each check, alternating, so both see the same machine; the ratio
is the figure.

Writes ``benchmarks/writes/bench_write_check.json`` and ``.md`` beside it.

Usage:
    python -m benchmarks run write_check [--rows 50000] [--rounds 9]
    python -m benchmarks run write_check --smoke    # 2,000 rows, 3 rounds
"""

from __future__ import annotations

import shutil
import statistics
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import harness
from benchmarks.common.harness import WORK, command_line, load_average, markdown, timed

__all__ = ["main", "render"]

_WORDS = [
    "the",
    "sea",
    "tide",
    "ice",
    "heat",
    "wave",
    "snow",
    "wind",
    "storm",
    "calm",
    "river",
    "stone",
    "light",
    "dark",
    "cold",
]


def _sizes_only(writer: Any) -> None:
    """The check before issue 41: the segments' files present with their sizes."""
    from flowsearch.storage.verify import verify_files

    assert writer.base is not None
    for seg in writer.base.segments:
        verify_files(writer.index_dir / seg.dir, seg.files, small=False)


def measure(rows: int, rounds: int, n: int = 20) -> dict[str, Any]:
    """Median seconds of a ``delete`` of ``n`` ids per check, and the check alone."""
    import numpy as np

    from flowsearch import build_index, delete
    from flowsearch.storage import manifest as mf
    from flowsearch.storage.verify import verify
    from flowsearch.storage.writer import Writer

    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(_WORDS, size=12)) + f" {i}" for i in range(rows)]
    work = WORK / "write_check"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus = work / "corpus.parquet"
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(rows)], "text": texts}), corpus)
    index = work / "index"
    build_index(corpus, index, pooling="static", calibration="whitening")
    checks = {"sizes of the segments' files (before)": _sizes_only, "as an open (now)": None}
    original = Writer._check_base
    seconds: dict[str, list[float]] = {name: [] for name in checks}
    next_id = 0
    for _ in range(rounds + 1):  # the first round warms the page cache and imports
        for name, check in checks.items():
            Writer._check_base = check or original  # type: ignore[method-assign]
            ids = [f"d{i}" for i in range(next_id, next_id + n)]
            next_id += n
            seconds[name].append(timed(lambda ids=ids: delete(index, ids))[1])
    Writer._check_base = original  # type: ignore[method-assign]
    manifest = mf.read(index)
    alone = [timed(lambda: verify(index, manifest))[1] for _ in range(rounds)]
    checked = verify(index, manifest)
    medians = {k: statistics.median(v[1:]) for k, v in seconds.items()}
    before, now = medians.values()
    doc = {
        "rows": rows,
        "rounds": rounds,
        "deleted_per_write": n,
        "index_bytes": sum(p.stat().st_size for p in index.rglob("*") if p.is_file()),
        "files": checked.n_files,
        "hashed": checked.n_hashed,
        "seconds": {k: round(v, 4) for k, v in medians.items()},
        "check_alone_s": round(statistics.median(alone), 4),
        "ratio": round(now / before, 3),
        "load_average": load_average()[0],
        "command": command_line(),
    }
    shutil.rmtree(work, ignore_errors=True)
    return doc


def render(doc: dict[str, Any]) -> str:
    """The markdown report, from the JSON document :func:`measure` returns."""
    lines = [
        f"A delete of {doc['deleted_per_write']} ids from a {doc['rows']:,}-row index "
        f"({doc['index_bytes'] / 2**20:.1f} MiB, {doc['files']} files, {doc['hashed']} of them "
        f"small enough to hash), medians of {doc['rounds']} alternating rounds, load average "
        f"{doc['load_average']:.1f} on 2 shared cores.",
        "",
        "| check before the write | seconds |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {value:.3f} |" for name, value in doc["seconds"].items()]
    lines += [
        "",
        f"Ratio now / before: **{doc['ratio']:.2f}x**; the check alone: "
        f"{doc['check_alone_s'] * 1000:.0f} ms.",
    ]
    return markdown(
        "What a write's check of the index costs (`benchmarks/writes/bench_write_check.py`)",
        lines,
        doc,
        f"python -m benchmarks run write_check --rows {doc['rows']} --rounds {doc['rounds']}",
    )


def main() -> None:
    """Run the measurements and write the JSON and the markdown report."""
    parser = harness.arguments(__doc__, "2,000 rows, 3 rounds", "bench_write_check", data=False)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = harness.parse(parser, rows=2000, rounds=3)
    if harness.rendered(args, render):
        return
    harness.finish(args, render, measure(args.rows, args.rounds))


if __name__ == "__main__":
    main()
