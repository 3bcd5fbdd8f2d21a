"""Every runnable benchmark: its entry name, module, area, and whether it is in the suite.

The suite holds the figures a release re-measures; the studies answered a question once and
stay runnable. ``python -m benchmarks list`` prints this table; ``tests/test_benchmarks.py``
checks that every ``bench_*.py`` and ``run_*.py`` is listed here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AREAS", "BENCHMARKS", "Benchmark", "find"]

HERE = Path(__file__).resolve().parent

#: The suite's areas, in the order a release reads them.
AREAS = ("quality", "encoding", "ingest", "query", "ann", "writes", "serving", "gpu")


@dataclass(frozen=True)
class Benchmark:
    """One runnable script: ``python -m benchmarks run NAME`` runs ``module`` as ``__main__``."""

    name: str
    module: str
    suite: bool
    #: Whether the script has a ``--smoke`` (its smallest settings).
    smoke: bool = True

    @property
    def area(self) -> str:
        """The area folder: ``quality`` for the suite's, ``studies/fusion`` for a study's."""
        return "/".join(self.module.split(".")[1:-1])

    @property
    def path(self) -> Path:
        """The script's file."""
        return HERE.parent.joinpath(*self.module.split(".")).with_suffix(".py")

    def summary(self) -> str:
        """The first line of the script's docstring (read without importing it)."""
        doc = ast.get_docstring(ast.parse(self.path.read_text(encoding="utf-8"))) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


def _suite(name: str, module: str) -> Benchmark:
    return Benchmark(name, f"benchmarks.{module}", suite=True)


def _study(name: str, module: str, *, smoke: bool = True) -> Benchmark:
    return Benchmark(name, f"benchmarks.studies.{module}", suite=False, smoke=smoke)


BENCHMARKS: tuple[Benchmark, ...] = (
    _suite("sts", "quality.run_sts"),
    _suite("retrieval_cli", "quality.bench_retrieval_cli"),
    _suite("documents", "quality.bench_documents"),
    _suite("encoder", "encoding.bench_encoder"),
    _suite("calibration", "encoding.bench_calibration"),
    _suite("cold_query", "encoding.bench_cold_query"),
    _suite("index", "ingest.bench_index"),
    _suite("speed", "ingest.bench_speed"),
    _suite("filters", "query.bench_filters"),
    _suite("filter_segments", "query.bench_filter_segments"),
    _suite("lexical", "query.bench_lexical"),
    _suite("searcher_cost", "query.bench_searcher_cost"),
    _suite("rerank", "query.bench_rerank"),
    _suite("ann_study", "ann.bench_ann_study"),
    _suite("segments", "ann.bench_segments"),
    _suite("scale", "ann.bench_scale"),
    _suite("writes", "writes.bench_writes"),
    _suite("storage", "writes.bench_storage"),
    _suite("write_check", "writes.bench_write_check"),
    _suite("serving", "serving.bench_serving"),
    _suite("metrics", "serving.bench_metrics"),
    _suite("gpu", "gpu.bench_gpu"),
    _study("retrieval", "quality.bench_retrieval"),
    _study("retrieval_auto", "quality.bench_retrieval_auto"),
    _study("passages", "quality.bench_passages"),
    _study("density", "density.bench_density"),
    _study("density_length", "density.bench_density_length"),
    _study("drift", "drift.bench_drift"),
    _study("drift_sample", "drift.bench_drift_sample"),
    _study("fusion_dump", "fusion.fusion_dump", smoke=False),
    _study("fusion", "fusion.bench_fusion", smoke=False),
    _study("fusion_query", "fusion.bench_fusion_query", smoke=False),
    _study("fusion_adaptive", "fusion.bench_fusion_adaptive", smoke=False),
    _study("tuner", "ann.bench_tuner"),
    _study("flow_steps", "calibration.bench_flow_steps", smoke=False),
    Benchmark("dev_sets", "benchmarks.common.dev_sets", suite=False),
)


def find(name: str) -> Benchmark:
    """The benchmark called ``name`` (or by its file's stem, ``bench_`` included).

    Raises:
        SystemExit: no such benchmark (one line naming ``list``).
    """
    for bench in BENCHMARKS:
        if name in (bench.name, bench.module.rsplit(".", 1)[1]):
            return bench
    raise SystemExit(f"no benchmark {name!r}: `python -m benchmarks list` names them")
