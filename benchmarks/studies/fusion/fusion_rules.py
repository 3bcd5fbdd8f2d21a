r"""Stage 2 of the fusion study (issue 24): every fusion rule on dumped candidates, in numpy.

:func:`load` reads one ``fusion_dump.py`` file and its qrels; :func:`candidates` forms each
query's union of both sides' top ``C`` (the Searcher fuses 100 a side) with each side's raw
score of every union row, "partial" (NaN where that side did not return the row, as a searcher
that fuses only what each side returned sees it) or "complete" (each side's score of every
union row). A rule maps that to a fused score per union row (:data:`RULES`); :func:`rank` sorts
(fused descending, then lower row, as :func:`flowsearch.search.fusion.fuse` does) and
:func:`fast_metrics` scores the top 100 (binary qrels), checked against pytrec_eval by
``bench_fusion.py``.

Per-query rules take their statistics (min, max, mean, sd) from the side's own top ``C``, and
give a row that side did not return the rule's floor: min-max and TM2C2 0 (Bruch et al.
2023), z-score the lowest candidate's z, DBSF 0 (Qdrant's ``dbsf`` adds nothing for a list
that lacks the row; its normalisation is not clipped, so 0 is mean - 3 sd). RRF (k=60,
Cormack et al. 2009) ranks within the side's top ``C``; its complete variant uses the rank in
the side's top 1000 (beyond it, nothing). With complete scores, a per-query rule still takes
its statistics from the side's own top ``C`` and applies them to every union row.

The shipped rule is the library's own: :func:`flowsearch.search.scores.normalise_dense` (the
cosine above the corpus's background, the reference built by
:func:`~flowsearch.search.scores.build_reference` from the dump's corpus sum) and
:func:`~flowsearch.search.scores.normalise_lexical` (BM25 over the query's upper bound).
:func:`percentile_scores` is the other reference rule studied: each side's place in the
distribution of the held-out rows' own neighbours (an interpolated CDF with exponential tails).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.evaluation.beir import load_beir
from flowsearch.search.scores import (
    FusionReference,
    build_reference,
    normalise_dense,
    normalise_lexical,
)

__all__ = [
    "Candidates",
    "Study",
    "candidates",
    "fast_metrics",
    "load",
    "percentile_scores",
    "rank",
    "reference",
    "reference_scores",
    "rrf_scores",
    "side_scores",
    "trec_metrics",
]

#: Cumulative percentages at which the percentile rule keeps its quantiles.
LEVELS = (0.5, 1, 2, 5, 10, 15, 20, 25, 30, 40, 50, 60, 70, 75, 80, 85, 90, 95, 98, 99, 99.5)


@dataclass
class Study:
    """One (encoder, set) dump with its qrels as row sets."""

    name: str
    encoder: str
    arrays: dict[str, np.ndarray]
    qids: list[str]
    doc_ids: list[str]
    relevant: list[np.ndarray]  # per query: int64 rows of its relevant passages
    rel_mat: np.ndarray  # bool (q, n_rows + 1): relevant rows; the last column is row -1

    @property
    def n_rows(self) -> int:
        return len(self.doc_ids)


def load(npz: Path, beir_dir: Path, encoder: str) -> Study:
    ds = load_beir(beir_dir)
    row_of = {d: i for i, d in enumerate(ds.doc_ids)}
    qids = list(ds.queries)
    relevant = [
        np.array(sorted(row_of[d] for d, g in ds.qrels[q].items() if g >= 1), np.int64)
        for q in qids
    ]
    arrays = dict(np.load(npz))
    rel_mat = np.zeros((len(qids), len(ds.doc_ids) + 1), bool)
    for i, rel in enumerate(relevant):
        rel_mat[i, rel] = True
    return Study(ds.name, encoder, arrays, qids, ds.doc_ids, relevant, rel_mat)


@dataclass
class Candidates:
    """Each query's union of both sides' top ``C``: (q, 2C) arrays; invalid slots have row -1.

    ``d``/``l`` are the raw cosine/BM25 (NaN where unknown); ``d_rank``/``l_rank`` the 1-based
    rank in that side's list (NaN beyond it); ``d_side``/``l_side`` each side's own top ``C``
    scores (q, C), for per-query statistics; ``upper`` the queries' BM25 upper bounds.
    """

    rows: np.ndarray
    d: np.ndarray
    l: np.ndarray  # noqa: E741
    d_rank: np.ndarray
    l_rank: np.ndarray
    d_side: np.ndarray
    l_side: np.ndarray
    upper: np.ndarray


def _rank_in(rows: np.ndarray, lists: np.ndarray) -> np.ndarray:
    """float (q, w): 1-based position of each of ``rows`` in ``lists`` (q, depth), NaN if absent."""
    out = np.full(rows.shape, np.nan)
    for i in range(len(rows)):
        order = np.argsort(lists[i], kind="stable")
        pos = np.searchsorted(lists[i], rows[i], sorter=order)
        pos = np.minimum(pos, lists.shape[1] - 1)
        hit = lists[i][order[pos]] == rows[i]
        out[i] = np.where(hit & (rows[i] >= 0), order[pos] + 1.0, np.nan)
    return out


def candidates(st: Study, c: int = 100, complete: bool = True, known: bool = False) -> Candidates:
    """The union of each side's top ``c`` for every query (see :class:`Candidates`).

    Args:
        complete: fill each side's score of the other side's rows (else NaN).
        known: use the upper bound over the terms the corpus holds (else every term counts,
            an unknown one at document frequency 0, as the library does).
    """
    a = st.arrays
    dr, lr = a["dense_rows"][:, :c], a["lex_rows"][:, :c]
    rows = np.concatenate([dr, lr], 1)
    rows[:, c:][_member(lr, dr)] = -1
    valid = rows >= 0
    d = np.concatenate([a["dense_scores"][:, :c], a["dense_of_lex"][:, :c]], 1).astype(float)
    lx = np.concatenate([a["lex_of_dense"][:, :c], a["lex_scores"][:, :c]], 1).astype(float)
    in_d = np.concatenate([dr >= 0, np.zeros(lr.shape, bool)], 1)
    in_l = np.concatenate([_member(dr, lr), lr >= 0], 1)
    if not complete:
        d = np.where(in_d, d, np.nan)
        lx = np.where(in_l, lx, np.nan)
    d, lx = np.where(valid, d, np.nan), np.where(valid, lx, np.nan)
    d_rank = _rank_in(rows, a["dense_rows"] if complete else dr)
    l_rank = _rank_in(rows, a["lex_rows"] if complete else lr)
    d_side = np.where(dr >= 0, a["dense_scores"][:, :c], np.nan)
    l_side = np.where(lr >= 0, a["lex_scores"][:, :c], np.nan)
    upper = a["q_upper_known"] if known else a["q_upper"]
    return Candidates(rows, d, lx, d_rank, l_rank, d_side, l_side, upper)


def _member(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bool like ``a``: whether each entry of row i of ``a`` is in row i of ``b`` (rows >= 0)."""
    out = np.zeros(a.shape, bool)
    for i in range(len(a)):
        out[i] = np.isin(a[i], b[i][b[i] >= 0]) & (a[i] >= 0)
    return out


def reference(st: Study) -> FusionReference:
    """The library's reference for the dump's corpus (from the sum of its searched vectors)."""
    return build_reference(st.arrays["corpus_mean"] * st.n_rows, st.n_rows)


def ecdf(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The CDF of ``values`` at ``x``: linear between the quantiles at :data:`LEVELS`, then
    exponential tails with the neighbouring segment's slope (strictly increasing, in (0, 1))."""
    v = values[np.isfinite(values)]
    q = np.percentile(v, LEVELS)
    keep = np.r_[np.diff(q) > 0, True]
    q, p = q[keep], np.asarray(LEVELS, float)[keep] / 100
    out = np.interp(x, q, p)
    lo = p[0] * (q[1] - q[0]) / (p[1] - p[0])
    hi = (1 - p[-1]) * (q[-1] - q[-2]) / (p[-1] - p[-2])
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.where(x < q[0], p[0] * np.exp((x - q[0]) / lo), out)
        out = np.where(x > q[-1], 1 - (1 - p[-1]) * np.exp((q[-1] - x) / hi), out)
    return np.where(np.isnan(x), np.nan, out)


def percentile_scores(cand: Candidates, st: Study, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Each side's place among the held-out rows' top ``depth`` neighbours: cosines, and BM25
    shares of the held-out texts searched as queries (rows sharing a term); 0 for BM25 0."""
    a = st.arrays
    ref_share = normalise_lexical(a["ref_lex"][:, :depth], a["ref_upper"])
    ref_share = np.where(a["ref_lex"][:, :depth] > 0, ref_share, np.nan)
    nd = ecdf(a["ref_dense"][:, :depth].ravel(), cand.d)
    share = normalise_lexical(cand.l, cand.upper)
    nl = np.where(share > 0, ecdf(ref_share.ravel(), share), 0.0)
    return np.nan_to_num(nd), np.nan_to_num(nl)


# -- the per-side normalisations (each returns float (q, 2C), NaN where the side is unknown) --


def _stat(side: np.ndarray, fn: Any) -> np.ndarray:
    with np.errstate(all="ignore"):
        return fn(side, axis=1)[:, None]


def minmax(x: np.ndarray, side: np.ndarray) -> np.ndarray:
    lo, hi = _stat(side, np.nanmin), _stat(side, np.nanmax)
    span = hi - lo
    return np.where(span > 0, (x - lo) / np.where(span > 0, span, 1), 1.0)


def tm2c2(x: np.ndarray, side: np.ndarray, lower: float) -> np.ndarray:
    hi = _stat(side, np.nanmax)
    span = hi - lower
    return np.where(span > 0, (x - lower) / np.where(span > 0, span, 1), 1.0)


def zscore(x: np.ndarray, side: np.ndarray) -> np.ndarray:
    mu, sd = _stat(side, np.nanmean), _stat(side, np.nanstd)
    return (x - mu) / np.where(sd > 0, sd, 1.0)


def dbsf(x: np.ndarray, side: np.ndarray) -> np.ndarray:
    """Qdrant's ``dbsf``: (x - (mean - 3 sd)) / (6 sd), sample sd, not clipped; 0.5 if flat."""
    mu = _stat(side, np.nanmean)
    with np.errstate(all="ignore"):
        sd = np.nanstd(side, axis=1, ddof=1)[:, None]
    ok = np.isfinite(sd) & (sd > 0)
    return np.where(ok, (x - mu + 3 * sd) / np.where(ok, 6 * sd, 1.0), 0.5)


def floor_of(norm: np.ndarray, side_norm: np.ndarray, rule: str) -> np.ndarray:
    """What a row the side did not return gets under ``rule`` (see the module docstring)."""
    if rule == "zscore":
        return np.broadcast_to(_stat(side_norm, np.nanmin), norm.shape)
    return np.zeros(norm.shape)


def side_scores(
    cand: Candidates, rule: str, dense_lower: float = -1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Both sides normalised by ``rule``, missing entries at the rule's floor."""
    out = []
    for x, side, lower in ((cand.d, cand.d_side, dense_lower), (cand.l, cand.l_side, 0.0)):
        if rule == "minmax":
            n, ns = minmax(x, side), minmax(side, side)
        elif rule == "tm2c2":
            n, ns = tm2c2(x, side, lower), tm2c2(side, side, lower)
        elif rule == "zscore":
            n, ns = zscore(x, side), zscore(side, side)
        elif rule == "dbsf":
            n, ns = dbsf(x, side), dbsf(side, side)
        else:
            raise ValueError(rule)
        out.append(np.where(np.isnan(n), floor_of(n, ns, rule), n))
    return out[0], out[1]


def reference_scores(cand: Candidates, ref: FusionReference | None) -> tuple:
    """The library's normalisations; an unknown side scores 0 (its floor)."""
    nd = np.nan_to_num(normalise_dense(cand.d, ref))
    nl = np.nan_to_num(normalise_lexical(cand.l, cand.upper))
    return nd, nl


def rrf_scores(cand: Candidates, k: float = 60.0) -> np.ndarray:
    return np.nan_to_num(1.0 / (k + cand.d_rank)) + np.nan_to_num(1.0 / (k + cand.l_rank))


# -- ranking and metrics --------------------------------------------------------------------


def rank(fused: np.ndarray, rows: np.ndarray, top: int = 100) -> np.ndarray:
    """int64 (q, top): rows by fused descending, then lower row; -1 past the union."""
    fused = np.where(rows >= 0, fused, -np.inf)
    key_rows = np.where(rows >= 0, rows, np.iinfo(np.int64).max)
    order = np.lexsort((key_rows, -fused), axis=1)[:, :top]
    out = np.take_along_axis(rows, order, 1)
    got = np.take_along_axis(fused, order, 1)
    return np.where(np.isneginf(got), -1, out)


def side_alone(st: Study, side: str, top: int = 100) -> np.ndarray:
    rows = st.arrays["dense_rows" if side == "dense" else "lex_rows"][:, :top]
    return rows.astype(np.int64)


def fast_metrics(top: np.ndarray, st: Study) -> tuple[np.ndarray, np.ndarray]:
    """Per query nDCG@10 and recall@100 of ranked rows (binary relevance, trec_eval's
    definitions; the ranking is taken as given)."""
    disc = 1.0 / np.log2(np.arange(2, 12))
    hit = np.take_along_axis(st.rel_mat, np.where(top >= 0, top, st.n_rows), 1)
    n_rel = st.rel_mat.sum(1)
    ideal = np.cumsum(disc)[np.minimum(n_rel, 10) - 1]
    ndcg = (hit[:, :10] @ disc[: hit[:, :10].shape[1]]) / ideal
    recall = hit[:, :100].sum(1) / n_rel
    return ndcg, recall


def trec_metrics(top: np.ndarray, st: Study) -> dict[str, float]:
    """Mean nDCG@10 and recall@100 through pytrec_eval (scores = descending ranks, so it keeps
    our order)."""
    import pytrec_eval

    qrels = {q: {st.doc_ids[r]: 1 for r in rel} for q, rel in zip(st.qids, st.relevant)}
    run = {
        q: {st.doc_ids[r]: float(len(row) - j) for j, r in enumerate(row) if r >= 0}
        for q, row in zip(st.qids, top)
    }
    run = {q: docs for q, docs in run.items() if docs}
    ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"})
    per = ev.evaluate(run)
    # a query with no hit scores 0, as the fast metrics count it
    n = len(st.qids)
    return {
        "ndcg@10": sum(v["ndcg_cut_10"] for v in per.values()) / n,
        "recall@100": sum(v["recall_100"] for v in per.values()) / n,
    }
