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

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np

from flowsearch.ann import io as ann_io
from flowsearch.settings import current

__all__ = ["cosines", "merge_top_k", "search_segments"]


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
        threads = max(1, min(current().segment_threads, len(work)))

        def some(items: list[tuple[Any, Any, Any, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
            found: list[tuple[np.ndarray, np.ndarray]] = ann_io.single_threaded(
                lambda: [
                    seg.search(queries, k, keep, dead, knob) for seg, dead, keep, knob in items
                ]  # fmt: skip
            )
            return found

        # one task per thread (segments dealt round-robin): a task per segment cost more in
        # hand-offs than a 20k-row graph search takes
        groups = [list(range(t, len(work), threads)) for t in range(threads)]
        placed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for group, found in zip(groups, pool.map(some, [[work[i] for i in g] for g in groups])):
            placed.update(zip(group, found, strict=True))
        answers = [placed[i] for i in range(len(work))]
    else:
        answers = [seg.search(queries, k, keep, dead, knob) for seg, dead, keep, knob in work]
    if not answers:
        empty = np.zeros((len(queries), 0))
        return empty.astype(np.float32), empty.astype(np.int64)
    kept = [i for i, keep in enumerate(rows) if keep is None or len(keep)]
    return merge_top_k(answers, offsets[kept], k)


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
