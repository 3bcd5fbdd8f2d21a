r"""Checking a version's files against its manifest.

Every file a version references (each segment's parts, vector index, postings, keys and deletion
file, the calibrator's files, the reference sample's base and deltas) must be there with its
recorded size; small files (at most :data:`CHEAP_CHECKSUM_BYTES`) are checksummed on every
open, all of them with ``checksums=True`` (``info --verify``, ``Searcher.open(verify=True)``),
which also checks the history log and that each segment's ``key_ids.arrow`` holds the ids its
keys were hashed from. A file in a segment's, the calibrator's or a reference sample
piece's directory that the manifest does not name is refused (older deletion files, which earlier
versions still use, and a killed atomic write's temporary file excepted; the next writer removes
both).

Example:
    >>> verify(Path("idx"), read(Path("idx")), checksums=True).n_hashed  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from flowsearch.errors import IndexDamaged
from flowsearch.storage import history
from flowsearch.storage import manifest as mf
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.layout import KEY_IDS_FILE

__all__ = ["Verification", "size_on_disk", "verify", "verify_files"]

#: Files at most this large are checksummed on every open (cheap next to opening them); larger
#: ones only when asked (``checksums=True``).
CHEAP_CHECKSUM_BYTES = 16 * 2**20


class Verification(BaseModel):
    """What was checked: files present with their recorded sizes (``n_files``), how many were
    checksummed, the large ones that were not, and the history's records (with checksums)."""

    model_config = ConfigDict(frozen=True)
    n_files: int = 0
    n_hashed: int = 0
    not_hashed: tuple[str, ...] = ()
    history_records: int | None = None

    def __add__(self, other: Verification) -> Verification:
        return Verification(
            n_files=self.n_files + other.n_files,
            n_hashed=self.n_hashed + other.n_hashed,
            not_hashed=self.not_hashed + other.not_hashed,
            history_records=other.history_records or self.history_records,
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


def _extra_files(folder: Path, files: Mapping[str, mf.FileRecord]) -> None:
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        leftover = rel.startswith("deleted-v") or (path.name.startswith(".") and ".tmp-" in rel)
        if path.is_file() and rel not in files and not leftover:
            raise IndexDamaged(
                f"unexpected file in the index: {path}", "remove it or rebuild the index"
            )


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
        IndexDamaged: naming the first file that is missing, extra, or differs.
    """
    index_dir = Path(index_dir)
    wanted = None if segments is None else set(segments)
    out = Verification()
    if calibrator:
        folder = index_dir / manifest.calibration.path
        out += verify_files(folder, manifest.calibration.files, checksums)
        # a calibrator of its own directory (not an older format's files in the index's)
        if manifest.format_version >= 3 and folder.resolve() != index_dir.resolve():
            _extra_files(folder, manifest.calibration.files)
    sample = manifest.reference.sample if manifest.reference is not None else None
    for piece in sample.pieces if calibrator and sample is not None else ():
        out += verify_files(index_dir / piece.path, piece.files, checksums)
        _extra_files(index_dir / piece.path, piece.files)  # a base or delta: its own directory
    for seg in manifest.segments:
        if wanted is not None and seg.name not in wanted:
            continue
        folder = index_dir / seg.dir
        out += verify_files(folder, seg.files, checksums)
        if manifest.format_version >= 3:
            _extra_files(folder, seg.files)
        if checksums and KEY_IDS_FILE in seg.files:  # the ids confirm lookups: they must agree
            KeyIndex.load(folder, seg.n_rows, ids=True).check(folder)
    if checksums and manifest.format_version >= 3:
        out = out.model_copy(update={"history_records": history.verify(index_dir, manifest)})
    return out


def size_on_disk(root: Path) -> int:
    """Total bytes of the files under ``root`` (a file: its size)."""
    root = Path(root)
    if root.is_file():
        return root.stat().st_size
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
