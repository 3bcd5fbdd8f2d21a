r"""Ranking metrics as BEIR reports them, computed by pytrec_eval (trec_eval's own code).

BEIR (Thakur et al. 2021) and MTEB score retrieval with pytrec_eval (Van Gysel & de Rijke 2018);
these functions call it too, so a figure here is theirs for the same run:

- nDCG@k is trec_eval's ``ndcg_cut_k``: gain = the qrels grade, discount ``log2(rank + 1)``, the
  ideal ranking made from every judgement of the query, including passages the corpus lacks
  (they are unreachable, and count against the run, as in BEIR).
- recall@k is ``recall_k``: relevant (grade >= 1) passages in the top k over all relevant ones.
- MRR@k is ``recip_rank`` of the run cut at its top k (BEIR's ``mrr``). trec_eval ranks a run by
  score descending, ties by document id descending, whatever order the retriever returned; the
  cut follows that order (:func:`ranked_ids`).
- A query is scored when it is in both the qrels and the run (an empty run entry scores 0);
  means are over those queries, as BEIR averages pytrec_eval's output.

Example:
    >>> qrels = {"q1": {"d1": 2, "d2": 1}}
    >>> run = {"q1": {"d2": 0.9, "d1": 0.8, "d3": 0.1}}
    >>> round(ndcg_at_k(qrels, run, 10)["q1"], 4), mrr_at_k(qrels, run, 10)["q1"]
    (0.8597, 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flowsearch.errors import BadInput

__all__ = [
    "Qrels",
    "Run",
    "drop_identical_ids",
    "mrr_at_k",
    "ndcg_at_k",
    "ranked_ids",
    "recall_at_k",
    "retrieval_scores",
]

#: query id -> {corpus id: grade}; a grade <= 0 means judged not relevant.
Qrels = Mapping[str, Mapping[str, int]]
#: query id -> {corpus id: score}; a higher score ranks first.
Run = Mapping[str, Mapping[str, float]]


def ranked_ids(scores: Mapping[str, float], k: int | None = None) -> list[str]:
    """Document ids of one query's run in trec_eval's order: score descending, then id descending.

    Args:
        scores: doc id -> score.
        k: keep the first ``k`` (all when None).
    """
    if not scores:
        return []
    ids = np.array(list(scores.keys()), dtype=str)
    values = np.fromiter(scores.values(), dtype=np.float64, count=len(scores))
    # lexsort's last key is the primary one; ascending by (score, id) reversed is both descending.
    order = np.lexsort((ids, values))[::-1]
    return [str(d) for d in ids[order[:k]]]


def _evaluate(qrels: Qrels, run: Run, measures: set[str]) -> dict[str, dict[str, float]]:
    """pytrec_eval's per-query figures (``{qid: {"ndcg_cut_10": ...}}``) of ``measures``."""
    import pytrec_eval

    judged = {q: {d: int(g) for d, g in docs.items()} for q, docs in qrels.items()}
    scored = {q: {str(d): float(s) for d, s in docs.items()} for q, docs in run.items()}
    out: dict[str, dict[str, float]] = pytrec_eval.RelevanceEvaluator(judged, measures).evaluate(
        scored
    )
    return out


def _per_query(qrels: Qrels, run: Run, measure: str, name: str) -> dict[str, float]:
    """``{qid: value}`` of one pytrec_eval measure, in the run's query order."""
    got = _evaluate(qrels, run, {measure})
    return {q: got[q][name] for q in run if q in got}


def _cut(run: Run, k: int) -> dict[str, dict[str, float]]:
    """The run with each query's top ``k`` only, in trec_eval's order (for MRR@k)."""
    return {q: {d: docs[d] for d in ranked_ids(docs, k)} for q, docs in run.items()}


def ndcg_at_k(qrels: Qrels, run: Run, k: int = 10) -> dict[str, float]:
    """nDCG@k per scored query with graded gains (trec_eval's ``ndcg_cut_k``), each in [0, 1]."""
    return _per_query(qrels, run, f"ndcg_cut.{k}", f"ndcg_cut_{k}")


def recall_at_k(qrels: Qrels, run: Run, k: int = 100) -> dict[str, float]:
    """Recall@k per scored query: relevant (grade >= 1) docs in the top k over all relevant."""
    return _per_query(qrels, run, f"recall.{k}", f"recall_{k}")


def mrr_at_k(qrels: Qrels, run: Run, k: int = 10) -> dict[str, float]:
    """Reciprocal rank of the first relevant (grade >= 1) doc within the top k, per query."""
    return _per_query(qrels, _cut(run, k), "recip_rank", "recip_rank")


def drop_identical_ids(run: Run) -> dict[str, dict[str, float]]:
    """The run without any document whose id equals its query's id.

    The protocol of argument-retrieval sets (BEIR's ``ignore_identical_ids``), where every query
    is also a passage of the corpus and would otherwise find itself first.
    """
    return {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}


def retrieval_scores(
    qrels: Qrels,
    run: Run,
    *,
    ndcg_k: int = 10,
    recall_k: int = 100,
    mrr_k: int = 10,
    ignore_identical_ids: bool = False,
) -> dict[str, float]:
    """Mean nDCG@10, recall@100 and MRR@10 over the scored queries (see the module docstring).

    Args:
        qrels: query id -> {corpus id: grade}.
        run: query id -> {corpus id: score}.
        ndcg_k, recall_k, mrr_k: the cut-offs (they name the keys).
        ignore_identical_ids: drop every retrieved document whose id is its query's.

    Returns:
        ``{"ndcg@10", "recall@100", "mrr@10", "queries"}`` (names follow the cut-offs):
        means over the scored queries, and how many were scored.

    Raises:
        BadInput: no query of the run is judged.
    """
    if ignore_identical_ids:
        run = drop_identical_ids(run)
    ranked = _evaluate(qrels, run, {f"ndcg_cut.{ndcg_k}", f"recall.{recall_k}"})
    if not ranked:
        raise BadInput(
            "no query of the run has qrels",
            fix="check the run's query ids are the qrels' (query-id column)",
        )
    firsts = _evaluate(qrels, _cut(run, mrr_k), {"recip_rank"})
    means = {
        f"ndcg@{ndcg_k}": np.mean([v[f"ndcg_cut_{ndcg_k}"] for v in ranked.values()]),
        f"recall@{recall_k}": np.mean([v[f"recall_{recall_k}"] for v in ranked.values()]),
        f"mrr@{mrr_k}": np.mean([v["recip_rank"] for v in firsts.values()]),
    }
    out = {name: float(value) for name, value in means.items()}
    out["queries"] = len(ranked)
    return out
