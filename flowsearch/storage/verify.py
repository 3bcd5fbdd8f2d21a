r"""Checking a version's files against its manifest.

Every file a version references (each segment's parts, vector index, postings, keys and deletion
file, the calibrator's files, the reference sample's base and deltas) must be there with its
recorded size; small files (at most :data:`CHEAP_CHECKSUM_BYTES`) are checksummed on every
open, all of them with ``checksums=True`` (``info --verify``, ``Searcher.open(verify=True)``),
which also checks the history log and that each segment's ``key_ids.arrow`` holds the ids its
keys were hashed from.

**Strays**, one rule wherever they are: a file no version names (in a segment's, the
calibrator's, a postings or reference sample directory, or higher up in the index directory) is
listed in :attr:`Verification.strays` (``info --verify`` warns of them), never read, and removed
by the next write's tidy-up (:func:`flowsearch.storage.cleanup.clean`). Older deletion files,
which earlier versions still use, the previous version's directories and a killed atomic
write's temporary files are not strays.

Example:
    >>> verify(Path("idx"), read(Path("idx")), checksums=True).n_hashed  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from flowsearch.errors import IndexDamaged
from flowsearch.storage import history
from flowsearch.storage import manifest as mf
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.layout import (
    CALIBRATORS_DIR,
    HISTORY_NAME,
    KEY_IDS_FILE,
    LOCK_NAME,
    MANIFEST_NAME,
    REFERENCES_DIR,
    SEGMENTS_DIR,
    STAGE_PREFIX,
)

__all__ = ["Verification", "is_leftover", "root_strays", "size_on_disk", "verify", "verify_files"]

#: Files at most this large are checksummed on every open (cheap next to opening them); larger
#: ones only when asked (``checksums=True``).
CHEAP_CHECKSUM_BYTES = 16 * 2**20


class Verification(BaseModel):
    """What was checked: files present with their recorded sizes (``n_files``), how many were
    checksummed, the large ones that were not, the history's records (with checksums), and the
    stray files found (paths no version names: ignored, removed by the next write)."""

    model_config = ConfigDict(frozen=True)
    n_files: int = 0
    n_hashed: int = 0
    not_hashed: tuple[str, ...] = ()
    history_records: int | None = None
    strays: tuple[str, ...] = ()

    def __add__(self, other: Verification) -> Verification:
        return Verification(
            n_files=self.n_files + other.n_files,
            n_hashed=self.n_hashed + other.n_hashed,
            not_hashed=self.not_hashed + other.not_hashed,
            history_records=other.history_records or self.history_records,
            strays=self.strays + other.strays,
        )

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict."""
        return self.model_dump(mode="json")


def verify_files(
    folder: Path,
    files: Mapping[str, mf.FileRecord],
    checksums: bool = False,
    *,
    small: bool = True,
) -> Verification:
    """Check ``files`` (relative to ``folder``): present, recorded size, sha256 when small
    (unless ``small`` is False: sizes only) or ``checksums``.

    Raises:
        IndexDamaged: naming the first file missing or different.
    """
    hashed, skipped = 0, []
    cheap = CHEAP_CHECKSUM_BYTES
    for relpath, record in files.items():
        path = folder / relpath
        if not path.is_file():
            raise IndexDamaged(f"index file missing: {path}", "the index is damaged; rebuild it")
        size = path.stat().st_size
        if size != record.bytes:
            raise IndexDamaged(
                f"index file changed: {path} has {size} bytes, the manifest says {record.bytes}",
                "the index is damaged; rebuild it",
            )
        if checksums or (small and size <= cheap):
            if mf.sha256_file(path) != record.sha256:
                raise IndexDamaged(
                    f"checksum mismatch for {path}", "the index is corrupt; rebuild it"
                )
            hashed += 1
        else:
            skipped.append(str(path))
    return Verification(n_files=len(files), n_hashed=hashed, not_hashed=tuple(skipped))


def _strays(folder: Path, files: Mapping[str, mf.FileRecord]) -> Verification:
    """The files under ``folder`` that ``files`` does not name (older deletion files and a
    killed atomic write's temporary files excepted)."""
    found = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel not in files and not is_leftover(path.name):
            found.append(str(path))
    return Verification(strays=tuple(sorted(found)))


def is_leftover(name: str) -> bool:
    """A name the writer leaves on purpose or removes itself: an older deletion file (earlier
    versions use it), a temporary file of an atomic write, a staging directory."""
    temporary = name.startswith(".") and ".tmp-" in name
    return temporary or name.startswith(("deleted-v", STAGE_PREFIX))


#: What the index directory holds besides its manifest (format 3).
_ROOT_NAMES = {MANIFEST_NAME, HISTORY_NAME, LOCK_NAME, SEGMENTS_DIR}
_ROOT_NAMES |= {CALIBRATORS_DIR, REFERENCES_DIR}
#: The names of the entries of each of the index directory's folders (any version's).
_ENTRY = {
    SEGMENTS_DIR: re.compile(r"s\d{6}"),
    CALIBRATORS_DIR: re.compile(r"c\d{6}"),
    REFERENCES_DIR: re.compile(r"r\d{6}"),
}


def root_strays(index_dir: Path) -> list[Path]:
    """What the index directory (format 3) and its three folders hold that is not an index
    part by its name: a file or directory some other program put there."""
    found = []
    for path in index_dir.iterdir():
        if path.name not in _ROOT_NAMES and not is_leftover(path.name):
            found.append(path)
    for kind, pattern in _ENTRY.items():
        folder = index_dir / kind
        for path in folder.iterdir() if folder.is_dir() else ():
            if not pattern.fullmatch(path.name) and not is_leftover(path.name):
                found.append(path)
    return sorted(found)


def verify(
    index_dir: Path,
    manifest: mf.Manifest,
    checksums: bool = False,
    *,
    segments: Iterable[str] | None = None,
    calibrator: bool = True,
) -> Verification:
    """Check a version's files (only the named ``segments``, and the calibrator unless told
    not to: a reader re-opening a newer version checks only what it has not seen).

    Raises:
        IndexDamaged: naming the first file that is missing or differs (a stray file is no
            damage: it is listed in the result's ``strays``).
    """
    index_dir = Path(index_dir)
    wanted = None if segments is None else set(segments)
    out = Verification()
    if calibrator:
        folder = index_dir / manifest.calibration.path
        out += verify_files(folder, manifest.calibration.files, checksums)
        # a calibrator of its own directory (not an older format's files in the index's)
        if manifest.format_version >= 3 and folder.resolve() != index_dir.resolve():
            out += _strays(folder, manifest.calibration.files)
    sample = manifest.reference.sample if manifest.reference is not None else None
    for piece in sample.pieces if calibrator and sample is not None else ():
        out += verify_files(index_dir / piece.path, piece.files, checksums)
        out += _strays(index_dir / piece.path, piece.files)  # a base or delta: its own folder
    for seg in manifest.segments:
        if wanted is not None and seg.name not in wanted:
            continue
        folder = index_dir / seg.dir
        out += verify_files(folder, seg.files, checksums)
        if manifest.format_version >= 3:
            out += _strays(folder, seg.files)
        if checksums and KEY_IDS_FILE in seg.files:  # the ids confirm lookups: they must agree
            KeyIndex.load(folder, seg.n_rows, ids=True).check(folder)
    if checksums and manifest.format_version >= 3:
        out = out.model_copy(update={"history_records": history.verify(index_dir, manifest)})
    if calibrator and wanted is None and manifest.format_version >= 3:
        more = tuple(str(p) for p in root_strays(index_dir))
        out = out.model_copy(update={"strays": out.strays + more})
    return out


def size_on_disk(root: Path) -> int:
    """Total bytes of the files under ``root`` (a file: its size)."""
    root = Path(root)
    if root.is_file():
        return root.stat().st_size
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
