"""An index built by the fourth release (0.3.0; ``tests/assets/make_index_r4.py`` wrote it: a
flow calibrator, passages, a tuned HNSW segment beside a Flat one, deletions, BM25 postings, a
reference sample with a delta) opens, verifies and answers every mode as it did, and takes
writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flowsearch import Searcher, upsert

ASSETS = Path(__file__).parent / "assets"
MODEL = ASSETS / "tiny_bert"
RECORDED: dict[str, list[list[object]]] = json.loads((ASSETS / "index_r4_hits.json").read_text())


def _answers(searcher: Searcher, key: str) -> list[list[object]]:
    mode, query = key.split("|")
    where = "year >= 2000" if mode == "where" else None
    hits = searcher.search(query, k=8, mode="dense" if mode == "where" else mode, where=where)
    return [
        [h.id, h.score, h.dense_score, h.lexical_score,
         None if h.highlight is None else [h.highlight.start, h.highlight.end]]
        for h in hits
    ]  # fmt: skip


@pytest.fixture()
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the asset, searched with the fourth release's dense rule for long documents
    (a document scored by its best passage): the fifth release scores a long document by the
    mean of its best passage and its centroid (flowsearch.search.document_scores), which moves
    the recorded rankings by design; reading the files is what these tests check."""
    from flowsearch.search import document_scores

    monkeypatch.setattr(document_scores, "rescored_segment", lambda seg, Z, s, r: (s, r))
    monkeypatch.setattr(document_scores, "document_cosines", lambda segs, o, Z, r, cos: cos)
    return Path(shutil.copytree(ASSETS / "index_r4", tmp_path / "r4"))


def test_the_fifth_release_rule_moves_only_long_documents(tmp_path: Path) -> None:
    """Without the patch: every hit still comes from the index, a whole document keeps its
    recorded cosine, and a long document's dense score lies between its centroid's and its
    best passage's (so at most its recorded best passage's cosine)."""
    index = Path(shutil.copytree(ASSETS / "index_r4", tmp_path / "r4"))
    searcher = Searcher.open(index, model=MODEL, verify=True)
    moved = 0
    for key in (k for k in RECORDED if k.startswith("dense|")):
        recorded = {h[0]: h for h in RECORDED[key]}
        for h in _answers(searcher, key):
            if h[0] in recorded and h[4] is None:
                assert h[2] == pytest.approx(recorded[h[0]][2], abs=1e-5)
            elif h[0] in recorded:
                assert h[2] <= recorded[h[0]][2] + 1e-5
                moved += h[2] < recorded[h[0]][2] - 1e-4
    assert moved  # the rule is in force: some long document scores below its best passage


def test_recorded_answers_cover_passages_and_both_segments() -> None:
    """The asset exercises what it claims: highlights (passages) and hits from the upserted
    segment (ids ``n...``) are among the recorded answers."""
    hits = [h for answer in RECORDED.values() for h in answer]
    assert any(h[4] is not None for h in hits)
    assert any(str(h[0]).startswith("n") for h in hits)
    assert not any(h[0] in ("d3", "d4", "d5") for h in hits)  # deleted


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_fourth_release_index_answers_as_it_did(index: Path, key: str) -> None:
    searcher = Searcher.open(index, model=MODEL, verify=True)
    got = _answers(searcher, key)
    want = RECORDED[key]
    assert [h[0] for h in got] == [h[0] for h in want]
    for g, w in zip(got, want):
        for a, b in zip(g[1:4], w[1:4]):
            assert (a is None) == (b is None)
            if a is not None:
                assert a == pytest.approx(b, abs=1e-5)
        assert g[4] == w[4]


def test_fourth_release_index_takes_a_write(index: Path) -> None:
    upsert(index, [{"id": "q1", "text": "zzz unrelated", "topic": "q", "year": 1900}], model=MODEL)
    searcher = Searcher.open(index, model=MODEL, verify=True)
    assert searcher.info().n_documents == 208  # 207 and the new one
    for key in (k for k in RECORDED if k.startswith("dense|")):
        got = [h[0] for h in _answers(searcher, key) if h[0] != "q1"]
        assert got == [h[0] for h in RECORDED[key]][: len(got)]
