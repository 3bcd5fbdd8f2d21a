r"""Reading a corpus for indexing: find its parts, check them, stream their rows.

A corpus is a Parquet, JSON Lines (``.jsonl``, ``.ndjson``, ``.json``) or CSV/TSV file (the text
formats optionally ``.gz``), a directory of them (searched recursively; formats may mix when the
columns agree; hidden and ``_``-prefixed files are ignored, as pyarrow's datasets do), a glob, a
list of those, or records in memory (a ``pa.Table`` or a list of dicts, what ``upsert`` and
``POST /upsert`` pass). Checking reads every row's id and text (and, for JSON and CSV, parses
every line), so every bad-input error (a missing column, a wrong type, duplicate ids, an empty
corpus, a corrupt file, ...) is raised before anything is encoded or written. Rows are then
streamed in record batches (see :mod:`flowsearch.ingest.readers` for what is streamed), file by
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
names are checked by the index's rules (:meth:`IndexRules.check_names`: no ``__`` prefix, none
of the index's own, no two differing only in case).

The pass is one direction: the corpus argument becomes sources (:mod:`flowsearch.ingest.files`,
read by :mod:`flowsearch.ingest.readers`), their columns are chosen and typed
(:mod:`flowsearch.ingest.columns`), every row is checked once, and the result is a
:class:`CorpusPlan` that streams the checked rows as often as a write needs them.

What the index asks of the metadata (its column names, an existing index's types) is storage's
knowledge: a write hands it in as :class:`IndexRules`, so reading a corpus imports nothing above.

Example:
    >>> plan = read_corpus("data/sample.parquet", CorpusOptions(), rules)  # doctest: +SKIP
    >>> for ids, texts, metadata in plan.batches(4096): ...  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flowsearch.errors import BadInput, check_bool
from flowsearch.ingest import files
from flowsearch.ingest.columns import (
    checked_columns,
    metadata_schema,
    normal_ids,
    row_label,
    text_strings,
    valid_text_mask,
)
from flowsearch.ingest.files import Corpus
from flowsearch.ingest.readers import Source, with_growing_blocks

__all__ = ["Corpus", "CorpusOptions", "CorpusPlan", "IdType", "IndexRules", "read_corpus"]

LOG = logging.getLogger(__name__)

_SCAN_ROWS = 65_536

#: The two id types an index stores.
IdType = Literal["int", "string"]


@dataclass(frozen=True)
class CorpusOptions:
    """Which columns of a corpus are read, and how strictly.

    Attributes:
        text_column: the column of texts.
        id_column: the column of unique ids; when it is the default ``"id"`` and absent, row
            numbers are the ids. None always numbers the rows.
        strict: refuse null or blank texts instead of skipping them.
    """

    text_column: str = "text"
    id_column: str | None = "id"
    strict: bool = False

    def __post_init__(self) -> None:
        check_bool(self.strict, "strict")
        if not isinstance(self.text_column, str):
            raise BadInput(
                f"text_column must be a column name, got {self.text_column!r}",
                param="text_column",
            )
        if self.id_column is not None and not isinstance(self.id_column, str):
            raise BadInput(
                f"id_column must be a column name or None, got {self.id_column!r}",
                param="id_column",
            )


class IndexRules(Protocol):
    """What an index asks of a corpus's metadata and ids (storage's rules, handed in by a write).

    A new index has no schema nor id type yet; a write into an existing one has both.
    """

    @property
    def known(self) -> pa.Schema | None:
        """The index's metadata columns and their types; None for a new index."""
        ...

    @property
    def id_type(self) -> IdType | None:
        """The index's id type: integer ids go into a string index as their decimal text,
        string ids into an integer index are refused; None for a new index."""
        ...

    @property
    def auto_id_start(self) -> int:
        """The first row-number id (an index's next one)."""
        ...

    def check_names(self, names: Sequence[str]) -> None:
        """Refuse metadata column names the index cannot keep apart (one BadInput line)."""
        ...

    def conform(self, metadata: pa.Table, ids: pa.Array) -> object:
        """Refuse a value that cannot be cast losslessly to its known column's type (one
        BadInput line naming the id ``ids`` gives its row)."""
        ...


@dataclass
class CorpusPlan:
    """A checked corpus, ready to stream.

    Attributes:
        files: the corpus files, in reading order (empty for records in memory).
        text_column: the column holding the texts.
        id_column: the id column, or None when ids are row numbers (``auto_id_start`` + row).
        id_type: ``"int"`` or ``"string"``.
        n_rows_in: rows in the corpus.
        n_rows: rows that will be indexed (texts neither null nor blank).
        n_skipped: rows skipped for a null or blank text.
        metadata_columns: the other columns, in the first file's order.
        auto_id_start: first row-number id when ``id_column`` is None.
        metadata_schema: the metadata columns' types, unified over all files (an existing
            index's types for the columns it knows).
    """

    files: list[Path]
    text_column: str
    id_column: str | None
    id_type: IdType
    n_rows_in: int
    n_rows: int
    n_skipped: int
    metadata_columns: list[str] = field(default_factory=list)
    auto_id_start: int = 0
    metadata_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    sources: list[Source] = field(default_factory=list, repr=False)

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
                    if self.id_type == "string" and not pa.types.is_string(ids.type):
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

    def by_file(self) -> list[CorpusPlan]:
        """One plan per corpus file (each streams only its file's rows); row-number ids go on
        across files as :meth:`batches` numbers them."""
        plans = []
        start = self.auto_id_start
        for source in self.sources:
            plans.append(replace(self, sources=[copy.copy(source)], auto_id_start=start))
            if self.id_column is None:  # only row-number ids need each file's row count
                start += _rows_in(source, self.text_column)
        return plans


def _rows_in(source: Source, text_column: str) -> int:
    if source.format == "parquet" and source.path is not None:
        return int(pq.ParquetFile(source.path).metadata.num_rows)
    return sum(batch.num_rows for batch in source.batches(_SCAN_ROWS, [text_column]))


def read_corpus(corpus: Corpus, options: CorpusOptions, rules: IndexRules) -> CorpusPlan:
    """Read and check a corpus without encoding it: every bad-input error is raised here.

    Args:
        corpus: a Parquet, JSON Lines or CSV file, directory or glob, a list of them, a
            ``pa.Table``, or a list of dicts (records; every one with the same keys).
        options: which columns, how strictly.
        rules: what the index asks of the metadata and ids (a new index's, or the existing
            index's a write goes into: then every value must cast losslessly to its column's
            type, and the plan's metadata are cast to it; new columns keep their own type).

    Returns:
        The plan; :meth:`CorpusPlan.batches` streams its rows.

    Raises:
        FlowsearchError: one line naming the file (column, row) and the fix, for a missing or
            unreadable file, an unsupported or corrupt one, a missing column, a text column that
            is not text, reserved column names, null, fractional or duplicate ids, ids of
            another type than the index's, null or blank texts under ``strict``, or no rows.
    """
    text_column = options.text_column
    sources = files.sources(corpus)
    known = rules.known
    while True:
        blocks = [source.block_size for source in sources]
        schemas = [with_growing_blocks(source, Source.schema) for source in sources]
        id_column = checked_columns(schemas, sources, text_column, options.id_column)
        metadata = [c for c in schemas[0].names if c not in (text_column, id_column)]
        rules.check_names(metadata)
        meta_schema = metadata_schema(schemas, sources, metadata)
        if known is not None:
            meta_schema = _target_schema(meta_schema, known)
        scan = _Scan(text_column, id_column, rules if known is not None else None, metadata)
        for source in sources:
            with_growing_blocks(source, scan.source)
        # a JSON/CSV file read with larger blocks may show columns and types its first block
        # did not: choose and check the columns again, as those blocks read them (rare)
        if blocks == [source.block_size for source in sources]:
            break
    if scan.skipped and options.strict:
        raise BadInput(
            f"{scan.skipped} row(s) have a null or blank {text_column!r}",
            "drop them, or pass {strict=False} to skip them",
            param="strict",
        )
    rows = scan.rows_in - scan.skipped
    if rows == 0:
        what = "has no rows" if scan.rows_in == 0 else f"has no non-blank {text_column!r} values"
        raise BadInput(f"the corpus {what}; nothing to index")

    id_type = scan.checked_ids(rules.id_type)
    if scan.skipped:
        LOG.warning("skipping %d row(s) with a null or blank %r", scan.skipped, text_column)
    return CorpusPlan(
        files=[s.path for s in sources if s.path is not None],
        text_column=text_column,
        id_column=id_column,
        id_type=id_type,
        n_rows_in=scan.rows_in,
        n_rows=rows,
        n_skipped=scan.skipped,
        metadata_columns=metadata,
        auto_id_start=rules.auto_id_start,
        metadata_schema=meta_schema,
        sources=sources,
    )


class _Scan:
    """The check pass over every source: rows read and skipped, the ids (to check once)."""

    def __init__(
        self,
        text_column: str,
        id_column: str | None,
        into: IndexRules | None,
        metadata: list[str],
    ) -> None:
        self.text_column, self.id_column = text_column, id_column
        #: an existing index whose types every metadata value must fit (None: a new index)
        self.into = into
        self.metadata = metadata
        self.rows_in = self.skipped = 0
        self.ids: list[pa.Array] = []
        self._kinds: dict[str, str] = {}  # id kind -> the first source holding it

    def source(self, source: Source) -> None:
        """Check one source's rows (read again from its start when its blocks grow)."""
        rows_in, skipped, ids = self.rows_in, self.skipped, len(self.ids)
        try:
            self._read(source)
        except BaseException:
            self.rows_in, self.skipped, self.ids = rows_in, skipped, self.ids[:ids]
            raise
        if len(self.ids) > ids:
            self._kinds.setdefault(_kind(self.ids[ids].type), source.name)

    def _read(self, source: Source) -> None:
        text_column, id_column = self.text_column, self.id_column
        # Parquet reads only these two columns (and the metadata when a write must check it);
        # JSON and CSV parse whole lines anyway, and reading every column surfaces any
        # conversion error now, before encoding starts.
        columns = [text_column] + ([id_column] if id_column is not None else [])
        wanted = columns if source.format == "parquet" and self.into is None else None
        first_row = 0
        for batch in source.batches(_SCAN_ROWS, wanted):
            n = batch.num_rows
            text = text_strings(
                pa.chunked_array([batch.column(text_column)]), source, text_column, first_row
            )
            keep = valid_text_mask(text).combine_chunks()
            self.skipped += n - pc.sum(keep.cast(pa.int64())).as_py() if n else 0
            if wanted is None:  # the other columns: strings must be valid UTF-8 too
                for name in batch.schema.names:
                    if name not in columns and pa.types.is_string(batch.schema.field(name).type):
                        text_strings(pa.chunked_array([batch.column(name)]), source, name,
                                     first_row)  # fmt: skip
            ids = None
            if id_column is not None:
                ids = self._checked_ids(batch, source, first_row)
                self.ids.append(ids.filter(keep))
            if self.into is not None and self.metadata:
                start = self.into.auto_id_start + self.rows_in
                row_ids = ids if ids is not None else pa.array(range(start, start + n), pa.int64())
                self.into.conform(pa.Table.from_batches([batch]).select(self.metadata), row_ids)
            first_row += n
            self.rows_in += n

    def _checked_ids(self, batch: pa.RecordBatch, source: Source, first_row: int) -> pa.Array:
        id_column = self.id_column
        assert id_column is not None
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
        return ids

    def checked_ids(self, index_type: IdType | None) -> IdType:
        """The plan's id type, after checking its ids are of one type, unique, and of the
        index's type (``index_type``; None: a new index)."""
        id_column = self.id_column
        if id_column is None:
            return "int"
        # a string index takes integer ids as their decimal text, from one file or several
        into_strings = index_type == "string"
        if len(self._kinds) > 1 and not into_strings:
            (k1, f1), (k2, f2) = self._kinds.items()
            raise BadInput(
                f"ids in {id_column!r} are {k1}s in {f1} but {k2}s in {f2}", "give them one type"
            )
        chunks = self.ids
        if into_strings:  # files may mix ints and strings
            chunks = [c if pa.types.is_string(c.type) else c.cast(pa.string()) for c in chunks]
        all_ids = pa.chunked_array(chunks).combine_chunks()
        id_type: IdType = "int" if pa.types.is_integer(all_ids.type) else "string"
        if index_type is not None and id_type != index_type:
            all_ids, id_type = _index_ids(all_ids, index_type, id_column), index_type
        _refuse_duplicates(all_ids, id_column)
        return id_type


def _target_schema(corpus: pa.Schema, known: pa.Schema) -> pa.Schema:
    """The corpus's metadata schema with the index's types for the columns it knows."""
    types = {f.name: f.type for f in known}
    return pa.schema([pa.field(f.name, types.get(f.name, f.type)) for f in corpus])


def _index_ids(ids: pa.Array, index_type: IdType, id_column: str) -> pa.Array:
    """Ids of the corpus in the index's id type (see :class:`IndexRules`'s ``id_type``)."""
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


def _kind(type_: pa.DataType) -> str:
    return "integer" if pa.types.is_integer(type_) else "string"
