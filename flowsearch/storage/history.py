r"""The history of writes: ``history.jsonl`` beside the manifest, one JSON line per write.

Every published version appends one line (:class:`~flowsearch.storage.manifest.WriteRecord`:
its version, kind, time, rows and what it reported). Nothing that opens an index reads it; only
``info --history`` does, so the manifest stays small however many writes there were.

The manifest is the commit point and the log follows it: the writer appends a version's line
right after publishing it. A crash between the two leaves the log one line short (and a crash
inside an append a torn last line): the next writer, under the lock, trims a torn line and
appends the missing record from the manifest's ``last_write`` (:func:`repair`).

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> append(root, WriteRecord(version=1, kind="build", time="t", n_rows=3))
    >>> [r.kind for r in read(root)]
    ['build']
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from flowsearch.atomic import fsync_dir
from flowsearch.errors import IndexDamaged
from flowsearch.storage.layout import HISTORY_NAME
from flowsearch.storage.records import Manifest, WriteRecord

__all__ = ["append", "read", "repair", "verify"]


def append(index_dir: Path, record: WriteRecord) -> None:
    """Append one record (one line, flushed to disk)."""
    path = Path(index_dir) / HISTORY_NAME
    line = json.dumps(record.model_dump(mode="json"), ensure_ascii=False, sort_keys=True) + "\n"
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


def _lines(index_dir: Path) -> tuple[list[bytes], bool]:
    """The log's complete lines, and whether a torn (unterminated) line follows them."""
    path = Path(index_dir) / HISTORY_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], False
    lines = data.split(b"\n")
    torn = bool(lines[-1])
    return [line for line in lines[:-1] if line.strip()], torn


def read(index_dir: Path) -> list[WriteRecord]:
    """Every complete record, oldest first (a torn last line is ignored).

    Raises:
        IndexDamaged: a complete line that is not a record.
    """
    out = []
    lines, _ = _lines(index_dir)
    for number, line in enumerate(lines, 1):
        try:
            out.append(WriteRecord.model_validate_json(line))
        except ValidationError:
            raise IndexDamaged(
                f"{Path(index_dir) / HISTORY_NAME} line {number} is not a write record",
                "remove that line (the index itself is not affected)",
            ) from None
    return out


def repair(index_dir: Path, manifest: Manifest | None) -> None:
    """Trim a torn last line and append the current version's record if it is missing
    (called by the writer, with the lock held)."""
    path = Path(index_dir) / HISTORY_NAME
    lines, torn = _lines(index_dir)
    if torn:
        keep = b"".join(line + b"\n" for line in lines)
        with open(path, "r+b") as handle:
            handle.truncate(len(keep))
            os.fsync(handle.fileno())
    if manifest is None or manifest.last_write is None:
        return
    last = 0
    if lines:
        try:
            last = WriteRecord.model_validate_json(lines[-1]).version
        except ValidationError:
            raise IndexDamaged(
                f"{path} line {len(lines)} is not a write record",
                "remove that line (the index itself is not affected)",
            ) from None
    if last < manifest.version and manifest.last_write.version == manifest.version:
        append(index_dir, manifest.last_write)


def verify(index_dir: Path, manifest: Manifest) -> int:
    """Check the log: complete records, versions increasing, none newer than the manifest.

    Returns the number of records. A log one record short of the manifest (a write that
    crashed before appending) is allowed: the next write repairs it.

    Raises:
        IndexDamaged: naming the first problem.
    """
    records = read(index_dir)
    versions = [r.version for r in records]
    if any(b <= a for a, b in zip(versions, versions[1:])):
        raise IndexDamaged(
            f"{Path(index_dir) / HISTORY_NAME} lists versions out of order", "remove the bad lines"
        )
    if versions and versions[-1] > manifest.version:
        raise IndexDamaged(
            f"{Path(index_dir) / HISTORY_NAME} records version {versions[-1]}, newer than the "
            f"manifest's {manifest.version}",
            "restore the manifest or remove those lines",
        )
    return len(records)
