r"""The storage engine's costs (issue 22): writes at 20k, 200k and 1M rows beside LanceDB, query
latency over segments, what the merge policy leaves, and ``refresh()`` as writes accumulate.

Stages (``--stage all`` runs them in this order; a stage alone keeps the others' figures from
the saved JSON):

- ``writes`` (:mod:`storage_writes`): add, upsert and delete of ``--batch`` rows (1,000) into
  one-segment indexes of 20k, 200k and 1M rows (``static`` pooling; the 1M index twice: ``Flat``
  and ``auto``, which builds ``HNSW32``) and a 20k ``mean`` index, each on a fresh copy, beside
  LanceDB on the same rows and vectors; time (flowsearch's stages: encoding, drift, the rest),
  bytes of new files and the process's write and read counters;
- ``segments`` (:mod:`storage_segments`): single-query latency, dense and hybrid, of the 200k
  rows as 1, 10 and 50 segments (``Flat`` and ``auto``), and whether the ``Flat`` top-k equals
  the one segment's;
- ``policy``: ``--policy-writes`` upserts of ``--batch`` rows into the 200k ``auto`` index
  under each merge policy of ``storage_segments.POLICIES`` (the tiers alone, the Flat budget,
  and fewer segments per tier), write by write in turn: each write's time and the rows its
  merges rewrote, the segments left, and the latency then;
- ``refresh`` (:mod:`storage_refresh`): ``Searcher.refresh()`` and a one-id delete after 1, 100,
  1,000 and 10,000 writes, and the manifest's and history's sizes.

Corpus: the 1M-row real-text corpus of ``speed_corpus.py`` (distinct sentences of the evaluation
data topped up with splices of two of them); the smaller indexes hold its first rows; the base
indexes are built once under ``benchmarks/_work/storage/base`` (the 1M ones take minutes).

Usage (about 45 minutes on 2 loaded cores, the first time 25 more for the base indexes)::

    python -m benchmarks run storage [--stage all|writes|segments|policy|refresh]
        [--rounds 3] [--batch 1000] [--no-lancedb] [--no-hnsw-1m]
    python -m benchmarks run storage --smoke     # small indexes, a minute or two; no figures
    python -m benchmarks run storage --render    # the report again from bench_storage.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

from benchmarks.common import harness
from benchmarks.writes.storage_indexes import BaseSpec

__all__ = ["main"]

LOG = logging.getLogger("bench_storage")

STAGES = ("writes", "segments", "policy", "refresh")


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.arguments(
        __doc__, "indexes of 500-10k rows, 100-row writes, one round", "bench_storage"
    )
    parser.add_argument("--stage", default="all", choices=("all", *STAGES))
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (after one untimed)")
    parser.add_argument("--batch", type=int, default=1000, help="rows per write")
    parser.add_argument("--no-lancedb", dest="lancedb", action="store_false")
    parser.add_argument(
        "--no-hnsw-1m", dest="hnsw_1m", action="store_false",
        help="skip the 1M HNSW32 index (its build is the longest step)",
    )  # fmt: skip
    parser.add_argument("--queries", type=int, default=200, help="latency queries")
    parser.add_argument("--policy-writes", type=int, default=100)
    parser.add_argument("--checkpoints", default="1,100,1000,10000", help="refresh: writes")
    parser.add_argument("--sizes", default="20000,200000,1000000", help="writes: index rows")
    parser.add_argument(
        "--mean-rows", type=int, default=None, help="writes: rows of the mean index (default: "
        "the smallest size; encoding a 1M-row mean index takes hours on 2 cores)",
    )  # fmt: skip
    parser.add_argument(
        "--kinds", default="add,upsert,delete", help="writes: which writes (upserts also run "
        "as flowsearch-whole: every write saving the whole reference sample)",
    )  # fmt: skip
    parser.add_argument(
        "--sequence", type=int, default=0, help="writes: then this many consecutive upserts "
        "per index and variant (the reference sample's bytes per write, folds included)",
    )  # fmt: skip
    parser.add_argument(
        "--serving", default=None, help="writes: bench_serving.py's work folder (e.g. "
        "_work/serving_1000000): its index is the largest size (hard-linked, never written in "
        "place), the smaller ones are built from its corpus's first rows (static, Flat), and "
        "the writes use its string ids; no mean index, no LanceDB",
    )  # fmt: skip
    parser.add_argument(
        "--serving-factories", default="Flat", help="writes with --serving: the vector "
        "indexes of its indexes, e.g. Flat,auto (auto: the largest is bench_serving.py's index "
        "merged once into one segment with auto's graph, HNSW32)",
    )  # fmt: skip
    parser.add_argument("--segment-rows", type=int, default=200_000)
    parser.add_argument("--segment-counts", default="10,50")
    parser.add_argument(
        "--note", default=None, help="what this run left out and why (kept in the JSON and "
        "shown in the section; with --render, added to the saved JSON)",
    )  # fmt: skip
    return harness.parse(
        parser, argv, rounds=1, batch=100, queries=20, policy_writes=12, hnsw_1m=False,
        checkpoints="1,10,100", sizes="2000,10000", mean_rows=500, segment_rows=6_000,
        segment_counts="3,6",
    )  # fmt: skip


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def write_specs(args: argparse.Namespace) -> list[BaseSpec]:
    """The indexes the writes stage measures: ``static`` at every size (the largest also with
    ``auto``'s graph when asked), and a ``mean`` index at the smallest size."""
    sizes = ints(args.sizes)
    largest = max(sizes)
    specs = [BaseSpec(n, factory="Flat" if n == largest else "auto") for n in sizes]
    if args.hnsw_1m:
        specs.append(BaseSpec(largest))
    specs.append(BaseSpec(args.mean_rows or min(sizes), pooling="mean"))
    return specs


def run_stage(name: str, args: argparse.Namespace, data: Path, work: Path) -> dict[str, Any]:
    from benchmarks.writes.storage_refresh import refresh_costs
    from benchmarks.writes.storage_segments import measure_segments, policy
    from benchmarks.writes.storage_writes import measure_writes, summarise

    rows = args.segment_rows
    if name == "writes":
        kinds = tuple(k for k in args.kinds.split(",") if k)
        if args.serving:
            return serving_writes(args, data, work, kinds)
        out = measure_writes(data, write_specs(args), work, rounds=args.rounds,
                             batch=args.batch, lance_too=args.lancedb, kinds=kinds,
                             sequence=args.sequence)  # fmt: skip
        out["summary"] = summarise(out["runs"])
        return out
    if name == "segments":
        families = {"Flat": BaseSpec(rows, factory="Flat"), "auto": BaseSpec(rows)}
        return measure_segments(data, families, work, ints(args.segment_counts),
                                queries=args.queries, rounds=args.rounds,
                                batch=args.batch)  # fmt: skip
    if name == "policy":
        return policy(data, BaseSpec(rows), work, writes=args.policy_writes, batch=args.batch,
                      queries=args.queries, rounds=args.rounds)  # fmt: skip
    smallest = min(ints(args.sizes))
    return refresh_costs(data, BaseSpec(smallest), work, checkpoints=ints(args.checkpoints),
                         repeats=200 if not args.smoke else 20,
                         published=20 if not args.smoke else 3)  # fmt: skip


def serving_writes(
    args: argparse.Namespace, data: Path, work: Path, kinds: tuple[str, ...]
) -> dict[str, Any]:
    """The writes stage on ``--serving``'s corpus: ``static`` indexes of ``--sizes`` rows for
    each of ``--serving-factories`` (the largest: bench_serving.py's own index, ``Flat``, or
    re-indexed once), writes with its string ids."""
    from functools import partial

    from benchmarks.writes.storage_indexes import serving_base, serving_batches
    from benchmarks.writes.storage_writes import measure_writes, summarise

    serving = Path(args.serving)
    if not (serving / "index" / "manifest.json").is_file():
        raise SystemExit(f"no bench_serving.py index at {serving / 'index'}: pass its work folder")
    sizes = ints(args.sizes)
    factories = [f for f in args.serving_factories.split(",") if f]
    specs = [BaseSpec(n, factory=f) for f in factories for n in sizes]
    out = measure_writes(
        data, specs, work, rounds=args.rounds, batch=args.batch, lance_too=False, kinds=kinds,
        sequence=args.sequence,
        base_of=lambda spec: serving_base(serving, spec, max(sizes), work),
        batches_of=partial(serving_batches, data, size=args.batch),
    )  # fmt: skip
    out["summary"] = summarise(out["runs"])
    out["serving"] = str(serving)
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks.writes.storage_report import render

    args = arguments(argv)
    saved = Path(args.out + ".json")
    if args.render and args.note is not None and saved.exists():
        stored = json.loads(saved.read_text())
        stored["note"] = args.note
        saved.write_text(json.dumps(stored, indent=1) + "\n")
    if harness.rendered(args, render):
        return 0
    data = harness.data_dir(args.data)
    work = harness.WORK / ("smoke/storage" if args.smoke else "storage")
    report: dict[str, Any] = {}
    if saved.exists() and not args.smoke and args.stage != "all":
        report = json.loads(saved.read_text())
    stages = STAGES if args.stage == "all" else (args.stage,)
    for name in stages:
        start, load = time.perf_counter(), harness.load_average()
        LOG.info("stage %s", name)
        report[name] = run_stage(name, args, data, work)
        report[name]["run"] = {
            "seconds": round(time.perf_counter() - start, 1),
            "load": [load, harness.load_average()],
            "command": harness.command_line(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
    if args.note is not None:
        report["note"] = args.note
    report["machine"] = harness.machine()
    report["command"] = harness.command_line()
    harness.finish(args, render, report)
    return 0


if __name__ == "__main__":
    harness.script(main)
