r"""Issue 24: which hybrid fusion rule, and what ``Hit.score`` means (the study and its table).

Usage::

    python -m benchmarks run fusion_dump --data ../shared/data
    python -m benchmarks run fusion [--report-only]

``fusion_dump.py`` builds every (encoder, dev set) index with the shipped defaults and dumps the
candidates (see its docstring); this script evaluates every rule on the dumps in numpy
(:mod:`fusion_rules`) and writes ``benchmarks/studies/fusion/bench_fusion.json`` and ``.md``
section.

Method. Each query fuses the union of both sides' top 100 (what the Searcher fuses), "partial"
(each side's score only for the rows it returned) or "complete" (both sides' score of every
union row). A weighted rule's dense weight is swept over 0, 0.05, ..., 1; the weight reported
for a set is chosen on the *other* sets (leave-one-set-out: the mean nDCG@10 over the four
others, per encoder), so no figure is tuned on the set it reports. The shipped default weight
per encoder kind is the best mean over all five sets. nDCG@10 and recall@100 of every reported
cell are computed by pytrec_eval (and checked equal to the sweep's numpy figures); the shipped
rule's ranking is re-run through :func:`flowsearch.search.fusion.fuse` on every query and
checked equal to the study's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent

from benchmarks.common.harness import publish  # noqa: E402
from benchmarks.common.published_fusion import minmax_fusion  # noqa: E402
from benchmarks.studies.fusion import fusion_rules as fr  # noqa: E402
from benchmarks.studies.fusion.fusion_dump import ALL_SETS, OUT, WORK  # noqa: E402
from benchmarks.studies.fusion.fusion_report import render  # noqa: E402

LOG = logging.getLogger("bench_fusion")

#: Encoders studied and the kind that picks their default weight.
ENCODERS = {"mean": "transformer", "static": "static"}
GRID = np.round(np.arange(0.0, 1.0001, 0.05), 2)
#: Candidates per side (the Searcher's).
C = 100
#: Deeper candidate lists tried for the shipped rule.
DEPTHS = (300, 1000)
Sides = tuple[np.ndarray, np.ndarray]


def _pct1(c: fr.Candidates, st: fr.Study) -> Sides:
    return fr.percentile_scores(c, st, 1)


def _pct10(c: fr.Candidates, st: fr.Study) -> Sides:
    return fr.percentile_scores(c, st, 10)


def _ours(c: fr.Candidates, st: fr.Study) -> Sides:
    return fr.reference_scores(c, fr.reference(st))


#: rule key -> (label, the per-side normalisation; None for RRF, which fuses ranks)
RULES: dict[str, tuple[str, Callable[[fr.Candidates, fr.Study], Sides] | None]] = {
    "minmax": ("min-max (second release)", lambda c, st: fr.side_scores(c, "minmax")),
    "tm2c2": ("TM2C2, dense bound -1", lambda c, st: fr.side_scores(c, "tm2c2", -1.0)),
    "tm2c2_0": ("TM2C2, dense bound 0", lambda c, st: fr.side_scores(c, "tm2c2", 0.0)),
    "zscore": ("z-score", lambda c, st: fr.side_scores(c, "zscore")),
    "dbsf": ("DBSF (mean ± 3 sd)", lambda c, st: fr.side_scores(c, "dbsf")),
    "rrf": ("RRF (k=60)", None),
    "pct1": ("percentile vs held-out rows' best neighbour", _pct1),
    "pct10": ("percentile vs held-out rows' top-10", _pct10),
    "ours": ("background + BM25 share (shipped)", _ours),
}  # fmt: skip
SHIPPED = "ours"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def studies(encoder: str, max_corpus: int) -> list[fr.Study]:
    root = WORK / f"dev_sets_{max_corpus}"
    return [fr.load(OUT / encoder / f"{s}.npz", root / s, encoder) for s in ALL_SETS]


def ranking(rule: str, cand: fr.Candidates, st: fr.Study, weight: float) -> np.ndarray:
    """The rule's top 100 rows (q, 100) at ``weight``."""
    fn = RULES[rule][1]
    if fn is None:
        return fr.rank(fr.rrf_scores(cand), cand.rows)
    nd, nl = fn(cand, st)
    return fr.rank(weight * nd + (1 - weight) * nl, cand.rows)


def sweep(rule: str, cand: fr.Candidates, st: fr.Study) -> dict[str, list[float]]:
    """Mean nDCG@10 and recall@100 at every weight of :data:`GRID` (one value for RRF)."""
    fn = RULES[rule][1]
    weights = [0.0] if fn is None else GRID
    sides = None if fn is None else fn(cand, st)
    ndcg, recall = [], []
    for w in weights:
        if sides is None:
            top = fr.rank(fr.rrf_scores(cand), cand.rows)
        else:
            top = fr.rank(w * sides[0] + (1 - w) * sides[1], cand.rows)
        n, r = fr.fast_metrics(top, st)
        ndcg.append(round(float(n.mean()), 6))
        recall.append(round(float(r.mean()), 6))
    return {"ndcg": ndcg, "recall": recall}


def loso_weights(sweeps: dict[str, dict[str, list[float]]]) -> tuple[dict[str, float], float]:
    """Per set: the weight with the best mean nDCG@10 over the other sets; and over all sets."""
    names = list(sweeps)
    M = np.array([sweeps[s]["ndcg"] for s in names])
    if M.shape[1] == 1:
        return {s: 0.0 for s in names}, 0.0
    out = {s: float(GRID[np.argmax(np.delete(M, i, 0).mean(0))]) for i, s in enumerate(names)}
    return out, float(GRID[np.argmax(M.mean(0))])


def library_check(st: fr.Study, cand: fr.Candidates, weight: float, kind: str) -> float:
    """Share of queries whose top 100 from :func:`flowsearch.search.fusion.fuse` (complete
    scores, the candidates as the Searcher would pass them) equals the study's ranking."""
    from flowsearch.search.fusion import fuse

    a = st.arrays
    dense = (a["dense_scores"][:, :C], a["dense_rows"][:, :C])
    lexical = (a["lex_scores"][:, :C], a["lex_rows"][:, :C])
    out = fuse(dense, lexical, fr.reference(st), 100, upper=a["q_upper"], kind=kind,  # type: ignore[arg-type]
               weight=weight, dense_of_lexical=a["dense_of_lex"][:, :C],
               lexical_of_dense=a["lex_of_dense"][:, :C])  # fmt: skip
    mine = ranking(SHIPPED, cand, st, weight)
    return float(np.mean(np.all(out.rows == mine, axis=1)))


def cost(st: fr.Study, weight: float, kind: str, queries: int = 200) -> dict[str, float]:
    """Median wall time of one single-query call: ``fuse`` (complete scores, 100 + 100
    candidates) and the second release's ``convex`` on the same candidates, interleaved in one
    run after a warm-up, and their ratio."""
    from flowsearch.search.fusion import fuse

    a, ref = st.arrays, fr.reference(st)
    times: dict[str, list[float]] = {"fuse": [], "convex": []}
    for i in range(min(queries, len(st.qids)) + 20):
        q = i % len(st.qids)
        dense = (a["dense_scores"][q : q + 1, :C], a["dense_rows"][q : q + 1, :C])
        lexical = (a["lex_scores"][q : q + 1, :C], a["lex_rows"][q : q + 1, :C])
        t0 = time.perf_counter()
        fuse(dense, lexical, ref, 10, upper=a["q_upper"][q : q + 1], kind=kind,  # type: ignore[arg-type]
             dense_of_lexical=a["dense_of_lex"][q : q + 1, :C],
             lexical_of_dense=a["lex_of_dense"][q : q + 1, :C])  # fmt: skip
        t1 = time.perf_counter()
        minmax_fusion(dense, lexical, 10, weight)
        t2 = time.perf_counter()
        if i >= 20:  # warm-up
            times["fuse"].append(t1 - t0)
            times["convex"].append(t2 - t1)
    f, c = (float(np.median(times[k])) * 1e6 for k in ("fuse", "convex"))
    return {"fuse_us": round(f, 1), "convex_us": round(c, 1), "ratio": round(f / c, 3)}


def evaluate(encoder: str, kind: str, max_corpus: int) -> dict[str, Any]:
    """Every rule's sweep, its leave-one-set-out cells (pytrec_eval) and the library check."""
    sets = studies(encoder, max_corpus)
    cands = {(st.name, comp): fr.candidates(st, C, complete=comp)
             for st in sets for comp in (False, True)}  # fmt: skip
    alone = {}
    for st in sets:
        alone[st.name] = {side: fr.trec_metrics(fr.side_alone(st, side), st)
                          for side in ("dense", "lex")}  # fmt: skip
    sweeps: dict[str, dict[str, dict[str, list[float]]]] = {}
    cells: dict[str, dict[str, dict[str, float]]] = {}
    weights: dict[str, Any] = {}
    per_query: dict[str, list[np.ndarray]] = {}
    for rule in RULES:
        for comp in (False, True):
            key = f"{rule}/{'complete' if comp else 'partial'}"
            sweeps[key] = {st.name: sweep(rule, cands[st.name, comp], st) for st in sets}
            per_set, overall = loso_weights(sweeps[key])
            weights[key] = {"loso": per_set, "all": overall}
            cells[key], per_query[key] = {}, []
            for st in sets:
                top = ranking(rule, cands[st.name, comp], st, per_set[st.name])
                got = fr.trec_metrics(top, st)
                fast = fr.fast_metrics(top, st)
                per_query[key].append(fast[0])
                assert abs(got["ndcg@10"] - fast[0].mean()) < 1e-9, (key, st.name)
                assert abs(got["recall@100"] - fast[1].mean()) < 1e-9, (key, st.name)
                cells[key][st.name] = {"weight": per_set[st.name], **got}
            LOG.info("%s %s %s", encoder, key, {s: round(v["ndcg@10"], 4)
                                                for s, v in cells[key].items()})  # fmt: skip
    default = weights[f"{SHIPPED}/complete"]["all"]
    check = {st.name: library_check(st, cands[st.name, True], default, kind) for st in sets}
    depth = {}
    for c in DEPTHS:  # the shipped rule with deeper candidate lists
        deep = {st.name: fr.candidates(st, c, complete=True) for st in sets}
        sw = {st.name: sweep(SHIPPED, deep[st.name], st) for st in sets}
        per_set, _ = loso_weights(sw)
        depth[str(c)] = {
            st.name: fr.trec_metrics(ranking(SHIPPED, deep[st.name], st, per_set[st.name]), st)
            for st in sets
        }
    shipped = per_query[f"{SHIPPED}/complete"]
    gaps = {key: paired_ci(shipped, other) for key, other in per_query.items()}
    return {"kind": kind, "alone": alone, "sweeps": sweeps, "cells": cells, "weights": weights,
            "default_weight": default, "library_check": check, "shipped_minus": gaps,
            "cost": cost(sets[0], default, kind), "depth": depth,
            "meaning": meaning(sets, cands, default)}  # fmt: skip


def paired_ci(a: list[np.ndarray], b: list[np.ndarray], draws: int = 2000) -> list[float]:
    """Mean over the sets of the per-query nDCG@10 difference ``a - b``, and its 95% interval
    (queries resampled within each set, paired)."""
    rng = np.random.default_rng(0)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    means = np.zeros(draws)
    for d in diffs:
        means += d[rng.integers(len(d), size=(draws, len(d)))].mean(axis=1)
    means /= len(diffs)
    point = float(np.mean([d.mean() for d in diffs]))
    return [round(point, 4), *(round(float(x), 4) for x in np.percentile(means, [2.5, 97.5]))]


def meaning(sets: list[fr.Study], cands: dict, weight: float) -> dict[str, Any]:
    """What the shipped scores say: each mode's top-1 score for the real queries (and whether
    that hit is relevant) and for the nonsense queries, pooled over the sets."""
    from flowsearch.search.scores import normalise_dense, normalise_lexical

    real: dict[str, list[np.ndarray]] = {"dense": [], "lexical": [], "hybrid": []}
    right: dict[str, list[np.ndarray]] = {"dense": [], "lexical": [], "hybrid": []}
    nonsense: dict[str, list[np.ndarray]] = {"dense": [], "lexical": [], "hybrid": [],
                                             "hybrid (min-max, second release)": []}  # fmt: skip
    names: list[np.ndarray] = []
    for st in sets:
        names.append(np.full(len(st.qids), st.name))
        a, ref, cand = st.arrays, fr.reference(st), cands[st.name, True]
        nd, nl = fr.reference_scores(cand, ref)
        fused = weight * nd + (1 - weight) * nl
        top = fr.rank(fused, cand.rows, 1)[:, 0]
        pos = np.argmax(np.where(cand.rows >= 0, fused, -np.inf), axis=1)
        real["hybrid"].append(fused[np.arange(len(pos)), pos])
        right["hybrid"].append(st.rel_mat[np.arange(len(top)), top])
        real["dense"].append(normalise_dense(a["dense_scores"][:, 0], ref))
        right["dense"].append(st.rel_mat[np.arange(len(top)), a["dense_rows"][:, 0]])
        lex_top = normalise_lexical(a["lex_scores"][:, :1], a["q_upper"])[:, 0]
        real["lexical"].append(np.where(a["lex_rows"][:, 0] >= 0, lex_top, 0.0))
        # row -1 (no lexical hit) reads rel_mat's last column, which is never relevant
        right["lexical"].append(st.rel_mat[np.arange(len(top)), a["lex_rows"][:, 0]])
        ns = np.load(OUT / st.encoder / f"{st.name}.nonsense.npz")
        d_all = normalise_dense(ns["dense_full"], ref)
        l_all = normalise_lexical(ns["lex_full"], ns["q_upper"])
        nonsense["dense"].append(d_all.max(1))
        nonsense["lexical"].append(l_all.max(1))
        nonsense["hybrid"].append((weight * d_all + (1 - weight) * l_all).max(1))
        nonsense["hybrid (min-max, second release)"].append(
            old_top(ns["dense_full"], ns["lex_full"], 0.6 if st.encoder == "mean" else 0.3)
        )
    cat = lambda d: {k: np.concatenate(v) for k, v in d.items()}  # noqa: E731
    return summarise(cat(real), cat(right), cat(nonsense), np.concatenate(names))


def old_top(dense: np.ndarray, lex: np.ndarray, weight: float) -> np.ndarray:
    """The second release's hybrid top score (per-query min-max over each side's top 100)."""

    order_d = np.argsort(-dense, axis=1, kind="stable")[:, :C]
    order_l = np.argsort(-lex, axis=1, kind="stable")[:, :C]
    lex_s = np.take_along_axis(lex, order_l, 1)
    lex_rows = np.where(lex_s > 0, order_l, -1)  # BM25 returns rows sharing a term only
    ranked_dense = (np.take_along_axis(dense, order_d, 1), order_d)
    out = minmax_fusion(ranked_dense, (lex_s, lex_rows), 1, weight)
    return out.scores[:, 0]


def _share(flags: np.ndarray) -> float | None:
    return round(float(np.mean(flags)), 4) if len(flags) else None


THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def summarise(real: dict, right: dict, nonsense: dict, names: np.ndarray) -> dict[str, Any]:
    pct = lambda x: [round(float(v), 4) for v in np.percentile(x, [5, 50, 95])]  # noqa: E731
    out: dict[str, Any] = {"nonsense": {m: pct(v) for m, v in nonsense.items()},
                           "real": {m: pct(v) for m, v in real.items()},
                           "queries": int(len(real["hybrid"])),
                           "nonsense_queries": int(len(nonsense["hybrid"])),
                           "thresholds": {}}  # fmt: skip
    for mode in ("dense", "lexical", "hybrid"):
        rows = []
        for t in THRESHOLDS:
            keep = real[mode] >= t
            rows.append({
                "t": t,
                "nonsense_kept": round(float(np.mean(nonsense[mode] >= t)), 4),
                "queries_kept": round(float(np.mean(keep)), 4),
                "right_kept": _share(keep[right[mode]]),
                "precision": _share(right[mode][keep]),
            })  # fmt: skip
        out["thresholds"][mode] = rows
    bins = np.array([0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 1.01])
    which = np.digitize(real["hybrid"], bins) - 1
    out["reliability_bins"] = [float(b) for b in bins[:-1]] + [1.0]
    # per set: how relevance labels are drawn differs (SICK holds near-identical sentences of
    # which one is labelled), so pooled bins would mix the sets' shares
    out["reliability"] = {
        name: [[int(np.sum(mine & (which == b))), _share(right["hybrid"][mine & (which == b)])]
               for b in range(len(bins) - 1)]
        for name in dict.fromkeys(names.tolist())
        for mine in [names == name]
    }  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-corpus", type=int, default=6000)
    parser.add_argument("--out", default=str(HERE / "bench_fusion"))
    parser.add_argument("--report-only", action="store_true", help="re-render the .md")
    args = parser.parse_args(argv)
    if args.report_only:
        publish(args.out, render, None)
        return 0
    started, load_start = time.perf_counter(), load_average()
    dump = json.loads((OUT / "dump.json").read_text())
    report: dict[str, Any] = {"sets": {}, "dump": dump, "grid": GRID.tolist(), "candidates": C,
                              "encoders": {}, "load_average_start": load_start}  # fmt: skip
    for encoder, kind in ENCODERS.items():
        report["encoders"][encoder] = evaluate(encoder, kind, args.max_corpus)
    root = WORK / f"dev_sets_{args.max_corpus}"
    for name in ALL_SETS:
        report["sets"][name] = json.loads((root / name / "dataset.json").read_text())
    report["labels"] = {k: v[0] for k, v in RULES.items()}
    report["shipped"] = SHIPPED
    report["load_average_end"] = load_average()
    report["seconds"] = round(time.perf_counter() - started, 1)
    publish(args.out, render, report)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")  # fmt: skip
    sys.exit(main())
