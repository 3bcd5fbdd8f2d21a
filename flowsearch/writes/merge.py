r"""Merging segments: the size-tiered policy and the merge itself.

Every write adds a segment, so without merging a busy index would be searched across thousands
of segments. Segments are grouped in size *tiers* (sizes within a factor of
``Settings.merge_factor``, everything under ``Settings.floor_segment_rows`` in the lowest); when
a tier holds ``Settings.segments_per_tier`` segments they are merged into one of the next tier,
as Lucene's tiered policy does. Each row is rewritten about log(n) times over an index's life,
and a query sees a logarithmic number of segments. Small segments have a budget of their own
(the *Flat budget*): at most ``Settings.flat_segments_max`` segments of up to
``Settings.flat_max_rows`` live rows (those ``auto`` searches exactly, the costliest per row) stay
apart; one more and all of them merge into one, which gets a graph once it passes that size
(the floor of Lucene's policy plays this part there). Writes run the policy themselves for tiers
whose merge stays small (``Settings.write_merge_max_rows``), so a write's cost stays bounded;
``compact`` runs it without that bound, rewrites segments with many deleted rows, and
``compact(full=True)`` merges everything into one segment.

A merge reads the live rows of its segments (no re-encoding: the stored ``vector`` and ``raw``
columns are copied), builds the merged vector index, merges the postings (no re-tokenising),
and hands the new segment to the writer, which drops the old ones from the version.

Example:
    >>> [len(t) for t in tiers([5, 6, 7, 50_000])]
    [3, 1]
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.errors import IndexDamaged
from flowsearch.settings import current
from flowsearch.storage import deletions
from flowsearch.storage.manifest import AnnRecord, SchemaColumn, SegmentRecord
from flowsearch.storage.passages import PASSAGE_COLUMNS, has_passages, whole_documents
from flowsearch.storage.rows import VECTOR_COLUMNS, RowReader, matrix, vector_column
from flowsearch.storage.schema import type_of
from flowsearch.storage.writer import Writer
from flowsearch.writes.segments import SegmentBuilder

__all__ = ["merge", "merged_at_once", "plan_merges", "tier_of", "tiers"]

LOG = logging.getLogger(__name__)


def tier_of(n_live: int) -> int:
    """The size tier of a segment with ``n_live`` live rows (0: under the floor)."""
    floor, factor = current().floor_segment_rows, current().merge_factor
    tier = 0
    while n_live >= floor:  # integers: a segment of exactly floor x factor**t rows is tier t + 1
        tier += 1
        floor *= factor
    return tier


def tiers(sizes: Sequence[int]) -> list[list[int]]:
    """Segment positions grouped by tier, smallest tier first (positions in order)."""
    groups: dict[int, list[int]] = {}
    for at, n in enumerate(sizes):
        groups.setdefault(tier_of(n), []).append(at)
    return [groups[t] for t in sorted(groups)]


def plan_merges(
    segments: Sequence[SegmentRecord], *, max_rows: int | None, deleted_share: float | None = None
) -> list[list[str]]:
    """The merges the policy asks for: lists of segment names, each merged into one: full
    tiers (their ``segments_per_tier`` smallest), then the small segments the tiers left when
    there are more than the Flat budget (``flat_segments_max``), then segments with many
    deleted rows.

    Args:
        segments: the version's segments.
        max_rows: merge a tier (or the small segments) only when its live rows are at most
            this (None: no bound).
        deleted_share: also rewrite (alone) a segment with at least this share of deleted
            rows (None: no).
    """
    per_tier = current().segments_per_tier
    out: list[list[str]] = []
    taken: set[str] = set()
    live = [s.n_live for s in segments]
    for group in tiers(live):
        if len(group) < per_tier:
            continue
        pick = sorted(group, key=lambda at: live[at])[:per_tier]
        if max_rows is not None and sum(live[at] for at in pick) > max_rows:
            continue
        out.append([segments[at].name for at in sorted(pick)])
        taken.update(out[-1])
    # the Flat budget: small segments beyond it merge into one (a graph past flat_max_rows)
    small = [at for at, n in enumerate(live)
             if 0 < n <= current().flat_max_rows and segments[at].name not in taken]  # fmt: skip
    bounded = max_rows is None or sum(live[at] for at in small) <= max_rows
    if len(small) > max(current().flat_segments_max, 1) and bounded:
        out.append([segments[at].name for at in small])
        taken.update(out[-1])
    if deleted_share is not None:
        for seg in segments:
            share = seg.n_deleted / max(seg.n_rows, 1)
            if seg.name not in taken and seg.n_deleted and share >= deleted_share:
                out.append([seg.name])
    return out


def merged_at_once(
    segments: Sequence[SegmentRecord], removed: dict[str, np.ndarray], n_new: int
) -> bool:
    """Whether the policy a write runs (:func:`plan_merges` with
    ``Settings.write_merge_max_rows``) will merge the write's own new segment of ``n_new`` rows
    in the same write, once ``removed`` (per segment name, the rows it replaces) are deleted: then
    that segment's vector index would be built, tuned and thrown away, and the write builds it
    ``Flat`` (a copy of its vectors) instead; the merge builds the one index that is kept."""
    new = "\0new"  # no segment's name
    after = [s.model_copy(update={"n_deleted": s.n_deleted + len(removed.get(s.name, ()))})
             for s in segments]  # fmt: skip
    after.append(
        SegmentRecord(name=new, dir=".", n_rows=n_new, ann=AnnRecord(path="-", factory=""))
    )
    plans = plan_merges(after, max_rows=current().write_merge_max_rows)
    return any(new in names for names in plans)


def _unified(table: pa.Table, schema: Sequence[SchemaColumn], passages: bool = False) -> pa.Table:
    """A segment's rows with the version's metadata columns (missing ones null), in order;
    with ``passages``, the passage columns too (a segment without them: whole documents)."""
    columns: dict[str, pa.ChunkedArray | pa.Array] = {
        "id": table.column("id"),
        "text": table.column("text"),
    }
    for col in schema:
        typ = type_of(col)
        if col.name in table.column_names:
            columns[col.name] = table.column(col.name).cast(typ, safe=False)
        else:
            columns[col.name] = pa.nulls(table.num_rows, typ)
    if passages:
        if has_passages(table.schema):
            columns.update({name: table.column(name) for name in PASSAGE_COLUMNS})
        else:
            columns.update(whole_documents(table.column("text")))
    for name in VECTOR_COLUMNS:
        columns[name] = table.column(name)
    return pa.table(columns)


def merge(
    writer: Writer,
    names: Sequence[str],
    *,
    dim: int,
    requested: str,
    lexical: bool,
    schema: Sequence[SchemaColumn],
    project: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]] | None = None,
    lps: list[np.ndarray] | None = None,
) -> SegmentRecord | None:
    """Merge the named segments' live rows into one new segment (None when none is live: the
    segments are just dropped). Returns the new segment's record.

    Args:
        project: recalibrate: map the stored raw vectors (float32 (n, dim_in)) to new searched
            vectors and log-densities (the ``vector`` column is rewritten); None copies it.
        lps: where ``project``'s log-densities are appended (row order).
    """
    wanted = set(names)
    records = [s for s in writer.segments if s.name in wanted]
    n_live = sum(s.n_live for s in records)
    writer.drop_segments(list(wanted))
    if n_live == 0:
        return None
    builder = SegmentBuilder(writer, dim=dim, n_rows=n_live, requested=requested, lexical=False)
    # one part schema per segment: passage columns for all rows when any segment has them
    passages = any(
        has_passages(pq.read_schema(writer.segment_path(s) / s.parts[0].path))
        for s in records
        if s.parts
    )
    parts = []
    for seg in records:
        folder = writer.segment_path(seg)
        dead = deletions.read(folder / seg.deletions, seg.n_rows) if seg.deletions else None
        for table in _live_tables(folder, seg, dead):
            table = _unified(table, schema, passages)
            if project is None:
                builder.add(table, matrix(table.column("vector")))
                continue
            Z, lp = project(matrix(table.column("raw")))
            if lp is not None and lps is not None:
                lps.append(lp)
            column = table.schema.get_field_index("vector")
            builder.add(table.set_column(column, "vector", vector_column(Z)), Z)
        if lexical:
            parts.append((_postings(folder, seg), None if dead is None else ~dead))
    postings = None
    if lexical:
        from flowsearch.lexical.postings import Postings

        postings = Postings.merge(parts)
    LOG.info("merged %d segments (%d live rows) into one", len(records), n_live)
    return builder.finish(postings=postings)


def _live_tables(folder: Path, seg: SegmentRecord, dead: np.ndarray | None) -> Iterator[pa.Table]:
    """A segment's live rows, part by part (all columns)."""
    reader = RowReader(folder, seg.parts)
    try:
        start = 0
        for table in reader.batches():
            n = table.num_rows
            if dead is not None:
                table = table.filter(pa.array(~dead[start : start + n]))
            start += n
            if table.num_rows:
                yield table
    finally:
        reader.close()


def _postings(folder: Path, seg: SegmentRecord) -> Any:
    from flowsearch.lexical.postings import Postings

    if seg.postings is None:
        raise IndexDamaged(f"segment {seg.name} has no postings", "rebuild the index")
    return Postings.load(folder / seg.postings)
