r"""The corpora the benchmarks index: the shipped sample split into sentences, synthetic
corpora of any size spliced from them, and the real-text corpus of ``bench_speed.py`` with its
held-out queries.

The real-text corpus (:func:`real_corpus`, :func:`corpus_and_queries`):

Corpus: every distinct sentence of ``../shared/data`` (:func:`real_sentences`: STS-B, SICK,
STS12-16, SNLI dev/test, QNLI dev and the QNLI test *answer* sentences: about 65k) minus the
held-out sentences below, topped up to ``rows`` with seeded splices of two real sentences (the
first half of one, the second half of another, distinct): the vocabulary and lengths stay those of
real text, and nothing is an i.i.d. random vector. QNLI's "passages" are single sentences already,
so there is nothing to split.

Queries (never in the corpus): QNLI test questions (question -> sentence search), and a seeded
sample of the real sentences held out of the corpus (sentence -> sentence search), half each.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common.harness import ROOT, WORK
from flowsearch.evaluation import datasets as ds

__all__ = [
    "corpus_and_queries",
    "partial_sentence",
    "partial_text",
    "real_corpus",
    "real_sentences",
    "sample_queries",
    "synthetic_corpus",
    "top_up",
]


def corpus_and_queries(
    data: Path, work: Path, rows: int, n_queries: int, seed: int = 0
) -> tuple[Path, list[str], dict[str, int]]:
    """``(corpus.parquet path, queries, counts)``; cached under ``work`` by ``rows``."""
    path = work / f"corpus_{rows}.parquet"
    meta = work / f"corpus_{rows}.json"
    if path.exists() and meta.exists():
        doc = json.loads(meta.read_text())
        return path, doc["queries"], doc["counts"]
    sentences, questions = real_sentences(data)
    rng = np.random.default_rng(seed)
    half = n_queries // 2
    held = set(rng.choice(len(sentences), size=half, replace=False).tolist())
    held_out = [s for i, s in enumerate(sentences) if i in held]
    kept = [s for i, s in enumerate(sentences) if i not in held]
    q_pick = rng.choice(len(questions), size=n_queries - half, replace=False)
    queries = [questions[i] for i in q_pick] + held_out
    texts = top_up(kept, rows, seed=seed)
    counts = {
        "real_sentences": len(kept),
        "splices": len(texts) - len(kept),
        "held_out_sentences": len(held_out),
        "qnli_questions": n_queries - half,
    }
    work.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": texts})
    pq.write_table(table, path, row_group_size=16_384)
    meta.write_text(json.dumps({"queries": queries, "counts": counts}))
    return path, queries, counts


def partial_sentence(sentence: str, rng: np.random.Generator) -> str:
    """A query cut from a held-out sentence: a seeded contiguous 40-70% of its words (at least
    three), as a user types part of what they remember."""
    words = sentence.split()
    if len(words) < 4:
        return sentence
    keep = max(3, int(round(len(words) * rng.uniform(0.4, 0.7))))
    start = int(rng.integers(0, len(words) - keep + 1))
    return " ".join(words[start : start + keep])


def partial_text(text: str, rng: np.random.Generator) -> str:
    """:func:`partial_sentence` of one of ``text``'s sentences of four words or more (seeded;
    the whole text when it has none): a query cut from a corpus row, as the tuner study's
    text probes are (``benchmarks/studies/ann/bench_tuner.py --probes texts``)."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if len(s.split()) > 3]
    sentence = sentences[int(rng.integers(len(sentences)))] if sentences else text
    return partial_sentence(sentence, rng)


def _sample_sentences() -> list[str]:
    """The shipped sample corpus (``data/sample.parquet``) split into sentences of 6+ words."""
    texts = pq.read_table(ROOT / "data" / "sample.parquet").column("text").to_pylist()
    return [s for t in texts for s in re.split(r"(?<=[.!?])\s+", t) if len(s.split()) >= 6]


def synthetic_corpus(path: Path, rows: int, seed: int = 0) -> Path:
    """A Parquet corpus (``id``, ``text``) of ``rows`` passages, each the first half of one
    sample sentence and the second half of another: real vocabulary, any size."""
    words = [s.split() for s in _sample_sentences()]
    rng = np.random.default_rng(seed)
    a, b = rng.integers(len(words), size=rows), rng.integers(len(words), size=rows)
    texts = [
        " ".join(words[i][: len(words[i]) // 2] + words[j][len(words[j]) // 2 :])
        for i, j in zip(a, b, strict=True)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"s{i:06d}" for i in range(rows)], "text": texts}), path)
    return path


def sample_queries(n: int, seed: int = 1) -> list[str]:
    """The hand-written sample queries, then windows of 5-10 words of sample sentences."""
    hand = [q["query"] for q in json.loads((ROOT / "tests" / "sample_queries.json").read_text())]
    sentences = _sample_sentences()
    rng = np.random.default_rng(seed)
    out = list(hand)
    while len(out) < n:
        words = sentences[int(rng.integers(len(sentences)))].split()
        size = int(rng.integers(5, 11))
        start = int(rng.integers(0, max(1, len(words) - size)))
        out.append(" ".join(words[start : start + size]))
    return out[:n]


def real_sentences(data: Path) -> tuple[list[str], list[str]]:
    """(distinct corpus sentences, QNLI test questions not among them)."""
    texts: list[str] = []
    for split in ("train", "dev", "test"):
        texts += ds.load_stsb(data, split).sentences()
    for split in ("train", "trial", "test"):
        texts += ds.load_sick(data, split).sentences()
    for year in (12, 13, 14, 15, 16):
        texts += ds.load_sts_year(data, year).sentences()
    texts += ds.load_qnli(data, "dev").sentences()
    texts += ds.load_snli_sentences(data)
    questions = []
    # the test split is unlabelled (index, question, sentence), so load_qnli does not read it
    lines = (data / "qnli" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    for line in lines:
        cols = line.split("\t")
        if len(cols) >= 3:
            questions.append(cols[1])
            texts.append(cols[2])
    corpus = ds.unique_texts([t for t in texts if t.strip()])
    in_corpus = set(corpus)
    return corpus, ds.unique_texts([q for q in questions if q not in in_corpus])


def top_up(texts: list[str], rows: int, seed: int = 0) -> list[str]:
    """``texts`` plus distinct splices of two of them, up to ``rows`` texts."""
    rng = np.random.default_rng(seed)
    words = [t.split() for t in texts]
    out, seen = list(texts), set(texts)
    while len(out) < rows:
        for a, b in rng.integers(len(words), size=(rows - len(out), 2)):
            first, second = words[a], words[b]
            text = " ".join(first[: len(first) // 2] + second[len(second) // 2 :])
            if text and text not in seen:
                seen.add(text)
                out.append(text)
    return out[:rows]


def real_corpus(data: Path, rows: int, n_queries: int) -> tuple[Path, list[str], dict[str, int]]:
    """The real-text corpus of :func:`corpus_and_queries` (``_work/corpus_<rows>.parquet``, built
    from the evaluation data when missing) and its held-out queries: ``(path, queries, counts)``."""
    return corpus_and_queries(data, WORK, rows, n_queries)
