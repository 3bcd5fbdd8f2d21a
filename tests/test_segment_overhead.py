"""What a query pays per segment, cut without changing an answer: the merge of the segments'
answers, the searchable-rows mask of a segment with deletions, and the HNSW search parameters
made once per index and efSearch (each against the plain computation it replaced)."""

from __future__ import annotations

import faiss
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flowsearch.ann import io as ann_io
from flowsearch.ann.prefilter import _keep_mask, allowed_rows
from flowsearch.search.dense import merge_top_k


def _merged_plainly(answers, offsets, k):
    """merge_top_k as it was: each segment's rows shifted in turn, then the same ordering."""
    scores = np.concatenate([a[0] for a in answers], axis=1).astype(np.float32)
    rows = np.concatenate(
        [np.where(a[1] >= 0, a[1] + offsets[i], -1) for i, a in enumerate(answers)], axis=1
    ).astype(np.int64)
    valid = rows >= 0
    width = int(min(k, valid.sum(axis=1).max(initial=0)))
    key_score = np.where(valid, -scores.astype(np.float64), np.inf)
    key_row = np.where(valid, rows, np.iinfo(np.int64).max)
    order = np.lexsort((key_row, key_score), axis=-1)[:, :width]
    top_rows = np.take_along_axis(rows, order, axis=1)
    top_scores = np.take_along_axis(scores, order, axis=1)
    return np.where(top_rows >= 0, top_scores, -np.inf).astype(np.float32), top_rows


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(1, 12), st.integers(0, 999))
def test_merging_segment_answers_equals_the_plain_merge(n_segments, n_queries, k, seed):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 30, n_segments)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    answers = []
    for size in sizes:
        width = int(rng.integers(1, 8))
        rows = rng.integers(-1, size, (n_queries, width)).astype(np.int64)
        scores = rng.choice([0.1, 0.5, 0.9], (n_queries, width)).astype(np.float32)  # ties
        answers.append((scores, rows))
    got = merge_top_k(answers, offsets, k)
    want = _merged_plainly(answers, offsets, k)
    if want[1].shape[1] == 0:
        assert got[1].shape[1] == 0
        return
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 50), st.integers(0, 999), st.booleans(), st.booleans())
def test_the_searchable_mask_equals_the_plain_one(n, seed, filtered, as_rows):
    rng = np.random.default_rng(seed)
    dead = rng.random(n) < 0.3
    rows = np.flatnonzero(rng.random(n) < 0.6) if filtered else None
    excluded = np.flatnonzero(dead) if as_rows else dead
    want = np.zeros(n, bool) if rows is not None else np.ones(n, bool)
    if rows is not None:
        want[rows] = True
    want[dead] = False
    got = _keep_mask(n, rows, excluded)
    if not dead.any() and (rows is None or len(rows) == n):
        assert got is None
        return
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(allowed_rows(n, rows, excluded), np.flatnonzero(want))
    assert not np.shares_memory(got, dead)  # the caller's deletions are never handed out


def test_hnsw_search_parameters_are_made_once_per_index_and_value():
    x = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)
    one, two = (faiss.index_factory(8, "HNSW16", faiss.METRIC_INNER_PRODUCT) for _ in range(2))
    one.add(x)
    two.add(x)
    assert ann_io.knob_params(one, 40) is ann_io.knob_params(one, 40)
    assert ann_io.knob_params(one, 40).efSearch == 40
    assert ann_io.knob_params(one, 80) is not ann_io.knob_params(one, 40)
    assert ann_io.knob_params(two, 40) is not ann_io.knob_params(one, 40)
    assert ann_io.knob_params(one, None) is None
    fresh = faiss.SearchParametersHNSW(efSearch=16)
    for _ in range(2):  # the shared parameters search as fresh ones do
        got = ann_io.search(one, x[:20], 5, 16)
        want = one.search(x[:20], 5, params=fresh)
        np.testing.assert_array_equal(got[1], want[1])
    flat = faiss.IndexFlatIP(8)
    assert ann_io.knob_params(flat, 40) is None
    ivf = faiss.index_factory(8, "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(x)
    ivf.max_codes = 123
    params = ann_io.knob_params(ivf, 3)
    assert (params.nprobe, params.max_codes) == (3, 123)
    assert ann_io.knob_params(ivf, 3) is not params  # IVF's copy the index's max_codes afresh
