r"""Scores with a meaning: each side's raw score as a number in [0, 1], comparable across queries.

``Hit.score`` in every mode is built from two figures that mean the same for every query of an
index:

- :func:`normalise_dense`: the cosine's place between the corpus's *background* similarity (0:
  no closer to the query than an average passage of this corpus is to another) and an identical
  vector (1): ``max(0, (cosine - background) / (1 - background))``. The background is the mean
  cosine between rows of the corpus, measured at build time (:func:`build_reference`) and kept
  in a :class:`FusionReference`. It makes the figure independent of an encoder's offset:
  an encoder whose unrelated passages sit at cosine 0.3 does not hand every query 0.3 for free.
- :func:`normalise_lexical`: BM25 as a share of the query's upper bound (the sum of its terms'
  idf times the saturation limit of the term-frequency part, which no row reaches), stretched
  so that a row holding every query term once at the corpus's average length scores 0.7
  (:data:`LEXICAL_MATCH`): 0 for a row sharing no term, towards 1 for a row holding every
  query term many times. Raw BM25 grows with the number and rarity of the query's terms; the
  score does not.

Both are per row: a hit's figure depends on its own raw score, the query and the reference,
never on which other rows were candidates. A query with nothing like it in the corpus
(``"asdf qwerty zxcv"``) gets low figures on both sides; the per-query min-max of the second
release gave its best row 1.0 whatever it was.

Compared on five dev sets (the study ``fusion``, benchmarks/RESULTS.md "Hybrid
fusion"), fused by :func:`flowsearch.search.fusion.fuse`: for the bundled ``mean`` they rank
above per-query min-max, theoretical-min-max, z-score, DBSF and RRF; for ``static`` about level
with the min-max rules, the price of a score that depends on the hit alone. Percentiles against
held-out rows' own neighbours (the other candidate for a "meaning") ranked lower: they
compress the upper tail, where a query's candidates sit.

References:
    Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009 (a
    term's BM25 weight is its idf times a term-frequency part that saturates below a limit).
    Ethayarajh, "How Contextual are Contextualized Word Representations?", EMNLP 2019 (the
    mean cosine between random sentences as an encoder's anisotropy baseline).

Example:
    >>> rows = np.eye(4, dtype=np.float32)[[0, 0, 1, 2]] + 0.5  # four rows, two of them alike
    >>> rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    >>> ref = build_reference(rows.sum(0), len(rows))
    >>> round(ref.dense_background, 3)  # the mean cosine over the 6 pairs of rows
    0.722
    >>> normalise_dense(np.array([0.5, 0.9, 1.0]), ref).round(3).tolist()
    [0.0, 0.64, 1.0]
    >>> normalise_lexical(np.array([[6.0, 1.5, 0.0]]), np.array([10.0]), match=None).tolist()
    [[0.6, 0.15, 0.0]]
    >>> normalise_lexical(np.array([[6.0, 4.0, 1.5, 0.0]]), np.array([10.0])).round(3).tolist()
    [[0.8, 0.7, 0.262, 0.0]]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from flowsearch.errors import BadInput, IndexDamaged

__all__ = [
    "LEXICAL_MATCH",
    "ONE_OCCURRENCE",
    "FusionReference",
    "build_reference",
    "normalise_dense",
    "normalise_lexical",
]


@dataclass(frozen=True)
class FusionReference:
    r"""What a dense score is judged against: the manifest's ``fusion_reference`` (~50 bytes).

    Attributes:
        n_measured: how many reference rows the background was averaged over (0: every pair
            of the corpus's rows).
        n_rows: rows in the corpus when it was measured.
        dense_background: the mean cosine, in the searched space, between a reference row
            and the corpus's other rows; in [-1, 1).
    """

    n_measured: int
    n_rows: int
    dense_background: float

    def __post_init__(self) -> None:
        bg = self.dense_background
        if not (isinstance(bg, (int, float)) and math.isfinite(bg) and -1.0 <= bg < 1.0):
            raise IndexDamaged(
                f"the fusion reference's dense background {bg!r} is not a cosine below 1",
                "rebuild the index",
            )

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict (what the manifest stores)."""
        return {"n_measured": self.n_measured, "n_rows": self.n_rows,
                "dense_background": self.dense_background}  # fmt: skip

    @classmethod
    def from_dict(cls, raw: object) -> FusionReference:
        """Read :meth:`to_dict`'s form back.

        Raises:
            IndexDamaged: a missing key or a value of the wrong kind.
        """
        try:
            if not isinstance(raw, Mapping):
                raise TypeError(f"a {type(raw).__name__}, not a mapping")
            return cls(int(raw["n_measured"]), int(raw["n_rows"]), float(raw["dense_background"]))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, IndexDamaged):
                raise
            raise IndexDamaged(
                f"the manifest's fusion reference is malformed ({exc!r})", "rebuild the index"
            ) from None


def build_reference(
    total: np.ndarray, n_rows: int, reference: np.ndarray | None = None
) -> FusionReference:
    r"""The reference from the sum of the corpus's searched vectors.

    The mean cosine of a row to the other rows is ``(z · total - 1) / (n_rows - 1)`` for a
    unit row ``z`` of the corpus, so the background costs one pass over the stored vectors
    (``total``, which a write can also update exactly: add the new rows' vectors, subtract the
    deleted ones').

    Args:
        total: float (dim,): the sum of every row's searched (unit) vector.
        n_rows: how many rows ``total`` sums (>= 2).
        reference: float (m, dim), optional: the reference rows' searched vectors (rows of the
            corpus: those held out of the calibrator fit). Without it the background is the
            mean over all pairs of distinct rows, ``(|total|^2 - n_rows) / (n_rows (n_rows-1))``
            (on the dev sets the two agree closely).

    Raises:
        BadInput: fewer than two rows, or shapes that do not match.
    """
    total = np.asarray(total, np.float64).reshape(-1)
    if n_rows < 2:
        raise BadInput(f"a reference needs at least 2 rows, got {n_rows}", param="n_rows")
    if reference is None:
        bg = (float(total @ total) - n_rows) / (n_rows * (n_rows - 1.0))
        rows = 0
    else:
        ref = np.atleast_2d(np.asarray(reference, np.float64))
        if ref.shape[1] != len(total) or not len(ref):
            raise BadInput(
                f"reference rows have shape {ref.shape}, the total has dim {len(total)}",
                "pass the reference rows' searched vectors",
                param="reference",
            )
        bg = float(np.mean((ref @ total - np.sum(ref * ref, axis=1)) / (n_rows - 1.0)))
        rows = len(ref)
    return FusionReference(rows, int(n_rows), float(np.clip(bg, -1.0, 1.0 - 1e-6)))


def normalise_dense(scores: np.ndarray, reference: FusionReference | None) -> np.ndarray:
    r"""Cosines -> float64 in [0, 1]: ``max(0, (cosine - background) / (1 - background))``.

    0 for a row no closer to the query than the corpus's rows are to each other on average,
    1 for an identical vector; strictly increasing above the background. Without a reference
    (an index built before it) the background is 0. NaN stays NaN.
    """
    s = np.asarray(scores, np.float64)
    bg = 0.0 if reference is None else reference.dense_background
    return np.clip((s - bg) / (1.0 - bg), 0.0, 1.0)


#: The share of a query's BM25 upper bound that a row holding every query term once, at the
#: corpus's average length, reaches: ``1 / (1 + k1)`` for every method offered, at the default
#: ``k1 = 1.5``.
ONE_OCCURRENCE = 1.0 / (1.0 + 1.5)
#: What :func:`normalise_lexical` maps :data:`ONE_OCCURRENCE` to by default: the highest of
#: 0.5-0.9 whose hybrid nDCG@10 on the dev sets (weight re-chosen leave-one-set-out) is not
#: significantly below the plain share's for either encoder (the study ``fusion_query``).
LEXICAL_MATCH = 0.7


def normalise_lexical(
    scores: np.ndarray, upper: np.ndarray, match: float | None = LEXICAL_MATCH
) -> np.ndarray:
    r"""BM25 scores (q, k) with the queries' upper bounds (q,) -> float64 in [0, 1].

    The *share* ``score / upper``, stretched so that a row holding every query term once at
    the corpus's average length (share :data:`ONE_OCCURRENCE`, 0.4) scores ``match`` (0.7):
    linear below that point (a row holding terms worth half the query's idf once scores 0.35,
    a row sharing no term 0), and the rest of the share, which only repeats and short rows
    reach, compressed into ``[match, 1]``. ``match=None`` gives the share itself (which no row
    reaches 1 of: a good match reads 0.2-0.4). Strictly increasing in BM25 for a given query,
    and the same map for every query, so scores compare across queries.

    A query's upper bound is ``sum over its tokens (repeats counted, as BM25 counts them) of
    max(idf(t), 0) * s_max``, with the live rows' statistics the scores use: ``s_max`` is the
    limit of BM25's term-frequency part (1 for bm25s's ``lucene`` method, the product's
    default; ``k1 + 1`` for ``atire``), and a term no row holds counts with the idf of document
    frequency 0 (``lucene``: ``log(1 + (N + 0.5) / 0.5)``; for ``atire``, whose idf is infinite
    there, document frequency 1), the rarest possible, so a query of made-up words cannot score
    high through the one real word it holds. 0 for a row sharing no term (and -inf padding);
    NaN stays NaN; a query without terms (``upper`` 0) gives 0.

    Raises:
        BadInput: ``match`` outside (0, 1), or not one upper bound per query.
    """
    s = np.asarray(scores, np.float64)
    u = np.asarray(upper, np.float64).reshape(-1, *([1] * max(s.ndim - 1, 0)))
    if s.ndim and len(u) != len(s):
        raise BadInput(
            f"{len(u)} upper bounds for {len(s)} queries", "pass one per query", param="upper"
        )
    if match is not None and not 0.0 < match < 1.0:
        raise BadInput(f"match must be in (0, 1), got {match}", param="match")
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.clip(np.where(u > 0, s / u, 0.0), 0.0, 1.0)
        if match is not None:
            low = share * (match / ONE_OCCURRENCE)
            high = match + (share - ONE_OCCURRENCE) * ((1.0 - match) / (1.0 - ONE_OCCURRENCE))
            share = np.where(share <= ONE_OCCURRENCE, low, high)
    return np.where(np.isnan(s), np.nan, share)
