r"""The live documents of an index as one Parquet file: :func:`export_index`.

What a user takes to re-index elsewhere (or here: ``flowsearch index`` reads the file as it is):
one row per live document of one published version, ``id``, ``text`` (a document cut into
passages is joined back whole) and the metadata columns, in segment and row order. With
``vectors=True`` also ``raw``: per document, a list of its passages' ``{start, end, vector}``
(one for a document read whole), ``vector`` the encoder's own output (the ``raw`` column the
index keeps to refit a calibrator, stored as float16 and written as float32), not the searched
(calibrated) space, which only this index's calibrator gives meaning to. ``raw`` is a name the
index reserves: re-indexing the file with it is refused, so drop the column first.

The version is pinned when the export starts (every segment's files opened, so a writer's
cleanup cannot take them away) and the file is written aside and renamed into place: a reader
of ``dest`` sees the old file or the whole new one, and a writer running meanwhile changes
nothing in it. The file's schema metadata (key ``flowsearch``) names the version, model,
pooling and dimension.

Example:
    >>> export_index("idx", "docs.parquet")  # doctest: +SKIP
    Exported(path='/home/me/docs.parquet', version=3, n_documents=1200, vectors=False)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.atomic import atomic_write
from flowsearch.errors import BadInput, IndexDamaged, check_bool, check_path
from flowsearch.ingest.passages import joined
from flowsearch.search.version import open_current
from flowsearch.storage import deletions
from flowsearch.storage import manifest as mf
from flowsearch.storage.passages import PASSAGE, PASSAGE_COLUMNS, PASSAGE_END, PASSAGE_START
from flowsearch.storage.rows import RowReader, matrix
from flowsearch.storage.schema import type_of

__all__ = ["Exported", "export_index", "raw_type"]

RAW = "raw"
#: Schema metadata key of the export's description.
METADATA_KEY = b"flowsearch"


@dataclass(frozen=True)
class Exported:
    """What :func:`export_index` wrote.

    Attributes:
        path: the file (absolute).
        version: the index version exported.
        n_documents: rows written (live documents).
        vectors: whether the ``raw`` column was written.
        columns: the file's columns, in order.
    """

    path: str
    version: int
    n_documents: int
    vectors: bool
    columns: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """The JSON form (``export --json``)."""
        out = asdict(self)
        out["columns"] = list(self.columns)
        return out


def _checked_dest(dest: str | os.PathLike[str], root: Path, overwrite: bool) -> Path:
    path = check_path(dest, "dest", "a file name DEST.parquet")
    if path.suffix.lower() != ".parquet":
        raise BadInput(f"the export is Parquet, but {str(dest)!r} does not end in .parquet",
                       "name the file DEST.parquet", param="dest")  # fmt: skip
    if path.is_dir():
        raise BadInput(f"{path} is a directory", "name a file DEST.parquet", param="dest")
    if not path.parent.is_dir():
        raise BadInput(f"no directory {path.parent} to write {path.name} into",
                       "create it first, or name a file in an existing one",
                       param="dest")  # fmt: skip
    if path.resolve().is_relative_to(root.resolve()):
        raise BadInput(f"{path} is inside the index directory {root}",
                       "write the export outside the index", param="dest")  # fmt: skip
    if path.exists() and not overwrite:
        raise BadInput(f"{path} already exists", "pass {overwrite=True} to replace it",
                       param="overwrite")  # fmt: skip
    return path


def export_index(
    index_dir: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    vectors: bool = False,
    overwrite: bool = False,
) -> Exported:
    """Write the live documents of an index's current version to ``dest`` (Parquet).

    Args:
        index_dir: the index.
        dest: the file to write, ``*.parquet``, outside the index directory.
        vectors: also write ``raw`` (each passage's span and raw encoder vector; see above).
        overwrite: replace an existing ``dest``.

    Raises:
        NotFound: no index there.
        BadInput: ``dest`` not a ``.parquet`` file name, in a directory that does not exist,
            inside the index, or existing without ``overwrite``.
        IndexDamaged: a segment file missing or unreadable.
        WriteFailed: the disk refused the write.
    """
    root = check_path(index_dir, "index_dir", "an index directory")
    vectors, overwrite = check_bool(vectors, "vectors"), check_bool(overwrite, "overwrite")
    mf.read(root)  # NotFound before anything else is judged
    path = _checked_dest(dest, root, overwrite)
    manifest, readers = open_current(root, lambda m: (m, _open_readers(root, m)))
    try:
        schema = _schema(manifest, vectors)
        counted = [0]

        def write(tmp: str) -> None:
            with pq.ParquetWriter(tmp, schema) as writer:
                for seg, reader in zip(manifest.segments, readers, strict=True):
                    folder = manifest.path(root, seg.dir)
                    dead = None
                    if seg.deletions is not None and seg.n_deleted:
                        dead = deletions.read(folder / seg.deletions, seg.n_rows)
                    for table in _documents(reader, dead, manifest, vectors):
                        writer.write_table(_with_every_column(table, schema))
                        counted[0] += table.num_rows

        atomic_write(path, write)
    finally:
        for reader in readers:
            reader.close()
    return Exported(str(path.resolve()), manifest.version, counted[0], vectors,
                    tuple(schema.names))  # fmt: skip


def _open_readers(root: Path, manifest: mf.Manifest) -> list[RowReader]:
    readers: list[RowReader] = []
    try:
        for seg in manifest.segments:
            if seg.n_rows and not seg.parts:
                raise IndexDamaged(f"segment {seg.name} lists no row files",
                                   "run `flowsearch compact`, or rebuild the index")  # fmt: skip
            readers.append(RowReader(manifest.path(root, seg.dir), seg.parts))
    except BaseException:
        for reader in readers:
            reader.close()
        raise
    return readers


def _schema(manifest: mf.Manifest, vectors: bool) -> pa.Schema:
    """id, text, the metadata columns (the manifest's types), raw when asked."""
    id_type = pa.int64() if manifest.columns.id_type == "int" else pa.string()
    fields = [pa.field("id", id_type), pa.field("text", pa.string()),
              *[pa.field(c.name, type_of(c)) for c in manifest.schema_]]  # fmt: skip
    if vectors:
        fields.append(pa.field(RAW, raw_type(manifest.dim)))
    enc = manifest.encoder
    described = {"version": manifest.version, "model": enc.model, "pooling": enc.pooling,
                 "dim": enc.dim, "raw": "the encoder's output, before calibration"}  # fmt: skip
    return pa.schema(fields, metadata={METADATA_KEY: json.dumps(described).encode()})


def raw_type(dim: int) -> pa.DataType:
    """The ``raw`` column's type: per document, its passages' span and float32 vector."""
    vector = pa.list_(pa.float32(), dim)
    return pa.list_(pa.struct([("start", pa.int64()), ("end", pa.int64()), ("vector", vector)]))


def _with_every_column(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``'s columns and types (a column an older segment lacks: nulls)."""
    columns = [
        table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)


def _documents(
    reader: RowReader, dead: np.ndarray | None, manifest: mf.Manifest, vectors: bool
) -> Iterator[pa.Table]:
    """A segment's live documents, part by part (a document's passages, consecutive rows,
    may straddle two parts: the rows of a document not yet whole wait for the next part)."""
    present = reader.schema.names
    names = [n for n in ("id", "text", *manifest.metadata_columns) if n in present]
    passages = [c for c in PASSAGE_COLUMNS if c in present]
    wanted = names + passages + ([RAW] if vectors else [])
    carry: pa.Table | None = None
    start = 0
    for part in reader.batches(wanted):
        n = part.num_rows
        if dead is not None:
            part = part.filter(pa.array(~dead[start : start + n]))
        start += n
        table = part if carry is None else pa.concat_tables([carry, part])
        if not passages:
            if table.num_rows:
                yield _whole(table, names, vectors)
            continue
        done = _complete(table)
        carry = table.slice(done) if done < table.num_rows else None
        if done:
            yield _joined(table.slice(0, done), names, vectors)
    if carry is not None and carry.num_rows:
        raise IndexDamaged("a document's passages end before the segment does",
                           "rebuild the index")  # fmt: skip


def _complete(table: pa.Table) -> int:
    """How many leading rows of ``table`` are whole documents (all their passages there)."""
    number = table.column(PASSAGE).to_numpy()
    firsts = np.flatnonzero(number == 0)
    if not len(firsts):
        return 0
    count = table.column("__passages").to_numpy()
    last = int(firsts[-1])
    return table.num_rows if last + int(count[last]) <= table.num_rows else last


def _raw(table: pa.Table, starts: list[int], ends: list[int]) -> pa.Array:
    """Each row's passage as a one-element ``raw`` list."""
    vecs = matrix(table.column(RAW)).astype(np.float32)
    items = [[{"start": s, "end": e, "vector": v}] for s, e, v in zip(starts, ends, vecs.tolist(),
                                                                       strict=True)]  # fmt: skip
    return pa.array(items, raw_type(vecs.shape[1]))


def _whole(table: pa.Table, names: list[str], vectors: bool) -> pa.Table:
    """Rows that are each a whole document."""
    out = table.select(names)
    if vectors:
        texts = table.column("text").to_pylist()
        ends = [len(t) if t is not None else 0 for t in texts]
        out = out.append_column(RAW, _raw(table, [0] * len(ends), ends))
    return out


def _joined(table: pa.Table, names: list[str], vectors: bool) -> pa.Table:
    """Rows that are passages: one row per document (its first passage's id and metadata),
    its text joined from them, its passages' vectors in order."""
    number = table.column(PASSAGE).to_numpy()
    firsts = np.flatnonzero(number == 0)
    bounds = [*firsts.tolist(), table.num_rows]
    texts = table.column("text").to_pylist()
    starts = table.column(PASSAGE_START).to_pylist()
    ends = table.column(PASSAGE_END).to_pylist()
    whole = [joined(texts[a:b], starts[a:b], ends[a:b]) for a, b in zip(bounds, bounds[1:])]
    out = table.select(names).take(pa.array(firsts))
    out = out.set_column(out.schema.get_field_index("text"), "text", pa.array(whole, pa.string()))
    if vectors:
        vecs = matrix(table.column(RAW)).astype(np.float32).tolist()
        raw = [
            [{"start": starts[i], "end": ends[i], "vector": vecs[i]} for i in range(a, b)]
            for a, b in zip(bounds, bounds[1:])
        ]
        out = out.append_column(RAW, pa.array(raw, raw_type(len(vecs[0]))))
    return out
