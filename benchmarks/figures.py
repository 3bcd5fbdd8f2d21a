"""Plots of the recorded reports, for a reader who would rather look than read.

Every plot is drawn from a JSON report the suite wrote (nothing here measures) into
``benchmarks/figures/``:

- ``ann_recall_speedup.png``: recall@10 against speed-up over ``Flat``, one line per index
  structure, at 200k and 1M rows (``ann/bench_ann_study.json``, the searched space);
- ``encoder_rows_per_s.png``: encoder rows per second by runtime, per model
  (``encoding/bench_encoder.json``);
- ``sts_spearman_by_calibration.png``: STS-B Spearman and the mean over the seven STS tasks,
  per calibration and pooling (``quality/sts_results.json``).

Usage::

    python -m benchmarks plots [--only ann,encoder,sts] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PLOTS", "ann_recall_speedup", "encoder_rows_per_s", "main", "sts_by_calibration"]

HERE = Path(__file__).resolve().parent
FIGURES = HERE / "figures"


def _read(relative: str) -> dict[str, Any]:
    path = HERE / relative
    if not path.is_file():
        raise SystemExit(
            f"no report at {path}: run its benchmark first (python -m benchmarks list)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ann_recall_speedup(out: Path) -> Path:
    """Recall@10 against speed-up over Flat per structure (searched space), 200k and 1M rows."""
    plt = _pyplot()
    report = _read("ann/bench_ann_study.json")
    panels = [
        (f"{report['study']['rows']:,} rows", report["study"]["curves"]),
        (f"{report['scale']['prepare']['rows']:,} rows", report["scale"]["curves"]),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    for ax, (title, curves) in zip(axes, panels, strict=True):
        by_structure: dict[str, list[tuple[float, float]]] = {}
        for point in curves:
            if point["space"] == "searched" and point.get("speedup"):
                by_structure.setdefault(point["structure"], []).append(
                    (point["speedup"], point["recall"])
                )
        for structure, points in sorted(by_structure.items()):
            points.sort()
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=structure)
        ax.set_xscale("log")
        ax.set_xlabel("speed-up over Flat (single query p50)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.axhline(0.95, color="grey", linewidth=0.8, linestyle="--")
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("recall@10 (real queries)")
    fig.suptitle("Vector index structures on the calibrated space")
    fig.tight_layout()
    return _save(fig, plt, out / "ann_recall_speedup.png")


def encoder_rows_per_s(out: Path) -> Path:
    """Rows per second by runtime, one group of bars per model."""
    plt = _pyplot()
    report = _read("encoding/bench_encoder.json")
    models = report["speed"]
    runtimes = list(dict.fromkeys(r for m in models for r in m["results"]))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    height = 0.8 / len(models)
    for i, model in enumerate(models):
        values = [model["results"].get(r, {}).get("rows_per_s", 0.0) for r in runtimes]
        positions = [j + i * height for j in range(len(runtimes))]
        bars = ax.barh(positions, values, height=height, label=f"{model['model']}")
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7, padding=2)
    ax.set_yticks([j + height * (len(models) - 1) / 2 for j in range(len(runtimes))], runtimes)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"rows per second ({report['threads']} threads, log scale)")
    ax.set_title("Encoder throughput by runtime")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    return _save(fig, plt, out / "encoder_rows_per_s.png")


def sts_by_calibration(out: Path) -> Path:
    """STS-B Spearman and the seven tasks' mean, per calibration (bars) and pooling (groups)."""
    plt = _pyplot()
    rows = _read("quality/sts_results.json")["table2"]
    poolings = list(dict.fromkeys(r["pooling"] for r in rows))
    calibrations = list(dict.fromkeys(r["calibration"] for r in rows))
    score = {(r["pooling"], r["calibration"]): r["results"] for r in rows}

    def stsb(results: dict[str, Any]) -> float:
        return float(results["STSB"]["spearman"])

    def mean(results: dict[str, Any]) -> float:
        return sum(v["spearman"] for v in results.values()) / len(results)

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    width = 0.8 / len(calibrations)
    for ax, (title, measure) in zip(
        axes, [("STS-B", stsb), ("mean of STS12-16, STS-B, SICK-R", mean)], strict=True
    ):
        for i, calibration in enumerate(calibrations):
            values = [
                measure(score[(p, calibration)]) if (p, calibration) in score else 0.0
                for p in poolings
            ]
            ax.bar([j + i * width for j in range(len(poolings))], values, width, label=calibration)
        ax.set_xticks([j + width * (len(calibrations) - 1) / 2 for j in range(len(poolings))])
        ax.set_xticklabels(poolings)
        ax.set_ylim(50, 90)
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("Spearman x 100")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=len(calibrations), loc="lower center")
    fig.suptitle("STS by calibration and pooling (bundled model)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _save(fig, plt, out / "sts_spearman_by_calibration.png")


def _save(fig: Any, plt: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: Each plot's name and how it is drawn into a folder.
PLOTS: dict[str, Callable[[Path], Path]] = {
    "ann": ann_recall_speedup,
    "encoder": encoder_rows_per_s,
    "sts": sts_by_calibration,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks plots", description=__doc__)
    parser.add_argument("--only", default=",".join(PLOTS), help="comma-separated plot names")
    parser.add_argument("--out", type=Path, default=FIGURES, help="folder of the PNGs")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLOTS]
    if unknown:
        raise SystemExit(f"unknown plot {unknown[0]!r}; choose from {', '.join(PLOTS)}")
    for name in names:
        print(PLOTS[name](args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
