r"""Entry points of ``flowsearch eval sts|qnli``: one call, one JSON-able result.

Example:
    >>> out = run_sts(pooling="mean", calibration="none", data_dir="../shared/data",
    ...               tasks=["STSB"])  # doctest: +SKIP
    >>> out["results"]["STSB"]["spearman"]  # doctest: +SKIP
    82.03...
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from flowsearch.errors import BadInput
from flowsearch.evaluation.cache import SupportsEncode, VectorCache
from flowsearch.evaluation.datasets import TextVariant, resolve_data_dir
from flowsearch.evaluation.reports import QnliReport, StsReport
from flowsearch.evaluation.session import CALIBRATIONS, STS_TASKS, EvalSession

__all__ = ["parse_tasks", "run_qnli", "run_sts"]

LOG = logging.getLogger(__name__)


def parse_tasks(tasks: str | Sequence[str] | None) -> list[str]:
    """Normalises ``"STSB,SICKR"`` / ``["stsb"]`` / ``None`` (all) to task names in JSON order."""
    if tasks is None:
        return list(STS_TASKS)
    items = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    aliases = {"STS-B": "STSB", "SICK-R": "SICKR", "SICK": "SICKR"}
    wanted = []
    for item in items:
        name = str(item).strip().upper()
        name = aliases.get(name, name)
        if not name:
            continue
        if name not in STS_TASKS:
            raise BadInput(
                f"unknown STS task {item!r}; choose from {', '.join(STS_TASKS)} (comma-separated)"
            )
        wanted.append(name)
    if not wanted:
        raise BadInput("no STS task given; e.g. --tasks STSB,SICKR")
    return [t for t in STS_TASKS if t in wanted]


def _session(
    model: str | None,
    pooling: str,
    calibration: str,
    max_length: int | None,
    data_dir: str | Path | None,
    batch_size: int,
    text: TextVariant,
    cache_dir: str | Path | None,
    encoder: SupportsEncode | None,
    seed: int,
    backend: str = "auto",
    quantize: str | None = None,
) -> EvalSession:
    if calibration not in CALIBRATIONS:
        raise BadInput(
            f"unknown calibration {calibration!r}; choose one of {', '.join(CALIBRATIONS)}"
        )
    # Check the data folder before loading a model: a missing folder is the common mistake.
    root = resolve_data_dir(data_dir)
    if encoder is None:
        from flowsearch.encode.encoder import Encoder

        encoder = Encoder(
            model, pooling=pooling, max_length=max_length, backend=backend, quantize=quantize
        )
    cache = VectorCache(cache_dir) if cache_dir is not None else None
    return EvalSession(encoder, root, cache, text=text, batch_size=batch_size, seed=seed)


def run_sts(
    model: str | None = None,
    pooling: str = "mean",
    calibration: str = "none",
    max_length: int | None = None,
    data_dir: str | Path | None = None,
    tasks: list[str] | None = None,
    batch_size: int = 64,
    *,
    text: TextVariant = "raw",
    cache_dir: str | Path | None = None,
    encoder: SupportsEncode | None = None,
    seed: int = 0,
    backend: str = "auto",
    quantize: str | None = None,
) -> StsReport:
    r"""Spearman x 100 of cosine similarity against gold on the STS tasks.

    Arguments:
        model: Hugging Face id or local directory; ``None`` is the bundled all-MiniLM-L6-v2.
        pooling: ``cls``, ``mean``, ``last2avg``, ``first_last_avg`` or ``static``.
        calibration: one of :data:`~flowsearch.evaluation.session.CALIBRATIONS`.
        max_length: encoder token limit; ``None`` is the model's own (MiniLM: 256).
        data_dir: evaluation data folder, else ``$FLOWSEARCH_DATA``.
        tasks: subset of ``STS12 .. STS16, STSB, SICKR``; ``None`` runs all.
        batch_size: encoder batch size.
        text: ``"raw"`` sentences (as MTEB) or ``"senteval"`` tokenised ones (as the papers).
        cache_dir: vector cache folder; ``None`` is ``$FLOWSEARCH_CACHE`` or ``~/.cache``.
        encoder: an already built encoder (then ``model``/``pooling``/``max_length`` are
            taken from it).
        seed: flow seed.
        backend: encoder backend: ``"auto"`` (ONNX Runtime on a CPU, torch on CUDA, as
            :class:`~flowsearch.encode.encoder.Encoder`), ``"torch"`` or ``"onnx"``.
        quantize: ``None`` or ``"int8"`` (``backend="onnx"`` only).

    Returns:
        ``{"model", "pooling", "calibration", "max_length", "results", "avg"}``: ``results``
        maps each task to ``{"spearman"}``, plus ``"wmean"`` for STS12-16 whose ``spearman`` is
        the "all" (pooled) figure; ``avg`` is the mean of the ``spearman`` values.
    """
    names = parse_tasks(tasks)
    session = _session(
        model,
        pooling,
        calibration,
        max_length,
        data_dir,
        batch_size,
        text,
        cache_dir,
        encoder,
        seed,
        backend,
        quantize,
    )
    results = {task: session.sts(task, calibration) for task in names}
    desc = session.encoder.describe()
    avg = sum(r["spearman"] for r in results.values()) / len(results)
    return {
        "model": desc.get("model"),
        "pooling": desc.get("pooling"),
        "calibration": calibration,
        "max_length": desc.get("max_length"),
        "results": results,
        "avg": avg,
    }


def run_qnli(
    model: str | None = None,
    pooling: str = "mean",
    calibration: str = "none",
    max_length: int | None = None,
    data_dir: str | Path | None = None,
    batch_size: int = 64,
    *,
    cache_dir: str | Path | None = None,
    encoder: SupportsEncode | None = None,
    seed: int = 0,
    backend: str = "auto",
    quantize: str | None = None,
) -> QnliReport:
    r"""AUC x 100 of cosine(question, sentence) for entailment on QNLI dev.

    Arguments are those of :func:`run_sts`. The target flow (``flow``) is fitted on the QNLI dev
    sentences; ``natsv`` / ``sn-natsv`` choose ``k`` on STS-B dev, so they also need STS-B.

    Returns:
        ``{"model", "pooling", "calibration", "results": {"QNLI": {"auc"}}}``.
    """
    session = _session(
        model,
        pooling,
        calibration,
        max_length,
        data_dir,
        batch_size,
        "raw",
        cache_dir,
        encoder,
        seed,
        backend,
        quantize,
    )
    desc = session.encoder.describe()
    return {
        "model": desc.get("model"),
        "pooling": desc.get("pooling"),
        "calibration": calibration,
        "results": {"QNLI": session.qnli(calibration)},
    }
