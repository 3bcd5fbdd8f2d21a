r"""Growing an index under its frozen encoder and calibrator: upsert and add.

A write of new rows costs what it writes: the rows are encoded by the index's own encoder
(reused when the caller holds one, as the server does), projected by its own calibrator (never
refitted here: :func:`~flowsearch.writes.recalibrate.recalibrate` does that) and written as one
new segment (:class:`~flowsearch.writes.segments.SegmentBuilder`); an upsert's replaced rows
are found through the segments' id keys and get deletion files. Nothing else is read or
rewritten, but for the merges the size-tiered policy asks of small segments
(:mod:`flowsearch.writes.merge`). The version is published atomically by the version writer.

Records are checked against the index's schema before anything is written: a value that
cannot be cast losslessly to its column's type is refused naming the id, the column, the
expected and the given type; a new column is added (null for older rows).

Drift: each new row's best score against the version's reference sample (a fixed-size sample
of the rows the index held before, those the write replaces or deleted since excluded; at most
``measure.DRIFT_MAX_ROWS`` new rows, a seeded sample) is placed among the corpus's own best
scores against the same sample (:func:`flowsearch.space.drift.drift_report`): "the 20 new rows
sit like the corpus: median percentile 48". The check's cost does not grow with the corpus
(:mod:`flowsearch.space.sample`); the write's rows enter the next version's sample in
proportion.

Example:
    >>> upsert("my_index", [{"id": "doc-1", "text": "new text"}]).n_inserted  # doctest: +SKIP
    1
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import pyarrow as pa

from flowsearch.ann.policy import AnnPolicy, policy_or_default
from flowsearch.encode.protocol import TextEncoder
from flowsearch.errors import BadInput, check_bool, check_int, check_path
from flowsearch.ingest.corpus import Corpus, CorpusOptions, CorpusPlan
from flowsearch.ingest.passages import Cuts
from flowsearch.progress import Stages
from flowsearch.space import reference as space_reference
from flowsearch.space import sample as space_sample
from flowsearch.space.drift import DriftReport, drift_report
from flowsearch.space.reference import Reference, reference_of
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import manifest as mf
from flowsearch.storage import schema as schema_mod
from flowsearch.storage.keys import keys_of
from flowsearch.storage.lookup import find_live
from flowsearch.storage.passages import passage_columns
from flowsearch.storage.rows import rows_table
from flowsearch.storage.writer import Writer, open_writer
from flowsearch.writes import measure
from flowsearch.writes.corpus import read_for_write, sizes_of
from flowsearch.writes.engine import CHUNK_ROWS
from flowsearch.writes.measure import (
    draw_sample,
    read_sample,
    sample_positions,
    stage_sample,
    stale_keys,
)
from flowsearch.writes.merge import MergePolicy, merge, merged_at_once, plan_merges
from flowsearch.writes.merge import policy_or_default as merge_policy_or_default
from flowsearch.writes.results import WriteResult, result_of
from flowsearch.writes.segments import SegmentBuilder

__all__ = ["WriteRequest", "add_to_index", "upsert", "write"]

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteRequest:
    """What an add or upsert is asked, beyond the index and the corpus; checked when made (see
    :func:`upsert` for each field's meaning).

    Raises:
        BadInput: a batch size that is not an integer >= 1, a flag that is not a bool.
    """

    kind: Literal["add", "upsert"]
    text_column: str | None = None
    id_column: str | None = None
    batch_size: int = 64
    strict: bool = False
    model: str | os.PathLike[str] | None = None
    encoder: TextEncoder | None = None
    wait: float | None = None
    merge_segments: bool = True
    ann: AnnPolicy | None = None
    merge: MergePolicy | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ann", policy_or_default(self.ann))
        object.__setattr__(self, "merge", merge_policy_or_default(self.merge))
        check_int(self.batch_size, "batch_size", 1)
        check_bool(self.strict, "strict")
        check_bool(self.merge_segments, "merge_segments")

    def corpus_options(self, columns: mf.Columns) -> CorpusOptions:
        """The columns to read: those asked for, else the index's."""
        return CorpusOptions(self.text_column or columns.text, self.id_column or columns.id,
                             self.strict)  # fmt: skip


def upsert(
    index_dir: str | os.PathLike[str],
    corpus: Corpus,
    text_column: str | None = None,
    id_column: str | None = None,
    batch_size: int = 64,
    strict: bool = False,
    model: str | os.PathLike[str] | None = None,
    *,
    encoder: TextEncoder | None = None,
    wait: float | None = None,
    merge_segments: bool = True,
    ann: AnnPolicy | None = None,
    merge: MergePolicy | None = None,
) -> WriteResult:
    r"""Insert new ids and replace existing ones, under the index's frozen encoder and calibrator.

    A replaced row is re-encoded and written to the new segment; its old row is deleted (never
    returned again; dropped when its segment is merged or compacted). An id may appear once per
    call (a batch naming an id twice is refused).

    Args:
        index_dir: the index directory.
        corpus: a corpus file, a directory of them, a glob, a ``pa.Table`` or a list of dicts
            (records with the index's id and text columns, and any metadata).
        text_column: default: the index's.
        id_column: default: the index's.
        batch_size: texts per encoder forward pass.
        strict: refuse null or blank texts instead of skipping them.
        model: where the index's model directory is now, if it has moved.
        encoder: a loaded Encoder to reuse (must match the index's).
        wait: seconds to wait for another writer (None: refuse at once).
        merge_segments: let the write merge small segments (the size-tiered policy).
        ann: what ``auto`` builds and tunes the new and merged segments for
            (:class:`~flowsearch.ann.policy.AnnPolicy`; None: the defaults).
        merge: when segments merge (:class:`~flowsearch.writes.merge.MergePolicy`; None: the
            defaults).

    Returns:
        A :class:`WriteResult` with ``n_written``, ``n_inserted``, ``n_replaced`` and ``drift``.

    Raises:
        FlowsearchError: bad input (a type conflict, a repeated id, a missing column, ...);
            nothing is written.
    """
    request = WriteRequest("upsert", text_column, id_column, batch_size, strict, model,
                           encoder, wait, merge_segments, ann, merge)  # fmt: skip
    return write(index_dir, corpus, request)


def add_to_index(
    index_dir: str | os.PathLike[str],
    corpus: Corpus,
    text_column: str | None = None,
    id_column: str | None = None,
    batch_size: int = 64,
    strict: bool = False,
    model: str | os.PathLike[str] | None = None,
    *,
    encoder: TextEncoder | None = None,
    wait: float | None = None,
    merge_segments: bool = True,
    ann: AnnPolicy | None = None,
    merge: MergePolicy | None = None,
) -> WriteResult:
    r"""Append rows whose ids are new (an id already in the index is refused: use
    :func:`upsert` to replace). Same arguments and result as :func:`upsert`.

    The second release took ``add_to_index(corpus, index_dir)``: that order still works (the
    argument that is an index directory is taken as the index) with a DeprecationWarning.
    """
    index_dir = check_path(index_dir, "index_dir", "an index directory")
    index_dir, corpus = _index_first(index_dir, corpus)
    request = WriteRequest("add", text_column, id_column, batch_size, strict, model, encoder,
                           wait, merge_segments, ann, merge)  # fmt: skip
    return write(index_dir, corpus, request)


def _index_first(
    first: str | os.PathLike[str], second: Corpus
) -> tuple[str | os.PathLike[str], Corpus]:
    if (
        not mf.is_index_dir(first)
        and isinstance(second, (str, os.PathLike))
        and (mf.is_index_dir(second))
    ):
        warnings.warn(
            "add_to_index(corpus, index_dir) is deprecated; call add_to_index(index_dir, corpus)",
            DeprecationWarning,
            stacklevel=3,
        )
        return second, first
    return first, second


def write(index_dir: str | os.PathLike[str], corpus: Corpus, request: WriteRequest) -> WriteResult:
    """:func:`upsert` or :func:`add_to_index` (``request.kind``) with its request made (what
    the command line calls)."""
    kind, model, merge_segments = request.kind, request.model, request.merge_segments
    ann, merge_policy = policy_or_default(request.ann), merge_policy_or_default(request.merge)
    target = check_path(index_dir, "index_dir", "an index directory")
    st = Stages()
    with open_writer(target, wait=request.wait) as writer, st.live():
        base = writer.base
        assert base is not None
        with st.timed("scan"):
            plan = read_for_write(corpus, request.corpus_options(base.columns), base)
            replaced, replaced_keys, n_replaced = _replaced(writer, plan, kind)
        with st.timed("load model"):
            space = SearchSpace.open(target, base, request.encoder, model=model)
        with st.timed("cut"):  # as the build cut (the manifest's sizes): rows are passages
            cuts = Cuts(space.require_encoder(), plan, sizes_of(base.passages), CHUNK_ROWS)
        transient = merge_segments and merged_at_once(writer.segments, replaced, cuts.n_rows,
                                                       merge_policy, ann)  # fmt: skip
        record, scored = _write_segment(writer, base, cuts, space, request.batch_size, st,
                                        transient=transient, ann=ann)  # fmt: skip
        with st.timed("drift"):
            before = [seg for seg in writer.segments if seg.name != record.name]
            drift, reference = _drift(writer, base, before, replaced, replaced_keys, scored,
                                      cuts.n_rows)  # fmt: skip
        with st.timed("deletions"):
            for name, rows in replaced.items():
                writer.delete_rows(name, rows)
        new_schema = schema_mod.merged(base.schema_, plan.metadata_schema)
        with st.timed("merge"):
            merged = _merge(writer, base, new_schema, merge_policy, ann) if merge_segments else 0
        changes = _changes(base, plan, space, model, new_schema)
        if reference is not None:
            changes["reference"] = reference
        detail = {"segment": record.name, "inserted": plan.n_rows - n_replaced,
                  "replaced": n_replaced, "merged": merged, "drift": drift.to_dict()}  # fmt: skip
        with st.timed("publish"):
            manifest = writer.publish(kind=kind, n_rows=cuts.n_rows, detail=detail, **changes)
    if drift.warn:
        LOG.warning("%s", drift.to_words())
    return result_of(kind, target, manifest, st, n_written=plan.n_rows,
                     n_inserted=plan.n_rows - n_replaced, n_replaced=n_replaced,
                     n_skipped=plan.n_skipped, n_merged=merged, drift=drift,
                     factory=record.ann.factory)  # fmt: skip


def _changes(
    base: mf.Manifest,
    plan: CorpusPlan,
    space: SearchSpace,
    model: str | os.PathLike[str] | None,
    schema: tuple[mf.SchemaColumn, ...],
) -> dict[str, Any]:
    """The manifest fields a write of new rows changes (besides its segments)."""
    changes: dict[str, Any] = {  # manifest fields, each its own type
        "skipped": base.skipped + plan.n_skipped,
        "next_auto_id": plan.auto_id_start + plan.n_rows_in,
        "schema_": schema,
    }
    if model is not None:  # the model moved: remember where it is now
        source = str(space.require_encoder().model_id)
        changes["encoder"] = base.encoder.model_copy(update={"source": source})
    return changes


def _plan_ids(plan: CorpusPlan) -> pa.Array | None:
    if plan.id_column is None:
        return None
    chunks = [ids for ids, _, _ in plan.batches(65_536)]
    return pa.chunked_array(chunks).combine_chunks() if chunks else None


def _replaced(
    writer: Writer, plan: CorpusPlan, kind: str
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """Per segment, the live local rows this write replaces (every passage of a replaced
    document; ``add``: refused instead), their ids' keys (uint64) and how many documents
    they are."""
    ids = _plan_ids(plan)
    if ids is None or not len(ids):
        return {}, np.zeros(0, np.uint64), 0
    found = find_live(writer.segments, writer.segment_path, ids)
    if found and kind == "add":
        example = ids[found[0][0]].as_py()
        raise BadInput(
            f"{len(found)} id(s) are already in the index (e.g. {example!r})",
            "remove them from the corpus, or upsert them to replace those rows",
        )
    out: dict[str, list[int]] = {}
    for _, name, row in found:
        out.setdefault(name, []).append(row)
    keys = keys_of(ids.take(pa.array([p for p, _, _ in found], pa.int64())))
    rows = {name: np.array(sorted(rows), dtype=np.int64) for name, rows in out.items()}
    return rows, keys, len({p for p, _, _ in found})


def _write_segment(
    writer: Writer,
    base: mf.Manifest,
    cuts: Cuts,
    space: SearchSpace,
    batch_size: int,
    st: Stages,
    *,
    transient: bool = False,
    ann: AnnPolicy | None = None,
) -> tuple[mf.SegmentRecord, _Pool]:
    """Encode, project and write the new rows (a row per passage) as one segment. Returns its
    record and a seeded sample of the new rows (:func:`_pool`): their searched vectors, keys,
    which of them drift judges, and those rows' log-densities. ``transient``: the write merges
    the segment away (:func:`~flowsearch.writes.merge.merged_at_once`), so its vector index is
    ``Flat``: nothing searches it, and the merge builds the index that stays."""
    builder = SegmentBuilder(
        writer,
        dim=base.dim,
        n_rows=cuts.n_rows,
        requested="Flat" if transient else base.ann_requested,
        lexical=base.lexical is not None,
        ann=ann,
    )
    pool, judged = _pool(cuts.n_rows)
    Zs: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    lps: list[np.ndarray] = []
    row = 0
    with st.task("writing rows", total=cuts.n_rows) as advance:
        for ids, texts, meta, spans in cuts.batches():
            with st.timed("encode"):
                U = space.require_encoder().encode(texts, batch_size=batch_size, progress=False)
            with st.timed("write"):
                Z, lp = space.project(U)
                columns = None if spans is None else passage_columns(spans)
                builder.add(rows_table(ids, texts, meta, Z, U, columns), Z)
            pick = pool[(pool >= row) & (pool < row + len(texts))] - row
            Zs.append(Z[pick])
            keys.append(keys_of(ids.take(pa.array(pick, pa.int64()))))
            if lp is not None:
                lps.append(lp[pick])
            row += len(texts)
            advance(len(texts))
    with st.timed("index"):
        record = builder.finish()
    Z_pool = np.concatenate(Zs) if Zs else np.zeros((0, base.dim), np.float32)
    key_pool = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
    lp_judged = np.concatenate(lps)[judged] if lps else None
    return record, _Pool(Z_pool, key_pool, judged, lp_judged)


class _Pool(NamedTuple):
    """A seeded sample of a write's new rows (see :func:`_pool`)."""

    Z: np.ndarray  # float32 (q, d), searched vectors
    keys: np.ndarray  # uint64 (q,)
    judged: np.ndarray  # int64, positions in the pool drift judges
    lp: np.ndarray | None  # float (len(judged),), their log-densities


def _pool(n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Which of a write's ``n_rows`` new rows are kept (row positions, sorted): as many as may
    enter the reference sample, and among them (positions in the pool) the at most
    ``measure.DRIFT_MAX_ROWS`` drift judges (both seeded, uniform)."""
    most = max(space_sample.REFERENCE_SAMPLE_ROWS, measure.DRIFT_MAX_ROWS)
    pool = sample_positions(n_rows, most)
    judged = sample_positions(len(pool), measure.DRIFT_MAX_ROWS, seed=1)
    return pool, judged


def _merge(writer: Writer, base: mf.Manifest, schema: tuple[mf.SchemaColumn, ...],
           policy: MergePolicy, ann: AnnPolicy) -> int:  # fmt: skip
    """Run the size-tiered policy on small segments; returns how many segments it merged."""
    merged = 0
    for names in plan_merges(writer.segments, policy, max_rows=policy.write_merge_max_rows,
                             flat_max_rows=ann.flat_max_rows):  # fmt: skip
        merge(
            writer,
            names,
            dim=base.dim,
            requested=base.ann_requested,
            lexical=base.lexical is not None,
            schema=schema,
            ann=ann,
        )
        merged += len(names)
    return merged


def _drift(
    writer: Writer,
    base: mf.Manifest,
    before: list[mf.SegmentRecord],
    replaced: dict[str, np.ndarray],
    replaced_keys: np.ndarray,
    pool: _Pool,
    n_rows: int,
) -> tuple[DriftReport, dict[str, object] | None]:
    """Where the new rows sit: their best scores against the reference sample of the rows the
    index held before the write (``before``: its segments, an older format's converted), minus
    those it replaces and those deleted since (:mod:`flowsearch.space.sample`), placed among the
    sample's probes' best scores. Returns the report and the next version's reference (None:
    unchanged)."""
    stored = reference_of(base)
    sample = read_sample(writer, base)
    drawn = sample is None
    if sample is None:  # an index written before samples existed: draw one, once
        sample = draw_sample(writer, before, seed=base.version)
    gone = stale_keys(writer, before, np.concatenate([sample.keys, sample.probe_keys]))
    live = sample.without(np.union1d(gone, replaced_keys))
    n_live = base.n_live - int(sum(len(r) for r in replaced.values()))
    if not drawn and (
        live.n_sample < min(space_sample.REFERENCE_SAMPLE_ROWS, n_live) // 2
        or space_reference.REFERENCE_MIN_ROWS > live.n_probes < n_live
    ):  # deletes took most of it: draw it again (rare; reads the rows it picks)
        sample = draw_sample(writer, before, seed=base.version)
        live, drawn = sample.without(replaced_keys), True
    spec = base.calibration
    reference = Reference.from_scores(
        live.probe_best,
        method="held-out" if live.method == "held-out" else "leave-one-out",
        n_corpus=n_live,
        space=spec.space,
    )
    log_median = stored.log_density_median if stored is not None else None
    reference = reference.model_copy(update={"log_density_median": log_median})
    best = live.best_scores(pool.Z[pool.judged])
    report = drift_report(best, reference, pool.lp, rows=n_rows, sample=live.n_sample)
    after = live.updated(n_live, pool.Z, pool.keys, n_rows, space_sample.REFERENCE_SAMPLE_ROWS,
                         space_reference.REFERENCE_MAX_ROWS, seed=writer.number)  # fmt: skip
    if after is sample and not drawn:
        return report, None
    kept = dict(base.reference or {}) or (stored.model_dump(mode="json") if stored else {})
    kept["sample"] = stage_sample(writer, after, parent=None if drawn else sample)
    if "method" not in kept:  # no reference for queries (nor measured here: see Reference)
        empty = Reference(method=reference.method, n_measured=0, n_corpus=n_live, space=spec.space)
        kept = {**empty.model_dump(mode="json"), "sample": kept["sample"]}
    return report, kept
