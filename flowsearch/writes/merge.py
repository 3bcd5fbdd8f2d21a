r"""Merging segments: the size-tiered policy (:class:`MergePolicy`) and the merge itself.

Every write adds a segment, so without merging a busy index would be searched across thousands
of segments. Segments are grouped in size *tiers* (sizes within a factor of
``MergePolicy.merge_factor``, everything under ``floor_segment_rows`` in the lowest); when a tier
holds ``segments_per_tier`` segments they are merged into one of the next tier, as Lucene's
tiered policy does. Each row is rewritten about log(n) times over an index's life, and a query
sees a logarithmic number of segments. Small segments have a budget of their own (the *Flat
budget*): at most ``flat_segments_max`` segments of up to the
:class:`~flowsearch.ann.policy.AnnPolicy`'s ``flat_max_rows`` live rows (those ``auto``
searches exactly, the costliest per row) stay apart; one more and all of them merge into one,
which gets a graph once it passes that size (the floor of Lucene's policy plays this part
there). Writes run the policy themselves for tiers whose merge stays small
(``write_merge_max_rows``), so a write's cost stays bounded; ``compact`` runs it without that
bound, rewrites segments with many deleted rows, and ``compact(full=True)`` merges everything
into one segment. The writes take the policy as ``merge=MergePolicy(...)`` (None: the defaults)
and hand it to every function here.

A merge reads the live rows of its segments (no re-encoding: the stored ``vector`` and ``raw``
columns are copied), builds the merged vector index, merges the postings (no re-tokenising),
and hands the new segment to the writer, which drops the old ones from the version.

Example:
    >>> [len(t) for t in tiers([5, 6, 7, 50_000], MergePolicy())]
    [3, 1]
    >>> MergePolicy(segments_per_tier=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    flowsearch.errors.BadInput: MergePolicy.segments_per_tier must be an integer of at least 2...
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.ann.policy import DEFAULT as DEFAULT_ANN
from flowsearch.ann.policy import AnnPolicy
from flowsearch.errors import BadInput, IndexDamaged
from flowsearch.storage import deletions
from flowsearch.storage.manifest import AnnRecord, SchemaColumn, SegmentRecord
from flowsearch.storage.passages import (
    PASSAGE_COLUMNS,
    count_documents,
    has_passages,
    whole_documents,
)
from flowsearch.storage.rows import VECTOR_COLUMNS, RowReader, matrix, vector_column
from flowsearch.storage.schema import type_of
from flowsearch.storage.writer import Writer
from flowsearch.writes.segments import SegmentBuilder

if TYPE_CHECKING:
    from flowsearch.lexical.postings import Postings

__all__ = [
    "DEFAULT",
    "MergePolicy",
    "merge",
    "merged_at_once",
    "plan_merges",
    "policy_or_default",
    "tier_of",
    "tiers",
]

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergePolicy:
    """When segments are merged (size tiers, as Lucene's TieredMergePolicy; range-checked).

    Attributes:
        segments_per_tier: Segments a size tier holds before they merge; fewer means fewer
            segments to search for more rows rewritten by merges.
        merge_factor: How many times larger each tier's segments are than the one below;
            larger means fewer, bigger merges and more segments per query.
        floor_segment_rows: Segments below this many live rows all count as the lowest tier;
            higher merges small segments sooner.
        write_merge_max_rows: Largest merge a write runs on its own (``compact`` runs any);
            higher keeps fewer segments at the cost of slower worst-case writes.
        flat_segments_max: Small (exactly searched) segments a write or ``compact`` leaves
            apart before merging them all into one; fewer means faster queries, more merging.
    """

    segments_per_tier: int = 4
    merge_factor: int = 10
    floor_segment_rows: int = 10_000
    write_merge_max_rows: int = 200_000
    flat_segments_max: int = 4

    def __post_init__(self) -> None:
        least = {"segments_per_tier": 2, "merge_factor": 2, "floor_segment_rows": 1,
                 "write_merge_max_rows": 0, "flat_segments_max": 0}  # fmt: skip
        for f in fields(self):
            value, low = getattr(self, f.name), least[f.name]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise BadInput(
                    f"MergePolicy.{f.name} must be an integer of at least {low}, got {value!r}",
                    f"pass {f.name}= a whole number >= {low} (default {f.default})",
                    param=f.name,
                )


#: The policy a write uses when it is given none.
DEFAULT = MergePolicy()


def policy_or_default(policy: MergePolicy | None) -> MergePolicy:
    """``policy``, or :data:`DEFAULT` for None; anything else is refused.

    Raises:
        BadInput: ``policy`` is not a :class:`MergePolicy`.
    """
    if policy is None:
        return DEFAULT
    if not isinstance(policy, MergePolicy):
        raise BadInput(
            f"merge must be a MergePolicy, got {type(policy).__name__}",
            "pass merge=flowsearch.MergePolicy(...) or leave it out",
            param="merge",
        )
    return policy


def tier_of(n_live: int, policy: MergePolicy) -> int:
    """The size tier of a segment with ``n_live`` live rows (0: under the floor)."""
    floor, factor = policy.floor_segment_rows, policy.merge_factor
    tier = 0
    while n_live >= floor:  # integers: a segment of exactly floor x factor**t rows is tier t + 1
        tier += 1
        floor *= factor
    return tier


def tiers(sizes: Sequence[int], policy: MergePolicy) -> list[list[int]]:
    """Segment positions grouped by tier, smallest tier first (positions in order)."""
    groups: dict[int, list[int]] = {}
    for at, n in enumerate(sizes):
        groups.setdefault(tier_of(n, policy), []).append(at)
    return [groups[t] for t in sorted(groups)]


def plan_merges(
    segments: Sequence[SegmentRecord],
    policy: MergePolicy,
    *,
    max_rows: int | None,
    flat_max_rows: int = DEFAULT_ANN.flat_max_rows,
    deleted_share: float | None = None,
) -> list[list[str]]:
    """The merges the policy asks for: lists of segment names, each merged into one: full
    tiers (their ``segments_per_tier`` smallest), then the small segments the tiers left when
    there are more than the Flat budget (``flat_segments_max``), then segments with many
    deleted rows.

    Args:
        segments: the version's segments.
        policy: the tiers and the Flat budget.
        max_rows: merge a tier (or the small segments) only when its live rows are at most
            this (None: no bound).
        flat_max_rows: segments of at most this many live rows count against the Flat budget
            (the :class:`~flowsearch.ann.policy.AnnPolicy`'s).
        deleted_share: also rewrite (alone) a segment with at least this share of deleted
            rows (None: no).
    """
    per_tier = policy.segments_per_tier
    out: list[list[str]] = []
    taken: set[str] = set()
    live = [s.n_live for s in segments]
    for group in tiers(live, policy):
        if len(group) < per_tier:
            continue
        pick = sorted(group, key=lambda at: live[at])[:per_tier]
        if max_rows is not None and sum(live[at] for at in pick) > max_rows:
            continue
        out.append([segments[at].name for at in sorted(pick)])
        taken.update(out[-1])
    # the Flat budget: small segments beyond it merge into one (a graph past flat_max_rows)
    small = [at for at, n in enumerate(live)
             if 0 < n <= flat_max_rows and segments[at].name not in taken]  # fmt: skip
    bounded = max_rows is None or sum(live[at] for at in small) <= max_rows
    if len(small) > max(policy.flat_segments_max, 1) and bounded:
        out.append([segments[at].name for at in small])
        taken.update(out[-1])
    if deleted_share is not None:
        for seg in segments:
            share = seg.n_deleted / max(seg.n_rows, 1)
            if seg.name not in taken and seg.n_deleted and share >= deleted_share:
                out.append([seg.name])
    return out


def merged_at_once(
    segments: Sequence[SegmentRecord],
    removed: dict[str, np.ndarray],
    n_new: int,
    policy: MergePolicy,
    ann: AnnPolicy = DEFAULT_ANN,
) -> bool:
    """Whether the policy a write runs (:func:`plan_merges` with
    ``policy.write_merge_max_rows``) will merge the write's own new segment of ``n_new`` rows
    in the same write, once ``removed`` (per segment name, the rows it replaces) are deleted: then
    that segment's vector index would be built, tuned and thrown away, and the write builds it
    ``Flat`` (a copy of its vectors) instead; the merge builds the one index that is kept."""
    new = "\0new"  # no segment's name
    after = [s.model_copy(update={"n_deleted": s.n_deleted + len(removed.get(s.name, ()))})
             for s in segments]  # fmt: skip
    after.append(
        SegmentRecord(name=new, dir=".", n_rows=n_new, ann=AnnRecord(path="-", factory=""))
    )
    plans = plan_merges(after, policy, max_rows=policy.write_merge_max_rows,
                        flat_max_rows=ann.flat_max_rows)  # fmt: skip
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
    ann: AnnPolicy | None = None,
    tune_queries: np.ndarray | None = None,
) -> SegmentRecord | None:
    """Merge the named segments' live rows into one new segment (None when none is live: the
    segments are just dropped). Returns the new segment's record.

    Args:
        project: recalibrate: map the stored raw vectors (float32 (n, dim_in)) to new searched
            vectors and log-densities (the ``vector`` column is rewritten); None copies it.
        lps: where ``project``'s log-densities are appended (row order).
        ann: what ``auto`` builds and tunes the merged segment for (None: the defaults).
        tune_queries: the user's queries in the searched space, to tune the merged segment's
            ``auto`` index on (:class:`~flowsearch.writes.segments.SegmentBuilder`).
    """
    wanted = set(names)
    records = [s for s in writer.segments if s.name in wanted]
    n_live = sum(s.n_live for s in records)
    writer.drop_segments(list(wanted))
    if n_live == 0:
        return None
    builder = SegmentBuilder(writer, dim=dim, n_rows=n_live, requested=requested, lexical=False,
                             ann=ann, tune_queries=tune_queries)  # fmt: skip
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
    older = [seg for seg, (p, _) in zip(records, parts, strict=False) if p.leads is None]
    if lexical and any(count_documents(writer.segment_path(s), s) < s.n_live for s in older):
        # a release before whole-document BM25 scored a long document's passages: build the
        # merged segment's postings from its texts, so its documents are scored whole
        builder.lexical = True
    elif lexical:
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


def _postings(folder: Path, seg: SegmentRecord) -> Postings:
    from flowsearch.lexical.postings import Postings

    if seg.postings is None:
        raise IndexDamaged(f"segment {seg.name} has no postings", "rebuild the index")
    return Postings.load(folder / seg.postings)
