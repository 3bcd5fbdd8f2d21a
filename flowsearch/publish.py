r"""Publishing a directory atomically: build in a hidden sibling, then swap it in by rename.

A reader of ``index_dir`` sees either the old complete index or the new complete one. A build that
dies leaves only a hidden ``.NAME.tmp-PID-*`` sibling without a manifest (never taken for an
index, and removed by the next build once its process is gone).

Example:
    >>> with scratch_dir(Path("idx")) as tmp:  # doctest: +SKIP
    ...     (tmp / "manifest.json").write_text("{}")
    ...     publish(tmp, Path("idx"))
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowsearch import store

__all__ = ["file_records", "link_tree", "publish", "scratch_dir", "size_on_disk"]

LOG = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(target: Path) -> None:
    """Delete scratch siblings of ``target`` left by builds whose process has died."""
    for kind in ("tmp", "old"):
        for path in target.parent.glob(f".{target.name}.{kind}-*"):
            try:
                pid = int(path.name.rsplit("-", 2)[-2])
            except (ValueError, IndexError):
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                LOG.info("removing %s, left by an interrupted build", path)
                shutil.rmtree(path, ignore_errors=True)


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

    The old directory is renamed aside, the new one renamed in, then the old one deleted; if the
    second rename fails the old one is put back.
    """
    if not target.exists():
        os.rename(tmp, target)
        return
    old = _sibling(target, "old")
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
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
