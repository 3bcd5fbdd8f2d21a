"""Relative paths a manifest names: each must stay inside its directory.

A manifest is data read from disk; a crafted one (its checksum recomputed) could name
``../../etc/passwd`` as a segment's file. Every path field of the manifest's models is checked
here when it is read, before any file is opened.

Example:
    >>> safe_relpath("segments/s000001")
    'segments/s000001'
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

from flowsearch.errors import IndexDamaged

__all__ = ["inside", "safe_relpath"]


def safe_relpath(value: object, what: str = "path") -> str:
    """``value`` if it is a relative POSIX path that stays inside its directory.

    Raises:
        IndexDamaged: an absolute path, a ``..`` component, or not a string.
    """
    if not isinstance(value, str) or not value or "\\" in value or "\x00" in value:
        raise IndexDamaged(f"manifest {what} {value!r} is not a relative path", "rebuild the index")
    pure = PurePosixPath(value)
    if pure.is_absolute() or ".." in pure.parts:
        raise IndexDamaged(f"manifest {what} {value!r} leaves the index directory", "rebuild it")
    return value


def inside(what: str) -> Callable[[object], object]:
    """A field validator: the value (a path, a dict of paths, or None) stays in its directory."""

    def check(value: object) -> object:
        if isinstance(value, dict):
            return {safe_relpath(k, f"{what} file"): v for k, v in value.items()}
        return value if value is None else safe_relpath(value, what)

    return check
