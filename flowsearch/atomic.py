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
import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = [
    "atomic_write",
    "atomic_write_text",
    "fsync_dir",
    "fsync_paths",
    "fsync_tree",
    "link_or_copy",
    "sha256_file",
]


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` at ``dst`` (its parent made), or copy it where the filesystem refuses
    a link: how a segment's immutable files move into a new segment without being rewritten."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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


def fsync_paths(paths: Iterable[Path]) -> None:
    """Flush files and directories to disk, several at once (threads): a journaling file
    system commits concurrent flushes together, so many files take about the time of a few
    (benchmarks/RESULTS.md, "Figures behind the defaults")."""
    todo = list(dict.fromkeys(Path(p) for p in paths))
    if len(todo) <= 1:
        for path in todo:
            _fsync(path)
        return
    with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
        list(pool.map(_fsync, todo))


def _fsync(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(target: Path, write: Callable[[str], object], *, durable: bool = True) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``target``, flush it, rename it over.

    ``durable=False`` renames without flushing: the caller must flush the file and its
    directory (:func:`fsync_paths`) before anything makes the file count (the version writer
    flushes the deletion files of a write together, before the manifest names them).

    The file is made readable by all (0644), not ``mkstemp``'s private 0600: an index is data to
    share. (Reading the umask would mean setting it: process-wide state, not ours to touch.)
    """
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        os.fchmod(fd, 0o644)
        os.close(fd)
        write(tmp)
        if durable:
            _fsync(Path(tmp))
        os.replace(tmp, target)
        if durable:
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
