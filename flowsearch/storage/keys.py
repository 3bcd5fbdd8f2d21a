r"""A segment's ids, hashed and sorted: finding the rows of given ids without reading them all.

An upsert or a delete must find which live row holds each id it names. Reading every id of
every segment costs the whole corpus; instead each segment stores its ids' 64-bit keys, sorted,
beside the local row of each (``keys.npy``, ``key_rows.npy``, memory-mapped when read): a
lookup is a binary search per id and segment. Integer ids are their own keys; a string id's key
is the first 8 bytes of its BLAKE2b digest, so two strings can share a key. A string-id segment
therefore also stores its ids themselves in key order (``key_ids.arrow``, Arrow IPC,
memory-mapped): a key match is confirmed by comparing the id at the same sorted position, exact
and at the cost of the ids asked for (a segment written before this file existed has none:
:meth:`KeyIndex.lookup` then returns unconfirmed candidates, which callers confirm against the
rows' stored ids).

Example:
    >>> keys = KeyIndex.build(pa.array(["a", "b", "c"]))
    >>> [row for _, row in keys.lookup(pa.array(["c", "x"]))]
    [2]
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flowsearch.atomic import atomic_write
from flowsearch.errors import IndexDamaged
from flowsearch.storage.layout import KEY_IDS_FILE, KEY_ROWS_FILE, KEYS_FILE

__all__ = ["KeyIndex", "keys_of", "load_ids", "save_ids"]


def keys_of(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """uint64 (n,): the keys of int64 or string ids."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if pa.types.is_integer(ids.type):
        values = np.asarray(ids.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
        return values.view(np.uint64)
    out = np.empty(len(ids), dtype=np.uint64)
    for i, value in enumerate(ids.to_pylist()):
        digest = hashlib.blake2b(str(value).encode("utf-8"), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "little")
    return out


class KeyIndex:
    """Sorted keys of one segment's ids, with each key's local row (and, for string ids, the
    id itself).

    Args:
        keys: uint64 (n,), ascending.
        rows: int64 (n,), the local row of each key.
        ids: the id of each key (string, in key order), or None (integer ids, or a segment
            written without ``key_ids.arrow``).
    """

    def __init__(self, keys: np.ndarray, rows: np.ndarray, ids: pa.Array | None = None) -> None:
        self.keys = keys
        self.rows = rows
        self.ids = ids

    @classmethod
    def build(cls, ids: pa.Array | pa.ChunkedArray) -> KeyIndex:
        """The key index of a segment whose local row ``i`` has id ``ids[i]``."""
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        keys = keys_of(ids)
        order = np.argsort(keys, kind="stable")
        ordered = None
        if not pa.types.is_integer(ids.type):
            ordered = ids.take(pa.array(order)).cast(pa.large_string())
        return cls(keys[order], order.astype(np.int64), ordered)

    def save(self, directory: Path) -> list[str]:
        """Write the files into ``directory`` (each atomically); returns their names."""
        for name, array in ((KEYS_FILE, self.keys), (KEY_ROWS_FILE, self.rows)):

            def save(tmp: str, array: np.ndarray = array) -> None:
                with open(tmp, "wb") as handle:
                    np.save(handle, array, allow_pickle=False)

            atomic_write(directory / name, save)
        if self.ids is None:
            return [KEYS_FILE, KEY_ROWS_FILE]
        save_ids(directory, self.ids)
        return [KEYS_FILE, KEY_ROWS_FILE, KEY_IDS_FILE]

    @classmethod
    def load(cls, directory: Path, n_rows: int, *, ids: bool = False) -> KeyIndex:
        """Open the files :meth:`save` wrote (memory-mapped); ``ids``: the ids in key order too
        (only when the segment has ``key_ids.arrow``: its manifest record names it).

        Raises:
            FileNotFoundError: a file vanished.
            IndexDamaged: not the key index of an ``n_rows``-row segment.
        """
        try:
            keys = np.load(directory / KEYS_FILE, mmap_mode="r", allow_pickle=False)
            rows = np.load(directory / KEY_ROWS_FILE, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            raise IndexDamaged(
                f"the ids of {directory} are unreadable ({exc})", "rebuild"
            ) from None
        if (
            keys.dtype != np.uint64
            or rows.dtype != np.int64
            or keys.shape != (n_rows,)
            or (rows.shape != (n_rows,))
        ):
            raise IndexDamaged(f"the ids of {directory} do not match its rows", "rebuild it")
        return cls(keys, rows, load_ids(directory, n_rows) if ids else None)

    def lookup(
        self, ids: pa.Array | pa.ChunkedArray, keys: np.ndarray | None = None
    ) -> list[tuple[int, int]]:
        """``(position in ids, local row)`` for every row whose key matches an id's. Integer
        ids match exactly; string ids are confirmed against the stored ids when this index has
        them (:attr:`exact`), else they are candidates the caller confirms. ``keys``: the ids'
        keys when the caller has them (:func:`keys_of`; one hashing for every segment)."""
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        wanted = keys_of(ids) if keys is None else keys
        lo = np.searchsorted(self.keys, wanted, side="left")
        hi = np.searchsorted(self.keys, wanted, side="right")
        at = np.flatnonzero(hi > lo)
        counts = (hi - lo)[at]
        positions = np.repeat(at, counts)  # one entry per (id, key match)
        sorted_at = np.repeat(lo[at], counts) + _ranks(counts)
        if self.ids is not None and len(positions):
            given = ids.take(pa.array(positions)).cast(pa.large_string())
            same = pc.equal(self.ids.take(pa.array(sorted_at)), given)
            keep = np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
            positions, sorted_at = positions[keep], sorted_at[keep]
        rows = np.asarray(self.rows[sorted_at]) if len(sorted_at) else np.zeros(0, np.int64)
        return [(int(p), int(r)) for p, r in zip(positions, rows, strict=True)]

    @property
    def exact(self) -> bool:
        """Whether :meth:`lookup` confirms string ids itself (the segment has their sidecar)."""
        return self.ids is not None

    def check(self, directory: Path) -> None:
        """Check that the stored ids hash to the stored keys (``info --verify``): a sidecar
        that disagrees would let a 64-bit collision through, or miss a row.

        Raises:
            IndexDamaged: naming the segment's directory.
        """
        if self.ids is not None and not np.array_equal(keys_of(self.ids), self.keys):
            raise IndexDamaged(
                f"the ids in {directory / KEY_IDS_FILE} do not match its keys",
                "the index is damaged; rebuild it",
            )


def _ranks(counts: np.ndarray) -> np.ndarray:
    """int64: 0..c-1 for each count c, concatenated."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    ranks: np.ndarray = np.arange(total, dtype=np.int64) - starts
    return ranks


def save_ids(directory: Path, ids: pa.Array) -> None:
    """Write ``key_ids.arrow`` (string ids in key order) into ``directory``, atomically."""
    table = pa.table({"id": ids.cast(pa.large_string())})

    def save(tmp: str) -> None:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
            out.write_table(table)

    atomic_write(directory / KEY_IDS_FILE, save)


def load_ids(directory: Path, n_rows: int) -> pa.Array:
    """The ids :func:`save_ids` wrote, memory-mapped (large_string (n_rows,)).

    Raises:
        FileNotFoundError: the file vanished.
        IndexDamaged: unreadable, or not ``n_rows`` string ids.
    """
    path = directory / KEY_IDS_FILE
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise IndexDamaged(f"{path} is unreadable ({exc})", "rebuild the index") from None
    if (
        table.num_columns != 1
        or table.num_rows != n_rows
        or not pa.types.is_large_string(table.schema.field(0).type)
    ):
        raise IndexDamaged(f"{path} does not hold its segment's ids", "rebuild the index")
    column = table.column(0)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()  # no copy
