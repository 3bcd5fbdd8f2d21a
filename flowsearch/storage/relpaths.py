"""Relative paths a manifest names: each must stay inside its directory.

A manifest is data read from disk; a crafted one (its checksum recomputed) could name
``../../etc/passwd`` as a segment's file. Every path field of the manifest's models is checked
here when it is read, before any file is opened.

Example:
    >>> safe_relpath("segments/s000001")
    'segments/s000001'
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from flowsearch.errors import IndexDamaged

__all__ = ["inside", "reference_sample", "safe_relpath", "sample_pieces"]


def safe_relpath(value: Any, what: str = "path") -> str:
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


def inside(what: str) -> Any:
    """A field validator: the value (a path, a dict of paths, or None) stays in its directory."""

    def check(value: Any) -> Any:
        if isinstance(value, dict):
            return {safe_relpath(k, f"{what} file"): v for k, v in value.items()}
        return value if value is None else safe_relpath(value, what)

    return check


def reference_sample(reference: Any) -> dict[str, Any] | None:
    """The reference sample record a manifest's ``reference`` holds (``sample``: its base's
    directory and files, written by ``Writer.set_reference_sample``, and ``deltas``: the
    directories and files of the changes since, in order), its paths checked; None without one.

    Raises:
        IndexDamaged: a path that leaves the index directory, or a malformed record.
    """
    sample = reference.get("sample") if isinstance(reference, dict) else None
    if sample is None:
        return None
    deltas = sample.get("deltas", []) if isinstance(sample, dict) else None
    if not isinstance(deltas, list):
        raise IndexDamaged("the manifest's reference sample record is malformed", "rebuild it")
    for piece in (sample, *deltas):
        files = piece.get("files") if isinstance(piece, dict) else None
        if not isinstance(files, dict):
            raise IndexDamaged("the manifest's reference sample record is malformed", "rebuild it")
        safe_relpath(piece.get("path"), "reference sample")
        for name in files:
            safe_relpath(name, "reference sample file")
    return dict(sample)


def sample_pieces(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The directories (``path``, ``files``) a reference sample record names: its base, then
    its deltas in order (see :func:`reference_sample`); none for None."""
    if record is None:
        return []
    return [record, *record.get("deltas", [])]
