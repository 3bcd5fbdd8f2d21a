r"""What the index says about rows and queries: corpus and held-out statistics, drift, verdicts.

The flow gives every vector an exact log-density. At build, :data:`HELD_OUT_SHARE` of the rows
(:func:`split_fit_rows`) are kept out of the calibrator's fit; the manifest keeps all rows'
log-density statistics (:func:`density_stats`) and the held-out rows' (:func:`held_out_stats`):
their log-densities and each one's best cosine to another row of the index.
:func:`drift_report` compares rows added later with the held-out rows (rows the flow never saw,
as new rows are), in their standard deviations: at :data:`DRIFT_WARN_STD` (1.0) or more, time to
refit (``recalibrate``).

:func:`query_report` judges a query by its best dense score against the held-out rows' (out of
distribution below their :data:`OOD_PERCENTILE`), not by its log-density:
``benchmarks/bench_density.py`` found the log-density mostly measures text length (Spearman
+0.76 with token count, bundled model ``mean``), so short in-domain questions sat far below
passages and the old rule (1 std below the rows the flow saw) flagged 94% of them; the best
score flags 2% of in-domain questions and catches 86% of off-domain sentences (AUROC 0.99 vs the
flow's 0.81, which equals a plain Gaussian's). The log-density is still reported, when finite
and from a flow fitted on at least :data:`MIN_ROWS_PER_DIM` rows per dimension (a 300-row flow
puts its own rows at 658 ± 1.8 nats, a 3-row one at -6e26); otherwise it is not shown.

Example:
    >>> corpus = DensityStats(mean_log_prob=100.0, std_log_prob=10.0, p01=75.0, p05=80.0,
    ...                       median=100.0, rows=1000)
    >>> drift_report(np.array([70.0, 80.0]), corpus)["warn"]
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from flowsearch.storage.manifest import DensityStats, HeldOut

__all__ = [
    "DRIFT_WARN_STD",
    "HELD_OUT_SHARE",
    "MAX_HELD_OUT",
    "MIN_HELD_OUT",
    "MIN_ROWS_PER_DIM",
    "OOD_PERCENTILE",
    "QueryReport",
    "best_other_score",
    "density_stats",
    "drift_report",
    "held_out_stats",
    "query_report",
    "reliable",
    "split_fit_rows",
]

#: Warn when new rows' mean flow log-density is this many corpus std-devs below the corpus mean.
DRIFT_WARN_STD = 1.0

#: ``auto`` searches a calibrated space only with at least this many rows per dimension, and
#: densities are judged only then. On STS-B, all-MiniLM-L6-v2 first-release ``static`` (384-d),
#: whitening fitted on 300 rows (0.8 x dim) scores 39.4 against 55.6 raw, on 1,000 rows
#: (2.6 x dim) 55.1, on 5,385 rows (14 x dim) 70.4: below about 3 rows per dimension a
#: calibrator overfits and costs more than the anisotropy does.
MIN_ROWS_PER_DIM = 3


#: Share of the corpus kept out of the calibrator's fit to judge queries and new rows against.
HELD_OUT_SHARE = 0.10
#: At most this many rows are held out (enough for a 5th percentile; their scoring is cheap).
MAX_HELD_OUT = 2000
#: Fewer held-out rows than this give no reference (a corpus under 500 rows holds none out).
MIN_HELD_OUT = 50
#: A query whose best dense score is below this percentile of the held-out rows' is flagged.
OOD_PERCENTILE = 5.0
#: Percentiles of the held-out rows' best scores kept in the manifest.
PERCENTS = (1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0)


def reliable(fit_rows: int, dim: int) -> bool:
    """True when a calibrator fitted on ``fit_rows`` rows of dimension ``dim`` can be trusted."""
    return fit_rows >= MIN_ROWS_PER_DIM * dim


def density_stats(lp: np.ndarray) -> DensityStats:
    """Statistics of per-row log-densities (float (n,)): mean, std, 1st/5th percentile, median."""
    lp = np.asarray(lp, dtype=np.float64)
    q = np.percentile(lp, [1, 5, 50])
    return DensityStats(
        mean_log_prob=float(lp.mean()),
        std_log_prob=float(lp.std()),
        p01=float(q[0]),
        p05=float(q[1]),
        median=float(q[2]),
        rows=int(lp.size),
    )


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def drift_report(
    new_log_prob: np.ndarray, corpus: DensityStats, is_reliable: bool = True
) -> dict[str, Any]:
    """How far new rows sit from the corpus under the flow.

    Args:
        new_log_prob: float64 (n,), the new rows' log-densities.
        corpus: the corpus's statistics.
        is_reliable: False when the flow was fitted on too few rows per dimension (see
            :func:`reliable`): no warning is raised then.

    Returns:
        ``{"mean_log_prob", "corpus_mean_log_prob", "gap_std", "share_below_p01", "reliable",
        "warn"}``: ``gap_std`` is (corpus mean - new mean) / corpus std; ``warn`` when it
        reaches :data:`DRIFT_WARN_STD`. Figures that are not finite are None.
    """
    lp = np.asarray(new_log_prob, dtype=np.float64)
    std = max(float(corpus.std_log_prob), 1e-9)
    mean = float(lp.mean())
    gap = (float(corpus.mean_log_prob) - mean) / std
    ok = is_reliable and _finite(mean, gap, corpus.mean_log_prob)
    return {
        "mean_log_prob": mean if math.isfinite(mean) else None,
        "corpus_mean_log_prob": float(corpus.mean_log_prob),
        "gap_std": float(gap) if math.isfinite(gap) else None,
        "share_below_p01": float(np.mean(lp < corpus.p01)),
        "reliable": bool(ok),
        "warn": bool(ok and gap >= DRIFT_WARN_STD),
    }


def split_fit_rows(n: int, fit_sample: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Which rows fit the calibrator and which are held out to judge against (int64, sorted).

    :data:`HELD_OUT_SHARE` of the rows (at most :data:`MAX_HELD_OUT`; none below
    :data:`MIN_HELD_OUT` / share rows) are held out; at most ``fit_sample`` of the others, a
    seeded uniform sample, fit. A corpus larger than ``fit_sample`` holds out rows outside the
    sample, so its fit set does not shrink.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    held = min(int(round(n * HELD_OUT_SHARE)), MAX_HELD_OUT)
    if held < MIN_HELD_OUT:
        held = 0
    fit = order[held : held + fit_sample] if n - held > fit_sample else order[held:]
    return np.sort(fit).astype(np.int64), np.sort(order[:held]).astype(np.int64)


def best_other_score(scores: np.ndarray, rows: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Each searched row's best score to another row: ``(scores, rows)`` float/int (m, k) from
    searching rows ``own`` (int (m,)) with k >= 2; float64 (m,), NaN when none was found."""
    other = (rows >= 0) & (rows != own[:, None])
    first = np.argmax(other, axis=1)
    out = np.take_along_axis(np.asarray(scores, np.float64), first[:, None], 1)[:, 0]
    return np.where(other.any(axis=1), out, np.nan)


def held_out_stats(log_prob: np.ndarray | None, top_score: np.ndarray, rows: int) -> HeldOut:
    """The manifest's :class:`HeldOut` from held-out rows' log-densities (float (m,) or None)
    and best scores to the other rows (float (m,); NaN entries ignored)."""
    density = None
    if log_prob is not None and len(log_prob) and np.isfinite(log_prob).all():
        density = density_stats(log_prob)
    top = np.asarray(top_score, np.float64)
    top = top[np.isfinite(top)]
    values = tuple(float(v) for v in np.percentile(top, PERCENTS)) if len(top) else ()
    return HeldOut(rows=int(rows), density=density,
                   percents=PERCENTS if values else (), top_score=values)  # fmt: skip


def _percentile_of(value: float, held: HeldOut) -> float:
    """Where ``value`` falls among the held-out rows' top scores, in percent (interpolated
    between the stored percentiles, clamped to their range)."""
    return float(np.interp(value, held.top_score, held.percents))


@dataclass(frozen=True)
class QueryReport:
    """Whether a query looks like the indexed rows, and where it sits under the index's flow.

    The verdict compares the query's best dense score (its cosine to the nearest row) with the
    same figure for held-out rows (rows the calibrator did not see, scored against the rest of
    the index): out of distribution when it is below the held-out rows' 5th percentile. The
    benchmark (``benchmarks/bench_density.py``) found this separates in-domain questions from
    foreign sentences far better than any log-density, which mostly measures text length.

    Attributes:
        log_density: the query's log-density under the flow (None without a reliable flow,
            or not finite). Short texts sit far below passages even in-domain: informative,
            not the verdict.
        corpus_mean: the held-out rows' mean log-density (the index's rows for an index built
            before held-out statistics).
        corpus_std: their standard deviation.
        gap_std: (corpus mean - query) / corpus std; None when not shown.
        top_score: the query's best dense score over the index (None in lexical mode or with a
            filter, where it is not comparable).
        top_score_percentile: where ``top_score`` falls among the held-out rows' (0-100).
        verdict: ``out-of-distribution``, ``in-distribution``, or ``not judged`` (see ``reason``).
        reason: why no verdict was given, or None.
    """

    log_density: float | None
    corpus_mean: float | None
    corpus_std: float | None
    gap_std: float | None
    verdict: str
    reason: str | None = None
    top_score: float | None = None
    top_score_percentile: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields."""
        return asdict(self)


def _density_figures(
    log_density: float | None, ref: DensityStats | None, fit_rows: int, dim: int
) -> tuple[float | None, float | None, float | None, float | None]:
    """(log_density, mean, std, gap) when finite and from a reliable flow, else Nones."""
    if log_density is None or ref is None or not reliable(fit_rows, dim):
        return None, None, None, None
    mean, std = float(ref.mean_log_prob), float(ref.std_log_prob)
    gap = (mean - float(log_density)) / max(std, 1e-9)
    if not _finite(log_density, mean, std, gap):
        return None, None, None, None
    return float(log_density), mean, std, float(gap)


def query_report(
    log_density: float | None,
    corpus: DensityStats | None,
    fit_rows: int,
    dim: int,
    *,
    held_out: HeldOut | None = None,
    top_score: float | None = None,
) -> QueryReport:
    """Judge a query (see :class:`QueryReport`).

    Args:
        log_density: the query's log-density under the flow, or None.
        corpus: the index's density statistics over all its rows (shown for an index built
            before held-out statistics; never judged against: the flow saw those rows).
        fit_rows: rows the calibrator was fitted on.
        dim: the searched dimension.
        held_out: the held-out reference (None for an index built before it: not judged).
        top_score: the query's best dense score over the whole index, or None.
    """
    ref = held_out.density if held_out is not None and held_out.density else corpus
    lp, mean, std, gap = _density_figures(log_density, ref, fit_rows, dim)

    def report(verdict: str, reason: str | None, percentile: float | None = None) -> QueryReport:
        top = float(top_score) if top_score is not None and math.isfinite(top_score) else None
        return QueryReport(lp, mean, std, gap, verdict, reason, top, percentile)

    if held_out is None:
        return report("not judged", "the index has no held-out statistics (built before them)")
    if held_out.rows < MIN_HELD_OUT or not held_out.top_score:
        return report("not judged", f"too few rows held out ({held_out.rows}) to judge against")
    if top_score is None or not math.isfinite(top_score):
        return report(
            "not judged", "no dense score over the whole index (lexical mode or a filter)"
        )
    pct = _percentile_of(float(top_score), held_out)
    cut = _percentile_cut(held_out)
    verdict = "out-of-distribution" if top_score < cut else "in-distribution"
    return report(verdict, None, round(pct, 1))


def _percentile_cut(held: HeldOut) -> float:
    """The held-out top score at :data:`OOD_PERCENTILE`."""
    return float(np.interp(OOD_PERCENTILE, held.percents, held.top_score))
