r"""A corpus's columns: the text and id columns present and typed, values normalised, the
metadata columns' types unified across files.

A text column must hold text: strings (or dictionary-encoded strings), or binary that is valid
UTF-8; numbers, booleans, lists, structs and dates are refused rather than indexed as "3.0".
Ids are stored as int64 or string; float ids are normalised to int64 when every one is whole.
Every refusal is one :class:`~flowsearch.errors.FlowsearchError` line naming the column, the
source and, when known, the row.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from flowsearch.errors import BadInput
from flowsearch.ingest.readers import Source

__all__ = [
    "MAX_ID_CHARS",
    "check_id_length",
    "check_text_type",
    "checked_columns",
    "metadata_schema",
    "normal_ids",
    "row_label",
    "text_strings",
    "valid_text_mask",
]


#: Longest a string id may be, in characters: one limit for every write and lookup (building,
#: ``upsert``, ``delete``, the command line and the HTTP API).
MAX_ID_CHARS = 1_000


def check_id_length(value: str, where: str, param: str = "ids") -> None:
    """Refuse a string id longer than :data:`MAX_ID_CHARS` (``where``: which id, in words)."""
    if len(value) > MAX_ID_CHARS:
        raise BadInput(
            f"{where} is {len(value):,} characters long; ids may have at most {MAX_ID_CHARS:,}",
            "use shorter ids (a hash of a long key, for instance)",
            param=param,
        )


def row_label(source: Source, index: int) -> str:
    """Where a 0-based row is, as the user counts: ``records[i]``, else row i + 1."""
    return f"records[{index}]" if source.format == "table" else f"row {index + 1}"


def valid_text_mask(text: pa.ChunkedArray) -> pa.ChunkedArray:
    """True where a (string) text is present and not blank."""
    blank = pc.equal(pc.utf8_trim_whitespace(text), "")
    return pc.and_(pc.is_valid(text), pc.invert(pc.fill_null(blank, True)))


_BAD_UTF8 = re.compile(r"index (\d+)")


def text_strings(
    column: pa.ChunkedArray, source: Source, name: str, first_row: int = 0
) -> pa.ChunkedArray:
    """A text column as checked UTF-8 strings (binary that is valid UTF-8 counts as text)."""
    type_ = column.type
    if pa.types.is_dictionary(type_):
        column = column.cast(type_.value_type)
    elif pa.types.is_null(type_):
        return column.cast(pa.string())
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        as_text = pa.string() if pa.types.is_binary(column.type) else pa.large_string()
        column = pa.chunked_array([c.view(as_text) for c in column.chunks], as_text)
    offset = first_row
    for chunk in column.chunks:
        try:
            chunk.validate(full=True)
        except pa.ArrowInvalid as exc:
            found = _BAD_UTF8.search(str(exc))
            where = row_label(source, offset + int(found.group(1))) if found else "a row"
            raise BadInput(
                f"{name!r} in {source.name} holds bytes that are not valid UTF-8 ({where}); "
                "re-encode the text as UTF-8"
            ) from None
        offset += len(chunk)
    return column.cast(pa.string())


def check_text_type(type_: pa.DataType, source: Source, name: str) -> None:
    """Refuse text columns that are not text (numbers would be indexed as "3.0")."""
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    ok = (
        pa.types.is_string,
        pa.types.is_large_string,
        pa.types.is_binary,
        pa.types.is_large_binary,
        pa.types.is_null,
    )
    if pa.types.is_string_view(type_) or any(test(type_) for test in ok):
        return
    if pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_):
        what = f"numbers ({type_})"
    elif pa.types.is_boolean(type_):
        what = "booleans"
    elif (
        pa.types.is_list(type_)
        or pa.types.is_large_list(type_)
        or pa.types.is_fixed_size_list(type_)
    ):
        what = f"lists ({type_})"
    elif pa.types.is_struct(type_) or pa.types.is_map(type_):
        what = f"objects ({type_})"
    else:
        what = f"{type_} values"
    raise BadInput(
        f"text column {name!r} in {source.name} holds {what}, not text",
        "name the column of passages with {text_column=...}, or convert this one to strings",
        cli="name the column of passages with --text-column, or convert this one to strings",
        http='give every record a "text" field holding a string',
        param="text_column",
    )


def normal_ids(array: pa.Array, source: Source, name: str, first_row: int) -> pa.Array:
    """Ids as int64 or string (the two id types an index stores); whole floats become int64."""
    type_ = array.type
    if pa.types.is_dictionary(type_):
        array, type_ = array.cast(type_.value_type), type_.value_type
    if pa.types.is_integer(type_):
        return _int64_ids(array, source, name)
    if pa.types.is_null(type_):  # all missing: refused as null ids by the caller
        return array.cast(pa.string())
    if (
        pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_string_view(type_)
    ):
        strings = array.cast(pa.string())
        long = pc.greater(pc.utf8_length(strings), MAX_ID_CHARS)
        if pc.any(long).as_py():
            at = pc.index(long, True).as_py()
            where = f"an id in {name!r} of {source.name} ({row_label(source, first_row + at)})"
            check_id_length(strings[at].as_py(), where, param="id_column")
        return strings
    if pa.types.is_floating(type_):
        whole = pc.and_(pc.is_finite(array), pc.equal(pc.floor(array), array))
        if not pc.all(pc.fill_null(whole, True)).as_py():
            at = pc.index(whole, False).as_py()
            raise BadInput(
                f"id {array[at].as_py()!r} in {name!r} of {source.name} "
                f"({row_label(source, first_row + at)}) is not a whole number; use integer or "
                "string ids"
            )
        return _int64_ids(array, source, name)
    raise BadInput(
        f"id column {name!r} in {source.name} holds {type_} values; ids must be integers or "
        "strings (pass id_column=None to number the rows)"
    )


def _int64_ids(array: pa.Array, source: Source, name: str) -> pa.Array:
    """Integer (or whole float) ids as int64, refusing one beyond its range in one line."""
    try:
        return array.cast(pa.int64())
    except (pa.ArrowInvalid, OverflowError):
        big = max((v for v in array.to_pylist() if v is not None), key=abs)  # the error path
        raise BadInput(
            f"id column {name!r} in {source.name} holds {big!r}, beyond the 64-bit integers "
            "ids are stored as",
            "use smaller integer ids, or string ids",
        ) from None


def checked_columns(
    schemas: list[pa.Schema], sources: list[Source], text_column: str, id_column: str | None
) -> str | None:
    """Check the text and id columns are there; the id column to use (None: row numbers)."""
    for schema, source in zip(schemas, sources):
        names = schema.names
        if text_column not in names:
            raise BadInput(
                f"no text column {text_column!r} in {source.name} (columns: {', '.join(names)})",
                "name the text column with {text_column=...}",
                cli="name the text column with --text-column",
                http='give every record a "text" field',
                param="text_column",
            )
        if id_column is not None and id_column != "id" and id_column not in names:
            raise BadInput(
                f"no id column {id_column!r} in {source.name} (columns: {', '.join(names)})",
                "name the id column with {id_column=...} (id_column=None numbers the rows)",
                cli="name the id column with --id-column (leave out an `id` column to number "
                "the rows)",
                param="id_column",
            )
        other_id = [n for n in names if n.lower() == "id" and n != id_column]
        if id_column is not None and id_column != "id" and other_id:
            # it would be metadata, and "id" is the index's own name: say which column it is
            raise BadInput(
                f"{source.name} has a column {other_id[0]!r}, but the ids are read from "
                f"{id_column!r}, so {other_id[0]!r} would be kept as metadata, and that name is "
                "the index's own",
                f"pass id_column={other_id[0]!r} to read the ids from it, or rename or drop it",
                cli=f"pass --id-column {other_id[0]} to read the ids from it, or rename or drop it",
                param="id_column",
            )
        check_text_type(schema.field(text_column).type, source, text_column)
    if id_column == "id":  # the default: use it when there, row numbers when not
        has_id = ["id" in schema.names for schema in schemas]
        if not any(has_id):
            return None
        if not all(has_id):
            missing = sources[has_id.index(False)].name
            raise BadInput(f"{missing} has no 'id' column but other files do; add it")
    return id_column


def metadata_schema(schemas: list[pa.Schema], sources: list[Source], names: list[str]) -> pa.Schema:
    """The metadata columns' types, unified across files (see the module docstring)."""
    for schema, source in zip(schemas, sources):
        missing = [c for c in names if c not in schema.names]
        if missing:
            raise BadInput(
                f"{source.name} has no column {missing[0]!r} that {sources[0].name} has; give "
                "every file the same columns (null values are fine)"
            )
    parts = [pa.schema([schema.field(c) for c in names]) for schema in schemas]
    try:
        return pa.unify_schemas(parts, promote_options="permissive")
    except (pa.ArrowException, ValueError, TypeError):
        pass
    for column in names:
        typed = [(p.field(column).type, s.name) for p, s in zip(parts, sources)]
        typed = [(t, name) for t, name in typed if not pa.types.is_null(t)]
        try:
            pa.unify_schemas(
                [pa.schema([(column, t)]) for t, _ in typed], promote_options="permissive"
            )
        except (pa.ArrowException, ValueError, TypeError):
            (t1, f1), (t2, f2) = next((a, b) for a in typed for b in typed if a[0] != b[0])
            raise BadInput(
                f"column {column!r} is {t1} in {f1} but {t2} in {f2}; give it one type in "
                "every file"
            ) from None
    raise BadInput("the files' columns cannot be combined; give them the same types")
