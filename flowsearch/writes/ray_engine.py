r"""Distributed ingest on Ray Data: ``build_index(..., engine="ray")`` (extra ``ray``).

The same index as the local path (:func:`flowsearch.writes.build.build_index`), with the two
expensive per-row steps spread over a Ray cluster:

1. **Encode** (Ray Data). The corpus is checked on the driver first (:func:`scan_corpus`, so bad
   input fails exactly as it does locally, before Ray starts any work). One read task per corpus
   file streams its rows through the project's own readers (same parsing, ids, skipped texts and
   metadata types as the local path; Ray's JSON/CSV readers infer types differently and cannot
   number rows), tagging each row with a sort key (file number, row in file). A pool of encoder
   actors (``ActorPoolStrategy``: one per GPU when the cluster has GPUs, CPU actors otherwise;
   each builds its :class:`~flowsearch.encode.encoder.Encoder` once, and is restarted and its batch
   retried if its process dies) adds the raw vectors; the rows are written as Parquet to a scratch
   directory the version writer staged.
2. **Fit** (driver). The calibrator is fitted on the same seeded uniform sample of rows the
   local path takes (:func:`~flowsearch.space.fitting.fit_for_index`); only the sample's
   vectors are read, file by file.
3. **Project** (Ray Data). Tasks map the raw vectors into the searched space
   (:class:`~flowsearch.space.search_space.SearchSpace`, the calibrator shipped to them as bytes)
   and assemble rows (:func:`~flowsearch.storage.rows.rows_table`).
4. **Write** (driver). Projected batches arrive in row order and go to the build's one segment
   (:class:`~flowsearch.writes.segments.SegmentBuilder`: Parquet parts, and, for all but
   IVF-family indexes, its vector index batch by batch); the postings, keys, manifest and the
   atomic publish are the local path's own code (:mod:`flowsearch.writes.engine`).
5. **IVF lists** (Ray tasks, IVF-family factories without a re-rank). One task per Parquet part
   adds the part's vectors, with their rows as ids, to a copy of the trained empty index and
   writes it (:func:`flowsearch.ann.ondisk.fill_part`); the driver merges the copies' lists on
   disk into ``ann.ivfdata`` beside the segment's ``ann.faiss``
   (:func:`flowsearch.ann.ondisk.merge_on_disk`), which readers find in the segment's own
   directory (``IO_FLAG_ONDISK_SAME_DIR``: the index directory stays relocatable); the manifest
   checksums it like every file.

No step holds the corpus's vectors on the driver: it sees one batch at a time, the fit sample,
and, for factories that are not IVF, the FAISS index itself (for ``Flat`` that is the vectors;
for ``auto``'s ``IVF...,PQ...,RFlat`` its re-rank vectors: see ``docs/SCALE.md``). Rows keep
the local path's order (``preserve_order`` plus the sort key, checked on every batch), so ids,
rows and FAISS ids match a local build of the same corpus.

Example:
    >>> build_index("corpus/", "idx", engine="ray", address="auto")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.ann import ondisk
from flowsearch.errors import FlowsearchError
from flowsearch.progress import Stages
from flowsearch.space.reference import reference_rows, split_fit_rows
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import manifest as mf
from flowsearch.storage.corpus import CorpusPlan
from flowsearch.storage.layout import ANN_DATA_FILE
from flowsearch.storage.rows import rows_table, vector_column
from flowsearch.storage.writer import Writer
from flowsearch.writes.engine import CHUNK_ROWS, finish_build, fit_space
from flowsearch.writes.segments import SegmentBuilder

__all__ = ["LOCAL_CPUS", "EncoderActor", "build_on_ray", "builder", "ray_session"]

LOG = logging.getLogger(__name__)

#: CPUs of the local Ray started when no address is given (join a bigger one with ``address``).
LOCAL_CPUS = 2
# Internal columns: names no corpus column can take (metadata may not start with "__flowsearch").
ROW = "__flowsearch_row"
LOG_PROB = "__flowsearch_lp"
_FILE_SHIFT = 32  # sort key = file number << 32 | row within file


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FlowsearchError(
            "engine='ray' needs Ray Data; install the extra: pip install 'flowsearch[ray]'"
        ) from None
    return ray


@contextlib.contextmanager
def ray_session(address: str | None = None) -> Iterator[Any]:
    """Connect to Ray for the block; yields the ``ray`` module.

    Reuses a Ray already initialised in this process; else joins ``address`` or starts a local
    Ray with :data:`LOCAL_CPUS` CPUs. Shuts down only what it started. Workers of a local Ray
    import this same ``flowsearch`` (its directory goes first on their ``PYTHONPATH``).
    """
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    package_root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None:
        kwargs.update(num_cpus=LOCAL_CPUS, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise FlowsearchError(
            f"cannot connect to Ray at {address!r} ({exc}); check the address"
        ) from None
    try:
        yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _data_context(ray: Any) -> Iterator[None]:
    """Row order preserved and progress bars off, restored afterwards."""
    ctx = ray.data.DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars)
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    try:
        yield
    finally:
        ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved


def builder(
    address: str | None,
    model: str | os.PathLike[str] | None,
    options: dict[str, Any],
    **extra: Any,
) -> Callable[..., mf.Manifest]:
    """The Ray engine's stand-in for the local build (same arguments).

    Args:
        address: the Ray cluster (None: a local one).
        model: the model as the user named it (actors load it again: a path must exist on
            every node).
        options: the encoder's extra options (``backend``, ``quantize``).
        extra: more keyword arguments of :func:`build_on_ray` (``actors``, ``fault_marker``).
    """

    def build(writer: Writer, plan: CorpusPlan, enc: Any, st: Stages, **kwargs: Any) -> mf.Manifest:
        with ray_session(address) as ray, _data_context(ray):
            return build_on_ray(
                ray, writer, plan, enc, st, model=model, encoder_options=options, **kwargs, **extra
            )

    return build


# --- stage 1: read and encode -------------------------------------------------------------


def _file_plans(plan: CorpusPlan) -> list[CorpusPlan]:
    """One plan per corpus file; row-number ids continue across files as in the local path."""
    plans = []
    start = plan.auto_id_start
    for source in plan.sources:
        plans.append(replace(plan, sources=[copy.copy(source)], auto_id_start=start))
        if plan.id_column is None:  # only row-number ids need each file's row count
            start += _rows_in(source, plan.text_column)
    return plans


def _rows_in(source: Any, text_column: str) -> int:
    if source.format == "parquet":
        return int(pq.ParquetFile(source.path).metadata.num_rows)
    return sum(batch.num_rows for batch in source.batches(65_536, [text_column]))


def _read_files(items: dict[str, np.ndarray], plans: list[CorpusPlan]) -> Iterator[pa.Table]:
    """Ray task: the rows to index of the files numbered ``items["file"]``, with their sort key."""
    for number in items["file"]:
        seq = int(number) << _FILE_SHIFT
        for ids, texts, meta in plans[int(number)].batches(CHUNK_ROWS):
            n = len(texts)
            columns = {ROW: pa.array(np.arange(seq, seq + n, dtype=np.int64)), "id": ids}
            columns["text"] = pa.array(texts, pa.string())
            columns.update({name: meta.column(name) for name in meta.column_names})
            seq += n
            yield pa.table(columns)


class EncoderActor:
    """Ray actor: builds the encoder once, adds a ``raw`` float32 vector column to each batch.

    Args:
        model: model id or directory (None: bundled).
        pooling: the encoder's pooling.
        max_length: tokens per passage.
        options: extra Encoder options (``backend``, ``quantize``).
        batch_size: texts per forward pass.
        threads: torch threads (the CPUs the actor was given).
        fault_marker: testing only: the first call that finds this file missing creates it and
            ends the actor's process, so tests can watch Ray restart the actor and retry.
    """

    def __init__(
        self,
        model: str | None,
        pooling: str,
        max_length: int | None,
        options: dict[str, Any],
        batch_size: int,
        threads: int,
        fault_marker: str | None = None,
    ) -> None:
        import torch

        from flowsearch.encode.encoder import Encoder

        torch.set_num_threads(max(1, threads))
        self.encoder = Encoder(model, pooling=pooling, max_length=max_length, **options)
        self.batch_size = batch_size
        self.fault_marker = fault_marker

    def __call__(self, table: pa.Table) -> pa.Table:
        if self.fault_marker and not os.path.exists(self.fault_marker):
            Path(self.fault_marker).touch()
            os._exit(1)  # a crash mid-run, not an exception: Ray must restart the process
        texts = table.column("text").to_pylist()
        U = self.encoder.encode(texts, batch_size=self.batch_size, progress=False)
        return table.append_column("raw", vector_column(U))


def _actors(ray: Any, requested: int | None) -> tuple[int, dict[str, Any]]:
    """How many encoder actors, and each one's resources: a GPU each when there are GPUs,
    else one CPU each, leaving one CPU for the read and write tasks."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if gpus:
        return requested or gpus, {"num_gpus": 1, "num_cpus": 1}
    cpus = int(resources.get("CPU", 1))
    return requested or max(1, cpus - 1), {"num_cpus": 1}


# --- between the stages: order the raw files, read the fit sample ---------------------------


def _ordered_files(folder: Path) -> list[tuple[Path, int]] | None:
    """The raw Parquet files in row order with their row counts, or None when their key ranges
    interleave (then the dataset is sorted instead)."""
    spans = []
    for path in sorted(folder.glob("*.parquet")):
        keys = pq.read_table(path, columns=[ROW]).column(ROW).to_numpy()
        if not len(keys):
            continue
        if np.any(np.diff(keys) <= 0):
            return None
        spans.append((int(keys[0]), int(keys[-1]), path, len(keys)))
    spans.sort(key=lambda s: s[0])
    if any(a[1] >= b[0] for a, b in zip(spans, spans[1:])):
        return None
    return [(path, n) for _, _, path, n in spans]


def _read_rows(files: list[tuple[Path, int]], wanted: np.ndarray) -> np.ndarray:
    """float32 (m, dim): the raw vectors of rows ``wanted`` (sorted global row numbers)."""
    parts, start = [], 0
    for path, n in files:
        lo, hi = np.searchsorted(wanted, [start, start + n])
        if hi > lo:
            raw = pq.read_table(path, columns=["raw"]).column("raw")
            take = pa.array(wanted[lo:hi] - start)
            parts.append(_matrix(raw.take(take)))
        start += n
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


def _matrix(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A ``fixed_size_list<float>`` column as float32 (n, d)."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    dim = col.type.list_size
    flat = [c.flatten().to_numpy(zero_copy_only=False) for c in chunks]
    if not flat:
        return np.zeros((0, dim), dtype=np.float32)
    return np.concatenate(flat).astype(np.float32).reshape(-1, dim)


# --- stage 2: project ------------------------------------------------------------------------

_SPACES: dict[str, SearchSpace] = {}  # per worker process: the calibrator, loaded once


def _worker_space(files: dict[str, bytes], spec: mf.CalibrationSpec) -> SearchSpace:
    from flowsearch.calibration import load_calibrator

    key = hashlib.sha256(b"".join(files[k] for k in sorted(files))).hexdigest()
    if key not in _SPACES:
        with tempfile.TemporaryDirectory() as folder:
            for name, data in files.items():
                (Path(folder) / name).write_bytes(data)
            _SPACES[key] = SearchSpace(load_calibrator(folder), spec)
    return _SPACES[key]


def _project(
    table: pa.Table,
    calibrator: dict[str, bytes],
    spec: mf.CalibrationSpec,
    id_type: pa.DataType,
    metadata_schema: pa.Schema,
) -> pa.Table:
    """Ray task: raw rows -> segment rows (:func:`rows_table`) plus key and log-density."""
    space = _worker_space(calibrator, spec)
    U = _matrix(table.column("raw"))
    Z, lp = space.project(U)
    meta = table.select(metadata_schema.names).cast(metadata_schema)
    ids = table.column("id").combine_chunks().cast(id_type)
    texts = table.column("text").combine_chunks().cast(pa.string())
    out = rows_table(ids, texts, meta, Z, U)
    out = out.append_column(ROW, table.column(ROW))
    values = pa.array(lp, pa.float64()) if lp is not None else pa.nulls(len(U), pa.float64())
    return out.append_column(LOG_PROB, values)


def _calibrator_bytes(cal: Any) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as folder:
        cal.save(folder)
        return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


# --- stage 3 for IVF indexes: per-shard inverted lists, merged on disk -----------------------


def _fill_shard(trained: Any, part_path: str, first_row: int, out: str) -> int:
    """Ray task: a copy of the trained index filled with one Parquet part's vectors (their
    local rows as ids), written to ``out``."""
    vectors = _matrix(pq.read_table(part_path, columns=["vector"]).column("vector"))
    return ondisk.fill_part(trained, vectors, first_row, Path(out))


def _fill_on_ray(
    ray: Any, index: Any, folder: Path, parts: tuple[mf.PartRecord, ...], scratch: Path
) -> Any:
    """``index`` (trained, empty, IVF-family) filled with every part's rows: one Ray task per
    part fills a copy, the driver merges their lists into ``folder/ann.ivfdata``
    (:func:`flowsearch.ann.ondisk.merge_on_disk`). The driver never holds the lists in RAM."""
    import faiss

    work = scratch / "ivf"
    work.mkdir(parents=True)
    trained = ray.put(faiss.serialize_index(index))
    task = ray.remote(num_cpus=1)(_fill_shard)
    refs, outs, start = [], [], 0
    for number, part in enumerate(parts):
        out = work / f"part-{number:05d}.faiss"
        refs.append(task.remote(trained, str(folder / part.path), start, str(out)))
        outs.append(out)
        start += part.n_rows
    added = sum(ray.get(refs))
    if added != start:
        raise FlowsearchError(f"Ray filled the IVF lists with {added} rows of {start}; rerun")
    return ondisk.merge_on_disk(index, outs, folder / ANN_DATA_FILE)


# --- the whole build -------------------------------------------------------------------------


def _encode_on_ray(
    ray: Any,
    plan: CorpusPlan,
    enc: Any,
    raw_dir: Path,
    *,
    model: Any,
    options: dict[str, Any],
    batch_size: int,
    actors: int | None,
    fault_marker: str | None,
) -> list[tuple[Path, int]]:
    """Stage 1: read and encode every row on Ray into Parquet files in ``raw_dir``; returns
    them in row order with their row counts."""
    n_actors, resources = _actors(ray, actors)
    plans = _file_plans(plan)
    items = ray.data.from_items([{"file": i} for i in range(len(plans))])
    rows = items.map_batches(_read_files, batch_size=1, fn_kwargs={"plans": plans}, num_cpus=0.5)
    encoded = rows.map_batches(
        EncoderActor,
        batch_size=CHUNK_ROWS,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=n_actors),
        fn_constructor_kwargs={
            "model": None if model is None else str(model),
            "pooling": enc.pooling,
            "max_length": enc.max_length,
            "options": options,
            "batch_size": batch_size,
            "threads": int(resources["num_cpus"]),
            "fault_marker": fault_marker,
        },
        # Ray Data restarts a dead actor and retries its batch by default (max_restarts=-1,
        # max_task_retries=-1 for actor pools), which is what a crashed encoder needs.
        **resources,
    )
    encoded.write_parquet(str(raw_dir))
    files = _ordered_files(raw_dir)
    if files is None:  # key ranges interleave: sort once, then read in file order
        LOG.info("raw vectors out of order; sorting them")
        sorted_dir = raw_dir.with_name("sorted")
        ray.data.read_parquet(str(raw_dir)).sort(ROW).write_parquet(str(sorted_dir))
        shutil.rmtree(raw_dir)
        files = _ordered_files(sorted_dir)
        if files is None:
            raise FlowsearchError("Ray returned the encoded rows out of order; please report")
    found = sum(n for _, n in files)
    if found != plan.rows:
        raise FlowsearchError(f"Ray encoded {found} rows, the corpus has {plan.rows}; rerun")
    return files


def _project_on_ray(
    ray: Any,
    files: list[tuple[Path, int]],
    space: SearchSpace,
    plan: CorpusPlan,
    builder: SegmentBuilder,
    on_disk: bool,
) -> list[np.ndarray]:
    """Stage 2: project on Ray; the driver writes the rows in order to the segment (and adds
    the vectors to its index unless IVF lists are filled on Ray). Returns the log-densities."""
    id_type = pa.int64() if plan.id_type == "int" else pa.string()
    projected = ray.data.read_parquet([str(p) for p, _ in files]).map_batches(
        _project,
        batch_size=CHUNK_ROWS,
        batch_format="pyarrow",
        fn_kwargs={
            "calibrator": _calibrator_bytes(space.calibrator),
            "spec": space.spec,
            "id_type": id_type,
            "metadata_schema": plan.metadata_schema,
        },
        num_cpus=1,
    )
    lps: list[np.ndarray] = []
    last, written = -1, 0
    for table in projected.iter_batches(batch_format="pyarrow", batch_size=None):
        keys = table.column(ROW).to_numpy()
        if len(keys) and (keys[0] <= last or np.any(np.diff(keys) <= 0)):
            raise FlowsearchError("Ray returned the projected rows out of order; please report")
        last = int(keys[-1]) if len(keys) else last
        lp = table.column(LOG_PROB)
        if len(lp) and lp.null_count == 0:  # a density model gave every row its value
            lps.append(lp.to_numpy())
        rows = table.drop_columns([ROW, LOG_PROB])
        if on_disk:
            builder.write_rows(rows)
        else:
            builder.add(rows, _matrix(rows.column("vector")))
        written += rows.num_rows
    if written != plan.rows:
        raise FlowsearchError(f"Ray projected {written} rows, the corpus has {plan.rows}")
    return lps


def build_on_ray(
    ray: Any,
    writer: Writer,
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
    model: str | os.PathLike[str] | None,
    encoder_options: dict[str, Any],
    actors: int | None = None,
    fault_marker: str | None = None,
) -> mf.Manifest:
    """Encode, calibrate, write and publish on a connected Ray (see the module docstring)."""
    scratch = writer.stage()
    with st.timed("encode"), st.status("encoding on Ray"):
        files = _encode_on_ray(
            ray,
            plan,
            enc,
            scratch / "raw",
            model=model,
            options=encoder_options,
            batch_size=batch_size,
            actors=actors,
            fault_marker=fault_marker,
        )
    with st.timed("fit"):
        fit_idx, held_idx = split_fit_rows(plan.rows, fit_sample)  # as the local path
        space, index, factory = fit_space(
            _read_rows(files, fit_idx),
            enc,
            plan.rows,
            st,
            calibration,
            loaded,
            loaded_from,
            index_factory,
        )
    builder = SegmentBuilder(
        writer,
        dim=space.dim,
        n_rows=plan.rows,
        requested=index_factory,
        lexical=lexical,
        strict_factory=True,
        index=index,
        factory=factory,
    )
    on_disk = ondisk.mergeable(index)  # IVF: filled per part on Ray, merged on disk
    with st.timed("write segment"), st.status("projecting on Ray, writing the segment"):
        lps = _project_on_ray(ray, files, space, plan, builder, on_disk)
    if on_disk:
        with st.timed("fill IVF"), st.status("filling IVF lists on Ray, merging them on disk"):
            parts = builder.close_parts()
            builder.use_index(
                _fill_on_ray(ray, index, builder.stage, parts, scratch), data=ANN_DATA_FILE
            )
    measured, method = reference_rows(plan.rows, held_idx)
    measured_raw = _read_rows(files, measured)
    shutil.rmtree(scratch)
    return finish_build(
        writer,
        builder,
        space,
        enc,
        plan,
        lps,
        (measured, measured_raw, method),
        source=source,
        index_factory=index_factory,
        lexical=lexical,
    )
