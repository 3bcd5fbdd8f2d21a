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
   retried if its process dies) cuts documents longer than the window into passage rows, as the
   local build does (:func:`~flowsearch.writes.ray_encode.cut_rows`: the same cutting code), and
   adds their raw vectors; the rows are written as Parquet to a scratch directory the version
   writer staged.
2. **Fit** (driver). The calibrator is fitted on the same seeded uniform sample of passage rows
   the local path takes (:func:`~flowsearch.space.fitting.fit_for_index`); only the sample's
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
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.ann import ondisk
from flowsearch.calibration.base import Calibrator
from flowsearch.encode.protocol import TextEncoder
from flowsearch.errors import BadInput, FlowsearchError, MissingExtra
from flowsearch.ingest.corpus import CorpusPlan
from flowsearch.progress import Stages
from flowsearch.space.reference import reference_rows, split_fit_rows
from flowsearch.space.search_space import SearchSpace, load_index_calibrator
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import ANN_DATA_FILE
from flowsearch.storage.passages import PASSAGE_COLUMNS
from flowsearch.storage.rows import rows_table
from flowsearch.storage.writer import Writer
from flowsearch.writes import ray_encode
from flowsearch.writes.engine import (
    CHUNK_ROWS,
    BuildOptions,
    EncoderRuntime,
    finish_build,
    fit_space,
)
from flowsearch.writes.ray_encode import ROW
from flowsearch.writes.segments import SegmentBuilder

__all__ = ["LOCAL_CPUS", "build_on_ray", "builder", "ray_session"]

LOG = logging.getLogger(__name__)

#: CPUs of the local Ray started when no address is given (join a bigger one with ``address``).
LOCAL_CPUS = 2
# The log-density column: a name no corpus column can take (as ray_encode.ROW).
LOG_PROB = "__flowsearch_lp"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingExtra(
            "engine='ray' needs Ray Data, which is not installed",
            "install the extra: pip install 'flowsearch[ray]'",
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
        raise BadInput(
            f"cannot connect to Ray at {address!r} ({exc})",
            "check the {address} (a running cluster's address), or leave it out",
            param="address",
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
    options: EncoderRuntime,
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

    def build(
        writer: Writer, plan: CorpusPlan, enc: TextEncoder, st: Stages, build_options: BuildOptions
    ) -> mf.Manifest:
        with ray_session(address) as ray, _data_context(ray):
            return build_on_ray(ray, writer, plan, enc, st, build_options, model=model,
                                encoder_options=options, **extra)  # fmt: skip

    return build


# --- stage 2: project ------------------------------------------------------------------------

#: Calibrators a worker process keeps loaded (one per index build it serves; the oldest goes).
WORKER_SPACES = 4
_SPACES: OrderedDict[str, SearchSpace] = OrderedDict()
_SPACES_LOCK = threading.Lock()


def _worker_space(files: dict[str, bytes], spec: mf.CalibrationSpec) -> SearchSpace:
    """The calibrator these files hold, loaded once per worker process (a small LRU under a
    lock: a worker may run tasks on several threads and serve several builds in turn)."""
    digest = hashlib.sha256(spec.model_dump_json().encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    key = digest.hexdigest()
    with _SPACES_LOCK:
        if key in _SPACES:
            _SPACES.move_to_end(key)
            return _SPACES[key]
        with tempfile.TemporaryDirectory() as folder:
            for name, data in files.items():
                (Path(folder) / name).write_bytes(data)
            space = SearchSpace(load_index_calibrator(folder), spec)
        _SPACES[key] = space
        while len(_SPACES) > WORKER_SPACES:
            _SPACES.popitem(last=False)
        return space


def _project(
    table: pa.Table,
    calibrator: dict[str, bytes],
    spec: mf.CalibrationSpec,
    id_type: pa.DataType,
    metadata_schema: pa.Schema,
    passages: bool,
) -> pa.Table:
    """Ray task: raw rows -> segment rows (:func:`rows_table`; with the passage columns when
    ``passages``, that is when a document of the corpus was cut) plus key and log-density."""
    space = _worker_space(calibrator, spec)
    U = ray_encode.matrix(table.column("raw"))
    Z, lp = space.project(U)
    meta = table.select(metadata_schema.names).cast(metadata_schema)
    ids = table.column("id").combine_chunks().cast(id_type)
    texts = table.column("text").combine_chunks().cast(pa.string())
    columns = None
    if passages:
        columns = {name: table.column(name).combine_chunks() for name in PASSAGE_COLUMNS}
    out = rows_table(ids, texts, meta, Z, U, columns)
    out = out.append_column(ROW, table.column(ROW))
    values = pa.array(lp, pa.float64()) if lp is not None else pa.nulls(len(U), pa.float64())
    return out.append_column(LOG_PROB, values)


def _calibrator_bytes(cal: Calibrator) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as folder:
        cal.save(folder)
        return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


# --- stage 3 for IVF indexes: per-shard inverted lists, merged on disk -----------------------


def _fill_shard(trained: Any, part_path: str, first_row: int, out: str) -> int:
    """Ray task: a copy of the trained index filled with one Parquet part's vectors (their
    local rows as ids), written to ``out``."""
    vectors = ray_encode.matrix(pq.read_table(part_path, columns=["vector"]).column("vector"))
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


def _project_on_ray(
    ray: Any,
    files: list[tuple[Path, int]],
    space: SearchSpace,
    plan: CorpusPlan,
    builder: SegmentBuilder,
    on_disk: bool,
    passages: bool,
) -> list[np.ndarray]:
    """Stage 2: project on Ray; the driver writes the rows in order to the segment (and adds
    the vectors to its index unless IVF lists are filled on Ray). Returns the log-densities."""
    n_rows = sum(n for _, n in files)
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
            "passages": passages,
        },
        num_cpus=1,
    )
    lps: list[np.ndarray] = []
    last, written = (-1, 0), 0
    for table in projected.iter_batches(batch_format="pyarrow", batch_size=None):
        if table.num_rows:
            found = ray_encode.key_range(table)
            if found is None or found[0] <= last:
                raise FlowsearchError("Ray returned the projected rows out of order; please report")
            last = found[1]
        lp = table.column(LOG_PROB)
        if len(lp) and lp.null_count == 0:  # a density model gave every row its value
            lps.append(lp.to_numpy())
        rows = table.drop_columns([ROW, LOG_PROB])
        if on_disk:
            builder.write_rows(rows)
        else:
            builder.add(rows, ray_encode.matrix(rows.column("vector")))
        written += rows.num_rows
    if written != n_rows:
        raise FlowsearchError(f"Ray projected {written} rows, it encoded {n_rows}")
    return lps


def build_on_ray(
    ray: Any,
    writer: Writer,
    plan: CorpusPlan,
    enc: TextEncoder,
    st: Stages,
    options: BuildOptions,
    *,
    model: str | os.PathLike[str] | None,
    encoder_options: EncoderRuntime,
    actors: int | None = None,
    fault_marker: str | None = None,
) -> mf.Manifest:
    """Encode, calibrate, write and publish on a connected Ray (see the module docstring)."""
    scratch = writer.stage()
    with st.timed("encode"), st.status("encoding on Ray"):
        files = ray_encode.encode_on_ray(ray, plan, enc, scratch / "raw", model=model,
                                         options=encoder_options, batch_size=options.batch_size,
                                         actors=actors, fault_marker=fault_marker,
                                         passages=options.passages)  # fmt: skip
    # passage rows: the calibrator is fitted on passages, as the local path does
    n_rows = sum(n for _, n in files)
    n_documents, documents = ray_encode.documents_in(files)
    if n_documents != plan.n_rows:
        raise FlowsearchError(f"Ray encoded {n_documents} documents, the corpus has {plan.n_rows}; "
                              "rerun")  # fmt: skip
    with st.timed("fit"):
        fit_idx, held_idx = split_fit_rows(n_rows, options.fit_sample)  # as the local path
        U_fit = ray_encode.read_rows(files, fit_idx)
        space, index, factory = fit_space(U_fit, enc, n_rows, st, options)
    builder = SegmentBuilder(writer, dim=space.dim, n_rows=n_rows,
                             requested=options.index_factory, lexical=options.lexical,
                             strict_factory=True, index=index, factory=factory,
                             ann=options.ann)  # fmt: skip
    on_disk = ondisk.mergeable(index)  # IVF: filled per part on Ray, merged on disk
    with st.timed("write segment"), st.status("projecting on Ray, writing the segment"):
        lps = _project_on_ray(ray, files, space, plan, builder, on_disk, documents is not None)
    if on_disk:
        with st.timed("fill IVF"), st.status("filling IVF lists on Ray, merging them on disk"):
            filled = _fill_on_ray(ray, index, builder.stage, builder.close_parts(), scratch)
            builder.use_index(filled, data=ANN_DATA_FILE)
    measured, method = reference_rows(n_rows, held_idx)
    measured_raw = ray_encode.read_rows(files, measured)
    shutil.rmtree(scratch)
    return finish_build(writer, builder, space, enc, plan, lps,
                        (measured, measured_raw, method), options, documents)  # fmt: skip
