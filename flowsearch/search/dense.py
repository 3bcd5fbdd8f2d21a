r"""Dense search over a version's segments: each segment's vector index, then one exact top-k.

Each segment answers its own top-k among its searchable rows (a ``where`` filter's rows minus
its deleted ones; :func:`flowsearch.ann.prefilter.filtered_search`); the answers are merged by
score, ties going to the lower global row. For exact (``Flat``) segments the result is the same
top-k as one segment holding every row.

Example:
    >>> merge_top_k([(np.array([[0.9, 0.1]], np.float32), np.array([[0, 1]]))],
    ...             np.array([0, 2]), 1)[1].tolist()
    [[0]]
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, Future, wait
from typing import Any

import numpy as np

from flowsearch.ann import io as ann_io
from flowsearch.settings import current

__all__ = ["cosines", "merge_top_k", "search_segments", "segment_threads"]


def merge_top_k(
    answers: Sequence[tuple[np.ndarray, np.ndarray]], offsets: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-segment answers into one top-k.

    Args:
        answers: per segment ``(scores float32 (q, k_i), local rows int64 (q, k_i))``, -1 for
            no hit.
        offsets: int64 (segments + 1,), each segment's first global row.
        k: hits per query.

    Returns:
        ``(scores float32 (q, k'), global rows int64 (q, k'))``, best first, ties to the lower
        row; ``k'`` is at most ``k`` and at most the hits found; -1 rows pad.
    """
    if not answers:
        return np.zeros((0, 0), np.float32), np.zeros((0, 0), np.int64)
    scores = np.concatenate([a[0] for a in answers], axis=1).astype(np.float32, copy=False)
    local = np.concatenate([a[1] for a in answers], axis=1).astype(np.int64, copy=False)
    shift = np.repeat(np.asarray(offsets[: len(answers)], np.int64),
                      [a[1].shape[1] for a in answers])  # fmt: skip
    valid = local >= 0
    rows = np.where(valid, local + shift, -1)
    width = int(min(k, valid.sum(axis=1).max(initial=0)))
    if width == 0:
        return np.zeros((len(rows), 0), np.float32), np.zeros((len(rows), 0), np.int64)
    key_score = np.where(valid, -scores.astype(np.float64), np.inf)
    key_row = np.where(valid, rows, np.iinfo(np.int64).max)
    order = np.lexsort((key_row, key_score), axis=-1)[:, :width]
    top_rows = np.take_along_axis(rows, order, axis=1)
    top_scores = np.take_along_axis(scores, order, axis=1)
    top_scores = np.where(top_rows >= 0, top_scores, -np.inf).astype(np.float32)
    return top_scores, top_rows


def search_segments(
    segments: Sequence[Any],
    deleted: Sequence[np.ndarray | None],
    offsets: np.ndarray,
    queries: np.ndarray,
    k: int,
    rows: Sequence[np.ndarray | None],
    knobs: Sequence[int | None] | None = None,
    pool: Executor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k over every segment (see the module docstring).

    Args:
        segments: the version's segment readers (``search(queries, k, rows, deleted, knob)``).
        deleted: per segment, its deleted rows (bool mask) or None.
        offsets: int64 (segments + 1,).
        queries: float32 (q, d) in the searched space.
        k: hits per query.
        rows: per segment, the local rows a filter kept (sorted int64) or None for all.
        knobs: per segment, its search knob for this version
            (:func:`flowsearch.ann.merged.choose_knobs`), None for its own; None: all its own.
        pool: searches the segments concurrently (each on one FAISS thread); None: in turn.
    """
    knobs = [None] * len(segments) if knobs is None else knobs
    work = [
        (seg, dead, keep, knob)
        for seg, dead, keep, knob in zip(segments, deleted, rows, knobs, strict=True)
        if keep is None or len(keep)
    ]
    if pool is not None and len(work) > 1:
        answers = _shared(work, queries, k, pool, max(1, min(segment_threads(), len(work))))
    else:
        answers = [seg.search(queries, k, keep, dead, knob) for seg, dead, keep, knob in work]
    if not answers:
        empty = np.zeros((len(queries), 0))
        return empty.astype(np.float32), empty.astype(np.int64)
    kept = [i for i, keep in enumerate(rows) if keep is None or len(keep)]
    return merge_top_k(answers, offsets[kept], k)


def segment_threads() -> int:
    """Threads that search one query's segments (``Settings.segment_threads``; 0: the cores
    this process may run on, at most 4)."""
    n = current().segment_threads
    if n != 0:
        return max(1, n)  # a negative setting: in turn
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cores or 1))


# Searches inside :func:`_shared` now, process-wide (one pool serves every searcher).
_RUNNING = 0
_RUNNING_LOCK = threading.Lock()


def _after_fork() -> None:
    """A forked child has none of its parent's searches (nor a lock one of them held)."""
    global _RUNNING, _RUNNING_LOCK
    _RUNNING, _RUNNING_LOCK = 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _shared(
    work: list[tuple[Any, Any, Any, Any]],
    queries: np.ndarray,
    k: int,
    pool: Executor,
    threads: int,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every segment of ``work`` searched by the calling thread and ``threads - 1`` helpers of
    ``pool``, each taking the next segment not yet taken (one FAISS thread each).

    The caller never idles waiting for a helper to wake: on a virtual machine waking an idle
    core took 0.1-1.2 ms (bench_segments), more than a 20k-row graph search; a helper that
    starts after the caller has taken every segment finds none and returns at once, and one
    that has not started is cancelled. Concurrent queries therefore never queue behind each
    other's segments: each query's own thread carries its search.
    """
    found: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(work)
    taken = itertools.count()  # next() is atomic under the GIL
    stop = threading.Event()  # set when the query is done (or failed): helpers take no more
    global _RUNNING
    with _RUNNING_LOCK:
        # each query searching holds a thread: ask for helpers only up to the threads no query
        # holds (4 concurrent clients lost 16% of their QPS to hand-offs when every query
        # asked for one)
        spare = threads - _RUNNING
        _RUNNING += 1

    def drain() -> None:
        def loop() -> None:
            try:
                while not stop.is_set() and (i := next(taken)) < len(work):
                    seg, dead, keep, knob = work[i]
                    found[i] = seg.search(queries, k, keep, dead, knob)
            except BaseException:
                stop.set()  # the query fails: the others take no more segments
                raise

        ann_io.single_threaded(loop)

    helpers: list[Future[None]] = []
    try:
        for _ in range(spare - 1):  # spare <= threads
            try:
                helpers.append(pool.submit(drain))
            except RuntimeError:  # the pool was replaced (and shut down): search alone
                break
        drain()
    finally:
        stop.set()
        running = [h for h in helpers if not h.cancel()]
        wait(running)  # none is left writing into this query's answers after it returns
        with _RUNNING_LOCK:
            _RUNNING -= 1
    for helper in running:
        helper.result()  # a helper's error is the query's
    assert all(f is not None for f in found)
    return [f for f in found if f is not None]


def cosines(
    segments: Sequence[Any], offsets: np.ndarray, queries: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """The cosine of each query (float32 (q, d), searched space) with each of its ``rows``
    (int64 (q, c) global rows, -1 for none): float64 (q, c), NaN for -1 (vectors read back by
    :meth:`~flowsearch.search.segment.SegmentReader.vectors`)."""
    out = np.full(rows.shape, np.nan)
    wanted = np.unique(rows[rows >= 0])
    if not len(wanted):
        return out
    seg_of = np.searchsorted(offsets, wanted, side="right") - 1
    vectors: dict[int, np.ndarray] = {}
    for s in np.unique(seg_of):
        pick = wanted[seg_of == s]
        found = segments[int(s)].vectors(pick - offsets[s])
        vectors.update(zip(pick.tolist(), found))
    for qi in range(len(rows)):
        for j, row in enumerate(rows[qi]):
            vector = vectors.get(int(row))
            if vector is not None:
                out[qi, j] = float(queries[qi] @ vector)
    return out
