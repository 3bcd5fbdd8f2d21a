"""Finding live rows by id across a version's segments (flowsearch.storage.lookup), and the ids
an index accepts (``typed_ids``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from segment_helpers import add_segment

from flowsearch.errors import BadInput
from flowsearch.storage import keys
from flowsearch.storage.layout import KEY_IDS_FILE
from flowsearch.storage.lookup import find_live, typed_ids
from flowsearch.storage.rows import RowReader
from flowsearch.storage.writer import Writer


def _version(tmp_path, segments, deleted=None):
    """A writer whose new version holds one staged segment per list of ids; ``deleted`` maps a
    segment's position to the local rows to delete."""
    writer = Writer(tmp_path, None, True)  # no lock needed: nothing is published
    names = [add_segment(writer, ids, seed=at).name for at, ids in enumerate(segments)]
    for at, rows in (deleted or {}).items():
        writer.delete_rows(names[at], np.array(rows))
    return writer, names


def _found(writer, ids):
    return sorted(find_live(writer.segments, writer.segment_path, ids))


@pytest.mark.parametrize("key_ids", [True, False], ids=["key_ids", "older-segments"])
def test_string_ids_across_segments(tmp_path, key_ids):
    writer, (s1, s2) = _version(tmp_path, [["a", "b", "c"], ["d", "e"]])
    if not key_ids:
        _without_key_ids(writer)
    ids = pa.array(["e", "zz", "a", "c"])
    assert _found(writer, ids) == [(0, s2, 1), (2, s1, 0), (3, s1, 2)]
    assert _found(writer, pa.array(["nope"])) == []


def test_integer_ids_across_segments(tmp_path):
    writer, (s1, s2) = _version(tmp_path, [[10, -3, 2**62], [7, 0]])
    ids = pa.array([0, 2**62, 11, -3], pa.int64())
    assert _found(writer, ids) == [(0, s2, 1), (1, s1, 2), (3, s1, 1)]


def test_deleted_rows_are_not_live(tmp_path):
    """An upsert leaves the old row deleted in its segment and the new one live in another:
    only the live one is found."""
    writer, (s1, s2) = _version(tmp_path, [["a", "b", "c"], ["b", "x"]], deleted={0: [1, 2]})
    assert _found(writer, pa.array(["b", "c", "a"])) == [(0, s2, 0), (2, s1, 0)]
    writer.delete_rows(s2, np.array([0]))
    assert _found(writer, pa.array(["b"])) == []


def _without_key_ids(writer):
    """The segments as an older release wrote them: no key_ids.arrow."""
    for at, seg in enumerate(writer.segments):
        (writer.segment_path(seg) / KEY_IDS_FILE).unlink()
        files = {k: v for k, v in seg.files.items() if k != KEY_IDS_FILE}
        writer.segments[at] = seg.model_copy(update={"files": files})


@pytest.mark.parametrize("key_ids", [True, False], ids=["key_ids", "older-segments"])
def test_a_hash_collision_is_confirmed_by_the_stored_id(tmp_path, monkeypatch, key_ids):
    """Every string shares one key: each lookup meets every row, and only the row holding the
    very id is found (confirmed by key_ids.arrow without reading the rows; in a segment
    without it, by the rows' id column)."""
    real = keys.keys_of

    def colliding(ids):  # every string has the same key: each lookup sees every row
        ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        if pa.types.is_integer(ids.type):
            return real(ids)
        return np.full(len(ids), 42, dtype=np.uint64)

    monkeypatch.setattr(keys, "keys_of", colliding)
    writer, (s1, s2) = _version(tmp_path, [["a", "b", "c"], ["d", "b2"]], deleted={0: [0]})
    reads = []
    values_at = RowReader.values_at
    monkeypatch.setattr(
        RowReader, "values_at", lambda self, *a, **k: reads.append(1) or values_at(self, *a, **k)
    )
    if not key_ids:
        _without_key_ids(writer)
    assert _found(writer, pa.array(["b2", "c", "zz", "a"])) == [(0, s2, 1), (1, s1, 2)]
    assert bool(reads) is not key_ids  # the rows are read only without key_ids.arrow


def test_a_segment_without_keys_is_refused(tmp_path):
    writer, (s1,) = _version(tmp_path, [["a"]])
    writer.segments[0] = writer.segments[0].model_copy(update={"keys": None})
    with pytest.raises(BadInput, match=f"segment {s1} has no id keys"):
        find_live(writer.segments, writer.segment_path, pa.array(["a"]))


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ([17, "17", "-3", "+5", " 42 ", "0"], [17, 17, -3, 5, 42, 0]),
        ([2**63 - 1, -(2**63), str(2**63 - 1)], [2**63 - 1, -(2**63), 2**63 - 1]),
    ],
)
def test_an_integer_index_takes_integers_and_their_canonical_decimal_text(given, want):
    got = typed_ids(given, "int")
    assert got.type == pa.int64() and got.to_pylist() == want


def test_numpy_integers_are_integers():
    assert typed_ids([np.int64(7), np.int32(-2)], "int").to_pylist() == [7, -2]
    assert typed_ids([np.int64(7)], "string").to_pylist() == ["7"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("²", "not an integer"),  # a digit to Python's str.isdigit, not ASCII
        ("٣", "not an integer"),  # an Arabic-Indic three
        ("017", "not an integer"),  # not canonical: which id did the caller mean?
        ("1e3", "not an integer"),
        ("", "not an integer"),
        ("0x1f", "not an integer"),
        (1.0, "is a float"),
        (float("nan"), "is a float"),
        (True, "is a bool"),
        (None, "is a NoneType"),
        (2**63, "does not fit in 64 bits"),
        (-(2**63) - 1, "does not fit in 64 bits"),
        (str(2**63), "does not fit in 64 bits"),
    ],
)
def test_an_integer_index_refuses_what_is_not_one_of_its_ids(bad, message):
    with pytest.raises(BadInput, match=message) as info:
        typed_ids(["1", bad], "int", param="ids")
    assert info.value.param == "ids" and "\n" not in str(info.value)


def test_a_string_index_takes_strings_and_integers_as_their_text():
    got = typed_ids(["a", 17, "017", "²", -4], "string")
    assert got.type == pa.string() and got.to_pylist() == ["a", "17", "017", "²", "-4"]
    for bad in (1.5, False, None, b"bytes"):
        with pytest.raises(BadInput, match="ids are integers or strings"):
            typed_ids([bad], "string")
