r"""Publishing a directory atomically: build in a hidden sibling, then swap it in by rename.

A reader of ``index_dir`` sees either the old complete index or the new complete one. A build that
dies leaves only a hidden ``.NAME.tmp-PID-*`` sibling without a manifest (never taken for an
index, and removed by the next build once its process is gone); one killed between moving the old
index aside and moving the new one in leaves ``.NAME.old-PID-*``, which the next writer renames
back. Writers hold :func:`writer_lock` (``fcntl.flock`` on ``.NAME.lock``) for their whole run.

Example:
    >>> with scratch_dir(Path("idx")) as tmp:  # doctest: +SKIP
    ...     (tmp / "manifest.json").write_text("{}")
    ...     publish(tmp, Path("idx"))
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowsearch import store
from flowsearch.errors import FlowsearchError

__all__ = [
    "file_records",
    "fsync_tree",
    "link_tree",
    "publish",
    "recover",
    "scratch_dir",
    "size_on_disk",
    "writer_lock",
]

LOG = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(path: Path) -> int | None:
    """The pid in a scratch sibling's name ``.NAME.KIND-PID-HEX``, None if it has none."""
    try:
        return int(path.name.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return None


def _dead(path: Path) -> bool:
    pid = _owner_pid(path)
    return pid is not None and pid != os.getpid() and not _pid_alive(pid)


def _restore_old(target: Path) -> None:
    """Put back an index a dead process had moved aside (killed between the two renames)."""
    if target.exists() or target.is_symlink():
        return
    olds = [p for p in target.parent.glob(f".{target.name}.old-*") if p.is_dir() and _dead(p)]
    olds = [p for p in olds if store.is_index_dir(p)] or olds
    if not olds:
        return
    newest = max(olds, key=lambda p: p.stat().st_mtime)
    LOG.warning("restoring %s from %s, left by an interrupted build", target, newest.name)
    os.rename(newest, target)
    _fsync_dir(target.parent)


def recover(target: Path) -> None:
    """Put back the index an interrupted build moved aside, if ``target`` is missing for that
    reason and no writer is busy (best effort: readers may lack write access)."""
    target = Path(target)
    if target.exists() or not any(target.parent.glob(f".{target.name}.old-*")):
        return
    with contextlib.suppress(OSError, FlowsearchError), writer_lock(target):
        pass


def _remove_stale(target: Path) -> None:
    """Tidy scratch siblings of ``target`` left by builds whose process has died.

    A ``.old-*`` copy is the previous index: when ``target`` is missing (the build died between
    moving the old index aside and moving the new one in) it is renamed back, and it is never
    deleted while ``target`` is absent.
    """
    _restore_old(target)
    for kind in ("tmp", "old"):
        for path in target.parent.glob(f".{target.name}.{kind}-*"):
            if not _dead(path):
                continue
            if kind == "old" and not store.is_index_dir(target):
                LOG.warning("keeping %s: %s is not a complete index", path, target)
                continue
            LOG.info("removing %s, left by an interrupted build", path)
            shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
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
            _fsync_dir(path)
        elif path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(root)


@contextlib.contextmanager
def writer_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``target`` (a sibling ``.NAME.lock``) so writers do not race.

    Fails at once, rather than waiting, when another process holds it. On release the lock file
    is removed (while still locked; a taker re-checks it locked the file that is at the path).

    Raises:
        FlowsearchError: another process is writing ``target``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    path = target.parent / f".{target.name}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FlowsearchError(
                f"another flowsearch process is writing {target}; wait for it to finish"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file we locked; lock the one there now
    try:
        _remove_stale(target)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def _sibling(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


@contextlib.contextmanager
def scratch_dir(target: Path) -> Iterator[Path]:
    """A fresh hidden sibling of ``target`` to build in; removed on exit unless published."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(target)
    tmp = _sibling(target, "tmp")
    tmp.mkdir()
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def publish(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` to ``target``, replacing whatever ``target`` was.

    Every file of ``tmp`` is flushed to disk first. The old directory is renamed aside, the new
    one renamed in, then the old one deleted; if the second rename fails the old one is put back,
    and if the process dies between the renames the next writer puts it back (``_remove_stale``).
    """
    fsync_tree(tmp)
    if not target.exists():
        os.rename(tmp, target)
        _fsync_dir(target.parent)
        return
    old = _sibling(target, "old")
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    _fsync_dir(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def link_tree(src: Path, dst: Path, exclude: set[str]) -> list[str]:
    """Hard-link (copy where links fail) every file of ``src`` into ``dst``, same layout.

    Index files are never modified in place, so an old and a new index may share them.
    ``exclude`` holds relative paths to leave out. Returns the relative paths linked.
    """
    done = []
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        if rel in exclude:
            continue
        out = dst / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, out)
        except OSError:
            shutil.copy2(path, out)
        done.append(rel)
    return done


def file_records(root: Path, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """Manifest ``files`` entries for every file under ``root`` but the manifest itself.

    ``known`` supplies records for files linked unchanged from a verified index, sparing a rehash.
    """
    known = known or {}
    records = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == store.MANIFEST_NAME:
            continue
        records[rel] = known[rel] if rel in known else store.file_record(root, rel)
    return records


def size_on_disk(root: Path) -> int:
    """Total bytes of the files under ``root``."""
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())
