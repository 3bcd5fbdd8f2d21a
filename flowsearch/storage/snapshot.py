r"""Snapshots: a self-contained copy of one published version, and an index restored from one.

:func:`snapshot` copies the files one version references (segments, deletion files, the
calibrator, the reference sample), its ``manifest.json`` byte for byte, its history up to that
version and a ``snapshot.json`` naming where it came from. Segment files are immutable, so they
are hard-linked where the file system allows (no bytes copied; flowsearch never writes a
published file in place) and copied otherwise. A ``DEST`` ending in ``.tar`` is one tar archive
of that directory.

**One version while a writer runs.** The manifest is read once and its files are linked by the
names it gives; names are never reused (a new segment, deletion file, calibrator or reference
sample takes a new number), so a file found is the file that version wrote. A file a writer's
cleanup removed meanwhile (two writes published during the copy) starts the copy again from the
newer manifest, as a :class:`~flowsearch.search.searcher.Searcher` re-opens. The copy is then
checked against its manifest, every file by sha256: a snapshot is one version or nothing.

A snapshot of a damaged index (a file missing, changed or corrupt) is refused with the error
``info --verify`` gives. Every write is atomic: the copy is made aside (``.DEST.tmp-*``) and
renamed into place; an existing ``DEST`` is refused, never replaced.

:func:`restore` copies a snapshot (a directory or a ``.tar``) aside, checks every file, and
publishes it as a new version of a new index (kind ``restore``), whose manifest records the
snapshot in ``restored_from`` (``info`` shows it), then renames it into place.

Example:
    >>> snapshot("idx", "backup-1")            # doctest: +SKIP
    >>> restore("backup-1", "idx-restored")    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from flowsearch._version import __version__
from flowsearch.atomic import fsync_dir, fsync_tree
from flowsearch.errors import BadInput, FlowsearchError, IndexDamaged, NotFound, check_path
from flowsearch.storage import history
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import HISTORY_NAME, MANIFEST_NAME
from flowsearch.storage.verify import Verification, verify
from flowsearch.storage.writer import open_writer, sample_record

__all__ = ["SNAPSHOT_NAME", "RestoreResult", "SnapshotResult", "restore", "snapshot"]

#: The file in a snapshot that says what it is a snapshot of.
SNAPSHOT_NAME = "snapshot.json"
SNAPSHOT_FORMAT = "flowsearch-snapshot"
#: Copies started again when a writer's cleanup removed a file meanwhile.
_RETRIES = 5


class SnapshotResult(BaseModel):
    """What :func:`snapshot` wrote: where, of which index and version, how many files (and how
    many of them hard-linked rather than copied), their bytes, and when."""

    model_config = ConfigDict(frozen=True)
    path: str
    source: str
    version: int
    n_live: int
    n_files: int
    n_linked: int
    bytes: int
    time: str

    def to_dict(self) -> dict[str, object]:
        """The ``snapshot --json`` document."""
        return self.model_dump(mode="json")


class RestoreResult(BaseModel):
    """What :func:`restore` made: the new index, the snapshot it came from (its index and
    version), the new index's version and live rows, and what was verified."""

    model_config = ConfigDict(frozen=True)
    path: str
    snapshot: str
    source: str
    source_version: int
    version: int
    n_live: int
    verified: Verification

    def to_dict(self) -> dict[str, object]:
        """The ``restore --json`` document."""
        return self.model_dump(mode="json")


def _version_files(manifest: mf.Manifest) -> list[str]:
    """Every file (relative to the index directory) a format-3 version references."""
    cal = manifest.calibration
    out = [f"{cal.path}/{rel}" for rel in cal.files]
    sample = sample_record(manifest)
    for piece in sample.pieces if sample is not None else ():
        out += [f"{piece.path}/{rel}" for rel in piece.files]
    for seg in manifest.segments:
        out += [f"{seg.dir}/{rel}" for rel in seg.files]
    return out


def _link_or_copy(src: Path, dst: Path) -> bool:
    """Hard-link ``src`` at ``dst``, else copy it; True when linked. FileNotFoundError when
    ``src`` is gone."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
        return True
    except FileNotFoundError:
        raise
    except OSError:
        shutil.copyfile(src, dst)
        return False


def _check_dest(dest: Path) -> None:
    if dest.exists() or dest.is_symlink():
        raise BadInput(
            f"{dest} already exists; a snapshot or restore never replaces anything",
            "choose a new path, or remove the old one first",
        )
    if not dest.parent.is_dir():
        raise NotFound(f"{dest.parent} does not exist", "create the folder first")


@contextlib.contextmanager
def _aside(dest: Path, suffix: str = "") -> Iterator[Path]:
    """A path beside ``dest`` to build into (removed unless renamed into place)."""
    tmp = dest.parent / f".{dest.name}.tmp-{secrets.token_hex(6)}{suffix}"
    try:
        yield tmp
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def _in_words(exc: IndexDamaged, copy: Path, original: Path) -> IndexDamaged:
    """``exc`` (raised on the copy) naming the original's files."""
    message = exc.problem.replace(str(copy), str(original))
    return IndexDamaged(message, exc.fix)


def _copy_version(src: Path, dst: Path) -> tuple[mf.Manifest, int, int]:
    """Copy the current version of ``src`` into the new directory ``dst`` (manifest, files,
    history up to that version); (its manifest, files, files linked). Starts again from the
    newer manifest when a file vanished (a writer's cleanup)."""
    last: FileNotFoundError | None = None
    for _ in range(_RETRIES):
        mf.read_raw(src)  # a missing or damaged manifest, in its own words
        text = (src / MANIFEST_NAME).read_bytes()  # the one version copied
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir()
        (dst / MANIFEST_NAME).write_bytes(text)
        manifest = mf.read(dst)
        if manifest.format_version < mf.FORMAT_VERSION:
            raise BadInput(
                f"{src} is an index of format {manifest.format_version} (an earlier release)",
                "convert it with any write first, e.g. `flowsearch compact --index DIR`",
            )
        files = _version_files(manifest)
        try:
            linked = sum(_link_or_copy(src / rel, dst / rel) for rel in files)
        except FileNotFoundError as exc:
            last = exc
            if mf.read(src).version == manifest.version:  # not a writer: the file is lost
                raise IndexDamaged(
                    f"index file missing: {exc.filename or src}", "the index is damaged; rebuild it"
                ) from None
            continue
        kept = [r for r in history.read(src) if r.version <= manifest.version]
        lines = [json.dumps(r.model_dump(mode="json"), ensure_ascii=False, sort_keys=True)
                 for r in kept]  # fmt: skip
        (dst / HISTORY_NAME).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return manifest, len(files), linked
    raise IndexDamaged(f"index file missing under {src} ({last})", "retry when writes pause")


def snapshot(index_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> SnapshotResult:
    """Write a self-contained copy of the index's current version to ``dest`` (a directory;
    one tar archive when ``dest`` ends in ``.tar``). Safe while a writer runs (see the module
    docstring); the index itself is only read.

    Raises:
        NotFound: no index at ``index_dir``, or no folder for ``dest``.
        BadInput: ``dest`` exists, or the index is of an earlier format.
        IndexDamaged: a file of the version is missing, changed or corrupt (nothing written).
    """
    src = check_path(index_dir, "index_dir", "an index directory")
    target = check_path(dest, "dest", "the snapshot's path")
    mf.read_raw(src)
    _check_dest(target)
    if target.resolve().is_relative_to(src.resolve()):
        raise BadInput(f"{target} is inside the index {src}", "write the snapshot elsewhere")
    as_tar = target.suffix == ".tar"
    with _aside(target) as stage:
        manifest, n_files, n_linked = _copy_version(src, stage)
        try:
            verify(stage, manifest, checksums=True)
        except IndexDamaged as exc:
            raise _in_words(exc, stage, src) from None
        time = mf.utc_now()
        about = {"format": SNAPSHOT_FORMAT, "source": str(src.resolve()),
                 "version": manifest.version, "time": time,
                 "flowsearch_version": __version__}  # fmt: skip
        (stage / SNAPSHOT_NAME).write_text(json.dumps(about, indent=1) + "\n", encoding="utf-8")
        size = sum(p.stat().st_size for p in stage.rglob("*") if p.is_file())
        if as_tar:
            with _aside(target, ".tar") as archive:
                with tarfile.open(archive, "w") as tar:
                    tar.add(stage, arcname=".")
                with open(archive, "rb+") as handle:
                    os.fsync(handle.fileno())
                os.rename(archive, target)
        else:
            fsync_tree(stage)
            os.rename(stage, target)
        fsync_dir(target.parent)
    return SnapshotResult(path=str(target.resolve()), source=str(src.resolve()),
                          version=manifest.version, n_live=manifest.n_live, n_files=n_files,
                          n_linked=0 if as_tar else n_linked, bytes=size,
                          time=time)  # fmt: skip


def _unpack(snap: Path, stage: Path) -> None:
    """The snapshot's files into the new directory ``stage`` (a tar is extracted with the
    ``data`` filter: no path leaves ``stage``, no links, devices or odd modes)."""
    if snap.is_file():
        try:
            with _tar(snap) as tar:
                tar.extractall(stage, filter="data")  # a cut archive says where it ends
        except (tarfile.TarError, OSError) as exc:
            why = " ".join(str(exc).split())
            raise BadInput(
                f"{snap} is not a readable snapshot archive ({why})",
                "pass a directory or .tar that `flowsearch snapshot` wrote",
            ) from None
        return
    stage.mkdir()
    for path in sorted(p for p in snap.rglob("*") if p.is_file()):
        _link_or_copy(path, stage / path.relative_to(snap))


def _tar(snap: Path) -> tarfile.TarFile:
    """``snap`` open as a tar archive; a file that is none is one short ``ReadError``."""
    try:
        return tarfile.open(snap)
    except tarfile.ReadError:  # it lists every compression tried: say what it is not
        raise tarfile.ReadError("not a tar archive") from None


def _about(stage: Path, snap: Path) -> dict[str, object]:
    """The snapshot's ``snapshot.json``."""
    try:
        about = json.loads((stage / SNAPSHOT_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        about = None
    if not isinstance(about, dict) or about.get("format") != SNAPSHOT_FORMAT:
        raise BadInput(
            f"{snap} is not a flowsearch snapshot (no readable {SNAPSHOT_NAME})",
            "pass a directory or .tar that `flowsearch snapshot` wrote",
        )
    return about


def restore(
    snapshot_path: str | os.PathLike[str], index_dir: str | os.PathLike[str]
) -> RestoreResult:
    """Make a new, verified index at ``index_dir`` from a snapshot (a directory or ``.tar``
    that :func:`snapshot` wrote). Its manifest's ``restored_from`` names the snapshot.

    Raises:
        NotFound: no snapshot there, or no folder for ``index_dir``.
        BadInput: not a snapshot, or ``index_dir`` exists.
        IndexDamaged: a file of the snapshot is missing, changed or corrupt (nothing written).
    """
    snap = check_path(snapshot_path, "snapshot_path", "a snapshot's path")
    target = check_path(index_dir, "index_dir", "a new index directory")
    if not snap.exists():
        raise NotFound(f"no snapshot at {snap}", "pass the path `flowsearch snapshot` wrote")
    _check_dest(target)
    with _aside(target) as stage:
        _unpack(snap, stage)
        about = _about(stage, snap)
        try:
            manifest = mf.read(stage)
            checked = verify(stage, manifest, checksums=True)
        except (IndexDamaged, NotFound) as exc:
            raise IndexDamaged(
                f"the snapshot {snap} is damaged: {_in_words(exc, stage, snap).problem}"
                if isinstance(exc, IndexDamaged)
                else f"the snapshot {snap} has no manifest",
                "take another snapshot",
            ) from None
        (stage / SNAPSHOT_NAME).unlink()
        origin = mf.RestoreOrigin(
            snapshot=str(snap.resolve()),
            source=str(about.get("source", "")),
            source_version=manifest.version,
            snapshot_time=str(about.get("time", "")),
        )
        try:
            with open_writer(stage) as writer:
                published = writer.publish(
                    kind="restore", n_rows=manifest.n_live, restored_from=origin,
                    detail={"snapshot": origin.snapshot, "source": origin.source,
                            "source_version": origin.source_version},
                )  # fmt: skip
        except FlowsearchError as exc:
            raise type(exc)(exc.problem.replace(str(stage), str(target)), exc.fix) from None
        fsync_tree(stage)
        os.rename(stage, target)
        fsync_dir(target.parent)
    return RestoreResult(path=str(target.resolve()), snapshot=origin.snapshot,
                         source=origin.source, source_version=origin.source_version,
                         version=published.version, n_live=published.n_live,
                         verified=checked)  # fmt: skip
