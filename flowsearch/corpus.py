r"""Reading a Parquet corpus for indexing: find the files, check them, stream their rows.

A corpus is a Parquet file, a directory of them (searched recursively) or a glob. Checking reads
only the id and text columns, so every bad-input error (missing column, duplicate ids, empty
corpus, ...) is raised before anything is encoded or written. Rows are then streamed in record
batches, file by file in sorted order, so the same corpus always yields the same row order.

Example:
    >>> plan = scan_corpus("data/sample.parquet")  # doctest: +SKIP
    >>> for ids, texts, metadata in plan.batches(4096): ...  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flowsearch.errors import FlowsearchError
from flowsearch.store import RESERVED_COLUMNS

__all__ = ["CorpusPlan", "resolve_files", "scan_corpus"]

LOG = logging.getLogger(__name__)

_SCAN_ROWS = 65_536


def resolve_files(corpus: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The Parquet files a corpus argument names (file, directory, glob, or a list of those).

    Raises:
        FlowsearchError: nothing there, or a file that is not Parquet.
    """
    items = [corpus] if isinstance(corpus, (str, os.PathLike)) else list(corpus)
    files: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.parquet") if p.is_file())
            if not found:
                raise FlowsearchError(f"no .parquet files in directory {path}; point at a corpus")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif glob.has_magic(str(item)):
            found = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
            found = [p for p in found if p.is_file()]
            if not found:
                raise FlowsearchError(f"no files match {item!s}; check the pattern")
            files.extend(found)
        else:
            raise FlowsearchError(f"corpus not found: {path}; give a Parquet file, folder or glob")
    for path in files:
        try:
            pq.ParquetFile(path).close()
        except (pa.ArrowException, OSError):
            raise FlowsearchError(
                f"{path} is not a Parquet file; convert it (e.g. pandas.DataFrame.to_parquet)"
            ) from None
    return files


def _normal_ids(array: pa.Array) -> pa.Array:
    """Ids as int64 or string (the two id types an index stores)."""
    if pa.types.is_integer(array.type):
        return array.cast(pa.int64())
    if pa.types.is_string(array.type):
        return array
    return array.cast(pa.string())


@dataclass
class CorpusPlan:
    """A checked corpus, ready to stream.

    Attributes:
        files: the Parquet files, in reading order.
        text_column: the column holding the passages.
        id_column: the id column, or None when ids are row numbers (``auto_id_start`` + row).
        id_type: ``"int"`` or ``"string"``.
        rows_in: rows in the files.
        rows: rows that will be indexed (texts neither null nor blank).
        skipped: rows skipped for a null or blank text.
        metadata_columns: the other columns, as the first file has them.
        auto_id_start: first row-number id when ``id_column`` is None.
    """

    files: list[Path]
    text_column: str
    id_column: str | None
    id_type: str
    rows_in: int
    rows: int
    skipped: int
    metadata_columns: list[str] = field(default_factory=list)
    auto_id_start: int = 0

    def batches(self, batch_rows: int = 4096) -> Iterator[tuple[pa.Array, list[str], pa.Table]]:
        """Yield ``(ids, texts, metadata)`` for the rows to index, in corpus order."""
        row = self.auto_id_start
        for path in self.files:
            handle = pq.ParquetFile(path)
            for batch in handle.iter_batches(batch_size=batch_rows):
                table = pa.Table.from_batches([batch])
                n = table.num_rows
                keep = _valid_text_mask(table.column(self.text_column))
                if self.id_column is None:
                    ids: pa.Array = pa.array(range(row, row + n), type=pa.int64())
                else:
                    ids = _normal_ids(table.column(self.id_column).combine_chunks())
                row += n
                if not pc.all(keep).as_py():
                    table, ids = table.filter(keep), ids.filter(keep)
                if table.num_rows == 0:
                    continue
                texts = table.column(self.text_column).cast(pa.string()).to_pylist()
                drop = [c for c in (self.text_column, self.id_column) if c is not None]
                yield ids, texts, table.drop_columns(drop)


def _valid_text_mask(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """True where the text is present and not blank."""
    text = column.cast(pa.string())
    blank = pc.equal(pc.utf8_trim_whitespace(text), "")
    return pc.and_(pc.is_valid(text), pc.invert(pc.fill_null(blank, True)))


def scan_corpus(
    corpus: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    text_column: str = "text",
    id_column: str | None = "id",
    *,
    strict: bool = False,
    existing_ids: pa.Array | None = None,
    auto_id_start: int = 0,
) -> CorpusPlan:
    """Check a corpus without encoding it, reading only its id and text columns.

    Args:
        corpus: Parquet file, directory or glob (or a list of them).
        text_column: column with the passages.
        id_column: column with unique ids; when it is the default ``"id"`` and absent, row
            numbers are the ids. None always uses row numbers.
        strict: refuse null or blank texts instead of skipping them.
        existing_ids: ids already in the index (``add``): any overlap is refused.
        auto_id_start: first row-number id.

    Raises:
        FlowsearchError: a missing column, reserved column names, null or duplicate ids, null or
            blank texts under ``strict``, or no rows left to index.
    """
    files = resolve_files(corpus)
    first_names = pq.read_schema(files[0]).names
    for path in files:
        names = pq.read_schema(path).names
        if text_column not in names:
            raise FlowsearchError(
                f"no text column {text_column!r} in {path} (columns: {', '.join(names)}); "
                "pass --text-column"
            )
        if id_column is not None and id_column != "id" and id_column not in names:
            raise FlowsearchError(
                f"no id column {id_column!r} in {path} (columns: {', '.join(names)}); "
                "pass --id-column"
            )
    if id_column == "id":  # the default: use it when there, row numbers when not
        has_id = [id_column in pq.read_schema(p).names for p in files]
        if not any(has_id):
            id_column = None
        elif not all(has_id):
            missing = files[has_id.index(False)]
            raise FlowsearchError(f"{missing} has no 'id' column but other files do; add it")
    metadata = [c for c in first_names if c not in (text_column, id_column)]
    clash = [c for c in metadata if c in RESERVED_COLUMNS]
    if clash:
        raise FlowsearchError(
            f"column(s) {', '.join(repr(c) for c in clash)} clash with the index's own columns "
            f"({', '.join(RESERVED_COLUMNS)}); rename or drop them"
        )

    rows_in = skipped = 0
    id_chunks: list[pa.Array] = []
    columns = [text_column] + ([id_column] if id_column is not None else [])
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=_SCAN_ROWS, columns=columns):
            rows_in += batch.num_rows
            keep = _valid_text_mask(pa.chunked_array([batch.column(text_column)]))
            bad = batch.num_rows - pc.sum(keep.cast(pa.int64())).as_py() if batch.num_rows else 0
            skipped += bad
            if id_column is not None:
                ids = batch.column(id_column)
                if ids.null_count:
                    raise FlowsearchError(
                        f"{ids.null_count} row(s) of {path} have a null id in {id_column!r}; "
                        "fill them or pass --id-column of a complete column"
                    )
                id_chunks.append(_normal_ids(ids).filter(keep.combine_chunks()))
    if skipped and strict:
        raise FlowsearchError(
            f"{skipped} row(s) have a null or blank {text_column!r}; drop them, or leave out "
            "--strict to skip them"
        )
    rows = rows_in - skipped
    if rows == 0:
        what = "has no rows" if rows_in == 0 else f"has no non-blank {text_column!r} values"
        raise FlowsearchError(f"the corpus {what}; nothing to index")

    id_type = "int"
    if id_column is not None:
        all_ids = pa.chunked_array(id_chunks).combine_chunks()
        id_type = "int" if pa.types.is_integer(all_ids.type) else "string"
        unique = pc.unique(all_ids)
        if len(unique) != len(all_ids):
            counts = pc.value_counts(all_ids)
            dup = pc.filter(counts, pc.greater(counts.field("counts"), 1))
            example = dup.field("values")[0].as_py()
            raise FlowsearchError(
                f"{len(dup)} id(s) occur more than once in {id_column!r} (e.g. {example!r}); "
                "ids must be unique"
            )
        if existing_ids is not None and len(existing_ids):
            existing = _normal_ids(existing_ids)
            if existing.type != all_ids.type:
                raise FlowsearchError(
                    f"the index has {_kind(existing.type)} ids, this corpus has "
                    f"{_kind(all_ids.type)} ids in {id_column!r}; convert them to match"
                )
            taken = pc.filter(all_ids, pc.is_in(all_ids, value_set=existing))
            if len(taken):
                raise FlowsearchError(
                    f"{len(taken)} id(s) are already in the index (e.g. {taken[0].as_py()!r}); "
                    "remove them from the corpus, or rebuild with `flowsearch index --overwrite`"
                )
    if skipped:
        LOG.warning("skipping %d row(s) with a null or blank %r", skipped, text_column)
    return CorpusPlan(
        files=files,
        text_column=text_column,
        id_column=id_column,
        id_type=id_type,
        rows_in=rows_in,
        rows=rows,
        skipped=skipped,
        metadata_columns=metadata,
        auto_id_start=auto_id_start,
    )


def _kind(type_: Any) -> str:
    return "integer" if pa.types.is_integer(type_) else "string"
