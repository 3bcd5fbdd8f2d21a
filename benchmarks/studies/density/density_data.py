r"""Texts and vectors for the density study (``bench_density.py``): every text encoded once.

The OOD cases and the fusion dev sets share most of their texts (QNLI passages and questions,
SICK/STS-B/SNLI sentences), so vectors are kept in one text -> vector store per pooling under
``benchmarks/_work/density_vectors/`` (git-ignored) and only texts not seen before are encoded.

Cases (all from ``../shared/data``; the dev sets from ``make_dev_sets.py --max-corpus 3000``):

- index: every distinct QNLI dev sentence (the "passages").
- in-domain queries: the qnli-dev set's questions; off-domain queries: the stsb-para and
  sick-para queries (single STS-B / SICK sentences, about as short as a question).
- foreign passages: sentences of the stsb-para, sick-para and snli-entail corpora.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowsearch.evaluation.beir import BeirDataset, load_beir
from flowsearch.evaluation.datasets import load_qnli, unique_texts

__all__ = ["DEV_SETS", "Texts", "VectorStore", "load_texts", "token_counts"]

LOG = logging.getLogger(__name__)

DEV_SETS = ("qnli-dev", "stsb-para", "sick-para", "snli-entail")
FOREIGN_PER_SET = 400  # foreign passages taken from each of the three non-QNLI corpora


@dataclass
class Texts:
    """Every text set of the study, plus the dev sets."""

    passages: list[str]
    questions: list[str]
    off_queries: dict[str, list[str]]
    foreign: dict[str, list[str]]
    dev: dict[str, BeirDataset]

    def sizes(self) -> dict[str, str]:
        """How many texts each group holds, as the reports print them."""
        return {
            "passages": f"{len(self.passages):,}",
            "questions": f"{len(self.questions):,}",
            "off": ", ".join(f"{len(v)} {k}" for k, v in self.off_queries.items()),
            "foreign": ", ".join(f"{len(v)} {k}" for k, v in self.foreign.items()),
        }

    def all_texts(self) -> list[str]:
        texts = [*self.passages, *self.questions]
        for group in (*self.off_queries.values(), *self.foreign.values()):
            texts.extend(group)
        for ds in self.dev.values():
            texts.extend(ds.texts)
            texts.extend(ds.queries.values())
        return unique_texts(texts)


def load_texts(data: Path, dev_dir: Path, limit: int | None = None) -> Texts:
    """The study's text sets (deterministic); ``limit`` keeps the first passages and questions
    only (a smoke run)."""
    qnli = load_qnli(data, "dev")
    passages = unique_texts([t.strip() for t in qnli.s2 if t.strip()])[:limit]
    dev = {name: load_beir(dev_dir / name) for name in DEV_SETS}
    questions = list(dev["qnli-dev"].queries.values())[:limit]
    off = {
        name.split("-")[0]: list(dev[name].queries.values())[:limit]
        for name in ("stsb-para", "sick-para")
    }
    qnli_set = set(passages)
    rng = np.random.default_rng(0)
    foreign = {}
    for name in ("stsb-para", "sick-para", "snli-entail"):
        pool = [t for t in dev[name].texts if t not in qnli_set]
        n = min(FOREIGN_PER_SET, len(pool), limit or len(pool))
        pick = np.sort(rng.choice(len(pool), n, replace=False))
        foreign[name.split("-")[0]] = [pool[i] for i in pick]
    return Texts(passages, questions, off, foreign, dev)


class VectorStore:
    """Text -> raw encoder vector (float32) for one pooling, persisted as ``.npz``."""

    def __init__(self, path: Path, encoder: object) -> None:
        self.path = path
        self.encoder = encoder
        self.index: dict[str, int] = {}
        self.vectors = np.zeros((0, 0), np.float32)
        self.encode_seconds = 0.0
        self.encoded = 0
        if path.is_file():
            saved = np.load(path, allow_pickle=False)
            texts = [str(t) for t in saved["texts"]]
            self.vectors = saved["vectors"]
            self.index = {t: i for i, t in enumerate(texts)}

    def get(self, texts: Sequence[str]) -> np.ndarray:
        """float32 (len(texts), dim), encoding the texts not stored yet."""
        missing = unique_texts([t for t in texts if t not in self.index])
        if missing:
            t0 = time.perf_counter()
            U = self.encoder.encode(missing, batch_size=64, progress=False)  # type: ignore[attr-defined]
            self.encode_seconds += time.perf_counter() - t0
            self.encoded += len(missing)
            base = len(self.index)
            self.vectors = U if not base else np.concatenate([self.vectors, U])
            self.index.update({t: base + i for i, t in enumerate(missing)})
            self.save()
        return self.vectors[[self.index[t] for t in texts]]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        texts = np.array(sorted(self.index, key=self.index.__getitem__), dtype=str)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, texts=texts, vectors=self.vectors)
        tmp.replace(self.path)


def token_counts(encoder: object, texts: Sequence[str]) -> np.ndarray:
    """Word-piece tokens per text (special tokens excluded), int64 (n,)."""
    tok = getattr(encoder, "_tokenizer", None)
    if tok is None:  # a Model2Vec directory: words as a stand-in
        return np.array([len(t.split()) for t in texts], np.int64)
    ids = tok(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
    return np.array([len(i) for i in ids], np.int64)
