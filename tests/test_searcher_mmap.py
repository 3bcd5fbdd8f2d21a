"""``Searcher.open(..., mmap=True)``: a memory-mapped FAISS index answers like one read into RAM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import write_corpus

from flowsearch import Searcher, build_index

QUERIES = ["the cat and the dog", "red car on the road", "music piano song", "old book page"]


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat", "HNSW8"])
def test_mmap_answers_like_ram(tmp_path: Path, model_dir: Path, factory: str) -> None:
    corpus = write_corpus(tmp_path / "c.parquet", n=200)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), index_factory=factory,
                calibration="none", lexical=False)  # fmt: skip
    ram = Searcher.open(tmp_path / "idx", gpu=False)
    mapped = Searcher.open(tmp_path / "idx", gpu=False, mmap=True, encoder=ram.encoder)
    for a, b in zip(ram.search(QUERIES, k=10), mapped.search(QUERIES, k=10), strict=True):
        assert [h.id for h in b] == [h.id for h in a]
        np.testing.assert_allclose([h.score for h in b], [h.score for h in a], atol=1e-6)
    assert mapped.refresh() is False  # refresh keeps working on the mapped index


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat"])
def test_mmap_filters(tmp_path: Path, model_dir: Path, factory: str) -> None:
    corpus = write_corpus(tmp_path / "c.parquet", n=200)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), index_factory=factory,
                calibration="none", lexical=False)  # fmt: skip
    ram = Searcher.open(tmp_path / "idx", gpu=False)
    mapped = Searcher.open(tmp_path / "idx", gpu=False, mmap=True, encoder=ram.encoder)
    want = ram.search("the cat", k=5, where="year >= 2010")
    hits = mapped.search("the cat", k=5, where="year >= 2010")
    assert len(hits) == 5 and all(h.metadata["year"] >= 2010 for h in hits)
    if factory == "Flat":  # exact either way; a mapped IVF index has no direct map, so its
        assert [h.id for h in hits] == [h.id for h in want]  # filtered search probes lists


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat", "HNSW8"])
def test_vectors_read_back_and_background_with_deletions(
    tmp_path: Path, model_dir: Path, factory: str
) -> None:
    """A segment's vectors read back by row (from its vector index, or from its Parquet rows
    when a mapped IVF index has no direct map) are the stored ones, so a version's background
    over its live rows is the same mapped or not."""
    from flowsearch import delete

    corpus = write_corpus(tmp_path / "c.parquet", n=200)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), index_factory=factory,
                calibration="none", lexical=False)  # fmt: skip
    delete(tmp_path / "idx", [f"d{i}" for i in range(0, 200, 3)])
    ram = Searcher.open(tmp_path / "idx", gpu=False)
    mapped = Searcher.open(tmp_path / "idx", gpu=False, mmap=True, encoder=ram.encoder)
    stored = ram.vectors()
    rows = np.array([199, 0, 3, 150, 77])
    for searcher in (ram, mapped):
        segment = searcher.version.segments[0]
        np.testing.assert_allclose(segment.vectors(rows), stored[rows], atol=1e-6)
    live = stored[np.arange(200) % 3 != 0].astype(np.float64)
    brute = ((live @ live.T).sum() - len(live)) / (len(live) * (len(live) - 1))
    for searcher in (ram, mapped):
        assert searcher.version.fusion().dense_background == pytest.approx(brute, abs=1e-6)
