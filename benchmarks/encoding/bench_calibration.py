r"""What calibration costs beside encoding: fit and per-query transform time, as ratios.

The encoder dominates an index's cost; calibrating must be noise beside it. This script measures,
in one run and interleaved (so the machine's load hits both alike):

- encoding rate of the bundled all-MiniLM-L6-v2 (``mean``, batch 64) on passages made from the
  sample corpus, timed on a ``--encode-rows`` subset, median of ``--repeats`` runs;
- fitting each calibrator on ``--rows`` vectors of those passages (dimension 384; default 10,000,
  the size the core issue names), after a warm-up fit, median of ``--repeats`` runs, reported as
  seconds and as a fraction of the time encoding the same rows takes;
- per-query cost: one vector through the fitted calibrator against one query through the encoder.

Writes ``benchmarks/encoding/bench_calibration.json`` and ``.md`` beside it.

Usage:
    python -m benchmarks run calibration [--rows 10000] [--encode-rows 2000] [--repeats 3]
    python -m benchmarks run calibration --smoke    # tiny sizes, recorded report untouched
    python -m benchmarks run calibration --render   # the report again from the JSON
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial
from typing import Any

import pyarrow.parquet as pq

from benchmarks.common import harness
from benchmarks.common.corpora import synthetic_corpus
from benchmarks.common.harness import WORK, command_line, machine, markdown, timed

__all__ = ["main"]

SECTION = "bench_calibration"
CALIBRATORS: list[tuple[str, dict[str, Any]]] = [
    ("flow", {}),
    ("flow", {"levels": 2}),
    ("whitening-flow", {}),
    ("whitening", {}),
    ("whitening", {"k": 256}),
    ("sn", {}),
    ("natsv", {"k": 6}),
]


def _timed(fn: Any) -> float:
    return timed(fn)[1]


def _fit(name: str, kw: dict[str, Any], U: Any) -> None:
    from flowsearch import make_calibrator

    make_calibrator(name, **kw).fit(U)


def _label(name: str, kw: dict[str, Any]) -> str:
    return name + (" (" + ", ".join(f"{k}={v}" for k, v in kw.items()) + ")" if kw else "")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from flowsearch import Encoder, make_calibrator

    path = synthetic_corpus(WORK / "calibration_texts.parquet", args.rows)
    texts = pq.read_table(path).column("text").to_pylist()
    enc = Encoder()
    enc.encode(texts[:64])  # warm-up
    subset = texts[: args.encode_rows]

    U = enc.encode(texts, batch_size=64, progress=False)
    encode_s: list[float] = []
    fits: dict[str, list[float]] = {_label(n, kw): [] for n, kw in CALIBRATORS}
    for name, kw in CALIBRATORS:  # warm-up fits on a small slice
        make_calibrator(name, **kw).fit(U[:1000])
    for _ in range(args.repeats):
        encode_s.append(_timed(lambda: enc.encode(subset, batch_size=64, progress=False)))
        for name, kw in CALIBRATORS:
            fits[_label(name, kw)].append(_timed(partial(_fit, name, kw, U)))
    encode_rate = args.encode_rows / statistics.median(encode_s)
    encode_all_s = args.rows / encode_rate

    m = machine()
    query = ["how does a heat pump warm a house in winter"]
    enc_query = statistics.median(_timed(lambda: enc.encode(query)) for _ in range(30))
    rows = []
    for name, kw in CALIBRATORS:
        cal = make_calibrator(name, **kw).fit(U)
        one = U[:1]
        cal.transform(one)
        per_query = statistics.median(_timed(partial(cal.transform, one)) for _ in range(200))
        fit_s = statistics.median(fits[_label(name, kw)])
        rows.append(
            {
                "calibrator": _label(name, kw),
                "fit_s": fit_s,
                "fit_vs_encoding": fit_s / encode_all_s,
                "query_ms": per_query * 1e3,
                "query_vs_encoding": per_query / enc_query,
                "fit_stats": {k: v for k, v in cal.fit_stats.items() if isinstance(v, float | int)},
            }
        )
    return {
        "rows": args.rows,
        "dim": int(U.shape[1]),
        "repeats": args.repeats,
        "encode_rows_per_s": encode_rate,
        "encode_all_s": encode_all_s,
        "encode_query_ms": enc_query * 1e3,
        "calibrators": rows,
        "machine": f"{m['platform']}, {m['cpus']} cores, load {m['load'][0]:.1f}",
        "command": command_line(),
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"{res['rows']:,} vectors of dimension {res['dim']} (all-MiniLM-L6-v2, `mean`); encoding "
        f"them takes {res['encode_all_s']:.0f} s here ({res['encode_rows_per_s']:.0f} rows/s), "
        f"one query {res['encode_query_ms']:.1f} ms. Medians of {res['repeats']} runs, "
        f"interleaved with the encoding runs ({res['machine']}).",
        "",
        "| calibrator | fit (s) | fit / encoding | per query (ms) | per query / encoding |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in res["calibrators"]:
        lines.append(
            f"| {r['calibrator']} | {r['fit_s']:.2f} | {r['fit_vs_encoding']:.3f} | "
            f"{r['query_ms']:.3f} | {r['query_vs_encoding']:.4f} |"
        )
    flow = res["calibrators"][0]["fit_stats"]
    lines += [
        "",
        f"The default flow (3 levels x depth 3, width 32, 1 epoch, batch 64) ran "
        f"{flow.get('steps', '?')} Adam steps; bits/dim went from "
        f"{flow.get('bits_per_dim_first_batch', float('nan')):.3f} on the first batch to "
        f"{flow.get('bits_per_dim', float('nan')):.3f} over the corpus.",
    ]
    return markdown(
        "Calibration cost beside encoding",
        lines,
        res,
        f"python -m benchmarks run calibration --rows {res['rows']}",
    )


def main() -> None:
    """Run the benchmark and write its JSON and markdown report."""
    parser = harness.arguments(__doc__, "1,200 rows, 1 repeat", SECTION, data=False)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--encode-rows", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = harness.parse(parser, rows=1_200, encode_rows=200, repeats=1)
    if harness.rendered(args, render):
        return
    harness.finish(args, render, run(args))


if __name__ == "__main__":
    main()
