r"""What the benchmark scripts share: paths, options, timing with warm-up and repeats, the
machine's load, and writing a run's report beside its script.

Every script is a module of the ``benchmarks`` package, run from the repository root as
``python -m benchmarks run NAME [ARGS]`` (or ``python -m benchmarks.<area>.<script>``); it builds
what it needs under ``benchmarks/_work/`` (git-ignored), or stops with one line saying how to get
it: the evaluation data (``$FLOWSEARCH_DATA``, else ``../shared/data``) is never copied into the
repository. ``--smoke`` runs a script's smallest settings, writes under ``_work/smoke/`` and
leaves its recorded report alone.

A run's report is two files beside its script, ``<stem>.json`` (the figures) and ``<stem>.md``
(the tables), written by :func:`publish`; the markdown names the command that produced it
(:func:`command_line`, :func:`produced_by`). ``benchmarks/RESULTS.md`` is curated from these
reports by hand; nothing here writes it. Corpora are in :mod:`benchmarks.common.corpora`, the
dev sets in :mod:`benchmarks.common.dev_sets`.

Example:
    >>> from benchmarks.common.harness import publish, rounds, machine  # doctest: +SKIP
    >>> times = rounds({"ours": lambda: ours(q), "peer": lambda: peer(q)}, repeats=3)
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEV_SETS",
    "HERE",
    "ROOT",
    "WORK",
    "arguments",
    "command_line",
    "data_dir",
    "exact_top",
    "finish",
    "load_average",
    "machine",
    "markdown",
    "parse",
    "percentiles_ms",
    "produced_by",
    "publish",
    "recall",
    "rendered",
    "rounds",
    "script",
    "segment_of",
    "single_query_ms",
    "timed",
]

#: The ``benchmarks`` folder.
HERE = Path(__file__).resolve().parents[1]
ROOT = HERE.parent
#: Scratch space of every script: corpora, dev sets, vector caches, indexes (git-ignored).
WORK = HERE / "_work"
#: The BEIR-format dev sets :mod:`benchmarks.common.dev_sets` builds from the evaluation data.
DEV_SETS = ("qnli-dev", "stsb-para", "sick-para", "snli-entail")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this checkout's flowsearch, whatever is installed
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled model needs no network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# -- the command line --------------------------------------------------------------------------


def arguments(
    doc: str | None, smoke: str, section: str, *, data: bool = True, here: Path | None = None
) -> argparse.ArgumentParser:
    """A script's parser with the options every script spells alike: ``--data DIR`` (the
    evaluation data), ``--smoke`` (its smallest settings, described by ``smoke``; the recorded
    report untouched), ``--render`` (alias ``--report-only``: rewrite the markdown from the
    saved JSON) and ``--out`` (the path stem of its report: ``section`` in ``here``, by default
    the folder of the script that calls this). :func:`rendered` and :func:`finish` read them."""
    if here is None:
        caller = inspect.currentframe()
        assert caller is not None and caller.f_back is not None
        here = Path(caller.f_back.f_code.co_filename).resolve().parent
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    if data:
        parser.add_argument("--data", default=None, help="evaluation data ($FLOWSEARCH_DATA)")
    parser.add_argument("--smoke", action="store_true", help=f"{smoke}; report untouched")
    parser.add_argument(
        "--render", "--report-only", dest="render", action="store_true",
        help="only rewrite the markdown report from the saved JSON",
    )  # fmt: skip
    parser.add_argument("--out", default=str(here / section), help="path stem of the report")
    return parser


def parse(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, **smoke: Any
) -> argparse.Namespace:
    """The parsed options; with ``--smoke``, the ``smoke`` values replace theirs."""
    args = parser.parse_args(argv)
    if args.smoke:
        for name, value in smoke.items():
            setattr(args, name, value)
    return args


def script(main: Callable[[], int | None]) -> None:
    """Runs a script's ``main`` with progress logs (INFO, timestamped) on stderr; exits with
    its return code."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    raise SystemExit(main())


def rendered(args: argparse.Namespace, render: Callable[[dict[str, Any]], str]) -> bool:
    """With ``--render``: the markdown rewritten from the saved JSON (and printed); True."""
    if args.render:
        print(publish(args.out, render, None))
    return bool(args.render)


def finish(
    args: argparse.Namespace, render: Callable[[dict[str, Any]], str], report: dict[str, Any]
) -> str:
    """Publishes this run's ``report`` as :func:`publish` does (``--smoke``: under
    ``_work/smoke``); prints and returns the markdown."""
    body = publish(args.out, render, report, smoke=args.smoke)
    print(body)
    return body


# -- data, segments ---------------------------------------------------------------------------


def data_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The evaluation data folder: ``path``, else ``$FLOWSEARCH_DATA``, else ``../shared/data``.

    Raises:
        SystemExit: the folder does not exist (one line naming how to point at it).
    """
    chosen = path or os.environ.get("FLOWSEARCH_DATA") or ROOT.parent / "shared" / "data"
    found = Path(chosen).expanduser()
    if not (found / "stsb").is_dir():
        raise SystemExit(
            f"no evaluation data at {found}: pass --data DIR or set FLOWSEARCH_DATA to the folder "
            "holding stsb/, sick/, sts12/ ... qnli/, snli/ (shared/data/README.md)"
        )
    return found


def segment_of(searcher: Any) -> Any:
    """The one segment of a searcher's version (a freshly built index has one): its
    ``SegmentReader``, whose ``reader`` (the Parquet rows), ``ann`` (the FAISS index, ids are its
    rows) and ``record.ann`` (factory and search parameters) the speed scripts measure.

    Raises:
        SystemExit: the index holds more than one segment (compact it with ``--full``).
    """
    segments = searcher.version.segments
    if len(segments) != 1:
        raise SystemExit(
            f"{searcher.root} holds {len(segments)} segments; this measures a one-segment "
            "index: run `flowsearch compact --full` on it or rebuild it"
        )
    return segments[0]


# -- timing ------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), wall seconds)``."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def percentiles_ms(seconds: Iterable[float]) -> dict[str, float]:
    """``{"p50_ms", "p95_ms"}`` of durations given in seconds."""
    ms = np.asarray(list(seconds), dtype=np.float64) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95))}


def rounds(
    contenders: Mapping[str, Callable[[], Any]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Wall seconds of each contender over ``repeats`` rounds, after ``warmup`` untimed calls
    each. A round calls every contender once, in turn, so the shared machine's load falls on
    all of them alike: compare them as ratios within one call."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            times[name].append(timed(fn)[1])
    return times


def single_query_ms(search: Callable[[Any], Any], queries: Any, warmup: int = 10) -> float:
    """Median milliseconds of ``search(query)`` over ``queries`` one at a time, after
    ``warmup`` untimed queries (caches, lazy set-up)."""
    for query in queries[:warmup]:
        search(query)
    return float(np.median([timed(lambda q=q: search(q))[1] for q in queries]) * 1e3)


def exact_top(
    queries: np.ndarray, vectors: np.ndarray, k: int, chunk_rows: int = 262_144
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by inner product, faiss.contrib's brute force: ``(scores float32 (q, k),
    rows int64 (q, k))``, best first, -1 past the last row. ``vectors`` (an array or a
    memory map) is read ``chunk_rows`` at a time, so memory stays one chunk plus the results."""
    import faiss
    from faiss.contrib.exhaustive_search import knn, knn_ground_truth

    q = np.ascontiguousarray(queries, dtype=np.float32)
    if len(vectors) <= chunk_rows:
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        scores, rows = knn(q, x, min(k, len(x)), metric=faiss.METRIC_INNER_PRODUCT)
        return scores, rows
    chunks = (
        np.ascontiguousarray(vectors[i : i + chunk_rows], dtype=np.float32)
        for i in range(0, len(vectors), chunk_rows)
    )
    scores, rows = knn_ground_truth(q, chunks, k, metric_type=faiss.METRIC_INNER_PRODUCT, ngpu=0)
    return scores, rows


def recall(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    """recall@k of result rows ``found`` against exact ``truth`` (int64 (q, >= k) each):
    the share of each query's true top k found in its top k (faiss.contrib's measure)."""
    from faiss.contrib.evaluation import knn_intersection_measure

    return float(knn_intersection_measure(found[:, :k], truth[:, :k]))


# -- the machine -------------------------------------------------------------------------------


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """The machine a run measured on: ``{"platform", "cpus", "load"}`` (load: as now)."""
    return {"platform": platform.machine(), "cpus": os.cpu_count(), "load": load_average()}


# -- publishing --------------------------------------------------------------------------------


def command_line(argv: list[str] | None = None) -> str:
    """This run's command as a reader types it from the repository root
    (``python -m benchmarks run NAME ARGS``: NAME is the script's entry name), for the
    report to record."""
    args = list(sys.argv if argv is None else argv)
    name = Path(args[0]).stem
    return shlex.join(["python", "-m", "benchmarks", "run", name.removeprefix("bench_"), *args[1:]])


def produced_by(report: Mapping[str, Any], default: str) -> str:
    """The section's last line: the command recorded in ``report``, else ``default`` (runs
    from before commands were recorded: the command their settings correspond to)."""
    return f"Produced by `{report.get('command') or default}`."


def markdown(title: str, body: list[str], report: Mapping[str, Any], default: str) -> str:
    """A section: ``## title``, the ``body`` lines, then :func:`produced_by`'s line."""
    return "\n".join([f"## {title}", "", *body, "", produced_by(report, default)])


def publish(
    out: str | os.PathLike[str],
    render: Callable[[dict[str, Any]], str],
    report: dict[str, Any] | None,
    *,
    smoke: bool = False,
) -> str:
    """Write a run's report: ``out.json`` (unless ``report`` is None: re-render the stored one)
    and ``out.md`` (its markdown); returns the markdown.

    With ``smoke``, both go to ``_work/smoke/``: a smoke run proves the script and its
    rendering work without replacing the recorded report.
    """
    target = Path(out)
    if smoke:
        target = WORK / "smoke" / target.name
        target.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = (
        target.with_name(target.name + ".json"),
        target.with_name(target.name + ".md"),
    )
    if report is None:
        report = json.loads(json_path.read_text())
    else:
        json_path.write_text(json.dumps(report, indent=1, default=_plain) + "\n")
    body = render(report)
    md_path.write_text(body.rstrip() + "\n")
    return body


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and arrays."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")
