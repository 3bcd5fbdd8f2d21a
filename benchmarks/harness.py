r"""What the benchmark scripts share: paths, the data they need, corpora and dev sets, timing with
warm-up and repeats, the machine's load, and publishing to ``RESULTS.md``.

Every script runs from a fresh clone as ``python benchmarks/NAME.py`` (importing this module
puts the checkout first on ``sys.path``: ``PYTHONPATH=.`` is not needed) and builds what it needs
under ``benchmarks/_work/`` (git-ignored), or stops with one line saying how to get it: the
evaluation data (``$FLOWSEARCH_DATA``, else ``../shared/data``) is never copied into the
repository. ``--smoke`` (every script has it) runs the smallest settings, writes under
``_work/smoke/`` and leaves the published figures alone.

``RESULTS.md`` has one section per script, between ``<!-- name:start -->`` and
``<!-- name:end -->``; :func:`publish` writes a run's JSON, its markdown and its section, and
each section names the command that produced it (:func:`command_line`, :func:`produced_by`).

Example:
    >>> from harness import publish, rounds, machine  # doctest: +SKIP
    >>> times = rounds({"ours": lambda: ours(q), "peer": lambda: peer(q)}, repeats=3)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
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
    "dev_sets",
    "exact_top",
    "finish",
    "load_average",
    "machine",
    "markdown",
    "parse",
    "percentiles_ms",
    "produced_by",
    "publish",
    "real_corpus",
    "recall",
    "rendered",
    "rounds",
    "sample_queries",
    "script",
    "segment_of",
    "single_query_ms",
    "synthetic_corpus",
    "timed",
    "write_section",
]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Scratch space of every script: corpora, dev sets, vector caches, indexes (git-ignored).
WORK = HERE / "_work"
#: The BEIR-format dev sets ``make_dev_sets.py`` builds from the evaluation data.
DEV_SETS = ("qnli-dev", "stsb-para", "sick-para", "snli-entail")

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this checkout's flowsearch, whatever is installed
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the bundled model needs no network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# -- the command line --------------------------------------------------------------------------


def arguments(
    doc: str | None, smoke: str, section: str, *, data: bool = True, markdown: bool = True
) -> argparse.ArgumentParser:
    """A script's parser with the options every script spells alike: ``--data DIR`` (the
    evaluation data), ``--smoke`` (its smallest settings, described by ``smoke``; figures
    untouched), ``--render`` (alias ``--report-only``: rewrite the section from the saved JSON)
    and ``--out`` (the path stem of its JSON and markdown, ``benchmarks/<section>``).
    :func:`rendered` and :func:`finish` read them back (with the RESULTS.md ``section`` and
    whether a ``.md`` copy is written)."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    if data:
        parser.add_argument("--data", default=None, help="evaluation data ($FLOWSEARCH_DATA)")
    parser.add_argument("--smoke", action="store_true", help=f"{smoke}; RESULTS.md untouched")
    parser.add_argument(
        "--render", "--report-only", dest="render", action="store_true",
        help="only rewrite the RESULTS.md section from the saved JSON",
    )  # fmt: skip
    parser.add_argument("--out", default=str(HERE / section), help="path stem of the JSON")
    parser.set_defaults(section=section, markdown=markdown)
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
    """With ``--render``: the section rewritten from the saved JSON (and printed); True."""
    if args.render:
        print(publish(args.out, render, args.section, None, markdown=args.markdown))
    return bool(args.render)


def finish(
    args: argparse.Namespace, render: Callable[[dict[str, Any]], str], report: dict[str, Any]
) -> str:
    """Publishes this run's ``report`` as :func:`publish` does (``--smoke``: under
    ``_work/smoke``); prints and returns the markdown."""
    body = publish(args.out, render, args.section, report, smoke=args.smoke, markdown=args.markdown)
    print(body)
    return body


# -- data, corpora, dev sets -------------------------------------------------------------------


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


def dev_sets(
    data: Path, max_corpus: int, names: Iterable[str] = DEV_SETS
) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The BEIR dev sets of ``make_dev_sets.py`` at ``max_corpus`` passages, (re)built under
    ``_work/dev_sets_<max_corpus>`` (deterministic, seconds): ``(root, {name: record})``."""
    from make_dev_sets import make_dev_sets

    root = WORK / f"dev_sets_{max_corpus}"
    return root, make_dev_sets(data, root, list(names), max_corpus)


def _sample_sentences() -> list[str]:
    """The shipped sample corpus (``data/sample.parquet``) split into sentences of 6+ words."""
    import pyarrow.parquet as pq

    texts = pq.read_table(ROOT / "data" / "sample.parquet").column("text").to_pylist()
    return [s for t in texts for s in re.split(r"(?<=[.!?])\s+", t) if len(s.split()) >= 6]


def synthetic_corpus(path: Path, rows: int, seed: int = 0) -> Path:
    """A Parquet corpus (``id``, ``text``) of ``rows`` passages, each the first half of one
    sample sentence and the second half of another: real vocabulary, any size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = [s.split() for s in _sample_sentences()]
    rng = np.random.default_rng(seed)
    a, b = rng.integers(len(words), size=rows), rng.integers(len(words), size=rows)
    texts = [
        " ".join(words[i][: len(words[i]) // 2] + words[j][len(words[j]) // 2 :])
        for i, j in zip(a, b, strict=True)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"s{i:06d}" for i in range(rows)], "text": texts}), path)
    return path


def sample_queries(n: int, seed: int = 1) -> list[str]:
    """The hand-written sample queries, then windows of 5-10 words of sample sentences."""
    hand = [q["query"] for q in json.loads((ROOT / "tests" / "sample_queries.json").read_text())]
    sentences = _sample_sentences()
    rng = np.random.default_rng(seed)
    out = list(hand)
    while len(out) < n:
        words = sentences[int(rng.integers(len(sentences)))].split()
        size = int(rng.integers(5, 11))
        start = int(rng.integers(0, max(1, len(words) - size)))
        out.append(" ".join(words[start : start + size]))
    return out[:n]


def real_corpus(data: Path, rows: int, n_queries: int) -> tuple[Path, list[str], dict[str, int]]:
    """The real-text corpus of ``speed_corpus.py`` (``_work/corpus_<rows>.parquet``, built
    from the evaluation data when missing) and its held-out queries: ``(path, queries, counts)``."""
    from speed_corpus import corpus_and_queries

    return corpus_and_queries(data, WORK, rows, n_queries)


def segment_of(searcher: Any) -> Any:
    """The one segment of a searcher's version (a freshly built index has one): its
    ``SegmentReader``, whose ``rows`` (the Parquet rows), ``ann`` (the FAISS index, ids are its
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
    (``python benchmarks/NAME.py ARGS``), for the report to record."""
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *args[1:]])


def produced_by(report: Mapping[str, Any], default: str) -> str:
    """The section's last line: the command recorded in ``report``, else ``default`` (runs
    from before commands were recorded: the command their settings correspond to)."""
    return f"Produced by `{report.get('command') or default}`."


def markdown(title: str, body: list[str], report: Mapping[str, Any], default: str) -> str:
    """A section: ``## title``, the ``body`` lines, then :func:`produced_by`'s line."""
    return "\n".join([f"## {title}", "", *body, "", produced_by(report, default)])


def write_section(path: Path, body: str, name: str) -> None:
    """Replace (or append) the ``<!-- name:start -->`` ... ``<!-- name:end -->`` section."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.is_file() else "# Benchmark results\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def publish(
    out: str | os.PathLike[str],
    render: Callable[[dict[str, Any]], str],
    section: str,
    report: dict[str, Any] | None,
    *,
    smoke: bool = False,
    markdown: bool = True,
) -> str:
    """Write a run's ``out.json`` (unless ``report`` is None: re-render the stored one), its
    ``out.md`` (when ``markdown``) and its section of RESULTS.md; returns the markdown.

    With ``smoke``, the JSON and markdown go to ``_work/smoke/`` and RESULTS.md is untouched:
    a smoke run proves the script and its rendering work without replacing figures.
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
    if markdown or smoke:
        md_path.write_text(body.rstrip() + "\n")
    if not smoke:
        write_section(HERE / "RESULTS.md", body, section)
    return body


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and arrays."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")
