r"""Retrieval quality the way BEIR reports it: metrics, and ``flowsearch eval retrieval``.

Metrics follow trec_eval, which BEIR calls through pytrec_eval (Thakur et al. 2021; Van Gysel &
de Rijke 2018), and match ``pytrec_eval`` to 1e-9 (tests/test_retrieval.py):

- A run is ranked by score descending, ties broken by document id *descending* (trec_eval's
  order, whatever order the retriever returned them in).
- nDCG@k (``ndcg_cut_k``): gain = the qrels grade (linear, negative grades count 0), discount
  ``log2(rank + 1)``; the ideal ranking is the query's judged grades sorted, cut at k.
- recall@k (``recall_k``): relevant (grade >= 1) documents in the top k over all relevant ones.
- MRR@k: ``recip_rank`` of the run cut at its top k in the order above (BEIR's ``mrr``).
- A query is scored when it is in both the qrels and the run (an empty run entry scores 0);
  the mean is over those queries, as BEIR averages pytrec_eval's output.

:func:`run_retrieval` runs the product path end to end: the corpus is written to Parquet,
indexed with :func:`flowsearch.build_index`, and every query is answered by
:meth:`flowsearch.Searcher.search`.

Example:
    >>> qrels = {"q1": {"d1": 2, "d2": 1}}
    >>> run = {"q1": {"d2": 0.9, "d1": 0.8, "d3": 0.1}}
    >>> round(ndcg_at_k(qrels, run, 10)["q1"], 4), mrr_at_k(qrels, run, 10)["q1"]
    (0.8597, 1.0)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from flowsearch.errors import FlowsearchError
from flowsearch.evaluation.beir import BeirDataset, load_beir

__all__ = [
    "MODES",
    "Mode",
    "drop_identical_ids",
    "mrr_at_k",
    "ndcg_at_k",
    "ranked_ids",
    "recall_at_k",
    "retrieval_scores",
    "run_retrieval",
    "search_run",
    "write_corpus_parquet",
]

LOG = logging.getLogger(__name__)

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]
Mode = Literal["dense", "lexical", "hybrid"]
MODES: tuple[str, ...] = ("dense", "lexical", "hybrid")


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
    return ids[order[:k]].tolist()


def _scored(qrels: Qrels, run: Run) -> list[str]:
    """The queries trec_eval scores: judged and present in the run, in the run's order."""
    return [q for q in run if q in qrels]


def _grades(ranked: list[str], judged: Mapping[str, int]) -> np.ndarray:
    """float64 grade of each ranked document (0 when unjudged)."""
    return np.array([judged.get(d, 0) for d in ranked], dtype=np.float64)


def ndcg_at_k(qrels: Qrels, run: Run, k: int = 10) -> dict[str, float]:
    r"""nDCG@k per query with graded gains (trec_eval's ``ndcg_cut_k``, BEIR's NDCG@k).

    Args:
        qrels: query id -> {doc id: grade}.
        run: query id -> {doc id: score}.
        k: rank cut-off.

    Returns:
        query id -> nDCG@k in [0, 1]; 0 for a query with no positive grade.
    """
    out: dict[str, float] = {}
    discount = 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))
    for qid in _scored(qrels, run):
        gains = np.maximum(_grades(ranked_ids(run[qid], k), qrels[qid]), 0.0)
        ideal = np.sort(np.maximum(np.fromiter(qrels[qid].values(), np.float64), 0.0))[::-1][:k]
        idcg = float(ideal @ discount[: len(ideal)])
        dcg = float(gains @ discount[: len(gains)])
        out[qid] = dcg / idcg if idcg > 0 else 0.0
    return out


def recall_at_k(qrels: Qrels, run: Run, k: int = 100) -> dict[str, float]:
    """Recall@k per query: relevant (grade >= 1) docs in the top k over all relevant (0 if none)."""
    out: dict[str, float] = {}
    for qid in _scored(qrels, run):
        n_rel = sum(g >= 1 for g in qrels[qid].values())
        found = int((_grades(ranked_ids(run[qid], k), qrels[qid]) >= 1).sum())
        out[qid] = found / n_rel if n_rel else 0.0
    return out


def mrr_at_k(qrels: Qrels, run: Run, k: int = 10) -> dict[str, float]:
    """Reciprocal rank of the first relevant (grade >= 1) doc within the top k, per query."""
    out: dict[str, float] = {}
    for qid in _scored(qrels, run):
        hits = np.flatnonzero(_grades(ranked_ids(run[qid], k), qrels[qid]) >= 1)
        out[qid] = 1.0 / float(hits[0] + 1) if hits.size else 0.0
    return out


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

    Returns:
        ``{"ndcg@10", "recall@100", "mrr@10", "queries"}`` (names follow the cut-offs).

    Raises:
        FlowsearchError: no query of the run is judged.
    """
    if ignore_identical_ids:
        run = drop_identical_ids(run)
    scored = _scored(qrels, run)
    if not scored:
        raise FlowsearchError("no query of the run has qrels; check the query ids match")
    per_metric = {
        f"ndcg@{ndcg_k}": ndcg_at_k(qrels, run, ndcg_k),
        f"recall@{recall_k}": recall_at_k(qrels, run, recall_k),
        f"mrr@{mrr_k}": mrr_at_k(qrels, run, mrr_k),
    }
    out = {name: float(np.mean(list(vals.values()))) for name, vals in per_metric.items()}
    out["queries"] = len(scored)
    return out


def search_run(
    searcher: Any,
    queries: Mapping[str, str],
    *,
    k: int = 100,
    mode: str = "dense",
    batch_size: int = 64,
    ignore_identical_ids: bool = False,
) -> dict[str, dict[str, float]]:
    """Answers every query with ``searcher.search`` and returns the run.

    Args:
        searcher: an open :class:`flowsearch.Searcher` (or anything with its ``search``).
        queries: query id -> text.
        k: hits kept per query.
        mode: ``"dense"``, ``"lexical"`` or ``"hybrid"``, always passed on (the Searcher's own
            default is hybrid when the index has a lexical part).
        batch_size: queries per ``search`` call.
        ignore_identical_ids: fetch one hit more and drop the query's own id, so ``k`` remain
            (as BEIR's exact search does).

    Returns:
        query id -> {doc id (as str): score}.
    """
    extra = {"mode": mode}
    fetch = k + 1 if ignore_identical_ids else k
    ids = list(queries)
    run: dict[str, dict[str, float]] = {}
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        results = searcher.search([queries[q] for q in chunk], k=fetch, **extra)
        for qid, hits in zip(chunk, results, strict=True):
            docs = [(str(h.id), float(h.score)) for h in hits]
            if ignore_identical_ids:
                docs = [(d, s) for d, s in docs if d != qid]
            run[qid] = dict(docs[:k])
    return run


def _metadata_columns(dataset: BeirDataset, reserved: Sequence[str]) -> dict[str, Any]:
    """pyarrow arrays of the corpus's metadata keys; nested or mixed values become JSON text."""
    import pyarrow as pa

    keys = list(dict.fromkeys(k for meta in dataset.metadata for k in meta))
    keys = (["title"] if any(dataset.titles) else []) + keys
    columns: dict[str, Any] = {}
    for key in keys:
        if key == "title":
            values: list[Any] = [t or None for t in dataset.titles]
        else:
            values = [meta.get(key) for meta in dataset.metadata]
        name = key
        while name in reserved or name in columns:
            name += "_"  # "id" / "text" / "vector" are the index's own columns
        try:
            if any(isinstance(v, (dict, list)) for v in values):
                raise TypeError("nested")
            columns[name] = pa.array(values)
        except (TypeError, ValueError, pa.ArrowException):
            columns[name] = pa.array(
                [None if v is None else json.dumps(v, ensure_ascii=False) for v in values],
                pa.string(),
            )
    return columns


def write_corpus_parquet(dataset: BeirDataset, path: str | os.PathLike[str]) -> Path:
    """The corpus as the Parquet file ``build_index`` reads: ``id``, ``text``, then metadata.

    ``text`` is the title joined to the text (:func:`~flowsearch.evaluation.beir.passage_text`);
    ``title`` is kept as a metadata column too. A metadata key that clashes with the index's own
    columns gets a trailing underscore.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flowsearch.storage.rows import RESERVED_COLUMNS

    table = pa.table(
        {
            "id": pa.array(dataset.doc_ids, pa.string()),
            "text": pa.array(dataset.texts, pa.string()),
            **_metadata_columns(dataset, RESERVED_COLUMNS),
        }
    )
    out = Path(path)
    pq.write_table(table, out)
    return out


def _modes(modes: str | Sequence[str]) -> list[str]:
    items = [modes] if isinstance(modes, str) else list(modes)
    wanted: list[str] = []
    for item in items:
        names = list(MODES) if item == "all" else [item]
        for name in names:
            if name not in MODES:
                raise FlowsearchError(
                    f"unknown retrieval mode {item!r}; choose dense, lexical, hybrid or all"
                )
            if name not in wanted:
                wanted.append(name)
    if not wanted:
        raise FlowsearchError("no retrieval mode given; e.g. --mode dense")
    return wanted


def run_retrieval(
    beir_dir: str | os.PathLike[str],
    modes: str | Sequence[str] = ("dense",),
    *,
    model: str | os.PathLike[str] | None = None,
    pooling: str = "mean",
    calibration: str = "auto",
    index_dir: str | os.PathLike[str] | None = None,
    keep: bool = False,
    k: int = 100,
    batch_size: int = 64,
    ignore_identical_ids: bool = False,
    **index_options: Any,
) -> dict[str, Any]:
    r"""Indexes a BEIR directory with the product and scores its search, per mode.

    Args:
        beir_dir: a BEIR-format directory (see :mod:`flowsearch.evaluation.beir`).
        modes: any of ``"dense"``, ``"lexical"``, ``"hybrid"``, or ``"all"``.
        model: encoder id or directory; None is the bundled all-MiniLM-L6-v2.
        pooling: encoder pooling.
        calibration: as for :func:`flowsearch.build_index` (``auto``, ``none``, ``flow``, ...).
        index_dir: where to build the index; None builds it in a temporary directory.
        keep: keep the temporary index (its path is returned as ``index_dir``); an
            ``index_dir`` you name is always kept.
        k: hits retrieved per query (recall@100 needs k >= 100).
        batch_size: texts per encoder batch, and queries per search call.
        ignore_identical_ids: drop a retrieved passage whose id is the query's id.
        \**index_options: passed on to :func:`flowsearch.build_index` (e.g. ``max_length``,
            ``index_factory``, ``overwrite``).

    Returns:
        ``{"dataset", "corpus_rows", "queries", "model", "pooling", "calibration",
        "calibrator", "space", "k", "ignore_identical_ids", "index_dir", "results": {mode:
        {"ndcg@10", "recall@100", "mrr@10"}}, "seconds": {"load", "index", "search": {mode},
        "total"}}``.

    Raises:
        FlowsearchError: a bad directory or file, an unknown mode or calibration, k < 10.
    """
    from flowsearch.search.searcher import Searcher
    from flowsearch.writes.build import build_index

    wanted = _modes(modes)
    if k < 10:
        raise FlowsearchError(f"k must be at least 10 for nDCG@10 and MRR@10, got {k}")
    if k < 100:
        LOG.warning("k=%d < 100: recall@100 counts only the top %d", k, k)
    t0 = time.perf_counter()
    dataset = load_beir(beir_dir)
    seconds: dict[str, Any] = {"load": time.perf_counter() - t0}
    scratch = Path(tempfile.mkdtemp(prefix="flowsearch-retrieval-"))
    target = Path(index_dir).expanduser() if index_dir is not None else scratch / "index"
    searcher = None
    try:
        parquet = write_corpus_parquet(dataset, scratch / "corpus.parquet")
        t1 = time.perf_counter()
        summary = build_index(
            parquet,
            target,
            model=model,
            pooling=pooling,
            calibration=calibration,
            batch_size=batch_size,
            **index_options,
        )
        seconds["index"] = time.perf_counter() - t1
        searcher = Searcher.open(target)
        results: dict[str, dict[str, float]] = {}
        seconds["search"] = {}
        for mode in wanted:
            t2 = time.perf_counter()
            run = search_run(
                searcher,
                dataset.queries,
                k=k,
                mode=mode,
                batch_size=batch_size,
                ignore_identical_ids=ignore_identical_ids,
            )
            seconds["search"][mode] = time.perf_counter() - t2
            scores = retrieval_scores(dataset.qrels, run, ignore_identical_ids=ignore_identical_ids)
            scores.pop("queries")
            results[mode] = scores
            LOG.info("%s %s: %s", dataset.name, mode, scores)
        encoder = searcher.manifest.encoder
        record = searcher.manifest.calibration
        out: dict[str, Any] = {
            "dataset": dataset.name,
            "corpus_rows": len(dataset.doc_ids),
            "indexed_rows": len(searcher),
            "skipped": summary.get("skipped", 0),
            "queries": len(dataset.queries),
            "model": encoder.model,
            "pooling": encoder.pooling,
            "calibration": calibration,
            "calibrator": record.calibrator,
            "space": record.space,
            "k": k,
            "ignore_identical_ids": ignore_identical_ids,
            "index_dir": str(target) if (keep or index_dir is not None) else None,
            "results": results,
            "seconds": seconds,
        }
    finally:
        if searcher is not None:
            searcher.close()
        if keep and index_dir is None:
            (scratch / "corpus.parquet").unlink(missing_ok=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    seconds["total"] = time.perf_counter() - t0
    return out
