r"""Drift: where rows added to an index sit among the corpus's own passages, in plain words.

Each new row is scored like a query: its best score against the rows the index held before the
write (a fixed-size sample of them, :mod:`flowsearch.space.sample`), placed among the corpus's
own rows' best scores against the same rows (a :class:`~flowsearch.space.reference.Reference`)
as a percentile. If the new rows are like the corpus, each percentile is uniform on 0-100, whatever
the encoder, the space or the text length. The report gives their median percentile with a
distribution-free interval from order statistics (:func:`median_interval`), so a handful of rows
is judged with the uncertainty a handful allows:

- ``apart from the corpus`` (the only alarm, ``warn``): the interval lies wholly below
  :data:`DRIFT_APART_PERCENTILE` (25): most new rows are less like the corpus than three
  quarters of its passages, beyond what chance gives. The advice depends on the searched space
  (a calibrated space may want ``recalibrate``; the encoder's own space has nothing to refit).
- ``a little apart``: the interval is below 50 but reaches 25: related rows, nothing to do.
- ``closer than its own passages``: the interval lies above 75: likely repeats of rows held.
- ``like the corpus``: the interval holds the middle and stays above 25.
- ``too few to tell``: fewer than :data:`DRIFT_MIN_ROWS` (5) rows, or an interval that
  reaches both "apart" and the middle.

The flow's log-density, which the previous release judged drift by, tracks text length more
than topic (the study ``density``; benchmarks/RESULTS.md, "Figures behind the defaults"): a
passage with one word prepended sat far "below" the corpus. It stays a raw figure here.

Example:
    >>> from flowsearch.space.reference import Reference
    >>> ref = Reference.from_scores(np.linspace(0.2, 0.6, 201), method="held-out",
    ...                             n_corpus=2000, space="encoder")
    >>> report = drift_report(np.full(8, 0.21), ref)
    >>> report.verdict, report.warn, report.median_percentile
    ('apart from the corpus', True, 2.5)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from flowsearch.space import reference as space_reference
from flowsearch.space.reference import Reference, share_words, why_unusable

__all__ = ["DriftReport", "DriftVerdict", "drift_report", "median_interval"]

#: Confidence of the interval around new rows' median percentile (order statistics).
DRIFT_CONFIDENCE = 0.95
#: New rows sit apart from the corpus when their median percentile is below this with
#: :data:`DRIFT_CONFIDENCE`: most of them less like the corpus than 3/4 of its passages.
DRIFT_APART_PERCENTILE = 25.0
#: Fewer new rows than this are described, never judged as drift: so few rows all below
#: :data:`DRIFT_APART_PERCENTILE` happen by chance too often to raise an alarm.
DRIFT_MIN_ROWS = 5

DriftVerdict = Literal[
    "like the corpus",
    "a little apart",
    "apart from the corpus",
    "closer than its own passages",
    "too few to tell",
    "not judged",
]


def _half_binomial_cdf(n: int) -> np.ndarray:
    """``P(B <= k)`` for ``B ~ Binomial(n, 1/2)``, k = 0 .. n // 2 (float64; in log space, so
    large n neither overflows nor needs scipy, whose import costs seconds on a cold start)."""
    k = np.arange(n // 2 + 1)
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    log_pmf = lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0) - n * math.log(2.0)
    cdf: np.ndarray = np.minimum(np.cumsum(np.exp(log_pmf)), 1.0)
    return cdf


def median_interval(percentiles: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """A distribution-free interval for the median of the values' population.

    The interval is ``[x(j), x(n+1-j)]`` of the sorted values with the largest ``j`` whose
    coverage ``1 - 2 P(B <= j - 1)``, ``B ~ Binomial(n, 1/2)``, reaches ``confidence``; below
    six values no ``j`` reaches 95%, and the whole range (``j = 1``) is returned with its own
    coverage.

    Args:
        percentiles: float (n,), n >= 1, finite.
        confidence: the coverage asked for, in (0, 1).

    Returns:
        ``(low, high, coverage)``; coverage 0 for a single value.

    Example:
        >>> low, high, cover = median_interval(np.arange(100.0), 0.95)
        >>> low, high, round(cover, 3)
        (39.0, 60.0, 0.965)
    """
    x = np.sort(np.asarray(percentiles, np.float64))
    n = len(x)
    if n == 1:
        return float(x[0]), float(x[0]), 0.0
    j = np.arange(1, n // 2 + 1)
    coverage = 1.0 - 2.0 * _half_binomial_cdf(n)[j - 1]
    ok = np.nonzero(coverage >= confidence)[0]
    pick = int(ok[-1]) if len(ok) else 0
    k = int(j[pick])
    return float(x[k - 1]), float(x[n - k]), float(coverage[pick])


class DriftReport(BaseModel):
    """Where new rows sit among the corpus's own passages (see :func:`drift_report`).

    Attributes:
        n_rows: new rows written; n_scored: how many of them were scored (a sample of a large
            write), n_judged: how many had a best score (another row to be near).
        n_sample: rows of the index they were scored against (its reference sample); None
            when not recorded (the whole index, in earlier releases' reports).
        verdict: see :data:`DriftVerdict`; warn: True only for ``apart from the corpus``.
        reason: why it was not judged; None otherwise.
        median_percentile: the judged rows' median percentile among the reference (0-100).
        interval: a distribution-free interval for it (:func:`median_interval`).
        coverage: the interval's confidence (below :data:`DRIFT_CONFIDENCE` for fewer
            than six rows, where it is their whole range).
        share_flagged: share of judged rows below ``OOD_PERCENTILE`` (what a query
            that far off would be flagged at).
        space: the searched space (``calibrated`` or ``encoder``), which decides the advice.
        median_score, reference_median: raw best scores. log_density_median,
            reference_log_density: raw log-densities (only with a reliable calibrator).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")
    n_rows: int
    n_scored: int
    n_judged: int
    n_sample: int | None = None
    verdict: DriftVerdict
    warn: bool = False
    reason: str | None = None
    median_percentile: float | None = None
    interval: tuple[float, float] | None = None
    coverage: float | None = None
    share_flagged: float | None = None
    space: str | None = None
    median_score: float | None = None
    reference_median: float | None = None
    log_density_median: float | None = None
    reference_log_density: float | None = None

    def to_dict(self) -> dict[str, object]:
        """The JSON form (``add --json``, the history)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_record(cls, record: Mapping[str, object] | None) -> DriftReport | None:
        """The report a write's history record holds, or None: no report, or the previous
        release's log-density figures (``gap_std``, ...), which are not comparable."""
        if not record or "verdict" not in record:
            return None
        return cls.model_validate(dict(record))

    def _interval_words(self) -> str:
        assert self.interval is not None and self.coverage is not None
        lo, hi = self.interval
        if self.coverage >= DRIFT_CONFIDENCE:
            return f"{self.coverage * 100:.0f}% interval {lo:.0f}-{hi:.0f}"
        return f"range {lo:.0f}-{hi:.0f}"

    def to_words(self) -> str:
        """The report in one or two sentences: where the rows sit, and what to do when it
        matters."""
        if self.verdict == "not judged" or self.median_percentile is None:
            return f"drift not judged: {self.reason}"
        m, n = self.median_percentile, self.n_judged
        if n == 1:
            where = (
                f"less like the corpus than {share_words(100 - m)} of its own passages"
                if m < space_reference.OOD_PERCENTILE
                else f"closer to the corpus than {share_words(m)} of its own passages"
            )
            return f"the new row is {where} (percentile {m:.0f}); one row is too few to call drift"
        rows = f"the {self.n_rows:,} new rows"
        if n < self.n_rows:  # count what was judged apart from what was written
            why = (
                "a seeded sample"
                if self.n_scored < self.n_rows
                else "the others had no row to compare with"
            )
            rows += f" ({n:,} of them judged, {why})"
        figures = f"median percentile {m:.0f} ({self._interval_words()})"
        if self.verdict == "too few to tell":
            return f"{rows}: {figures}; too few to tell whether they differ from the corpus"
        if self.verdict == "like the corpus":
            return f"{rows} sit like the corpus: {figures}"
        if self.verdict == "a little apart":
            return (
                f"{rows} sit a little apart from the corpus: {figures}; related to it, "
                "nothing to do"
            )
        if self.verdict == "closer than its own passages":
            return (
                f"{rows} sit closer to the corpus than its own passages do: {figures}; many "
                "may repeat passages the index already holds"
            )
        flagged = self.share_flagged or 0.0
        return (
            f"{rows} sit apart from the corpus: {figures}; {flagged:.0%} of them are less like "
            f"it than {share_words(100 - space_reference.OOD_PERCENTILE)} of its own passages. "
            + _advice(self.space)
        )

    def to_explain(self) -> str:
        """The raw figures behind the report, in one line (``--explain``)."""
        against = (
            "the index"
            if self.n_sample is None
            else f"{self.n_sample:,} rows of the index (its reference sample)"
        )
        parts = [f"{self.n_judged:,} of {self.n_rows:,} new rows scored against {against}"]
        if self.median_score is not None and self.reference_median is not None:
            parts.append(
                f"median best score {self.median_score:.3f} (the corpus's passages: "
                f"{self.reference_median:.3f})"
            )
        if self.log_density_median is not None and self.reference_log_density is not None:
            parts.append(
                f"median log-density {self.log_density_median:.1f} (passages' "
                f"{self.reference_log_density:.1f}; it tracks text length, so it is not judged)"
            )
        return "; ".join(parts)


def _advice(space: str | None) -> str:
    """What to do about new rows that sit apart from the corpus."""
    if space == "encoder":
        return (
            "If they belong here, nothing needs doing: the index searches the encoder's own "
            "space, with no calibration to refit. If they were meant for another index, "
            "delete them."
        )
    return (
        "If they belong here and rows like them keep coming, recalibrate the index once they "
        "are a large share of it, so its calibration fits them too. If they were meant for "
        "another index, delete them."
    )


def _drift_verdict(lo: float, hi: float, n: int) -> DriftVerdict:
    """The verdict of ``n`` judged rows whose median percentile lies in ``[lo, hi]``."""
    if n < DRIFT_MIN_ROWS:
        return "too few to tell"
    if hi < DRIFT_APART_PERCENTILE:
        return "apart from the corpus"
    if lo > 100 - DRIFT_APART_PERCENTILE:
        return "closer than its own passages"
    if hi < 50:
        return "a little apart"
    if lo < DRIFT_APART_PERCENTILE:
        return "too few to tell"  # the interval reaches both the corpus's middle and "apart"
    return "like the corpus"


def drift_report(
    best_scores: np.ndarray,
    reference: Reference | None,
    log_densities: np.ndarray | None = None,
    *,
    rows: int | None = None,
    sample: int | None = None,
) -> DriftReport:
    """Where new rows sit among the corpus's own passages.

    Args:
        best_scores: float (m,), each new row's best score against the rows the index held
            before the write (rows the write replaces excluded; the reference sample of them),
            in the searched space; NaN where there was none. At most
            ``flowsearch.writes.measure.DRIFT_MAX_ROWS`` of the new rows need scoring (a seeded
            sample).
        reference: the index's reference before the write.
        log_densities: float (m,), the scored rows' log-densities, or None (raw figures,
            kept only when the reference has a reliable median to show beside them).
        rows: how many rows the write added, when ``best_scores`` is a sample (default m).
        sample: how many rows of the index they were scored against (its reference sample).

    Returns:
        The report: ``warn`` only when the interval around the median percentile is wholly
        below :data:`DRIFT_APART_PERCENTILE` (see the module docstring).
    """
    scores = np.asarray(best_scores, np.float64).ravel()
    total = len(scores) if rows is None else int(rows)
    judged = scores[np.isfinite(scores)]
    base: dict[str, Any] = {"n_rows": total, "n_scored": len(scores), "n_judged": len(judged),
                            "n_sample": sample}  # fmt: skip
    reason = why_unusable(reference)
    if reason is None and not len(judged):
        reason = "no new row had an existing row to be compared with"
    if reason is not None or reference is None:
        return DriftReport(verdict="not judged", reason=reason, **base)
    pct = reference.percentiles(judged)
    lo, hi, coverage = median_interval(pct, DRIFT_CONFIDENCE)
    verdict = _drift_verdict(lo, hi, len(judged))
    raw: dict[str, Any] = {
        "median_score": float(np.median(judged)),
        "reference_median": reference.score_at(50.0),
    }
    if log_densities is not None and reference.log_density_median is not None:
        lp = np.asarray(log_densities, np.float64)
        lp = lp[np.isfinite(lp)]
        if len(lp):
            raw.update(
                log_density_median=float(np.median(lp)),
                reference_log_density=reference.log_density_median,
            )
    return DriftReport(
        verdict=verdict,
        warn=verdict == "apart from the corpus",
        median_percentile=round(float(np.median(pct)), 1),
        interval=(round(lo, 1), round(hi, 1)),
        coverage=round(coverage, 4),
        share_flagged=round(float(np.mean(pct < space_reference.OOD_PERCENTILE)), 4),
        space=reference.space,
        **base,
        **raw,
    )
