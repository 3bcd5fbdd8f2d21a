r"""A long document's dense score: the mean of its best passage's cosine and its centroid's.

A document longer than the encoder's window is several rows, one per passage
(:mod:`flowsearch.storage.passages`). Its best passage alone misses what the document says
across passages; a vector of the whole text would miss what lies past the window. Its
*centroid* (the normalised sum of its passages' searched vectors, which are unit vectors)
stands for the whole of it, and needs nothing more encoded or stored: it is computed at query
time from the passages' vectors. The dense side scores each passage row of such a document as
the mean of its own cosine and its document's centroid's, so the document's best row scores

    (best passage cosine + centroid cosine) / 2

and every row of a whole document keeps its cosine (its centroid is itself). A document is
found by its passages: each segment's candidates are re-scored before the segments' answers
are merged (so shards holding some of the segments give the same documents as one process);
when any of a document's passages is among its segment's candidates its best one is too (it
scores at least as high), so its score is exact; one with no passage among them is not seen,
as before. Measured against whole-document and best-passage scoring on the public test
collections (benchmarks/RESULTS.md, "Retrieval on public test collections").

Example:
    >>> scores, rows = rescored(segments, offsets, Z, scores, rows)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from flowsearch.search.segment import SegmentReader

__all__ = ["document_cosines", "rescored", "rescored_segment"]


class _Documents:
    """The documents of some version rows: for each row its document (an index into
    ``centroids``; -1 for a whole document), and each document's centroid."""

    def __init__(
        self, segments: Sequence[SegmentReader], offsets: np.ndarray, rows: np.ndarray
    ) -> None:
        self.rows = rows  # unique, valid, ascending
        seg = np.searchsorted(offsets, rows, side="right") - 1
        local = rows - offsets[seg]
        lead, count = local.copy(), np.ones(len(rows), np.int64)
        for s in np.unique(seg).tolist():
            layout = segments[s].passages()
            if layout is None:
                continue
            pick = seg == s
            number, n = layout
            lead[pick] = local[pick] - number[local[pick]]
            count[pick] = n[local[pick]]
        cut = count > 1
        keys = offsets[seg] + lead  # a document's first row, as a version row
        docs, first = np.unique(keys[cut], return_index=True)
        self.doc_of = np.full(len(rows), -1, np.int64)
        self.doc_of[cut] = np.searchsorted(docs, keys[cut])
        doc_seg, doc_lead, doc_count = seg[cut][first], lead[cut][first], count[cut][first]
        # every passage of those documents, document after document: one read per segment
        starts = np.cumsum(doc_count) - doc_count
        within = np.arange(int(doc_count.sum())) - np.repeat(starts, doc_count)
        rows_of = np.repeat(doc_lead, doc_count) + within
        seg_of = np.repeat(doc_seg, doc_count)
        passages = np.zeros((len(rows_of), int(segments[0].ann.d)), np.float64)
        for s in np.unique(seg_of).tolist():
            pick = seg_of == s
            passages[pick] = segments[s].vectors(rows_of[pick])
        sums = np.add.reduceat(passages, starts, axis=0) if len(docs) else passages
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        self.centroids = sums / np.where(norms > 0, norms, 1.0)

    def with_centroids(
        self, queries: np.ndarray, cosines: np.ndarray, rows: np.ndarray
    ) -> np.ndarray:
        """``cosines`` (q, c) of ``rows`` (-1 padding) as float64, each passage of a longer
        document's the mean of its own and its document's centroid's."""
        out = np.asarray(cosines, np.float64).copy()
        valid = rows >= 0
        doc = np.full(rows.shape, -1, np.int64)
        doc[valid] = self.doc_of[np.searchsorted(self.rows, rows[valid])]
        qi, j = np.nonzero(doc >= 0)
        Z = np.asarray(queries, np.float64)
        out[qi, j] = (out[qi, j] + np.einsum("ij,ij->i", Z[qi], self.centroids[doc[qi, j]])) / 2
        return out


def _of(
    segments: Sequence[SegmentReader], offsets: np.ndarray, rows: np.ndarray
) -> _Documents | None:
    valid = np.unique(rows[rows >= 0])
    if not valid.size or all(s.passages() is None for s in segments):
        return None
    found = _Documents(segments, np.asarray(offsets, np.int64), valid)
    return found if len(found.centroids) else None


def rescored(
    segments: Sequence[SegmentReader],
    offsets: np.ndarray,
    queries: np.ndarray,
    scores: np.ndarray,
    rows: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Dense candidates re-scored by their documents (see the module docstring).

    Args:
        segments: the version's segment readers (``passages()``, ``vectors(local rows)``).
        offsets: int64 (segments + 1,): each segment's first version row.
        queries: float32 (q, d), searched space.
        scores, rows: the candidates: cosines float32 (q, c) and version rows int64 (q, c),
            best first, -1 padding.

    Returns:
        The same rows with their new scores, best first (ties to the lower row), -1 padding
        last; unchanged when no candidate is a passage of a longer document.
    """
    docs = _of(segments, offsets, rows)
    if docs is None:
        return scores, rows
    valid = rows >= 0
    new = np.where(valid, docs.with_centroids(queries, scores, rows), -np.inf)
    order = np.lexsort((np.where(valid, rows, np.iinfo(np.int64).max), -new), axis=1)
    out_rows = np.take_along_axis(rows, order, axis=1)
    out_scores = np.take_along_axis(new, order, axis=1)
    pads = np.asarray(scores)[~valid]
    out_scores = np.where(out_rows >= 0, out_scores, pads[0] if pads.size else 0.0)
    return out_scores.astype(np.float32), out_rows


def rescored_segment(
    segment: SegmentReader, queries: np.ndarray, scores: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rescored` for one segment's own answer (local rows): what the dense side does
    to each segment's candidates before they are merged, so that any set of segments (a
    shard's) gives the same documents as the whole version."""
    if segment.passages() is None:
        return scores, rows
    return rescored([segment], np.array([0, segment.n_rows], np.int64), queries, scores, rows)


def document_cosines(
    segments: Sequence[SegmentReader], offsets: np.ndarray, queries: np.ndarray, rows: np.ndarray,
    cosines: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """The dense score of each of ``rows`` as the dense side gives it (float64 (q, c), NaN for
    -1): for a passage of a longer document, the mean of its ``cosines`` (float64 (q, c), the
    rows' own) and its document's centroid's; for a whole document, its cosine. (The lexical
    side's candidates are first passages: scored as their own row, a document whose best
    passage is a dense candidate keeps that passage as its best row.)"""
    docs = _of(segments, offsets, rows)
    return cosines if docs is None else docs.with_centroids(queries, cosines, rows)
