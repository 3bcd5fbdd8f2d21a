r"""One encoder against the evaluation sets: cached vectors, fitted calibrators, scores.

:class:`EvalSession` holds an encoder, a data folder and a :class:`VectorCache`. Every dataset is
encoded once (all its distinct sentences, every split) and kept in memory, so evaluating several
calibration settings costs one encoding; the benchmarks run whole sweeps through one session.

Calibration settings (Li et al. 2020, sections 4.1 and 4.3; Su et al. 2021):

- ``none``: the raw vectors.
- ``sn``, ``natsv``, ``sn-natsv``, ``whitening``: fitted on the evaluated set's own sentences
  (all splits, no labels). For ``natsv`` and ``sn-natsv`` the number of nulled directions ``k``
  is chosen among 1..20 by Spearman on the STS-B dev split, as the paper does, then used for
  every task.
- ``whitening-k``: whitening keeping ``k = min(256, dim // 2)`` dimensions (Su et al. use 256
  for BERT-base; half the dimension for smaller encoders).
- ``flow``: the flow fitted on the evaluated set's own sentences, all splits ("flow (target)").
- ``whitening-flow``: the same flow (same settings) behind a fixed full-rank whitening layer
  (``make_calibrator("whitening-flow")``, not in the paper), fitted like ``flow``; the index's
  ``calibration="auto"`` uses it.
- ``flow-nli``: one flow fitted on SNLI sentences (dev + test: the train split is not shipped),
  applied to every task ("flow (NLI)").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import SupportsInt, cast

import numpy as np

from flowsearch.calibration import Calibrator, make_calibrator
from flowsearch.calibration.base import as_config
from flowsearch.errors import BadInput
from flowsearch.evaluation.cache import SupportsEncode, VectorCache
from flowsearch.evaluation.datasets import (
    PairSet,
    TextVariant,
    load_qnli,
    load_sick,
    load_snli_sentences,
    load_sts_year,
    load_stsb,
    resolve_data_dir,
    unique_texts,
)
from flowsearch.evaluation.metrics import auc100, cosine_pairs, spearman100, sts_correlations

__all__ = [
    "CALIBRATIONS",
    "NATSV_K_RANGE",
    "STS_TASKS",
    "EvalSession",
    "TaskData",
    "load_task",
]

LOG = logging.getLogger(__name__)

#: STS tasks in the order of the result JSON.
STS_TASKS: tuple[str, ...] = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSB", "SICKR")
#: Calibration settings the evaluators accept.
CALIBRATIONS: tuple[str, ...] = (
    "none",
    "sn",
    "natsv",
    "sn-natsv",
    "whitening",
    "whitening-k",
    "flow",
    "whitening-flow",
    "flow-nli",
)
#: Candidate k for NATSV, chosen on STS-B dev (the paper's range).
NATSV_K_RANGE: tuple[int, ...] = tuple(range(1, 21))


@dataclass(frozen=True)
class TaskData:
    """An evaluated set: the scored pairs, and every sentence of the set for target fitting."""

    name: str
    pairs: PairSet
    fit_texts: list[str]


def load_task(task: str, data_dir: str | Path | None, text: TextVariant = "raw") -> TaskData:
    """Loads one task (``STS12`` .. ``STS16``, ``STSB``, ``SICKR``, ``QNLI``).

    The pairs are what is scored (STS-B and SICK-R: test; QNLI: dev); ``fit_texts`` are the
    distinct sentences of all splits (STS12-16: every scored pair; QNLI: dev, the only split
    with labels here).
    """
    if task in STS_TASKS[:5]:
        pairs = load_sts_year(data_dir, int(task[3:]), text)
        return TaskData(task, pairs, pairs.sentences())
    if task == "STSB":
        splits = [load_stsb(data_dir, s, text) for s in ("train", "dev", "test")]
        texts = unique_texts([t for p in splits for t in p.sentences()])
        return TaskData(task, splits[2], texts)
    if task == "SICKR":
        splits = [load_sick(data_dir, s, text) for s in ("train", "trial", "test")]
        texts = unique_texts([t for p in splits for t in p.sentences()])
        return TaskData(task, splits[2], texts)
    if task == "QNLI":
        pairs = load_qnli(data_dir, "dev")
        return TaskData(task, pairs, pairs.sentences())
    raise BadInput(f"unknown task {task!r}; choose from {', '.join(STS_TASKS)}, QNLI")


def _natsv_dev_scores(
    setting: str,
    fit: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    gold: np.ndarray,
    candidates: list[int],
) -> dict[int, float]:
    """Dev Spearman of ``natsv`` / ``sn-natsv`` for every candidate ``k``.

    The top-k directions for every k are the first k of the largest candidate's, so one fit
    (one SVD) serves all candidates: the projections are read from the fitted calibrator's
    saved state. If the state does not look as expected, every k is fitted on its own.
    """
    cal = make_calibrator(setting, k=max(candidates)).fit(fit)
    state = cal.state()
    prefix = "natsv." if setting == "sn-natsv" else ""
    try:
        mu, directions = state[f"{prefix}mu"], state[f"{prefix}directions"]
        sn = (state["sn.mu"], state["sn.sigma"]) if setting == "sn-natsv" else None
    except KeyError:
        LOG.warning("unexpected %s state; fitting every k separately", setting)
        out = {}
        for k in candidates:
            one = make_calibrator(setting, k=k).fit(fit)
            out[k] = spearman100(cosine_pairs(one.transform(a), one.transform(b)), gold)
        return out

    def project(U: np.ndarray, k: int) -> np.ndarray:
        X = np.asarray(U, dtype=np.float64)
        if sn is not None:
            X = (X - sn[0]) / sn[1]
        X = X - mu
        projected: np.ndarray = X - (X @ directions[:, :k]) @ directions[:, :k].T
        return projected

    return {k: spearman100(cosine_pairs(project(a, k), project(b, k)), gold) for k in candidates}


class EvalSession:
    r"""Evaluates one encoder under any calibration setting, encoding each dataset once.

    Arguments:
        encoder: a :class:`flowsearch.Encoder` (or anything with ``describe`` and ``encode``).
        data_dir: evaluation data folder; ``None`` means ``$FLOWSEARCH_DATA``.
        cache: vector cache; ``None`` means the default on-disk cache.
        text: ``"raw"`` (original sentences) or ``"senteval"`` (tokenised, as the papers).
        batch_size: encoder batch size.
        seed: seed of the flows.
        flow_config: extra keyword arguments for ``make_calibrator("flow", ...)`` (and for
            ``"whitening-flow"``).
        nli_sentences: fit ``flow-nli`` on at most this many SNLI sentences (a seeded sample);
            ``None`` uses all (about 25,700).

    Example:
        >>> session = EvalSession(Encoder(), "../shared/data")  # doctest: +SKIP
        >>> session.sts("STSB", "whitening")["spearman"]  # doctest: +SKIP
    """

    def __init__(
        self,
        encoder: SupportsEncode,
        data_dir: str | Path | None = None,
        cache: VectorCache | None = None,
        text: TextVariant = "raw",
        batch_size: int = 64,
        seed: int = 0,
        flow_config: Mapping[str, object] | None = None,
        nli_sentences: int | None = None,
    ) -> None:
        if text not in ("raw", "senteval"):
            raise BadInput(f"unknown text variant {text!r}; use 'raw' or 'senteval'")
        self.encoder = encoder
        self.data_dir = resolve_data_dir(data_dir)
        self.cache = cache if cache is not None else VectorCache()
        self.text: TextVariant = text
        self.batch_size = batch_size
        self.seed = seed
        self.flow_config = dict(flow_config or {})
        self.nli_sentences = nli_sentences
        self.dim = int(cast("SupportsInt", encoder.describe().get("dim") or 0))
        self._tasks: dict[str, TaskData] = {}
        self._vectors: dict[str, tuple[dict[str, int], np.ndarray]] = {}
        self._natsv_k: dict[str, int] = {}
        self._fitted: dict[tuple[str, str, str], Calibrator] = {}
        #: Every fitted calibrator's ``fit_stats``, by (setting, fit set), for reports.
        self.fit_stats: dict[tuple[str, str], dict[str, object]] = {}

    # -- data and vectors --------------------------------------------------------------------

    def task(self, name: str) -> TaskData:
        """The loaded task (memoised)."""
        if name not in self._tasks:
            self._tasks[name] = load_task(name, self.data_dir, self.text)
        return self._tasks[name]

    def _encoded(self, key: str, texts: list[str]) -> tuple[dict[str, int], np.ndarray]:
        if key not in self._vectors:
            vectors = self.cache.encode(self.encoder, texts, key, batch_size=self.batch_size)
            if not self.dim:
                self.dim = int(vectors.shape[1])
            self._vectors[key] = ({t: i for i, t in enumerate(texts)}, vectors)
        return self._vectors[key]

    def fit_vectors(self, name: str) -> np.ndarray:
        """Raw vectors of every distinct sentence of a task (or ``"SNLI"``), float32 (n, dim)."""
        if name == "SNLI":
            texts = load_snli_sentences(self.data_dir)
            if self.nli_sentences is not None and len(texts) > self.nli_sentences:
                rng = np.random.default_rng(self.seed)
                keep = np.sort(rng.choice(len(texts), self.nli_sentences, replace=False))
                texts = [texts[i] for i in keep]
            return self._encoded("snli", texts)[1]
        variant = "" if name == "QNLI" else f"-{self.text}"
        return self._encoded(f"{name.lower()}{variant}", self.task(name).fit_texts)[1]

    def text_vectors(self, name: str, texts: list[str]) -> np.ndarray:
        """Raw vectors of some of a task's sentences (all must belong to the task), (n, dim)."""
        self.fit_vectors(name)
        variant = "" if name in ("QNLI", "SNLI") else f"-{self.text}"
        lookup, vectors = self._vectors[f"{name.lower()}{variant}"]
        return vectors[[lookup[t] for t in texts]]

    def pair_vectors(
        self, name: str, pairs: PairSet | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Raw vectors of both sides of a task's scored pairs (or of ``pairs`` from that task)."""
        self.fit_vectors(name)
        variant = "" if name == "QNLI" else f"-{self.text}"
        lookup, vectors = self._vectors[f"{name.lower()}{variant}"]
        pairs = pairs if pairs is not None else self.task(name).pairs
        rows1 = [lookup[t] for t in pairs.s1]
        rows2 = [lookup[t] for t in pairs.s2]
        return vectors[rows1], vectors[rows2]

    # -- calibration -------------------------------------------------------------------------

    def whitening_k(self) -> int:
        """``k`` of ``whitening-k``: 256, or half the dimension for encoders below 512 dims."""
        return min(256, max(1, self.dim // 2))

    def natsv_k(self, setting: str) -> int:
        """The ``k`` of ``natsv`` / ``sn-natsv`` with the best Spearman on STS-B dev."""
        if setting not in self._natsv_k:
            fit = self.fit_vectors("STSB")
            dev = load_stsb(self.data_dir, "dev", self.text)
            a, b = self.pair_vectors("STSB", dev)
            limit = max(1, min(fit.shape[1] - 1, fit.shape[0] - 1))
            candidates = [k for k in NATSV_K_RANGE if k <= limit]
            scores = _natsv_dev_scores(setting, fit, a, b, dev.scores, candidates)
            best = max(scores, key=lambda k: (scores[k], -k))
            LOG.info("%s: k=%d chosen on STS-B dev (%.2f)", setting, best, scores[best])
            self._natsv_k[setting] = best
        return self._natsv_k[setting]

    def calibrator(self, setting: str, task: str) -> Calibrator | None:
        """A calibrator for ``setting`` fitted for ``task`` (``None`` for ``"none"``)."""
        if setting not in CALIBRATIONS:
            raise BadInput(
                f"unknown calibration {setting!r}; choose one of {', '.join(CALIBRATIONS)}"
            )
        if setting == "none":
            return None
        if setting == "flow-nli":
            return self._fit("flow", "SNLI", self._flow_kwargs())
        if setting in ("natsv", "sn-natsv"):
            return self._fit(setting, task, {"k": self.natsv_k(setting)})
        if setting == "whitening-k":
            return self._fit("whitening", task, {"k": self.whitening_k()})
        if setting in ("flow", "whitening-flow"):
            return self._fit(setting, task, self._flow_kwargs())
        return self._fit(setting, task, {})

    def _flow_kwargs(self) -> dict[str, object]:
        return {"seed": self.seed, **self.flow_config}

    def _fit(self, name: str, fit_set: str, kwargs: dict[str, object]) -> Calibrator:
        """Fits (once per session) calibrator ``name`` with ``kwargs`` on a set's sentences."""
        key = (name, fit_set, repr(sorted(kwargs.items())))
        if key not in self._fitted:
            cal = make_calibrator(name, **as_config(kwargs)).fit(self.fit_vectors(fit_set))
            self.fit_stats[(name, fit_set)] = dict(cal.fit_stats)
            self._fitted[key] = cal
        return self._fitted[key]

    def similarities(self, task: str, calibration: str) -> np.ndarray:
        """Cosine similarity of every scored pair of ``task`` after ``calibration``, (n,)."""
        a, b = self.pair_vectors(task)
        cal = self.calibrator(calibration, task)
        if cal is not None:
            a, b = cal.transform(a), cal.transform(b)
        return cosine_pairs(a, b)

    # -- evaluators --------------------------------------------------------------------------

    def sts(self, task: str, calibration: str = "none") -> dict[str, float]:
        """``{"spearman"}`` (STS-B, SICK-R) or ``{"spearman", "wmean"}`` (STS12-16), rho x 100."""
        if task not in STS_TASKS:
            raise BadInput(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS)}")
        pairs = self.task(task).pairs
        sims = self.similarities(task, calibration)
        if task in ("STSB", "SICKR"):
            return {"spearman": spearman100(sims, pairs.scores)}
        return sts_correlations(sims, pairs.scores, pairs.subsets)

    def qnli(self, calibration: str = "none") -> dict[str, float]:
        """``{"auc"}``: AUC x 100 of cosine(question, sentence) for entailment on QNLI dev."""
        sims = self.similarities("QNLI", calibration)
        return {"auc": auc100(sims, self.task("QNLI").pairs.scores)}
