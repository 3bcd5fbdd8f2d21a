r"""The 200k-row real-text corpus and the held-out queries of ``bench_speed.py``.

Corpus: every distinct sentence of ``../shared/data`` (STS-B, SICK, STS12-16, SNLI dev/test, QNLI
dev and the QNLI test *answer* sentences: about 65k; the same source as ``bench_lexical.py``) minus
the held-out sentences below, topped up to ``rows`` with seeded splices of two real sentences (the
first half of one, the second half of another, distinct): the vocabulary and lengths stay those of
real text, and nothing is an i.i.d. random vector. QNLI's "passages" are single sentences already,
so there is nothing to split.

Queries (never in the corpus): QNLI test questions (question -> sentence search), and a seeded
sample of the real sentences held out of the corpus (sentence -> sentence search), half each.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_lexical import real_sentences, top_up

__all__ = ["corpus_and_queries"]


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
