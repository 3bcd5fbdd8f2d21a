r"""Durable, atomic file writes: write aside, flush, rename over the target.

A reader of the target sees the old content or the new content, never a mix, and a crash at any
moment leaves at worst a hidden temporary file (``.NAME.tmp-*``) beside it.

Example:
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> atomic_write_text(d / "a.json", "{}")
    >>> (d / "a.json").read_text()
    '{}'
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_text", "fsync_dir", "fsync_tree", "sha256_file"]


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (renames, creations) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` (and ``root``) to disk."""
    root = Path(root)
    for path in sorted(root.rglob("*"), reverse=True):  # files and subdirectories first
        if path.is_dir():
            fsync_dir(path)
        elif path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(root)


def atomic_write(target: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``target``, flush it, rename it over.

    The file is made readable by all (0644), not ``mkstemp``'s private 0600: an index is data to
    share. (Reading the umask would mean setting it: process-wide state, not ours to touch.)
    """
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        os.fchmod(fd, 0o644)
        os.close(fd)
        write(tmp)
        fd2 = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd2)
        finally:
            os.close(fd2)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(target: Path, text: str) -> None:
    """Atomically replace ``target`` with ``text`` (UTF-8)."""
    atomic_write(target, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()
