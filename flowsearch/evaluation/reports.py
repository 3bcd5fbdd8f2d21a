r"""What ``flowsearch eval`` computes, as typed dicts: the one shape that
:func:`~flowsearch.evaluation.run_sts`, :func:`~flowsearch.evaluation.run_qnli`,
:func:`~flowsearch.evaluation.run_retrieval` and
:func:`~flowsearch.evaluation.run_retrieval_suite` return and the CLI prints (``--json``: as
they are).

They are ``final`` so that ``"avg" in report`` tells them apart.

Example:
    >>> report: QnliReport = {"model": "m", "pooling": "mean", "calibration": "none",
    ...                       "results": {"QNLI": {"auc": 71.5}}}
    >>> report["results"]["QNLI"]["auc"]
    71.5
"""

from __future__ import annotations

from typing import TypedDict, final

__all__ = [
    "QnliReport",
    "RetrievalCorpus",
    "RetrievalReport",
    "RetrievalSeconds",
    "RetrievalSuiteReport",
    "StsReport",
]


@final
class StsReport(TypedDict):
    """:func:`~flowsearch.evaluation.run_sts`: ``results`` maps each task to ``{"spearman"}``
    (plus ``"wmean"`` for STS12-16); ``avg`` is the mean ``spearman``. ``model``, ``pooling``
    and ``max_length`` are what the encoder's ``describe()`` reports."""

    model: object
    pooling: object
    calibration: str
    max_length: object
    results: dict[str, dict[str, float]]
    avg: float


@final
class QnliReport(TypedDict):
    """:func:`~flowsearch.evaluation.run_qnli`: ``{"results": {"QNLI": {"auc"}}}``."""

    model: object
    pooling: object
    calibration: str
    results: dict[str, dict[str, float]]


class RetrievalSeconds(TypedDict, total=False):
    """Where a retrieval run's time went: loading, indexing, each mode's search, in all."""

    load: float
    index: float
    search: dict[str, float]
    total: float


class RetrievalCorpus(TypedDict):
    """What a retrieval run evaluated: the collection's sizes, the index's encoder and
    searched space."""

    dataset: str
    n_corpus: int
    n_indexed: int
    skipped: int
    queries: int
    missing_corpus_ids: int
    unreachable_judgements: int
    model: str
    pooling: str
    calibrator: str
    space: str


@final
class RetrievalReport(RetrievalCorpus):
    """:func:`~flowsearch.evaluation.run_retrieval`: :class:`RetrievalCorpus`'s keys, then
    ``results`` (``{mode: {"ndcg@10", "recall@100", "mrr@10"}}``) and how it was run."""

    results: dict[str, dict[str, float]]
    calibration: str
    k: int
    ignore_identical_ids: bool
    weight: float | None
    index_dir: str | None
    seconds: RetrievalSeconds


@final
class RetrievalSuiteReport(TypedDict):
    """:func:`~flowsearch.evaluation.run_retrieval_suite`: each collection's report, and the
    mean of each figure over them (``{mode: {measure: mean}}``)."""

    collections: list[RetrievalReport]
    mean: dict[str, dict[str, float]]
    modes: list[str]
    model: str
    pooling: str
    calibration: str
    weight: float | None
    seconds: dict[str, float]
