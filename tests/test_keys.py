"""A segment's id keys (flowsearch.storage.keys): hashed, sorted, found by binary search."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from flowsearch.errors import IndexDamaged
from flowsearch.storage import keys
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.layout import KEY_IDS_FILE, KEY_ROWS_FILE, KEYS_FILE


def test_integer_ids_are_their_own_keys():
    ids = pa.array([5, -1, 0, 2**63 - 1, -(2**63)], pa.int64())
    got = keys.keys_of(ids)
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got.view(np.int64), ids.to_numpy())
    # any integer width, chunked or not, gives the same keys
    narrow = pa.chunked_array([pa.array([5, -1], pa.int8()), pa.array([0], pa.int8())])
    np.testing.assert_array_equal(keys.keys_of(narrow), got[:3])
    np.testing.assert_array_equal(keys.keys_of(pa.array([0, 5], pa.uint16())), [0, 5])


def test_string_keys_are_stable_hashes_of_the_text():
    got = keys.keys_of(pa.array(["a", "b", "a", "ü", ""]))
    assert got.dtype == np.uint64 and got[0] == got[2] and len(set(got.tolist())) == 4
    # the same text always has the same key (a key index written by another process reads)
    again = keys.keys_of(pa.chunked_array([pa.array(["ü"]), pa.array(["b"])]))
    assert keys.keys_of(pa.array(["b"], pa.large_string())).tolist() == [got[1]]
    assert again.tolist() == [got[3], got[1]]


@pytest.mark.parametrize(
    "ids",
    [pa.array(["c", "a", "b", "d", "e"]), pa.array([30, -10, 20, 0, 2**40], pa.int64())],
)
def test_lookup_gives_each_ids_local_row(ids):
    index = KeyIndex.build(ids)
    assert np.all(index.keys[:-1] <= index.keys[1:])  # sorted for the binary search
    assert sorted(index.rows.tolist()) == list(range(len(ids)))
    wanted = pa.array([ids[3].as_py(), ids[0].as_py(), ids[4].as_py()], ids.type)
    assert index.lookup(wanted) == [(0, 3), (1, 0), (2, 4)]
    missing = pa.array(["zz"] if pa.types.is_string(ids.type) else [7], ids.type)
    assert index.lookup(missing) == []
    assert index.lookup(pa.array([], ids.type)) == []


def test_a_repeated_id_gives_every_row_holding_it():
    index = KeyIndex.build(pa.array(["x", "y", "x"]))  # an old row and its replacement
    assert sorted(index.lookup(pa.array(["x"]))) == [(0, 0), (0, 2)]


def _colliding(monkeypatch):
    real = keys.keys_of

    def colliding(ids):
        ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        if pa.types.is_integer(ids.type):
            return real(ids)
        return np.array([len(s) for s in ids.to_pylist()], dtype=np.uint64)  # key = length

    monkeypatch.setattr(keys, "keys_of", colliding)


def test_colliding_string_keys_are_told_apart_by_the_stored_ids(monkeypatch, tmp_path):
    """Two strings may share a key: the ids stored in key order confirm the match exactly,
    as built and as saved and memory-mapped again."""
    _colliding(monkeypatch)
    built = KeyIndex.build(pa.array(["ab", "cd", "e", "fg", "cd"]))
    built.save(tmp_path)
    for index in (built, KeyIndex.load(tmp_path, 5, ids=True)):
        assert index.exact
        assert index.lookup(pa.array(["xy"])) == []  # same key as three rows, none its id
        assert sorted(index.lookup(pa.array(["fg", "cd", "z", "e"]))) == [
            (0, 3), (1, 1), (1, 4), (3, 2)
        ]  # fmt: skip


def test_without_stored_ids_colliding_keys_are_all_candidates(monkeypatch, tmp_path):
    """A segment written before key_ids.arrow: lookup returns every row of a key, and the
    caller confirms against the rows' ids (flowsearch.storage.lookup does; see test_lookup)."""
    _colliding(monkeypatch)
    KeyIndex.build(pa.array(["ab", "cd", "e", "fg"])).save(tmp_path)
    (tmp_path / KEY_IDS_FILE).unlink()
    index = KeyIndex.load(tmp_path, 4)
    assert not index.exact
    assert sorted(index.lookup(pa.array(["xy"]))) == [(0, 0), (0, 1), (0, 3)]
    assert index.lookup(pa.array(["z"])) == [(0, 2)]


def test_save_and_load_memory_mapped(tmp_path):
    ids = pa.array([f"doc-{i}" for i in range(50)])
    built = KeyIndex.build(ids)
    names = [KEYS_FILE, KEY_ROWS_FILE, KEY_IDS_FILE]
    assert built.save(tmp_path) == names
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    loaded = KeyIndex.load(tmp_path, 50, ids=True)
    assert isinstance(loaded.keys, np.memmap) and isinstance(loaded.rows, np.memmap)
    np.testing.assert_array_equal(loaded.keys, built.keys)
    np.testing.assert_array_equal(loaded.rows, built.rows)
    assert loaded.ids is not None and loaded.ids.equals(built.ids)
    assert loaded.lookup(pa.array(["doc-17", "doc-49"])) == [(0, 17), (1, 49)]
    loaded.check(tmp_path)
    assert KeyIndex.load(tmp_path, 50).ids is None  # not asked for: not opened


def test_integer_ids_need_no_stored_ids(tmp_path):
    index = KeyIndex.build(pa.array([4, 2, 9], pa.int64()))
    assert index.ids is None and index.save(tmp_path) == [KEYS_FILE, KEY_ROWS_FILE]
    assert not (tmp_path / KEY_IDS_FILE).exists()


def test_stored_ids_that_do_not_match_the_segment_or_its_keys_are_damage(tmp_path):
    KeyIndex.build(pa.array(["a", "b", "c"])).save(tmp_path)
    with pytest.raises(IndexDamaged, match="does not hold its segment's ids"):
        keys.load_ids(tmp_path, 4)  # the segment has 4 rows, the file 3 ids
    keys.save_ids(tmp_path, pa.array(["a", "b", "x"]))  # another id where "c" was
    index = KeyIndex.load(tmp_path, 3, ids=True)
    with pytest.raises(IndexDamaged, match="do not match its keys"):
        index.check(tmp_path)
    (tmp_path / KEY_IDS_FILE).write_bytes(b"not arrow")
    with pytest.raises(IndexDamaged, match="unreadable"):
        KeyIndex.load(tmp_path, 3, ids=True)


def test_load_refuses_files_that_do_not_match_the_segment(tmp_path):
    KeyIndex.build(pa.array([1, 2, 3], pa.int64())).save(tmp_path)
    with pytest.raises(IndexDamaged, match="do not match its rows"):
        KeyIndex.load(tmp_path, 4)  # the segment has 4 rows, the keys 3
    np.save(tmp_path / KEYS_FILE, np.array([1, 2, 3], dtype=np.int64))  # wrong dtype
    with pytest.raises(IndexDamaged, match="do not match its rows"):
        KeyIndex.load(tmp_path, 3)
    (tmp_path / KEYS_FILE).write_bytes(b"not numpy")
    with pytest.raises(IndexDamaged, match="unreadable"):
        KeyIndex.load(tmp_path, 3)
    (tmp_path / KEYS_FILE).unlink()
    with pytest.raises(FileNotFoundError):  # a vanished version: the caller retries
        KeyIndex.load(tmp_path, 3)
