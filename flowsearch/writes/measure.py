r"""Measuring rows against an index: the best scores drift and the reference are judged on.

A row's *best score* is its cosine to the nearest other row of the index, in the searched space
(:mod:`flowsearch.space.reference`). :func:`best_scores` measures new rows against the rows an
index held before a write (each segment's vector index opened memory-mapped, so the cost is what
one top-1 search touches, not the index's size); :func:`remeasure` measures a sample of an
index's own rows against the others, after ``recalibrate`` changed the space.

Example:
    >>> best_scores(writer, writer.segments, {}, Z)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flowsearch.ann import io as ann_io
from flowsearch.ann.prefilter import filtered_search
from flowsearch.search.dense import merge_top_k
from flowsearch.settings import current
from flowsearch.space.reference import Reference, best_other_score, reference_rows
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import deletions
from flowsearch.storage.records import SegmentRecord
from flowsearch.storage.rows import RowReader
from flowsearch.storage.writer import Writer

__all__ = ["best_scores", "remeasure", "sample_positions"]


def sample_positions(n: int, most: int | None = None, seed: int = 0) -> np.ndarray:
    """Sorted positions (int64) of at most ``most`` (``Settings.drift_max_rows``) of ``n`` rows,
    a seeded uniform sample (all of them when there are few enough)."""
    most = current().drift_max_rows if most is None else most
    if n <= most:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, most, replace=False)).astype(np.int64)


def _open(writer: Writer, seg: SegmentRecord) -> Any:
    folder = writer.segment_path(seg)
    return ann_io.read_index(folder / seg.ann.path, seg.ann.params, mmap=seg.ann.factory,
                             on_disk=seg.ann.data is not None)  # fmt: skip


def _dead(writer: Writer, seg: SegmentRecord, extra: np.ndarray | None) -> np.ndarray | None:
    mask = None
    if seg.deletions is not None:
        mask = deletions.read(writer.segment_path(seg) / seg.deletions, seg.n_rows)
    if extra is not None and len(extra):
        mask = np.zeros(seg.n_rows, bool) if mask is None else mask.copy()
        mask[extra] = True
    return mask


def best_scores(
    writer: Writer,
    segments: Sequence[SegmentRecord],
    excluded: Mapping[str, np.ndarray],
    Z: np.ndarray,
) -> np.ndarray:
    """Each row of ``Z`` (float32 (m, d), in the searched space)'s best score to a live row of
    ``segments`` (minus ``excluded`` local rows per segment name): float64 (m,), NaN when no
    row is left to compare with."""
    best = np.full(len(Z), -np.inf)
    for seg in segments:
        if seg.n_live == 0:
            continue
        dead = _dead(writer, seg, excluded.get(seg.name))
        scores, rows = filtered_search(_open(writer, seg), Z, 1, None, excluded=dead)
        found = rows[:, 0] >= 0
        best[found] = np.maximum(best[found], scores[found, 0])
    return np.where(np.isfinite(best), best, np.nan)


def remeasure(writer: Writer, space: SearchSpace, lps: np.ndarray | None = None) -> Reference:
    """The reference of the version being written (every segment in ``space``): a seeded
    sample of its rows, each against the others (leave-one-out)."""
    segments = [s for s in writer.segments if s.n_rows]
    counts = [s.n_rows for s in segments]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(offsets[-1])
    rows, method = reference_rows(total, np.zeros(0, np.int64))
    if not len(rows):
        return Reference(method=method, n_measured=0, n_corpus=total, space=space.spec.space)
    seg_of = np.searchsorted(offsets, rows, side="right") - 1
    parts = []
    for i, seg in enumerate(segments):
        local = rows[seg_of == i] - offsets[i]
        if len(local):
            reader = RowReader(writer.segment_path(seg), seg.parts)
            try:
                parts.append(reader.vectors("vector")[local])
            finally:
                reader.close()
    Z = np.concatenate(parts)
    answers = []
    for seg in segments:
        dead = _dead(writer, seg, None)
        answers.append(filtered_search(_open(writer, seg), Z, 2, None, excluded=dead))
    scores, found = merge_top_k(answers, offsets, 2)
    top = best_other_score(scores, found, rows)
    spec = space.spec
    return Reference.from_scores(
        top,
        method=method,
        n_corpus=total,
        space=spec.space,
        mean_cosine=spec.anisotropy.get("mean_cosine") if spec.space == "encoder" else None,
    )
