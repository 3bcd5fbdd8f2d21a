r"""Corpus in, calibrated index out: :func:`build_index` (growing it:
:mod:`flowsearch.writes.upsert`).

The data flow is one direction: stream the corpus's record batches, encode them (raw float32
vectors cached in a scratch file), fit the calibrator on (a uniform sample of) the corpus's own
vectors (:mod:`flowsearch.space.fitting`), project into the searched space
(:class:`~flowsearch.space.search_space.SearchSpace`), write Parquet shards and fill the FAISS index
chunk by chunk (memory does not grow with the corpus), then publish the version
(:mod:`flowsearch.storage.directory`): a crash or Ctrl-C at any moment leaves the previous version
as it was and nothing that looks valid.

The corpus's density statistics and its reference (each of some rows' best score to another row:
held-out rows, or leave-one-out on a small corpus) are recorded for the query verdict and the drift
report of later writes (:mod:`flowsearch.space.reference`).

Example:
    >>> build_index("data/sample.parquet", "my_index")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.ann import faiss_index as fx
from flowsearch.errors import FlowsearchError
from flowsearch.progress import Stages
from flowsearch.space.fitting import fit_for_index, load_fitted
from flowsearch.space.reference import (
    Method,
    Reference,
    best_other_score,
    density_stats,
    reference_rows,
    reliable,
    split_fit_rows,
)
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import directory as directory
from flowsearch.storage import manifest as mf
from flowsearch.storage import rows as store
from flowsearch.storage.corpus import CorpusPlan, scan_corpus

__all__ = ["CHUNK_ROWS", "build_index", "finish_version", "fit_space", "summary"]

LOG = logging.getLogger(__name__)

CHUNK_ROWS = 2048  # texts per encoder call: enough to batch by length, small enough for progress
#: Where ``build_index`` runs: this process, or a Ray cluster (:mod:`flowsearch.writes.ray_engine`).
ENGINES = ("local", "ray")


def _source(model: str | os.PathLike[str] | None, enc: Any) -> str | None:
    """How to load the model again: None (bundled), else the encoder's own ``model_id`` (the
    absolute path of a local directory, as resolved when it was loaded, or the hub id)."""
    return None if model is None else str(enc.model_id)


def _encode_pass(enc: Any, plan: CorpusPlan, raw_path: Path, batch_size: int, st: Stages) -> None:
    """Encode every row to float32, appended to ``raw_path`` (rows in corpus order)."""
    with st.task("encoding", total=plan.rows) as advance, open(raw_path, "wb") as out:
        for _ids, texts, _ in plan.batches(CHUNK_ROWS):
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
            a Ray cluster, see :mod:`flowsearch.writes.ray_engine`); both write the same index.
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
        from flowsearch.encode.encoder import Encoder

        options: dict[str, Any] = {}
        if backend != "torch" or quantize is not None:  # only encoders that have them
            options = {"backend": backend, "quantize": quantize}
        enc = Encoder(model, pooling=pooling, max_length=max_length, **options)
        loaded = load_fitted(calibrator, calibration, enc.dim) if calibrator is not None else None
        fx.check_factory(index_factory, (loaded.dim_out if loaded else None) or enc.dim)
    builder: Any = _build
    if engine == "ray":  # imported only here: `ray` is an optional extra
        from flowsearch.writes import ray_engine as ray_ingest

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
    out = summary(target, manifest, st, skipped=plan.skipped)
    LOG.info("indexed %d rows into %s in %.1f s", plan.rows, target, out["seconds"]["total"])
    return out


def _fit_rows(n: int, fit_sample: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows the calibrator fits, rows held out to judge queries and new rows against), in row
    order: see :func:`flowsearch.space.reference.split_fit_rows`."""
    return split_fit_rows(n, fit_sample)


def fit_space(
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
    factory = fx.auto_factory(rows, dim=space.dim) if index_factory == "auto" else index_factory
    faiss_index = fx.new_index(space.dim, factory)
    sample = fx.training_sample(faiss_index, U_fit, space.project)
    fx.train(faiss_index, sample, factory)
    return space, faiss_index, factory, sample


def _reference(
    faiss_index: Any,
    space: SearchSpace,
    measured: tuple[np.ndarray, np.ndarray, Method],
    lp: np.ndarray | None,
    n_rows: int,
) -> Reference:
    """The reference: each measured row's (``measured``: numbers, raw vectors, how chosen) best
    score to another row of the finished index, with their log-densities (``lp``: all rows' or
    None) when the calibrator is reliable."""
    rows, raw, method = measured
    spec = space.spec
    mean_cosine = spec.anisotropy.get("mean_cosine") if spec.space == "encoder" else None
    if not len(rows):
        return Reference(method=method, rows=0, corpus_rows=n_rows, space=spec.space)
    Z = space.project(np.asarray(raw), want_density=False)[0]
    scores, found = fx.search(faiss_index, Z, 2)
    top = best_other_score(scores, found, rows)
    keep_lp = lp is not None and reliable(spec.fit_rows, space.dim)
    return Reference.from_scores(
        top,
        method=method,
        corpus_rows=n_rows,
        space=spec.space,
        mean_cosine=mean_cosine,
        log_densities=lp[rows] if keep_lp and lp is not None else None,
    )


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
        space, faiss_index, factory, sample = fit_space(
            U_fit, enc, plan.rows, st, calibration, loaded, loaded_from, index_factory
        )
        del U_fit
    with st.timed("write shards"):
        lps: list[np.ndarray] = []
        writer = store.ShardWriter(tmp)
        row = 0
        with st.task("writing shards", total=plan.rows) as advance:
            for ids, texts, meta in plan.batches(CHUNK_ROWS):
                U = np.asarray(raw[row : row + len(texts)])
                Z, lp = space.project(U)
                if lp is not None:
                    lps.append(lp)
                writer.write(store.shard_table(ids, texts, meta, Z, U))
                fx.add(faiss_index, Z, factory)
                row += len(texts)
                advance(len(texts))
        shards = writer.close()
        space.calibrator.save(tmp / mf.CALIBRATOR_DIR)
    measured, method = reference_rows(plan.rows, held_idx)
    measured_raw = np.asarray(raw[measured])
    del raw
    shutil.rmtree(work)
    return finish_version(
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
        measured=(measured, measured_raw, method),
        lexical=lexical,
    )


def finish_version(
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
    measured: tuple[np.ndarray, np.ndarray, Method],
    lexical: bool,
) -> mf.Manifest:
    """Tune and save the filled FAISS index, place the held-out rows, build BM25, write the
    manifest and publish (shared by both engines: the shards and calibrator are already in
    ``build.path``; ``lps`` are the rows' log-densities in row order, ``measured`` the numbers,
    raw vectors and method of the rows the reference measures:
    :func:`~flowsearch.space.reference.reference_rows`)."""
    tmp = build.path
    all_lp = np.concatenate(lps) if lps else None
    reference = _reference(faiss_index, space, measured, all_lp, int(plan.rows))
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
        fx.write_index(faiss_index, tmp / mf.FAISS_FILE)
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
        reference=reference.model_dump(mode="json"),
        skipped=int(plan.skipped),
        next_auto_id=int(plan.rows_in),
        created=mf.utc_now(),
        flowsearch_version=_version(),
    )
    return build.publish(manifest)


def _build_lexical(root: Path, shards: list[mf.Shard] | tuple[mf.Shard, ...]) -> mf.LexicalSpec:
    """Build the BM25 index of the texts in ``shards`` (all rows, in order) under
    ``root/lexical``."""
    from flowsearch.lexical.bm25 import LexicalIndex

    reader = store.RowReader(root, shards)
    try:
        texts = (text for chunk in reader.column_chunks("text") for text in chunk)
        lex = LexicalIndex.build(texts)
    finally:
        reader.close()
    return lex.save_version(root)


def _version() -> str:
    from flowsearch import __version__

    return __version__


def summary(target: Path, manifest: mf.Manifest, st: Stages, **extra: Any) -> dict[str, Any]:
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
