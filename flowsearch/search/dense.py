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
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

import numpy as np

from flowsearch.ann import io as ann_io
from flowsearch.errors import BadInput

if TYPE_CHECKING:
    from flowsearch.search.segment import SegmentReader

__all__ = ["SegmentHelpers", "cosines", "merge_top_k", "search_segments", "segment_threads"]

#: A segment's answer re-scored: (segment, queries, scores, local rows) -> (scores, rows).
Rescore = Callable[
    ["SegmentReader", np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]
]


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
    if len(answers) == 1:
        ordered = _ordered(answers[0], int(offsets[0]), k)
        if ordered is not None:
            return ordered
    scores = np.concatenate([a[0] for a in answers], axis=1).astype(np.float32, copy=False)
    local = np.concatenate([a[1] for a in answers], axis=1).astype(np.int64, copy=False)
    shift = np.repeat(np.asarray(offsets[: len(answers)], np.int64),
                      [a[1].shape[1] for a in answers])  # fmt: skip
    valid = local >= 0
    rows = np.where(valid, local + shift, -1)
    width = int(min(k, valid.sum(axis=1).max(initial=0)))
    if width == 0:
        return _none(len(rows))
    key_score = np.where(valid, -scores.astype(np.float64), np.inf)
    key_row = np.where(valid, rows, np.iinfo(np.int64).max)
    order = np.lexsort((key_row, key_score), axis=-1)[:, :width]
    top_rows = np.take_along_axis(rows, order, axis=1)
    top_scores = np.take_along_axis(scores, order, axis=1)
    top_scores = np.where(top_rows >= 0, top_scores, -np.inf).astype(np.float32)
    return top_scores, top_rows


def _ordered(
    answer: tuple[np.ndarray, np.ndarray], offset: int, k: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """One answer already in the merged order (its hits first, scores strictly falling, so no
    tie to break): :func:`merge_top_k`'s result without the sort; None when it is not so."""
    scores, local = answer
    if scores.ndim != 2 or scores.shape != local.shape:
        return None
    if len(scores) == 1:  # one query: its few values compared as Python numbers
        return _ordered_one(scores[0].tolist(), local[0].tolist(), offset, k)
    valid = local >= 0
    width = int(min(k, valid.sum(axis=1).max(initial=0)))
    if width == 0:
        return _none(len(local))
    if not _prefix(valid):
        return None
    if not ((scores[:, :-1] > scores[:, 1:]) | ~valid[:, 1:]).all():
        return None  # out of order, ties or NaN: the sort orders them
    head_scores, head_valid = scores[:, :width], valid[:, :width]
    rows = np.where(head_valid, local[:, :width].astype(np.int64, copy=False) + offset, -1)
    top = np.where(head_valid, head_scores, -np.inf).astype(np.float32)
    return top, rows


def _ordered_one(
    scores: list[float], local: list[int], offset: int, k: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_ordered` for one query's answer given as lists."""
    n = next((i for i, row in enumerate(local) if row < 0), len(local))
    if any(row >= 0 for row in local[n:]):
        return None
    if not all(a > b for a, b in zip(scores[:n], scores[1:n], strict=False)):
        return None  # out of order, ties or NaN: the sort orders them
    width = min(k, n)
    return (np.array([scores[:width]], np.float32),
            np.array([[row + offset for row in local[:width]]], np.int64))  # fmt: skip


def _prefix(valid: np.ndarray) -> bool:
    """Whether each row's True values all come before its False ones."""
    return bool((valid[:, :-1] | ~valid[:, 1:]).all())


def _none(n_queries: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((n_queries, 0), np.float32), np.zeros((n_queries, 0), np.int64)


def search_segments(
    segments: Sequence[SegmentReader],
    deleted: Sequence[np.ndarray | None],
    offsets: np.ndarray,
    queries: np.ndarray,
    k: int,
    rows: Sequence[np.ndarray | None],
    knobs: Sequence[int | None] | None = None,
    helpers: SegmentHelpers | None = None,
    rescore: Rescore | None = None,
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
        helpers: search the segments concurrently, the calling thread with idle helpers (each
            on one FAISS thread); None: in turn.
        rescore: applied to each segment's answer before the merge (``rescore(segment,
            queries, scores, local rows)``: new scores and rows, best first), so the merged
            top-k does not depend on which segments are searched together (a shard's).
    """
    knobs = [None] * len(segments) if knobs is None else knobs
    work = [
        (seg, dead, keep, knob)
        for seg, dead, keep, knob in zip(segments, deleted, rows, knobs, strict=True)
        if keep is None or len(keep)
    ]
    if helpers is not None and helpers.threads > 1 and len(work) > 1:
        answers = helpers.search(work, queries, k)
    else:
        answers = [seg.search(queries, k, keep, dead, knob) for seg, dead, keep, knob in work]
    if not answers:
        empty = np.zeros((len(queries), 0))
        return empty.astype(np.float32), empty.astype(np.int64)
    if rescore is not None:
        answers = [rescore(w[0], queries, *a) for w, a in zip(work, answers, strict=True)]
    kept = [i for i, keep in enumerate(rows) if keep is None or len(keep)]
    return merge_top_k(answers, offsets[kept], k)


def segment_threads(setting: int = 0) -> int:
    """Threads that search one query's segments for ``SearchOptions.segment_threads``: the
    setting itself, or for 0 the cores this process may run on, at most 4."""
    if setting > 0:
        return setting
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cores or 1))


#: One segment's search: (segment, its deleted rows, the rows kept, its knob).
Work = tuple["SegmentReader", np.ndarray | None, np.ndarray | None, int | None]


class SegmentHelpers:
    """A searcher's helper threads for one query's segments, and the count of its queries
    searching with them (so a query asks for a helper only while a thread is idle).

    Owned by one searcher (or one shard) and shut down by its ``close()``; its threads are
    made on first use. A forked child starts with none of its parent's threads or searches:
    the first use in another process makes them afresh.

    Args:
        threads: threads per query, the query's own included (>= 1; see :func:`segment_threads`).
        executor: the helpers' executor instead of a pool of ``threads - 1`` made on first use
            (it is not shut down by :meth:`close`).
    """

    def __init__(self, threads: int, executor: Executor | None = None) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise BadInput(f"threads must be an integer >= 1, got {threads!r}", param="threads")
        self.threads = threads
        self._given = executor
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.running = 0  # this owner's queries inside :meth:`search` now
        self._closed = False

    def _here(self) -> None:
        """After a fork: the parent's threads and searches do not exist here (nor a lock one
        of its threads held)."""
        if self._pid != os.getpid():
            self._pid, self._lock, self.running, self._pool = os.getpid(), threading.Lock(), 0, None

    def executor(self) -> Executor | None:
        """The helpers (None after :meth:`close`)."""
        self._here()
        with self._lock:
            if self._closed:
                return None
            if self._given is not None:
                return self._given
            if self._pool is None and self.threads > 1:
                self._pool = ThreadPoolExecutor(self.threads - 1, "flowsearch-segments")
            return self._pool

    def close(self) -> None:
        """Stop the helper threads (a query still searching finishes on its own thread)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def search(
        self, work: list[Work], queries: np.ndarray, k: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every segment of ``work`` searched by the calling thread and up to ``threads - 1``
        idle helpers, each taking the next segment not yet taken (one FAISS thread each).

        The caller never idles waiting for a helper to wake (waking an idle core can take
        longer than a small segment's search): a helper that starts after the caller has
        taken every segment finds none and returns at once, and one that has not started is
        cancelled. Concurrent queries therefore never queue behind each other's segments:
        each query's own thread carries its search.
        """
        pool = self.executor()
        found: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(work)
        taken = itertools.count()  # next() is atomic under the GIL
        stop = threading.Event()  # set when the query is done (or failed): helpers take no more
        with self._lock:
            # each query searching holds a thread: ask for helpers only up to the threads no
            # query holds (hand-offs cost concurrent clients their throughput otherwise)
            spare = min(self.threads, len(work)) - self.running
            self.running += 1

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
            for _ in range(spare - 1 if pool is not None else 0):
                try:
                    helpers.append(pool.submit(drain))  # type: ignore[union-attr]
                except RuntimeError:  # the pool was shut down meanwhile: search alone
                    break
            drain()
        finally:
            stop.set()
            running = [h for h in helpers if not h.cancel()]
            wait(running)  # none is left writing into this query's answers after it returns
            with self._lock:
                self.running -= 1
        for helper in running:
            helper.result()  # a helper's error is the query's
        assert all(f is not None for f in found)
        return [f for f in found if f is not None]


def cosines(
    segments: Sequence[SegmentReader], offsets: np.ndarray, queries: np.ndarray, rows: np.ndarray
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
