r"""Corpus sources (Parquet, JSON Lines, CSV/TSV files, in-memory tables) as record-batch streams.

What is streamed: Parquet one record batch at a time (``ParquetFile.iter_batches``); JSON Lines and
CSV/TSV (optionally ``.gz``) through pyarrow's block readers (``pyarrow.json.open_json``,
``pyarrow.csv.open_csv``), one block of :attr:`Source.block_size` bytes at a time. Those readers
infer column types from the first block; when a later block disagrees (a key that first appears
late, a column null at first, a line longer than a block), the file is read again with blocks twice
as large, up to :data:`MAX_BLOCK` (a file needing more is refused with the line and column). Lists
of dicts are converted to one in-memory table, after a check that names the record and key of any
inconsistency.

Every Arrow, JSON, OS and Unicode error met while reading becomes here one
:class:`~flowsearch.errors.FlowsearchError` line naming the file (and the column and line when
known) and the fix; no traceback reaches the caller.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from flowsearch.errors import BadInput, FlowsearchError
from flowsearch.jsonable import find_in_json

__all__ = [
    "FORMATS",
    "MAX_BLOCK",
    "MAX_NESTING",
    "BlockTooSmall",
    "Source",
    "format_of",
    "records_table",
    "reading_error",
    "with_growing_blocks",
]

LOG = logging.getLogger(__name__)
_T = TypeVar("_T")

#: File name suffixes read, and the format each names (``.gz`` may follow a text format).
FORMATS: dict[str, str] = {
    ".parquet": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
}
#: First block size for the JSON and CSV readers (their type-inference window).
FIRST_BLOCK = 16 << 20
#: The largest block tried before a file is refused.
MAX_BLOCK = 256 << 20
#: The deepest a column's values may nest (lists, objects and maps inside each other): Parquet
#: cannot read back much deeper (its schema holds up to 100 levels, a list takes two).
MAX_NESTING = 32


class BlockTooSmall(Exception):
    """A JSON/CSV block reader needs a larger block (long line, or types inferred too early)."""


def format_of(path: Path) -> str | None:
    """The format a file name says (``"parquet"``, ``"jsonl"``, ``"csv"``, ``"tsv"``), or None."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        kind = FORMATS.get(suffixes[-2]) if len(suffixes) > 1 else None
        return kind if kind not in (None, "parquet") else None
    if suffixes:
        return FORMATS.get(suffixes[-1])
    return None


@dataclass
class Source:
    """One part of a corpus: a file of a known format, or an in-memory table.

    Attributes:
        name: what error messages call it (the path, or ``"records"``).
        format: ``"parquet"``, ``"jsonl"``, ``"csv"``, ``"tsv"`` or ``"table"``.
        path: the file (None for a table).
        table: the in-memory table (None for a file).
        block_size: bytes per block for the JSON/CSV readers (grown by
            :func:`with_growing_blocks`).
    """

    name: str
    format: str
    path: Path | None = None
    table: pa.Table | None = None
    block_size: int = field(default_factory=lambda: FIRST_BLOCK)
    #: the file's numbers were read as text once and found fine (:func:`_refuse_big_numbers`)
    numbers_checked: bool = field(default=False, repr=False)

    def schema(self) -> pa.Schema:
        """The source's columns (for JSON/CSV, as inferred from the first block), checked:
        each name once, no value nested deeper than :data:`MAX_NESTING`.

        Raises:
            BadInput: a name twice, a column nested too deep, or the file cannot be read.
        """
        if self.table is not None:
            schema = self.table.schema
        else:
            try:
                schema = pq.read_schema(self._path) if self.format == "parquet" else None
                schema = schema or self._open().schema
            except Exception as exc:  # noqa: BLE001 - mapped to one line here, the boundary
                raise self._mapped(exc) from None
        check_schema(schema, self.name)
        return schema

    def batches(
        self, batch_rows: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Record batches of at most ``batch_rows`` rows, in file order.

        Args:
            batch_rows: the most rows in one batch.
            columns: read only these (Parquet reads no others; JSON/CSV parse whole lines anyway).

        Raises:
            FlowsearchError: the file cannot be read (one line naming it).
            BlockTooSmall: a JSON/CSV block reader needs larger blocks
                (:func:`with_growing_blocks` retries).
        """
        if self.table is not None:
            table = self.table if columns is None else self.table.select(list(columns))
            yield from table.to_batches(max_chunksize=batch_rows)
            return
        try:
            if self.format == "parquet":
                with pq.ParquetFile(self._path) as handle:
                    yield from handle.iter_batches(batch_size=batch_rows, columns=columns)
                return
            for batch in self._open():
                if not self.numbers_checked and _odd_numbers(batch, self.format == "jsonl"):
                    _refuse_big_numbers(self._path, self.name, self.format)
                    self.numbers_checked = True  # the whole file: once is enough
                if columns is not None:
                    batch = batch.select(list(columns))
                for start in range(0, batch.num_rows, batch_rows):
                    yield batch.slice(start, batch_rows)
        except (FlowsearchError, BlockTooSmall):
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to one line here, the boundary
            raise self._mapped(exc) from None

    def _mapped(self, exc: Exception) -> Exception:
        """BlockTooSmall when a larger block may read the file, else the one-line error."""
        text_format = self.format in ("jsonl", "csv", "tsv")
        if text_format and self.block_size < MAX_BLOCK and _needs_larger_block(exc, self.format):
            return BlockTooSmall(str(exc))
        return reading_error(exc, self)

    @property
    def _path(self) -> Path:
        assert self.path is not None
        return self.path

    def _open(self) -> pa.RecordBatchReader:
        stream = pa.input_stream(self._path, compression="detect")
        if self.format == "jsonl":
            return pjson.open_json(
                stream, read_options=pjson.ReadOptions(block_size=self.block_size)
            )
        # single-threaded so that CSV errors carry the physical row number
        return pcsv.open_csv(
            stream,
            read_options=pcsv.ReadOptions(block_size=self.block_size, use_threads=False),
            parse_options=pcsv.ParseOptions(delimiter="\t" if self.format == "tsv" else ","),
            # an empty field is a missing value (as pandas reads it), not an empty string
            convert_options=pcsv.ConvertOptions(strings_can_be_null=True),
        )


def check_schema(schema: pa.Schema, where: str) -> None:
    """Refuse a column name given twice, and a column nested deeper than :data:`MAX_NESTING`.

    Raises:
        BadInput: naming the column and the fix.
    """
    seen: set[str] = set()
    for name in schema.names:
        if name in seen:
            raise BadInput(
                f"{where} has two columns named {name!r}",
                "give every column its own name (rename or drop one)",
            )
        seen.add(name)
    for item in schema:
        depth = _type_depth(item.type)
        if depth > MAX_NESTING:
            raise BadInput(
                f"{where}: column {item.name!r} nests {depth} levels deep, more than the "
                f"{MAX_NESTING} an index stores",
                "flatten it, or store it as a JSON string",
            )


def _type_depth(type_: pa.DataType) -> int:
    """How many lists, structs and maps an Arrow type nests (0 for a plain value)."""
    deepest, todo = 0, [(type_, 0)]
    while todo:
        current, depth = todo.pop()
        deepest = max(deepest, depth)
        todo.extend((current.field(i).type, depth + 1) for i in range(current.num_fields))
    return deepest


def _value_depth(value: object, limit: int) -> int:
    """How deep a Python value nests (lists, tuples, dicts), counted up to ``limit`` + 1."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        current, depth = todo.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        if isinstance(current, Mapping):
            todo.extend((v, depth + 1) for v in current.values())
        elif isinstance(current, (list, tuple)):
            todo.extend((v, depth + 1) for v in current)
    return deepest


def with_growing_blocks(source: Source, read: Callable[[Source], _T]) -> _T:
    """``read(source)``, read again with blocks twice as large while a JSON/CSV block reader
    needs them (up to :data:`MAX_BLOCK`, past which the reader's error is the one line)."""
    while True:
        try:
            return read(source)
        except BlockTooSmall:
            source.block_size = min(source.block_size * 2, MAX_BLOCK)
            LOG.debug("re-reading %s with %d-byte blocks", source.name, source.block_size)


def _needs_larger_block(exc: Exception, fmt: str) -> bool:
    """Whether a JSON/CSV error comes from inferring types (or framing lines) on too little."""
    text = str(exc)
    if "straddl" in text:
        return True
    if fmt == "jsonl":
        return "unexpected field" in text or "changed from null to" in text
    return "CSV conversion error" in text  # the first block inferred a type a later one breaks


def _line(text: str) -> str:
    """An error text as one short line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= 200 else flat[:197] + "..."


def reading_error(exc: BaseException, source: Source) -> FlowsearchError:
    """One line for an error met reading ``source``: what went wrong, where, and the fix."""
    where = source.name
    if isinstance(exc, FlowsearchError):
        return exc
    if isinstance(exc, PermissionError):
        return BadInput(f"cannot read {where}: permission denied; make it readable")
    if isinstance(exc, IsADirectoryError):
        return BadInput(f"{where} is a directory, not a file; give the directory itself")
    if isinstance(exc, FileNotFoundError):
        return BadInput(f"corpus file not found: {where}; check the path")
    if isinstance(exc, UnicodeDecodeError):
        return BadInput(f"{where} is not valid UTF-8 (byte {exc.start}); re-encode it")
    if isinstance(exc, (EOFError, gzip.BadGzipFile)):
        return BadInput(f"{where} is a truncated or corrupt gzip file; compress it again")
    text = _line(str(exc))
    gz = source.path is not None and source.path.suffix.lower() == ".gz"
    if gz and any(word in text.lower() for word in ("gzip", "zlib", "compress", "inflate")):
        return BadInput(f"{where} is a truncated or corrupt gzip file ({text}); compress it again")
    if source.format == "parquet":
        if "magic bytes" in text or "size is 0" in text or "Couldn't deserialize" in text:
            return BadInput(
                f"{where} is not a Parquet file, or is truncated ({text}); write it again"
            )
        return BadInput(f"cannot read {where}: {text}; the file is corrupt, write it again")
    if source.format == "jsonl":
        if "Empty JSON stream" in text:
            return BadInput(f"{where} holds no JSON records; remove it or fill it")
        try:
            problem = _json_problem(source._path) if source.path is not None else None
        except (EOFError, OSError):  # a truncated or corrupt .gz: pyarrow's error said why
            problem = None
        if problem:
            return BadInput(f"{where}: {problem}")
        return BadInput(f"cannot read {where} as JSON Lines: {text}")
    if source.format in ("csv", "tsv"):
        return BadInput(_csv_problem(where, text, source))
    return BadInput(f"cannot read {where}: {text}")


_CSV_COLUMN = re.compile(r"In CSV column #(\d+): Row #(\d+): (.*)")
_CSV_ROW = re.compile(r"CSV parse error: Row #(\d+): Expected (\d+) columns, got (\d+)")


def _csv_problem(where: str, text: str, source: Source) -> str:
    ragged = _CSV_ROW.search(text)
    if ragged:
        line, expected, got = ragged.groups()
        return (
            f"{where} line {line} has {got} fields, the header has {expected}; quote fields "
            "that contain the delimiter, and give every row the same number of fields"
        )
    cell = _CSV_COLUMN.search(text)
    if cell:
        index, line, detail = cell.groups()
        try:
            name = source.schema().names[int(index)]
        except (FlowsearchError, IndexError):
            name = f"#{index}"
        return (
            f"{where} line {line}, column {name!r}: {detail} (its first {MAX_BLOCK >> 20} MB "
            "had another type); give the column one type"
        )
    if "Empty CSV file" in text:
        return f"{where} has no header line; write the column names on its first line"
    return f"cannot read {where} as CSV: {text}"


def _kind(value: object) -> str:
    """A JSON value's kind, as error messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _lines(handle: IO[bytes], path: Path) -> Iterator[bytes]:
    """A text file's lines, each at most :data:`MAX_BLOCK` bytes (a longer one, or a file
    without line breaks such as ``/dev/zero``, is refused instead of read whole)."""
    while True:
        raw = handle.readline(MAX_BLOCK + 1)
        if not raw:
            return
        if len(raw) > MAX_BLOCK:
            raise BadInput(
                f"{path} has a line longer than {MAX_BLOCK >> 20} MiB, the most a corpus line "
                "may hold",
                "split the record, or check that the file is text with one record per line",
            )
        yield raw


def _json_problem(path: Path) -> str | None:
    """The first line of a JSON Lines file that pyarrow refuses, said plainly (error path only)."""
    opener: Any = gzip.open if path.suffix.lower() == ".gz" else open
    first: dict[str, tuple[str, int]] = {}
    with opener(path, "rb") as handle:
        for number, raw in enumerate(_lines(handle, path), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except RecursionError:
                return (
                    f"line {number} nests deeper than a JSON reader goes (an index stores at "
                    f"most {MAX_NESTING} levels); flatten it, or store it as a JSON string"
                )
            except UnicodeDecodeError as exc:
                return f"line {number} is not valid UTF-8 (byte {exc.start}); re-encode the file"
            except json.JSONDecodeError as exc:
                return (
                    f"line {number} is not valid JSON ({exc.msg}, column {exc.colno}); fix it "
                    "(one JSON object per line, control characters escaped)"
                )
            if not isinstance(record, dict):
                what = "a JSON array" if number == 1 and isinstance(record, list) else _kind(record)
                return (
                    f"line {number} is {what}, not a JSON object; write one object per line "
                    "(for a JSON array: jq -c '.[]')"
                )
            for key, value in record.items():
                if value is None:
                    continue
                kind = _kind(value)
                seen = first.setdefault(key, (kind, number))
                if seen[0] != kind:
                    return (
                        f"key {key!r} is {kind} on line {number} but {seen[0]} on line "
                        f"{seen[1]}; give each key one type"
                    )
    return None


#: Integers a column can hold (int64): JSON's larger integers would be read as inexact floats.
_INT64 = (-(2**63), 2**63 - 1)


def _float_leaves(array: pa.Array) -> Iterator[pa.Array]:
    """The floating-point arrays inside ``array`` (itself, list items, struct members)."""
    type_ = array.type
    if pa.types.is_floating(type_):
        yield array
    elif pa.types.is_list(type_) or pa.types.is_large_list(type_):
        yield from _float_leaves(array.flatten())
    elif pa.types.is_struct(type_):
        for i in range(type_.num_fields):
            yield from _float_leaves(array.field(i))


def _odd_numbers(batch: pa.RecordBatch, json_text: bool) -> bool:
    """Whether a batch read from text holds a float its file may hold otherwise: a whole number
    beyond int64 (an integer too large for a column, read as an inexact float) or, from JSON,
    NaN or infinity (a ``NaN`` literal, which JSON does not have)."""
    for column in batch.columns:
        for leaf in _float_leaves(column):
            if not len(leaf) or leaf.null_count == len(leaf):
                continue
            finite = pc.is_finite(leaf)
            if json_text and not pc.all(pc.fill_null(finite, True)).as_py():
                return True
            if pc.any(pc.fill_null(pc.greater_equal(pc.abs(leaf), 2.0**63), False)).as_py():
                return True
    return False


class _NotJson(ValueError):
    """A constant (NaN, Infinity) that JSON does not have."""


def _constant(name: str) -> NoReturn:
    raise _NotJson(name)


def _big_int(value: object) -> str | None:
    """Where in a JSON value an integer lies beyond int64 (its key path), or None."""
    keys = find_in_json(
        value,
        lambda v: isinstance(v, int) and not isinstance(v, bool)
        and not _INT64[0] <= v <= _INT64[1],
    )  # fmt: skip
    return None if keys is None else ".".join(str(k) for k in keys)


def _shown_id(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_INTEGER = re.compile(r"\s*[+-]?\d+\s*")


def _refuse_csv_integers(path: Path, where: str, delimiter: str) -> None:
    """Refuse the first CSV/TSV field holding an integer beyond int64 (naming line, column
    and id)."""
    opener: Any = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as handle:
        rows = csv.reader(handle, delimiter=delimiter)
        header = next(rows, [])
        for row in rows:
            for name, cell in zip(header, row):
                if _INTEGER.fullmatch(cell) and not _INT64[0] <= int(cell) <= _INT64[1]:
                    known = "id" in header and name != "id" and len(row) > header.index("id")
                    who = f" (id {_shown_id(row[header.index('id')])})" if known else ""
                    raise BadInput(
                        f"{where} line {rows.line_num}{who}: column {name!r} holds an integer "
                        "beyond 64 bits, which a column cannot hold (it would be stored as an "
                        "inexact float)",
                        "write it as a float (e.g. 1e20) if inexact is fine, or as text (e.g. "
                        "with a letter in front)",
                    )


def _refuse_big_numbers(path: Path, where: str, fmt: str) -> None:
    """Refuse the first number of a text file that a column would not hold as written (called
    when a batch held a float such a number becomes; returns when there is none)."""
    if fmt in ("csv", "tsv"):
        _refuse_csv_integers(path, where, "\t" if fmt == "tsv" else ",")
    elif fmt == "jsonl":
        _refuse_json_numbers(path, where)


def _refuse_json_numbers(path: Path, where: str) -> None:
    """Refuse the first line of a JSON Lines file with a NaN/Infinity literal or an integer
    beyond int64 (called when a batch held such a float; a float literal like ``1e20`` passes).

    Raises:
        BadInput: naming the line, the key and the fix.
    """
    opener: Any = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as handle:
        for number, raw in enumerate(_lines(handle, path), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"), parse_constant=_constant)
            except _NotJson as exc:
                raise BadInput(
                    f"{where} line {number} holds {exc}, which is not JSON (JSON has no NaN or "
                    "infinity)",
                    "write null for a missing number",
                ) from None
            except (ValueError, UnicodeDecodeError, RecursionError):
                continue  # pyarrow read it; its other problems are reported elsewhere
            try:
                key = _big_int(record)
            except RecursionError:  # nested too deep: the schema check says so
                continue
            if key is not None:
                known = isinstance(record, dict) and key != "id" and "id" in record
                who = f" (id {_shown_id(record['id'])})" if known else ""
                raise BadInput(
                    f"{where} line {number}{who}: {key!r} is an integer beyond 64 bits, which a "
                    "column cannot hold (it would be stored as an inexact float)",
                    "write it as a string, or as a float (e.g. 1e20) if inexact is fine",
                )


def records_table(records: Sequence[Mapping[str, object]]) -> pa.Table:
    """A list of dicts (what ``upsert`` and ``POST /upsert`` pass) as one Arrow table.

    Every record must have the same keys (a value may be None) and each key one kind of value
    (numbers may mix ints and floats).

    Raises:
        FlowsearchError: naming the record index and key that break this.
    """
    if not records:
        raise BadInput("no records given; pass at least one record")
    keys: list[str] | None = None
    kinds: dict[str, tuple[str, int]] = {}
    for i, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise BadInput(f"records[{i}] is {_kind(record)}, not an object (dict)")
        if keys is None:
            keys = list(record)
            bad = [k for k in keys if not isinstance(k, str)]
            if bad:
                raise BadInput(f"records[0] has a non-string key {bad[0]!r}; use names")
        elif record.keys() != set(keys):
            missing = [k for k in keys if k not in record]
            if missing:
                raise BadInput(
                    f"records[{i}] lacks key {missing[0]!r} that records[0] has; give every "
                    "record the same keys (null is fine)"
                )
            extra = next(k for k in record if k not in keys)
            raise BadInput(
                f"records[{i}] has key {extra!r} that records[0] lacks; give every record the "
                "same keys (null is fine)"
            )
        for key in keys:
            value = record[key]
            if value is None:
                continue
            if isinstance(value, (Mapping, list, tuple)):
                depth = _value_depth(value, MAX_NESTING)
                if depth > MAX_NESTING:
                    raise BadInput(
                        f"records[{i}][{key!r}] nests more than the {MAX_NESTING} levels an "
                        "index stores",
                        "flatten it, or store it as a JSON string",
                    )
            if _big_int(value) is not None:
                raise BadInput(
                    f"records[{i}][{key!r}] holds an integer beyond 64 bits, which a column "
                    "cannot hold",
                    "give it as a string, or as a float if inexact is fine",
                )
            kind = _kind(value)
            seen = kinds.setdefault(key, (kind, i))
            if seen[0] != kind:
                raise BadInput(
                    f"records[{i}][{key!r}] is {kind} but records[{seen[1]}][{key!r}] is "
                    f"{seen[0]}; give each key one type"
                )
    try:
        return pa.Table.from_pylist(list(records))
    except UnicodeEncodeError as exc:
        raise BadInput(
            f"records hold a string with a lone surrogate ({exc.object[:40]!a}), which is not "
            "valid Unicode and no index can store",
            "decode the text with errors='replace', or remove the character",
        ) from None
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        key = _failing_key(records, keys or [])
        raise BadInput(
            f"records: key {key!r} cannot be stored ({_line(str(exc))}); give it one type"
        ) from None


def _failing_key(records: Sequence[Mapping[str, object]], keys: list[str]) -> str:
    for key in keys:
        try:
            pa.array([record[key] for record in records])
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            return key
    return keys[0] if keys else "?"
