r"""The reference: how close the corpus's own passages sit to each other, in the searched space.

A query, or a row added later, is judged by one figure: its *best score*, the cosine to its
nearest row of the index in the searched space. Alone that figure means little (0.4 is close
for one encoder, far for another); placed among the same figure for the corpus's own rows it
reads as a percentile: "less like the corpus than 97% of its own passages". The
:class:`Reference` keeps that distribution: the best score of each measured row to *another*
row (:func:`best_other_score`), at the percentiles 0, 1, ..., 100 (about 1 KB of JSON, stored in
the manifest).

Which rows are measured (:func:`reference_rows`): the rows the build held out of the
calibrator's fit (:func:`split_fit_rows`) when there are enough of them, as new rows are unseen
by the calibrator too; otherwise, on a small corpus that holds none out, a sample of all rows,
each against the others (*leave-one-out*); the study ``drift`` compares the two on the dev
sets. Why the best score and not the flow's log-density: the study ``density`` found the
log-density mostly measures text length, so short in-domain questions sat far below passages,
while the best score separated in-domain from foreign queries far better (benchmarks/RESULTS.md,
"Figures behind the defaults"). The log-density is still carried as a raw figure
(:attr:`Reference.log_density_median`), never judged.

How the figures become verdicts and words: :mod:`flowsearch.space.reports` (queries) and
:mod:`flowsearch.space.drift` (new rows).

Example:
    >>> ref = Reference.from_scores(np.linspace(0.2, 0.6, 201), method="leave-one-out",
    ...                             n_corpus=201)
    >>> round(ref.percentile(0.5), 1), ref.score_at(5.0)
    (75.0, 0.22)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from flowsearch.errors import IndexDamaged
from flowsearch.storage.records import ReferenceMethod, ReferenceRecord

if TYPE_CHECKING:
    from flowsearch.storage.manifest import DensityStats

__all__ = [
    "MIN_ROWS_PER_DIM",
    "PERCENTS",
    "Method",
    "Reference",
    "best_other_score",
    "density_stats",
    "percentile_of",
    "reference_of",
    "reference_rows",
    "reliable",
    "share_words",
    "split_fit_rows",
    "why_unusable",
]

#: ``auto`` searches a calibrated space only with at least this many rows per dimension, and
#: log-densities are shown only then: below about 3 rows per dimension a calibrator overfits and
#: costs more than the anisotropy does (benchmarks/RESULTS.md, "Figures behind the defaults").
MIN_ROWS_PER_DIM = 3

#: The percentiles a :class:`Reference` stores (every whole percent: the words say "97%").
PERCENTS: tuple[float, ...] = tuple(float(p) for p in range(101))

#: How a reference's rows were measured: held out of the calibrator's fit, or leave-one-out.
Method = ReferenceMethod

#: Share of the corpus the build keeps out of the calibrator's fit: the rows the reference is
#: measured on when there are enough of them, unseen by the calibrator as new rows are.
HELD_OUT_SHARE = 0.10
#: At most this many rows are held out: enough for a 1st percentile, and cheap to score.
HELD_OUT_MAX = 2000
#: Fewer held-out rows than this are none: a small corpus keeps every row for the fit and
#: measures its reference leave-one-out instead.
HELD_OUT_MIN = 50
#: A reference needs at least this many measured rows: fewer say nothing about what is usual.
REFERENCE_MIN_ROWS = 50
#: A leave-one-out reference measures at most this many rows (a seeded sample); the reference
#: sample keeps at most this many probes.
REFERENCE_MAX_ROWS = 2000
#: A query whose best score is below this percentile of the reference is out of distribution:
#: a cut that flags few in-domain questions and most foreign ones (benchmarks/RESULTS.md).
OOD_PERCENTILE = 5.0


def reliable(fit_rows: int, dim: int) -> bool:
    """True when a calibrator fitted on ``fit_rows`` rows of dimension ``dim`` can be trusted
    (its log-densities are worth showing)."""
    return fit_rows >= MIN_ROWS_PER_DIM * dim


def split_fit_rows(n: int, fit_sample: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Which rows fit the calibrator and which are held out (int64, sorted).

    :data:`HELD_OUT_SHARE` of the rows (at most :data:`HELD_OUT_MAX`; none when that is fewer
    than :data:`HELD_OUT_MIN`) are held out; at most ``fit_sample`` of the others, a seeded uniform
    sample, fit. A corpus larger than ``fit_sample`` holds out rows outside the sample, so its
    fit set does not shrink.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    held = min(int(round(n * HELD_OUT_SHARE)), HELD_OUT_MAX)
    if held < HELD_OUT_MIN:
        held = 0
    fit = order[held : held + fit_sample] if n - held > fit_sample else order[held:]
    return np.sort(fit).astype(np.int64), np.sort(order[:held]).astype(np.int64)


def reference_rows(n_rows: int, held_out: np.ndarray, seed: int = 0) -> tuple[np.ndarray, Method]:
    """The rows whose best score to another row makes the reference, and how they were chosen.

    Args:
        n_rows: rows in the index.
        held_out: int (m,), the rows held out of the calibrator's fit (:func:`split_fit_rows`).
        seed: for the leave-one-out sample.

    Returns:
        ``(rows, method)``: the held-out rows (``"held-out"``) when there are at least
        :data:`REFERENCE_MIN_ROWS` of them; otherwise a seeded sample of at most
        :data:`REFERENCE_MAX_ROWS` of all rows (``"leave-one-out"``; every row of a small
        corpus). int64, sorted. Empty below two rows (a row has no other to be near).
    """
    held_out = np.asarray(held_out, dtype=np.int64)
    if len(held_out) >= REFERENCE_MIN_ROWS:
        return np.sort(held_out), "held-out"
    if n_rows < 2:
        return np.zeros(0, np.int64), "leave-one-out"
    take = min(n_rows, REFERENCE_MAX_ROWS)
    rows = np.random.default_rng(seed).choice(n_rows, take, replace=False)
    return np.sort(rows).astype(np.int64), "leave-one-out"


def best_other_score(
    scores: np.ndarray, rows: np.ndarray, own: np.ndarray, documents: np.ndarray | None = None
) -> np.ndarray:
    """Each searched row's best score to another row (of another document, with
    ``documents``: a passage's neighbours in its own document overlap it).

    Args:
        scores: float (m, k), a search's scores for rows ``own`` (k >= 2, best first).
        rows: int (m, k), the rows found (-1 for none).
        own: int (m,), the row each search started from.
        documents: int (n_rows,), each row's document (any label), or None: every row its own.

    Returns:
        float64 (m,): the first score whose row is not the row itself (nor of its document);
        NaN when none was found.
    """
    other = (rows >= 0) & (rows != own[:, None])
    if documents is not None:
        found = documents[np.where(rows >= 0, rows, 0)]
        other &= found != documents[own][:, None]
    first = np.argmax(other, axis=1)
    out = np.take_along_axis(np.asarray(scores, np.float64), first[:, None], 1)[:, 0]
    return np.where(other.any(axis=1), out, np.nan)


def density_stats(lp: np.ndarray) -> DensityStats:
    """The manifest's ``DensityStats`` of per-row log-densities (float (n,)): mean, std,
    1st/5th percentile, median (raw figures for ``info --json``; never judged)."""
    from flowsearch.storage.manifest import DensityStats

    lp = np.asarray(lp, dtype=np.float64)
    q = np.percentile(lp, [1, 5, 50])
    return DensityStats(
        mean_log_prob=float(lp.mean()),
        std_log_prob=float(lp.std()),
        p01=float(q[0]),
        p05=float(q[1]),
        median=float(q[2]),
        n_rows=int(lp.size),
    )


def percentile_of(values: np.ndarray, percents: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Where each value falls in a distribution given by its quantiles, in percent (0-100).

    ``scores`` (ascending) are the distribution's values at ``percents`` (ascending). Between
    two quantiles the percentile is interpolated; a value equal to a run of tied quantiles gets
    the middle of the run (so a tie is neither above nor below); below the first quantile it is
    the first percent, above the last the last. NaN stays NaN.

    Example:
        >>> percentile_of(np.array([0.25, 0.5, 2.0]), np.array([0.0, 50.0, 100.0]),
        ...               np.array([0.0, 0.5, 1.0])).tolist()
        [25.0, 50.0, 100.0]
    """
    x = np.asarray(values, dtype=np.float64)
    p = np.asarray(percents, dtype=np.float64)
    q = np.asarray(scores, dtype=np.float64)
    left = np.searchsorted(q, x, side="left")
    right = np.searchsorted(q, x, side="right")
    tied = right > left
    out = np.empty(x.shape, np.float64)
    # a value on a run of equal quantiles: the middle of the run
    out[tied] = (p[left[tied]] + p[right[tied] - 1]) / 2
    free = ~tied
    hi = np.clip(left[free], 1, len(q) - 1)
    lo = hi - 1
    span = q[hi] - q[lo]
    frac = np.where(span > 0, (x[free] - q[lo]) / np.where(span > 0, span, 1.0), 0.5)
    out[free] = p[lo] + np.clip(frac, 0.0, 1.0) * (p[hi] - p[lo])
    out[np.isnan(x)] = np.nan
    return out


class Reference(ReferenceRecord):
    """The corpus's own rows' best scores to another row: what queries and new rows are judged
    against (see the module docstring). Small and JSON-able: the manifest stores it (its fields
    are :class:`~flowsearch.storage.records.ReferenceRecord`'s; ``space`` is None and
    ``sample`` absent in records of releases before them).
    """

    @classmethod
    def from_scores(
        cls,
        best_scores: np.ndarray,
        *,
        method: Method,
        n_corpus: int,
        space: str | None = None,
        mean_cosine: float | None = None,
        log_densities: np.ndarray | None = None,
    ) -> Reference:
        """The reference of measured rows.

        Args:
            best_scores: float (m,), each measured row's best score to another row of the
                index (:func:`best_other_score`); NaN entries (no other row found) are dropped.
            method: how the rows were chosen (:func:`reference_rows`).
            n_corpus: rows in the index.
            space: the searched space (the calibration record's ``space``).
            mean_cosine: the calibration record's ``anisotropy["mean_cosine"]`` when the index
                searches the encoder's own space, else None.
            log_densities: float (m,), the measured rows' log-densities, or None (pass None
                when the calibrator is not :func:`reliable`).
        """
        top = np.asarray(best_scores, np.float64)
        top = top[np.isfinite(top)]
        values: tuple[float, ...] = ()
        if len(top):
            values = tuple(round(float(v), 6) for v in np.percentile(top, PERCENTS))
        median = None
        if log_densities is not None and len(log_densities):
            lp = np.asarray(log_densities, np.float64)
            if np.isfinite(lp).all():
                median = float(np.median(lp))
        return cls(
            method=method,
            n_measured=int(len(top)),
            n_corpus=int(n_corpus),
            space=space,
            percents=PERCENTS if values else (),
            scores=values,
            mean_cosine=None if mean_cosine is None else float(mean_cosine),
            log_density_median=median,
            sample=None,
        )

    @property
    def measured(self) -> bool:
        """True when it holds scores to place a value among."""
        return bool(self.scores) and len(self.scores) == len(self.percents)

    def percentile(self, score: float) -> float:
        """Where ``score`` falls among the measured rows' best scores, in percent (0-100; NaN
        for NaN)."""
        return float(self.percentiles(np.array([score]))[0])

    def percentiles(self, scores: np.ndarray) -> np.ndarray:
        """:meth:`percentile` of each score (float64, same shape)."""
        return percentile_of(scores, np.array(self.percents), np.array(self.scores))

    def score_at(self, percent: float) -> float:
        """The measured rows' best score at ``percent`` (interpolated between stored ones)."""
        return float(np.interp(percent, self.percents, self.scores))

    def to_words(self) -> str:
        """One line for ``info``: what queries and new rows are judged against."""
        if not self.measured:
            return "no reference: queries and new rows are not judged"
        how = "held out of the calibrator's fit" if self.method == "held-out" else "leave-one-out"
        words = (
            f"{self.n_measured:,} of the corpus's own passages, each scored against its closest "
            f"other passage ({how}); a query less like the corpus than "
            f"{100 - OOD_PERCENTILE:g}% of them is flagged"
        )
        rows = self.sample.rows if self.sample is not None else None
        if rows is not None:
            words += f"; new rows are judged against a sample of {rows:,} of its rows"
        return words


def why_unusable(reference: Reference | None) -> str | None:
    """Why ``reference`` cannot judge a query or new rows, in words; None when it can."""
    if reference is None or not reference.measured:
        return "the index records no reference to judge against; rebuilding it measures one"
    if reference.n_measured < REFERENCE_MIN_ROWS:
        return (
            f"the index holds {reference.n_corpus} rows, too few to know what is usual "
            f"for it ({REFERENCE_MIN_ROWS} needed)"
        )
    return None


def share_words(percent: float) -> str:
    """A share of the corpus's passages in words: "97%", "99.7%", "all", "none" (never rounded
    up to "all" or down to "none").

    Example:
        >>> [share_words(p) for p in (96.6, 99.97, 100.0, 0.4, 0.0)]
        ['97%', '99.9%', 'all', '0.4%', 'none']
    """
    if percent >= 100:
        return "all"
    if percent <= 0:
        return "none"
    if percent > 99 or percent < 1:
        return f"{max(math.floor(percent * 10) / 10, 0.1):.1f}%"
    return f"{percent:.0f}%"


def _get(record: Any, name: str, default: Any = None) -> Any:
    """A field of a record that may be a model, a dataclass or a plain mapping."""
    if isinstance(record, Mapping):
        return record.get(name, default)
    return getattr(record, name, default)


def reference_of(manifest: object) -> Reference | None:
    """The reference an index's manifest records, or None.

    This release's indexes store it as ``manifest.reference`` (a
    :class:`~flowsearch.storage.records.ReferenceRecord`, a :class:`Reference`, or its JSON
    form). Indexes built by the previous release have a ``held_out`` record instead (the
    best scores of the held-out rows at nine percentiles, and their log-density statistics):
    it is read as a ``held-out`` reference, so those indexes keep their verdict. A ``held_out``
    record without scores (a corpus under 500 rows) gives None.

    Raises:
        IndexDamaged: a stored reference that is not one (a hand-edited manifest).
    """
    stored = _get(manifest, "reference")
    if isinstance(stored, Reference):
        return stored
    if isinstance(stored, ReferenceRecord):  # the manifest's record, checked: the same fields
        return Reference.model_validate(stored, from_attributes=True)
    if stored:
        try:
            return Reference.model_validate(dict(stored))
        except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            raise IndexDamaged(
                f"the manifest's reference is malformed ({type(exc).__name__})", "rebuild the index"
            ) from None
    held = _get(manifest, "held_out")
    if not held or not _get(held, "top_score"):
        return None
    calibration = _get(manifest, "calibration")
    space = _get(calibration, "space")
    mean_cosine = None
    if space == "encoder":
        mean_cosine = (_get(calibration, "anisotropy") or {}).get("mean_cosine")
    density = _get(held, "density")
    median = _get(density, "median") if density else None
    fit_rows, dim = _get(calibration, "fit_rows", 0), _get(manifest, "dim", 0)
    if median is not None and (not math.isfinite(median) or not reliable(fit_rows, dim)):
        median = None
    rows = _get(manifest, "rows")
    return Reference(
        method="held-out",
        n_measured=int(_get(held, "n_rows", 0) or _get(held, "rows", 0) or 0),
        n_corpus=int(rows if rows is not None else _get(manifest, "n_rows", 0)),
        space=space,
        percents=tuple(float(p) for p in _get(held, "percents")),
        scores=tuple(float(v) for v in _get(held, "top_score")),
        mean_cosine=None if mean_cosine is None else float(mean_cosine),
        log_density_median=median,
    )
