"""Dense search over segments (flowsearch.search.dense): per-segment answers merged into one
exact top-k; a Flat index cut into segments answers exactly as one segment does."""

from __future__ import annotations

import os

import faiss
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowsearch.search.dense import merge_top_k, search_segments
from flowsearch.search.segment import SegmentReader

F32 = np.float32


def _answer(scores, rows):
    return np.array(scores, F32), np.array(rows, np.int64)


def test_merge_is_the_top_k_by_score_over_every_segment():
    answers = [
        _answer([[0.9, 0.5, 0.1], [0.3, 0.2, 0.1]], [[2, 0, 1], [0, 1, 2]]),  # rows 0..2
        _answer([[0.7, 0.6], [0.8, 0.05]], [[1, 0], [0, 1]]),  # rows 10..11
        _answer([[0.95], [0.0]], [[0], [0]]),  # row 20
    ]
    offsets = np.array([0, 10, 20, 21])
    scores, rows = merge_top_k(answers, offsets, 4)
    assert rows.tolist() == [[20, 2, 11, 10], [10, 0, 1, 2]]
    np.testing.assert_array_equal(
        scores, np.array([[0.95, 0.9, 0.7, 0.6], [0.8, 0.3, 0.2, 0.1]], F32)
    )
    assert scores.dtype == F32 and rows.dtype == np.int64


def test_ties_go_to_the_lower_global_row():
    answers = [
        _answer([[0.5, 0.5, 0.2]], [[4, 1, 0]]),  # a segment listing its tie high row first
        _answer([[0.5, 0.5]], [[1, 0]]),  # rows 5 and 6 after offset
    ]
    scores, rows = merge_top_k(answers, np.array([0, 5, 7]), 4)
    assert rows.tolist() == [[1, 4, 5, 6]] and scores.tolist() == [[0.5] * 4]
    _, rows = merge_top_k(answers[::-1], np.array([0, 2, 7]), 3)  # the other order: same rule
    assert rows.tolist() == [[0, 1, 3]]


def test_missing_hits_are_skipped_and_short_answers_padded():
    answers = [
        _answer(
            [[0.9, -3.4e38, -3.4e38], [-3.4e38, -3.4e38, -3.4e38]], [[0, -1, -1], [-1, -1, -1]]
        ),
        _answer([[0.4], [-3.4e38]], [[0], [-1]]),
    ]
    scores, rows = merge_top_k(answers, np.array([0, 3, 4]), 5)
    # as wide as the most hits any query has (2), never wider than k; -1 and -inf pad
    assert rows.tolist() == [[0, 3], [-1, -1]]
    assert scores[0].tolist() == pytest.approx([0.9, 0.4]) and np.isneginf(scores[1]).all()
    scores, rows = merge_top_k(answers, np.array([0, 3, 4]), 1)
    assert rows.tolist() == [[0], [-1]]
    none = [_answer([[-1.0]], [[-1]])]
    assert merge_top_k(none, np.array([0, 1]), 3)[1].shape == (1, 0)
    assert merge_top_k([], np.array([0]), 3)[1].shape == (0, 0)


def _flat(x: np.ndarray) -> SegmentReader:
    """A segment reader holding only an exact index over ``x`` (what search reads)."""
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    return SegmentReader(record=None, folder=None, rows=None, ann=index, postings=None)  # type: ignore[arg-type]


def _search(x, cuts, queries, k, deleted, keep):
    """search_segments over ``x`` cut at ``cuts`` (global ``deleted`` mask, ``keep`` rows)."""
    bounds = [0, *cuts, len(x)]
    segments = [_flat(x[a:b]) for a, b in zip(bounds, bounds[1:])]
    offsets = np.array(bounds, np.int64)
    dead = [deleted[a:b] if deleted[a:b].any() else None for a, b in zip(bounds, bounds[1:])]
    rows = [None] * len(segments)
    if keep is not None:
        rows = [keep[(keep >= a) & (keep < b)] - a for a, b in zip(bounds, bounds[1:])]
    return search_segments(segments, dead, offsets, queries, k, rows)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(7, 120),
    n_queries=st.integers(1, 24),  # past FAISS's BLAS threshold (20 queries) too
    k=st.integers(1, 130),
    seed=st.integers(0, 2**32 - 1),
    deleted_share=st.sampled_from([0.0, 0.1, 0.6]),
    filtered=st.booleans(),
    data=st.data(),
)
def test_a_flat_index_cut_into_segments_answers_exactly_as_one(
    n, n_queries, k, seed, deleted_share, filtered, data
):
    rng = np.random.default_rng(seed)
    dim = 8
    x = rng.normal(size=(n, dim)).astype(F32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    queries = rng.normal(size=(n_queries, dim)).astype(F32)
    deleted = rng.random(n) < deleted_share
    keep = np.flatnonzero(rng.random(n) < 0.5).astype(np.int64) if filtered else None
    whole = _search(x, [], queries, k, deleted, keep)
    for parts in (3, 7):
        cuts = sorted(
            data.draw(st.sets(st.integers(1, n - 1), min_size=parts - 1, max_size=parts - 1))
        )
        got = _search(x, cuts, queries, k, deleted, keep)
        np.testing.assert_array_equal(got[1], whole[1])
        np.testing.assert_array_equal(got[0], whole[0])
    # and both are the exact answer over the searchable rows (checked against float64)
    allowed = ~deleted
    if keep is not None:
        mask = np.zeros(n, bool)
        mask[keep] = True
        allowed &= mask
    width = min(k, int(allowed.sum()))
    assert whole[1].shape == (n_queries, width)
    exact = np.where(allowed, queries.astype(np.float64) @ x.T.astype(np.float64), -np.inf)
    for q in range(n_queries):
        found = whole[1][q]
        assert allowed[found].all() and len(set(found.tolist())) == width
        np.testing.assert_allclose(whole[0][q], exact[q, found], rtol=1e-5, atol=1e-6)
        assert np.all(np.diff(whole[0][q]) <= 0)
        others = np.delete(exact[q], found)
        if width and others.size:  # nothing left out scores above the last hit
            assert others.max() <= whole[0][q][-1] + 1e-5


@pytest.mark.parametrize("cuts", [[], [3], [2, 5, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]])
@pytest.mark.parametrize("n_queries", [1, 25])  # FAISS's scan and BLAS paths
def test_exact_ties_across_segments_go_to_the_lowest_rows(cuts, n_queries):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(12, 8)).astype(F32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[[1, 4, 6, 7, 10]] = x[0]  # six copies of one vector
    queries = np.repeat(x[:1], n_queries, axis=0)
    deleted = np.zeros(12, bool)
    deleted[4] = True
    scores, rows = _search(x, cuts, queries, 4, deleted, None)
    assert rows.tolist() == [[0, 1, 6, 7]] * n_queries
    assert len(set(scores.ravel().tolist())) == 1


# -- one query's segments searched by its own thread and helpers (SegmentHelpers) --


class _Pool:
    """An executor whose helpers run on real threads, counting what it was given."""

    def __init__(self, workers: int = 1) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.inner = ThreadPoolExecutor(workers)
        self.submitted = 0

    def submit(self, fn, *args):
        self.submitted += 1
        return self.inner.submit(fn, *args)


def _segments(seed: int = 3, parts: int = 8):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(400, 16)).astype(F32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    bounds = np.linspace(0, 400, parts + 1).astype(np.int64)
    deleted = rng.random(400) < 0.1
    segments = [_flat(x[a:b]) for a, b in zip(bounds, bounds[1:])]
    dead = [deleted[a:b] for a, b in zip(bounds, bounds[1:])]
    rows = [None] * parts
    rows[2] = np.arange(0, 50, 3, dtype=np.int64)  # a filter keeping some of one segment
    rows[5] = np.zeros(0, np.int64)  # and none of another
    queries = rng.normal(size=(1, 16)).astype(F32)
    return segments, dead, bounds, queries, rows


class _Timed:
    """A segment whose search records the thread it ran on, after a short sleep (so helpers
    that wake within it get segments of their own)."""

    def __init__(self, inner, log, pause=0.002, fail_on_helper=False):
        self.inner, self.log, self.pause, self.fail_on_helper = inner, log, pause, fail_on_helper

    def search(self, *args):
        import threading
        import time

        main = threading.current_thread() is threading.main_thread()
        self.log.append(main)
        time.sleep(self.pause)
        if self.fail_on_helper and not main:
            raise RuntimeError("segment file unreadable")
        return self.inner.search(*args)


@pytest.mark.parametrize("threads", [2, 3, 9])
def test_segments_searched_on_helper_threads_answer_as_in_turn(threads):
    from flowsearch.search.dense import SegmentHelpers

    segments, dead, offsets, queries, rows = _segments()
    alone = search_segments(segments, dead, offsets, queries, 10, rows)
    log: list[bool] = []
    timed = [_Timed(s, log) for s in segments]
    pool = _Pool(threads)
    helpers = SegmentHelpers(threads, pool)
    for _ in range(20):
        got = search_segments(timed, dead, offsets, queries, 10, rows, helpers=helpers)
        np.testing.assert_array_equal(got[1], alone[1])
        np.testing.assert_array_equal(got[0], alone[0])
    assert pool.submitted == 20 * (min(threads, 7) - 1)  # 7 segments have rows to search
    assert len(log) == 20 * 7 and log.count(False) > 0  # helpers did search segments
    pool.inner.shutdown()


def test_a_query_never_waits_for_a_helper_that_has_not_started():
    """The pool's only worker is busy elsewhere: the query's own thread searches every segment
    and returns (the helper it asked for is cancelled, never run)."""
    import threading

    from flowsearch.search.dense import SegmentHelpers

    segments, dead, offsets, queries, rows = _segments()
    alone = search_segments(segments, dead, offsets, queries, 10, rows)
    pool = _Pool(1)
    release = threading.Event()
    busy = pool.inner.submit(release.wait, 30)
    try:
        helpers = SegmentHelpers(2, pool)
        got = search_segments(segments, dead, offsets, queries, 10, rows, helpers=helpers)
        np.testing.assert_array_equal(got[1], alone[1])
        assert pool.submitted == 1 and not busy.done()
    finally:
        release.set()
        pool.inner.shutdown()


def test_no_helper_is_asked_for_while_other_queries_hold_the_threads():
    from flowsearch.search.dense import SegmentHelpers

    segments, dead, offsets, queries, rows = _segments()
    pool = _Pool(1)
    helpers = SegmentHelpers(2, pool)
    helpers.running = 1  # one query already searching, on 2 threads
    got = search_segments(segments, dead, offsets, queries, 10, rows, helpers=helpers)
    assert pool.submitted == 0 and got[1].shape == (1, 10)
    assert helpers.running == 1  # its own count given back
    pool.inner.shutdown()


def test_an_error_in_a_helper_reaches_the_query_and_no_search_outlives_it():
    """A segment fails only on a helper thread: the query raises that error, and when it
    returns no helper is still searching (nothing more is searched after, the count of
    searching queries is given back)."""
    import time

    from flowsearch.search.dense import SegmentHelpers

    segments, dead, offsets, queries, rows = _segments()
    log: list[bool] = []
    timed = [_Timed(s, log, pause=0.02, fail_on_helper=True) for s in segments]
    pool = _Pool(1)
    helpers = SegmentHelpers(2, pool)
    try:
        with pytest.raises(RuntimeError, match="unreadable"):
            search_segments(timed, dead, offsets, queries, 10, rows, helpers=helpers)
        assert helpers.running == 0
        searched = len(log)
        time.sleep(0.1)
        assert len(log) == searched < 7  # it stopped: the other segments were never taken
    finally:
        pool.inner.shutdown()


def test_segment_threads_zero_means_the_usable_cores_at_most_four(monkeypatch):
    import os

    from flowsearch.errors import BadInput
    from flowsearch.search import dense
    from flowsearch.search.options import SearchOptions

    assert SearchOptions().segment_threads == 0  # the default
    with pytest.raises(BadInput, match="segment_threads"):
        SearchOptions(segment_threads=-2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert dense.segment_threads(0) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert dense.segment_threads(0) == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert dense.segment_threads(0) == 1
    assert dense.segment_threads(3) == 3


def test_closed_helpers_search_on_the_query_thread_alone():
    """After its owner closes them, a query still answers (in turn), and no thread is left."""
    from flowsearch.search.dense import SegmentHelpers

    segments, dead, offsets, queries, rows = _segments()
    alone = search_segments(segments, dead, offsets, queries, 10, rows)
    helpers = SegmentHelpers(3)
    pool = helpers.executor()
    assert pool is not None
    helpers.close()
    assert helpers.executor() is None and pool._shutdown  # type: ignore[attr-defined]
    got = search_segments(segments, dead, offsets, queries, 10, rows, helpers=helpers)
    np.testing.assert_array_equal(got[1], alone[1])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_no_searches_and_its_own_pool():
    """The parent's pool threads do not exist in a forked child, nor do its searches: the
    child makes a new pool and counts no search running."""
    from flowsearch.search.dense import SegmentHelpers

    helpers = SegmentHelpers(2)
    parent_pool = helpers.executor()
    helpers.running = 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit
        child_pool = helpers.executor()
        ok = helpers.running == 0
        ok = ok and child_pool is not None and child_pool is not parent_pool
        ok = ok and child_pool.submit(lambda: 7).result(timeout=10) == 7
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"1"
    assert helpers.running == 1 and helpers.executor() is parent_pool  # the parent's own
    helpers.close()


def _sorted_merge(answers, offsets, k):
    """merge_top_k by its general path (the sort), for comparing with its one-answer path."""
    n = len(answers[0][0])
    pad = (np.full((n, 1), -np.inf, np.float32), np.full((n, 1), -1))
    return merge_top_k([*answers, pad], np.append(offsets, offsets[-1]), k)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 4),
    st.integers(0, 12),
    st.integers(1, 15),
    st.integers(0, 3),
    st.integers(0, 2**31 - 1),
)
def test_one_segments_answer_merges_as_the_sort_does(n_queries, width, k, levels, seed):
    """The one-answer path (no sort when the scores strictly fall) gives the general path's
    answer: ties (few distinct scores), unsorted answers and -1 padding included."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n_queries, width))
    if levels:  # few distinct values: ties
        values = np.round(values * levels) / levels
    scores = np.sort(values, axis=1)[:, ::-1].astype(np.float32)
    if seed % 5 == 0:
        scores = values.astype(np.float32)  # not in order
    rows = np.stack([rng.permutation(40)[:width] for _ in range(n_queries)]).astype(np.int64)
    short = rng.integers(0, width + 1, size=n_queries)
    for qi, n in enumerate(short):  # FAISS pads a short answer with -1 rows
        rows[qi, n:] = -1
        scores[qi, n:] = -np.inf if seed % 2 else -3.4e38
    offsets = np.array([7, 47])
    got = merge_top_k([(scores, rows)], offsets, k)
    want = _sorted_merge([(scores, rows)], offsets, k)
    assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
