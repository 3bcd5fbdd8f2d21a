r"""Growing an index under its frozen encoder and calibrator: :func:`add_to_index`, :func:`upsert`.

New rows are encoded by the index's own encoder, projected by its own calibrator (never refitted
here: :func:`~flowsearch.writes.rewrite.recalibrate` does that), written to new shards and added to
the FAISS and BM25 indexes; the old shards and calibrator are linked into the new version, which is
published atomically (:mod:`flowsearch.storage.directory`). An upsert's replaced rows are
tombstoned.

Drift: each new row's best score against the rows the index held (those the write replaces
excluded) is placed among the corpus's own (:func:`flowsearch.space.drift.drift_report`); rows
that sit apart from the corpus log a warning saying what to do.

Example:
    >>> add_to_index("more.parquet", "my_index")["drift"]["verdict"]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.ann import faiss_index as fx
from flowsearch.errors import FlowsearchError
from flowsearch.progress import Stages
from flowsearch.settings import current
from flowsearch.space.drift import drift_report
from flowsearch.space.reference import reference_of
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import directory as directory
from flowsearch.storage import manifest as mf
from flowsearch.storage import rows as store
from flowsearch.storage.corpus import CorpusPlan, scan_corpus
from flowsearch.writes.build import CHUNK_ROWS, summary

__all__ = ["add_to_index", "upsert"]

LOG = logging.getLogger(__name__)


def add_to_index(
    corpus: Any,
    index_dir: str | os.PathLike[str],
    text_column: str | None = None,
    id_column: str | None = None,
    batch_size: int = 64,
    strict: bool = False,
    model: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    r"""Append a corpus to an existing index under its frozen encoder and calibrator.

    New rows go to new shards, the FAISS and BM25 indexes grow (trained indexes keep their
    training), and the result is published as a new version, atomically like
    :func:`build_index`. Columns default to the ones the index was built with.

    Args:
        corpus: a corpus file, a directory of them, a glob, a ``pa.Table`` or a list of dicts.
        index_dir: the index directory.
        text_column: default: the index's.
        id_column: default: the index's.
        batch_size: texts per encoder forward pass.
        strict: refuse null or blank texts instead of skipping them.
        model: where the index's model directory is now, if it has moved.

    Returns:
        A summary, with ``"drift"``: the JSON form of
        :func:`~flowsearch.space.drift.drift_report` (where the new rows sit among the
        corpus's own passages, in words by ``DriftReport.to_words()``).

    Raises:
        FlowsearchError: bad input, ids already in the index, or an index that fails to verify.
    """
    return _write("add", corpus, index_dir, text_column, id_column, batch_size, strict, model)


def upsert(
    index_dir: str | os.PathLike[str],
    corpus: Any,
    text_column: str | None = None,
    id_column: str | None = None,
    batch_size: int = 64,
    strict: bool = False,
    model: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    r"""Insert new ids and replace existing ones, under the index's frozen encoder and calibrator.

    A replaced row is re-encoded and appended; its old row is deleted (never returned again,
    dropped by :func:`~flowsearch.writes.rewrite.compact`). Published atomically like
    :func:`add_to_index`, with the same drift report.

    Args:
        index_dir: the index directory.
        corpus: a corpus file, a directory of them, a glob, a ``pa.Table`` or a list of dicts
            (records with the index's id and text columns).
        text_column: default: the index's.
        id_column: default: the index's.
        batch_size: texts per encoder forward pass.
        strict: refuse null or blank texts instead of skipping them.
        model: where the index's model directory is now, if it has moved.

    Returns:
        A summary with ``"upserted"`` (rows written), ``"inserted"``, ``"replaced"`` and
        ``"drift"``.

    Raises:
        FlowsearchError: bad input (duplicate ids in the batch, a missing column, ...).
    """
    return _write("upsert", corpus, index_dir, text_column, id_column, batch_size, strict, model)


def _write(
    kind: str,
    corpus: Any,
    index_dir: str | os.PathLike[str],
    text_column: str | None,
    id_column: str | None,
    batch_size: int,
    strict: bool,
    model: str | os.PathLike[str] | None,
) -> dict[str, Any]:
    if batch_size < 1:
        raise FlowsearchError(f"batch_size must be >= 1, got {batch_size}")
    target = Path(index_dir).expanduser()
    st = Stages()
    with directory.write_version(target) as build, st.live():
        manifest, plan, drift, replaced = _append(
            build, kind, corpus, st, text_column, id_column, batch_size, strict, model
        )
    if drift is not None and drift.warn:
        LOG.warning("%s", drift.to_words())
    extra: dict[str, Any] = {"added": plan.rows}
    if kind == "upsert":
        extra = {"upserted": plan.rows, "inserted": plan.rows - replaced, "replaced": replaced}
    report = drift.to_dict() if drift is not None else None
    return summary(target, manifest, st, skipped=plan.skipped, drift=report, **extra)


def _append(
    build: directory.VersionBuild,
    kind: str,
    corpus: Any,
    st: Stages,
    text_column: str | None,
    id_column: str | None,
    batch_size: int,
    strict: bool,
    model: str | os.PathLike[str] | None,
) -> tuple[mf.Manifest, CorpusPlan, Any, int]:
    """Append (``add``) or upsert under the writer lock: (manifest, plan, drift, replaced)."""
    import pyarrow as pa

    base = build.base
    assert base is not None
    index_dir = build.index_dir
    directory.verify(index_dir, base)
    cols = base.columns
    text_column = text_column or cols.text
    id_column = id_column or cols.id
    with st.timed("scan"):
        ids, deleted = store.live_ids(index_dir, base)
        alive = [i for n, i in enumerate(ids) if deleted is None or not deleted[n]]
        plan = scan_corpus(
            corpus,
            text_column,
            id_column,
            strict=strict,
            existing_ids=pa.array(alive) if id_column is not None else None,
            on_existing="replace" if kind == "upsert" else "refuse",
            auto_id_start=base.next_auto_id,
        )
        if plan.id_column is None and cols.id is not None:
            raise FlowsearchError(
                f"the index has ids from column {cols.id!r}, the corpus has no such column; "
                "pass id_column"
            )
    replaced_rows = np.zeros(0, dtype=np.int64)
    if len(plan.replaced_ids):
        gone = set(plan.replaced_ids.to_pylist())
        replaced_rows = np.array(
            [n for n, i in enumerate(ids) if i in gone and (deleted is None or not deleted[n])],
            dtype=np.int64,
        )
    with st.timed("load model"):
        space = SearchSpace.open(index_dir, base, model=model)
    build.link(mf.CALIBRATOR_DIR)
    for shard in base.shards:
        build.link(shard.path)
    faiss_index = fx.read_index(base.path(index_dir, mf.FAISS_FILE), base.faiss.params)
    writer = store.ShardWriter(build.path, first_part=len(base.shards))
    new_texts: list[str] = []
    scored = _drift_sample(plan.rows)
    searchable = _searchable(base.rows, deleted, replaced_rows)
    best: list[np.ndarray] = []
    lps: list[np.ndarray] = []
    row = 0
    with st.timed("encode+write"), st.task(f"{kind}ing", total=plan.rows) as advance:
        for batch_ids, texts, meta in plan.batches(CHUNK_ROWS):
            U = space.encoder.encode(texts, batch_size=batch_size, progress=False)
            Z, lp = space.project(U)
            pick = scored[(scored >= row) & (scored < row + len(texts))] - row
            if len(pick) and len(searchable):  # before adding: against the rows held before
                best.append(_best_scores(faiss_index, Z[pick], searchable))
                if lp is not None:
                    lps.append(lp[pick])
            row += len(texts)
            writer.write(store.shard_table(batch_ids, texts, meta, Z, U))
            fx.add(faiss_index, Z, base.faiss.factory)
            if base.lexical is not None:
                new_texts.extend(texts)
            advance(len(texts))
    with st.timed("write index"):
        fx.write_index(faiss_index, build.path / mf.FAISS_FILE)
    new_shards = writer.close()
    lexical = base.lexical
    if base.lexical is not None:
        with st.timed("lexical"):
            lexical = _grow_lexical(build, base, new_texts, replaced_rows)
    tombstones, n_deleted = base.tombstones, base.deleted
    if len(replaced_rows):
        tombstones, n_deleted = store.write_deleted(build.path, deleted, replaced_rows)
    elif base.tombstones is not None:
        build.link(base.tombstones)
    drift = drift_report(
        np.concatenate(best) if best else np.zeros(0),
        reference_of(base),
        np.concatenate(lps) if lps else None,
        rows=plan.rows,
    )
    detail = {"replaced": int(len(replaced_rows))} if kind == "upsert" else {}
    record = mf.WriteRecord(
        kind=kind, time=mf.utc_now(), rows=plan.rows, drift=drift.to_dict(), detail=detail
    )
    manifest = mf.with_history(
        base,
        record,
        shards=(*base.shards, *new_shards),
        rows=base.rows + plan.rows,
        skipped=base.skipped + plan.skipped,
        next_auto_id=plan.auto_id_start + plan.rows_in,
        lexical=lexical,
        tombstones=tombstones,
        deleted=n_deleted,
    )
    if model is not None:  # the model moved: remember where it is now
        encoder = replace(base.encoder, source=str(space.encoder.model_id))
        manifest = replace(manifest, encoder=encoder)
    return build.publish(manifest), plan, drift, int(len(replaced_rows))


def _drift_sample(n: int) -> np.ndarray:
    """Positions (int64, sorted) of the new rows the drift report scores: all of them, or a
    seeded sample of ``Settings.drift_max_rows``."""
    most = current().drift_max_rows
    if n <= most:
        return np.arange(n, dtype=np.int64)
    return np.sort(np.random.default_rng(0).choice(n, most, replace=False)).astype(np.int64)


def _searchable(n_rows: int, deleted: np.ndarray | None, replaced: np.ndarray) -> np.ndarray:
    """The rows (int64) new rows are compared with: live rows the write does not replace."""
    keep = np.ones(n_rows, dtype=bool) if deleted is None else ~np.asarray(deleted, bool)
    keep[replaced] = False
    return np.flatnonzero(keep).astype(np.int64)


def _best_scores(faiss_index: Any, Z: np.ndarray, searchable: np.ndarray) -> np.ndarray:
    """Each vector's best score (float64, NaN for none) among rows ``searchable``."""
    from flowsearch.ann.prefilter import filtered_search

    scores, found = filtered_search(faiss_index, Z, 1, searchable)
    return np.where(found[:, 0] >= 0, scores[:, 0].astype(np.float64), np.nan)


def _grow_lexical(
    build: directory.VersionBuild, base: mf.Manifest, texts: list[str], dead: np.ndarray
) -> mf.LexicalSpec:
    """The BM25 index of ``base`` with ``texts`` appended and rows ``dead`` deleted."""
    from flowsearch.lexical.bm25 import LexicalIndex

    assert base.lexical is not None
    lex = LexicalIndex.load(base.path(build.index_dir, base.lexical.path))
    lex.add(texts)
    if len(dead):
        lex.delete(dead)
    return lex.save_version(build.path)
