r"""Housekeeping of an index directory: what a build may write over, what the writer removes.

:func:`check_target` refuses to build over a file, a foreign directory, or an index without
``overwrite``. :func:`clean` removes what no version in a given set references (staging
directories, unreferenced segments and calibrators, superseded deletion files, converted
old-format files, temporary manifests, and stray files: anything else in the index directory
or inside one of its parts, see :mod:`flowsearch.storage.verify`); the version writer calls it,
with the lock held, when it starts (the leftovers of a dead writer) and after it publishes
(what the version before the previous one used).

Example:
    >>> check_target(Path("/nonexistent/index"), overwrite=False)
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

from flowsearch.errors import BadInput
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import (
    CALIBRATORS_DIR,
    LOCK_NAME,
    MANIFEST_NAME,
    REFERENCES_DIR,
    SEGMENTS_DIR,
    STAGE_PREFIX,
)
from flowsearch.storage.verify import root_strays

__all__ = ["LEGACY_ENTRIES", "check_target", "clean", "remove_failed_first_build"]

LOG = logging.getLogger(__name__)

#: What the first two formats kept in the index directory itself (format 1) or per version.
LEGACY_ENTRIES = ("calibrator", "shards", "index.faiss", "versions")


def check_target(index_dir: Path, overwrite: bool) -> None:
    """Refuse to build over a file, a foreign directory, or an index without ``overwrite``.

    Raises:
        BadInput: naming the problem and the fix.
    """
    if index_dir.is_file():
        raise BadInput(f"{index_dir} is a file, not an index directory", "choose another path")
    if not index_dir.is_dir():
        return
    if mf.is_index_dir(index_dir):
        if not overwrite:
            raise BadInput(
                f"an index already exists at {index_dir}",
                "pass {overwrite=True} to replace it",
                param="overwrite",
            )
        return
    ours = {LOCK_NAME, SEGMENTS_DIR, CALIBRATORS_DIR, REFERENCES_DIR}
    foreign = [p.name for p in index_dir.iterdir() if p.name not in ours and not _tmp(p)]
    if foreign:
        raise BadInput(
            f"{index_dir} exists and is not a flowsearch index (it holds {foreign[0]!r}, ...)",
            "choose another index directory; refusing to replace it",
        )


def _tmp(path: Path) -> bool:
    """A temporary file an atomic write was killed inside (``atomic.py``)."""
    return path.name.startswith(f".{mf.MANIFEST_NAME}.tmp-")


def clean(root: Path, keep: set[str]) -> None:
    """Remove what no version in ``keep`` needs: staging directories, unreferenced segments and
    calibrators, old deletion files, the old formats' files once converted, temp manifests."""
    for path in root.glob(f".{MANIFEST_NAME}.tmp-*"):
        path.unlink(missing_ok=True)
    for kind in (SEGMENTS_DIR, CALIBRATORS_DIR, REFERENCES_DIR):
        folder = root / kind
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            rel = f"{kind}/{path.name}"
            if path.name.startswith(STAGE_PREFIX) or rel not in keep:
                LOG.info("removing %s", path)
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
            elif path.is_dir():
                _tidy(path, rel, keep)
    legacy_kept = any(k == "." or k.startswith("versions/") or k in LEGACY_ENTRIES for k in keep)
    if not legacy_kept and mf.is_index_dir(root):  # a format-3 index: strays at the top too
        for path in root_strays(root):
            LOG.info("removing stray %s", path)
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
    versions = root / "versions"
    if versions.is_dir():
        for path in versions.iterdir():
            if f"versions/{path.name}" not in keep:
                shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            versions.rmdir()
    if not legacy_kept:
        for name in LEGACY_ENTRIES[:3]:
            path = root / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.is_file():
                path.unlink()


def _tidy(folder: Path, rel: str, keep: set[str]) -> None:
    """Remove the files inside a kept part (``folder``, at ``rel``) that no kept version names
    (superseded deletion files, a killed atomic write's temporary files, strays), then the
    directories that left empty."""
    files = [p for p in folder.rglob("*") if not p.is_dir()]
    for path in files:
        if f"{rel}/{path.relative_to(folder).as_posix()}" not in keep:
            LOG.info("removing %s", path)
            path.unlink(missing_ok=True)
    for path in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()  # only when empty


def remove_failed_first_build(root: Path, keep_root: bool = False) -> None:
    """Leave nothing of a first build that failed: what it made in ``root`` (and ``root``
    itself unless ``keep_root``: the directory was there, empty, before)."""
    for kind in (SEGMENTS_DIR, CALIBRATORS_DIR, REFERENCES_DIR):
        with contextlib.suppress(OSError):
            (root / kind).rmdir()
    if {p.name for p in root.iterdir()} <= {LOCK_NAME}:
        with contextlib.suppress(OSError):
            (root / LOCK_NAME).unlink()
            if not keep_root:
                root.rmdir()
