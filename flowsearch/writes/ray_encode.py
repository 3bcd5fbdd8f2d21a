r"""The Ray engine's first stage: read every corpus file and encode its rows on Ray Data.

One read task per corpus file streams its rows through the project's own readers (the same
parsing, ids, skipped texts and metadata types as the local path), tagging each row with a sort
key (file number, row in file); a pool of :class:`EncoderActor` (one per GPU, else CPU actors,
each building its encoder once, restarted and its batch retried if its process dies) cuts each
document into passages with its encoder's tokenizer (the local build's own cutting,
:func:`~flowsearch.ingest.passages.split_texts` and
:func:`~flowsearch.ingest.passages.passage_rows`: a passage row keeps its document's sort key and
carries its passage number) and adds their raw vectors; the rows land as Parquet in a scratch
directory, read back in row order (:func:`encode_on_ray`, :func:`read_rows`,
:func:`documents_in`). See :mod:`flowsearch.writes.ray_engine`.

Example:
    >>> files = encode_on_ray(ray, plan, enc, scratch / "raw", model=None, options={},
    ...                       batch_size=64, actors=None, fault_marker=None)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.encode.protocol import TextEncoder
from flowsearch.errors import FlowsearchError
from flowsearch.ingest.corpus import CorpusPlan
from flowsearch.ingest.passages import PassageSizes, passage_rows, split_texts
from flowsearch.storage.passages import PASSAGE, PASSAGES, passage_columns
from flowsearch.storage.rows import vector_column
from flowsearch.writes.engine import CHUNK_ROWS, EncoderRuntime

__all__ = [
    "ROW",
    "EncoderActor",
    "cut_rows",
    "documents_in",
    "encode_on_ray",
    "key_range",
    "matrix",
    "read_rows",
]

LOG = logging.getLogger(__name__)

# The sort key's column: a name no corpus column can take (metadata may not start with
# "__flowsearch").
ROW = "__flowsearch_row"
_FILE_SHIFT = 32  # sort key = file number << 32 | row within file


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
    """Ray actor: builds the encoder once; cuts each batch's documents into passage rows (with
    ``passages``) and adds a ``raw`` float32 vector column.

    Args:
        model: model id or directory (None: bundled).
        pooling: the encoder's pooling.
        max_length: tokens per passage.
        options: extra Encoder options (``backend``, ``quantize``).
        batch_size: texts per forward pass.
        threads: torch threads (the CPUs the actor was given).
        passages: how to cut (:class:`~flowsearch.ingest.passages.PassageSizes` as a dict);
            None: every text is one row, read up to the window.
        fault_marker: testing only: the first call that finds this file missing creates it and
            ends the actor's process, so tests can watch Ray restart the actor and retry.
    """

    def __init__(
        self,
        model: str | None,
        pooling: str,
        max_length: int | None,
        options: EncoderRuntime,
        batch_size: int,
        threads: int,
        passages: dict[str, int] | None = None,
        fault_marker: str | None = None,
    ) -> None:
        import torch

        from flowsearch.encode.encoder import Encoder

        torch.set_num_threads(max(1, threads))
        self.encoder = Encoder(model, pooling=pooling, max_length=max_length, **options)
        self.batch_size = batch_size
        self.sizes = None if passages is None else PassageSizes(**passages)
        self.fault_marker = fault_marker

    def __call__(self, table: pa.Table) -> pa.Table:
        if self.fault_marker and not os.path.exists(self.fault_marker):
            Path(self.fault_marker).touch()
            os._exit(1)  # a crash mid-run, not an exception: Ray must restart the process
        if self.sizes is not None:
            table = cut_rows(self.encoder, table, self.sizes)
        texts = table.column("text").to_pylist()
        U = self.encoder.encode(texts, batch_size=self.batch_size, progress=False)
        return table.append_column("raw", vector_column(U))


def cut_rows(encoder: TextEncoder, table: pa.Table, sizes: PassageSizes) -> pa.Table:
    """A batch of documents (``ROW``, ``id``, ``text``, metadata) as passage rows, cut as the
    local build cuts, with the passage columns (every row gets them, whole documents too: the
    driver drops them when no document of the corpus was cut)."""
    texts = table.column("text").to_pylist()
    spans = split_texts(encoder, texts, sizes)
    rest = table.drop_columns(["id", "text"])
    rows = passage_rows(table.column("id").combine_chunks(), texts, rest, spans)
    assert rows.metadata is not None
    out = {"id": rows.ids, "text": pa.array(rows.texts, pa.string())}
    out.update({name: rows.metadata.column(name) for name in rows.metadata.column_names})
    out.update(passage_columns(spans))
    return pa.table(out)


def _actors(ray: Any, requested: int | None) -> tuple[int, dict[str, int]]:
    """How many encoder actors, and each one's resources: a GPU each when there are GPUs,
    else one CPU each, leaving one CPU for the read and write tasks."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if gpus:
        return requested or gpus, {"num_gpus": 1, "num_cpus": 1}
    cpus = int(resources.get("CPU", 1))
    return requested or max(1, cpus - 1), {"num_cpus": 1}


# --- between the stages: order the raw files, read the fit sample ---------------------------


def key_range(table: pa.Table) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """A batch's first and last row order keys, ``(document's sort key, passage number)``, or
    None when its keys are not strictly increasing (or it is empty)."""
    keys = table.column(ROW).to_numpy()
    if not len(keys):
        return None
    has = PASSAGE in table.column_names
    number = table.column(PASSAGE).to_numpy() if has else np.zeros(len(keys), np.int64)
    step, next_number = np.diff(keys), np.diff(number)
    if np.any((step < 0) | ((step == 0) & (next_number <= 0))):
        return None
    return (int(keys[0]), int(number[0])), (int(keys[-1]), int(number[-1]))


def _ordered_files(folder: Path) -> list[tuple[Path, int]] | None:
    """The raw Parquet files in row order with their row counts, or None when their key ranges
    interleave (then the dataset is sorted instead)."""
    spans = []
    for path in sorted(folder.glob("*.parquet")):
        names = [ROW, *([PASSAGE] if PASSAGE in pq.read_schema(path).names else [])]
        table = pq.read_table(path, columns=names)
        if not table.num_rows:
            continue
        found = key_range(table)
        if found is None:
            return None
        spans.append((found[0], found[1], path, table.num_rows))
    spans.sort(key=lambda s: s[0])
    if any(a[1] >= b[0] for a, b in zip(spans, spans[1:])):
        return None
    return [(path, n) for _, _, path, n in spans]


def documents_in(files: list[tuple[Path, int]]) -> tuple[int, np.ndarray | None]:
    """``(documents, each row's document)`` of the raw files (in row order): the second is
    int64 (n_rows,), documents numbered in corpus order, or None when no document was cut into
    several passages (every row is a document, as the local build's
    :meth:`~flowsearch.ingest.passages.Cuts.documents`). Reads two small columns, file by
    file."""
    n_rows = sum(n for _, n in files)
    if not files or PASSAGE not in pq.read_schema(files[0][0]).names:
        return n_rows, None
    first, cut = [], False
    for path, _ in files:
        table = pq.read_table(path, columns=[PASSAGE, PASSAGES])
        first.append(table.column(PASSAGE).to_numpy() == 0)
        cut = cut or bool(np.any(table.column(PASSAGES).to_numpy() > 1))
    starts = np.concatenate(first)
    n_documents = int(starts.sum())
    if not cut:
        return n_documents, None
    return n_documents, np.cumsum(starts, dtype=np.int64) - 1


def read_rows(files: list[tuple[Path, int]], wanted: np.ndarray) -> np.ndarray:
    """float32 (m, dim): the raw vectors of rows ``wanted`` (sorted global row numbers)."""
    parts, start = [], 0
    for path, n in files:
        lo, hi = np.searchsorted(wanted, [start, start + n])
        if hi > lo:
            raw = pq.read_table(path, columns=["raw"]).column("raw")
            take = pa.array(wanted[lo:hi] - start)
            parts.append(matrix(raw.take(take)))
        start += n
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


def matrix(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A ``fixed_size_list<float>`` column as float32 (n, d)."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    dim = col.type.list_size
    flat = [c.flatten().to_numpy(zero_copy_only=False) for c in chunks]
    if not flat:
        return np.zeros((0, dim), dtype=np.float32)
    return np.concatenate(flat).astype(np.float32).reshape(-1, dim)


def encode_on_ray(
    ray: Any,
    plan: CorpusPlan,
    enc: TextEncoder,
    raw_dir: Path,
    *,
    model: str | os.PathLike[str] | None,
    options: EncoderRuntime,
    batch_size: int,
    actors: int | None,
    fault_marker: str | None,
    passages: PassageSizes | None = None,
) -> list[tuple[Path, int]]:
    """Stage 1: read every document on Ray, cut it into passages (``passages``: how; None:
    not cut) and encode them into Parquet files in ``raw_dir``; returns them in row order with
    their row counts (passage rows: :func:`documents_in` counts their documents)."""
    n_actors, resources = _actors(ray, actors)
    plans = plan.by_file()
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
            "passages": None if passages is None else passages.to_dict(),
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
        keys = [ROW, PASSAGE] if passages is not None else ROW
        ray.data.read_parquet(str(raw_dir)).sort(keys).write_parquet(str(sorted_dir))
        shutil.rmtree(raw_dir)
        files = _ordered_files(sorted_dir)
        if files is None:
            raise FlowsearchError("Ray returned the encoded rows out of order; please report")
    return files
