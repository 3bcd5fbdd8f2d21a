"""The metadata schema (flowsearch.storage.schema): lossless casts only, new columns added,
nested values typed or refused in one line."""

from __future__ import annotations

import pyarrow as pa
import pytest

from flowsearch.errors import BadInput
from flowsearch.storage import schema

BASE = pa.schema(
    [
        ("topic", pa.string()),
        ("year", pa.int32()),
        ("count", pa.int64()),
        ("score", pa.float64()),
        ("ok", pa.bool_()),
        ("tags", pa.list_(pa.string())),
        ("sizes", pa.list_(pa.float64())),
        ("geo", pa.struct([("lat", pa.float64()), ("city", pa.string())])),
    ]
)
COLUMNS = schema.columns_of(BASE)


def _conform(column: str, values: pa.Array, ids: list | None = None) -> pa.Array:
    ids = ids if ids is not None else [f"t{i}" for i in range(len(values))]
    out = schema.conform(pa.table({column: values}), COLUMNS, pa.array(ids))
    return out.column(column).combine_chunks()


def test_the_manifest_records_each_columns_exact_arrow_type():
    assert [c.name for c in COLUMNS] == BASE.names
    assert [c.type for c in COLUMNS] == [str(f.type) for f in BASE]
    assert [schema.type_of(c) for c in COLUMNS] == list(BASE.types)
    assert schema.arrow_schema(COLUMNS).equals(BASE)
    # an all-null column has no type to learn: it is left out
    assert schema.columns_of(pa.schema([("x", pa.null()), ("y", pa.int8())]))[0].name == "y"


@pytest.mark.parametrize(
    ("column", "given", "want"),
    [
        ("score", pa.array([5, -2], pa.int64()), [5.0, -2.0]),  # int into float
        ("count", pa.array([5.0, -7.0]), [5, -7]),  # a whole float into int
        ("year", pa.array([2020, None], pa.int64()), [2020, None]),  # int64 that fits int32
        ("year", pa.array([199], pa.uint8()), [199]),  # any integer width that fits
        ("topic", pa.array(["sea"], pa.large_string()), ["sea"]),
        ("tags", pa.array([["a"], None, []], pa.list_(pa.large_string())), [["a"], None, []]),
        ("sizes", pa.array([[1, 2], []], pa.list_(pa.int64())), [[1.0, 2.0], []]),
    ],
)
def test_lossless_casts_within_a_family_are_taken(column, given, want):
    got = _conform(column, given)
    assert got.type.equals(BASE.field(column).type)
    assert got.to_pylist() == want


@pytest.mark.parametrize("column", BASE.names)
def test_null_goes_into_any_column(column):
    got = _conform(column, pa.nulls(2))
    assert got.type.equals(BASE.field(column).type) and got.to_pylist() == [None, None]


@pytest.mark.parametrize(
    ("column", "given", "expected", "got", "shown"),
    [
        ("count", pa.array([5.0, 5.5]), "int64", "double", "5.5"),  # a fraction is lost
        ("count", pa.array(["5", "6"]), "int64", "string", "'5'"),  # never text into a number
        ("topic", pa.array([7, 5]), "string", "int64", "7"),  # never a number into text
        ("year", pa.array([1, 2**40]), "int32", "int64", "1099511627776"),  # overflow
        ("ok", pa.array([1, 0]), "bool", "int64", "1"),  # numbers are not booleans
        ("score", pa.array([True, False]), "double", "bool", "True"),
        ("tags", pa.array(["a", "b"]), "list<item: string>", "string", "'a'"),
        ("sizes", pa.array([[1.0], [2.5, None]]), "list<item: double>", "list<item: double>",
         None),
    ],
)  # fmt: skip
def test_lossy_or_cross_family_values_are_refused_naming_id_column_and_types(
    column, given, expected, got, shown
):
    if shown is None:  # a list<double> into its own type: nothing to refuse
        assert _conform(column, given).to_pylist() == [[1.0], [2.5, None]]
        return
    with pytest.raises(BadInput) as info:
        _conform(column, given, ids=["first", "second"])
    message = str(info.value)
    bad = "second" if shown in ("5.5", "1099511627776") else "first"
    assert message.startswith(f"record {bad!r}: column {column!r} expects {expected}, got {got}")
    assert f"({shown})" in message and "\n" not in message
    assert info.value.fix  # names the way out


def test_the_first_bad_value_is_named_with_an_integer_id():
    values = pa.array([1.0, 2.0, 2.25, 3.5])
    with pytest.raises(
        BadInput, match=r"record 12: column 'count' expects int64, got double \(2.25"
    ):
        schema.conform(pa.table({"count": values}), COLUMNS, pa.array([10, 11, 12, 13]))


def test_a_long_value_is_shortened_in_the_message():
    with pytest.raises(BadInput) as info:
        _conform("count", pa.array(["x" * 200]))
    assert "..." in str(info.value) and "x" * 60 not in str(info.value)


def test_new_columns_are_added_and_all_null_ones_stay_absent():
    incoming = pa.schema(
        [("topic", pa.string()), ("lang", pa.string()), ("empty", pa.null()), ("n", pa.int16())]
    )
    grown = schema.merged(COLUMNS, incoming)
    assert [c.name for c in grown] == [*BASE.names, "lang", "n"]
    assert grown[: len(COLUMNS)] == COLUMNS  # known columns keep their recorded type
    assert schema.type_of(grown[-1]) == pa.int16()
    table = pa.table({"lang": ["en"], "year": pa.array([2001], pa.int64())})
    out = schema.conform(table, COLUMNS, pa.array(["a"]))
    assert out.schema.field("lang").type == pa.string()  # new: kept as it came
    assert out.schema.field("year").type == pa.int32()  # known: cast to its type
    assert schema.merged(COLUMNS, pa.schema([])) == COLUMNS


def test_nested_lists_and_structs_are_typed_columns():
    nested = pa.schema(
        [
            ("tags", pa.list_(pa.string())),
            ("pairs", pa.list_(pa.list_(pa.int64()))),
            ("geo", pa.struct([("lat", pa.float64()), ("names", pa.list_(pa.string()))])),
            ("empty_lists", pa.list_(pa.null())),
        ]
    )
    cols = schema.columns_of(nested)
    assert [schema.type_of(c) for c in cols] == list(nested.types)
    assert cols[2].type == "struct<lat: double, names: list<item: string>>"
    got = _conform("geo", pa.array([{"lat": 59.9, "city": "Oslo"}], BASE.field("geo").type))
    assert got.to_pylist() == [{"lat": 59.9, "city": "Oslo"}]


def test_a_struct_value_is_cast_losslessly_or_refused_in_one_line():
    """A struct whose member came as an int (JSON ``1`` for ``1.0``) is one family: cast like
    any number. The comparison behind the rule must handle structs (pyarrow has no ``equal``
    kernel for them)."""
    given = pa.array([{"lat": 60, "city": "Oslo"}])
    got = _conform("geo", given)
    assert got.type.equals(BASE.field("geo").type)
    assert got.to_pylist() == [{"lat": 60.0, "city": "Oslo"}]
    with pytest.raises(BadInput, match=r"record 't0': column 'geo' expects struct<lat: double"):
        _conform("geo", pa.array([{"lat": "north", "city": "Oslo"}]))


@pytest.mark.parametrize(
    ("type_", "name"),
    [
        (pa.map_(pa.string(), pa.int64()), "m"),
        (pa.dense_union([pa.field("a", pa.int64()), pa.field("b", pa.string())]), "m"),
        (pa.dictionary(pa.int32(), pa.string()), "m"),
        (pa.list_(pa.map_(pa.string(), pa.int64())), "m"),  # inside a list
        (pa.struct([("inner", pa.map_(pa.string(), pa.int64()))]), "m.inner"),  # in a struct
        (pa.struct([]), "m"),  # an empty object ({}): Parquet cannot write it (fuzz found it)
        (pa.list_(pa.struct([])), "m"),
    ],
)
def test_maps_unions_and_dictionaries_are_refused_in_one_line(type_, name):
    for call in (
        lambda: schema.columns_of(pa.schema([("m", type_)])),
        lambda: schema.merged(COLUMNS, pa.schema([("m", type_)])),
        lambda: schema.conform(pa.table({"m": pa.nulls(1, type_)}), COLUMNS, pa.array(["a"])),
    ):
        with pytest.raises(BadInput, match=f"column {name!r} has type .* cannot store") as info:
            call()
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("column", "given"),
    [
        ("tags", pa.array([[5]])),  # a number into list<string>
        ("tags", pa.array([[True]])),  # a boolean into list<string>
        ("sizes", pa.array([["5"]])),  # text into list<double>
        ("geo", pa.array([{"lat": 1.0, "city": 5}])),  # a number into a string member
    ],
)
def test_the_family_rule_holds_inside_lists_and_structs(column, given):
    with pytest.raises(BadInput, match=f"column {column!r} expects"):
        _conform(column, given)
