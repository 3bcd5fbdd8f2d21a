r"""Reading a corpus for indexing: find its parts, check them, stream their rows.

A corpus is a Parquet, JSON Lines (``.jsonl``, ``.ndjson``, ``.json``) or CSV/TSV file (the text
formats optionally ``.gz``), a directory of them (searched recursively; formats may mix when the
columns agree; hidden and ``_``-prefixed files are ignored, as pyarrow's datasets do), a glob, a
list of those, or records in memory (a ``pa.Table`` or a list of dicts, what ``upsert`` and
``POST /upsert`` pass). Checking reads every row's id and text (and, for JSON and CSV, parses
every line), so every bad-input error (a missing column, a wrong type, duplicate ids, an empty
corpus, a corrupt file, ...) is raised before anything is encoded or written. Rows are then
streamed in record batches (see :mod:`flowsearch.storage.readers` for what is streamed), file by
file in sorted path order, so the same corpus always yields the same row order.

Decisions: a text column of numbers, lists, structs or dates is refused (it would index "3.0");
binary text is accepted when it is valid UTF-8; invalid UTF-8 is refused naming the column and
row. Float ids are normalised to integers when every one is whole, refused otherwise. A metadata
column whose type differs across files is unified by pyarrow's permissive promotion (null takes
the other type, numbers widen: int32 + int64 -> int64, int + float -> float64) and refused,
naming the column and files, when that fails (a string in one file, a number in another).
JSON has no NaN or infinity: a JSON Lines ``NaN``/``Infinity`` literal is refused naming the
line; an integer beyond int64, in JSON Lines or CSV, is refused naming the line, column and id
(it would be stored as an inexact float; a float such as ``1e20`` is taken). Metadata column
names are checked by :func:`flowsearch.storage.schema.check_names` (no ``__`` prefix, none of
the index's own, no two differing only in case).

Example:
    >>> plan = scan_corpus("data/sample.parquet")  # doctest: +SKIP
    >>> for ids, texts, metadata in plan.batches(4096): ...  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flowsearch.errors import BadInput
from flowsearch.storage import corpus_files
from flowsearch.storage.columns import (
    checked_columns,
    metadata_schema,
    normal_ids,
    row_label,
    text_strings,
    valid_text_mask,
)
from flowsearch.storage.corpus_files import Corpus, resolve_files
from flowsearch.storage.manifest import SchemaColumn
from flowsearch.storage.readers import MAX_BLOCK, BlockTooSmall, Source
from flowsearch.storage.schema import check_names

__all__ = ["Corpus", "CorpusPlan", "resolve_files", "scan_corpus"]

LOG = logging.getLogger(__name__)

_SCAN_ROWS = 65_536


@dataclass
class CorpusPlan:
    """A checked corpus, ready to stream.

    Attributes:
        files: the corpus files, in reading order (empty for records in memory).
        text_column: the column holding the passages.
        id_column: the id column, or None when ids are row numbers (``auto_id_start`` + row).
        id_type: ``"int"`` or ``"string"``.
        n_rows_in: rows in the corpus.
        n_rows: rows that will be indexed (texts neither null nor blank).
        n_skipped: rows skipped for a null or blank text.
        metadata_columns: the other columns, in the first file's order.
        auto_id_start: first row-number id when ``id_column`` is None.
        metadata_schema: the metadata columns' types, unified over all files.
    """

    files: list[Path]
    text_column: str
    id_column: str | None
    id_type: str
    n_rows_in: int
    n_rows: int
    n_skipped: int
    metadata_columns: list[str] = field(default_factory=list)
    auto_id_start: int = 0
    metadata_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    sources: list[Source] = field(default_factory=list, repr=False)
    ids_as: str | None = None

    def batches(self, batch_rows: int = 4096) -> Iterator[tuple[pa.Array, list[str], pa.Table]]:
        """Yield ``(ids, texts, metadata)`` for the rows to index, in corpus order.

        ``ids`` is an int64 or string array, ``texts`` a list of str, ``metadata`` a table of
        :attr:`metadata_columns` typed as :attr:`metadata_schema`; at most ``batch_rows`` rows.
        """
        row = self.auto_id_start
        for source in self.sources:
            for batch in source.batches(batch_rows):
                table = pa.Table.from_batches([batch])
                n = table.num_rows
                text = text_strings(table.column(self.text_column), source, self.text_column)
                keep = valid_text_mask(text)
                if self.id_column is None:
                    ids: pa.Array = pa.array(range(row, row + n), type=pa.int64())
                else:
                    column = table.column(self.id_column).combine_chunks()
                    ids = normal_ids(column, source, self.id_column, 0)
                    if self.ids_as == "string" and not pa.types.is_string(ids.type):
                        ids = ids.cast(pa.string())
                row += n
                if not pc.all(keep).as_py():
                    table, ids, text = table.filter(keep), ids.filter(keep), text.filter(keep)
                if table.num_rows == 0:
                    continue
                meta = table.select(self.metadata_columns)
                if meta.schema != self.metadata_schema:
                    meta = meta.cast(self.metadata_schema)
                yield ids, text.to_pylist(), meta


@dataclass
class _Scan:
    """What one source's check pass found."""

    rows_in: int = 0
    skipped: int = 0
    ids: list[pa.Array] = field(default_factory=list)


def _scan_source(
    source: Source, text_column: str, id_column: str | None, check: _Check | None = None
) -> _Scan:
    """Read a source's ids and texts once, checking them; grows JSON/CSV blocks when needed."""
    while True:
        try:
            return _scan_once(source, text_column, id_column, check)
        except BlockTooSmall:
            source.block_size = min(source.block_size * 2, MAX_BLOCK)
            LOG.debug("re-reading %s with %d-byte blocks", source.name, source.block_size)


@dataclass
class _Check:
    """What a write into an existing index checks every row against: its schema and id type."""

    schema: Sequence[SchemaColumn]
    metadata: list[str]
    id_type: str
    auto_id_start: int


def _scan_once(
    source: Source, text_column: str, id_column: str | None, check: _Check | None = None
) -> _Scan:
    scan = _Scan()
    # Parquet reads only these two columns (and the metadata when a write must check it);
    # JSON and CSV parse whole lines anyway, and reading every column surfaces any conversion
    # error now, before encoding starts.
    columns = [text_column] + ([id_column] if id_column is not None else [])
    wanted = columns if source.format == "parquet" and check is None else None
    for batch in source.batches(_SCAN_ROWS, wanted):
        first_row, n = scan.rows_in, batch.num_rows
        scan.rows_in += n
        text = text_strings(
            pa.chunked_array([batch.column(text_column)]), source, text_column, first_row
        )
        keep = valid_text_mask(text).combine_chunks()
        scan.skipped += n - pc.sum(keep.cast(pa.int64())).as_py() if n else 0
        if wanted is None:  # the other columns: strings must be valid UTF-8 too
            for name in batch.schema.names:
                if name not in columns and pa.types.is_string(batch.schema.field(name).type):
                    text_strings(pa.chunked_array([batch.column(name)]), source, name, first_row)
        if id_column is not None:
            ids = normal_ids(batch.column(id_column), source, id_column, first_row)
            missing = pc.is_null(ids)
            if pa.types.is_string(ids.type):  # "" is no id either
                missing = pc.or_kleene(missing, pc.equal(pc.utf8_length(ids), 0))
            count = pc.sum(missing.cast(pa.int64())).as_py() or 0
            if count:
                at = first_row + pc.index(missing, True).as_py()
                raise BadInput(
                    f"{count} row(s) of {source.name} have a null or empty id in {id_column!r} "
                    f"(first: {row_label(source, at)})",
                    "fill them, or name a complete id column with {id_column=...}",
                    cli="fill them, or name a complete id column with --id-column",
                    param="id_column",
                )
            scan.ids.append(ids.filter(keep))
        if check is not None and check.metadata:
            from flowsearch.storage.schema import conform

            row_ids = (
                ids
                if id_column is not None
                else pa.array(
                    range(check.auto_id_start + first_row, check.auto_id_start + first_row + n),
                    pa.int64(),
                )
            )
            conform(pa.Table.from_batches([batch]).select(check.metadata), check.schema, row_ids)
    return scan


def scan_corpus(
    corpus: Corpus,
    text_column: str = "text",
    id_column: str | None = "id",
    *,
    strict: bool = False,
    auto_id_start: int = 0,
    schema: Sequence[SchemaColumn] | None = None,
    id_type: str | None = None,
) -> CorpusPlan:
    """Check a corpus without encoding it: every bad-input error is raised here.

    Args:
        corpus: a Parquet, JSON Lines or CSV file, directory or glob, a list of them, a
            ``pa.Table``, or a list of dicts (records; every one with the same keys).
        text_column: column with the passages.
        id_column: column with unique ids; when it is the default ``"id"`` and absent, row
            numbers are the ids. None always uses row numbers.
        strict: refuse null or blank texts instead of skipping them.
        auto_id_start: first row-number id.
        schema: the index's metadata schema, for a write into an existing index: every value
            must cast losslessly to its column's type (:func:`flowsearch.storage.schema.conform`);
            the plan's metadata are cast to it, new columns keep their own type.
        id_type: the index's id type (``"int"`` or ``"string"``): integer ids go into a string
            index as their decimal text; string ids into an integer index are refused.

    Returns:
        The plan; :meth:`CorpusPlan.batches` streams its rows.

    Raises:
        FlowsearchError: one line naming the file (column, row) and the fix, for a missing or
            unreadable file, an unsupported or corrupt one, a missing column, a text column that
            is not text, reserved column names, null, fractional or duplicate ids, ids of
            another type than the index's, null or blank texts under ``strict``, or no rows.
    """
    sources = corpus_files.sources(corpus)
    schemas = [_schema(source) for source in sources]
    id_column = checked_columns(schemas, sources, text_column, id_column)
    metadata = [c for c in schemas[0].names if c not in (text_column, id_column)]
    check_names(metadata, [c.name for c in schema] if schema is not None else ())
    meta_schema = metadata_schema(schemas, sources, metadata)
    check = None
    if schema is not None:
        check = _Check(schema, metadata, id_type or "int", auto_id_start)
        meta_schema = _target_schema(meta_schema, schema)

    rows_in, skipped, id_chunks = _scan_all(sources, text_column, id_column, check)
    if skipped and strict:
        raise BadInput(
            f"{skipped} row(s) have a null or blank {text_column!r}",
            "drop them, or pass {strict=False} to skip them",
            param="strict",
        )
    rows = rows_in - skipped
    if rows == 0:
        what = "has no rows" if rows_in == 0 else f"has no non-blank {text_column!r} values"
        raise BadInput(f"the corpus {what}; nothing to index")

    id_type = _checked_ids(id_chunks, id_column, check)
    if skipped:
        LOG.warning("skipping %d row(s) with a null or blank %r", skipped, text_column)
    return CorpusPlan(
        files=[s.path for s in sources if s.path is not None],
        text_column=text_column,
        id_column=id_column,
        id_type=id_type,
        n_rows_in=rows_in,
        n_rows=rows,
        n_skipped=skipped,
        metadata_columns=metadata,
        auto_id_start=auto_id_start,
        metadata_schema=meta_schema,
        sources=sources,
        ids_as=id_type if id_column is not None else None,
    )


def _schema(source: Source) -> pa.Schema:
    """A source's columns, growing its JSON/CSV block size until the reader can tell."""
    while True:
        try:
            return source.schema()
        except BlockTooSmall:
            source.block_size = min(source.block_size * 2, MAX_BLOCK)


def _scan_all(
    sources: list[Source], text_column: str, id_column: str | None, check: _Check | None
) -> tuple[int, int, list[pa.Array]]:
    """Every source scanned: ``(rows in, rows skipped, id chunks)``; ids of one type."""
    rows_in = skipped = 0
    id_chunks: list[pa.Array] = []
    id_kinds: dict[str, str] = {}
    for source in sources:
        scan = _scan_source(source, text_column, id_column, check)
        rows_in, skipped = rows_in + scan.rows_in, skipped + scan.skipped
        id_chunks.extend(scan.ids)
        if scan.ids:
            id_kinds.setdefault(_kind(scan.ids[0].type), source.name)
    # a string index takes integer ids as their decimal text, from one file or from several
    into_strings = check is not None and check.id_type == "string"
    if len(id_kinds) > 1 and not into_strings:
        (k1, f1), (k2, f2) = id_kinds.items()
        raise BadInput(
            f"ids in {id_column!r} are {k1}s in {f1} but {k2}s in {f2}", "give them one type"
        )
    return rows_in, skipped, id_chunks


def _checked_ids(chunks: list[pa.Array], id_column: str | None, check: _Check | None) -> str:
    """The plan's id type, after checking its ids are unique (and of the index's type)."""
    if id_column is None:
        return "int"
    if check is not None and check.id_type == "string":  # files may mix ints and strings
        chunks = [c if pa.types.is_string(c.type) else c.cast(pa.string()) for c in chunks]
    all_ids = pa.chunked_array(chunks).combine_chunks()
    id_type = "int" if pa.types.is_integer(all_ids.type) else "string"
    if check is not None and id_type != check.id_type:
        all_ids, id_type = _index_ids(all_ids, check.id_type, id_column), check.id_type
    _refuse_duplicates(all_ids, id_column)
    return id_type


def _target_schema(corpus: pa.Schema, schema: Sequence[SchemaColumn]) -> pa.Schema:
    """The corpus's metadata schema with the index's types for the columns it knows."""
    from flowsearch.storage.schema import type_of

    known = {c.name: type_of(c) for c in schema}
    return pa.schema([pa.field(f.name, known.get(f.name, f.type)) for f in corpus])


def _index_ids(ids: pa.Array, index_type: str, id_column: str) -> pa.Array:
    """Ids of the corpus in the index's id type (see :func:`scan_corpus`'s ``id_type``)."""
    if index_type == "string":
        return ids.cast(pa.string())
    example = ids[0].as_py() if len(ids) else None
    raise BadInput(
        f"the index has integer ids, this corpus has string ids in {id_column!r} "
        f"(e.g. {example!r})",
        f"give {id_column!r} integer values, or rebuild the index with string ids",
    )


def _refuse_duplicates(ids: pa.Array, id_column: str) -> None:
    if len(pc.unique(ids)) != len(ids):
        counts = pc.value_counts(ids)
        dup = pc.filter(counts, pc.greater(counts.field("counts"), 1))
        example = dup.field("values")[0].as_py()
        raise BadInput(
            f"{len(dup)} id(s) occur more than once in {id_column!r} (e.g. {example!r}); "
            "ids must be unique"
        )


def _kind(type_: Any) -> str:
    return "integer" if pa.types.is_integer(type_) else "string"
