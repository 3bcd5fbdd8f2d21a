r"""A segment's ids, hashed and sorted: finding the rows of given ids without reading them all.

An upsert or a delete must find which live row holds each id it names. Reading every id of
every segment costs the whole corpus; instead each segment stores its ids' 64-bit keys, sorted,
beside the local row of each (``keys.npy``, ``key_rows.npy``, memory-mapped when read): a
lookup is a binary search per id and segment. Integer ids are their own keys; a string id's key
is the first 8 bytes of its BLAKE2b digest, so two strings can share a key: callers confirm a
string match against the row's stored id (:meth:`KeyIndex.lookup` returns candidates).

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

from flowsearch.atomic import atomic_write
from flowsearch.errors import IndexDamaged
from flowsearch.storage.layout import KEY_ROWS_FILE, KEYS_FILE

__all__ = ["KeyIndex", "keys_of"]


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
    """Sorted keys of one segment's ids, with each key's local row.

    Args:
        keys: uint64 (n,), ascending.
        rows: int64 (n,), the local row of each key.
    """

    def __init__(self, keys: np.ndarray, rows: np.ndarray) -> None:
        self.keys = keys
        self.rows = rows

    @classmethod
    def build(cls, ids: pa.Array | pa.ChunkedArray) -> KeyIndex:
        """The key index of a segment whose local row ``i`` has id ``ids[i]``."""
        keys = keys_of(ids)
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], order.astype(np.int64))

    def save(self, directory: Path) -> list[str]:
        """Write the two files into ``directory``; returns their names."""
        for name, array in ((KEYS_FILE, self.keys), (KEY_ROWS_FILE, self.rows)):

            def save(tmp: str, array: np.ndarray = array) -> None:
                with open(tmp, "wb") as handle:
                    np.save(handle, array, allow_pickle=False)

            atomic_write(directory / name, save)
        return [KEYS_FILE, KEY_ROWS_FILE]

    @classmethod
    def load(cls, directory: Path, n_rows: int) -> KeyIndex:
        """Open the files :meth:`save` wrote (memory-mapped).

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
        return cls(keys, rows)

    def lookup(self, ids: pa.Array | pa.ChunkedArray) -> list[tuple[int, int]]:
        """``(position in ids, local row)`` for every row whose key matches an id's (string
        ids: confirm against the stored id; integer ids match exactly)."""
        wanted = keys_of(ids)
        lo = np.searchsorted(self.keys, wanted, side="left")
        hi = np.searchsorted(self.keys, wanted, side="right")
        out: list[tuple[int, int]] = []
        for at in np.flatnonzero(hi > lo):
            out.extend((int(at), int(self.rows[j])) for j in range(lo[at], hi[at]))
        return out
