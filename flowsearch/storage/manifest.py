r"""The manifest: the one record of what an index version holds (typed, immutable, checksummed).

``manifest.json`` names the encoder that made the vectors, the calibration and the space it
searches, the metadata schema, and the live segments with their files (size and sha256), their
deletion files and their vector indexes. Everything else reads these fields through
:class:`Manifest` (pydantic models, frozen; change one with ``model_copy(update=...)``), and only
the version writer (:mod:`flowsearch.storage.writer`) stores one. Its JSON schema is
:func:`Manifest.model_json_schema`.

The manifest stays small: the history of writes is a log beside it (``history.jsonl``,
:mod:`flowsearch.storage.history`), so a reader's ``refresh()`` parses a few kilobytes whatever
the number of writes. The file carries a checksum of its own content, so an edit by hand is
detected.

Indexes of formats 1 and 2 (earlier releases: a version was one directory) are read as one
legacy segment (:mod:`flowsearch.storage.legacy`); their first write converts them.

Example:
    >>> m = Manifest(encoder=EncoderSpec(model="m", revision="r", pooling="mean",
    ...              max_length=8, dim=4), dim=4,
    ...              calibration=CalibrationSpec(name="none", calibrator="none", space="encoder"),
    ...              columns=Columns(text="text", id="id"))
    >>> m.n_rows, m.calibration.calibrated
    (0, False)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from flowsearch.errors import BadInput, IndexDamaged, NotFound
from flowsearch.jsonable import JSONObject
from flowsearch.storage.layout import MANIFEST_NAME
from flowsearch.storage.records import (
    FORMAT,
    FORMAT_VERSION,
    STORED,
    AnnCurve,
    AnnProjection,
    AnnRecord,
    AnnTuning,
    AutoDecision,
    CalibrationSpec,
    Columns,
    DensityStats,
    EncoderSpec,
    FileRecord,
    HeldOut,
    LexicalSpec,
    Manifest,
    PartRecord,
    PassageSpec,
    ReferenceMethod,
    ReferenceRecord,
    RestoreOrigin,
    SamplePiece,
    SampleRecord,
    SchemaColumn,
    SegmentRecord,
    WriteRecord,
    safe_relpath,
    sha256_file,
    utc_now,
)

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "AnnCurve",
    "AnnProjection",
    "AnnRecord",
    "AnnTuning",
    "AutoDecision",
    "CalibrationSpec",
    "Columns",
    "DensityStats",
    "EncoderSpec",
    "FileRecord",
    "HeldOut",
    "LexicalSpec",
    "Manifest",
    "PartRecord",
    "PassageSpec",
    "ReferenceMethod",
    "ReferenceRecord",
    "RestoreOrigin",
    "SamplePiece",
    "SampleRecord",
    "SchemaColumn",
    "SegmentRecord",
    "WriteRecord",
    "MANIFEST_NAME",
    "checksum",
    "from_json",
    "is_index_dir",
    "read",
    "read_raw",
    "safe_relpath",
    "sha256_file",
    "utc_now",
]


def checksum(raw: Mapping[str, object]) -> str:
    """sha256 of a manifest's canonical JSON, without its own ``checksum`` field."""
    body = {k: v for k, v in raw.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def is_index_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a manifest that says it is a flowsearch index."""
    try:
        with open(Path(path) / MANIFEST_NAME, encoding="utf-8") as handle:
            return bool(json.load(handle).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError):
        return False


def read_raw(index_dir: str | os.PathLike[str]) -> JSONObject:
    """``index_dir/manifest.json`` as checked JSON (any format version).

    Raises:
        NotFound: no index there.
        IndexDamaged: unreadable, not JSON, or changed after it was written.
    """
    root = Path(index_dir)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        what = "a file, not an index directory" if root.exists() else "missing"
        raise NotFound(
            f"no index at {root} ({what})",
            f"build one with build_index(corpus, {str(root)!r})",
            cli=f"build one with `flowsearch index CORPUS --index {root}`",
            http="start the server on an index directory",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFound(f"{root} is not a flowsearch index (no {MANIFEST_NAME})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise IndexDamaged(f"{path} is unreadable ({exc})", "rebuild the index") from None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise IndexDamaged(f"{path} is not valid JSON ({exc})", "rebuild the index") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise IndexDamaged(f"{path} is not a flowsearch manifest", "rebuild the index")
    if "checksum" in raw and raw["checksum"] != checksum(raw):
        raise IndexDamaged(
            f"{path} was changed after it was written (its checksum does not match)",
            "restore it or rebuild the index",
        )
    return raw


def from_json(raw: Mapping[str, object], where: str = MANIFEST_NAME) -> Manifest:
    """A format-3 :class:`Manifest` from its JSON form.

    Raises:
        IndexDamaged: a missing or malformed field, or a path leaving the index directory.
    """
    try:
        manifest = Manifest.model_validate(dict(raw), context={STORED: True})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ()))
        raise IndexDamaged(
            f"{where} is malformed ({field}: {first.get('msg')})", "rebuild the index"
        ) from None
    names = [s.name for s in manifest.segments]
    if len(set(names)) != len(names):
        raise IndexDamaged(f"{where} names a segment twice", "rebuild the index")
    return manifest


def read(index_dir: str | os.PathLike[str]) -> Manifest:
    """The current version of ``index_dir`` (formats 1 and 2 read as one legacy segment).

    Raises:
        NotFound: no index there.
        IndexDamaged: an unreadable or malformed manifest.
        BadInput: a format newer than this release reads.
    """
    raw = read_raw(index_dir)
    version = raw.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise IndexDamaged(f"manifest has a bad format_version {version!r}", "rebuild the index")
    if version > FORMAT_VERSION:
        raise BadInput(
            f"index format {version} is newer than this flowsearch reads ({FORMAT_VERSION})",
            "upgrade flowsearch or rebuild the index",
        )
    if version < FORMAT_VERSION:
        from flowsearch.storage.legacy import from_legacy

        return from_legacy(raw, Path(index_dir))
    return from_json(raw, str(Path(index_dir) / MANIFEST_NAME))
