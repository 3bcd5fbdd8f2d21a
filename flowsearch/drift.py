r"""The drift signal: how likely new rows are under the flow fitted on the corpus.

The flow gives every vector a log-density. The manifest keeps the corpus's per-row log-density
statistics; :func:`drift_report` compares new rows against them. The gap is measured in corpus
standard deviations of per-row log-density: at :data:`DRIFT_WARN_STD` (1.0) or more, new rows are
on average less likely than about five in six corpus rows (for a roughly normal spread), which we
take as far out of distribution, time to refit the flow (``flowsearch index ... --overwrite``).

For scale: a flow fitted on 250 passages of the sample corpus puts 50 held-out passages of the
same corpus 0.3 std below the corpus mean (a small corpus's flow overfits a little); short
questions sit about 10 std below passages, and off-topic text further still.

Example:
    >>> corpus = {"mean_log_prob": 100.0, "std_log_prob": 10.0, "p01": 75.0}
    >>> drift_report(np.array([70.0, 80.0]), corpus)["warn"]
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DRIFT_WARN_STD", "density", "density_stats", "drift_report"]

#: Warn when new rows' mean flow log-density is this many corpus std-devs below the corpus mean.
DRIFT_WARN_STD = 1.0


def density(cal: Any, U: np.ndarray) -> np.ndarray | None:
    """Per-row log-density (float64 (n,)) of raw vectors U under the calibrator; None if it has
    no density (only the flow has one)."""
    try:
        return np.asarray(cal.log_prob(U), dtype=np.float64)
    except NotImplementedError:
        return None


def density_stats(lp: np.ndarray) -> dict[str, float]:
    """The manifest's ``density`` record: mean, std, 1st/5th percentile, median, rows."""
    q = np.percentile(lp, [1, 5, 50])
    return {
        "mean_log_prob": float(lp.mean()),
        "std_log_prob": float(lp.std()),
        "p01": float(q[0]),
        "p05": float(q[1]),
        "median": float(q[2]),
        "rows": int(lp.size),
    }


def drift_report(new_log_prob: np.ndarray, corpus: dict[str, float]) -> dict[str, Any]:
    """How far new rows sit from the corpus under the flow.

    Args:
        new_log_prob: float64 (n,), the new rows' log-densities.
        corpus: the manifest's ``density`` record (mean, std, p01 of the corpus's log-densities).

    Returns:
        ``{"mean_log_prob", "corpus_mean_log_prob", "gap_std", "share_below_p01", "warn"}``:
        ``gap_std`` is (corpus mean - new mean) / corpus std; ``warn`` when it reaches
        :data:`DRIFT_WARN_STD`.
    """
    lp = np.asarray(new_log_prob, dtype=np.float64)
    std = max(float(corpus["std_log_prob"]), 1e-9)
    gap = (float(corpus["mean_log_prob"]) - float(lp.mean())) / std
    return {
        "mean_log_prob": float(lp.mean()),
        "corpus_mean_log_prob": float(corpus["mean_log_prob"]),
        "gap_std": float(gap),
        "share_below_p01": float(np.mean(lp < corpus["p01"])),
        "warn": bool(gap >= DRIFT_WARN_STD),
    }
