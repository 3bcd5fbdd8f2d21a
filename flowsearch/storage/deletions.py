r"""Deletion files: which of a segment's rows are deleted, as of a version.

A delete (or the replaced side of an upsert) never rewrites a segment: it writes a new
deletion file for each segment it touches, listing every deleted local row (sorted unique int64,
``.npy``, no pickle), and the new version's manifest points at it. Older deletion files stay for
readers pinned to older versions and are removed by the writer's cleanup.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "deleted-v000002.npy"
    >>> write(path, np.array([3, 1, 3]))
    2
    >>> read(path, 5).tolist()
    [False, True, False, True, False]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flowsearch.atomic import atomic_write
from flowsearch.errors import IndexDamaged

__all__ = ["read", "read_rows", "write"]


def write(path: Path, rows: np.ndarray, *, durable: bool = True) -> int:
    """Store deleted local rows at ``path`` (atomically); returns how many there are.
    ``durable=False``: the caller flushes the file and its directory before anything names
    it (:func:`~flowsearch.atomic.atomic_write`; the version writer does, all of a write's
    deletion files at once, before the manifest)."""
    rows = np.unique(np.asarray(rows, dtype=np.int64))

    def save(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            np.save(handle, rows, allow_pickle=False)

    atomic_write(path, save, durable=durable)
    return int(len(rows))


def read_rows(path: Path, n_rows: int) -> np.ndarray:
    """The deleted local rows a file lists (sorted int64).

    Raises:
        FileNotFoundError: the file vanished (its version was removed meanwhile).
        IndexDamaged: not an int64 row list within ``[0, n_rows)``.
    """
    try:
        rows: np.ndarray = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise IndexDamaged(f"{path} is unreadable ({exc})", "rebuild the index") from None
    if (
        rows.dtype != np.int64
        or rows.ndim != 1
        or (rows.size and (rows.min() < 0 or rows.max() >= n_rows))
    ):
        raise IndexDamaged(f"{path} does not list rows of its segment", "rebuild the index")
    return rows


def read(path: Path, n_rows: int) -> np.ndarray:
    """The deleted rows as a bool mask (n_rows,), True for a deleted row."""
    mask = np.zeros(n_rows, dtype=bool)
    mask[read_rows(path, n_rows)] = True
    return mask
