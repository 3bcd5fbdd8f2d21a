r"""The index directory: immutable versions, one writer at a time, atomic publish, verification.

Layout (format 2)::

    index_dir/
      manifest.json        the current version's manifest: replacing it publishes a version
      .lock                held (fcntl.flock) by the one writer for its whole run
      versions/v000003/    one immutable directory per version: calibrator/, shards/,
                           index.faiss, lexical/, tombstones
      versions/.build-*    a version being built (removed by the next writer: the lock, held
                           for a whole build, is the only liveness signal)

A write builds its version aside (files unchanged since the previous version are hard-linked,
never copied or modified), flushes it, renames it to ``versions/vNNNNNN`` and then replaces
``manifest.json`` with ``os.replace``: one atomic step that a reader observes whole. A reader
reads the manifest once and opens that version's files; versions older than the previous one
are deleted by the next write (a reader that was slower than that retries with the current
one, see :func:`open_version`). A first-release index (files in ``index_dir`` itself, root
``"."``) is read in place; its files are removed two writes after it was superseded.

Example:
    >>> with write_version("idx") as build:  # doctest: +SKIP
    ...     (build.path / "index.faiss").write_bytes(b"...")
    ...     build.publish(manifest)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from flowsearch.atomic import fsync_dir, fsync_tree
from flowsearch.errors import FlowsearchError
from flowsearch.storage import manifest as mf

__all__ = [
    "LEGACY_ENTRIES",
    "VersionBuild",
    "Verification",
    "check_target",
    "open_version",
    "size_on_disk",
    "verify",
    "write_version",
]

LOG = logging.getLogger(__name__)

LOCK_NAME = ".lock"
VERSIONS = "versions"
#: What a first-release index kept in the index directory itself.
LEGACY_ENTRIES = (mf.CALIBRATOR_DIR, mf.SHARDS_DIR, mf.FAISS_FILE)
#: Files at most this large are checksummed on every open; larger ones only with verify=True.
CHEAP_CHECKSUM_BYTES = 16 * 2**20
_OPEN_RETRIES = 3

T = TypeVar("T")


def _version_dir(number: int) -> str:
    return f"{VERSIONS}/v{number:06d}"


def check_target(index_dir: Path, overwrite: bool) -> None:
    """Refuse to build over a file, a foreign directory, or an index without ``overwrite``.

    A directory holding only the leftovers of our own failed builds (a lock file, an empty
    ``versions/`` or builds in it) counts as empty.

    Raises:
        FlowsearchError: naming the problem.
    """
    if index_dir.is_file():
        raise FlowsearchError(f"{index_dir} is a file, not an index directory; choose another path")
    if not index_dir.is_dir():
        return
    if mf.is_index_dir(index_dir):
        if not overwrite:
            raise FlowsearchError(
                f"an index already exists at {index_dir}; pass overwrite=True to replace it"
            )
        return
    ours = {LOCK_NAME, VERSIONS}
    foreign = [p.name for p in index_dir.iterdir() if p.name not in ours and not _manifest_tmp(p)]
    if foreign:
        raise FlowsearchError(
            f"{index_dir} exists and is not a flowsearch index (it holds {foreign[0]!r}, ...); "
            "refusing to replace it, choose another index directory"
        )


@contextlib.contextmanager
def _lock(index_dir: Path) -> Iterator[None]:
    """Hold ``index_dir/.lock`` exclusively; fail at once when another writer holds it."""
    index_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(index_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise FlowsearchError(
            f"cannot write to {index_dir} ({exc.strerror}); check its permissions"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FlowsearchError(
                f"another flowsearch process is writing {index_dir}; wait for it to finish"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a new taker)


def _manifest_tmp(path: Path) -> bool:
    """A temporary manifest left by a writer killed inside its atomic write (``atomic.py``)."""
    return path.name.startswith(f".{mf.MANIFEST_NAME}.tmp-")


def _kept(index_dir: Path, current: mf.Manifest) -> set[str]:
    """Version roots a reader may still be on: the current one and the one before it."""
    keep = {current.root}
    if current.version > 1:
        previous = _version_dir(current.version - 1)
        first_release = current.version == 2 and not (index_dir / previous).exists()
        keep.add("." if first_release else previous)
    return keep


def _clean(index_dir: Path, current: mf.Manifest | None) -> None:
    """Remove what no reader needs: dead builds, a killed writer's temporary manifest, versions
    older than the previous one, and a first-release layout once it is older than that. Called
    with the lock held."""
    keep = _kept(index_dir, current) if current is not None else set()
    for path in index_dir.glob(f".{mf.MANIFEST_NAME}.tmp-*"):
        LOG.info("removing %s", path)
        path.unlink(missing_ok=True)
    versions = index_dir / VERSIONS
    if versions.is_dir():
        for path in versions.iterdir():
            stale = current is not None and f"{VERSIONS}/{path.name}" not in keep
            if path.name.startswith(".build-") or (stale and path.is_dir()):
                LOG.info("removing %s", path)
                shutil.rmtree(path, ignore_errors=True)
    if current is not None and "." not in keep:
        for name in LEGACY_ENTRIES:
            legacy = index_dir / name
            if legacy.is_dir():
                shutil.rmtree(legacy, ignore_errors=True)
            elif legacy.is_file():
                legacy.unlink()


@dataclass
class VersionBuild:
    """A version being built in ``path`` (see :func:`write_version`).

    Attributes:
        index_dir: the index directory.
        path: the build directory, to write the version's files into.
        base: the current version's manifest (None for a first build).
    """

    index_dir: Path
    path: Path
    base: mf.Manifest | None
    published: mf.Manifest | None = None

    @property
    def number(self) -> int:
        """The number the version gets."""
        return 1 if self.base is None else self.base.version + 1

    def link(self, relpath: str) -> None:
        """Hard-link (copy where links fail) ``relpath`` of the current version into this one,
        a file or a whole directory. Version files are never modified, so versions share them."""
        assert self.base is not None
        src = self.base.path(self.index_dir, relpath)
        items = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
        for item in items:
            rel = Path(relpath) / item.relative_to(src) if item != src else Path(relpath)
            out = self.path / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(item, out)
            except OSError:
                shutil.copy2(item, out)

    def publish(self, manifest: mf.Manifest) -> mf.Manifest:
        """Seal the build as the next version and make it current (atomically).

        Every file under the build is recorded with its size and sha256 (files linked
        unchanged from the current version keep the records already vouched for); extra files
        are impossible by construction. Returns the published manifest.
        """
        root = _version_dir(self.number)
        known = dict(self.base.files) if self.base is not None else {}
        records: dict[str, mf.FileRecord] = {}
        for path in sorted(p for p in self.path.rglob("*") if p.is_file()):
            rel = path.relative_to(self.path).as_posix()
            old = known.get(rel)
            same = (
                old is not None
                and self.base is not None
                and _same_file(path, self.base.path(self.index_dir, rel))
            )
            records[rel] = old if same and old is not None else mf.file_record(path)
        final = replace(
            manifest,
            version=self.number,
            root=root,
            files=records,
            format_version=mf.FORMAT_VERSION,
        )
        fsync_tree(self.path)
        target = self.index_dir / root
        if target.exists():  # a version dir no manifest points to: a dead writer's
            shutil.rmtree(target)
        os.rename(self.path, target)
        fsync_dir(target.parent)
        mf.write(self.index_dir, final)
        self.published = final
        return final


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@contextlib.contextmanager
def write_version(
    index_dir: str | os.PathLike[str], *, new: bool = False, overwrite: bool = False
) -> Iterator[VersionBuild]:
    """Take the writer lock and a fresh build directory for the next version.

    Args:
        index_dir: the index directory.
        new: a build from scratch (``build_index``): the current version, if any, is replaced
            only with ``overwrite``; otherwise an index must exist.
        overwrite: see ``new``.

    Yields a :class:`VersionBuild`; call its ``publish(manifest)`` to make it current. Leaving
    the block without publishing (an error, Ctrl-C) removes the build; a kill leaves it for the
    next writer to remove. The version before is kept for readers still on it.

    Raises:
        FlowsearchError: another writer holds the lock, no index (``new=False``), or the target
            is not ours (``new=True``).
    """
    root = Path(index_dir).expanduser()
    if new:
        check_target(root, overwrite)
    else:
        mf.read(root)  # "no index at ...", before creating anything
    created = not root.exists()
    with _lock(root):
        try:
            yield from _versioned(root, new, overwrite)
        except OSError as exc:  # disk full, permissions, ...: one line, like any bad input
            detail = exc.strerror or str(exc)
            where = f": {exc.filename}" if exc.filename else ""
            raise FlowsearchError(
                f"the write to {root} failed ({detail}{where}); the index is unchanged: free "
                "some disk space or fix the permissions, then retry"
            ) from None
        finally:
            if created and not mf.is_index_dir(root):
                _remove_failed_first_build(root)


def _versioned(root: Path, new: bool, overwrite: bool) -> Iterator[VersionBuild]:
    """The body of :func:`write_version`, under the lock."""
    base = mf.read(root) if mf.is_index_dir(root) else None
    if new:
        check_target(root, overwrite)  # again: another writer may have published meanwhile
    elif base is None:
        raise FlowsearchError(f"{root} is not a flowsearch index (no manifest.json)")
    _clean(root, base)
    (root / VERSIONS).mkdir(exist_ok=True)
    path = root / VERSIONS / f".build-{secrets.token_hex(6)}"
    path.mkdir()
    build = VersionBuild(index_dir=root, path=path, base=base)
    try:
        yield build
    finally:
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
    if build.published is not None:
        _clean(root, build.published)


def _remove_failed_first_build(root: Path) -> None:
    """Leave nothing of a first build that failed: the directory this write created holds only
    our lock file and an empty ``versions/`` (called with the lock held)."""
    versions = root / VERSIONS
    with contextlib.suppress(OSError):
        versions.rmdir()
    if {p.name for p in root.iterdir()} <= {LOCK_NAME}:
        with contextlib.suppress(OSError):
            (root / LOCK_NAME).unlink()
            root.rmdir()


def open_version(index_dir: str | os.PathLike[str], opener: Callable[[mf.Manifest], T]) -> T:
    """Read the current manifest and call ``opener(manifest)`` to open that version's files.

    If the version's files vanish meanwhile (a writer published twice and removed it), read the
    manifest again and retry, a few times.
    """
    root = Path(index_dir).expanduser()
    last: Exception | None = None
    for _ in range(_OPEN_RETRIES):
        manifest = mf.read(root)
        try:
            return opener(manifest)
        except FileNotFoundError as exc:
            last = exc
            if mf.read(root).version == manifest.version:
                break
    raise FlowsearchError(
        f"index file missing under {root} ({last}); the index is damaged, rebuild it"
    )


@dataclass(frozen=True)
class Verification:
    """What opening checked: files present with the recorded sizes (always), the sha256 of
    ``hashed`` files, and which were not hashed (larger than the cheap bound, without verify)."""

    files: int
    hashed: int
    not_hashed: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict."""
        return {"files": self.files, "hashed": self.hashed, "not_hashed": list(self.not_hashed)}


def verify(index_dir: Path, manifest: mf.Manifest, checksums: bool = False) -> Verification:
    """Check a version's files against its manifest: every file present with its size, no
    file the manifest does not name, and sha256 of all (``checksums``) or of the small ones.

    Raises:
        FlowsearchError: naming the first file that is missing, extra, or differs.
    """
    base = manifest.path(index_dir)
    hashed, skipped = 0, []
    for relpath, record in manifest.files.items():
        path = base / relpath
        if not path.is_file():
            raise FlowsearchError(f"index file missing: {path}; the index is damaged, rebuild it")
        size = path.stat().st_size
        if size != record.bytes:
            raise FlowsearchError(
                f"index file changed: {path} has {size} bytes, the manifest says {record.bytes}; "
                "the index is damaged, rebuild it"
            )
        if checksums or size <= CHEAP_CHECKSUM_BYTES:
            if mf.sha256_file(path) != record.sha256:
                raise FlowsearchError(
                    f"checksum mismatch for {path}; the index is corrupt, rebuild it"
                )
            hashed += 1
        else:
            skipped.append(relpath)
    if manifest.root != ".":
        for path in base.rglob("*"):
            rel = path.relative_to(base).as_posix()
            if path.is_file() and rel not in manifest.files:
                raise FlowsearchError(
                    f"unexpected file in the index: {path}; remove it or rebuild the index"
                )
    return Verification(files=len(manifest.files), hashed=hashed, not_hashed=tuple(skipped))


def size_on_disk(root: Path) -> int:
    """Total bytes of the files under ``root`` (a file: its size)."""
    root = Path(root)
    if root.is_file():
        return root.stat().st_size
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
