"""The published hybrid rules the studies compare against (the second release shipped them).

Per-query min-max fusion is what published hybrids of a dense and a BM25 side use; the product
fuses with scores that depend on the hit alone (:mod:`flowsearch.search.fusion`).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def minmax_fusion(dense, lexical, k, weight):
    """Per-query min-max fusion (the second release's rule, now only here): each side's scores
    mapped to [0, 1] over its own candidates (a flat side: 1; a row it lacks: 0), fused
    ``weight * dense + (1 - weight) * lexical``; ties to the heavier side, then the other, then
    the lower row. Returns ``.scores`` (q, k) float64 and ``.rows`` (q, k) int64, -1 pads."""
    q = len(dense[1])
    out = SimpleNamespace(scores=np.full((q, k), -np.inf), rows=np.full((q, k), -1, np.int64))
    for i in range(q):
        norm = []
        for scores, rows in ((dense[0][i], dense[1][i]), (lexical[0][i], lexical[1][i])):
            rows = np.asarray(rows, np.int64)
            keep = np.flatnonzero(rows >= 0)
            found, first = np.unique(rows[keep], return_index=True)
            s = np.asarray(scores, np.float64)[keep[first]]
            span = s.max() - s.min() if len(s) else 0.0
            scaled = (s - s.min()) / span if span > 0 else np.ones(len(s))
            norm.append(dict(zip(found.tolist(), scaled.tolist())))
        union = np.array(sorted(norm[0].keys() | norm[1].keys()), np.int64)
        nd, nl = (np.array([side.get(r, np.nan) for r in union.tolist()]) for side in norm)
        fused = weight * np.nan_to_num(nd) + (1 - weight) * np.nan_to_num(nl)
        heavy, light = (nd, nl) if weight >= 0.5 else (nl, nd)
        keys = (union, -np.nan_to_num(light, nan=-1.0), -np.nan_to_num(heavy, nan=-1.0), -fused)
        order = np.lexsort(keys)[:k]
        out.rows[i, : len(order)], out.scores[i, : len(order)] = union[order], fused[order]
    return out


def rrf_fusion(dense, lexical, k, k_rrf=60.0):
    """Reciprocal-rank fusion (Cormack et al. 2009): the sum over sides of 1 / (k_rrf + rank);
    ties to the better best rank, then the lower row. Returns ``.scores`` and ``.rows``."""
    q = len(dense[1])
    out = SimpleNamespace(scores=np.full((q, k), -np.inf), rows=np.full((q, k), -1, np.int64))
    for i in range(q):
        ranks = []
        for rows in (dense[1][i], lexical[1][i]):
            rows = np.asarray(rows, np.int64)
            keep = rows[rows >= 0]
            found, first = np.unique(keep, return_index=True)
            place = np.empty(len(first))
            place[np.argsort(first, kind="stable")] = np.arange(1, len(first) + 1)
            ranks.append(dict(zip(found.tolist(), place.tolist())))
        union = np.array(sorted(ranks[0].keys() | ranks[1].keys()), np.int64)
        rd, rl = (np.array([side.get(r, np.nan) for r in union.tolist()]) for side in ranks)
        fused = np.nan_to_num(1.0 / (k_rrf + rd)) + np.nan_to_num(1.0 / (k_rrf + rl))
        order = np.lexsort((union, np.fmin(rd, rl), -fused))[:k]
        out.rows[i, : len(order)], out.scores[i, : len(order)] = union[order], fused[order]
    return out
