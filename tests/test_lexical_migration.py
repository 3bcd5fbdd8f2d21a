"""Lexical indexes the second release wrote (format 1) open and answer as that release did.

``tests/assets/lexical_v1`` was written by the release's own ``LexicalIndex`` (see its README):
300 rows, built, added to, then 45 deleted; ``hits.json`` is what that release answered.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from lexical_helpers import assert_same_postings, bits

from flowsearch.lexical.bm25 import Bm25
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
