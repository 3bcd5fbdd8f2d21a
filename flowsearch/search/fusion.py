r"""Hybrid search: fuse the dense and lexical candidates of each query into one ranking.

Each side gives its top candidates as ``(scores float32 (q, k_side), rows int64 (q, k_side))``,
row -1 for padding (what :func:`flowsearch.ann.faiss_index.search` and
:meth:`flowsearch.lexical.bm25.Bm25.search` return). Only candidates are fused: a row that
neither side returned is never a hit.

- :func:`convex` (the default): min-max normalise each side's scores per query, then
  ``weight * dense + (1 - weight) * lexical``. Bruch et al. (2022) found a convex combination of
  normalised scores more robust than rank fusion and cheap to tune (one weight).
- :func:`rrf`: reciprocal-rank fusion (Cormack et al., 2009), which ignores score values.

Every result keeps both sides' raw scores, so a hit can report ``dense_score`` and
``lexical_score`` (NaN for the side that did not return it).

References:
    Bruch, Gai & Ingber, "An Analysis of Fusion Functions for Hybrid Retrieval", ACM TOIS 2023
    (arXiv:2210.11934, 2022).
    Cormack, Clarke & Buettcher, "Reciprocal Rank Fusion outperforms Condorcet and Individual
    Rank Learning Methods", SIGIR 2009.

Example:
    >>> dense = (np.array([[0.9, 0.5]], np.float32), np.array([[4, 7]]))
    >>> lexical = (np.array([[12.0, 3.0]], np.float32), np.array([[7, 2]]))
    >>> convex(dense, lexical, k=3, weight=0.3).rows.tolist()  # 7: 0.7, 4: 0.3, 2: 0
    [[7, 4, 2]]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["FusedHits", "Hits", "convex", "rrf"]

LOG = logging.getLogger(__name__)

#: One side's candidates: ``(scores float (q, k_side), rows int (q, k_side))``, row -1 = none.
Hits = tuple[np.ndarray, np.ndarray]
# (each side's value per union row, NaN = absent) -> (fused scores, tie-break keys, larger first)
Fuser = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, tuple[np.ndarray, ...]]]


@dataclass(frozen=True)
class FusedHits:
    """Fused top-k of q queries; every array is (q, k), padded past the last hit.

    Attributes:
        rows: int64, the fused ranking, best first; -1 for padding.
        scores: float32, the fused score; -inf for padding.
        dense_scores: float32, the dense side's raw score of the row; NaN when the dense side
            did not return it (and for padding).
        lexical_scores: float32, the same for the lexical side.
    """

    rows: np.ndarray
    scores: np.ndarray
    dense_scores: np.ndarray
    lexical_scores: np.ndarray


def convex(dense: Hits, lexical: Hits, k: int, weight: float) -> FusedHits:
    r"""Convex combination of per-query min-max normalised scores (Bruch et al., 2022).

    Each side's scores are mapped to [0, 1] over that side's candidates for the query,
    ``(s - min) / (max - min)``: cosine and BM25 live on unrelated scales (BM25 is unbounded and
    grows with query length), so raw scores cannot be added, and the per-query range makes one
    weight mean the same for short and long queries. A candidate missing from a side gets that
    side's 0, like its worst candidate. A side whose candidates all score the same (one
    candidate, or ties) gives them all 1: they are that side's best. A side without candidates
    contributes 0 to every row.

    Equal fused scores are ordered by the heavier side's normalised score (a row it did not
    return counts as below 0), then the other side's, then the lower row, so ``weight=1``
    reproduces the dense order with lexical-only rows after it, and ``weight=0`` the lexical
    order.

    Args:
        dense: the dense candidates, ``(scores (q, kd), rows (q, kd))``.
        lexical: the lexical candidates, ``(scores (q, kl), rows (q, kl))``.
        k: hits per query (>= 1).
        weight: the dense side's weight, in [0, 1].

    Returns:
        :class:`FusedHits` of shape (q, k).
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight}")

    def fuse(d: np.ndarray, lx: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        nd, nl = _min_max(d), _min_max(lx)
        fused = weight * np.nan_to_num(nd) + (1 - weight) * np.nan_to_num(nl)
        heavy, light = (nd, nl) if weight >= 0.5 else (nl, nd)
        return fused, (np.nan_to_num(heavy, nan=-1.0), np.nan_to_num(light, nan=-1.0))

    return _fuse(dense, lexical, k, fuse)


def rrf(dense: Hits, lexical: Hits, k: int, k_rrf: float = 60.0) -> FusedHits:
    r"""Reciprocal-rank fusion (Cormack et al., 2009): ``sum over sides of 1 / (k_rrf + rank)``.

    ``rank`` is 1-based in the side's own order; a side that did not return a row adds nothing.
    Equal fused scores go to the row with the better best rank, then the lower row.

    Args:
        dense: the dense candidates, ``(scores (q, kd), rows (q, kd))``, best first.
        lexical: the lexical candidates, ``(scores (q, kl), rows (q, kl))``, best first.
        k: hits per query (>= 1).
        k_rrf: the damping constant (> 0); 60 as in the paper.

    Returns:
        :class:`FusedHits` of shape (q, k); ``scores`` are the RRF sums.
    """
    if not k_rrf > 0:
        raise ValueError(f"k_rrf must be > 0, got {k_rrf}")

    def fuse(rd: np.ndarray, rl: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        fused = np.nan_to_num(1.0 / (k_rrf + rd)) + np.nan_to_num(1.0 / (k_rrf + rl))
        return fused, (-np.fmin(rd, rl),)

    return _fuse(dense, lexical, k, fuse, by_rank=True)


def _min_max(scores: np.ndarray) -> np.ndarray:
    """float64 scores in [0, 1] over the non-NaN entries; NaN stays NaN; a flat side is all 1."""
    present = ~np.isnan(scores)
    if not present.any():
        return scores
    low, high = scores[present].min(), scores[present].max()
    if high == low:
        return np.where(present, 1.0, np.nan)
    return (scores - low) / (high - low)


def _fuse(dense: Hits, lexical: Hits, k: int, fuse: Fuser, by_rank: bool = False) -> FusedHits:
    """Per query: the union of both sides' candidates, scored by ``fuse``, top ``k``.

    ``fuse(d, l)`` gets, for the union's rows (ascending), each side's raw score (or, with
    ``by_rank``, its 1-based rank in the side's order), NaN where the side did not return the
    row, and returns the fused scores and tie-break keys (larger first); the lower row breaks
    the remaining ties.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    d_scores, d_rows = _side(dense, "dense")
    l_scores, l_rows = _side(lexical, "lexical")
    if len(d_rows) != len(l_rows):
        raise ValueError(f"dense has {len(d_rows)} queries, lexical {len(l_rows)}")
    q = len(d_rows)
    out = FusedHits(
        rows=np.full((q, k), -1, np.int64),
        scores=np.full((q, k), -np.inf, np.float32),
        dense_scores=np.full((q, k), np.nan, np.float32),
        lexical_scores=np.full((q, k), np.nan, np.float32),
    )
    for i in range(q):
        d = _candidates(d_scores[i], d_rows[i])
        lx = _candidates(l_scores[i], l_rows[i])
        union = np.union1d(d[0], lx[0])
        if not len(union):
            continue
        raw_d, raw_l = _align(union, d), _align(union, lx)
        if by_rank:
            fused, keys = fuse(_align(union, d, rank=True), _align(union, lx, rank=True))
        else:
            fused, keys = fuse(raw_d, raw_l)
        fused32 = fused.astype(np.float32)  # rank on the scores the caller sees
        order = np.lexsort((union, *(-key for key in reversed(keys)), -fused32))[:k]
        n = len(order)
        out.rows[i, :n] = union[order]
        out.scores[i, :n] = fused32[order]
        out.dense_scores[i, :n] = raw_d[order]
        out.lexical_scores[i, :n] = raw_l[order]
    return out


def _side(hits: Hits, name: str) -> tuple[np.ndarray, np.ndarray]:
    scores, rows = (np.asarray(a) for a in hits)
    if scores.ndim != 2 or scores.shape != rows.shape:
        raise ValueError(
            f"{name} hits must be (scores, rows) of one 2-D shape, got {scores.shape} and "
            f"{rows.shape}"
        )
    return scores.astype(np.float64), rows.astype(np.int64)


def _candidates(scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query's candidates of one side: (rows ascending, raw scores, 1-based ranks).

    Padding (row -1) is dropped; a row listed twice keeps its first (best) place.
    """
    valid = np.flatnonzero(rows >= 0)
    found, first = np.unique(rows[valid], return_index=True)
    place = valid[first]  # position in the side's own order
    rank = np.empty(len(place), np.float64)
    rank[np.argsort(place, kind="stable")] = np.arange(1, len(place) + 1)
    return found, scores[place], rank


def _align(
    union: np.ndarray, side: tuple[np.ndarray, np.ndarray, np.ndarray], rank: bool = False
) -> np.ndarray:
    """float64 (len(union),): the side's score (or rank) of each union row, NaN when absent."""
    found, scores, ranks = side
    out = np.full(len(union), math.nan)
    out[np.searchsorted(union, found)] = ranks if rank else scores
    return out
