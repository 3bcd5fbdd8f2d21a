r"""The manifest: the one place that knows what an index holds.

An index directory's ``manifest.json`` names the encoder that made its vectors, the calibration
and the space it searches, the FAISS index, the columns, every shard and every file with its
size and sha256, the corpus's density statistics and the history of writes. This module is the
only one that reads or writes those fields by name: everything else takes a typed, immutable
:class:`Manifest` and changes it with :func:`dataclasses.replace`.

Versions. Format 2 (this release) publishes every write as a new immutable *version directory*
(``versions/v000002/``) and makes it current by replacing ``manifest.json`` with ``os.replace``:
the manifest is the pointer, so a reader that read it sees one whole version. Every path a
manifest names is relative to its version's ``root`` and is checked to stay inside the index
directory. Format 1 (the first release: the files sat in the index directory itself, ``root``
``"."``) is migrated on read: the first release's ``static`` pooling (the embedding layer's output,
positions included) is named ``embedding_layer`` now.

Example:
    >>> m = from_dict({"format": FORMAT, "format_version": 2, "version": 3,
    ...                "root": "versions/v000003", "encoder": {"model": "m", "revision": "r",
    ...                "pooling": "mean", "max_length": 8, "dim": 4}, "dim": 4,
    ...                "calibration": {"name": "none", "calibrator": "none", "space": "encoder"},
    ...                "faiss": {"factory": "Flat"}, "columns": {"text": "text", "id": "id"},
    ...                "rows": 0})
    >>> m.version, m.encoder.pooling, m.calibration.space
    (3, 'mean', 'encoder')
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from flowsearch.atomic import atomic_write_text
from flowsearch.errors import FlowsearchError

__all__ = [
    "CALIBRATOR_DIR",
    "FAISS_FILE",
    "FORMAT",
    "IVF_DATA_FILE",
    "FORMAT_VERSION",
    "LEXICAL_DIR",
    "MANIFEST_NAME",
    "SHARDS_DIR",
    "TOMBSTONES_FILE",
    "AutoDecision",
    "CalibrationSpec",
    "Columns",
    "DensityStats",
    "EncoderSpec",
    "FaissSpec",
    "FileRecord",
    "HeldOut",
    "LexicalSpec",
    "Manifest",
    "Shard",
    "WriteRecord",
    "file_record",
    "from_dict",
    "is_index_dir",
    "read",
    "safe_relpath",
    "sha256_file",
    "to_dict",
    "utc_now",
    "with_history",
    "write",
]

FORMAT = "flowsearch-index"
#: 1: first release (files in the index directory); 2: version directories, tombstones, lexical.
FORMAT_VERSION = 2
MANIFEST_NAME = "manifest.json"

# The parts of a version directory; the paths a manifest records are relative to it.
CALIBRATOR_DIR = "calibrator"
SHARDS_DIR = "shards"
FAISS_FILE = "index.faiss"
LEXICAL_DIR = "lexical"
#: An IVF index's inverted lists merged on disk (the Ray engine), beside ``index.faiss``.
IVF_DATA_FILE = "index.ivfdata"
#: Deleted rows (global row numbers, sorted int64, ``.npy``).
TOMBSTONES_FILE = "tombstones.npy"


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string (seconds), as manifests store it."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def safe_relpath(value: Any, what: str = "path") -> str:
    """``value`` if it is a relative POSIX path that stays inside its directory.

    Raises:
        FlowsearchError: an absolute path, a ``..`` component, or not a string.
    """
    if not isinstance(value, str) or not value or "\\" in value or "\x00" in value:
        raise FlowsearchError(f"manifest {what} {value!r} is not a relative path; rebuild it")
    pure = PurePosixPath(value)
    if pure.is_absolute() or ".." in pure.parts:
        raise FlowsearchError(
            f"manifest {what} {value!r} leaves the index directory; refusing to open it"
        )
    return value


@dataclass(frozen=True)
class FileRecord:
    """Size and sha256 of one file of a version."""

    bytes: int
    sha256: str


def file_record(path: Path) -> FileRecord:
    """The :class:`FileRecord` of the file at ``path`` (reads it whole)."""
    return FileRecord(bytes=path.stat().st_size, sha256=sha256_file(path))


@dataclass(frozen=True)
class EncoderSpec:
    """What made the vectors: enough to reload the encoder and to refuse a different one.

    Attributes:
        model: the model's name as recorded (hub id, absolute directory, or the bundled id).
        revision: the model's content hash (local) or commit (hub).
        pooling: the pooling name.
        max_length: tokens per text.
        dim: the encoder's output dimension.
        source: how to load it again: None for the bundled model, else the id or directory.
        options: any further fields the encoder's ``describe()`` reports (backend, quantize,
            a static variant, ...), compared like the others.
    """

    model: str
    revision: str
    pooling: str
    max_length: int
    dim: int
    source: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """The fields an encoder's ``describe()`` must reproduce."""
        return {
            "model": self.model,
            "revision": self.revision,
            "pooling": self.pooling,
            "max_length": self.max_length,
            "dim": self.dim,
            **dict(self.options),
        }

    @classmethod
    def from_description(cls, described: Mapping[str, Any], source: str | None) -> EncoderSpec:
        """The spec of an encoder from its ``describe()`` and how it was named."""
        core = {"model", "revision", "pooling", "max_length", "dim"}
        return cls(
            model=str(described["model"]),
            revision=str(described["revision"]),
            pooling=str(described["pooling"]),
            max_length=int(described["max_length"]),
            dim=int(described["dim"]),
            source=source,
            options={k: v for k, v in described.items() if k not in core},
        )


@dataclass(frozen=True)
class AutoDecision:
    """What ``calibration="auto"`` measured and decided: the statistic, its threshold, and
    whether the calibrated space is searched."""

    statistic: str
    threshold: float
    calibrated: bool


@dataclass(frozen=True)
class CalibrationSpec:
    """The calibrator and the searched space.

    Attributes:
        name: what was asked for (``auto``, ``flow``, ``whitening``, ...).
        calibrator: the fitted calibrator's registry name.
        config: its hyper-parameters (as its ``config``).
        space: ``calibrated`` (search the calibrator's output) or ``encoder`` (the raw vectors).
        decision: why that space, in words.
        anisotropy: the corpus's anisotropy statistics.
        fitted_on: ``corpus`` or the directory of a calibrator fitted elsewhere.
        fit_rows: rows the calibrator was fitted on.
        fit_stats: the calibrator's own fit statistics.
        dim_out: dimension of the calibrator's output.
        auto: the :class:`AutoDecision` when ``name == "auto"``.
    """

    name: str
    calibrator: str
    space: str
    config: Mapping[str, Any] = field(default_factory=dict)
    decision: str = ""
    anisotropy: Mapping[str, float] = field(default_factory=dict)
    fitted_on: str = "corpus"
    fit_rows: int = 0
    fit_stats: Mapping[str, Any] = field(default_factory=dict)
    dim_out: int | None = None
    auto: AutoDecision | None = None

    @property
    def calibrated(self) -> bool:
        """True when the index searches the calibrator's output."""
        return self.space == "calibrated"


@dataclass(frozen=True)
class DensityStats:
    """Per-row log-density statistics of a set of rows under the index's flow."""

    mean_log_prob: float
    std_log_prob: float
    p01: float
    p05: float
    median: float
    rows: int


@dataclass(frozen=True)
class HeldOut:
    """Rows kept out of the calibrator's fit, and where they sit: the reference a query or a new
    row is judged against (rows the flow was fitted on flatter it).

    Attributes:
        rows: how many rows were held out.
        density: their log-densities under the flow (None without a flow).
        percents: the percentiles ``top_score`` holds (ascending).
        top_score: each held-out row's best cosine to any other row of the index, in the
            searched space, at ``percents`` (empty when not measured).
    """

    rows: int
    density: DensityStats | None = None
    percents: tuple[float, ...] = ()
    top_score: tuple[float, ...] = ()


@dataclass(frozen=True)
class FaissSpec:
    """The FAISS index: resolved factory string, what was asked for, search parameters."""

    factory: str
    requested: str = "auto"
    params: str = ""


@dataclass(frozen=True)
class LexicalSpec:
    """The BM25 index under ``lexical/`` (rows aligned with the FAISS ids)."""

    path: str = "lexical"
    rows: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Columns:
    """The corpus columns: text, id (None: row numbers are ids), id type, metadata columns."""

    text: str
    id: str | None
    id_type: str = "int"
    metadata: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shard:
    """One Parquet shard (relative to the version root) and its row count."""

    path: str
    rows: int


@dataclass(frozen=True)
class WriteRecord:
    """One write after the build: what it did, when, how many rows, and its drift report."""

    kind: str
    time: str
    rows: int
    drift: Mapping[str, Any] | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    """Everything an index version holds. Build with :func:`from_dict` or the constructor,
    change with :func:`dataclasses.replace`, store with :func:`write`.

    Attributes:
        version: this version's number (1 for a fresh build, +1 per write).
        root: the version directory, relative to the index directory (``"."`` for format 1).
        rows: rows in the shards, live and deleted (the FAISS index's ``ntotal``).
        deleted: rows tombstoned by delete/upsert (never returned; gone after compact).
        tombstones: relative path of the file listing deleted rows, or None.
        next_auto_id: the next row-number id for corpora without an id column.
    """

    encoder: EncoderSpec
    dim: int
    calibration: CalibrationSpec
    faiss: FaissSpec
    columns: Columns
    rows: int
    version: int = 1
    root: str = "."
    shards: tuple[Shard, ...] = ()
    files: Mapping[str, FileRecord] = field(default_factory=dict)
    density: DensityStats | None = None
    held_out: HeldOut | None = None
    #: the JSON form of :class:`flowsearch.space.reference.Reference` (read with
    #: :func:`~flowsearch.space.reference.reference_of`, which also reads ``held_out``)
    reference: Mapping[str, Any] | None = None
    lexical: LexicalSpec | None = None
    deleted: int = 0
    tombstones: str | None = None
    skipped: int = 0
    next_auto_id: int = 0
    history: tuple[WriteRecord, ...] = ()
    created: str = ""
    updated: str | None = None
    flowsearch_version: str = ""
    format_version: int = FORMAT_VERSION

    @property
    def live_rows(self) -> int:
        """Rows a search can return."""
        return self.rows - self.deleted

    def path(self, index_dir: Path, relpath: str = "") -> Path:
        """Absolute path of ``relpath`` inside this version of ``index_dir``."""
        base = Path(index_dir) / self.root
        return base / relpath if relpath else base


def _f(value: Any) -> float:
    return float(value)


def _density(raw: Any) -> DensityStats | None:
    if not raw:
        return None
    return DensityStats(**{f.name: raw[f.name] for f in fields(DensityStats)})


def _held_out(raw: Any) -> HeldOut | None:
    if not raw:
        return None
    return HeldOut(
        rows=int(raw["rows"]),
        density=_density(raw.get("density")),
        percents=tuple(float(v) for v in raw.get("percents", ())),
        top_score=tuple(float(v) for v in raw.get("top_score", ())),
    )


def _known(cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in raw.items() if k in names}


def _migrate_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Format 1 -> 2: files in the index directory itself, ``index`` -> ``faiss``, additions ->
    history, the first release's ``static`` pooling -> ``embedding_layer``."""
    out = dict(raw)
    out["root"] = "."
    out["version"] = 1
    out["faiss"] = raw["index"]
    enc = dict(raw["encoder"])
    if enc.get("pooling") == "static":
        enc["pooling"] = "embedding_layer"
    out["encoder"] = enc
    cal = dict(raw["calibration"])
    if "auto_decision" in cal:
        cal["auto"] = {
            "statistic": cal.pop("auto_statistic", None),
            "threshold": cal.pop("auto_threshold", None),
            "calibrated": cal.pop("auto_decision"),
        }
    out["calibration"] = cal
    out["history"] = [{"kind": "add", **a} for a in raw.get("additions", [])]
    return out


def from_dict(raw: Any) -> Manifest:
    """A :class:`Manifest` from its JSON form, migrating older formats.

    Raises:
        FlowsearchError: not a flowsearch manifest, a newer format, a missing or malformed
            field, or a path that leaves the index directory.
    """
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise FlowsearchError("not a flowsearch manifest; rebuild the index")
    version = raw.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FlowsearchError(f"manifest has a bad format_version {version!r}; rebuild the index")
    if version > FORMAT_VERSION:
        raise FlowsearchError(
            f"index format {version} is newer than this flowsearch reads ({FORMAT_VERSION}); "
            "upgrade flowsearch or rebuild the index"
        )
    try:
        if version == 1:
            raw = _migrate_v1(raw)
        enc = dict(raw["encoder"])
        cal = dict(raw["calibration"])
        root = raw.get("root", ".")
        if root != ".":
            safe_relpath(root, "root")
        shards = tuple(
            Shard(path=safe_relpath(s["path"], "shard path"), rows=int(s["rows"]))
            for s in raw.get("shards", [])
        )
        files = {
            safe_relpath(k, "file path"): FileRecord(bytes=int(v["bytes"]), sha256=str(v["sha256"]))
            for k, v in raw.get("files", {}).items()
        }
        cols = raw["columns"]
        lexical = raw.get("lexical")
        tombstones = raw.get("tombstones")
        manifest = Manifest(
            encoder=EncoderSpec(
                model=str(enc.pop("model")),
                revision=str(enc.pop("revision")),
                pooling=str(enc.pop("pooling")),
                max_length=int(enc.pop("max_length")),
                dim=int(enc.pop("dim")),
                source=enc.pop("source", None),
                options=dict(enc.pop("options", {}), **enc),
            ),
            dim=int(raw["dim"]),
            calibration=CalibrationSpec(
                **{
                    **_known(CalibrationSpec, cal),
                    "auto": AutoDecision(**_known(AutoDecision, cal["auto"]))
                    if cal.get("auto")
                    else None,
                }
            ),
            faiss=FaissSpec(**_known(FaissSpec, raw["faiss"])),
            columns=Columns(
                text=str(cols["text"]),
                id=cols.get("id"),
                id_type=str(cols.get("id_type", "int")),
                metadata=tuple(cols.get("metadata", ())),
            ),
            rows=int(raw["rows"]),
            version=int(raw.get("version", 1)),
            root=root,
            shards=shards,
            files=files,
            density=_density(raw.get("density")),
            held_out=_held_out(raw.get("held_out")),
            reference=dict(raw["reference"]) if raw.get("reference") else None,
            lexical=(
                LexicalSpec(
                    **{
                        **_known(LexicalSpec, lexical),
                        "path": safe_relpath(lexical.get("path", "lexical"), "lexical path"),
                    }
                )
                if lexical
                else None
            ),  # fmt: skip
            deleted=int(raw.get("deleted", 0)),
            tombstones=safe_relpath(tombstones, "tombstones path") if tombstones else None,
            skipped=int(raw.get("skipped", 0)),
            next_auto_id=int(raw.get("next_auto_id", raw["rows"])),
            history=tuple(WriteRecord(**_known(WriteRecord, h)) for h in raw.get("history", [])),
            created=str(raw.get("created", "")),
            updated=raw.get("updated"),
            flowsearch_version=str(raw.get("flowsearch_version", "")),
            format_version=FORMAT_VERSION,
        )
    except FlowsearchError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise FlowsearchError(
            f"manifest is malformed ({type(exc).__name__}: {exc}); rebuild the index"
        ) from None
    if manifest.rows < 0 or not 0 <= manifest.deleted <= manifest.rows:
        raise FlowsearchError("manifest row counts are inconsistent; rebuild the index")
    if sum(s.rows for s in manifest.shards) != manifest.rows:
        raise FlowsearchError("manifest shards do not add up to its rows; rebuild the index")
    return manifest


def to_dict(manifest: Manifest) -> dict[str, Any]:
    """The JSON form of a manifest (what :func:`write` stores)."""
    raw = asdict(manifest)
    out: dict[str, Any] = {"format": FORMAT, **raw}
    out["format_version"] = FORMAT_VERSION
    out["encoder"] = {**{k: v for k, v in raw["encoder"].items() if k != "options"},
                      "options": dict(manifest.encoder.options)}  # fmt: skip
    out["columns"]["metadata"] = list(manifest.columns.metadata)
    return out


def is_index_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a manifest that says it is a flowsearch index."""
    try:
        with open(Path(path) / MANIFEST_NAME, encoding="utf-8") as handle:
            return bool(json.load(handle).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError):
        return False


def read(index_dir: str | os.PathLike[str]) -> Manifest:
    """Load ``index_dir/manifest.json`` (the current version).

    Raises:
        FlowsearchError: no index there, an unreadable or malformed manifest, a newer format.
    """
    root = Path(index_dir)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        what = "a file, not an index directory" if root.exists() else "missing"
        raise FlowsearchError(
            f"no index at {root} ({what}): build one with build_index(corpus, {str(root)!r})"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FlowsearchError(f"{root} is not a flowsearch index (no {MANIFEST_NAME})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FlowsearchError(f"{path} is unreadable ({exc}); rebuild the index") from None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise FlowsearchError(f"{path} is not valid JSON ({exc}); rebuild the index") from None
    if isinstance(raw, dict) and "checksum" in raw and raw["checksum"] != _checksum(raw):
        raise FlowsearchError(
            f"{path} was changed after it was written (its checksum does not match); "
            "restore it or rebuild the index"
        )
    try:
        return from_dict(raw)
    except FlowsearchError as exc:
        raise FlowsearchError(f"{path}: {exc}") from None


def _checksum(raw: Mapping[str, Any]) -> str:
    """sha256 of a manifest's canonical JSON, without its own ``checksum`` field."""
    body = {k: v for k, v in raw.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def write(index_dir: str | os.PathLike[str], manifest: Manifest) -> None:
    """Atomically replace ``index_dir/manifest.json``: this publishes ``manifest``'s version.

    The manifest carries a checksum of its own content, so an edit by hand is detected."""
    raw = to_dict(manifest)
    raw["checksum"] = _checksum(raw)
    text = json.dumps(raw, indent=2, ensure_ascii=False) + "\n"
    atomic_write_text(Path(index_dir) / MANIFEST_NAME, text)


def with_history(manifest: Manifest, record: WriteRecord, **changes: Any) -> Manifest:
    """``manifest`` with ``record`` appended to its history and ``changes`` applied."""
    return replace(manifest, history=(*manifest.history, record), updated=record.time, **changes)
