r"""BM25's weighting formulas: idf and the term-frequency component, per variant.

The variants are those of Kamphuis et al. (2020) as bm25s names them (Lù, 2024), written with
the same operations in the same order, so a weight is the same float64 as bm25s's before bm25s
rounds it to float32. Only variants whose weight depends on (tf, row length, df) alone are
offered: BM25L and BM25+ give every row a weight for every term, which postings cannot hold.

Example:
    >>> round(idf("lucene", df=2, n=10), 4)
    1.4816
    >>> tfc("atire", np.array([1.0, 3.0]), np.array([5.0, 5.0]), 5.0, 1.2, 0.75).round(4).tolist()
    [1.0, 1.5714]

References:
    Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009.
    Kamphuis, de Vries, Boytsov & Lin, "Which BM25 Do You Mean? A Large-Scale Reproducibility
    Study of Scoring Variants", ECIR 2020. Lù, "BM25S: Orders of magnitude faster lexical search
    via eager sparse scoring", 2024.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from flowsearch.errors import BadInput

__all__ = ["METHODS", "Method", "check_method", "idf", "tfc", "tfc_supremum"]

#: The BM25 variants offered, as bm25s names them.
Method = Literal["lucene", "robertson", "atire"]
METHODS: tuple[str, ...] = get_args(Method)

Float64 = npt.NDArray[np.float64]


def check_method(method: str) -> None:
    """Refuse a variant that is not one of :data:`METHODS`."""
    if method not in METHODS:
        raise BadInput(
            f"unknown BM25 method {method!r}", f"use one of {', '.join(METHODS)}", param="method"
        )


def idf(method: Method, df: int, n: int) -> float:
    """The idf of a term that ``df >= 1`` of ``n`` live rows hold.

    lucene: ``log(1 + (n - df + 0.5) / (df + 0.5))``; robertson: ``log((n - df + 0.5) /
    (df + 0.5))`` clipped at 0, as bm25s does; atire: ``log(n / df)``.
    """
    if method == "lucene":
        return math.log(1 + (n - df + 0.5) / (df + 0.5))
    if method == "robertson":
        return math.log(max((n - df + 0.5) / (df + 0.5), 1.0))
    return math.log(n / df)


def tfc(
    method: Method, tf: Float64, length: Float64, avg_length: float, k1: float, b: float
) -> Float64:
    """The term-frequency component, float64 (m,), elementwise over postings.

    lucene and robertson: ``tf / (k1 * ((1 - b) + b * length / avg_length) + tf)``; atire:
    ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg_length))``.
    """
    if method == "atire":
        out: Float64 = (tf * (k1 + 1)) / (tf + k1 * (1 - b + b * length / avg_length))
        return out
    out = tf / (k1 * ((1 - b) + b * length / avg_length) + tf)
    return out


def tfc_supremum(method: Method, k1: float) -> float:
    """The least value :func:`tfc` stays below for every tf and length: 1, or k1 + 1 (atire)."""
    return k1 + 1 if method == "atire" else 1.0
