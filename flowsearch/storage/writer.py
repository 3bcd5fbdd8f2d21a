r"""The one version writer: lock, stage the parts of a version, publish it atomically, clean up.

Every write (build, add, upsert, delete, compact, recalibrate, the Ray engine) goes through
:func:`open_writer`, and nothing else writes an index file:

1. take the index's writer lock (``filelock``; ``wait`` seconds, else refuse at once), read the
   current version (the *base*), repair the history log, remove what dead writers left;
2. the write hands over its parts: new segments written into :meth:`Writer.stage` directories
   (:meth:`Writer.add_segment`), deletion files (:meth:`Writer.delete_rows`), segments to drop
   (:meth:`Writer.drop_segments`), a new calibrator (:meth:`Writer.set_calibrator`);
3. :meth:`Writer.publish` flushes the staged directories, renames them into place, and replaces
   ``manifest.json`` with ``os.replace``: the one atomic step that makes the version current;
   then it appends the history line and removes what neither this version nor the one before
   it references.

**What readers keep.** A reader (a ``Searcher``) opens every file of the version it pins when it
opens it, and holds the handles (Parquet and FAISS memory maps, loaded arrays): on POSIX an open
file outlives its directory entry, so cleanup may remove a version's files while a reader still
answers from them, and never needs to know who reads. A reader that read a manifest but had not
yet opened its files when a cleanup removed them reads the manifest again (it retries). Files
referenced by the current or the previous version are kept, so that race needs two writes
within one open.

A crash (SIGKILL, power loss) at any moment leaves the previous version whole: staged
directories and unreferenced segments are removed by the next writer, and a history line lost
between the manifest and the log is appended again from the manifest's ``last_write``.

Indexes of formats 1 and 2 are converted on their first write: their one version becomes
segment ``s000001`` (files hard-linked, ids keyed, deletions carried over).

Example:
    >>> with open_writer("idx") as w:  # doctest: +SKIP
    ...     stage = w.stage()
    ...     ...  # write the segment's files into stage
    ...     w.add_segment(stage, n_rows=..., parts=..., ann=..., postings=..., keys=...)
    ...     w.publish(kind="add", n_rows=...)
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import numbers
import os
import secrets
import shutil
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import filelock
import numpy as np

from flowsearch._version import __version__
from flowsearch.atomic import atomic_write_text, fsync_dir, fsync_paths, fsync_tree
from flowsearch.errors import BadInput, FlowsearchError, IndexDamaged, IndexLocked, WriteFailed
from flowsearch.storage import deletions, history
from flowsearch.storage import manifest as mf
from flowsearch.storage.cleanup import check_target, clean, remove_failed_first_build
from flowsearch.storage.layout import (
    LOCK_NAME,
    MANIFEST_NAME,
    SEGMENTS_DIR,
    STAGE_PREFIX,
    calibrator_dir,
    deletions_file,
    reference_dir,
    segment_dir,
    segment_name,
)
from flowsearch.storage.verify import verify

__all__ = ["Writer", "file_records", "open_writer", "referenced", "sample_record"]

LOG = logging.getLogger(__name__)


def file_records(directory: Path) -> dict[str, mf.FileRecord]:
    """Size and sha256 of every file under ``directory`` (paths relative to it)."""
    out = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        out[rel] = mf.FileRecord(bytes=path.stat().st_size, sha256=mf.sha256_file(path))
    return out


def referenced(manifest: mf.Manifest | None) -> set[str]:
    """Every path (relative to the index directory) a version needs: segment directories,
    their files, the calibrator directory and its files, the reference sample's."""
    if manifest is None:
        return set()
    cal = manifest.calibration
    out = {cal.path, *(f"{cal.path}/{rel}" for rel in cal.files)}
    sample = sample_record(manifest)
    for piece in sample.pieces if sample is not None else ():  # the base and its deltas
        out.add(piece.path)
        out.update(f"{piece.path}/{rel}" for rel in piece.files)
    for seg in manifest.segments:
        out.add(seg.dir)
        out.update(f"{seg.dir}/{rel}" if seg.dir != "." else rel for rel in seg.files)
    return out


def sample_record(manifest: mf.Manifest | None) -> mf.SampleRecord | None:
    """The reference sample a version records (``reference.sample``: its directory and files,
    paths checked when the manifest was read), or None."""
    if manifest is None or manifest.reference is None:
        return None
    return manifest.reference.sample


class Writer:
    """A version being written under the lock (see the module docstring); from
    :func:`open_writer`.

    Attributes:
        index_dir: the index directory.
        base: the current version (None for a first build).
        number: the number the new version gets.
        segments: the new version's segments as staged so far (base's, minus dropped, plus
            added, with new deletion files).
    """

    def __init__(self, index_dir: Path, base: mf.Manifest | None, new: bool) -> None:
        self.index_dir = index_dir
        self.base = base
        self.number = 1 if base is None else base.version + 1
        self.segments: list[mf.SegmentRecord] = [] if new or base is None else list(base.segments)
        self._next_segment = 1 if base is None else base.next_segment
        self._staged: dict[str, Path] = {}  # segment name -> its staging directory
        self._unflushed: list[Path] = []  # deletion files written into published segments
        self._calibrator: tuple[Path, mf.CalibrationSpec] | None = None
        self._sample: tuple[Path, str] | None = None
        self._stages: list[Path] = []
        self._tidied = False
        self.published: mf.Manifest | None = None

    # -- staging ---------------------------------------------------------------------------

    def stage(self, kind: str = SEGMENTS_DIR) -> Path:
        """A fresh empty directory to write a segment (or a calibrator) into."""
        folder = self.index_dir / kind
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{STAGE_PREFIX}{secrets.token_hex(6)}"
        self._stages.append(path)  # before it exists: an interrupt between leaves nothing
        path.mkdir()
        return path

    def add_segment(self, stage: Path, **fields: Any) -> mf.SegmentRecord:
        """Add the segment written in ``stage`` (fields of :class:`SegmentRecord` but ``name``,
        ``dir`` and ``files``, which are assigned here). Returns its record."""
        name = segment_name(self._next_segment)
        self._next_segment += 1
        record = mf.SegmentRecord(
            name=name, dir=segment_dir(name), files=file_records(stage), **fields
        )
        self._staged[name] = stage
        self.segments.append(record)
        return record

    def relink_segment(
        self, name: str, stage: Path, files: dict[str, mf.FileRecord], **fields: Any
    ) -> mf.SegmentRecord:
        """Replace segment ``name`` by the same rows in ``stage`` (its files hard-linked there,
        some added or rewritten: an upgrade, :mod:`flowsearch.storage.upgrade`), under a new
        name at the same place. ``files``: every file's record (a hard-linked file keeps its
        recorded size and checksum: nothing is re-read); ``fields``: record fields to change.
        A published segment is never written into (readers of older versions keep it)."""
        at = next(i for i, s in enumerate(self.segments) if s.name == name)
        new = segment_name(self._next_segment)
        self._next_segment += 1
        record = self.segments[at].model_copy(
            update={"name": new, "dir": segment_dir(new), "files": files, **fields}
        )
        self._staged[new] = stage
        self.segments[at] = record
        return record

    def drop_segments(self, names: Sequence[str]) -> None:
        """Leave the named segments out of the new version (a merge replaced them)."""
        gone = set(names)
        self.segments = [s for s in self.segments if s.name not in gone]

    def segment_path(self, record: mf.SegmentRecord) -> Path:
        """Where a segment's files are now (its staging directory until published)."""
        return self._staged.get(record.name) or self.index_dir / record.dir

    def delete_rows(self, name: str, rows: np.ndarray) -> mf.SegmentRecord:
        """Mark local ``rows`` of segment ``name`` deleted (added to those already deleted):
        writes the segment's new deletion file. Returns the updated record."""
        at = next(i for i, s in enumerate(self.segments) if s.name == name)
        seg = self.segments[at]
        folder = self.segment_path(seg)
        old = np.zeros(0, np.int64)
        if seg.deletions is not None:
            old = deletions.read_rows(folder / seg.deletions, seg.n_rows)
        rel = deletions_file(self.number)
        rows = np.union1d(old, np.asarray(rows, np.int64))
        # flushed at publish (_place_stages), all of the write's at once: a staged segment's
        # with its tree, a published one's with its directory
        count = deletions.write(folder / rel, rows, durable=False)
        if seg.name not in self._staged:
            self._unflushed.append(folder / rel)
        files = {k: v for k, v in seg.files.items() if k != seg.deletions}
        files[rel] = mf.FileRecord(
            bytes=(folder / rel).stat().st_size, sha256=mf.sha256_file(folder / rel)
        )
        seg = seg.model_copy(update={"deletions": rel, "n_deleted": count, "files": files})
        self.segments[at] = seg
        return seg

    def set_calibrator(self, stage: Path, spec: mf.CalibrationSpec) -> mf.CalibrationSpec:
        """Use the calibrator saved in ``stage`` (from :meth:`stage` with ``calibrators``)."""
        spec = spec.model_copy(
            update={"path": calibrator_dir(self.number), "files": file_records(stage)}
        )
        self._calibrator = (stage, spec)
        return spec

    def set_reference_sample(self, stage: Path) -> mf.SamplePiece:
        """Use the reference sample (a base, or a delta on the base version's) saved in
        ``stage`` (from :meth:`stage` with ``references``). Returns the directory's record
        (``path`` and ``files``), for the manifest's ``reference.sample``."""
        path = reference_dir(self.number)
        self._sample = (stage, path)
        return mf.SamplePiece(path=path, files=file_records(stage))

    # -- publishing ------------------------------------------------------------------------

    def publish(
        self,
        *,
        kind: str,
        n_rows: int,
        detail: dict[str, Any] | None = None,
        template: mf.Manifest | None = None,
        **changes: Any,
    ) -> mf.Manifest:
        """Make the staged version current (atomically) and log it.

        Args:
            kind: the write's kind (``build``, ``add``, ``upsert``, ``delete``, ...).
            n_rows: rows it wrote or deleted.
            detail: what it reported (logged in the history).
            template: the manifest's other fields for a first build (else the base's).
            changes: manifest fields to change.
        """
        start = template if template is not None else self.base
        if start is None:
            raise ValueError("a first build needs a template manifest")
        record = mf.WriteRecord(
            version=self.number, kind=kind, time=mf.utc_now(), n_rows=n_rows, detail=detail or {}
        )
        if self._calibrator is not None:
            changes["calibration"] = self._calibrator[1]
        update = {
            "format_version": mf.FORMAT_VERSION,
            "version": self.number,
            "segments": tuple(self.segments),
            "next_segment": self._next_segment,
            "updated": record.time if self.base is not None and template is None else None,
            "created": start.created or record.time,
            "flowsearch_version": __version__,
            "last_write": record,
            **changes,
        }
        manifest = start.model_copy(update=update)
        if isinstance(manifest.reference, Mapping):  # given in its JSON form: typed here
            reference = mf.ReferenceRecord.model_validate(manifest.reference)
            manifest = manifest.model_copy(update={"reference": reference})
        self._place_stages()
        text = json.dumps(_with_checksum(manifest), indent=1, ensure_ascii=False) + "\n"
        atomic_write_text(self.index_dir / MANIFEST_NAME, text)
        self.published = manifest
        history.append(self.index_dir, record)
        self._tidy()
        return manifest

    def _tidy(self) -> None:
        """Remove the write's staged directories (those placed are gone already: a build's
        scratch is not) and, once published, what neither this version nor the one before
        references; a Ctrl-C waits for it. Run by :meth:`publish` itself, so that a Ctrl-C
        after it finds nothing to tidy (one landing between the write's end and the way out
        of :func:`open_writer`, before the tidy-up there held it back, left a staged
        directory), and again on the way out, for a write that failed before publishing."""
        with _interrupts_deferred():
            for stage in self._stages:  # every time: cheap once they are gone
                shutil.rmtree(stage, ignore_errors=True)
            if self.published is not None and not self._tidied:
                clean(self.index_dir, referenced(self.published) | referenced(self.base))
                self._tidied = True

    def _check_base(self) -> None:
        """Refuse to write over a damaged index, before the write stages anything: every file
        of the version it starts from (segments, calibrator, reference sample) is there with
        its recorded size, and the small ones (what an open hashes) with their checksum; so
        no write publishes a version that an open would refuse. Large files' checksums are
        ``info --verify``'s."""
        if self.base is not None:
            verify(self.index_dir, self.base)

    def _place_stages(self) -> None:
        """Flush the staged directories and rename them to their final names."""
        moves = [
            (self._staged[s.name], self.index_dir / s.dir)
            for s in self.segments
            if s.name in self._staged
        ]
        if self._calibrator is not None:
            moves.append((self._calibrator[0], self.index_dir / self._calibrator[1].path))
        if self._sample is not None:
            moves.append((self._sample[0], self.index_dir / self._sample[1]))
        for stage, target in moves:
            fsync_tree(stage)
            if target.exists():  # a dead writer's, which no manifest references
                shutil.rmtree(target)
            os.rename(stage, target)
            fsync_dir(target.parent)
        kept = {self.index_dir / s.dir for s in self.segments if s.name not in self._staged}
        files = [f for f in self._unflushed if f.parent in kept]  # not of a dropped segment
        fsync_paths([*files, *{f.parent for f in files}])  # before the manifest names them


def _with_checksum(manifest: mf.Manifest) -> dict[str, Any]:
    raw = manifest.to_json_dict()
    raw["checksum"] = mf.checksum(raw)
    return raw


def _check_wait(wait: float | None) -> None:
    """Refuse a ``wait`` that is not None or a finite number of seconds >= 0."""
    number = isinstance(wait, numbers.Real) and not isinstance(wait, bool)
    if wait is not None and (not number or not math.isfinite(wait) or wait < 0):
        raise BadInput(
            f"wait must be a number of seconds >= 0, got {wait!r}",
            "pass {wait=SECONDS}, or leave it out to refuse at once when another write runs",
            param="wait",
        )


@contextlib.contextmanager
def _lock(index_dir: Path, wait: float | None) -> Iterator[None]:
    """Hold ``index_dir/.lock``; wait up to ``wait`` seconds for another writer (0: refuse)."""
    try:
        index_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. /proc/nope: a place no directory can be made
        raise _os_error(exc, index_dir) from None
    lock = filelock.FileLock(str(index_dir / LOCK_NAME), timeout=max(0.0, float(wait or 0)))
    try:
        lock.acquire()
    except filelock.Timeout:
        waited = f" for {wait:g} s" if wait else ""
        raise IndexLocked(
            f"another flowsearch process is writing {index_dir} (waited{waited or ' not at all'})",
            "retry when it is done, or pass {wait=SECONDS} to wait for it",
            param="wait",
        ) from None
    except PermissionError as exc:
        raise WriteFailed(
            f"cannot write to {index_dir} ({exc.strerror})", "fix its permissions"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _os_error(exc: OSError, root: Path) -> FlowsearchError:
    """One line for an OSError met while writing, with the fix its cause calls for."""
    where = f": {exc.filename}" if exc.filename else ""
    detail = f"{exc.strerror or exc}{where}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return WriteFailed(f"the disk is full ({detail}); {root} is unchanged", "free some space")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return WriteFailed(
            f"not allowed to write ({detail}); {root} is unchanged", "fix permissions"
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return WriteFailed(
            f"cannot make the index directory {root} ({detail})",
            "choose an index directory in a folder you can write to",
        )
    return WriteFailed(f"the write to {root} failed ({detail}); it is unchanged", "retry")


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back until the block is done (a writer's tidy-up interrupted
    half-way would leave a staged directory), then act on one that came meanwhile as its
    handler would have. Python runs signal handlers in the main thread only: elsewhere the
    block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous: dict[int, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not None:  # None: set outside Python, which we could not put back
            previous[signum] = signal.signal(signum, lambda n, _f: pending.append(n))
    try:
        yield
    finally:
        for held, handler in previous.items():
            signal.signal(held, handler)
        if pending:
            came = previous[pending[0]]
            if callable(came):
                came(pending[0], None)  # Ctrl-C: KeyboardInterrupt, raised now
            elif came == signal.SIG_DFL:
                os.kill(os.getpid(), pending[0])  # its default action (SIGTERM: exit)


@contextlib.contextmanager
def open_writer(
    index_dir: str | os.PathLike[str],
    *,
    new: bool = False,
    overwrite: bool = False,
    wait: float | None = None,
) -> Iterator[Writer]:
    """Take the writer lock and start the next version (see the module docstring).

    Args:
        index_dir: the index directory.
        new: a build from scratch: an existing index is replaced only with ``overwrite``.
        overwrite: see ``new``.
        wait: seconds to wait for another writer (None or 0: refuse at once).

    Raises:
        NotFound: no index (``new=False``).
        BadInput: the target is not ours, or exists without ``overwrite`` (``new=True``).
        IndexLocked: another writer holds the lock past ``wait``.
        WriteFailed: the disk refused a write (nothing published).
    """
    _check_wait(wait)
    root = Path(index_dir).expanduser()
    if new:
        check_target(root, overwrite)
    else:
        mf.read(root)  # "no index at ...", before creating anything
    # a first build into nothing, or into an empty directory, leaves nothing if it fails
    existed = root.is_dir()
    created = not root.exists() or (existed and not any(root.iterdir()))
    with _lock(root, wait):
        writer = None
        try:
            writer = _start(root, new, overwrite)
            yield writer
        except OSError as exc:
            raise _os_error(exc, root) from None
        finally:
            with _interrupts_deferred():  # a Ctrl-C now waits for the tidy-up to finish
                if writer is not None:
                    writer._tidy()  # done already if it published
                if created and not mf.is_index_dir(root):
                    remove_failed_first_build(root, keep_root=existed)


def _start(root: Path, new: bool, overwrite: bool) -> Writer:
    base = mf.read(root) if mf.is_index_dir(root) else None
    if new:
        check_target(root, overwrite)  # again: another writer may have published meanwhile
    elif base is None:
        raise IndexDamaged(f"{root} is not a flowsearch index (no {MANIFEST_NAME})")
    history.repair(root, base if base is not None and base.format_version == 3 else None)
    clean(root, referenced(base))
    writer = Writer(root, base, new)
    if not new and base is not None and base.format_version == mf.FORMAT_VERSION:
        writer._check_base()
    if not new and base is not None and base.format_version < mf.FORMAT_VERSION:
        from flowsearch.storage.legacy import convert

        convert(writer)
    return writer
