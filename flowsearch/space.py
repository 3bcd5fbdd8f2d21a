r"""The searched space of an index: fitting its calibrator, projecting into it, and drift.

At build time :func:`fit_calibrator` fits the calibrator on the corpus's raw vectors and decides
the searched space (``auto``: the flow's space only when the vectors are anisotropic);
:func:`project` maps raw vectors to that space, with their log-density.

The flow gives every vector a log-density. The manifest keeps the corpus's per-row log-density
statistics; :func:`drift_report` compares new rows against them. The gap is measured in corpus
standard deviations of per-row log-density: at :data:`DRIFT_WARN_STD` (1.0) or more, new rows are
on average less likely than about five in six corpus rows (for a roughly normal spread), which we
take as far out of distribution, time to refit the flow (``flowsearch index ... --overwrite``).

For scale: a flow fitted on 250 passages of the sample corpus puts 50 held-out passages of the
same corpus 0.3 std below the corpus mean (a small corpus's flow overfits a little); short
questions sit about 10 std below passages, and off-topic text further still.

Example:
    >>> corpus = {"mean_log_prob": 100.0, "std_log_prob": 10.0, "p01": 75.0}
    >>> drift_report(np.array([70.0, 80.0]), corpus)["warn"]
    True
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flowsearch.errors import FlowsearchError

if TYPE_CHECKING:
    from flowsearch.progress import Stages

__all__ = [
    "DRIFT_WARN_STD",
    "density",
    "density_stats",
    "drift_report",
    "fit_calibrator",
    "load_fitted_calibrator",
    "normalise",
    "project",
]

LOG = logging.getLogger("flowsearch.ingest")  # the build log, where users look for it

#: Warn when new rows' mean flow log-density is this many corpus std-devs below the corpus mean.
DRIFT_WARN_STD = 1.0


def density(cal: Any, U: np.ndarray) -> np.ndarray | None:
    """Per-row log-density (float64 (n,)) of raw vectors U under the calibrator; None if it has
    no density (only the flow has one)."""
    try:
        return np.asarray(cal.log_prob(U), dtype=np.float64)
    except NotImplementedError:
        return None


def normalise(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, as float32 (a new array)."""
    x = np.array(x, dtype=np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return x


def project(
    cal: Any, space: str, U: np.ndarray, want_density: bool = True
) -> tuple[np.ndarray, np.ndarray | None]:
    """Raw encoder vectors -> (the searched space's vectors, L2-normalised float32 (n, d);
    their float64 (n,) log-density, or None without a density or when not wanted).

    In the calibrated space a calibrator with ``transform_and_log_prob`` (the flow) gives both in
    one pass; otherwise transform and density are computed separately.
    """
    both = getattr(cal, "transform_and_log_prob", None)
    if space == "calibrated" and want_density and both is not None:
        Z, lp = both(U)
        return normalise(Z), np.asarray(lp, dtype=np.float64)
    Z = cal.transform(U) if space == "calibrated" else U
    return normalise(Z), density(cal, U) if want_density else None


def density_stats(lp: np.ndarray) -> dict[str, float]:
    """The manifest's ``density`` record: mean, std, 1st/5th percentile, median, rows."""
    q = np.percentile(lp, [1, 5, 50])
    return {
        "mean_log_prob": float(lp.mean()),
        "std_log_prob": float(lp.std()),
        "p01": float(q[0]),
        "p05": float(q[1]),
        "median": float(q[2]),
        "rows": int(lp.size),
    }


def drift_report(
    new_log_prob: np.ndarray, corpus: dict[str, float], reliable: bool = True
) -> dict[str, Any]:
    """How far new rows sit from the corpus under the flow.

    Args:
        new_log_prob: float64 (n,), the new rows' log-densities.
        corpus: the manifest's ``density`` record (mean, std, p01 of the corpus's log-densities).
        reliable: False when the flow was fitted on fewer than :data:`MIN_ROWS_PER_DIM` rows per
            dimension: its own rows then sit far above anything else, and no warning is raised.

    Returns:
        ``{"mean_log_prob", "corpus_mean_log_prob", "gap_std", "share_below_p01", "warn"}``:
        ``gap_std`` is (corpus mean - new mean) / corpus std; ``warn`` when it reaches
        :data:`DRIFT_WARN_STD`.
    """
    lp = np.asarray(new_log_prob, dtype=np.float64)
    std = max(float(corpus["std_log_prob"]), 1e-9)
    gap = (float(corpus["mean_log_prob"]) - float(lp.mean())) / std
    return {
        "mean_log_prob": float(lp.mean()),
        "corpus_mean_log_prob": float(corpus["mean_log_prob"]),
        "gap_std": float(gap),
        "share_below_p01": float(np.mean(lp < corpus["p01"])),
        "reliable": bool(reliable),
        "warn": bool(reliable and gap >= DRIFT_WARN_STD),
    }


def load_fitted_calibrator(
    calibrator: str | os.PathLike[str] | None, calibration: str, dim: int
) -> Any:
    """The calibrator fitted before (``--calibrator``), checked against the encoder; or None."""
    if calibrator is None:
        return None
    from flowsearch.calibration import load_calibrator

    cal = load_calibrator(calibrator)
    if calibration not in ("auto", cal.name):
        raise FlowsearchError(
            f"--calibration {calibration} contradicts the {cal.name!r} calibrator in "
            f"{calibrator}; leave --calibration out or make them agree"
        )
    if cal.dim_in != dim:
        raise FlowsearchError(
            f"the calibrator in {calibrator} was fitted on {cal.dim_in}-d vectors, this "
            f"encoder gives {dim}-d; use the same model and pooling"
        )
    return cal


#: ``auto`` searches a calibrated space only with at least this many rows per dimension. On
#: STS-B, all-MiniLM-L6-v2 ``static`` (384-d), whitening fitted on 300 rows (0.8 x dim) scores
#: 39.4 against 55.6 raw, on 1,000 rows (2.6 x dim) 55.1, on 5,385 rows (14 x dim) 70.4: below
#: about 3 rows per dimension a calibrator overfits and costs more than the anisotropy does.
MIN_ROWS_PER_DIM = 3


def fit_calibrator(
    U: np.ndarray,
    calibration: str,
    calibrator: str | os.PathLike[str] | None,
    loaded: Any,
    st: Stages,
) -> tuple[Any, dict[str, Any]]:
    """Fit the calibrator (or take ``loaded``, read from ``calibrator``) and decide the searched
    space; returns it and its record."""
    from flowsearch.calibration import make_calibrator
    from flowsearch.calibration.anisotropy import (
        AUTO_STATISTIC,
        AUTO_THRESHOLD,
        anisotropy_stats,
        should_calibrate,
    )

    stats = {k: float(v) for k, v in anisotropy_stats(U).items()}
    record: dict[str, Any] = {"name": calibration, "anisotropy": stats}
    if calibrator is not None:
        cal = loaded
        record.update(name=cal.name, fitted_on=str(Path(calibrator).resolve()), space="calibrated")
        record["decision"] = "forced by --calibrator"
    else:
        # auto's flow starts from whitened vectors: on anisotropic corpora (the only ones auto
        # searches in calibrated space) that matches whitening, where the reference flow trails
        # it by up to 5 STS points when fitted on few rows (benchmarks/RESULTS.md)
        name = "whitening-flow" if calibration == "auto" else calibration
        flows = ("flow", "whitening-flow")
        cal = make_calibrator(name, seed=0) if name in flows else make_calibrator(name)
        with st.status(f"fitting {name} on {len(U):,} rows", follow="flowsearch.calibration"):
            cal.fit(U)
        record["fitted_on"] = "corpus"
        if calibration == "auto":
            anisotropic = bool(should_calibrate(stats))
            enough = len(U) >= MIN_ROWS_PER_DIM * U.shape[1]
            searched = anisotropic and enough
            record["space"] = "calibrated" if searched else "encoder"
            record["decision"] = (
                f"{AUTO_STATISTIC}={stats.get(AUTO_STATISTIC, float('nan')):.4f} "
                f"{'>' if anisotropic else '<='} {AUTO_THRESHOLD}"
                + ("" if enough or not anisotropic else
                   f", but {len(U)} rows < {MIN_ROWS_PER_DIM} x dim {U.shape[1]}")
                + f": search in the {'flow' if searched else 'encoder'} space"
            )  # fmt: skip
            record.update(auto_statistic=AUTO_STATISTIC, auto_threshold=float(AUTO_THRESHOLD))
            record["auto_decision"] = searched
        else:
            record.update(space="calibrated", decision=f"forced: --calibration {calibration}")
    record.update(
        calibrator=cal.name,
        config=cal.config,
        fit_rows=int(len(U)),
        fit_stats=cal.fit_stats,
        dim_out=int(cal.dim_out or U.shape[1]),
    )
    LOG.info("calibration: %s", record["decision"])
    return cal, record
