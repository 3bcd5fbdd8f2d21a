r"""Each segment's search knob for the recall of a search over several segments.

A search over segments keeps the best ``k`` of the segments' answers. A segment holding a share
``w`` of the live rows gives that merged top-k about ``k * w`` rows, and those are its own
*nearest* ones, which a graph or an inverted file finds far more reliably than its 10th. So
tuning each segment's knob for its own recall@10 (what :func:`flowsearch.ann.tune.tune` does)
overpays ``n`` times over at ``n`` equal segments. Instead each segment records a recall curve
(:class:`Curve`: per knob value, the share of held-out queries whose rank-r neighbour it finds)
and a version chooses every segment's knob from the curves and the segments' shares
(:func:`choose_knobs`) so that the *merged* answer's expected recall@k reaches the target.

The model: the rows of the merged top-k that segment ``s`` holds are its own top ``J_s``, with
``J_s ~ Binomial(k, min(1, skew * w_s))`` (rows spread over segments as their sizes; ``skew`` > 1
assumes a query's neighbours crowd into fewer segments than that, as when segments hold rows
written at different times about different things, and makes up for the curves' held-out rows
being easier than real queries at small knobs); the merged recall is the expected share
of those rows found, ``1 - sum_s sum_r P(J_s >= r) (1 - found_s(r)) / sum_s E[J_s]``. Knobs rise
greedily, the largest recall gained per unit of knob first, from each curve's smallest value
until the target is met (or every segment is at its own tuned value, the curve's last).

Example:
    >>> easy = Curve("efSearch", (10, 40), ((0.99,) * 10, (1.0,) * 10))
    >>> choose_knobs([easy] * 10, [1000] * 10, target=0.95)
    [10, 10, 10, 10, 10, 10, 10, 10, 10, 10]
    >>> choose_knobs([easy], [1000], target=0.995)
    [40]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MERGED_SKEW", "Curve", "choose_knobs", "merged_recall", "rank_tails"]

#: The ``skew`` a version's search chooses its segments' knobs with: a query's neighbours crowd
#: into some segments more than their share, and the curves' held-out rows are easier than real
#: queries at the small knobs a segment then gets.
MERGED_SKEW = 5.0


@dataclass(frozen=True)
class Curve:
    """A segment's recall curve.

    Attributes:
        name: the knob (``efSearch``, ``nprobe``).
        values: knob values, ascending; the last is the value tuned for the segment alone.
        found: per value, per rank r = 1..k: the share of held-out queries whose true rank-r
            row (against exact search over the segment) the search found.
    """

    name: str
    values: tuple[int, ...]
    found: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.values or len(self.values) != len(self.found):
            raise ValueError("a recall curve needs one row of found shares per knob value")
        if list(self.values) != sorted(self.values):
            raise ValueError("a recall curve's knob values must ascend")


def rank_tails(k: int, share: float) -> list[float]:
    """``P(J >= r)`` for r = 1..k, ``J ~ Binomial(k, share)``: how often a segment holding
    ``share`` of the rows gives the merged top-k at least r rows."""
    p = min(max(share, 0.0), 1.0)
    pmf = [math.comb(k, j) * p**j * (1.0 - p) ** (k - j) for j in range(k + 1)]
    return [sum(pmf[r:]) for r in range(1, k + 1)]


def _misses(tails: Sequence[float], found: Sequence[float]) -> float:
    depth = min(len(tails), len(found))
    last = found[-1] if found else 1.0
    miss = sum(t * (1.0 - f) for t, f in zip(tails[:depth], found[:depth], strict=True))
    return miss + sum(t * (1.0 - last) for t in tails[depth:])  # ranks past the curve's k


def merged_recall(
    found: Sequence[Sequence[float]], shares: Sequence[float], k: int = 10, skew: float = 1.0
) -> float:
    """The expected recall@k of the merged answer when segment ``s`` finds its rank-r row with
    probability ``found[s][r - 1]`` and holds ``shares[s]`` of the rows (see the module
    docstring)."""
    tails = [rank_tails(k, skew * w) for w in shares]
    rows = sum(sum(t) for t in tails)
    if rows <= 0:
        return 1.0
    return 1.0 - sum(_misses(t, f) for t, f in zip(tails, found, strict=True)) / rows


def choose_knobs(
    curves: Sequence[Curve | float],
    live: Sequence[int],
    *,
    target: float,
    k: int = 10,
    skew: float = 1.0,
) -> list[int | None]:
    """Each segment's knob value for a merged recall@k of at least ``target``.

    Args:
        curves: per segment, its :class:`Curve`, or a float: the share of its rank-r rows it
            finds at every rank whatever is chosen (1.0 for an exact index; an approximate one
            without a curve: its recorded recall), for which None is returned.
        live: per segment, its live rows.
        target: the merged recall@k to reach.
        k: the merged answer's depth the recall is for.
        skew: how much more than its share of the merged rows a segment is assumed to give.

    Returns:
        per segment, the chosen value of its curve's knob (None for a float entry).
    """
    total = sum(live)
    if total <= 0:
        return [None if not isinstance(c, Curve) else c.values[-1] for c in curves]
    tails = [rank_tails(k, skew * n / total) for n in live]
    rows = sum(sum(t) for t in tails)
    at = [0] * len(curves)

    def misses(s: int, i: int) -> float:
        c = curves[s]
        if isinstance(c, Curve):
            return _misses(tails[s], c.found[i])
        return _misses(tails[s], [float(c)] * k)

    missed = [misses(s, 0) for s in range(len(curves))]
    while rows > 0 and 1.0 - sum(missed) / rows < target:
        best, best_gain = -1, -math.inf
        for s, c in enumerate(curves):
            if not isinstance(c, Curve) or at[s] + 1 >= len(c.values):
                continue
            gain = (missed[s] - misses(s, at[s] + 1)) / (c.values[at[s] + 1] - c.values[at[s]])
            if gain > best_gain:
                best, best_gain = s, gain
        if best < 0:
            break  # every curve at its last value: each segment as tuned alone
        at[best] += 1
        missed[best] = misses(best, at[best])
    return [c.values[at[s]] if isinstance(c, Curve) else None for s, c in enumerate(curves)]
