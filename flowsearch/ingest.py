r"""Corpus in, calibrated index out: :func:`build_index` and :func:`add_to_index`.

The data flow is one direction: stream the corpus's record batches, encode them (raw float32
vectors cached in a scratch file), fit the calibrator on (a uniform sample of) the corpus's own
vectors (:mod:`flowsearch.calibration.fitting`), project into the searched space
(:class:`~flowsearch.space.SearchSpace`), write Parquet shards and fill the FAISS index chunk by
chunk (memory does not grow with the corpus), then publish the version
(:mod:`flowsearch.directory`): a crash or Ctrl-C at any moment leaves the previous version as it
was and nothing that looks valid.

Drift: :func:`add_to_index` scores the new rows under the index's flow and reports how far they
sit from the corpus (:func:`flowsearch.density.drift_report`).

Example:
    >>> build_index("data/sample.parquet", "my_index")  # doctest: +SKIP
    >>> add_to_index("more.parquet", "my_index")["drift"]["gap_std"]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch import directory, store
from flowsearch import index as fx
from flowsearch import manifest as mf
from flowsearch.calibration.fitting import fit_for_index, load_fitted
from flowsearch.corpus import CorpusPlan, scan_corpus
from flowsearch.density import (
    DRIFT_WARN_STD,
    best_other_score,
    density_stats,
    drift_report,
    held_out_stats,
    reliable,
    split_fit_rows,
)
from flowsearch.errors import FlowsearchError
from flowsearch.progress import Stages
from flowsearch.space import SearchSpace

__all__ = ["add_to_index", "build_index", "live_ids", "upsert"]

LOG = logging.getLogger(__name__)

_CHUNK_ROWS = 2048  # texts per encoder call: enough to batch by length, small enough for progress
#: Where ``build_index`` runs: this process, or a Ray cluster (:mod:`flowsearch.ray_ingest`).
ENGINES = ("local", "ray")
FAISS_FILE = "index.faiss"
LEXICAL_DIR = "lexical"


def _source(model: str | os.PathLike[str] | None, enc: Any) -> str | None:
    """How to load the model again: None (bundled), else the encoder's own ``model_id`` (the
    absolute path of a local directory, as resolved when it was loaded, or the hub id)."""
    return None if model is None else str(enc.model_id)


def _encode_pass(enc: Any, plan: CorpusPlan, raw_path: Path, batch_size: int, st: Stages) -> None:
    """Encode every row to float32, appended to ``raw_path`` (rows in corpus order)."""
    with st.task("encoding", total=plan.rows) as advance, open(raw_path, "wb") as out:
        for _ids, texts, _ in plan.batches(_CHUNK_ROWS):
            U = enc.encode(texts, batch_size=batch_size, progress=False)
            out.write(np.ascontiguousarray(U, dtype=np.float32).tobytes())
            advance(len(texts))


def build_index(
    corpus: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    text_column: str = "text",
    id_column: str | None = "id",
    model: str | os.PathLike[str] | None = None,
    pooling: str = "mean",
    max_length: int | None = None,
    calibration: str = "auto",
    calibrator: str | os.PathLike[str] | None = None,
    index_factory: str = "auto",
    batch_size: int = 64,
    overwrite: bool = False,
    fit_sample: int = 200_000,
    strict: bool = False,
    lexical: bool = True,
    backend: str = "torch",
    quantize: str | None = None,
    engine: str = "local",
    address: str | None = None,
) -> dict[str, Any]:
    r"""Index a corpus into ``index_dir`` (see the module docstring for the data flow).

    Args:
        corpus: a corpus file, a directory of them, or a glob.
        index_dir: the index directory to publish into.
        text_column: column with the passages.
        id_column: column with unique ids (row numbers when the default ``"id"`` is absent).
        model: encoder model id or directory; None is the bundled all-MiniLM-L6-v2.
        pooling: encoder pooling (``mean``, ``cls``, ``last2avg``, ``first_last_avg``,
            ``static``, ...).
        max_length: tokens per passage; None takes the model's limit.
        calibration: ``auto`` (default), a calibrator name (``flow``, ``whitening``, ...), ``none``.
        calibrator: directory of a calibrator fitted before, used instead of fitting one.
        index_factory: ``auto`` or any ``faiss.index_factory`` string (inner product).
        batch_size: texts per encoder forward pass.
        overwrite: replace an existing index at ``index_dir``.
        fit_sample: fit the calibrator on a uniform sample of at most this many rows.
        strict: refuse null or blank texts instead of skipping them.
        lexical: also build a BM25 index (``lexical/``), for ``mode="lexical"`` and ``"hybrid"``.
        backend: the encoder's runtime, ``torch`` or ``onnx`` (extra ``onnx``).
        quantize: ``int8`` (ONNX dynamic quantisation), or None.
        engine: ``local`` (this process) or ``ray`` (extra ``ray``: encoding and projection on
            a Ray cluster, see :mod:`flowsearch.ray_ingest`); both write the same index.
        address: the Ray cluster to join (``engine="ray"``); None starts a local one.

    Returns:
        A summary: rows, skipped, dim, calibration, factory, seconds per stage, bytes on disk.

    Raises:
        FlowsearchError: bad input (nothing is written).
    """
    target = Path(index_dir).expanduser()
    directory.check_target(target, overwrite)
    if batch_size < 1:
        raise FlowsearchError(f"batch_size must be >= 1, got {batch_size}")
    if fit_sample < 2:
        raise FlowsearchError(f"fit_sample must be >= 2, got {fit_sample}")
    if engine not in ENGINES:
        raise FlowsearchError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if calibrator is None and calibration != "auto":
        from flowsearch.calibration import make_calibrator

        make_calibrator(calibration)  # an unknown name fails here, before any encoding
    st = Stages()
    with st.timed("scan"):
        plan = scan_corpus(corpus, text_column, id_column, strict=strict)
    if engine == "ray" and not plan.files:
        raise FlowsearchError(
            "engine='ray' reads corpus files; write the records to Parquet first, or use "
            "engine='local'"
        )
    with st.timed("load model"):
        from flowsearch.encoder import Encoder

        options: dict[str, Any] = {}
        if backend != "torch" or quantize is not None:  # only encoders that have them
            options = {"backend": backend, "quantize": quantize}
        enc = Encoder(model, pooling=pooling, max_length=max_length, **options)
        loaded = load_fitted(calibrator, calibration, enc.dim) if calibrator is not None else None
        fx.check_factory(index_factory, (loaded.dim_out if loaded else None) or enc.dim)
    builder: Any = _build
    if engine == "ray":  # imported only here: `ray` is an optional extra
        from flowsearch import ray_ingest

        builder = ray_ingest.builder(address, model, options)
    with directory.write_version(target, new=True, overwrite=overwrite) as build, st.live():
        manifest = builder(
            build,
            plan,
            enc,
            st,
            source=_source(model, enc),
            calibration=calibration,
            loaded=loaded,
            loaded_from=calibrator,
            index_factory=index_factory,
            batch_size=batch_size,
            fit_sample=fit_sample,
            lexical=lexical,
        )
    summary = _summary(target, manifest, st, skipped=plan.skipped)
    LOG.info("indexed %d rows into %s in %.1f s", plan.rows, target, summary["seconds"]["total"])
    return summary


def _fit_rows(n: int, fit_sample: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows the calibrator fits, rows held out to judge queries and new rows against), in row
    order: see :func:`flowsearch.density.split_fit_rows`."""
    return split_fit_rows(n, fit_sample)


def _fit_space(
    U_fit: np.ndarray,
    enc: Any,
    rows: int,
    st: Stages,
    calibration: str,
    loaded: Any,
    loaded_from: str | os.PathLike[str] | None,
    index_factory: str,
) -> tuple[SearchSpace, Any, str, np.ndarray]:
    """Fit the calibrator on the raw fit rows, make the searched space and the empty FAISS index,
    trained on a projected sample (both engines): ``(space, faiss index, resolved factory, the
    projected sample tuning draws its queries from)``; the calibrator is ``space.calibrator``."""
    cal, spec = fit_for_index(
        U_fit,
        calibration,
        loaded=loaded,
        loaded_from=loaded_from,
        status=lambda what: st.status(what, follow="flowsearch.calibration"),
        pooling=enc.pooling,
    )
    space = SearchSpace(cal, spec, enc)
    factory = fx.auto_factory(rows) if index_factory == "auto" else index_factory
    faiss_index = fx.new_index(space.dim, factory)
    sample = fx.training_sample(faiss_index, U_fit, space.project)
    fx.train(faiss_index, sample, factory)
    return space, faiss_index, factory, sample


def _held_out(
    faiss_index: Any,
    space: SearchSpace,
    held_raw: np.ndarray,
    held: np.ndarray,
    lp: np.ndarray | None,
) -> mf.HeldOut:
    """Where the held-out rows (numbers ``held``, raw vectors ``held_raw``) sit: log-densities
    (``lp``: all rows' or None) and each one's best score to another row of the finished index."""
    if not len(held):  # a small corpus: none held out, so queries are not judged
        return mf.HeldOut(rows=0)
    Z = space.project(np.asarray(held_raw), want_density=False)[0]
    scores, rows = fx.search(faiss_index, Z, 2)
    top = best_other_score(scores, rows, held)
    return held_out_stats(None if lp is None else lp[held], top, len(held))


def _build(
    build: directory.VersionBuild,
    plan: CorpusPlan,
    enc: Any,
    st: Stages,
    *,
    source: str | None,
    calibration: str,
    loaded: Any,
    loaded_from: str | os.PathLike[str] | None,
    index_factory: str,
    batch_size: int,
    fit_sample: int,
    lexical: bool,
) -> mf.Manifest:
    """Encode, calibrate, write and publish (under the writer lock); returns the manifest."""
    tmp = build.path
    work = tmp / "_work"
    work.mkdir()
    with st.timed("encode"):
        _encode_pass(enc, plan, work / "raw.f32", batch_size, st)
    raw = np.memmap(work / "raw.f32", dtype=np.float32, mode="r").reshape(plan.rows, enc.dim)
    with st.timed("fit"):
        fit_idx, held_idx = _fit_rows(plan.rows, fit_sample)
        U_fit = np.asarray(raw[fit_idx])
        space, faiss_index, factory, sample = _fit_space(
            U_fit, enc, plan.rows, st, calibration, loaded, loaded_from, index_factory
        )
        del U_fit
    with st.timed("write shards"):
        lps: list[np.ndarray] = []
        writer = store.ShardWriter(tmp)
        row = 0
        with st.task("writing shards", total=plan.rows) as advance:
            for ids, texts, meta in plan.batches(_CHUNK_ROWS):
                U = np.asarray(raw[row : row + len(texts)])
                Z, lp = space.project(U)
                if lp is not None:
                    lps.append(lp)
                writer.write(store.shard_table(ids, texts, meta, Z, U))
                fx.add(faiss_index, Z, factory)
                row += len(texts)
                advance(len(texts))
        shards = writer.close()
        space.calibrator.save(tmp / "calibrator")
    held_raw = np.asarray(raw[held_idx])
    del raw
    shutil.rmtree(work)
    return _finish(
        build,
        plan,
        enc,
        st,
        source=source,
        space=space,
        faiss_index=faiss_index,
        factory=factory,
        index_factory=index_factory,
        sample=sample,
        shards=shards,
        lps=lps,
        held=(held_idx, held_raw),
        lexical=lexical,
    )


def _finish(
    build: directory.VersionBuild,
    plan: CorpusPlan,
    enc: Any,
    st: Stages,
    *,
    source: str | None,
    space: SearchSpace,
    faiss_index: Any,
    factory: str,
    index_factory: str,
    sample: np.ndarray,
    shards: list[mf.Shard],
    lps: list[np.ndarray],
    held: tuple[np.ndarray, np.ndarray],
    lexical: bool,
) -> mf.Manifest:
    """Tune and save the filled FAISS index, place the held-out rows, build BM25, write the
    manifest and publish (shared by both engines: the shards and calibrator are already in
    ``build.path``; ``lps`` are the rows' log-densities in row order, ``held`` the held-out
    rows' numbers and raw vectors)."""
    tmp = build.path
    all_lp = np.concatenate(lps) if lps else None
    held_out = _held_out(faiss_index, space, held[1], held[0], all_lp)
    with st.timed("build index"), st.status("tuning the FAISS index"):
        params = ""
        if index_factory == "auto" and factory != "Flat":
            reader = store.RowReader(tmp, shards)
            try:
                params, _ = fx.tune_search(
                    faiss_index, sample, lambda: reader.column_chunks("vector")
                )
            finally:
                reader.close()
        fx.write_index(faiss_index, tmp / FAISS_FILE)
    lexical_spec = None
    if lexical:
        with st.timed("lexical"), st.status("building the BM25 index"):
            lexical_spec = _build_lexical(tmp, shards)
    manifest = mf.Manifest(
        encoder=mf.EncoderSpec.from_description(enc.describe(), source),
        dim=space.dim,
        calibration=space.spec,
        faiss=mf.FaissSpec(factory=factory, requested=index_factory, params=params),
        columns=mf.Columns(
            text=plan.text_column,
            id=plan.id_column,
            id_type=plan.id_type,
            metadata=tuple(plan.metadata_columns),
        ),
        rows=int(plan.rows),
        shards=tuple(shards),
        lexical=lexical_spec,
        density=density_stats(all_lp) if all_lp is not None else None,
        held_out=held_out,
        skipped=int(plan.skipped),
        next_auto_id=int(plan.rows_in),
        created=mf.utc_now(),
        flowsearch_version=_version(),
    )
    return build.publish(manifest)


def _build_lexical(root: Path, shards: list[mf.Shard] | tuple[mf.Shard, ...]) -> mf.LexicalSpec:
    """Build the BM25 index of the texts in ``shards`` (all rows, in order) under
    ``root/lexical``."""
    from flowsearch.lexical import LexicalIndex

    reader = store.RowReader(root, shards)
    try:
        texts = (text for chunk in reader.column_chunks("text") for text in chunk)
        lex = LexicalIndex.build(texts)
    finally:
        reader.close()
    lex.save(root / LEXICAL_DIR)
    return _lexical_spec(lex)


def _lexical_spec(lex: Any) -> mf.LexicalSpec:
    return mf.LexicalSpec(
        path=LEXICAL_DIR, rows=lex.n_rows, params={"k1": lex.k1, "b": lex.b, "method": lex.method}
    )


def _version() -> str:
    from flowsearch import __version__

    return __version__


def _summary(target: Path, manifest: mf.Manifest, st: Stages, **extra: Any) -> dict[str, Any]:
    total = sum(st.seconds.values())
    return {
        "index": str(target),
        "version": manifest.version,
        "rows": manifest.live_rows,
        "dim": manifest.dim,
        "calibration": manifest.calibration.name,
        "space": manifest.calibration.space,
        "factory": manifest.faiss.factory,
        "seconds": {**{k: round(v, 3) for k, v in st.seconds.items()}, "total": round(total, 3)},
        "bytes": directory.size_on_disk(manifest.path(target)),
        **extra,
    }


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
        A summary, with ``"drift"`` (see :func:`~flowsearch.density.drift_report`; None
        without a flow).

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
    dropped by :func:`~flowsearch.rewrite.compact`). Published atomically like :func:`add_to_index`,
    with the same drift report.

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
    if drift and drift["warn"]:
        LOG.warning(
            "new rows look out of distribution: mean log-density %.1f vs corpus %.1f "
            "(%.1f corpus std below, threshold %.1f); refit the calibrator (recalibrate)",
            drift["mean_log_prob"],
            drift["corpus_mean_log_prob"],
            drift["gap_std"],
            DRIFT_WARN_STD,
        )
    extra: dict[str, Any] = {"added": plan.rows}
    if kind == "upsert":
        extra = {"upserted": plan.rows, "inserted": plan.rows - replaced, "replaced": replaced}
    return _summary(target, manifest, st, skipped=plan.skipped, drift=drift, **extra)


def live_ids(index_dir: Path, manifest: mf.Manifest) -> tuple[list[Any], np.ndarray | None]:
    """``(ids of every row, in row order; bool mask of deleted rows or None)``."""
    reader = store.RowReader(manifest.path(index_dir), manifest.shards)
    try:
        ids = list(reader.column("id"))
    finally:
        reader.close()
    deleted = None
    if manifest.tombstones is not None:
        deleted = store.read_tombstones(manifest.path(index_dir, manifest.tombstones), len(ids))
    return ids, deleted


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
) -> tuple[mf.Manifest, CorpusPlan, dict[str, Any] | None, int]:
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
        ids, deleted = live_ids(index_dir, base)
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
    build.link("calibrator")
    for shard in base.shards:
        build.link(shard.path)
    faiss_index = fx.read_index(base.path(index_dir, FAISS_FILE), base.faiss.params)
    writer = store.ShardWriter(build.path, first_part=len(base.shards))
    lps: list[np.ndarray] = []
    new_texts: list[str] = []
    with st.timed("encode+write"), st.task(f"{kind}ing", total=plan.rows) as advance:
        for batch_ids, texts, meta in plan.batches(_CHUNK_ROWS):
            U = space.encoder.encode(texts, batch_size=batch_size, progress=False)
            Z, lp = space.project(U)
            if lp is not None:
                lps.append(lp)
            writer.write(store.shard_table(batch_ids, texts, meta, Z, U))
            fx.add(faiss_index, Z, base.faiss.factory)
            if base.lexical is not None:
                new_texts.extend(texts)
            advance(len(texts))
    with st.timed("write index"):
        fx.write_index(faiss_index, build.path / FAISS_FILE)
    new_shards = writer.close()
    lexical = base.lexical
    if base.lexical is not None:
        with st.timed("lexical"):
            lexical = _grow_lexical(build, base, new_texts, replaced_rows)
    tombstones, n_deleted = base.tombstones, base.deleted
    if len(replaced_rows):
        tombstones, n_deleted = _tombstone(build, deleted, replaced_rows)
    elif base.tombstones is not None:
        build.link(base.tombstones)
    drift = None
    # judged against rows the flow did not see when the index has them
    reference = base.held_out.density if base.held_out and base.held_out.density else base.density
    if lps and reference is not None:
        ok = reliable(base.calibration.fit_rows, base.dim)
        drift = drift_report(np.concatenate(lps), reference, ok)
    detail = {"replaced": int(len(replaced_rows))} if kind == "upsert" else {}
    record = mf.WriteRecord(
        kind=kind, time=mf.utc_now(), rows=plan.rows, drift=drift, detail=detail
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


def _grow_lexical(
    build: directory.VersionBuild, base: mf.Manifest, texts: list[str], dead: np.ndarray
) -> mf.LexicalSpec:
    """The BM25 index of ``base`` with ``texts`` appended and rows ``dead`` deleted."""
    from flowsearch.lexical import LexicalIndex

    assert base.lexical is not None
    lex = LexicalIndex.load(base.path(build.index_dir, base.lexical.path))
    lex.add(texts)
    if len(dead):
        lex.delete(dead)
    lex.save(build.path / LEXICAL_DIR)
    return _lexical_spec(lex)


def _tombstone(
    build: directory.VersionBuild, deleted: np.ndarray | None, rows: np.ndarray
) -> tuple[str, int]:
    """Write the version's tombstones: ``deleted`` (bool mask or None) plus ``rows``; returns
    ``(its relative path, how many rows are deleted)``."""
    old = np.flatnonzero(deleted) if deleted is not None else np.zeros(0, dtype=np.int64)
    dead = np.union1d(old, rows)
    store.write_tombstones(build.path / store.TOMBSTONES_FILE, dead)
    return store.TOMBSTONES_FILE, int(len(dead))
