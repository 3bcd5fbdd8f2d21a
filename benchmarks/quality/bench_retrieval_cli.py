r"""The dev sets through the shipped command, ``flowsearch eval retrieval``, with its defaults.

Usage::

    python -m benchmarks run retrieval_cli [--data DIR] [--max-corpus N] [--m2v DIR]
        [--tiers mean,static,model2vec]
    python -m benchmarks run retrieval_cli --smoke    # 300 passages, static; no figures

Each (dev set, tier) is one run of ``flowsearch eval retrieval DIR --mode all --json`` in a
subprocess (symmetric sets add ``--ignore-identical-ids``, as their ``dataset.json`` says), so
the figures are the product's: ``build_index`` with ``calibration="auto"`` and the default index,
then ``Searcher.search`` per mode (hybrid is the Searcher's default mode and fusion weight).
Tiers: ``mean`` (the defaults: bundled model, mean pooling), ``static`` (``--pooling static``),
``model2vec`` (``--model DIR --pooling static``, a Model2Vec model distilled from the bundled
model, distilled here as ``bench_retrieval.py`` does when missing). Writes
``benchmarks/quality/bench_retrieval_cli.json`` and ``.md``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import dev_sets, harness

LOG = logging.getLogger("bench_retrieval_cli")
SETS = harness.DEV_SETS
MODES = ("dense", "lexical", "hybrid")
TIERS = ("mean", "static", "model2vec")


def tier_options(tier: str, m2v: str) -> list[str]:
    if tier == "mean":
        return []
    if tier == "static":
        return ["--pooling", "static"]
    if tier == "model2vec":
        return ["--model", m2v, "--pooling", "static"]
    raise ValueError(f"unknown tier {tier!r}")


def run_one(ds_dir: Path, tier: str, m2v: str) -> dict[str, Any]:
    info = json.loads((ds_dir / "dataset.json").read_text())
    cmd = [sys.executable, "-c", "from flowsearch.cli import main; main()", "eval", "retrieval",
           str(ds_dir), "--mode", "all", "--json", *tier_options(tier, m2v)]  # fmt: skip
    if info["ignore_identical_ids"]:
        cmd.append("--ignore-identical-ids")
    load = round(os.getloadavg()[0], 2)
    started = time.perf_counter()
    env = {
        **os.environ,
        "PYTHONPATH": str(harness.ROOT),
    }  # this checkout's flowsearch in the child too
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    out = json.loads(done.stdout)
    out["tier"] = tier
    out["command"] = "flowsearch " + " ".join(cmd[3:])
    out["wall_seconds"] = round(time.perf_counter() - started, 1)
    out["load_average"] = [load, round(os.getloadavg()[0], 2)]
    LOG.info("%s %s: %s", ds_dir.name, tier, out["results"])
    return out


def findings(runs: list[dict[str, Any]]) -> list[str]:
    """Hybrid (the default mode) against each side alone, per tier, read from the runs."""
    out = []
    for tier in dict.fromkeys(r["tier"] for r in runs):
        mine = [r for r in runs if r["tier"] == tier]
        nd = {m: [r["results"][m]["ndcg@10"] for r in mine] for m in MODES}
        vs_lex = min(h - x for h, x in zip(nd["hybrid"], nd["lexical"], strict=True))
        vs_dense = min(h - x for h, x in zip(nd["hybrid"], nd["dense"], strict=True))
        out.append(f"- `{tier}`: hybrid minus BM25 alone is {vs_lex:+.3f} nDCG@10 on its worst "
                   f"set, hybrid minus dense {vs_dense:+.3f} on its worst.")  # fmt: skip
    return out


def markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    loads = [x for r in runs for x in r["load_average"]]
    lines = [
        "## The dev sets through `flowsearch eval retrieval` (`bench_retrieval_cli.py`)",
        "",
        f"Dev sets at most {report['max_corpus']:,} passages (`make_dev_sets.py`); one "
        "`flowsearch eval retrieval DIR --mode all --json` per (set, tier) with the shipped "
        "defaults (`calibration auto`, default index; hybrid is the Searcher's default mode). "
        f"Load average {min(loads):.1f}-{max(loads):.1f} on 2 shared cores. Cells: nDCG@10 / "
        "recall@100 / MRR@10.",
        "",
        "| tier | `auto` searches | mode | " + " | ".join(SETS) + " | mean nDCG@10 |",
        "|---|---|---|" + "---|" * len(SETS) + "---:|",
    ]
    for tier in dict.fromkeys(r["tier"] for r in runs):
        mine = {r["dataset"]: r for r in runs if r["tier"] == tier}
        spaces = sorted({f"{r['calibrator']} ({r['space']})" for r in mine.values()})
        for mode in MODES:
            cells, nd = [], []
            for s in SETS:
                res = mine.get(s, {}).get("results", {}).get(mode)
                if res is None:
                    cells.append("")
                    continue
                nd.append(res["ndcg@10"])
                cells.append(f"{res['ndcg@10']:.3f} / {res['recall@100']:.2f} / "
                             f"{res['mrr@10']:.3f}")  # fmt: skip
            mean = f"{sum(nd) / len(nd):.3f}" if nd else ""
            lines.append(f"| `{tier}` | {', '.join(spaces)} | {mode} | " + " | ".join(cells)
                         + f" | {mean} |")  # fmt: skip
    # paths as seen from the repository (the run may have been in another checkout)
    commands = {re.sub(r"\S*/benchmarks/", "benchmarks/", r["command"]) for r in runs
                if r["dataset"] == SETS[0]}  # fmt: skip
    lines += ["", *findings(runs)]
    missing = [t for t in TIERS if t not in {r["tier"] for r in runs}]
    if missing:  # a tier left out by --tiers: say so rather than let its rows vanish unexplained
        lines += ["", "Not in this run: " + ", ".join(f"`{t}`" for t in missing) + " (`--tiers`)."]
    lines += ["", "Commands: " + "; ".join(f"`{c}`" for c in sorted(commands))]
    default = f"python -m benchmarks run retrieval_cli --max-corpus {report['max_corpus']}"
    lines += ["", harness.produced_by(report, default)]
    return "\n".join(lines) + "\n"


def _model2vec(path: str) -> str:
    """The Model2Vec tier's model, distilled (as bench_retrieval.py does) when missing."""
    from benchmarks.common.encoders import distil_model2vec

    if distil_model2vec(Path(path)) is None:
        raise SystemExit(
            f"the model2vec tier needs a Model2Vec model at {path}: install model2vec[distill] "
            "to distil it, or pass --tiers mean,static"
        )
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.arguments(__doc__, "300 passages, the static tier", "bench_retrieval_cli")
    parser.add_argument("--max-corpus", type=int, default=6000)
    parser.add_argument("--m2v", default=str(harness.WORK / "m2v_minilm"))
    parser.add_argument("--tiers", default=",".join(TIERS))
    args = harness.parse(parser, argv, max_corpus=300, tiers="static")
    if harness.rendered(args, markdown):
        return 0
    tiers = args.tiers.split(",")
    m2v = _model2vec(args.m2v) if "model2vec" in tiers else args.m2v
    root, _ = dev_sets.dev_sets(harness.data_dir(args.data), args.max_corpus)
    report: dict[str, Any] = {
        "max_corpus": args.max_corpus,
        "runs": [],
        "command": harness.command_line(),
    }
    progress = harness.WORK / "bench_retrieval_cli.partial.json"  # what a stopped run had measured
    for tier in tiers:
        for s in SETS:
            report["runs"].append(run_one(root / s, tier, m2v))
            progress.write_text(json.dumps(report, indent=1) + "\n")
    harness.finish(args, markdown, report)
    return 0


if __name__ == "__main__":
    harness.script(main)
