"""Synthetic texts and comparisons shared by the lexical tests."""

from __future__ import annotations

import numpy as np

from flowsearch.lexical.bm25 import Bm25
from flowsearch.lexical.postings import Postings

WORDS = [
    "tide",
    "moon",
    "ocean",
    "wave",
    "heat",
    "pump",
    "energy",
    "house",
    "cat",
    "dog",
    "run",
    "running",
    "runs",
    "river",
    "bank",
    "money",
    "loan",
    "water",
    "cloud",
    "rain",
    "storm",
    "wind",
    "solar",
    "panel",
    "roof",
    "garden",
    "tree",
    "leaf",
]

QUERIES = ["tide moon", "heat pumps for a house", "running dog dog", "bank loan money", "leaf"]


def corpus(n: int, seed: int = 0, min_len: int = 1, max_len: int = 12) -> list[str]:
    """Texts over a small vocabulary (terms repeat, dfs vary), Zipf-distributed, with stopwords."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    texts = []
    for _ in range(n):
        words = rng.choice(WORDS, size=rng.integers(min_len, max_len), p=p / p.sum())
        texts.append(" the ".join(words).capitalize() + ".")
    return texts


def all_scores(bm25: Bm25, query: str) -> np.ndarray:
    """float32 (n_rows,): every row's score (0 for a row without a query term or deleted)."""
    scores, rows = bm25.search([query], k=max(bm25.n_rows, 1))
    out = np.zeros(bm25.n_rows, np.float32)
    out[rows[0][rows[0] >= 0]] = scores[0][rows[0] >= 0]
    return out


def bits(a: np.ndarray) -> np.ndarray:
    """float32 values as their bit patterns, so equality is bit for bit (-0.0 != 0.0)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_same_postings(a: Postings, b: Postings) -> None:
    """Equal vocabularies and arrays, entry for entry."""
    assert a.vocab == b.vocab
    for name in ("indptr", "rows", "tf", "lengths"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
