r"""The numbers behind the search page's pictures: what calibration did to the space.

Two pictures explain a calibrated index (``flowsearch serve``'s page draws them):

- the **spectrum**: how the vectors' squared length spreads over their principal directions,
  for the encoder's raw vectors (before calibration) and the searched vectors (after), each row
  first scaled to unit length (the cosine's geometry). An anisotropic space puts most of the
  length in a few directions (a "cone": every passage close to every other); a calibrated one
  spreads it evenly, every direction near ``1 / dim``. :func:`spectrum` gives the eigenvalues of
  the rows' second-moment matrix as shares of the total (they sum to 1), the mean cosine
  between rows, and the *effective dimension* ``exp(entropy of the shares)``;
- the **reference**: the corpus's own passages' best scores (:mod:`flowsearch.space.reference`),
  binned into a histogram with the cut below which a query is called unlike the corpus. A
  query's best score (its report's ``top_score``) is placed in it by the page.

:func:`space_pictures` computes both from a seeded sample of a version's live rows (at most
:data:`SAMPLE_ROWS`, taken in runs of neighbours so it reads a few dozen Parquet row groups
whatever the corpus size: :func:`sample_rows`) and keeps the answer with the opened version, so
the page's repeated visits cost nothing.

Example:
    >>> rng = np.random.default_rng(0)
    >>> cone = rng.normal(size=(500, 16)) + 4.0  # every row close to one direction
    >>> s = spectrum(cone)
    >>> round(s.shares[0], 2) > 0.9, round(s.mean_cosine, 2) > 0.9, s.effective_dim < 2
    (True, True, True)
    >>> round(spectrum(rng.normal(size=(500, 16))).effective_dim) > 12  # isotropic
    True
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict

from flowsearch.space import reference as space_reference

if TYPE_CHECKING:
    from flowsearch.search.version import Version
    from flowsearch.space.reference import Reference

__all__ = [
    "HISTOGRAM_BINS",
    "SAMPLE_ROWS",
    "SAMPLE_RUN",
    "ReferenceHistogram",
    "SpacePictures",
    "Spectrum",
    "reference_histogram",
    "sample_rows",
    "space_pictures",
    "spectrum",
]

#: Rows sampled for the spectra: enough that the top eigenvalues of a 384-d encoder are stable,
#: few enough that drawing the pictures does not wait on the read.
SAMPLE_ROWS = 1000
#: Neighbouring rows sampled together: a uniform sample of 1,000 rows of a large segment touches
#: about one Parquet row group (1,024 rows) per row, runs of 50 at most 2 per run (40 in all).
SAMPLE_RUN = 50
#: Bins of the reference's histogram.
HISTOGRAM_BINS = 24


class Spectrum(BaseModel):
    """How unit rows' squared length spreads over their principal directions.

    Attributes:
        shares: the second-moment matrix's eigenvalues, largest first, as shares of their sum
            (each in [0, 1], summing to 1; at most ``min(rows, dim)`` of them).
        mean_cosine: the mean cosine between two different rows (about 0 when spread out,
            near 1 in a cone).
        effective_dim: ``exp(entropy(shares))``: how many directions the rows really use
            (``dim`` when perfectly even, 1 when all on one line).
        dim: the vectors' dimension (an even spread puts ``1 / dim`` on every direction).
        n_rows: rows measured.
    """

    model_config = ConfigDict(frozen=True)
    shares: tuple[float, ...]
    mean_cosine: float
    effective_dim: float
    dim: int
    n_rows: int


class ReferenceHistogram(BaseModel):
    """The reference's best scores as a histogram (from its stored percentiles).

    Attributes:
        edges: ``bins + 1`` ascending score edges.
        shares: per bin, the percent of the measured passages whose best score falls in it.
        cut: the score below which a query is called unlike the corpus
            (``space.reference.OOD_PERCENTILE``), and ``cut_percentile`` that percentile.
        median: the passages' median best score.
        n_measured: passages measured; method: how (``held-out`` or ``leave-one-out``).
        words: what the reference is, in one line.
    """

    model_config = ConfigDict(frozen=True)
    edges: tuple[float, ...]
    shares: tuple[float, ...]
    cut: float
    cut_percentile: float
    median: float
    n_measured: int
    method: str
    words: str


class SpacePictures(BaseModel):
    """What the index page draws (see the module docstring); the JSON of ``GET /space``.

    Attributes:
        version: the index version measured.
        space: ``calibrated`` or ``encoder`` (what is searched).
        space_words: what the index searches and why (``auto``'s decision), in one line.
        raw: the spectrum of the encoder's raw vectors (before calibration); None when the
            index stores none.
        searched: the spectrum of the searched vectors (after calibration; the same space as
            ``raw`` when the index searches the encoder's own space).
        reference: the reference's histogram; None when the index records none.
        reference_reason: why there is no usable reference, in words (None when there is).
        n_sampled: live rows sampled for the spectra, of ``n_live``.
    """

    model_config = ConfigDict(frozen=True)
    version: int
    space: str
    space_words: str
    raw: Spectrum | None
    searched: Spectrum | None
    reference: ReferenceHistogram | None
    reference_reason: str | None = None
    n_sampled: int
    n_live: int

    def to_dict(self) -> dict[str, object]:
        """The JSON form (``GET /space``)."""
        return self.model_dump(mode="json")


def spectrum(vectors: np.ndarray) -> Spectrum:
    """The spectrum of ``vectors`` (float (n, dim), n >= 1), each row scaled to unit length
    (zero rows are dropped).

    Raises:
        ValueError: no non-zero finite row.
    """
    x = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1)
    keep = np.isfinite(norms) & (norms > 0)
    if not keep.any():
        raise ValueError("no non-zero finite row to measure")
    x = x[keep] / norms[keep, None]
    n, dim = x.shape
    # eigenvalues of X^T X / n through the smaller Gram side (n may be below dim)
    gram = x @ x.T if n < dim else x.T @ x
    values = np.linalg.eigvalsh(gram / n)[::-1]
    values = np.clip(values, 0.0, None)[: min(n, dim)]
    shares = values / values.sum()
    nonzero = shares[shares > 0]
    entropy = float(-(nonzero * np.log(nonzero)).sum())
    total = x.sum(axis=0)
    mean_cos = float((total @ total - n) / (n * (n - 1))) if n > 1 else 1.0
    return Spectrum(
        shares=tuple(round(float(s), 7) for s in shares),
        mean_cosine=round(mean_cos, 6),
        effective_dim=round(math.exp(entropy), 3),
        dim=int(dim),
        n_rows=int(n),
    )


def reference_histogram(
    reference: Reference | None, bins: int = HISTOGRAM_BINS
) -> ReferenceHistogram | None:
    """A :class:`~flowsearch.space.reference.Reference` as a histogram (None when it holds no
    scores). The share of each bin is read off the stored percentiles (interpolated), so it
    sums to 100."""
    if reference is None or not reference.measured:
        return None
    lo, hi = reference.score_at(0.0), reference.score_at(100.0)
    if hi <= lo:
        hi = lo + 1e-6
    edges = np.linspace(lo, hi, bins + 1)
    at = reference.percentiles(edges)
    at[0], at[-1] = 0.0, 100.0
    shares = np.clip(np.diff(at), 0.0, None)
    cut_p = space_reference.OOD_PERCENTILE
    return ReferenceHistogram(
        edges=tuple(round(float(e), 6) for e in edges),
        shares=tuple(round(float(s), 4) for s in shares),
        cut=round(reference.score_at(cut_p), 6),
        cut_percentile=cut_p,
        median=round(reference.score_at(50.0), 6),
        n_measured=reference.n_measured,
        method=reference.method,
        words=reference.to_words(),
    )


def sample_rows(live: np.ndarray, size: int, seed: int = 0, run: int = SAMPLE_RUN) -> np.ndarray:
    """At most ``size`` of the sorted rows ``live``, in runs of ``run`` neighbours starting at
    seeded random places (sorted, unique): a run shares its Parquet row groups, so the sample
    reads a few dozen row groups instead of one per row (:data:`SAMPLE_RUN`).

    Example:
        >>> rows = sample_rows(np.arange(10_000), 100, run=25)
        >>> len(rows), len(np.unique(rows // 1024)) <= 8
        (100, True)
    """
    live = np.asarray(live, dtype=np.int64)
    if len(live) <= size:
        return live
    run = max(1, min(run, size))
    starts = np.random.default_rng(seed).choice(len(live) - run + 1, -(-size // run), replace=False)
    picked = np.unique((starts[:, None] + np.arange(run)[None, :]).ravel())
    return live[picked[:size]] if len(picked) >= size else live[picked]


def _sample(version: Version, size: int) -> tuple[list[np.ndarray | None], int]:
    """A seeded sample of live global rows, split per segment (local rows), and its size."""
    live = []
    for i, dead in enumerate(version.deleted):
        rows = np.arange(version.offsets[i], version.offsets[i + 1], dtype=np.int64)
        live.append(rows if dead is None else rows[~dead])
    every = np.concatenate(live) if live else np.zeros(0, np.int64)
    every = sample_rows(every, size, seed=version.manifest.version)
    return version.split(every), int(len(every))


def _measure(version: Version, size: int) -> SpacePictures:
    from flowsearch.space.reports import describe_space

    m = version.manifest
    per_segment, n = _sample(version, size)
    raw_parts, searched_parts = [], []
    raw_missing = False
    for seg, local in zip(version.segments, per_segment, strict=True):
        if local is None or not len(local):
            continue
        searched_parts.append(seg.vectors(local))
        raw_missing = raw_missing or "raw" not in seg.reader.schema.names
        if not raw_missing:
            raw_parts.append(seg.reader.vectors_at(local, "raw"))
    searched = spectrum(np.concatenate(searched_parts)) if searched_parts else None
    raw = None
    if raw_parts and not raw_missing:
        raw = spectrum(np.concatenate(raw_parts))
    from flowsearch.space.reference import why_unusable

    reference = version.reference()
    return SpacePictures(
        version=m.version,
        space=m.calibration.space,
        space_words=describe_space(m.calibration, m.encoder.pooling),
        raw=raw,
        searched=searched,
        reference=reference_histogram(reference),
        reference_reason=why_unusable(reference),
        n_sampled=n,
        n_live=int(m.n_live),
    )


def space_pictures(version: Version, sample: int = SAMPLE_ROWS) -> SpacePictures:
    """The pictures' numbers for an opened :class:`~flowsearch.search.version.Version` (a
    searcher's ``.version``), from at most ``sample`` of its live rows; computed once per
    opened version and kept with it.

    Example:
        >>> space_pictures(Searcher.open("idx").version).searched.effective_dim  # doctest: +SKIP
        301.4
    """
    held = version.pictures.get(int(sample))
    if not isinstance(held, SpacePictures):  # two threads may both measure: either is kept
        held = version.pictures.setdefault(int(sample), _measure(version, sample))
    assert isinstance(held, SpacePictures)
    return held
