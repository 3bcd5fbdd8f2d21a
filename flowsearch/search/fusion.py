r"""Hybrid search: fuse the dense and lexical candidates of each query into one ranking.

:func:`fuse` (the default) scores every candidate either side returned by
``weight * normalise_dense(cosine) + (1 - weight) * normalise_lexical(BM25)``
(:mod:`flowsearch.search.scores`: the cosine above the corpus's background similarity, and
BM25 as a share of the query's upper bound, stretched so that a row holding every query term
once scores 0.7; both in [0, 1]). Given each side's score of the
other side's candidates ("complete" scores), a hit's score depends only on its own cosine, its
own BM25, the query's upper bound and the index's reference: it is comparable across queries,
does not move when other rows join the candidates, and a nonsense query scores low instead of
the 1.0 a per-query min-max gives its best row. The study ``fusion`` compares it
with the published rules (per-query min-max, reciprocal-rank fusion) on the dev sets
(benchmarks/RESULTS.md, "Hybrid fusion").

Each side's candidates are ``(scores float (q, k_side), rows int (q, k_side))``, row -1 for
padding (what :func:`flowsearch.ann.io.search` and
:meth:`flowsearch.lexical.bm25.Bm25.search` return).

References:
    Bruch, Gai & Ingber, "An Analysis of Fusion Functions for Hybrid Retrieval", ACM TOIS 2023
    (arXiv:2210.11934): a convex combination of normalised scores beats RRF, normalised with
    theoretical bounds where they exist, and scored on both sides for every candidate.

Example:
    >>> from flowsearch.search.scores import FusionReference
    >>> ref = FusionReference(n_measured=0, n_rows=1000, dense_background=0.2)
    >>> dense = (np.array([[0.9, 0.6]]), np.array([[4, 7]]))        # cosines
    >>> lexical = (np.array([[6.0, 2.0]]), np.array([[7, 2]]))      # BM25
    >>> out = fuse(dense, lexical, ref, k=3, upper=np.array([10.0]), weight=0.5,
    ...            dense_of_lexical=np.array([[0.6, 0.1]]),      # cosines of rows 7, 2
    ...            lexical_of_dense=np.array([[0.0, 6.0]]),      # BM25 of rows 4, 7
    ...            lexical_match=None)                            # lexical: BM25 / upper
    >>> out.rows.tolist(), out.scores.round(4).tolist()
    ([[7, 4, 2]], [[0.55, 0.4375, 0.1]])
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from flowsearch.errors import BadInput
from flowsearch.search.scores import (
    LEXICAL_MATCH,
    FusionReference,
    normalise_dense,
    normalise_lexical,
)

__all__ = [
    "DENSE_WEIGHT",
    "DENSE_WEIGHT_STATIC",
    "LENGTH_SLOPE",
    "LENGTH_SLOPE_STATIC",
    "FusedHits",
    "Hits",
    "Kind",
    "default_weight",
    "fuse",
]

LOG = logging.getLogger(__name__)

#: One side's candidates: ``(scores float (q, k_side), rows int (q, k_side))``, row -1 = none.
Hits = tuple[np.ndarray, np.ndarray]
#: The encoder's kind, which picks the default dense weight: a transformer pooling, or a static
#: table lookup (``static`` pooling, Model2Vec included).
Kind = Literal["transformer", "static"]

#: The dense side's weight for a transformer pooling: the best mean nDCG@10 over the dev sets
#: for the bundled ``mean`` (benchmarks/RESULTS.md, "Query-dependent fusion").
DENSE_WEIGHT = 0.65
#: The dense weight for a static pooling (a table lookup), whose dense side trails BM25 on
#: question -> passage search.
DENSE_WEIGHT_STATIC = 0.3
#: How fast the default weight falls with an index's passages per document p: weight - slope x
#: ln p, chosen on long documents cut into passages (benchmarks/RESULTS.md, "Coherent long
#: documents"); an index of short texts (p = 1) keeps the weight.
LENGTH_SLOPE = 0.1
#: The same for a static pooling: 0, as it was not measured on long documents.
LENGTH_SLOPE_STATIC = 0.0


@dataclass(frozen=True)
class FusedHits:
    """Fused top-k of q queries; every array is (q, k), padded past the last hit.

    Attributes:
        rows: int64, the fused ranking, best first; -1 for padding.
        scores: float64, the fused score; -inf for padding.
        dense_scores: float32, the dense side's raw score (cosine) of the row; NaN when the
            dense side did not score it (and for padding).
        lexical_scores: float32, the same for the lexical side (BM25).
    """

    rows: np.ndarray
    scores: np.ndarray
    dense_scores: np.ndarray
    lexical_scores: np.ndarray


def fuse(
    dense: Hits,
    lexical: Hits,
    reference: FusionReference | None,
    k: int,
    *,
    upper: np.ndarray,
    kind: Kind = "transformer",
    weight: float | None = None,
    passages_per_document: float = 1.0,
    dense_of_lexical: np.ndarray | None = None,
    lexical_of_dense: np.ndarray | None = None,
    lexical_match: float | None = LEXICAL_MATCH,
) -> FusedHits:
    r"""Hybrid top-``k``: ``weight * normalise_dense + (1 - weight) * normalise_lexical``.

    Every row either side returned is a candidate. Give each side's score of the other side's
    candidates (``dense_of_lexical``, ``lexical_of_dense``: "complete" scores) and a hit's
    score depends only on its own cosine, BM25, the query's upper bound and the reference, so
    it does not move when other rows join or leave either side's candidates; a row sharing no
    term with the query has BM25 0, which is a score, not a missing one. Without them a side's
    missing score counts as 0 (its floor), so a row's score depends on whether the other side
    happened to return it: no longer a property of the hit, and lower nDCG@10 on the dev sets
    for the bundled ``mean`` (benchmarks/RESULTS.md, "Hybrid fusion").

    The fused score is in [0, 1] and non-decreasing in each side's raw score (strictly above
    the side's floor: the dense background, BM25 0). Equal scores go to the higher cosine,
    then the lower row.

    Args:
        dense: the dense candidates, ``(cosines (q, kd), rows (q, kd))``.
        lexical: the lexical candidates, ``(BM25 (q, kl), rows (q, kl))``.
        reference: the index's :class:`~flowsearch.search.scores.FusionReference` (None: a
            background of 0, see :func:`~flowsearch.search.scores.normalise_dense`).
        k: hits per query (>= 1).
        upper: float (q,): each query's BM25 upper bound (see
            :func:`~flowsearch.search.scores.normalise_lexical`).
        kind: picks the default weight: :data:`DENSE_WEIGHT` for a transformer pooling,
            :data:`DENSE_WEIGHT_STATIC` for a static one.
        weight: the dense side's weight in [0, 1], instead of the default.
        passages_per_document: the index's live rows per live document (>= 1); the default
            weight falls with it (:func:`default_weight`). 1 (every document one passage, as
            in an index of short texts): the weight as it stands.
        dense_of_lexical: float (q, kl): the cosine of each lexical candidate (the query's
            searched vector dotted with the row's stored vector); NaN where unknown.
        lexical_of_dense: float (q, kd): the BM25 of each dense candidate for the query (0
            when it holds no query term); NaN where unknown.
        lexical_match: the lexical score of a row holding every query term once at average
            length (see :func:`~flowsearch.search.scores.normalise_lexical`); None: the BM25
            share itself (the third release's rule).

    Returns:
        :class:`FusedHits` of shape (q, k).
    """
    if weight is None:
        weight = default_weight(kind, passages_per_document)
    if not 0.0 <= weight <= 1.0:
        raise BadInput(f"weight must be in [0, 1], got {weight}", param="weight")
    own_dense, own_lexical = dense, lexical
    if dense_of_lexical is not None:
        dense = _extended(own_dense, own_lexical[1], dense_of_lexical, "dense_of_lexical")
    if lexical_of_dense is not None:
        lexical = _extended(own_lexical, own_dense[1], lexical_of_dense, "lexical_of_dense")
    bounds = np.asarray(upper, np.float64).reshape(-1)
    if len(bounds) != len(dense[1]):
        raise BadInput(f"upper has {len(bounds)} entries for {len(dense[1])} queries",
                       "pass one BM25 upper bound per query", param="upper")  # fmt: skip

    def rule(d: np.ndarray, lx: np.ndarray, i: int) -> np.ndarray:
        nd = np.nan_to_num(normalise_dense(d, reference))
        nl = np.nan_to_num(normalise_lexical(lx[None, :], bounds[i : i + 1], lexical_match)[0])
        fused: np.ndarray = weight * nd + (1.0 - weight) * nl
        return fused

    return _fuse(dense, lexical, k, rule)


def default_weight(kind: str, passages_per_document: float = 1.0) -> float:
    """The default dense weight: :data:`DENSE_WEIGHT` (a transformer pooling) or
    :data:`DENSE_WEIGHT_STATIC`, less ``slope x ln(passages_per_document)``
    (:data:`LENGTH_SLOPE`, per kind), clipped to [0, 1]. A passage of a long
    document holds several facts and its vector their average, while BM25 still finds the
    one sentence's terms: on documents of one topic cut into passages the dense side needs
    less weight (benchmarks/RESULTS.md, "Query-dependent fusion ... passage combination")."""
    if kind == "transformer":
        base, slope = DENSE_WEIGHT, LENGTH_SLOPE
    elif kind == "static":
        base, slope = DENSE_WEIGHT_STATIC, LENGTH_SLOPE_STATIC
    else:
        raise BadInput(
            f"unknown encoder kind {kind!r}; use 'transformer' or 'static'", param="kind"
        )
    if not (math.isfinite(passages_per_document) and passages_per_document >= 1.0):
        raise BadInput(f"passages_per_document must be a number >= 1, got "
                       f"{passages_per_document!r}", param="passages_per_document")  # fmt: skip
    return float(min(max(base - slope * math.log(passages_per_document), 0.0), 1.0))


def _extended(side: Hits, rows: np.ndarray, scores: np.ndarray, name: str) -> Hits:
    """``side`` followed by the other side's ``rows`` with ``scores`` (this side's score of
    them): a row already in ``side`` keeps its own (first) entry."""
    own_s, own_r = _side(side, "side")
    scores = np.asarray(scores, np.float64)
    if scores.shape != np.shape(rows):
        raise BadInput(f"{name} has shape {scores.shape}, its rows {np.shape(rows)}",
                       "give one score per candidate of the other side", param=name)  # fmt: skip
    return np.concatenate([own_s, scores], 1), np.concatenate([own_r, np.asarray(rows)], 1)


# (each side's raw score per union row, NaN = absent; the query) -> the fused scores
Rule = Callable[[np.ndarray, np.ndarray, int], np.ndarray]


def _fuse(dense: Hits, lexical: Hits, k: int, rule: Rule) -> FusedHits:
    """Per query: the union of both sides' candidates, scored by ``rule``, top ``k``.

    ``rule(d, l, i)`` gets, for query ``i``'s union rows (ascending), each side's raw score,
    NaN where the side did not return the row, and returns the fused scores; the higher raw
    dense score, then the lower row, breaks ties.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise BadInput(f"k must be >= 1, got {k!r}", param="k")
    d_scores, d_rows = _side(dense, "dense")
    l_scores, l_rows = _side(lexical, "lexical")
    if len(d_rows) != len(l_rows):
        raise BadInput(f"dense has {len(d_rows)} queries, lexical {len(l_rows)}",
                       "give both sides the same queries")  # fmt: skip
    q = len(d_rows)
    out = FusedHits(
        rows=np.full((q, k), -1, np.int64),
        scores=np.full((q, k), -np.inf, np.float64),
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
        fused = rule(raw_d, raw_l, i)
        # equal fused scores: the higher cosine first (a long document's best passage before
        # its first, which the lexical side found), then the lower row
        order = np.lexsort((union, -np.nan_to_num(raw_d, nan=-np.inf), -fused))[:k]
        n = len(order)
        out.rows[i, :n] = union[order]
        out.scores[i, :n] = fused[order]
        out.dense_scores[i, :n] = raw_d[order]
        out.lexical_scores[i, :n] = raw_l[order]
    return out


def _side(hits: Hits, name: str) -> tuple[np.ndarray, np.ndarray]:
    scores, rows = (np.asarray(a) for a in hits)
    if scores.ndim != 2 or scores.shape != rows.shape:
        raise BadInput(
            f"{name} hits must be (scores, rows) of one 2-D shape, got {scores.shape} and "
            f"{rows.shape}", "pass (q, k) arrays",
        )  # fmt: skip
    return scores.astype(np.float64), rows.astype(np.int64)


def _candidates(scores: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One query's candidates of one side: (rows ascending, raw scores).

    Padding (row -1) is dropped; a row listed twice keeps its first (best) place.
    """
    valid = np.flatnonzero(rows >= 0)
    found, first = np.unique(rows[valid], return_index=True)
    return found, scores[valid[first]]


def _align(union: np.ndarray, side: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """float64 (len(union),): the side's score of each union row, NaN when absent."""
    found, scores = side
    out = np.full(len(union), math.nan)
    out[np.searchsorted(union, found)] = scores
    return out
