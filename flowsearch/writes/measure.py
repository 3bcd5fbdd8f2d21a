r"""Measuring rows against an index: the best scores drift and the reference are judged on.

A row's *best score* is its cosine to the nearest other row of the index, in the searched space
(:mod:`flowsearch.space.reference`). A write's new rows are judged against the version's
reference sample (:mod:`flowsearch.space.sample`), never the whole index: :func:`draw_sample`
draws one from a version's rows (the build, ``recalibrate``, an index written before samples
existed), :func:`read_sample` reads a version's (a base and the deltas since),
:func:`stale_keys` finds its rows deleted since, :func:`stage_sample` writes the next version's
(a delta when it can). :func:`best_scores` (new rows against the whole index, a top-1 search
per row) is kept for measuring, and :func:`remeasure` measures a sample of an index's own rows
against the others, after ``recalibrate`` changed the space (the query verdict's reference).

Example:
    >>> sample = read_sample(writer, base) or draw_sample(writer, base.segments)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from flowsearch.ann import io as ann_io
from flowsearch.ann.prefilter import filtered_search
from flowsearch.search.dense import merge_top_k
from flowsearch.space import sample as space_sample
from flowsearch.space.reference import Method, Reference, best_other_score, reference_rows
from flowsearch.space.sample import ReferenceSample
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import deletions
from flowsearch.storage import manifest as mf
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.layout import REFERENCES_DIR
from flowsearch.storage.records import SegmentRecord
from flowsearch.storage.rows import RowReader
from flowsearch.storage.verify import verify_files
from flowsearch.storage.writer import Writer, sample_record

if TYPE_CHECKING:
    import faiss

__all__ = [
    "best_scores",
    "draw_sample",
    "open_index",
    "read_sample",
    "remeasure",
    "sample_positions",
    "stage_sample",
    "stale_keys",
]

#: A write scores at most this many of its new rows (a seeded sample) for the drift report:
#: enough that the median percentile's interval is narrower than the verdict's steps.
DRIFT_MAX_ROWS = 100
#: A write that changes the reference sample saves what changed (a delta) on the last base,
#: until the deltas since it would pass this share of the base's bytes, or their count
#: :data:`REFERENCE_DELTA_MAX`; then a new base (the whole sample). So a write pays at most
#: about twice its delta, and a drift check reads at most about twice a base.
REFERENCE_DELTA_SHARE = 1.0
REFERENCE_DELTA_MAX = 32


def sample_positions(n: int, most: int | None = None, seed: int = 0) -> np.ndarray:
    """Sorted positions (int64) of at most ``most`` (:data:`DRIFT_MAX_ROWS`) of ``n`` rows, a
    seeded uniform sample (all of them when there are few enough)."""
    most = DRIFT_MAX_ROWS if most is None else most
    if n <= most:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(n, most, replace=False)).astype(np.int64)


def open_index(writer: Writer, seg: SegmentRecord) -> faiss.Index:
    """Segment ``seg``'s vector index as the writer sees it (staged or published), its recorded
    search parameters set."""
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
        scores, rows = filtered_search(open_index(writer, seg), Z, 1, None, excluded=dead)
        found = rows[:, 0] >= 0
        best[found] = np.maximum(best[found], scores[found, 0])
    return np.where(np.isfinite(best), best, np.nan)


def _row_keys(writer: Writer, seg: SegmentRecord, local: np.ndarray) -> np.ndarray:
    """The id keys (uint64) of a segment's local rows."""
    index = KeyIndex.load(writer.segment_path(seg), seg.n_rows)
    where = np.empty(seg.n_rows, np.int64)
    where[np.asarray(index.rows)] = np.arange(seg.n_rows)
    keys: np.ndarray = np.asarray(index.keys)[where[local]].astype(np.uint64)
    return keys


def _read_rows(
    writer: Writer,
    segs: Sequence[SegmentRecord],
    offsets: np.ndarray,
    live: Sequence[np.ndarray],
    at: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Searched vectors and keys of live rows ``at`` (positions in the live rows' order)."""
    seg_of = np.searchsorted(offsets, at, side="right") - 1
    vecs, keys = [], []
    for i, seg in enumerate(segs):
        local = live[i][at[seg_of == i] - offsets[i]]
        if not len(local):
            continue
        reader = RowReader(writer.segment_path(seg), seg.parts)
        try:
            vecs.append(reader.vectors_at(local, "vector"))
        finally:
            reader.close()
        keys.append(_row_keys(writer, seg, local))
    if not vecs:
        dim = writer.base.dim if writer.base is not None else 0
        return np.zeros((0, dim), np.float32), np.zeros(0, np.uint64)
    return np.concatenate(vecs), np.concatenate(keys)


def draw_sample(
    writer: Writer,
    segments: Sequence[SegmentRecord],
    probes: np.ndarray | None = None,
    method: Method = "leave-one-out",
    seed: int = 0,
) -> ReferenceSample:
    """A reference sample of the live rows of ``segments`` (their searched vectors as stored):
    a seeded uniform sample of at most ``REFERENCE_SAMPLE_ROWS`` rows, and as probes
    the live rows ``probes`` (positions in the live rows' order: the build's held-out rows) or,
    by default, a leave-one-out sample (:func:`reference_rows`). Reads the row groups holding
    them: the one step whose cost grows with the corpus, taken once per build, recalibration,
    or index written before samples existed."""
    segs = [s for s in segments if s.n_live]
    live = []
    for seg in segs:
        dead = _dead(writer, seg, None)
        live.append(np.arange(seg.n_rows) if dead is None else np.flatnonzero(~dead))
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in live])]).astype(np.int64)
    total = int(offsets[-1])
    most = min(space_sample.REFERENCE_SAMPLE_ROWS, total)
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(total, most, replace=False)).astype(np.int64)
    if probes is None:
        probes, method = reference_rows(total, np.zeros(0, np.int64), seed=seed)
    probes = np.asarray(probes, np.int64)
    both = np.union1d(picked, probes)  # one pass over the row groups for both
    vectors, keys = _read_rows(writer, segs, offsets, live, both)
    at, pat = np.searchsorted(both, picked), np.searchsorted(both, probes)
    return ReferenceSample.measured(vectors[at], keys[at], vectors[pat], keys[pat], method)


def read_sample(writer: Writer, base: mf.Manifest) -> ReferenceSample | None:
    """The reference sample version ``base`` records (its base with its deltas applied, every
    file's size checked), or None when it has none (an index written before samples existed)."""
    record = sample_record(base)
    if record is None:
        return None
    folders = []
    for piece in record.pieces:
        folder = writer.index_dir / piece.path
        verify_files(folder, piece.files, small=False)
        folders.append(folder)
    return ReferenceSample.load(folders[0], base.dim, deltas=folders[1:])


def stale_keys(writer: Writer, segments: Sequence[SegmentRecord], keys: np.ndarray) -> np.ndarray:
    """The ``keys`` (uint64) no live row of ``segments`` holds: rows deleted since they were
    sampled. Each segment's key index is searched (binary search, memory-mapped): the cost
    grows with the keys and the segments, not the rows."""
    keys = np.unique(np.asarray(keys, np.uint64))
    live = np.zeros(len(keys), bool)
    for seg in segments:
        if seg.n_live == 0 or seg.keys is None:
            continue
        index = KeyIndex.load(writer.segment_path(seg), seg.n_rows)
        lo = np.searchsorted(index.keys, keys, side="left")
        hi = np.searchsorted(index.keys, keys, side="right")
        found = (hi > lo) & ~live
        dead = _dead(writer, seg, None)
        if dead is None:
            live |= found
            continue
        one = np.flatnonzero(found & (hi - lo == 1))  # most keys: one row (vectorised)
        live[one] = ~dead[np.asarray(index.rows)[lo[one]]]
        for at in np.flatnonzero(found & (hi - lo > 1)):  # an id's passages share its key
            rows = np.asarray(index.rows[lo[at] : hi[at]])
            live[at] = not dead[rows].all()
    return keys[~live]


def stage_sample(
    writer: Writer, sample: ReferenceSample, parent: ReferenceSample | None = None
) -> mf.SampleRecord:
    """Write ``sample`` for the version being written; returns its record (the manifest's
    ``reference.sample``).

    With ``parent`` (the base version's sample, as :func:`read_sample` read it, that
    ``sample`` was derived from), only what changed is written: a delta appended to the base
    version's chain (:class:`~flowsearch.space.sample.SampleDelta`), unless the chain's deltas
    would then pass :data:`REFERENCE_DELTA_SHARE` of its base's bytes or number
    :data:`REFERENCE_DELTA_MAX`: then, as without a parent, the whole sample (a new base).
    """
    before = sample_record(writer.base) if parent is not None else None
    delta = sample.delta_from(parent) if parent is not None and before is not None else None
    if before is not None and delta is not None:
        chain = before.deltas
        base_bytes = sum(f.bytes for f in before.files.values())
        chain_bytes = sum(f.bytes for d in chain for f in d.files.values())
        fits = chain_bytes + delta.nbytes <= REFERENCE_DELTA_SHARE * base_bytes
        if fits and len(chain) < REFERENCE_DELTA_MAX:
            stage = writer.stage(REFERENCES_DIR)
            delta.save(stage)
            deltas = (*chain, writer.set_reference_sample(stage))
            update = {"deltas": deltas, "rows": sample.n_sample, "probes": sample.n_probes}
            return before.model_copy(update=update)
    stage = writer.stage(REFERENCES_DIR)
    sample.save(stage)
    piece = writer.set_reference_sample(stage)
    return mf.SampleRecord(
        path=piece.path, files=piece.files, rows=sample.n_sample, probes=sample.n_probes
    )


def remeasure(writer: Writer, space: SearchSpace, lps: np.ndarray | None = None) -> Reference:
    """The reference of the version being written (every segment in ``space``): a seeded
    sample of its rows, each against the others (leave-one-out); with a reference sample drawn
    again from the rewritten rows (the old one's vectors are in the old space) and staged."""
    segments = [s for s in writer.segments if s.n_rows]
    counts = [s.n_rows for s in segments]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(offsets[-1])
    rows, method = reference_rows(total, np.zeros(0, np.int64))
    if not len(rows):
        return Reference(
            method=method, n_measured=0, n_corpus=total, space=space.spec.space, sample=None
        )
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
        answers.append(filtered_search(open_index(writer, seg), Z, 2, None, excluded=dead))
    scores, found = merge_top_k(answers, offsets, 2)
    top = best_other_score(scores, found, rows)
    spec = space.spec
    reference = Reference.from_scores(
        top,
        method=method,
        n_corpus=total,
        space=spec.space,
        mean_cosine=spec.anisotropy.get("mean_cosine") if spec.space == "encoder" else None,
    )
    sample = stage_sample(writer, draw_sample(writer, writer.segments, seed=writer.number))
    return reference.model_copy(update={"sample": sample})
