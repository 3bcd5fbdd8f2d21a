r"""Writes that need no encoder: :func:`delete`, :func:`compact` and :func:`recalibrate`.

- :func:`delete` tombstones rows (a new version whose ``tombstones.npy`` lists them; the BM25
  index drops them from its statistics). Nothing else is rewritten: the FAISS index and the
  shards are shared with the previous version, and searches skip the tombstoned rows.
- :func:`compact` rewrites the shards, the FAISS index and the BM25 index without dead rows.
- :func:`recalibrate` refits (or loads) the calibrator on the raw encoder vectors every shard
  keeps, and rewrites the searched vectors and the FAISS index: the searched space changes
  without touching the encoder, which is >99% of an index's cost. It compacts on the way.

All are published as a new version, atomically, under the writer lock, like every write.

Example:
    >>> delete("my_index", ["doc-17"]).missing  # doctest: +SKIP
    []
    >>> compact("my_index")["bytes_freed"]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.ann import faiss_index as fx
from flowsearch.errors import FlowsearchError
from flowsearch.progress import Stages
from flowsearch.space.fitting import fit_for_index, load_fitted
from flowsearch.space.reference import density_stats
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import directory as directory
from flowsearch.storage import manifest as mf
from flowsearch.storage import rows as store

__all__ = ["DeleteResult", "compact", "delete", "recalibrate"]

LOG = logging.getLogger(__name__)

_TRAIN_SAMPLE = 262_144


@dataclass(frozen=True)
class DeleteResult:
    """What :func:`delete` did: how many rows it deleted and which ids it did not find."""

    deleted: int
    missing: list[Any] = field(default_factory=list)
    version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"deleted", "missing", "version"}``."""
        return {"deleted": self.deleted, "missing": list(self.missing), "version": self.version}


def _normal_ids(ids: Sequence[Any], id_type: str) -> list[tuple[Any, Any]]:
    """``(as given, as stored)`` for each id: integer indexes take ints and digit strings."""
    out = []
    for given in ids:
        stored = given
        if id_type == "int" and isinstance(given, str) and given.strip().lstrip("-").isdigit():
            stored = int(given)
        elif id_type == "string" and isinstance(given, int) and not isinstance(given, bool):
            stored = str(given)
        out.append((given, stored))
    return out


def delete(index_dir: str | os.PathLike[str], ids: Sequence[Any]) -> DeleteResult:
    """Delete rows by id: they are never returned again, by any search mode, filter or k.

    Args:
        index_dir: the index directory.
        ids: the ids to delete (an index with integer ids also takes digit strings).

    Returns:
        A :class:`DeleteResult`; ids not in the index (or deleted before) are ``missing``. When
        none is found, no version is written.

    Raises:
        FlowsearchError: no index, another writer, an empty or non-list ``ids``.
    """
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise FlowsearchError("ids must be a list of ids, e.g. delete(index_dir, ['a', 'b'])")
    if not ids:
        raise FlowsearchError("no ids to delete; pass at least one")
    with directory.write_version(index_dir) as build:
        base = build.base
        assert base is not None
        directory.verify(build.index_dir, base)
        stored, deleted = store.live_ids(build.index_dir, base)
        where: dict[Any, int] = {}
        for n, value in enumerate(stored):
            if deleted is None or not deleted[n]:
                where[value] = n
        rows: list[int] = []
        missing: list[Any] = []
        for given, value in _normal_ids(ids, base.columns.id_type):
            row: int | None = where.pop(value, None)
            if row is None:
                missing.append(given)
            else:
                rows.append(row)
        if not rows:
            return DeleteResult(0, missing, base.version)
        dead = np.array(sorted(rows), dtype=np.int64)
        on_disk = (mf.IVF_DATA_FILE,) if mf.IVF_DATA_FILE in base.files else ()
        for part in (mf.CALIBRATOR_DIR, mf.FAISS_FILE, *on_disk, *(s.path for s in base.shards)):
            build.link(part)
        tombstones, n_deleted = store.write_deleted(build.path, deleted, dead)
        lexical = base.lexical
        if base.lexical is not None:
            from flowsearch.lexical.bm25 import LexicalIndex

            lex = LexicalIndex.load(base.path(build.index_dir, base.lexical.path))
            lex.delete(dead)
            lexical = lex.save_version(build.path)
        record = mf.WriteRecord(kind="delete", time=mf.utc_now(), rows=len(dead))
        manifest = mf.with_history(
            base, record, tombstones=tombstones, deleted=n_deleted, lexical=lexical
        )
        published = build.publish(manifest)
    return DeleteResult(len(dead), missing, published.version)


def _live_tables(
    index_dir: Path, base: mf.Manifest, deleted: np.ndarray | None
) -> Iterator[pa.Table]:
    """The version's rows without deleted ones, shard by shard (all columns)."""
    start = 0
    for shard in base.shards:
        table = pq.read_table(base.path(index_dir, shard.path))
        if deleted is not None:
            keep = ~deleted[start : start + table.num_rows]
            table = table.filter(pa.array(keep))
        start += shard.rows
        if table.num_rows:
            yield table


def _matrix(table: pa.Table, column: str) -> np.ndarray:
    col = table.column(column).combine_chunks()
    dim = col.type.list_size
    return col.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)


def _sample(index_dir: Path, base: mf.Manifest, deleted: Any, column: str, n: int) -> np.ndarray:
    """A seeded uniform sample of at most ``n`` live rows' ``column`` vectors (float32)."""
    live = base.rows - (int(deleted.sum()) if deleted is not None else 0)
    rate = min(1.0, n / max(live, 1))
    rng = np.random.default_rng(0)
    parts = []
    for table in _live_tables(index_dir, base, deleted):
        pick = np.flatnonzero(rng.random(table.num_rows) < rate) if rate < 1 else None
        part = table.select([column]) if pick is None else table.select([column]).take(pick)
        parts.append(_matrix(part, column))
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


def _rewrite(
    build: directory.VersionBuild,
    kind: str,
    space: SearchSpace | None,
    calibration: mf.CalibrationSpec | None,
    st: Stages,
) -> mf.Manifest:
    """Write the live rows again (re-projecting their raw vectors when ``space`` is given), a new
    FAISS index and BM25 index; returns the manifest to publish."""
    base = build.base
    assert base is not None
    index_dir = build.index_dir
    _, deleted = store.live_ids(index_dir, base)
    live = base.rows - (int(deleted.sum()) if deleted is not None else 0)
    if live == 0:
        raise FlowsearchError("every row is deleted; build a new index instead")
    dim = space.dim if space is not None else base.dim
    requested = base.faiss.requested
    factory = fx.auto_factory(live, dim=dim) if requested == "auto" else base.faiss.factory
    faiss_index = fx.new_index(dim, factory)
    sample = None
    if not faiss_index.is_trained or (requested == "auto" and factory != "Flat"):
        if space is not None:
            raw = _sample(index_dir, base, deleted, "raw", _TRAIN_SAMPLE)
            sample = space.project(raw, want_density=False)[0]
        else:
            sample = _sample(index_dir, base, deleted, "vector", _TRAIN_SAMPLE)
        fx.train(faiss_index, sample, factory)
    writer = store.ShardWriter(build.path)
    lps: list[np.ndarray] = []
    with st.task(f"{kind}: rewriting rows", total=live) as advance:
        for table in _live_tables(index_dir, base, deleted):
            if space is not None:
                Z, lp = space.project(_matrix(table, "raw"))
                if lp is not None:
                    lps.append(lp)
                vectors = store.vector_column(Z)
                table = table.set_column(table.schema.get_field_index("vector"), "vector", vectors)
            else:
                Z = _matrix(table, "vector")
            writer.write(table)
            fx.add(faiss_index, Z, factory)
            advance(table.num_rows)
    shards = writer.close()
    params = base.faiss.params if space is None else ""
    if requested == "auto" and factory != "Flat" and sample is not None:
        reader = store.RowReader(build.path, shards)
        try:
            params, _ = fx.tune_search(faiss_index, sample, lambda: reader.column_chunks("vector"))
        finally:
            reader.close()
    fx.write_index(faiss_index, build.path / mf.FAISS_FILE)
    lexical = base.lexical
    if base.lexical is not None:
        from flowsearch.lexical.bm25 import LexicalIndex

        lex = LexicalIndex.load(base.path(index_dir, base.lexical.path))
        if deleted is not None:
            lex.delete(np.flatnonzero(deleted))
        lex.compact()
        lexical = lex.save_version(build.path)
    new_calibration, density, held_out = base.calibration, base.density, base.held_out
    reference = base.reference
    if space is not None and calibration is not None:
        space.calibrator.save(build.path / mf.CALIBRATOR_DIR)
        new_calibration = calibration
        density = density_stats(np.concatenate(lps)) if lps else None
        held_out = reference = None  # measured in the old space: not a reference any more
    else:
        build.link(mf.CALIBRATOR_DIR)
    detail = {"dropped": base.rows - live}
    record = mf.WriteRecord(kind=kind, time=mf.utc_now(), rows=live, detail=detail)
    return mf.with_history(
        base,
        record,
        shards=tuple(shards),
        rows=live,
        deleted=0,
        tombstones=None,
        faiss=mf.FaissSpec(factory=factory, requested=requested, params=params),
        lexical=lexical,
        dim=dim,
        calibration=new_calibration,
        density=density,
        held_out=held_out,
        reference=reference,
    )


def compact(index_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Rewrite the index without its deleted rows (shards, FAISS index, BM25 index).

    Returns:
        ``{"version", "rows", "dropped", "bytes_before", "bytes_after", "bytes_freed"}``.

    Raises:
        FlowsearchError: no index, another writer, or every row deleted.
    """
    st = Stages()
    root = Path(index_dir).expanduser()
    with directory.write_version(root) as build, st.live():
        base = build.base
        assert base is not None
        directory.verify(root, base)
        before = directory.size_on_disk(base.path(root))
        if base.deleted == 0:
            return _sizes_summary(base, base, before, before)
        published = build.publish(_rewrite(build, "compact", None, None, st))
    return _sizes_summary(base, published, before, directory.size_on_disk(published.path(root)))


def _sizes_summary(base: mf.Manifest, new: mf.Manifest, before: int, after: int) -> dict[str, Any]:
    return {
        "version": new.version,
        "rows": new.live_rows,
        "dropped": base.rows - new.rows,
        "bytes_before": before,
        "bytes_after": after,
        "bytes_freed": before - after,
    }


def recalibrate(
    index_dir: str | os.PathLike[str],
    calibration: str = "auto",
    calibrator: str | os.PathLike[str] | None = None,
    fit_sample: int = 200_000,
) -> dict[str, Any]:
    """Refit the calibrator on the stored raw vectors (no re-encoding) and rewrite the searched
    vectors, the FAISS index and the density statistics; deleted rows are dropped on the way.

    Args:
        index_dir: the index directory.
        calibration: ``auto``, a calibrator name or ``none`` (as in ``build_index``).
        calibrator: a calibrator fitted elsewhere to load instead of fitting.
        fit_sample: fit on a uniform sample of at most this many live rows.

    Returns:
        ``{"version", "rows", "calibration", "space", "decision", "seconds"}``.

    Raises:
        FlowsearchError: an unknown calibration, a calibrator of another dimension, no index.
    """
    if calibrator is None and calibration != "auto":
        from flowsearch.calibration import make_calibrator

        make_calibrator(calibration)  # an unknown name fails before any work
    if fit_sample < 2:
        raise FlowsearchError(f"fit_sample must be >= 2, got {fit_sample}")
    st = Stages()
    root = Path(index_dir).expanduser()
    with directory.write_version(root) as build, st.live():
        base = build.base
        assert base is not None
        directory.verify(root, base)
        loaded = load_fitted(calibrator, calibration, base.encoder.dim) if calibrator else None
        _, deleted = store.live_ids(root, base)
        with st.timed("fit"):
            U = _sample(root, base, deleted, "raw", fit_sample)
            cal, spec = fit_for_index(
                U,
                calibration,
                loaded=loaded,
                loaded_from=calibrator,
                pooling=base.encoder.pooling,
            )
        space = SearchSpace(cal, spec)
        with st.timed("rewrite"):
            manifest = _rewrite(build, "recalibrate", space, spec, st)
        published = build.publish(replace(manifest))
    return {
        "version": published.version,
        "rows": published.live_rows,
        "calibration": spec.name,
        "space": spec.space,
        "decision": spec.decision,
        "seconds": {k: round(v, 3) for k, v in st.seconds.items()},
    }
