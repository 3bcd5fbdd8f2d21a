r"""The numbers the STS and QNLI papers report, computed the way they compute them.

- STS: Spearman's rho x 100 between the cosine similarity of the two sentence vectors and the
  gold score (Reimers & Gurevych 2019; Li et al. 2020, section 4.1).
- STS12-16: SentEval reports ``all`` (rho over every pair of the year pooled) and ``wmean`` (rho
  of each subset, averaged with the subset sizes as weights). BERT-flow and BERT-whitening report
  ``wmean``; SBERT, SimCSE and MTEB report ``all``-style pooled figures.
- QNLI: area under the ROC curve x 100 of cosine(question, sentence) against entailment = 1
  (Li et al. 2020, section 4.2).

Example:
    >>> import numpy as np
    >>> round(spearman100(np.array([0.1, 0.5, 0.3]), np.array([1.0, 3.0, 2.0])), 2)
    100.0
    >>> auc100(np.array([0.9, 0.2, 0.6, 0.4]), np.array([1, 0, 1, 0]))
    100.0
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata, spearmanr

from flowsearch.errors import BadInput

__all__ = ["auc100", "cosine_pairs", "spearman100", "sts_correlations"]

LOG = logging.getLogger(__name__)


def cosine_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two float arrays of shape (n, d); returns float64 (n,).

    A zero row has cosine 0 with anything (rather than NaN), so a degenerate vector ranks low
    instead of poisoning the correlation.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise BadInput(
            f"cosine_pairs needs two (n, d) arrays of one shape, got {a.shape}, {b.shape}"
        )
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    cosines: np.ndarray = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
    return cosines


def spearman100(pred: np.ndarray, gold: np.ndarray) -> float:
    """Spearman's rank correlation x 100 (ties get average ranks, as scipy does)."""
    pred = np.asarray(pred, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    if pred.shape != gold.shape or pred.ndim != 1 or len(pred) < 2:
        raise BadInput(f"spearman100 needs two 1-d arrays of one length >= 2, got {pred.shape}")
    rho = spearmanr(pred, gold).statistic
    return float(rho) * 100.0


def sts_correlations(
    pred: np.ndarray, gold: np.ndarray, subsets: Sequence[str] | None = None
) -> dict[str, float]:
    """``{"spearman": all, "wmean": ...}`` for one STS dataset.

    Args:
        pred: predicted similarity per pair, shape (n,).
        gold: gold score per pair, shape (n,).
        subsets: subset name per pair; ``None`` or a single name makes ``wmean`` equal ``all``.

    Returns:
        ``spearman``: rho x 100 over all pairs pooled; ``wmean``: per-subset rho x 100 averaged
        with weights = subset sizes (SentEval's ``wmean``).
    """
    pred = np.asarray(pred, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    overall = spearman100(pred, gold)
    if subsets is None:
        return {"spearman": overall, "wmean": overall}
    labels = np.asarray(list(subsets))
    if len(labels) != len(pred):
        raise BadInput(f"{len(labels)} subset labels for {len(pred)} pairs")
    total = 0.0
    weight = 0
    for name in dict.fromkeys(labels.tolist()):
        mask = labels == name
        total += spearman100(pred[mask], gold[mask]) * int(mask.sum())
        weight += int(mask.sum())
    return {"spearman": overall, "wmean": total / weight}


def auc100(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC x 100 of ``scores`` for binary ``labels`` (1 = positive).

    Computed as the Mann-Whitney U statistic with average ranks for ties, which equals the area
    under the ROC curve (ties count one half).
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    n_pos = int(labels.sum())
    n_neg = int(len(labels) - n_pos)
    if scores.shape != labels.shape or n_pos == 0 or n_neg == 0:
        raise BadInput("auc100 needs one score per label and both classes present")
    ranks = rankdata(scores)
    u_stat = ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u_stat / (n_pos * n_neg)) * 100.0
