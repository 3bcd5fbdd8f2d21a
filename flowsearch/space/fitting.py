r"""Choosing and fitting an index's calibrator, and deciding the space it searches.

``calibration="auto"`` searches a calibrated space only when the corpus's vectors are
anisotropic (:func:`should_calibrate`) or come from a
non-contextual pooling (:data:`AUTO_CALIBRATES_POOLINGS`: ``static``, a transformer's token table
or a Model2Vec model, and ``embedding_layer``), and there are at least
:data:`~flowsearch.space.reference.MIN_ROWS_PER_DIM` rows per dimension. Then it fits and searches
:data:`AUTO_SEARCHES`, partial whitening with a Gaussian density
(``make_calibrator("gaussian", power=0.25)``); otherwise it fits :data:`AUTO_FITS`
(``whitening-flow``, on at most :data:`DENSITY_FIT_ROWS` of the rows: it serves the density
alone) and searches the encoder's own space. Either way the fitted calibrator has a density for
the drift and query reports. A named calibration is fitted and always searched; a
calibrator fitted elsewhere (the paper's "flow (NLI)" setting) is loaded and checked against the
encoder.

Why partial whitening (issue 16, the study ``retrieval``): ``auto`` was set on STS, where both
sides of a pair come from one distribution. For query -> passage search, full whitening (and
``whitening-flow``, which matches it) equalises every direction, including ones that carry
little meaning, and on one dev set it lost to raw static vectors, while partial whitening
(eigenvalues to the power -1/4) was above raw on every set and above full whitening on average.
Its density is the corpus's full-covariance Gaussian
(:class:`~flowsearch.calibration.linear.Gaussian`) instead of the flow (issue 16 found the
Gaussian's density at least as good a signal as the flow's).

Why non-contextual poolings by their kind (issue 16, the study ``retrieval_auto``): a Model2Vec
model's vectors (PCA-reduced and unit-normalised) have a mean cosine under the anisotropy
threshold, yet partial whitening was never worse than raw on a dev set and gained on average, as
for the transformer's own token table; ``embedding_layer`` sits on the threshold, where the
statistic kept it raw though partial whitening gained. A lower threshold would also separate
Model2Vec from the contrastive ``mean`` (which calibration hurts even partially), but the STS
study that set the threshold has a contextual pooling just under it that calibration hurts
(MiniLM ``first_last_avg``); the kind of encoder separates them without that conflict.
Contextual poolings keep the statistic's rule. The figures: benchmarks/RESULTS.md, "Figures
behind the defaults".

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from flowsearch.errors import BadInput
from flowsearch.space.reference import MIN_ROWS_PER_DIM
from flowsearch.storage.manifest import AutoDecision, CalibrationSpec

if TYPE_CHECKING:
    from flowsearch.calibration.base import Calibrator, CalibratorConfig

#: The anisotropy statistic (:func:`~flowsearch.calibration.anisotropy.anisotropy_stats`)
#: :func:`should_calibrate` thresholds.
AUTO_STATISTIC: str = "mean_cosine"
#: Calibrate when ``stats[AUTO_STATISTIC] > AUTO_THRESHOLD`` (docs/CALIBRATION.md).
AUTO_THRESHOLD: float = 0.33


def should_calibrate(stats: dict[str, float]) -> bool:
    """True when the vectors are anisotropic enough that search should use a calibrated space:
    ``stats[AUTO_STATISTIC] > AUTO_THRESHOLD``.

    Arguments:
        stats: The output of :func:`~flowsearch.calibration.anisotropy.anisotropy_stats` (at
            least :data:`AUTO_STATISTIC`).

    Raises:
        KeyError: ``stats`` lacks :data:`AUTO_STATISTIC`.
    """
    if AUTO_STATISTIC not in stats:
        raise KeyError(f"should_calibrate needs the {AUTO_STATISTIC!r} statistic")
    return bool(stats[AUTO_STATISTIC] > AUTO_THRESHOLD)


__all__ = [
    "AUTO_CALIBRATES_POOLINGS",
    "AUTO_FITS",
    "AUTO_SEARCHES",
    "checked_calibration",
    "too_few_rows",
    "fit_for_index",
    "load_fitted",
]

LOG = logging.getLogger(__name__)

#: What ``auto`` fits when it searches the encoder's space: a density model for the drift and
#: query reports. Starting the flow from whitened vectors matches whitening, which the reference
#: flow trails when fitted on few rows (benchmarks/RESULTS.md, "Figures behind the defaults").
AUTO_FITS = "whitening-flow"
#: What ``auto`` fits and searches on an anisotropic corpus with enough rows: (name, config).
#: Partial whitening, chosen on the retrieval dev sets (module docstring).
AUTO_SEARCHES: tuple[str, CalibratorConfig] = ("gaussian", {"power": 0.25})
#: Poolings ``auto`` calibrates whatever their anisotropy statistic: the non-contextual ones, means
#: of token vectors that no attention layer has mixed (``static``: a transformer's token table or
#: a Model2Vec model; ``embedding_layer``: the embedding layer's outputs). See the module
#: docstring for the measurements.
AUTO_CALIBRATES_POOLINGS: frozenset[str] = frozenset({"static", "embedding_layer"})
#: When ``auto`` keeps the encoder's space, the flow it fits serves only the raw log-density
#: figures, so a seeded uniform sample of at most this many fit rows is enough, and bounds the
#: fit's memory on a large corpus.
DENSITY_FIT_ROWS = 50_000
_SEEDED = ("flow", "whitening-flow")

#: Calibrators whose fit inverts the corpus's covariance. Fitted on fewer rows than
#: ``MIN_ROWS_PER_DIM`` per dimension they overfit it: with fewer rows than dimensions every
#: corpus row comes out equidistant from every other (their best scores all -1/(n-1)), so the
#: reference, the verdict and drift say nothing, and on the sample corpus they rank written
#: questions' passages below the encoder's own space, flow, sn and natsv (benchmarks/RESULTS.md,
#: "Figures behind the defaults").
COVARIANCE_FITS: frozenset[str] = frozenset({"whitening", "gaussian", "whitening-flow"})


def too_few_rows(calibrator: str | None, fit_rows: int, dim: int) -> bool:
    """True when ``calibrator`` fitted on ``fit_rows`` rows of ``dim`` dimensions overfits
    (:data:`COVARIANCE_FITS` below ``MIN_ROWS_PER_DIM`` rows per dimension)."""
    return calibrator in COVARIANCE_FITS and 0 < fit_rows < MIN_ROWS_PER_DIM * dim


def checked_calibration(calibration: object) -> None:
    """Refuse, before any work, a ``calibration`` an index cannot be built or refitted with.

    ``auto`` is this module's policy, not a calibrator, so the calibrators' own registry does not
    list it; the error lists every name a build or ``recalibrate`` takes, ``auto`` first.

    Raises:
        BadInput: an unknown name (``param="calibration"``).
    """
    from flowsearch.calibration import names

    if calibration == "auto" or (isinstance(calibration, str) and calibration in names()):
        return
    raise BadInput(
        f"unknown calibration {calibration!r}",
        f"choose one of {', '.join(('auto', *names()))}",
        param="calibration",
    )


def load_fitted(calibrator: str | os.PathLike[str], calibration: str, dim: int) -> Calibrator:
    """A calibrator fitted before, checked against the requested name and the encoder's dim.

    Raises:
        BadInput: an unreadable calibrator, a contradicting ``calibration``, another dim.
    """
    from flowsearch.calibration import load_calibrator

    cal = load_calibrator(calibrator)
    if calibration not in ("auto", cal.name):
        raise BadInput(
            f"calibration={calibration!r} contradicts the {cal.name!r} calibrator in {calibrator}",
            "leave {calibration} out or make it agree with the calibrator",
            param="calibration",
        )
    if cal.dim_in != dim:
        raise BadInput(
            f"the calibrator in {calibrator} was fitted on {cal.dim_in}-d vectors, this "
            f"encoder gives {dim}-d",
            "use the model and pooling the calibrator was fitted with",
            param="calibrator",
        )
    return cal


@dataclass(frozen=True)
class _Choice:
    """What to fit, and what ``auto`` measured to choose it."""

    name: str
    config: CalibratorConfig
    searched: bool = False
    anisotropic: bool = False
    by_kind: bool = False
    enough: bool = True


def _choose(U: np.ndarray, calibration: str, stats: dict[str, float], pooling: str | None
            ) -> tuple[_Choice, np.ndarray]:  # fmt: skip
    """The calibrator to fit (and the rows to fit it on: a density-only flow needs a sample)."""
    if calibration != "auto":
        return _Choice(calibration, {"seed": 0} if calibration in _SEEDED else {}), U
    if len(U) < 2:  # nothing to fit a density on: the identity, in the encoder's space
        return _Choice("none", {}, enough=False), U
    anisotropic = bool(should_calibrate(stats))
    by_kind = pooling in AUTO_CALIBRATES_POOLINGS
    enough = len(U) >= MIN_ROWS_PER_DIM * U.shape[1]
    searched = (anisotropic or by_kind) and enough
    if searched:
        name, config = AUTO_SEARCHES
        return _Choice(name, config.copy(), True, anisotropic, by_kind, enough), U
    most = DENSITY_FIT_ROWS
    if len(U) > most:  # a density only: a sample is enough
        U = U[np.sort(np.random.default_rng(0).choice(len(U), most, replace=False))]
    return _Choice(AUTO_FITS, {"seed": 0}, False, anisotropic, by_kind, enough), U


def _auto_decision(choice: _Choice, stats: dict[str, float], pooling: str | None,
                   U: np.ndarray) -> str:  # fmt: skip
    """``auto``'s decision in words: the statistic, its threshold, why this space."""
    strength = "".join(f", {k}={v}" for k, v in choice.config.items())
    kind_only = choice.by_kind and not choice.anisotropic
    short = not choice.enough and (choice.anisotropic or choice.by_kind)
    return (
        f"{AUTO_STATISTIC}={stats.get(AUTO_STATISTIC, float('nan')):.4f} "
        f"{'>' if choice.anisotropic else '<='} {AUTO_THRESHOLD}"
        + (f", but pooling {pooling!r} is non-contextual" if kind_only else "")
        + (f", but {len(U)} rows < {MIN_ROWS_PER_DIM} x dim {U.shape[1]}" if short else "")
        + (f": search in the {choice.name} space ({choice.name}{strength})" if choice.searched
           else ": search in the encoder space")
    )  # fmt: skip


Space = Literal["calibrated", "encoder"]


def _space(
    choice: _Choice, calibration: str, stats: dict[str, float], pooling: str | None, U: np.ndarray
) -> tuple[Space, str, AutoDecision | None]:
    """The searched space, the decision in words, and ``auto``'s record."""
    if calibration == "auto":
        auto = AutoDecision(statistic=AUTO_STATISTIC, threshold=float(AUTO_THRESHOLD),
                            calibrated=choice.searched)  # fmt: skip
        space: Space = "calibrated" if choice.searched else "encoder"
        return space, _auto_decision(choice, stats, pooling, U), auto
    if calibration == "none":  # the identity: say so, search the encoder's own vectors
        return "encoder", "calibration='none': the encoder's own space", None
    decision = f"forced: calibration={calibration!r}"
    if too_few_rows(choice.name, len(U), U.shape[1]):
        decision += (
            f", but {len(U)} rows < {MIN_ROWS_PER_DIM} x dim {U.shape[1]}: too few, it overfits"
        )
    return "calibrated", decision, None


def fit_for_index(
    U: np.ndarray,
    calibration: str,
    loaded: Calibrator | None = None,
    loaded_from: str | os.PathLike[str] | None = None,
    status: Callable[[str], contextlib.AbstractContextManager[object]] | None = None,
    pooling: str | None = None,
) -> tuple[Calibrator, CalibrationSpec]:
    """Fit the calibrator on raw vectors ``U`` (float32 (n, dim)) and decide the searched space.

    Args:
        U: the corpus's raw vectors (or a uniform sample of them).
        calibration: ``auto``, a calibrator name, or ``none``.
        loaded: a calibrator fitted before (see :func:`load_fitted`), used instead of fitting.
        loaded_from: where ``loaded`` was read from (recorded).
        status: a context manager factory showing a status line while fitting.
        pooling: the encoder's pooling: ``auto`` calibrates the non-contextual ones
            (:data:`AUTO_CALIBRATES_POOLINGS`) whatever their statistic.

    Returns:
        ``(calibrator, spec)``.
    """
    from flowsearch.calibration import make_calibrator
    from flowsearch.calibration.anisotropy import anisotropy_stats
    from flowsearch.calibration.base import json_config

    # a statistic of pairs needs two rows at least (a one-row index is searched as it is)
    stats = {k: float(v) for k, v in anisotropy_stats(U).items()} if len(U) >= 2 else {}
    auto = None
    space: Literal["calibrated", "encoder"]
    if loaded is not None:
        cal = loaded
        fitted_on = str(Path(loaded_from).resolve()) if loaded_from else "elsewhere"
        space, decision = "calibrated", "forced: a calibrator fitted elsewhere"
    else:
        choice, U = _choose(U, calibration, stats, pooling)
        cal = make_calibrator(choice.name, **choice.config)
        showing = status(f"fitting {choice.name} on {len(U):,} rows") if status else None
        with showing or contextlib.nullcontext():
            # the identity learns only the dimension, which one row gives (a 1-row index)
            cal.fit(np.vstack([U, U]) if choice.name == "none" and len(U) == 1 else U)
        fitted_on = "corpus"
        space, decision, auto = _space(choice, calibration, stats, pooling, U)
    LOG.info("calibration: %s", decision)
    if loaded is None and calibration != "auto" and too_few_rows(cal.name, len(U), U.shape[1]):
        LOG.warning(
            "%s fitted on %d rows, fewer than %d per dimension (%d): it overfits and search "
            "suffers; calibration auto searches the encoder's own space until there are more",
            cal.name, len(U), MIN_ROWS_PER_DIM, U.shape[1],
        )  # fmt: skip
    spec = CalibrationSpec(
        name=calibration if loaded is None else cal.name,
        calibrator=cal.name,
        space=space,
        config=json_config(cal.config),
        decision=decision,
        anisotropy=stats,
        fitted_on=fitted_on,
        fit_rows=int(len(U)),
        fit_stats=dict(cal.fit_stats),
        dim_out=int(cal.dim_out or U.shape[1]),
        auto=auto,
    )
    return cal, spec
