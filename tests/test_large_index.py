"""``auto``'s large-corpus path (IVF-PQ with an exact re-rank) through ingest, writes and mmap.

The thresholds are lowered (an ``AnnPolicy`` passed to every write) so a thousand-odd rows take
the path a segment past ``AnnPolicy.graph_max_rows`` takes. Recall and mmap are checked on the
bundled model's ``static`` pooling (dim 384, real word embeddings, calibrated by ``auto`` as ingest
does); the writes on the tiny test BERT (dim 32: PQ training on 48 sub-quantizers is most of a
384-d build's time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from corpus_helpers import sentences, write_corpus

from flowsearch import Searcher, build_index, compact, delete, upsert
from flowsearch.ann.factory import large_factory
from flowsearch.ann.policy import AnnPolicy
from flowsearch.writes.upsert import add_to_index

ROWS = 1_500


#: ``auto`` past lowered thresholds: IVF-PQ with an exact re-rank from 1,000 rows.
LARGE = AnnPolicy(flat_max_rows=500, graph_max_rows=1_000)


def _recall(s: Searcher, queries: list[str], k: int = 10) -> float:
    """recall@k of the index against exact search over the version's stored vectors (live rows:
    ids are ``d{n}`` and replaced or deleted rows are skipped through the searcher's answer)."""
    Z, _ = s.embed(queries)
    vectors = s.vectors()
    ids = [h for h in _ids(s)]
    alive = np.array([i is not None for i in ids])
    scores = Z @ vectors.T
    scores[:, ~alive] = -np.inf
    exact = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    found = s.search(queries, k=k, mode="dense")
    hits = [
        len({h.id for h in got} & {ids[r] for r in want})
        for got, want in zip(found, exact, strict=True)
    ]
    return float(np.mean(hits)) / k


def _ids(s: Searcher) -> list[Any]:
    """The id of every row of the pinned version in global row order, None for a deleted one."""
    out: list[Any] = []
    for seg, dead in zip(s.version.segments, s.version.deleted, strict=True):
        ids = [i for chunk in seg.reader.column_chunks("id") for i in chunk]
        out += [None if dead is not None and dead[n] else i for n, i in enumerate(ids)]
    return out


QUERIES = sentences(60, seed=777)


@pytest.fixture(scope="module")
def static_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The bundled model's ``static`` pooling, built past the lowered thresholds."""
    tmp = tmp_path_factory.mktemp("large")
    corpus = write_corpus(tmp / "c.parquet", n=ROWS)
    summary = build_index(corpus, tmp / "idx", pooling="static", lexical=False, ann=LARGE)
    return tmp / "idx", summary


def test_large_corpus_path_builds_searches_and_maps(static_index: tuple[Path, Any]) -> None:
    index, summary = static_index
    assert summary["factory"] == large_factory(ROWS, summary["dim"]) == "IVF32,PQ48,RFlat"
    ram = Searcher.open(index, gpu=False)
    params = ram.manifest.segments[0].ann.params
    assert params.startswith("nprobe=") and ",k_factor_rf=" in params
    assert _recall(ram, QUERIES) >= 0.9  # tuned to 0.95 on probe queries
    mapped = Searcher.open(index, gpu=False, mmap=True, encoder=ram.encoder)
    for a, b in zip(ram.search(QUERIES, k=10), mapped.search(QUERIES, k=10), strict=True):
        assert [h.id for h in b] == [h.id for h in a]
        np.testing.assert_allclose([h.score for h in b], [h.score for h in a], atol=1e-5)


def test_large_corpus_path_filters_memory_mapped(static_index: tuple[Path, Any]) -> None:
    mapped = Searcher.open(static_index[0], gpu=False, mmap=True)
    hits = mapped.search(QUERIES[0], k=5, where="year >= 2015")
    assert len(hits) == 5 and all(h.metadata["year"] >= 2015 for h in hits)


def test_large_corpus_path_survives_writes(tmp_path: Path, model_dir: Path) -> None:
    index = tmp_path / "idx"
    corpus = write_corpus(tmp_path / "c.parquet", n=ROWS)
    build_index(corpus, index, model=str(model_dir), ann=LARGE)
    more = write_corpus(tmp_path / "more.parquet", n=300, seed=5, id_prefix="m")
    add_to_index(index, more, ann=LARGE)
    new_texts = sentences(40, seed=99)
    upsert(index, [{"id": f"d{i}", "text": t, "topic": "x", "year": 2001} for i, t in
                   enumerate(new_texts)], ann=LARGE)  # fmt: skip
    gone = [f"d{i}" for i in range(100, 140)]
    assert delete(index, gone).n_deleted == len(gone)
    s = Searcher.open(index, gpu=False, mmap=True)
    # each segment's factory by its own size: the build's past the lowered thresholds, the
    # small ones the writes added exact
    assert [g.ann.factory for g in s.manifest.segments] == ["IVF32,PQ4,RFlat", "Flat", "Flat"]
    assert s.manifest.n_rows == ROWS + 340 and s.manifest.n_live == ROWS + 260
    for mode in ("dense", "hybrid"):
        for hits in s.search(QUERIES, k=20, mode=mode):
            assert len(hits) == 20
            assert not {h.id for h in hits} & set(gone)
    # a replaced row answers with its new text only
    top = s.search(new_texts[3], k=3, mode="dense")
    assert top[0].id == "d3" and top[0].text == new_texts[3]
    assert sum(h.id == "d3" for h in s.search(new_texts[3], k=50, mode="dense")) == 1
    assert _recall(s, QUERIES) >= 0.9
    result = compact(index, ann=LARGE)
    assert result["dropped"] == 80  # 40 replaced + 40 deleted
    s = Searcher.open(index, gpu=False, mmap=True)
    big = max(s.manifest.segments, key=lambda g: g.n_rows)  # rewritten without its dead rows
    assert big.n_rows == ROWS - 80 and big.ann.factory == "IVF32,PQ4,RFlat"
    assert ",k_factor_rf=" in big.ann.params and s.manifest.n_deleted == 0
    assert s.manifest.n_rows == ROWS + 260
    assert _recall(s, QUERIES) >= 0.9
    assert not {h.id for hits in s.search(QUERIES, k=20) for h in hits} & set(gone)
