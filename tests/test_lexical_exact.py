"""Property tests: BM25 over segments is exact.

For random corpora, random cuts into 1-6 segments and random deletions, :class:`Bm25` answers bit
for bit what one segment built from the live rows (in the same order) answers, and what the
second release's ``LexicalIndex`` (built, added to and deleted from) answered; merging segments
gives the postings of a build of the kept rows.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from lexical_helpers import QUERIES, WORDS, assert_same_postings, bits, corpus
from lexical_reference import LexicalIndex

from flowsearch.lexical import postings
from flowsearch.lexical.bm25 import Bm25
from flowsearch.lexical.postings import Postings

METHODS = st.sampled_from(["lucene", "robertson", "atire"])
K1 = st.sampled_from([0.0, 0.9, 1.2, 1.5, 2.0])
B = st.sampled_from([0.0, 0.4, 0.75, 1.0])


@st.composite
def cut_corpora(draw: st.DrawFn) -> tuple[list[str], list[int], np.ndarray]:
    """(texts, segment boundaries [0, ..., n], deleted bool (n,))."""
    n = draw(st.integers(0, 90))
    texts = corpus(n, seed=draw(st.integers(0, 10**6)), max_len=draw(st.integers(2, 25)))
    for i in draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=3)) if n else []:
        texts[i] = draw(st.sampled_from(["", "?!", "the and of", "東京タワー"]))
    inner = draw(st.lists(st.integers(0, n), max_size=5))
    cuts = [0, *sorted(inner), n]
    rate = draw(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]))
    rng = np.random.default_rng(draw(st.integers(0, 10**6)))
    return texts, cuts, rng.random(n) < rate


@st.composite
def queries(draw: st.DrawFn) -> list[str]:
    """QUERIES plus a few random ones over the corpus words (repeats and unknown words)."""
    words = st.sampled_from([*WORDS, "zebra", "the"])
    extra = draw(st.lists(st.lists(words, min_size=1, max_size=6), min_size=1, max_size=3))
    return QUERIES + [" ".join(q) for q in extra]


def _segmented(texts: list[str], cuts: list[int], deleted: np.ndarray) -> list:
    segments = []
    for a, b in zip(cuts, cuts[1:]):
        mask = deleted[a:b].copy() if deleted[a:b].any() else None
        segments.append((Postings.build(texts[a:b]), mask))
    return segments


def _as_global(rows: np.ndarray, live: np.ndarray) -> np.ndarray:
    """One live-rows segment's rows as rows of the whole corpus (-1 stays -1)."""
    return np.where(rows >= 0, live[np.maximum(rows, 0)], -1)


@settings(max_examples=80, deadline=None)
@given(cut_corpora(), queries(), METHODS, K1, B, st.sampled_from([1, 3, 10, 10**9]), st.data())
def test_segments_answer_as_one_segment_of_the_live_rows(corpus_, qs, method, k1, b, k, data):
    # bisection or dictionaries for the vocabularies, the block cache on or off
    min_terms = data.draw(st.sampled_from([1, 10**9]))
    cache = data.draw(st.sampled_from([0, 2**20]))
    with mock.patch.object(postings, "BISECT_MIN_TERMS", min_terms):
        _segments_answer_as_one_segment(corpus_, qs, method, k1, b, k, data, cache)


def _segments_answer_as_one_segment(corpus_, qs, method, k1, b, k, data, cache):
    texts, cuts, deleted = corpus_
    live = np.flatnonzero(~deleted)
    params = {"k1": k1, "b": b, "method": method}
    segmented = Bm25(_segmented(texts, cuts, deleted), cache_bytes=cache, **params)
    one = Bm25([(Postings.build([texts[i] for i in live]), None)], **params)
    assert (segmented.n_rows, segmented.n_live) == (len(texts), len(live))
    allowed = None
    if data.draw(st.booleans()):
        allowed = np.random.default_rng(data.draw(st.integers(0, 99))).random(len(texts)) < 0.5
    scores, rows = segmented.search(qs, k, allowed=allowed)
    ref_scores, ref_rows = one.search(qs, k, allowed=None if allowed is None else allowed[live])
    np.testing.assert_array_equal(rows, _as_global(ref_rows, live))
    np.testing.assert_array_equal(bits(scores), bits(ref_scores))
    # hybrid's one scoring per query: the same answer, and score_rows' scores of asked rows
    asked = np.random.default_rng(len(qs)).integers(-1, len(texts), size=(len(qs), 6))
    (both_scores, both_rows), scored = segmented.search_and_score(qs, k, asked, allowed=allowed)
    np.testing.assert_array_equal(both_rows, rows)
    np.testing.assert_array_equal(bits(both_scores), bits(scores))
    want = np.full(asked.shape, np.nan)
    for qi, q in enumerate(qs):
        valid = asked[qi] >= 0
        if valid.any():
            want[qi, valid] = segmented.score_rows(q, asked[qi, valid])
    np.testing.assert_array_equal(scored, want)
    for q in qs[:3]:
        assert segmented.upper_bound(q) == one.upper_bound(q)
        np.testing.assert_array_equal(
            bits(segmented.score_rows(q, np.arange(len(texts)))[live]),
            bits(one.score_rows(q, np.arange(len(live)))),
        )


@settings(max_examples=60, deadline=None)
@given(cut_corpora(), queries(), METHODS, K1, B)
def test_equals_the_second_release_index_after_add_and_delete(corpus_, qs, method, k1, b):
    texts, cuts, deleted = corpus_
    params = {"k1": k1, "b": b, "method": method}
    old = LexicalIndex.build(texts[: cuts[1]], **params)
    for a, end in zip(cuts[1:], cuts[2:]):  # the release grew by adds, one per segment
        old.add(texts[a:end])
    old.delete(np.flatnonzero(deleted))
    new = Bm25(_segmented(texts, cuts, deleted), **params)
    old_scores, old_rows = old.search(qs, k=max(len(texts), 1))
    scores, rows = new.search(qs, k=max(len(texts), 1))
    width = rows.shape[1]
    assert np.all(old_rows[:, width:] == -1)
    np.testing.assert_array_equal(rows, old_rows[:, :width])
    np.testing.assert_array_equal(bits(scores), bits(old_scores[:, :width]))


@settings(max_examples=60, deadline=None)
@given(cut_corpora(), st.data())
def test_merge_equals_a_build_of_the_kept_rows(corpus_, data):
    texts, cuts, deleted = corpus_
    segments = []
    for a, b in zip(cuts, cuts[1:]):
        keep = None if data.draw(st.booleans()) else ~deleted[a:b]
        segments.append((Postings.build(texts[a:b]), keep))
    kept = [t for (a, b), (_, keep) in zip(zip(cuts, cuts[1:]), segments) for t, k in
            zip(texts[a:b], np.ones(b - a, bool) if keep is None else keep) if k]  # fmt: skip
    assert_same_postings(Postings.merge(segments), Postings.build(kept))
