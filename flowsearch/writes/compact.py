r"""Compaction and recalibration: the writes that rewrite segments, never re-encoding.

- :func:`compact` runs the size-tiered merge policy without the bound writes keep
  (:mod:`flowsearch.writes.merge`) and rewrites every segment that holds deleted rows, so no
  deleted row is left on disk; ``full=True`` merges the whole index into one segment. A
  string-id segment an older release wrote without ``key_ids.arrow`` and left unmerged is given
  the file (:mod:`flowsearch.storage.upgrade`: its files hard-linked, its keys rewritten), so
  id lookups in it are confirmed exactly without reading its rows.
- ``compact`` also re-tunes every ``auto`` segment an older tuning rule tuned
  (:data:`flowsearch.ann.tune.TUNER_VERSION`): the search knob is chosen again on the
  segment's own rows and recorded, its files hard-linked into a new segment (nothing rebuilt),
  so an index built before a tuner fix keeps the recall promise without a ``--full`` rebuild.
  Given ``tune_queries`` (the users' own queries, e.g. a log's), it re-tunes every ``auto``
  approximate segment on them instead of held-out rows: the knob those queries need, which
  held-out rows can only bound from the safe side (benchmarks/RESULTS.md, "ANN"); the tuning
  stays until the segment is rewritten (a later merge tunes the new segment on held-out rows).
- :func:`recalibrate` refits (or loads) the calibrator on the raw encoder vectors every segment
  keeps, and rewrites every segment's searched vectors and vector index from them: the searched
  space changes without touching the encoder, nearly all of an index's cost. Deleted rows
  are dropped on the way; the postings and ids are carried over.

Example:
    >>> compact("my_index").bytes_freed  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.ann.policy import AnnPolicy
from flowsearch.ann.policy import policy_or_default as ann_or_default
from flowsearch.ann.tune import MIN_USER_QUERIES, TUNER_VERSION
from flowsearch.errors import BadInput, NotFound, check_bool, check_int, check_path, check_text
from flowsearch.progress import Stages
from flowsearch.search.version import sizes
from flowsearch.space.fitting import checked_calibration, fit_for_index, load_fitted
from flowsearch.space.reference import density_stats
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import CALIBRATORS_DIR
from flowsearch.storage.rows import RowReader
from flowsearch.storage.upgrade import add_key_ids, lacks_key_ids, linked_stage
from flowsearch.storage.writer import Writer, open_writer
from flowsearch.writes import merge as merging
from flowsearch.writes.measure import open_index, remeasure
from flowsearch.writes.merge import MergePolicy, plan_merges
from flowsearch.writes.results import WriteResult, result_of
from flowsearch.writes.segments import segment_tuning

__all__ = ["checked_queries", "compact", "recalibrate", "tuned_by_older_rule"]

LOG = logging.getLogger(__name__)


def _merges(
    segments: tuple[mf.SegmentRecord, ...], full: bool, policy: MergePolicy, ann: AnnPolicy
) -> list[list[str]]:
    if full:
        whole = len(segments) > 1 or any(s.n_deleted for s in segments)
        return [[s.name for s in segments]] if whole else []
    out = plan_merges(segments, policy, max_rows=None, flat_max_rows=ann.flat_max_rows)
    taken = {name for group in out for name in group}
    out += [[s.name] for s in segments if s.n_deleted and s.name not in taken]
    return out


def tuned_by_older_rule(seg: mf.SegmentRecord, requested: str = "auto") -> bool:
    """Whether ``compact`` re-tunes segment ``seg`` of an index that asked for ``requested``:
    an ``auto`` approximate index tuned by a rule older than :data:`TUNER_VERSION`, or before
    tunings were recorded (a newer release's tuning is left alone)."""
    tuning = seg.ann.tuning
    return _tuned_by_auto(seg, requested) and (
        tuning is None or tuning.tuner is None or tuning.tuner < TUNER_VERSION
    )


def _tuned_by_auto(seg: mf.SegmentRecord, requested: str = "auto") -> bool:
    """Whether segment ``seg`` holds an approximate index ``auto`` built and tuned."""
    return requested == "auto" and seg.ann.factory != "Flat" and seg.n_rows > 0


#: The most of the users' queries a tuning embeds and searches (a seeded sample of a longer
#: log): a recall's standard error is then at most sqrt(0.25 / 10,000) = 0.005, and the
#: embedding, done while the writer lock is held, stays bounded.
MAX_USER_QUERIES = 10_000


def checked_queries(queries: object) -> list[str]:
    """``compact``'s ``tune_queries``: a list (or tuple) of at least :data:`MIN_USER_QUERIES`
    distinct, non-blank query texts; blank ones and repeats are dropped (the bound the tuning
    gives is over distinct queries, not over traffic), and a seeded sample of at most
    :data:`MAX_USER_QUERIES` is kept.

    Raises:
        BadInput: not a list of strings, or too few of them.
    """
    if isinstance(queries, (str, bytes)) or not isinstance(queries, (list, tuple)):
        raise BadInput(f"tune_queries must be a list of query texts, got "
                       f"{type(queries).__name__}", "pass {tune_queries=[...]}, one text each",
                       param="tune_queries")  # fmt: skip
    texts = [check_text(q, f"tune_queries[{i}]", "tune_queries") for i, q in enumerate(queries)]
    kept = list(dict.fromkeys(t.strip() for t in texts if t.strip()))
    if len(kept) < MIN_USER_QUERIES:
        raise BadInput(
            f"tune_queries holds {len(kept)} distinct queries, too few to measure a recall of "
            "0.95 on",
            f"give at least {MIN_USER_QUERIES} real queries (a log of what users searched)",
            param="tune_queries",
        )
    if len(kept) > MAX_USER_QUERIES:
        pick = np.random.default_rng(0).choice(len(kept), MAX_USER_QUERIES, replace=False)
        kept = [kept[i] for i in np.sort(pick)]
    return kept


def _embedded(root: Path, base: mf.Manifest, texts: list[str], st: Stages) -> np.ndarray:
    """The users' queries in the index's searched space (its encoder and calibrator).

    Raises:
        BadInput: its model cannot be loaded here (nothing is written)."""
    try:
        with st.timed("embed queries"):
            return SearchSpace.open(root, base).embed(texts)[0]
    except NotFound as exc:  # the model moved: compact cannot be told where
        raise BadInput(f"tune_queries needs the index's encoder: {exc.problem}",
                       "put the model back where the index's build found it",
                       param="tune_queries") from None  # fmt: skip


def _retune(
    writer: Writer,
    requested: str,
    policy: AnnPolicy,
    queries: np.ndarray | None = None,
    done: frozenset[str] = frozenset(),
) -> list[str]:
    """Re-tune every segment :func:`tuned_by_older_rule` names (with the user's ``queries``,
    float32 (q, dim) in the searched space: every ``auto`` approximate segment, on them) and
    relink it with the new knob and tuning (see the module docstring). A segment that cannot
    be re-tuned (its index unreadable, the tuning failing) keeps its knob, with a warning: the
    rest of the compaction goes on. Segments named in ``done`` (tuned by this compaction's
    merges) are left alone. Returns the new segments' names."""
    new: list[str] = []
    wanted = tuned_by_older_rule if queries is None else _tuned_by_auto
    for seg in [s for s in writer.segments if wanted(s, requested) and s.name not in done]:
        try:
            index = open_index(writer, seg)
            reader = RowReader(writer.segment_path(seg), seg.parts)
            try:
                params, tuning = segment_tuning(index, reader, policy, queries)
            finally:
                reader.close()
        except (OSError, RuntimeError, ValueError) as e:  # FAISS raises RuntimeError
            LOG.warning("segment %s keeps its knob (%s): re-tuning failed: %s", seg.name,
                        seg.ann.params or "none", e)  # fmt: skip
            continue
        if tuning.exact is not None:  # its file stays a graph: a rebuild searches it exactly
            LOG.warning("segment %s keeps its knob (%s): its %s; rebuild the index to search "
                        "it exactly", seg.name, seg.ann.params or "none", tuning.exact)  # fmt: skip
            continue
        ann = seg.ann.model_copy(update={"params": params, "tuning": tuning})
        LOG.info("segment %s re-tuned: %s -> %s", seg.name, seg.ann.params, params)
        stage = linked_stage(writer, seg)
        new.append(writer.relink_segment(seg.name, stage, dict(seg.files), ann=ann).name)
    return new


def compact(
    index_dir: str | os.PathLike[str],
    *,
    full: bool = False,
    wait: float | None = None,
    ann: AnnPolicy | None = None,
    merge: MergePolicy | None = None,
    tune_queries: Sequence[str] | None = None,
) -> WriteResult:
    """Merge small segments and drop every deleted row (see the module docstring).

    Args:
        index_dir: the index directory.
        full: merge everything into one segment.
        wait: seconds to wait for another writer (None: refuse at once).
        ann: what ``auto`` builds and tunes merged and re-tuned segments for (None: the
            defaults).
        merge: when segments merge (None: the defaults).
        tune_queries: the users' own queries (at least ``MIN_USER_QUERIES`` distinct texts,
            e.g. from a query log): every ``auto`` approximate segment, merged or not, is
            tuned on them (embedded by the index's encoder and calibrator) instead of on
            held-out rows, and ``info`` says so. None: held-out rows.

    Returns:
        A :class:`WriteResult`: ``merged`` segments, ``n_dropped`` deleted rows,
        ``bytes_freed``, ``n_retuned`` segments re-tuned. When there is nothing to do
        (nothing to merge or drop, no segment to give ``key_ids.arrow`` or to re-tune), no
        version is written.

    Raises:
        NotFound: no index. IndexLocked: another writer, past ``wait``.
    """
    policy, ann = merging.policy_or_default(merge), ann_or_default(ann)
    st = Stages()
    root = check_path(index_dir, "index_dir", "an index directory")
    check_bool(full, "full")
    texts = None if tune_queries is None else checked_queries(tune_queries)
    with open_writer(root, wait=wait) as writer, st.live():
        base = writer.base
        assert base is not None
        if texts is not None and base.ann_requested != "auto":
            raise BadInput(f"this index's vector index is {base.ann_requested!r}, chosen at "
                           "build, which is never tuned: tune_queries has nothing to tune",
                           "leave out {tune_queries=...}", param="tune_queries")  # fmt: skip
        before = sizes(root, base)["total"]
        groups = _merges(writer.base.segments if writer.base else (), full, policy, ann)
        again = tuned_by_older_rule if texts is None else _tuned_by_auto
        stale = any(again(s, base.ann_requested) for s in base.segments)
        if not groups and not lacks_key_ids(writer) and not stale:
            return result_of("compact", root, base, st, bytes_freed=0)
        queries = None
        if texts is not None:
            queries = _embedded(root, base, texts, st)
        merged_now: set[str] = set()
        with st.timed("merge"):
            for names in groups:
                record = merging.merge(
                    writer,
                    names,
                    dim=base.dim,
                    requested=base.ann_requested,
                    lexical=base.lexical is not None,
                    schema=base.schema_,
                    ann=ann,
                    tune_queries=queries,
                )
                if record is not None:
                    merged_now.add(record.name)
        with st.timed("key ids"):
            upgraded = add_key_ids(writer)  # the segments no merge rewrote
        with st.timed("tuning"):
            retuned = _retune(writer, base.ann_requested, ann, queries, frozenset(merged_now))
        if not groups and not upgraded and not retuned:  # every re-tune failed: no new version
            return result_of("compact", root, base, st, bytes_freed=0)
        merged = sum(len(g) for g in groups)
        dropped = base.n_deleted - sum(s.n_deleted for s in writer.segments)
        carried = {b.name for b in base.segments} | set(upgraded) | set(retuned)  # relinked
        written = sum(s.n_rows for s in writer.segments if s.name not in carried)
        detail: dict[str, object] = {"merged": merged, "dropped": dropped}
        if upgraded:
            detail["key_ids"] = len(upgraded)
        if retuned:
            detail["retuned"] = len(retuned)
        manifest = writer.publish(kind="compact", n_rows=written, detail=detail)
    after = sizes(root, manifest)["total"]
    return result_of(
        "compact",
        root,
        manifest,
        st,
        n_written=written,
        n_dropped=dropped,
        n_merged=merged,
        n_retuned=len(retuned),
        bytes_freed=before - after,
    )


def _raw_sample(root: Path, writer: Writer, n: int, seed: int = 0) -> np.ndarray:
    """A seeded uniform sample of at most ``n`` live rows' raw vectors (float32)."""
    from flowsearch.storage import deletions

    segments = writer.segments
    live = sum(s.n_live for s in segments)
    rate = min(1.0, n / max(live, 1))
    rng = np.random.default_rng(seed)
    parts = []
    for seg in segments:
        folder = writer.segment_path(seg)
        dead = deletions.read(folder / seg.deletions, seg.n_rows) if seg.deletions else None
        reader = RowReader(folder, seg.parts)
        try:
            start = 0
            for chunk in reader.column_chunks("raw"):
                keep = (
                    np.ones(len(chunk), bool) if dead is None else ~dead[start : start + len(chunk)]
                )
                start += len(chunk)
                if rate < 1:
                    keep &= rng.random(len(chunk)) < rate
                parts.append(chunk[keep])
        finally:
            reader.close()
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


def recalibrate(
    index_dir: str | os.PathLike[str],
    calibration: str = "auto",
    calibrator: str | os.PathLike[str] | None = None,
    fit_sample: int = 200_000,
    *,
    wait: float | None = None,
    ann: AnnPolicy | None = None,
) -> WriteResult:
    """Refit the calibrator on the stored raw vectors (no re-encoding) and rewrite every
    segment's searched vectors and vector index; deleted rows are dropped on the way.

    Args:
        index_dir: the index directory.
        calibration: ``auto``, a calibrator name or ``none`` (as in ``build_index``).
        calibrator: a calibrator fitted elsewhere to load instead of fitting.
        fit_sample: fit on a uniform sample of at most this many live rows.
        wait: seconds to wait for another writer (None: refuse at once).
        ann: what ``auto`` builds and tunes the rewritten segments for (None: the defaults).

    Returns:
        A :class:`WriteResult` with the new ``calibration``, ``space`` and ``decision``.

    Raises:
        BadInput: an unknown calibration, a calibrator of another dimension, every row deleted.
        NotFound: no index.
    """
    policy = ann_or_default(ann)
    if calibrator is None:
        checked_calibration(calibration)  # an unknown name fails here, before any work
    check_int(fit_sample, "fit_sample", 2)
    st = Stages()
    root = check_path(index_dir, "index_dir", "an index directory")
    with open_writer(root, wait=wait) as writer, st.live():
        base = writer.base
        assert base is not None
        if base.n_live == 0:
            raise BadInput("every row is deleted", "build a new index instead")
        loaded = load_fitted(calibrator, calibration, base.encoder.dim) if calibrator else None
        with st.timed("fit"):
            U = _raw_sample(root, writer, fit_sample)
            cal, spec = fit_for_index(
                U, calibration, loaded=loaded, loaded_from=calibrator, pooling=base.encoder.pooling
            )
        space = SearchSpace(cal, spec)
        with st.timed("rewrite"):
            manifest = _rewrite(writer, base, space, policy)
    return result_of("recalibrate", root, manifest, st, n_written=manifest.n_rows)


def _rewrite(writer: Writer, base: mf.Manifest, space: SearchSpace, ann: AnnPolicy) -> mf.Manifest:
    """Every segment rewritten in ``space``; publishes the new version."""
    stage = writer.stage(CALIBRATORS_DIR)
    space.calibrator.save(stage)
    spec = writer.set_calibrator(stage, space.spec)
    lps: list[np.ndarray] = []
    names = [s.name for s in writer.segments]
    for name in names:  # one new segment per old one: sizes and merge tiers stay
        merging.merge(
            writer,
            [name],
            dim=space.dim,
            requested=base.ann_requested,
            lexical=base.lexical is not None,
            schema=base.schema_,
            project=space.project,
            lps=lps,
            ann=ann,
        )
    reference = remeasure(writer, space)  # the old one was measured in the old space
    changes: dict[str, Any] = {  # manifest fields, each its own type
        "calibration": spec,
        "dim": space.dim,
        "density": density_stats(np.concatenate(lps)) if lps else None,
        "held_out": None,
        "reference": reference.model_dump(mode="json"),
    }
    return writer.publish(
        kind="recalibrate",
        n_rows=base.n_live,
        detail={"calibration": spec.name, "space": spec.space},
        **changes,
    )
