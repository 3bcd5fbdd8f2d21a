r"""Choosing and fitting an index's calibrator, and deciding the space it searches.

``calibration="auto"`` always fits ``whitening-flow`` (its density serves the drift and query
reports) but searches in the calibrated space only when the corpus's vectors are anisotropic
(:func:`~flowsearch.calibration.anisotropy.should_calibrate`) and there are at least
:data:`~flowsearch.density.MIN_ROWS_PER_DIM` rows per dimension; otherwise in the encoder's own
space. A named calibration is fitted and always searched; a calibrator fitted elsewhere (the
paper's "flow (NLI)" setting) is loaded and checked against the encoder.

Example:
    >>> U = np.random.default_rng(0).normal(size=(200, 4))
    >>> cal, spec = fit_for_index(U, "whitening")
    >>> spec.space, spec.calibrator, spec.fit_rows
    ('calibrated', 'whitening', 200)
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.density import MIN_ROWS_PER_DIM
from flowsearch.errors import FlowsearchError
from flowsearch.manifest import AutoDecision, CalibrationSpec

__all__ = ["AUTO_FITS", "fit_for_index", "load_fitted"]

LOG = logging.getLogger(__name__)

#: What ``auto`` fits. Starting the flow from whitened vectors matches whitening on anisotropic
#: corpora (the only ones auto searches calibrated), where the reference flow trails it by up to
#: 5 STS points when fitted on few rows (benchmarks/RESULTS.md).
AUTO_FITS = "whitening-flow"
_SEEDED = ("flow", "whitening-flow")


def load_fitted(calibrator: str | os.PathLike[str], calibration: str, dim: int) -> Any:
    """A calibrator fitted before, checked against the requested name and the encoder's dim.

    Raises:
        FlowsearchError: an unreadable calibrator, a contradicting ``calibration``, another dim.
    """
    from flowsearch.calibration import load_calibrator

    cal = load_calibrator(calibrator)
    if calibration not in ("auto", cal.name):
        raise FlowsearchError(
            f"calibration={calibration!r} contradicts the {cal.name!r} calibrator in "
            f"{calibrator}; leave calibration out or make them agree"
        )
    if cal.dim_in != dim:
        raise FlowsearchError(
            f"the calibrator in {calibrator} was fitted on {cal.dim_in}-d vectors, this "
            f"encoder gives {dim}-d; use the same model and pooling"
        )
    return cal


def fit_for_index(
    U: np.ndarray,
    calibration: str,
    loaded: Any = None,
    loaded_from: str | os.PathLike[str] | None = None,
    status: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None,
) -> tuple[Any, CalibrationSpec]:
    """Fit the calibrator on raw vectors ``U`` (float32 (n, dim)) and decide the searched space.

    Args:
        U: the corpus's raw vectors (or a uniform sample of them).
        calibration: ``auto``, a calibrator name, or ``none``.
        loaded: a calibrator fitted before (see :func:`load_fitted`), used instead of fitting.
        loaded_from: where ``loaded`` was read from (recorded).
        status: a context manager factory showing a status line while fitting.

    Returns:
        ``(calibrator, spec)``.
    """
    from flowsearch.calibration import make_calibrator
    from flowsearch.calibration.anisotropy import (
        AUTO_STATISTIC,
        AUTO_THRESHOLD,
        anisotropy_stats,
        should_calibrate,
    )

    stats = {k: float(v) for k, v in anisotropy_stats(U).items()}
    auto = None
    if loaded is not None:
        cal = loaded
        fitted_on = str(Path(loaded_from).resolve()) if loaded_from else "elsewhere"
        space, decision = "calibrated", "forced: a calibrator fitted elsewhere"
    else:
        name = AUTO_FITS if calibration == "auto" else calibration
        cal = make_calibrator(name, seed=0) if name in _SEEDED else make_calibrator(name)
        with status(f"fitting {name} on {len(U):,} rows") if status else contextlib.nullcontext():
            cal.fit(U)
        fitted_on = "corpus"
        if calibration == "auto":
            anisotropic = bool(should_calibrate(stats))
            enough = len(U) >= MIN_ROWS_PER_DIM * U.shape[1]
            searched = anisotropic and enough
            space = "calibrated" if searched else "encoder"
            decision = (
                f"{AUTO_STATISTIC}={stats.get(AUTO_STATISTIC, float('nan')):.4f} "
                f"{'>' if anisotropic else '<='} {AUTO_THRESHOLD}"
                + ("" if enough or not anisotropic else
                   f", but {len(U)} rows < {MIN_ROWS_PER_DIM} x dim {U.shape[1]}")
                + f": search in the {'flow' if searched else 'encoder'} space"
            )  # fmt: skip
            auto = AutoDecision(AUTO_STATISTIC, float(AUTO_THRESHOLD), searched)
        elif calibration == "none":  # the identity: say so, search the encoder's own vectors
            space, decision = "encoder", "calibration='none': the encoder's own space"
        else:
            space, decision = "calibrated", f"forced: calibration={calibration!r}"
    LOG.info("calibration: %s", decision)
    spec = CalibrationSpec(
        name=calibration if loaded is None else cal.name,
        calibrator=cal.name,
        space=space,
        config=dict(cal.config),
        decision=decision,
        anisotropy=stats,
        fitted_on=fitted_on,
        fit_rows=int(len(U)),
        fit_stats=dict(cal.fit_stats),
        dim_out=int(cal.dim_out or U.shape[1]),
        auto=auto,
    )
    return cal, spec
