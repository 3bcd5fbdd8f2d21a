"""STS, QNLI and retrieval evaluation: loaders, metrics, a vector cache, the ``eval`` entry points.

``run_sts`` / ``run_qnli`` / ``run_retrieval`` are what ``flowsearch eval`` calls;
:class:`EvalSession` is what the benchmarks use to sweep calibration settings over one encoding.
Retrieval metrics (nDCG, recall, MRR) are pytrec_eval's (:mod:`.ranking_metrics`); Spearman and
AUC are scipy's (:mod:`.metrics`).

Layer: beside ``cli`` and ``server``; it may import every package below (encoder, calibration,
storage, search, writes), and nothing imports it but the command line and the benchmarks.
"""

from __future__ import annotations

from flowsearch.evaluation.beir import BeirDataset, load_beir, write_beir
from flowsearch.evaluation.cache import VectorCache, default_cache_dir
from flowsearch.evaluation.datasets import (
    PairSet,
    load_qnli,
    load_sick,
    load_snli_sentences,
    load_sts_year,
    load_stsb,
    resolve_data_dir,
)
from flowsearch.evaluation.metrics import auc100, cosine_pairs, spearman100, sts_correlations
from flowsearch.evaluation.ranking_metrics import (
    mrr_at_k,
    ndcg_at_k,
    recall_at_k,
    retrieval_scores,
)
from flowsearch.evaluation.retrieval import run_retrieval, run_retrieval_suite, search_run
from flowsearch.evaluation.runner import parse_tasks, run_qnli, run_sts
from flowsearch.evaluation.session import CALIBRATIONS, STS_TASKS, EvalSession, load_task

__all__ = [
    "CALIBRATIONS",
    "BeirDataset",
    "STS_TASKS",
    "EvalSession",
    "PairSet",
    "VectorCache",
    "auc100",
    "cosine_pairs",
    "default_cache_dir",
    "load_beir",
    "load_qnli",
    "load_sick",
    "load_snli_sentences",
    "load_sts_year",
    "load_stsb",
    "load_task",
    "mrr_at_k",
    "ndcg_at_k",
    "parse_tasks",
    "recall_at_k",
    "retrieval_scores",
    "resolve_data_dir",
    "run_qnli",
    "run_retrieval",
    "run_retrieval_suite",
    "run_sts",
    "search_run",
    "spearman100",
    "sts_correlations",
    "write_beir",
]
