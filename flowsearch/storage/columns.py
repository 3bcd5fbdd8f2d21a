r"""The text and id columns of a corpus: their types checked, their values normalised.

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
from flowsearch.storage.readers import Source

__all__ = ["check_text_type", "normal_ids", "row_label", "text_strings", "valid_text_mask"]


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
        f"text column {name!r} in {source.name} holds {what}, not text; pass the column of "
        "passages as text_column=, or convert this one to strings"
    )


def normal_ids(array: pa.Array, source: Source, name: str, first_row: int) -> pa.Array:
    """Ids as int64 or string (the two id types an index stores); whole floats become int64."""
    type_ = array.type
    if pa.types.is_dictionary(type_):
        array, type_ = array.cast(type_.value_type), type_.value_type
    if pa.types.is_integer(type_):
        return array.cast(pa.int64())
    if pa.types.is_null(type_):  # all missing: refused as null ids by the caller
        return array.cast(pa.string())
    if (
        pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_string_view(type_)
    ):
        return array.cast(pa.string())
    if pa.types.is_floating(type_):
        whole = pc.and_(pc.is_finite(array), pc.equal(pc.floor(array), array))
        if not pc.all(pc.fill_null(whole, True)).as_py():
            at = pc.index(whole, False).as_py()
            raise BadInput(
                f"id {array[at].as_py()!r} in {name!r} of {source.name} "
                f"({row_label(source, first_row + at)}) is not a whole number; use integer or "
                "string ids"
            )
        return array.cast(pa.int64())
    raise BadInput(
        f"id column {name!r} in {source.name} holds {type_} values; ids must be integers or "
        "strings (pass id_column=None to number the rows)"
    )
