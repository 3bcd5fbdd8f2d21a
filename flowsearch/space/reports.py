r"""Reports in plain words: the query verdict, and what an index searches.

A query is judged by its best dense score (its cosine to the nearest row of the index), placed
among the corpus's own rows' (:class:`~flowsearch.space.reference.Reference`): *out of
distribution* below :data:`~flowsearch.space.reference.OOD_PERCENTILE` (5).
:meth:`QueryReport.to_words` says it in percentiles of the corpus ("this query is less like it
than 97% of the corpus's own passages"); the raw figures (scores, log-densities) are fields, for
``--json``, and :meth:`QueryReport.to_explain`. The drift of new rows is
:mod:`flowsearch.space.drift`.

:func:`describe_space` says in one line what an index searches, from the manifest's calibration
record (for ``info``).

Example:
    >>> import numpy as np
    >>> from flowsearch.space.reference import Reference
    >>> ref = Reference.from_scores(np.linspace(0.2, 0.6, 201), method="leave-one-out",
    ...                             n_corpus=201)
    >>> print(query_report(0.212, ref).to_words())  # doctest: +NORMALIZE_WHITESPACE
    unlike the corpus: this query is less like it than 97% of the corpus's own passages;
    its hits may be weak matches
    >>> print(query_report(0.5, ref).to_words())  # doctest: +NORMALIZE_WHITESPACE
    like the corpus: this query is closer to it than 75% of the corpus's own passages
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from flowsearch.space import reference as space_reference
from flowsearch.space.reference import MIN_ROWS_PER_DIM, Reference, share_words, why_unusable

__all__ = ["QueryReport", "QueryVerdict", "describe_space", "query_report"]

QueryVerdict = Literal["in-distribution", "out-of-distribution", "not judged"]


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


class QueryReport(BaseModel):
    """Whether a query looks like the indexed passages (see :func:`query_report`).

    Attributes:
        verdict: ``in-distribution``, ``out-of-distribution`` or ``not judged``.
        reason: why it was not judged, in words; None when judged.
        percentile: where the query's best score falls among the reference rows' (0-100).
        top_score: the query's best dense score over the whole index (raw).
        reference_cut: the reference's score at ``OOD_PERCENTILE`` (raw).
        reference_median: the reference's median score (raw).
        n_reference: rows the reference measured; reference_method: how.
        log_density: the query's log-density under the calibrator (raw; shown only with a
            reliable calibrator; it tracks text length, so it is never judged).
        reference_log_density: the reference rows' median log-density (raw).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")
    verdict: QueryVerdict
    reason: str | None = None
    percentile: float | None = None
    top_score: float | None = None
    reference_cut: float | None = None
    reference_median: float | None = None
    n_reference: int | None = None
    reference_method: str | None = None
    log_density: float | None = None
    reference_log_density: float | None = None

    def to_dict(self) -> dict[str, object]:
        """The JSON form (``--json``, the HTTP API)."""
        return self.model_dump(mode="json")

    def to_words(self) -> str:
        """The verdict in one line, in percentiles of the corpus (the query table's caption)."""
        if self.verdict == "not judged" or self.percentile is None:
            return f"not judged: {self.reason}"
        p = self.percentile
        if self.verdict == "out-of-distribution":
            return (
                f"unlike the corpus: this query is less like it than {share_words(100 - p)} of the "
                "corpus's own passages; its hits may be weak matches"
            )
        return (
            f"like the corpus: this query is closer to it than {share_words(p)} of the "
            "corpus's own passages"
        )

    def to_explain(self) -> str:
        """The raw figures behind the verdict, in one line (``--explain``)."""
        parts = []
        if self.top_score is not None:
            parts.append(f"best dense score {self.top_score:.3f}")
        if self.percentile is not None and self.reference_cut is not None:
            parts.append(
                f"percentile {self.percentile:.1f} among {self.n_reference:,} passages' best "
                f"score to another passage ({self.reference_method}; "
                f"{space_reference.OOD_PERCENTILE:g}th percentile {self.reference_cut:.3f}, median "
                f"{self.reference_median:.3f})"
            )
        if self.log_density is not None and self.reference_log_density is not None:
            parts.append(
                f"log-density {self.log_density:.1f} (passages' median "
                f"{self.reference_log_density:.1f}; it tracks text length, so it is not judged)"
            )
        return "; ".join(parts) if parts else self.to_words()


def query_report(
    top_score: float | None, reference: Reference | None, log_density: float | None = None
) -> QueryReport:
    """Judge a query by its best dense score among the reference's.

    Args:
        top_score: the query's best dense score over the whole index, or None when there is
            none to compare (lexical mode, or a filter: the best row of a subset is not the
            best row of the corpus).
        reference: the index's reference (:func:`~flowsearch.space.reference.reference_of`).
        log_density: the query's log-density under the calibrator, or None (a raw figure: kept
            only when the reference has a reliable median to show beside it).

    Returns:
        The report; ``not judged`` (with a reason in words) when there is no usable reference
        or score, or when the index searches an anisotropic encoder space (there every passage
        is close to every other, and a short query's best score says more about its length
        than its topic: the study ``drift``).
    """
    top = _finite(top_score)
    raw: dict[str, Any] = {"top_score": top}
    if reference is not None and reference.measured:
        raw.update(
            reference_cut=reference.score_at(space_reference.OOD_PERCENTILE),
            reference_median=reference.score_at(50.0),
            n_reference=reference.n_measured,
            reference_method=reference.method,
        )
        if reference.log_density_median is not None:
            raw.update(
                log_density=_finite(log_density),
                reference_log_density=reference.log_density_median,
            )
    reason = why_unusable(reference)
    if reason is None and reference is not None and _anisotropic(reference):
        reason = (
            f"in this space every passage is close to every other (mean cosine "
            f"{reference.mean_cosine:.2f}), so how close a query comes says more about its "
            "length than its topic"
        )
    if reason is None and top is None:
        reason = "this search gave no dense score over the whole index (lexical mode, or a filter)"
    if reason is not None or reference is None or top is None:
        return QueryReport(verdict="not judged", reason=reason, **raw)
    p = reference.percentile(top)
    verdict: QueryVerdict = (
        "out-of-distribution" if p < space_reference.OOD_PERCENTILE else "in-distribution"
    )
    return QueryReport(verdict=verdict, percentile=round(p, 1), **raw)


def _anisotropic(reference: Reference) -> bool:
    """True when the reference was measured in an encoder space that ``auto`` calls
    anisotropic (its mean cosine above the threshold that makes ``auto`` calibrate)."""
    from flowsearch.space.fitting import AUTO_THRESHOLD

    return reference.mean_cosine is not None and reference.mean_cosine > AUTO_THRESHOLD


def _field(record: Any, name: str, default: Any = None) -> Any:
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def _calibrator_words(calibrator: str, config: Mapping[str, Any]) -> str:
    """A calibrator in words, with an article: "a partial whitening", "a normalizing flow"."""
    if calibrator in ("whitening", "gaussian"):
        power, k = float(config.get("power", 0.5)), config.get("k")
        kind = "a whitening" if power >= 0.5 else "a partial whitening"
        if power <= 0:
            kind = "a centring and rotation"
        return kind + (f" to {k} dimensions" if k else "")
    return {
        "flow": "a normalizing flow (BERT-flow)",
        "whitening-flow": "a whitening-flow",
        "sn": "a standardisation of each dimension (SN)",
        "natsv": f"a removal of the top {config.get('k', 6)} principal directions (NATSV)",
        "sn-natsv": "a standardisation, then a removal of the top principal directions",
    }.get(calibrator, f"a {calibrator}")


def describe_space(calibration: object, pooling: str | None = None) -> str:
    """What an index searches, in one line, from its calibration record.

    Args:
        calibration: the manifest's ``CalibrationSpec`` (or its JSON form): ``name``,
            ``calibrator``, ``space``, ``config``, ``anisotropy``, ``fitted_on``, ``fit_rows``,
            ``dim_out``, ``decision``.
        pooling: the encoder's pooling, which tells why ``auto`` calibrated a non-contextual
            encoder (read from ``decision`` when not given).

    Example:
        >>> record = {"name": "auto", "calibrator": "whitening-flow", "space": "encoder",
        ...           "anisotropy": {"mean_cosine": 0.05}, "fit_rows": 300, "dim_out": 384}
        >>> print(describe_space(record))  # doctest: +NORMALIZE_WHITESPACE
        searches the encoder's own space (auto: its vectors are already spread out, mean
        cosine 0.05); a whitening-flow was fitted on 300 rows and kept for density
    """
    from flowsearch.space.fitting import (
        AUTO_CALIBRATES_POOLINGS,
        AUTO_STATISTIC,
        AUTO_THRESHOLD,
        too_few_rows,
    )

    name, calibrator = _field(calibration, "name"), _field(calibration, "calibrator")
    config = _field(calibration, "config") or {}
    fit_rows = int(_field(calibration, "fit_rows") or 0)
    stat = (_field(calibration, "anisotropy") or {}).get(AUTO_STATISTIC)
    kind = _calibrator_words(calibrator, config)
    fitted_on = _field(calibration, "fitted_on") or "corpus"
    where = f"fitted on {fit_rows:,} rows"
    if fitted_on != "corpus":
        where = f"fitted elsewhere ({fitted_on})"
    if _field(calibration, "space") == "calibrated":
        what = f"searches {kind} of the encoder's space"
        if name != "auto":
            dim = int(_field(calibration, "dim_out") or 0)
            if fitted_on == "corpus" and too_few_rows(calibrator, fit_rows, dim):
                return f"{what}, {where}: too few for {dim} dimensions, it overfits ({name})"
            return f"{what}, {where}" + ("" if fitted_on != "corpus" else f" (calibration={name})")
        non_contextual = pooling in AUTO_CALIBRATES_POOLINGS or (
            pooling is None and "non-contextual" in (_field(calibration, "decision") or "")
        )
        why = f"{pooling or 'a non-contextual'} pooling" if non_contextual else (
            f"its vectors are anisotropic, mean cosine {stat:.2f} > {AUTO_THRESHOLD}"
            if stat is not None else "its vectors are anisotropic"
        )  # fmt: skip
        return f"{what} (auto: {why}), {where}"
    if calibrator in (None, "none"):
        return "searches the encoder's own space (no calibration)"
    if name == "auto":
        dim = int(_field(calibration, "dim_out") or 0)
        if (
            dim
            and fit_rows < MIN_ROWS_PER_DIM * dim
            and (
                (stat is not None and stat > AUTO_THRESHOLD) or pooling in AUTO_CALIBRATES_POOLINGS
            )
        ):
            why = f"{fit_rows:,} rows are too few to calibrate {dim} dimensions"
        elif stat is not None:
            why = f"its vectors are already spread out, mean cosine {stat:.2f}"
        else:
            why = "its vectors are not anisotropic"
        return (
            f"searches the encoder's own space (auto: {why}); {kind} was {where} and kept "
            "for density"
        )
    return f"searches the encoder's own space; {kind} was {where} (calibration={name})"
