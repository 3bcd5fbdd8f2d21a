r"""Corpus in, calibrated index out: :func:`build_index` and :func:`add_to_index`.

The data flow is one direction: stream the corpus's record batches, encode them (raw float32
vectors cached in a scratch file), fit the calibrator on (a uniform sample of) the corpus's own
vectors, transform and L2-normalise, write Parquet shards, build the FAISS index, write the
manifest last. Everything is built in a hidden sibling directory and published by rename, so a
crash or Ctrl-C at any moment leaves the previous index as it was and nothing that looks valid.

``calibration="auto"`` always fits the flow (as ``whitening-flow``; its density serves drift and
out-of-distribution signals) but searches in the flow's Gaussian space only when the corpus's
vectors are anisotropic (:func:`flowsearch.calibration.anisotropy.should_calibrate`); otherwise
in the encoder's own space.

Drift: :func:`add_to_index` scores the new rows under the index's flow and warns when they are
far out of the corpus's distribution (see :mod:`flowsearch.space`).

Example:
    >>> build_index("data/sample.parquet", "my_index")  # doctest: +SKIP
    >>> add_to_index("more.parquet", "my_index")["drift"]["gap_std"]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch import index as fx
from flowsearch import store
from flowsearch.corpus import CorpusPlan, scan_corpus
from flowsearch.errors import FlowsearchError
from flowsearch.progress import Stages
from flowsearch.publish import (
    file_records,
    link_tree,
    publish,
    scratch_dir,
    size_on_disk,
    writer_lock,
)
from flowsearch.space import (
    DRIFT_WARN_STD,
    MIN_ROWS_PER_DIM,
    density_stats,
    drift_report,
    fit_calibrator,
    load_fitted_calibrator,
    project,
)

__all__ = ["DRIFT_WARN_STD", "add_to_index", "build_index", "drift_report"]

LOG = logging.getLogger(__name__)

_CHUNK_ROWS = 2048  # texts per encoder call: enough to batch by length, small enough for progress


def _check_target(index_dir: Path, overwrite: bool) -> None:
    if index_dir.is_file():
        raise FlowsearchError(f"{index_dir} is a file, not an index directory; choose another path")
    if not index_dir.is_dir() or not any(index_dir.iterdir()):
        return
    if not store.is_index_dir(index_dir):
        raise FlowsearchError(
            f"{index_dir} exists and is not a flowsearch index; refusing to replace it, "
            "choose another --index"
        )
    if not overwrite:
        raise FlowsearchError(
            f"an index already exists at {index_dir}; pass --overwrite to replace it"
        )


def _source(model: str | os.PathLike[str] | None, enc: Any) -> str | None:
    """How to load the model again: None (bundled), else the encoder's own ``model_id`` (the
    absolute path of a local directory, as resolved when it was loaded, or the hub id)."""
    return None if model is None else str(enc.model_id)


def _encode_pass(enc: Any, plan: CorpusPlan, raw_path: Path, batch_size: int, st: Stages) -> None:
    """Encode every row to float32, appended to ``raw_path`` (rows in corpus order)."""
    with st.task("encoding", total=plan.rows) as advance, open(raw_path, "wb") as out:
        for ids, texts, _ in plan.batches(_CHUNK_ROWS):
            del ids
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
) -> dict[str, Any]:
    r"""Index a Parquet corpus into ``index_dir`` (see the module docstring for the data flow).

    Args:
        corpus: a Parquet file, a directory of them, or a glob.
        index_dir: where to publish the index.
        text_column: column with the passages.
        id_column: column with unique ids (row numbers when the default ``"id"`` is absent).
        model: encoder model id or directory; None is the bundled all-MiniLM-L6-v2.
        pooling: encoder pooling (``mean``, ``cls``, ``last2avg``, ``first_last_avg``, ``static``).
        max_length: tokens per passage; None takes the model's limit.
        calibration: ``auto`` (default), a calibrator name (``flow``, ``whitening``, ...), ``none``.
        calibrator: directory of a calibrator fitted before, used instead of fitting one.
        index_factory: ``auto`` or any ``faiss.index_factory`` string (inner product).
        batch_size: texts per encoder forward pass.
        overwrite: replace an existing index at ``index_dir``.
        fit_sample: fit the calibrator on a uniform sample of at most this many rows.
        strict: refuse null or blank texts instead of skipping them.

    Returns:
        A summary: rows, skipped, dim, calibration, factory, seconds per stage, bytes on disk.

    Raises:
        FlowsearchError: bad input (nothing is written).
    """
    target = Path(index_dir).expanduser()
    _check_target(target, overwrite)
    if batch_size < 1 or fit_sample < 2:
        raise FlowsearchError("--batch-size must be >= 1 and --fit-sample >= 2")
    if calibrator is None and calibration != "auto":
        from flowsearch.calibration import make_calibrator

        make_calibrator(calibration)  # an unknown name fails here, before any encoding
    st = Stages()
    with st.timed("scan"):
        plan = scan_corpus(corpus, text_column, id_column, strict=strict)
    with writer_lock(target):
        _check_target(target, overwrite)  # again: another writer may have published meanwhile
        with st.timed("load model"):
            from flowsearch.encoder import Encoder

            enc = Encoder(model, pooling=pooling, max_length=max_length)
            loaded = load_fitted_calibrator(calibrator, calibration, enc.dim)
            fx.check_factory(index_factory, (loaded.dim_out if loaded else None) or enc.dim)
        manifest = _build(
            target,
            plan,
            enc,
            st,
            source=_source(model, enc),
            calibration=calibration,
            calibrator=calibrator,
            loaded=loaded,
            index_factory=index_factory,
            batch_size=batch_size,
            fit_sample=fit_sample,
        )
    summary = _summary(target, manifest, st, skipped=plan.skipped)
    LOG.info("indexed %d rows into %s in %.1f s", plan.rows, target, summary["seconds"]["total"])
    return summary


def _build(
    target: Path, plan: CorpusPlan, enc: Any, st: Stages, *, source: str | None, **opts: Any
) -> dict[str, Any]:
    """Encode, calibrate, write and publish (under the writer lock); returns the manifest."""
    with scratch_dir(target) as tmp, st.live():
        work = tmp / "_work"
        work.mkdir()
        with st.timed("encode"):
            _encode_pass(enc, plan, work / "raw.f32", opts["batch_size"], st)
        raw = np.memmap(work / "raw.f32", dtype=np.float32, mode="r").reshape(plan.rows, enc.dim)
        with st.timed("fit"):
            if plan.rows <= opts["fit_sample"]:
                U_fit = np.asarray(raw)
            else:
                rng = np.random.default_rng(0)
                U_fit = raw[np.sort(rng.choice(plan.rows, opts["fit_sample"], replace=False))]
            cal, record = fit_calibrator(
                U_fit, opts["calibration"], opts["calibrator"], opts["loaded"], st
            )
        with st.timed("write shards"):
            vectors = np.empty((plan.rows, record["dim_out"]), dtype=np.float32)
            lps: list[np.ndarray] = []
            writer = store.ShardWriter(tmp)
            row = 0
            with st.task("writing shards", total=plan.rows) as advance:
                for ids, texts, meta in plan.batches(_CHUNK_ROWS):
                    U = np.asarray(raw[row : row + len(texts)])
                    Z, lp = project(cal, record["space"], U)
                    vectors[row : row + len(texts)] = Z
                    if lp is not None:
                        lps.append(lp)
                    writer.write(store.shard_table(ids, texts, meta, Z, U))
                    row += len(texts)
                    advance(len(texts))
            shards = writer.close()
            cal.save(tmp / "calibrator")
        with st.timed("build index"), st.status("building FAISS index"):
            index, factory, params = fx.build_index(vectors, opts["index_factory"])
            fx.write_index(index, tmp / "index.faiss")
        del raw
        shutil.rmtree(work)
        manifest = {
            "format": store.FORMAT,
            "format_version": store.FORMAT_VERSION,
            "flowsearch_version": _version(),
            "created": store.utc_now(),
            "updated": None,
            "encoder": {**enc.describe(), "source": source},
            "dim": int(record["dim_out"]),
            "calibration": record,
            "density": density_stats(np.concatenate(lps)) if lps else None,
            "index": {"factory": factory, "requested": opts["index_factory"], "params": params},
            "columns": {
                "text": plan.text_column,
                "id": plan.id_column,
                "id_type": plan.id_type,
                "metadata": plan.metadata_columns,
            },
            "rows": int(plan.rows),
            "skipped": int(plan.skipped),
            "next_auto_id": int(plan.rows_in),
            "shards": shards,
            "additions": [],
        }
        manifest["files"] = file_records(tmp)
        store.write_manifest(tmp, manifest)
        publish(tmp, target)
    return manifest


def _version() -> str:
    from flowsearch import __version__

    return __version__


def _summary(target: Path, manifest: dict[str, Any], st: Stages, **extra: Any) -> dict[str, Any]:
    total = sum(st.seconds.values())
    return {
        "index": str(target),
        "rows": manifest["rows"],
        "dim": manifest["dim"],
        "calibration": manifest["calibration"]["name"],
        "space": manifest["calibration"]["space"],
        "factory": manifest["index"]["factory"],
        "seconds": {**{k: round(v, 3) for k, v in st.seconds.items()}, "total": round(total, 3)},
        "bytes": size_on_disk(target),
        **extra,
    }


def add_to_index(
    corpus: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    text_column: str | None = None,
    id_column: str | None = None,
    batch_size: int = 64,
    strict: bool = False,
) -> dict[str, Any]:
    r"""Append a corpus to an existing index under its frozen encoder and calibrator.

    New rows go to new shards, the FAISS index grows (trained indexes keep their training), the
    manifest is rewritten; all published atomically like :func:`build_index`. Columns default to
    the ones the index was built with.

    Returns:
        A summary, with ``"drift"`` (see :func:`drift_report`; None without a flow).

    Raises:
        FlowsearchError: bad input, ids already in the index, or an index that fails to verify.
    """
    target = Path(index_dir).expanduser()
    if not target.parent.is_dir():
        store.read_manifest(target)  # "no index at ...", without creating anything
    st = Stages()
    with writer_lock(target):
        manifest, plan, drift = _add(
            corpus, target, st, text_column, id_column, batch_size=batch_size, strict=strict
        )
    if drift and drift["warn"]:
        LOG.warning(
            "new rows look out of distribution: mean log-density %.1f vs corpus %.1f "
            "(%.1f corpus std below, threshold %.1f); refit: `flowsearch index ... --overwrite`",
            drift["mean_log_prob"],
            drift["corpus_mean_log_prob"],
            drift["gap_std"],
            DRIFT_WARN_STD,
        )
    return _summary(target, manifest, st, added=plan.rows, skipped=plan.skipped, drift=drift)


def _add(
    corpus: str | os.PathLike[str],
    target: Path,
    st: Stages,
    text_column: str | None,
    id_column: str | None,
    *,
    batch_size: int,
    strict: bool,
) -> tuple[dict[str, Any], CorpusPlan, dict[str, Any] | None]:
    """The body of :func:`add_to_index`, run under the writer lock: (manifest, plan, drift)."""
    import pyarrow as pa

    from flowsearch.calibration import load_calibrator
    from flowsearch.searcher import open_encoder

    manifest = store.read_manifest(target)
    store.verify_files(target, manifest)
    cols = manifest["columns"]
    text_column = text_column or cols["text"]
    id_column = id_column or cols["id"]
    with st.timed("scan"):
        reader = store.RowReader(target, manifest["shards"])
        existing = reader.column("id") if id_column is not None else None
        reader.close()
        plan = scan_corpus(
            corpus,
            text_column,
            id_column,
            strict=strict,
            existing_ids=pa.array(existing) if existing is not None else None,
            auto_id_start=int(manifest.get("next_auto_id", manifest["rows"])),
        )
        if plan.id_column is None and cols["id"] is not None:
            raise FlowsearchError(
                f"the index has ids from column {cols['id']!r}, the corpus has no such column; "
                "pass --id-column"
            )
    with st.timed("load model"):
        enc = open_encoder(manifest["encoder"])
        cal = load_calibrator(target / "calibrator")
    space = manifest["calibration"]["space"]
    with scratch_dir(target) as tmp, st.live():
        link_tree(target, tmp, exclude={store.MANIFEST_NAME, "index.faiss"})
        index = fx.read_index(target / "index.faiss", manifest["index"]["params"])
        first_part = 1 + max(int(Path(s["path"]).stem.split("-")[1]) for s in manifest["shards"])
        writer = store.ShardWriter(tmp, first_part=first_part)
        lps: list[np.ndarray] = []
        with st.timed("encode+write"), st.task("adding", total=plan.rows) as advance:
            for ids, texts, meta in plan.batches(_CHUNK_ROWS):
                U = enc.encode(texts, batch_size=batch_size, progress=False)
                Z, lp = project(cal, space, U)
                if lp is not None:
                    lps.append(lp)
                writer.write(store.shard_table(ids, texts, meta, Z, U))
                fx.add(index, Z)
                advance(len(texts))
        with st.timed("write index"):
            fx.write_index(index, tmp / "index.faiss")
        new_shards = writer.close()
        drift = None
        if lps and manifest.get("density"):
            fit_rows = int(manifest["calibration"].get("fit_rows", manifest["rows"]))
            reliable = fit_rows >= MIN_ROWS_PER_DIM * int(manifest["dim"])
            drift = drift_report(np.concatenate(lps), manifest["density"], reliable)
        manifest = dict(manifest)
        manifest["shards"] = manifest["shards"] + new_shards
        manifest["rows"] = int(manifest["rows"]) + plan.rows
        manifest["skipped"] = int(manifest.get("skipped", 0)) + plan.skipped
        manifest["next_auto_id"] = plan.auto_id_start + plan.rows_in
        manifest["updated"] = store.utc_now()
        manifest["additions"] = [
            *manifest.get("additions", []),
            {"time": manifest["updated"], "rows": plan.rows, "drift": drift},
        ]
        old = {k: v for k, v in manifest["files"].items() if k != "index.faiss"}
        manifest["files"] = file_records(tmp, known=old)
        store.write_manifest(tmp, manifest)
        publish(tmp, target)
    return manifest, plan, drift
