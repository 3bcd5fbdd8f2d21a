"""Lexical indexes the second release wrote (format 1) open and answer as that release did.

``tests/assets/lexical_v1`` was written by the release's own ``LexicalIndex`` (see its README):
300 rows, built, added to, then 45 deleted; ``hits.json`` is what that release answered.
Also the interim :class:`flowsearch.lexical.legacy.LexicalIndex` (the current layout's one
index per version, on the new modules) against the release's code kept in the tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from lexical_helpers import QUERIES, assert_same_postings, bits, corpus
from lexical_reference import LexicalIndex as ReleaseIndex

from flowsearch.errors import BadInput, IndexDamaged
from flowsearch.lexical.bm25 import Bm25
from flowsearch.lexical.legacy import LexicalIndex
from flowsearch.lexical.postings import Postings
from flowsearch.lexical.postings_files import LEGACY_FILES

ASSET = Path(__file__).resolve().parent / "assets" / "lexical_v1"


def _release_hits() -> list[dict]:
    return json.loads((ASSET / "hits.json").read_text(encoding="utf-8"))


def _expected(hit: dict) -> tuple[np.ndarray, np.ndarray]:
    scores = np.array([float.fromhex(s) for s in hit["scores"]], dtype=np.float32)
    return scores, np.array(hit["rows"], dtype=np.int64)


def test_postings_open_the_release_files_and_bm25_answers_as_it_did():
    postings = Postings.load(ASSET / "lexical")
    assert sorted(p.name for p in (ASSET / "lexical").iterdir()) == sorted(LEGACY_FILES)
    # the deletions are the segment's deletion file's business; here the release's own record
    deleted = ~np.load(ASSET / "lexical" / "live.npy")
    bm25 = Bm25([(postings, deleted)])  # the release's parameters: lucene, k1 1.5, b 0.75
    assert (bm25.n_rows, bm25.n_live) == (300, 255)
    hits = _release_hits()
    assert sum(len(h["rows"]) for h in hits) == 637
    scores, rows = bm25.search([h["query"] for h in hits], k=300)
    for i, hit in enumerate(hits):
        want_scores, want_rows = _expected(hit)
        np.testing.assert_array_equal(rows[i][: len(want_rows)], want_rows)
        assert np.all(rows[i][len(want_rows) :] == -1)
        np.testing.assert_array_equal(bits(scores[i][: len(want_rows)]), bits(want_scores))


def test_the_release_files_merge_into_the_postings_of_their_live_texts():
    texts = json.loads((ASSET / "texts.json").read_text(encoding="utf-8"))
    live = np.load(ASSET / "lexical" / "live.npy")
    merged = Postings.merge([(Postings.load(ASSET / "lexical", mmap=True), live)])
    assert_same_postings(merged, Postings.build([t for t, k in zip(texts, live) if k]))


def test_the_interim_index_opens_the_release_files_and_saves_them_back(tmp_path):
    lex = LexicalIndex.load(ASSET / "lexical")
    assert (lex.n_rows, lex.n_live, lex.params["method"]) == (300, 255, "lucene")
    hits = _release_hits()
    scores, rows = lex.search([h["query"] for h in hits], k=300)
    for i, hit in enumerate(hits):
        want_scores, want_rows = _expected(hit)
        np.testing.assert_array_equal(rows[i][: len(want_rows)], want_rows)
        np.testing.assert_array_equal(bits(scores[i][: len(want_rows)]), bits(want_scores))
    lex.save(tmp_path / "lexical")
    lex.save(tmp_path / "lexical")  # over its own files
    config = json.loads((tmp_path / "lexical" / "config.json").read_text())
    assert (config["format_version"], config["k1"], config["n_live"]) == (1, 1.5, 255)
    back = LexicalIndex.load(tmp_path / "lexical")
    np.testing.assert_array_equal(back.live, lex.live)
    np.testing.assert_array_equal(back.search(QUERIES, k=50)[1], lex.search(QUERIES, k=50)[1])


def test_the_interim_index_refuses_damaged_deletions(tmp_path):
    shutil.copytree(ASSET / "lexical", tmp_path / "lexical")
    np.save(tmp_path / "lexical" / "live.npy", np.ones(299, bool))
    with pytest.raises(IndexDamaged, match="live.npy does not match the rows"):
        LexicalIndex.load(tmp_path / "lexical")
    Postings.load(tmp_path / "lexical")  # the postings themselves are fine
    Postings.build(corpus(5)).save(tmp_path / "v2")
    with pytest.raises(IndexDamaged, match="not a lexical index of format 1"):
        LexicalIndex.load(tmp_path / "v2")


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_the_interim_index_answers_as_the_release_through_writes(method):
    texts = corpus(400, seed=21)
    params = {"k1": 1.1, "b": 0.6, "method": method}
    old, new = ReleaseIndex.build(texts[:150], **params), LexicalIndex.build(texts[:150], **params)
    rng = np.random.default_rng(22)
    steps = [("add", texts[150:260]), ("delete", rng.choice(260, 70, replace=False))]
    steps += [("add", texts[260:]), ("delete", rng.choice(400, 50, replace=False)), ("compact",)]
    steps += [("delete", np.arange(0, 200, 3))]
    for step in steps:
        results = [getattr(index, step[0])(*step[1:]) for index in (old, new)]
        np.testing.assert_array_equal(results[0], results[1])
        assert (old.n_rows, old.n_live, old.nnz) == (new.n_rows, new.n_live, new.nnz)
        s_old, r_old = old.search(QUERIES, k=400)
        s_new, r_new = new.search(QUERIES, k=400)
        width = r_new.shape[1]
        np.testing.assert_array_equal(r_new, r_old[:, :width])
        np.testing.assert_array_equal(bits(s_new), bits(s_old[:, :width]))
    assert old.vocab_size == new.vocab_size  # compact dropped the same terms


def test_the_interim_index_refuses_rows_out_of_range():
    lex = LexicalIndex.build(corpus(10))
    with pytest.raises(BadInput, match="cannot delete row 10"):
        lex.delete([2, 10])
    assert lex.n_live == 10 and lex.delete([2, 2]) == 1 and lex.delete([2]) == 0
