r"""Issue 32: can the hybrid go past the published rules? Query-dependent weights, dense
pseudo-relevance feedback, RM3, and a readable lexical score, on the fusion study's dev sets.

Usage::

    python -m benchmarks run fusion_dump --data ../shared/data
    python -m benchmarks run fusion_query [--report-only]

Reads the dumps of ``fusion_dump.py`` (the five dev sets, each corpus at most 6,000 passages,
indexed with the shipped defaults; the dumps keep the corpus's searched vectors and the
queries'), rebuilds each corpus's BM25 as a sparse matrix with the product's tokeniser and
lucene weights (checked equal to the dumped BM25 candidates), and evaluates in numpy, with the
machinery of ``bench_fusion.py`` (candidates: each side's top 100, complete scores; nDCG@10 by
pytrec_eval; every parameter, the fusion weight included, chosen leave-one-set-out: for each set,
the value with the best mean nDCG@10 over the four others):

- **third release**: the library's rule before this study (``background + BM25 share``), at
  its leave-one-set-out weight: the baseline of every "minus" column.
- **published**: RRF (k=60), TM2C2 (dense bound -1 and 0) and DBSF, complete and partial scores,
  at their leave-one-set-out weights (as ``bench_fusion.py`` reports them).
- **(a) query-dependent weight**: ``w(q) = clip(w0 + beta * (f(q) - 0.5), 0, 1)`` with ``f`` one
  of: the dense side's confidence (the query's best normalised dense score), the lexical side's
  (its best BM25 share), their difference, and the query terms' mean idf over ``log(1 + N)``.
- **(b) dense pseudo-relevance feedback**: the searched query vector plus ``alpha`` times the
  mean searched vector of the top ``m`` hits (dense's own, or the shipped hybrid's), renormalised,
  searched again; fused with the shipped rule.
- **(c) RM3** on the lexical side (Lavrenko & Croft 2001; Abdul-Jaleel et al. 2004, as Anserini
  runs it): the top ``m`` hits' (BM25's or the hybrid's) term distributions weighted by their
  score, the 10 heaviest terms, mixed with the query's own at ``lambda``; BM25 of the weighted
  terms, its upper bound weighted alike.
- **lexical score**: :func:`flowsearch.search.scores.normalise_lexical` with and without the
  stretch (its ``match`` point swept): nDCG@10 of the hybrid, and the top-1 scores of
  the dev and nonsense queries.

Writes ``benchmarks/studies/fusion/bench_fusion_query.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent

from benchmarks.common import harness, tables  # noqa: E402
from benchmarks.common.harness import publish  # noqa: E402
from benchmarks.studies.fusion import fusion_rules as fr  # noqa: E402
from benchmarks.studies.fusion.bench_fusion import (  # noqa: E402
    GRID,
    RULES,
    loso_weights,
    paired_ci,
    ranking,
    sweep,
)
from benchmarks.studies.fusion.fusion_dump import ALL_SETS, OUT, WORK  # noqa: E402
from flowsearch.evaluation.beir import load_beir  # noqa: E402
from flowsearch.lexical.tokens import tokenize_batch  # noqa: E402
from flowsearch.search.scores import normalise_dense, normalise_lexical  # noqa: E402

LOG = logging.getLogger("bench_fusion_query")

ENCODERS = ("mean", "static")
C = 100
DEPTH = 1000
K1, B = 1.5, 0.75
BETAS = (-1.0, -0.5, 0.0, 0.5, 1.0)
FEATURES = ("dense_conf", "lex_conf", "margin", "idf")
PRF = [(src, m, a) for src in ("dense", "hybrid") for m in (3, 10) for a in (0.5, 1.0)]
RM3 = [(src, m, lam) for src in ("lexical", "hybrid") for m in (3, 10) for lam in (0.5, 0.8)]
#: ``--quick``: half of each feedback grid (the machine's other jobs permitting).
PRF_QUICK = [("dense", 3, 0.5), ("dense", 10, 1.0), ("hybrid", 3, 0.5), ("hybrid", 10, 1.0)]
RM3_QUICK = [("lexical", 10, 0.5), ("lexical", 3, 0.8), ("hybrid", 10, 0.5), ("hybrid", 3, 0.8)]
MATCHES = (None, 0.5, 0.6, 0.7, 0.8, 0.9)
PUBLISHED = ("rrf/complete", "tm2c2/complete", "tm2c2_0/complete", "dbsf/partial", "dbsf/complete")


# -- BM25 as a sparse matrix --------------------------------------------------------------------


class Lexical:
    """The corpus's lucene BM25 weights (rows x vocabulary), as the product scores them."""

    def __init__(self, texts: list[str]) -> None:
        toks = tokenize_batch(texts)
        vocab: dict[str, int] = {}
        ind, ptr = [], [0]
        for doc in toks:
            ind.extend(vocab.setdefault(t, len(vocab)) for t in doc)
            ptr.append(len(ind))
        self.vocab, self.n = vocab, len(texts)
        tf = sp.csr_matrix((np.ones(len(ind)), ind, ptr), shape=(self.n, len(vocab)))
        tf.sum_duplicates()
        length = np.diff(ptr).astype(float)
        avg = length.mean()
        df = np.bincount(tf.indices, minlength=len(vocab))
        self.idf = np.log(1 + (self.n - df + 0.5) / (df + 0.5))
        self.idf_unknown = math.log(1 + (self.n + 0.5) / 0.5)
        norm = K1 * ((1 - B) + B * length / avg)
        tfc = tf.copy()
        tfc.data = tf.data / (np.repeat(norm, np.diff(tf.indptr)) + tf.data)
        self.weights = sp.csr_matrix(tfc.multiply(self.idf[None, :]))
        rel = tf.multiply(1.0 / np.maximum(length, 1)[:, None])
        self.tf_share = sp.csr_matrix(rel)  # P(t | d)

    def queries(self, texts: list[str]) -> tuple[sp.csr_matrix, np.ndarray]:
        """(term counts (q, vocab), the unknown terms' share of each upper bound)."""
        rows, cols, unknown = [], [], np.zeros(len(texts))
        for i, q in enumerate(tokenize_batch(texts)):
            for t in q:
                if t in self.vocab:
                    rows.append(i)
                    cols.append(self.vocab[t])
                else:
                    unknown[i] += self.idf_unknown
        m = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(texts), len(self.vocab)))
        m.sum_duplicates()
        return m, unknown

    def scores(self, weights: sp.csr_matrix, unknown: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row's BM25 of weighted queries (q, n), and their upper bounds (q,)."""
        full = np.asarray((weights @ self.weights.T).todense(), np.float64)
        upper = np.asarray(weights @ self.idf).reshape(-1) + unknown
        return full, upper


# -- candidates from full score matrices --------------------------------------------------------


def top(matrix: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``depth`` per row, best first, ties by lower column."""
    part = np.argpartition(-matrix, depth, axis=1)[:, : depth + 1]
    vals = np.take_along_axis(matrix, part, 1)
    order = np.lexsort((part, -vals), axis=1)[:, :depth]
    rows = np.take_along_axis(part, order, 1)
    return np.take_along_axis(matrix, rows, 1), rows


def arrays(
    D: np.ndarray, L: np.ndarray, upper: np.ndarray, own: np.ndarray, depth: int = C
) -> dict:
    """The dump's arrays for full dense / BM25 matrices (the query's own row removed)."""
    D, L = D.copy(), L.copy()
    has = own >= 0
    D[np.flatnonzero(has), own[has]] = -np.inf
    L[np.flatnonzero(has), own[has]] = -np.inf
    ds, dr = top(D, depth)
    ls, lr = top(L, depth)
    lr = np.where(ls > 0, lr, -1)
    ls = np.where(lr >= 0, ls, -np.inf)
    q = np.arange(len(D))[:, None]
    return {
        "dense_scores": ds,
        "dense_rows": dr,
        "lex_scores": ls,
        "lex_rows": lr,
        "dense_of_lex": np.where(lr >= 0, D[q, np.maximum(lr, 0)], np.nan),
        "lex_of_dense": np.where(dr >= 0, np.maximum(L[q, dr], 0.0), np.nan),
        "q_upper": upper,
        "q_upper_known": upper,
    }


def variant(st: fr.Study, arr: dict) -> fr.Study:
    return fr.Study(
        st.name, st.encoder, {**st.arrays, **arr}, st.qids, st.doc_ids, st.relevant, st.rel_mat
    )


# -- the study ------------------------------------------------------------------------------


class SetData:
    """One (encoder, set): the dump, BM25 matrix, full score matrices."""

    def __init__(self, encoder: str, name: str, max_corpus: int) -> None:
        root = WORK / f"dev_sets_{max_corpus}"
        self.st = fr.load(OUT / encoder / f"{name}.npz", root / name, encoder)
        a = self.st.arrays
        ds = load_beir(root / name)
        self.lex = Lexical(ds.texts)
        self.qc, self.unknown = self.lex.queries([ds.queries[q] for q in self.st.qids])
        self.V, self.Zq = a["vectors"], a["q_vectors"]
        self.own = a["own"]
        self.D = self.Zq @ self.V.T
        self.L, self.upper = self.lex.scores(self.qc, self.unknown)
        self.ref = fr.reference(self.st)
        base = arrays(self.D, self.L, self.upper, self.own, DEPTH)
        self.check = {
            "lex_rows_same": float(np.mean(base["lex_rows"][:, :C] == a["lex_rows"][:, :C])),
            "lex_max_diff": float(
                np.nanmax(
                    np.abs(
                        np.where(
                            a["lex_rows"][:, :C] >= 0,
                            base["lex_scores"][:, :C] - a["lex_scores"][:, :C],
                            0,
                        )
                    )
                )
            ),
            "upper_max_rel_diff": float(
                np.max(np.abs(self.upper / np.maximum(a["q_upper"], 1e-9) - 1))
            ),
        }
        self.base = variant(self.st, base)


def cands(st: fr.Study) -> fr.Candidates:
    return fr.candidates(st, C, complete=True)


def ours(cand: fr.Candidates, ref: Any, match: float | None = None) -> tuple:
    nd = np.nan_to_num(normalise_dense(cand.d, ref))
    nl = np.nan_to_num(normalise_lexical(cand.l, cand.upper, match=match))
    return nd, nl


def ndcg_at(cand: fr.Candidates, st: fr.Study, fused: np.ndarray) -> np.ndarray:
    """Per query nDCG@10 of the fused ranking (fused descending, then lower row, as ``fuse``):
    the top 10 by partition on ``fused - row * 1e-13`` (the tie-break, below any gap between
    distinct fused scores seen here), then sorted."""
    key = np.where(cand.rows >= 0, fused - cand.rows * 1e-13, -np.inf)
    part = np.argpartition(-key, 10, axis=1)[:, :10]
    vals = np.take_along_axis(key, part, 1)
    order = np.take_along_axis(part, np.argsort(-vals, axis=1, kind="stable"), 1)
    top = np.take_along_axis(cand.rows, order, 1)
    top = np.where(np.isneginf(np.take_along_axis(key, order, 1)), -1, top)
    return fr.fast_metrics(top, st)[0]


def loso(table: dict[str, np.ndarray]) -> dict[str, int]:
    """Per set: the index (over the parameter grid) best on the other sets."""
    names = list(table)
    M = np.array([table[s] for s in names])
    return {s: int(np.argmax(np.delete(M, i, 0).mean(0))) for i, s in enumerate(names)}


def weight_grid(
    data: list[SetData],
    cand_of: dict[str, fr.Candidates],
    studies: dict[str, fr.Study],
    match: float | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, dict[float, np.ndarray]]]:
    """nDCG@10 per query at every weight of GRID with the shipped rule, per set."""
    table, per_q = {}, {}
    for d in data:
        name = d.st.name
        cand, st = cand_of[name], studies[name]
        nd, nl = ours(cand, d.ref, match)
        per_q[name] = {float(w): ndcg_at(cand, st, w * nd + (1 - w) * nl) for w in GRID}
        table[name] = np.array([per_q[name][float(w)].mean() for w in GRID])
    return table, per_q


def held_out(per_q: dict[str, list[np.ndarray]], choice: dict[str, int]) -> list[np.ndarray]:
    return [per_q[s][choice[s]] for s in per_q]


def summary(
    per_set: list[np.ndarray], shipped: list[np.ndarray], names: list[str], params: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ndcg": {s: round(float(x.mean()), 4) for s, x in zip(names, per_set, strict=True)},
        "mean": round(float(np.mean([x.mean() for x in per_set])), 4),
        "minus_shipped": paired_ci(per_set, shipped),
        "params": params,
    }


def query_features(d: SetData, cand: fr.Candidates) -> dict[str, np.ndarray]:
    nd, nl = ours(cand, d.ref)
    n_terms = np.maximum(np.asarray(d.qc.sum(1)).reshape(-1), 1)
    idf = (d.upper / n_terms) / math.log(1 + d.lex.n)
    dc = np.nanmax(np.where(cand.rows >= 0, nd, 0), 1)
    lc = np.nanmax(np.where(cand.rows >= 0, nl, 0), 1)
    return {"dense_conf": dc, "lex_conf": lc, "margin": dc - lc + 0.5, "idf": idf}


def study_encoder(
    encoder: str, max_corpus: int, published: Sequence[str] = PUBLISHED, quick: bool = False
) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = [SetData(encoder, s, max_corpus) for s in ALL_SETS]
    names = [d.st.name for d in data]
    LOG.info(
        "%s: loaded in %.0f s; checks %s",
        encoder,
        time.perf_counter() - t0,
        {d.st.name: d.check for d in data},
    )
    studies = {d.st.name: d.base for d in data}
    base_cand = {n: cands(studies[n]) for n in names}
    out: dict[str, Any] = {"checks": {d.st.name: d.check for d in data}, "variants": {}}

    # shipped and published, at leave-one-set-out weights
    table, per_w = weight_grid(data, base_cand, studies)
    choice = loso(table)
    shipped = [per_w[s][float(GRID[choice[s]])] for s in names]
    out["shipped"] = summary(shipped, shipped, names, {s: float(GRID[choice[s]]) for s in names})
    default_w = float(GRID[int(np.argmax(np.mean([table[s] for s in names], 0)))])
    out["default_weight"] = default_w
    for key in published:
        rule, kind = key.split("/")
        pc = {n: fr.candidates(studies[n], C, complete=kind == "complete") for n in names}
        sw = {n: sweep(rule, pc[n], studies[n]) for n in names}
        per_set, _ = loso_weights(sw)
        got = [
            fr.fast_metrics(ranking(rule, pc[n], studies[n], per_set[n]), studies[n])[0]
            for n in names
        ]
        out["variants"][f"published: {RULES[rule][0]}, {kind}"] = summary(
            got, shipped, names, per_set
        )
        LOG.info(
            "%s published %s %s",
            encoder,
            key,
            out["variants"][f"published: {RULES[rule][0]}, {kind}"]["mean"],
        )

    # (a) query-dependent weight
    for feat in FEATURES:
        grid = [(float(w0), b) for w0 in GRID for b in BETAS]
        per_q: dict[str, list[np.ndarray]] = {}
        tab: dict[str, np.ndarray] = {}
        for d in data:
            n = d.st.name
            cand = base_cand[n]
            nd, nl = ours(cand, d.ref)
            f = query_features(d, cand)[feat]
            per_q[n] = []
            for w0, b in grid:
                w = np.clip(w0 + b * (f - 0.5), 0, 1)[:, None]
                per_q[n].append(ndcg_at(cand, studies[n], w * nd + (1 - w) * nl))
            tab[n] = np.array([x.mean() for x in per_q[n]])
        ch = loso(tab)
        out["variants"][f"(a) weight by {feat}"] = summary(
            held_out(per_q, ch), shipped, names, {s: grid[ch[s]] for s in names}
        )
        LOG.info("%s (a) %s %s", encoder, feat, out["variants"][f"(a) weight by {feat}"]["mean"])

    # (b) dense PRF, (c) RM3: each config's weight sweep, then (config, weight) chosen LOSO
    grids = (PRF_QUICK, RM3_QUICK) if quick else (PRF, RM3)
    out["feedback_grids"] = {"(b) dense PRF": grids[0], "(c) RM3": grids[1]}
    for label, configs in (("(b) dense PRF", grids[0]), ("(c) RM3", grids[1])):
        per_q = {n: [] for n in names}
        tab_l: dict[str, list[float]] = {n: [] for n in names}
        grid_b: list[tuple] = []
        for cfg in configs:
            for d in data:
                n = d.st.name
                arr = feedback(d, base_cand[n], cfg, default_w, label.startswith("(b)"))
                st = variant(d.st, arr)
                cand = cands(st)
                nd, nl = ours(cand, d.ref)
                for w in GRID:
                    x = ndcg_at(cand, st, w * nd + (1 - w) * nl)
                    per_q[n].append(x)
                    tab_l[n].append(float(x.mean()))
            grid_b += [(*cfg, float(w)) for w in GRID]
            LOG.info("%s %s %s done", encoder, label, cfg)
        tab = {n: np.array(v) for n, v in tab_l.items()}
        ch = loso(tab)
        out["variants"][label] = summary(
            held_out(per_q, ch), shipped, names, {s: grid_b[ch[s]] for s in names}
        )
        best_all = int(np.argmax(np.mean([tab[n] for n in names], 0)))
        out["variants"][label]["best_on_all"] = [
            grid_b[best_all],
            round(float(np.mean([tab[n][best_all] for n in names])), 4),
        ]
        LOG.info("%s %s %s", encoder, label, out["variants"][label]["mean"])

    # the lexical score's transform
    out["match"] = {}
    for match in MATCHES:
        table_m, per_m = weight_grid(data, base_cand, studies, match)
        ch = loso(table_m)
        got = [per_m[s][float(GRID[ch[s]])] for s in names]
        res = summary(got, shipped, names, {s: float(GRID[ch[s]]) for s in names})
        w_all = float(GRID[int(np.argmax(np.mean([table_m[s] for s in names], 0)))])
        res["weight_on_all"] = w_all
        res["meaning"] = meaning(data, base_cand, match, w_all)
        out["match"][str(match)] = res
        LOG.info("%s match %s %s", encoder, match, res["mean"])
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def feedback(d: SetData, cand: fr.Candidates, cfg: tuple, weight: float, dense: bool) -> dict:
    """The dump's arrays after one round of feedback on the dense (PRF) or lexical (RM3) side."""
    src, m, par = cfg
    if src == "hybrid":
        nd, nl = ours(cand, d.ref)
        fb = fr.rank(weight * nd + (1 - weight) * nl, cand.rows, m)
    else:
        key = "dense_rows" if src == "dense" else "lex_rows"
        fb = d.base.arrays[key][:, :m]
    if dense:
        ok = fb >= 0
        summed = np.einsum("qm,qmd->qd", ok.astype(np.float32), d.V[np.maximum(fb, 0)])
        centroid = summed / np.maximum(ok.sum(1), 1)[:, None]
        q = d.Zq + par * centroid
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        return arrays(q @ d.V.T, d.L, d.upper, d.own)
    # RM3: the feedback rows weighted by their BM25 (normalised), P(t|d) summed, 10 terms
    q_n = len(fb)
    ok = fb >= 0
    w = np.where(ok, d.L[np.arange(q_n)[:, None], np.maximum(fb, 0)], 0.0)
    w = np.maximum(w, 0)
    w = np.where(
        w.sum(1, keepdims=True) > 0,
        w / np.maximum(w.sum(1, keepdims=True), 1e-12),
        ok / np.maximum(ok.sum(1, keepdims=True), 1),
    )
    fw = sp.csr_matrix((w[ok], (np.nonzero(ok)[0], fb[ok])), shape=(q_n, d.lex.n))
    rel = (fw @ d.lex.tf_share).toarray()
    keep = np.argpartition(-rel, 10, axis=1)[:, :10]
    rm = np.zeros_like(rel)
    np.put_along_axis(rm, keep, np.take_along_axis(rel, keep, 1), 1)
    rm /= np.maximum(rm.sum(1, keepdims=True), 1e-12)
    counts = d.qc.toarray()
    total = counts.sum(1, keepdims=True) + d.unknown[:, None] / d.lex.idf_unknown
    orig = counts / np.maximum(total, 1e-12)
    weights = par * orig + (1 - par) * rm
    unknown = par * d.unknown / np.maximum(total.reshape(-1), 1e-12)
    L, upper = d.lex.scores(sp.csr_matrix(weights), unknown)
    return arrays(d.D, L, upper, d.own)


def meaning(data: list[SetData], cand_of: dict, match: float | None, weight: float) -> dict:
    """Top-1 lexical and hybrid scores (5/50/95th percentiles) of the dev and nonsense queries,
    and what ``min_score`` keeps."""
    real: dict[str, list] = {"lexical": [], "hybrid": []}
    right: dict[str, list] = {"lexical": [], "hybrid": []}
    junk: dict[str, list] = {"lexical": [], "hybrid": []}
    for d in data:
        st, cand = d.base, cand_of[d.st.name]
        nd, nl = ours(cand, d.ref, match)
        fused = weight * nd + (1 - weight) * nl
        t = fr.rank(fused, cand.rows, 1)[:, 0]
        real["hybrid"].append(np.max(np.where(cand.rows >= 0, fused, -np.inf), 1))
        right["hybrid"].append(st.rel_mat[np.arange(len(t)), t])
        a = st.arrays
        lt = normalise_lexical(a["lex_scores"][:, :1], a["q_upper"], match=match)[:, 0]
        real["lexical"].append(np.where(a["lex_rows"][:, 0] >= 0, lt, 0.0))
        right["lexical"].append(st.rel_mat[np.arange(len(t)), a["lex_rows"][:, 0]])
        ns = np.load(OUT / st.encoder / f"{st.name}.nonsense.npz")
        da = normalise_dense(ns["dense_full"], d.ref)
        la = normalise_lexical(ns["lex_full"], ns["q_upper"], match=match)
        junk["lexical"].append(la.max(1))
        junk["hybrid"].append((weight * da + (1 - weight) * la).max(1))
    pct = lambda x: [round(float(v), 3) for v in np.percentile(x, [5, 50, 95])]  # noqa: E731
    res: dict[str, Any] = {"weight": weight}
    for mode in ("lexical", "hybrid"):
        r, ok, j = (np.concatenate(x[mode]) for x in (real, right, junk))
        res[mode] = {"dev": pct(r), "nonsense": pct(j), "thresholds": []}
        for t in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7):
            res[mode]["thresholds"].append(
                {
                    "t": t,
                    "nonsense_kept": round(float(np.mean(j >= t)), 3),
                    "dev_kept": round(float(np.mean(r >= t)), 3),
                    "right_kept": round(float(np.mean((r >= t)[ok])), 3),
                }
            )
    return res


def cost(max_corpus: int) -> dict[str, float]:
    """Median µs of one ``fuse`` call (100 + 100 candidates, complete scores), with and without
    the lexical transform, interleaved."""
    from flowsearch.search.fusion import fuse

    st = fr.load(
        OUT / "mean" / "qnli-dev.npz", WORK / f"dev_sets_{max_corpus}" / "qnli-dev", "mean"
    )
    a, ref = st.arrays, fr.reference(st)
    times: dict[str, list[float]] = {"plain": [], "match": []}
    for i in range(220):
        q = i % len(st.qids)
        args = (
            (a["dense_scores"][q : q + 1, :C], a["dense_rows"][q : q + 1, :C]),
            (a["lex_scores"][q : q + 1, :C], a["lex_rows"][q : q + 1, :C]),
            ref,
            10,
        )
        kw = {
            "upper": a["q_upper"][q : q + 1],
            "dense_of_lexical": a["dense_of_lex"][q : q + 1, :C],
            "lexical_of_dense": a["lex_of_dense"][q : q + 1, :C],
        }
        for key, match in (("plain", None), ("match", 0.8)):
            t0 = time.perf_counter()
            fuse(*args, lexical_match=match, **kw)  # type: ignore[arg-type]
            if i >= 20:
                times[key].append(time.perf_counter() - t0)
    return {k: round(float(np.median(v)) * 1e6, 1) for k, v in times.items()}


# -- report ---------------------------------------------------------------------------------


SHORT = {
    "qnli-dev": "qnli",
    "stsb-para": "stsb",
    "sick-para": "sick",
    "snli-entail": "snli",
    "sts-para": "sts12-16",
}


def summary_lines(report: dict[str, Any]) -> list[str]:
    """What the run shows, in words, every figure read from the report."""
    out = [
        "What this shows (figures from this run's JSON):",
        "",
        "- Not measurable here: the issue's goal is +0.01 nDCG@10 over every published hybrid "
        "of all-MiniLM-L6-v2 + BM25 on BEIR's SciFact-like (claims -> abstracts) and "
        "ArguAna-like (argument -> counterargument) sets; neither is available offline, and "
        "none of the five dev sets below is of either kind (all are short sentences). The "
        "figures below are what can be measured: the same rules on the dev sets of "
        "`bench_fusion.py`, every parameter chosen leave-one-set-out.",
        "- Shipped: the lexical score's stretch at match 0.7, the highest of 0.5-0.9 whose "
        "nDCG@10 is not significantly below the plain share's for either encoder (0.8 and 0.9 "
        "are, for `mean`), with the dense weights re-chosen on all five sets (`mean` 0.55 -> "
        "0.65, `static` 0.2 -> 0.3). Not shipped: the query-dependent weights, dense PRF and "
        "RM3 (see each encoder's line); the one winner, `mean`'s weight by the query terms' "
        "idf, was measured on the plain share, does nothing for `static`, and with the shipped "
        "stretch is no longer significant (below).",
    ]
    for enc, res in report["encoders"].items():
        base = res["shipped"]["mean"]
        pub = {k: v for k, v in res["variants"].items() if k.startswith("published")}
        best_pub = max(pub, key=lambda k: pub[k]["mean"]) if pub else None
        ours = {k: v for k, v in res["variants"].items() if not k.startswith("published")}
        best = max(ours, key=lambda k: ours[k]["mean"])
        d = ours[best]["minus_shipped"]
        line = (
            f"- `{enc}`: the third release's rule (plain BM25 share; the baseline of every "
            f"'minus' column) {base:.4f} mean nDCG@10; the best candidate, {best}, "
            f"{ours[best]['mean']:.4f} ({d[0]:+.4f}, 95% CI {d[1]:+.4f} to {d[2]:+.4f})"
        )
        if best_pub:
            p = pub[best_pub]["minus_shipped"]
            line += (
                f"; the best published rule, {best_pub[len('published: ') :]}, "
                f"{pub[best_pub]['mean']:.4f} ({p[0]:+.4f}, 95% CI {p[1]:+.4f} to {p[2]:+.4f})"
            )
        wins = [k for k, v in ours.items() if v["minus_shipped"][1] > 0]
        line += (
            ". Candidates whose 95% CI is above it: " + (", ".join(wins) if wins else "none") + "."
        )
        again = res.get("idf_with_stretch")
        if again:
            g = again["idf_minus_plain"]
            line += (
                f" With the lexical stretch at {again['match']} (shipped), the weight by idf gives "
                f"{again['idf_mean']:.4f} against {again['plain_mean']:.4f} for one weight "
                f"({g[0]:+.4f}, 95% CI {g[1]:+.4f} to {g[2]:+.4f}): its gain was mostly the "
                "lexical side's scale, which the stretch changes."
            )
        grids = res.get("feedback_grids")
        if grids:
            line += f" Feedback grids (source, m, alpha or lambda): {json.dumps(grids)}."
        out.append(line)
    return out


def render(report: dict[str, Any]) -> str:
    sets = list(SHORT)
    lines = ["## Past the published hybrids? (`bench_fusion_query.py`, issue 32)", ""]
    lines += [*summary_lines(report), ""]
    for enc, res in report["encoders"].items():
        lines += [
            f"`{enc}`: nDCG@10 on each set with every parameter (the fusion weight "
            "included) chosen on the other four sets; last column: mean over the sets "
            "minus the shipped rule's, with its 95% CI (queries resampled within each set, "
            "paired):",
            "",
        ]
        lines += tables.head(
            ["rule", *(SHORT[s] for s in sets), "mean", "minus third release"],
            "l" + "r" * (len(sets) + 2),
        )
        rows = [
            ("third release: background + BM25 share", res["shipped"]),
            *res["variants"].items(),
        ]
        for label, v in rows:
            d = v["minus_shipped"]
            gap = (
                "-"
                if label.startswith("third release")
                else f"{d[0]:+.4f} ({d[1]:+.4f} to {d[2]:+.4f})"
            )
            lines.append(
                tables.row([label, *(f"{v['ndcg'][s]:.4f}" for s in sets), f"{v['mean']:.4f}", gap])
            )
        lines.append("")
        lines += [
            f"`{enc}`, the lexical score's stretch (`match`: the score of a row "
            "holding every query term once at the corpus's average length; None: the BM25 "
            "share itself, the third release's score):",
            "",
            "| match | mean nDCG@10 (LOSO weight) | minus third release | weight on all sets "
            "| lexical top-1, dev 5/50/95% | lexical top-1, nonsense 95% "
            "| hybrid top-1, dev 5/50/95% | hybrid top-1, nonsense 50/95% |",
            "|---|---:|---|---:|---|---:|---|---|",
        ]
        for m, v in res["match"].items():
            mn, d = v["meaning"], v["minus_shipped"]
            lex_dev = " / ".join(f"{x:.3f}" for x in mn["lexical"]["dev"])
            lines.append(
                f"| {m} | {v['mean']:.4f} | {d[0]:+.4f} ({d[1]:+.4f} to {d[2]:+.4f}) "
                f"| {v['weight_on_all']:.2f} | {lex_dev} "
                f"| {mn['lexical']['nonsense'][2]:.3f} "
                f"| {' / '.join(f'{x:.3f}' for x in mn['hybrid']['dev'])} "
                f"| {mn['hybrid']['nonsense'][1]:.3f} / {mn['hybrid']['nonsense'][2]:.3f} |"
            )
        lines.append("")
    lines.append(
        f"Checks: the study's BM25 (sparse matrix, product tokeniser) against the dumps: "
        f"{json.dumps(report['checks'])}. Cost: {json.dumps(report.get('cost'))}. Runs (load "
        f"average at the start and end, 2 shared cores): {json.dumps(report.get('runs'))}."
    )
    static = HERE / "bench_fusion_query_static.md"
    if "static" not in report["encoders"] and static.is_file():
        lines += ["", static.read_text().rstrip()]
    lines += [
        "",
        "Commands: `python -m benchmarks run fusion_dump "
        "--data ../shared/data`, then `python -m benchmarks run fusion_query`.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-corpus", type=int, default=6000)
    parser.add_argument("--encoders", default=",".join(ENCODERS))
    parser.add_argument("--out", default=str(HERE / "bench_fusion_query"))
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--published", default=",".join(PUBLISHED), help="rule/scores, ...")
    parser.add_argument("--quick", action="store_true", help="half the feedback grids")
    parser.add_argument(
        "--merge", action="store_true", help="add these encoders to the stored report"
    )
    args = parser.parse_args(argv)
    if args.report_only:
        publish(args.out, render, None)
        return 0
    started, load = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    stored = Path(args.out + ".json")
    report: dict[str, Any] = {"encoders": {}, "checks": {}, "runs": []}
    if args.merge and stored.is_file():
        report = json.loads(stored.read_text())
        old = {k: report.pop(k, None) for k in ("load_average_start", "load_average_end")}
        report.setdefault(
            "runs",
            [
                {
                    "encoders": ",".join(report["encoders"]),
                    "load_average": list(old.values()),
                    "seconds": report.pop("seconds", None),
                }
            ],
        )
    for enc in args.encoders.split(","):
        got = study_encoder(enc, args.max_corpus, args.published.split(","), args.quick)
        report["checks"][enc] = got.pop("checks")
        report["encoders"][enc] = got
    report["cost"] = cost(args.max_corpus)
    report["runs"].append(
        {
            "encoders": args.encoders,
            "load_average": [load, [round(x, 2) for x in os.getloadavg()]],
            "seconds": round(time.perf_counter() - started, 1),
        }
    )
    publish(args.out, render, report)
    return 0


if __name__ == "__main__":
    harness.script(main)
