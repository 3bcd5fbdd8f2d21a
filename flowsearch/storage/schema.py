r"""The metadata schema: column types fixed by the first build, values checked on every write.

The first build records each metadata column's Arrow type in the manifest. A later write:

- casts a value to its column's type only when nothing is lost: both types are of one family
  (integers and floats are one, numbers; strings; booleans; dates and times; binary; lists;
  structs) and the value survives the cast and the cast back unchanged (``5.0`` goes into an
  integer column, ``5.5`` does not; ``"5"`` never goes into an integer column, nor ``5`` into a
  string column). Otherwise the write is refused before anything is written, naming the id, the
  column, the expected and the given type;
- adds a column that first appears (null for older rows), filterable at once;
- stores an all-null column of a new name as absent (a type cannot be learnt from nulls);
- refuses a nested value whose type cannot be stored or filtered (a list of mixed values, a
  map, a union) with one line;
- refuses a column name the index cannot keep apart from its own or another column
  (:func:`check_names`): an empty name, a name of the index's own columns (``id``, ``text``,
  ``vector``, ``raw``, in any case), a name starting with ``__`` (kept for the index's internal
  columns, such as the filter engine's ``__row``), and a name that differs only in case from
  another column (filters name columns in SQL, where ``Topic`` and ``topic`` are one name).

Example:
    >>> base = columns_of(pa.schema([("topic", pa.string())]))
    >>> table = pa.table({"topic": [5]})
    >>> conform(table, base, pa.array(["t1"]))
    Traceback (most recent call last):
    ...
    flowsearch.errors.BadInput: record 't1': column 'topic' expects string, got int64 (5); ...
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from flowsearch.errors import BadInput
from flowsearch.storage.records import SchemaColumn
from flowsearch.storage.rows import RESERVED_COLUMNS

__all__ = [
    "RESERVED_PREFIX",
    "arrow_schema",
    "check_names",
    "column_of",
    "columns_of",
    "conform",
    "merged",
    "type_of",
]

#: Metadata column names starting with this are the index's own (the filter engine's ``__row``
#: and ``__local``, and whatever internal column a later release adds): never a user's.
RESERVED_PREFIX = "__"


def check_names(names: Sequence[str], known: Sequence[str] = ()) -> None:
    """Refuse metadata column names the index cannot keep apart (see the module docstring).

    Args:
        names: the incoming metadata columns' names.
        known: the index's metadata columns (a write into an existing index): a new name
            may not differ from one of them only in case.

    Raises:
        BadInput: one line naming the column (and the one it clashes with) and the fix.
    """
    own = {c.lower(): c for c in RESERVED_COLUMNS}
    seen = {name.lower(): name for name in known}
    for name in names:
        if not name.strip():
            raise BadInput("a metadata column has an empty or blank name", "name every column")
        if name.startswith(RESERVED_PREFIX):
            raise BadInput(
                f"column {name!r} is reserved: names starting with {RESERVED_PREFIX!r} are the "
                "index's own",
                "rename or drop that column",
            )
        if name.lower() in own:
            raise BadInput(
                f"column {name!r} clashes with the index's own column {own[name.lower()]!r} "
                f"(the index keeps {', '.join(RESERVED_COLUMNS)}; names ignore case in filters)",
                "rename or drop that column",
            )
        other = seen.get(name.lower())
        if other is not None and other != name and name not in known:
            where = "the index's column" if other in known else "column"
            raise BadInput(
                f"column {name!r} differs only in case from {where} {other!r}, and filters "
                "cannot tell them apart (SQL names ignore case)",
                f"use {other!r}, or rename one of them",
            )
        seen.setdefault(name.lower(), name)


def column_of(name: str, type_: pa.DataType) -> SchemaColumn:
    """The manifest's record of a column."""
    blob = pa.schema([pa.field(name, type_)]).serialize().to_pybytes()
    return SchemaColumn(name=name, type=str(type_), arrow=base64.b64encode(blob).decode("ascii"))


def type_of(column: SchemaColumn) -> pa.DataType:
    """The Arrow type a manifest's column records."""
    buffer = pa.py_buffer(base64.b64decode(column.arrow))
    return pa.ipc.read_schema(buffer).field(0).type


def columns_of(schema: pa.Schema) -> tuple[SchemaColumn, ...]:
    """The manifest's records of a schema's columns (checked to be storable)."""
    for field in schema:
        _check_storable(field.name, field.type)
    return tuple(column_of(f.name, f.type) for f in schema if not pa.types.is_null(f.type))


def arrow_schema(columns: Sequence[SchemaColumn]) -> pa.Schema:
    """The Arrow schema of the manifest's columns."""
    return pa.schema([pa.field(c.name, type_of(c)) for c in columns])


def merged(base: Sequence[SchemaColumn], incoming: pa.Schema) -> tuple[SchemaColumn, ...]:
    """``base`` plus the columns of ``incoming`` it lacks (all-null ones stay absent)."""
    known = {c.name for c in base}
    extra = [f for f in incoming if f.name not in known and not pa.types.is_null(f.type)]
    for field in extra:
        _check_storable(field.name, field.type)
    return (*base, *(column_of(f.name, f.type) for f in extra))


def _check_storable(name: str, type_: pa.DataType) -> None:
    """Refuse types the index cannot store and filter on (maps, unions, dictionaries...)."""
    bad = None
    if pa.types.is_map(type_) or pa.types.is_union(type_) or pa.types.is_dictionary(type_):
        bad = str(type_)
    elif pa.types.is_list(type_) or pa.types.is_large_list(type_):
        item = type_.value_type
        if pa.types.is_null(item):
            return
        return _check_storable(name, item)
    elif pa.types.is_struct(type_) and type_.num_fields == 0:
        bad = "struct<> (an empty object: Parquet stores no struct without a field)"
    elif pa.types.is_struct(type_):
        for child in type_:
            _check_storable(f"{name}.{child.name}", child.type)
    elif pa.types.is_float16(type_) or pa.types.is_decimal256(type_):
        bad = str(type_)
    if bad:
        raise BadInput(
            f"column {name!r} has type {bad}, which the index cannot store and filter on",
            "convert it to strings, numbers, booleans, dates, lists or structs of those",
        )


def _family(type_: pa.DataType) -> str:
    if pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_):
        return "number"
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return "string"
    if pa.types.is_boolean(type_):
        return "bool"
    if pa.types.is_temporal(type_):
        return "time"
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        return "binary"
    if (
        pa.types.is_list(type_)
        or pa.types.is_large_list(type_)
        or pa.types.is_fixed_size_list(type_)
    ):
        return "list"
    if pa.types.is_struct(type_):
        return "struct"
    return str(type_)


def _compatible(given: pa.DataType, target: pa.DataType) -> bool:
    """Same family all the way down: list items and struct members (by name) too."""
    if pa.types.is_null(given):
        return True
    family = _family(given)
    if family != _family(target):
        return False
    if family == "list":
        return _compatible(given.value_type, target.value_type)
    if family == "struct":
        members = {f.name: f.type for f in target}
        return all(f.name in members and _compatible(f.type, members[f.name]) for f in given)
    return True


def _lossless(values: pa.Array, target: pa.DataType) -> pa.Array | None:
    """``values`` cast to ``target`` when every value survives the round trip, else None."""
    if values.type.equals(target):
        return values
    if pa.types.is_null(values.type):
        return pa.nulls(len(values), target)
    if not _compatible(values.type, target):
        return None
    try:
        cast = pc.cast(values, target, safe=True)
        back = pc.cast(cast, values.type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    same = pc.equal(back, values) if _family(target) not in ("list", "struct") else None
    if same is not None and not pc.all(pc.or_kleene(same, pc.is_null(values))).as_py():
        return None
    if same is None and back.to_pylist() != values.to_pylist():
        return None
    return cast


def _first_bad(values: pa.Array, target: pa.DataType) -> int:
    """The position of the first value that does not cast losslessly (values fail as a whole)."""
    for i in range(len(values)):
        if _lossless(values.slice(i, 1), target) is None:
            return i
    return 0


def conform(table: pa.Table, columns: Sequence[SchemaColumn], ids: pa.Array) -> pa.Table:
    """``table``'s metadata cast to the index's schema, new columns kept as they are.

    Args:
        table: the incoming rows' metadata columns.
        columns: the index's schema.
        ids: the incoming rows' ids (to name the record at fault), same length.

    Returns:
        The table with known columns cast to their recorded types.

    Raises:
        BadInput: a value that cannot be cast losslessly (naming the id, the column, the
            expected and the given type), or a column of a type the index cannot store.
    """
    types = {c.name: type_of(c) for c in columns}
    out = table
    for position, field in enumerate(table.schema):
        target = types.get(field.name)
        if target is None:
            _check_storable(field.name, field.type)
            continue
        values = table.column(position).combine_chunks()
        cast = _lossless(values, target)
        if cast is None:
            at = _first_bad(values, target)
            raise BadInput(
                f"record {ids[at].as_py()!r}: column {field.name!r} expects {target}, got "
                f"{field.type} ({_shown(values[at].as_py())})",
                f"give {field.name!r} {target} values, or rebuild the index with the new type",
            )
        out = out.set_column(position, pa.field(field.name, target), cast)
    return out


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
