r"""The records a manifest is made of: typed, immutable pydantic models.

:mod:`flowsearch.storage.manifest` reads and checks ``manifest.json`` into a :class:`Manifest`;
these are its parts (and the history log's :class:`WriteRecord`). Change one with
``model_copy(update=...)``; the JSON schema of the whole is :func:`Manifest.model_json_schema`.

Example:
    >>> Columns(text="text", id="id").id_type
    'int'
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from typing_extensions import Self  # typing.Self is 3.11+

from flowsearch.atomic import sha256_file
from flowsearch.errors import IndexDamaged
from flowsearch.jsonable import JSONValue
from flowsearch.storage.relpaths import inside as _inside
from flowsearch.storage.relpaths import safe_relpath

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
    "encode_vector_sum",
    "safe_relpath",
    "sha256_file",
    "utc_now",
]

FORMAT: Final = "flowsearch-index"
#: 1: first release (files in the index directory); 2: one directory per version;
#: 3: segments, deletion files, a schema, the history beside the manifest.
FORMAT_VERSION = 3

_FROZEN = ConfigDict(frozen=True, extra="ignore")
#: The validation context key a manifest read from disk is validated with (``{STORED: True}``).
STORED: Final = "stored"


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string (seconds), as manifests store it."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


class FileRecord(BaseModel):
    """Size and sha256 of one file."""

    model_config = _FROZEN
    bytes: int = Field(ge=0)
    sha256: str


class EncoderSpec(BaseModel):
    """What made the vectors: enough to reload the encoder and to refuse a different one.

    Attributes:
        model: the model's name as recorded (hub id, absolute directory, or the bundled id).
        revision: the model's content hash (local) or commit (hub).
        pooling: the pooling name.
        max_length: tokens per text.
        dim: the encoder's output dimension.
        source: how to load it again: None for the bundled model, else the id or directory.
        options: further fields the encoder's ``describe()`` reports (backend, quantize, ...).
    """

    model_config = _FROZEN
    model: str
    revision: str
    pooling: str
    max_length: int
    dim: int
    source: str | None = None
    options: dict[str, JSONValue] = Field(default_factory=dict)

    def identity(self) -> dict[str, object]:
        """The fields an encoder's ``describe()`` must reproduce."""
        core = self.model_dump(include={"model", "revision", "pooling", "max_length", "dim"})
        return {**core, **self.options}

    @classmethod
    def from_description(cls, described: Mapping[str, object], source: str | None) -> EncoderSpec:
        """The spec of an encoder from its ``describe()`` and how it was named."""
        core = {"model", "revision", "pooling", "max_length", "dim"}
        return cls.model_validate(
            {
                **{k: described[k] for k in core},
                "source": source,
                "options": {k: v for k, v in described.items() if k not in core},
            }
        )


class AutoDecision(BaseModel):
    """What ``calibration="auto"`` measured and decided: the statistic, its threshold, and
    whether the calibrated space is searched."""

    model_config = _FROZEN
    statistic: str | None = None
    threshold: float | None = None
    calibrated: bool = False


class CalibrationSpec(BaseModel):
    """The calibrator and the searched space.

    Attributes:
        name: the calibration asked for (``auto``, ``flow``, ``whitening``, ...).
        calibrator: the fitted calibrator's registry name.
        space: ``calibrated`` (search the calibrator's output) or ``encoder`` (the raw vectors).
        config: the calibrator's hyper-parameters (its ``config``).
        decision: why that space, in words.
        anisotropy: the corpus's anisotropy statistics.
        fitted_on: ``corpus`` or the directory of a calibrator fitted elsewhere.
        fit_rows: rows the calibrator was fitted on.
        fit_stats: the calibrator's own fit statistics.
        dim_out: dimension of the calibrator's output.
        auto: what ``auto`` decided, when ``name == "auto"``.
        path: the calibrator's directory, relative to the index directory.
        files: its files (relative to ``path``) with sizes and checksums.
    """

    model_config = _FROZEN
    name: str
    calibrator: str
    space: Literal["calibrated", "encoder"]
    config: dict[str, JSONValue] = Field(default_factory=dict)
    decision: str = ""
    anisotropy: dict[str, float] = Field(default_factory=dict)
    fitted_on: str = "corpus"
    fit_rows: int = 0
    fit_stats: dict[str, JSONValue] = Field(default_factory=dict)
    dim_out: int | None = None
    auto: AutoDecision | None = None
    path: str = "calibrator"
    files: dict[str, FileRecord] = Field(default_factory=dict)

    _check_paths = field_validator("path", "files")(_inside("calibrator"))

    @property
    def calibrated(self) -> bool:
        """True when the index searches the calibrator's output."""
        return self.space == "calibrated"


class DensityStats(BaseModel):
    """Per-row log-density statistics of a set of rows under the index's flow."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    mean_log_prob: float
    std_log_prob: float
    p01: float
    p05: float
    median: float
    n_rows: int = Field(validation_alias=AliasChoices("n_rows", "rows"))


class HeldOut(BaseModel):
    """Rows kept out of the calibrator's fit, and where they sit: the reference a query or a
    new row is judged against.

    Attributes:
        n_rows: how many rows were held out.
        density: their log-densities under the flow (None without a flow).
        percents: the percentiles ``top_score`` holds (ascending).
        top_score: each held-out row's best cosine to another row, at ``percents``.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    n_rows: int = Field(validation_alias=AliasChoices("n_rows", "rows"))
    density: DensityStats | None = None
    percents: tuple[float, ...] = ()
    top_score: tuple[float, ...] = ()


#: How a reference's rows were measured: held out of the calibrator's fit, or leave-one-out.
ReferenceMethod = Literal["held-out", "leave-one-out"]


class SamplePiece(BaseModel):
    """One directory of a reference sample: its base, or one write's delta on it.

    Attributes:
        path: the directory, relative to the index directory (``references/rNNNNNN``).
        files: its files (relative to ``path``) with their sizes and checksums.
    """

    model_config = _FROZEN
    path: str
    files: dict[str, FileRecord]

    _check_paths = field_validator("path", "files")(_inside("reference sample"))


class SampleRecord(SamplePiece):
    """Where a version's reference sample is (``flowsearch.space.sample``): its base
    directory, the deltas written on it since (in order), and its size.

    Attributes:
        rows: entries of the sample (the rows new rows are judged against).
        probes: its probes (the rows the reference was measured on).
        deltas: the changes since the base, in order (absent from the JSON when none).
    """

    rows: int | None = Field(default=None, ge=0)
    probes: int | None = Field(default=None, ge=0)
    deltas: tuple[SamplePiece, ...] = ()

    @property
    def pieces(self) -> tuple[SamplePiece, ...]:
        """The directories to read, in order: the base, then its deltas."""
        return (self, *self.deltas)

    @model_serializer(mode="wrap")
    def _as_stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if isinstance(self, SampleRecord) and not self.deltas:  # a base alone: no key
            out.pop("deltas", None)
        return out


class ReferenceRecord(BaseModel):
    """The manifest's reference: the corpus's own rows' best scores to another row, what
    queries and new rows are judged against; ``flowsearch.space.reference.Reference`` is this
    record with its judging methods.

    Attributes:
        method: ``held-out`` (rows the calibrator was not fitted on) or ``leave-one-out``
            (rows of the whole index, each against the others).
        n_measured: how many rows were measured.
        n_corpus: rows in the index when they were measured.
        space: the space the scores were measured in (``calibrated`` or ``encoder``).
        percents: ascending percentiles (0-100) that ``scores`` holds.
        scores: the measured rows' best scores at ``percents``.
        mean_cosine: the searched space's mean cosine between rows, when it is the encoder's
            own space; None otherwise.
        log_density_median: the measured rows' median log-density under the calibrator (a raw
            figure); None without a reliable one.
        sample: the version's reference sample; None for an index written before samples
            existed (whose manifest then has no ``sample`` key, and keeps none when rewritten).
    """

    model_config = _FROZEN
    method: ReferenceMethod
    n_measured: int = Field(ge=0)
    n_corpus: int = Field(ge=0)
    space: str | None = None
    percents: tuple[float, ...] = ()
    scores: tuple[float, ...] = ()
    mean_cosine: float | None = None
    log_density_median: float | None = None
    sample: SampleRecord | None = None
    #: read from a manifest that had no ``sample`` key (a release before samples)
    _stored_without_sample: bool = PrivateAttr(default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_a_missing_sample(
        cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        record = handler(data)
        stored = bool(info.context and info.context.get(STORED))
        if stored and isinstance(data, Mapping) and "sample" not in data:
            record._stored_without_sample = True
        return record

    @model_serializer(mode="wrap")
    def _as_stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        absent = isinstance(self, ReferenceRecord) and self._stored_without_sample
        if absent and self.sample is None:  # read without one: written back without one
            out.pop("sample", None)
        return out


def _bm25_defaults() -> dict[str, JSONValue]:
    return {"k1": 1.5, "b": 0.75}


class LexicalSpec(BaseModel):
    """BM25's parameters (every segment has postings when the index has a lexical side)."""

    model_config = _FROZEN
    params: dict[str, JSONValue] = Field(default_factory=_bm25_defaults)


class PassageSpec(BaseModel):
    """How the index cuts documents longer than the encoder's window into passages (every
    write cuts the same way; ``flowsearch.ingest.passages``). An index without one (built
    before passages, or with ``passage_tokens=0``) reads only each text's first tokens."""

    model_config = _FROZEN
    tokens: int = Field(ge=1)
    overlap: int = Field(ge=0)
    window: int = Field(ge=1)


class Columns(BaseModel):
    """The corpus columns: text, id (None: row numbers are ids) and the id type."""

    model_config = _FROZEN
    text: str
    id: str | None
    id_type: Literal["int", "string"] = "int"


class SchemaColumn(BaseModel):
    """One metadata column: its name and Arrow type (``arrow`` is exact, ``type`` readable)."""

    model_config = _FROZEN
    name: str
    type: str
    arrow: str  # base64 of a one-field Arrow IPC schema (see flowsearch.storage.schema)


class PartRecord(BaseModel):
    """One Parquet part of a segment (path relative to the segment) and its rows."""

    model_config = _FROZEN
    path: str
    n_rows: int = Field(ge=0)

    _check_path = field_validator("path")(lambda v: safe_relpath(v, "part path"))


class AnnCurve(BaseModel):
    """A segment's recall curve (:class:`flowsearch.ann.merged.Curve`): per value of its search
    knob ``name``, the share of held-out queries whose true rank-r row (r = 1..k) it found."""

    model_config = _FROZEN
    name: str
    values: tuple[int, ...]
    found: tuple[tuple[float, ...], ...]


class AnnTuning(BaseModel):
    """What ``auto``'s tuning of a segment's approximate index measured
    (:class:`flowsearch.ann.tune.Tuning`): recall@k against exact search on ``queries``
    held-out rows moved by noise of norm ``noise`` (or, ``probes`` ``"queries"``, the user's
    own queries, ``compact(tune_queries=...)``), which the search knob was *not* chosen on
    (``tuned_recall``: on the ones it was chosen on), for a ``target``."""

    model_config = _FROZEN
    recall: float
    target: float
    k: int = 10
    queries: int
    noise: float
    tuned_recall: float | None = None
    curve: AnnCurve | None = None
    #: the tuning rule's version (:data:`flowsearch.ann.tune.TUNER_VERSION`); None: a tuning
    #: recorded before versions were (``compact`` re-tunes such a segment)
    tuner: int | None = None
    #: why ``auto`` searches the segment exactly (:attr:`flowsearch.ann.tune.Tuning.exact`:
    #: the graph it built, short of the target), in words; None: its index is the one tuned
    exact: str | None = None
    #: what the queries were (:attr:`flowsearch.ann.tune.Tuning.probes`): ``"noise"`` or
    #: ``"queries"`` (the user's own); None: recorded before it was (noise)
    probes: str | None = None

    def to_words(self) -> str:
        """``"recall@10 0.962 on 256 held-out rows + noise 0.8 (target 0.95)"``, or ``"...
        on 100 of your queries ..."``."""
        if self.exact is not None:
            return f"exact (Flat): its {self.exact}"
        made = ("of your queries" if self.probes == "queries"
                else f"held-out rows + noise {self.noise:g}")  # fmt: skip
        recall = f"recall@{self.k} {self.recall:.3f}"
        return f"{recall} on {self.queries} {made} (target {self.target:g})"


class AnnProjection(BaseModel):
    """How an older release's ``auto`` built a large segment's graph (the projected graph):
    over the rows' first ``dims`` principal components, fitted on at most ``sample_rows`` rows,
    at ``ef_construction``; the index file is an ordinary HNSW index of the full vectors."""

    model_config = _FROZEN
    dims: int = Field(ge=1)
    ef_construction: int = Field(ge=1)
    sample_rows: int = Field(ge=1)

    def to_words(self) -> str:
        """``"graph built over the first 128 principal components (...)"``."""
        return (
            f"graph built over the first {self.dims} principal components (fitted on at most "
            f"{self.sample_rows:,} rows) at efConstruction {self.ef_construction}, searched "
            "over the full vectors"
        )


class AnnRecord(BaseModel):
    """A segment's vector index: its file, the resolved factory and its search parameters
    (``tuning``: what ``auto``'s tuning measured; None for an exact or a user's index, or a
    segment written before it was recorded; ``projection``: how a graph built over principal
    components was built, None for any other index)."""

    model_config = _FROZEN
    path: str
    factory: str
    params: str = ""
    data: str | None = None  # an IVF index's lists on disk, beside ``path``
    tuning: AnnTuning | None = None
    projection: AnnProjection | None = None

    _check_paths = field_validator("path", "data")(_inside("vector index"))


class SegmentRecord(BaseModel):
    """One immutable segment of a version.

    Attributes:
        name: unique within the index (``s000004``; ``legacy`` for an old-format version).
        dir: its directory, relative to the index directory.
        n_rows: rows in its parts, deleted ones included (its ann's ``ntotal``).
        n_deleted: rows its deletion file lists.
        parts: its Parquet parts, in row order.
        ann: its vector index.
        postings: its BM25 postings directory (None: the index has no lexical side).
        keys: its id lookup file (None in a legacy segment, built on its first write).
        deletions: its current deletion file (None: nothing deleted).
        files: every file (relative to ``dir``) with size and checksum.
        vector_sum: the sum of its rows' searched vectors, deleted rows included (float64
            little-endian, base64; :meth:`vectors_summed`): a version's dense background is
            computed from its segments' sums (``flowsearch.search.scores``), so every write
            keeps it current. None in a segment written before it was recorded.
    """

    model_config = _FROZEN
    name: str
    dir: str
    n_rows: int = Field(ge=0)
    n_deleted: int = Field(default=0, ge=0)
    parts: tuple[PartRecord, ...] = ()
    ann: AnnRecord
    postings: str | None = None
    keys: str | None = None
    deletions: str | None = None
    files: dict[str, FileRecord] = Field(default_factory=dict)
    vector_sum: str | None = None

    _check_paths = field_validator("postings", "keys", "deletions", "files")(_inside("segment"))

    @field_validator("dir")
    @classmethod
    def _dir_inside(cls, value: str) -> str:
        return value if value == "." else safe_relpath(value, "segment directory")

    @property
    def n_live(self) -> int:
        """Rows a search can return."""
        return self.n_rows - self.n_deleted

    def vectors_summed(self, dim: int) -> np.ndarray | None:
        """:attr:`vector_sum` as float64 (dim,), or None when not recorded.

        Raises:
            IndexDamaged: it does not decode to ``dim`` finite numbers.
        """
        if self.vector_sum is None:
            return None
        try:
            raw = base64.b64decode(self.vector_sum.encode("ascii"), validate=True)
            total = np.frombuffer(raw, dtype="<f8").astype(np.float64)
        except ValueError:
            total = np.zeros(0)
        if total.shape != (dim,) or not np.isfinite(total).all():
            raise IndexDamaged(
                f"segment {self.name}'s vector_sum is not {dim} finite numbers",
                "the manifest is damaged: rebuild the index",
            )
        return total


def encode_vector_sum(total: np.ndarray) -> str:
    """The :attr:`SegmentRecord.vector_sum` form of a float64 (dim,) sum."""
    return base64.b64encode(np.asarray(total, dtype="<f8").tobytes()).decode("ascii")


class WriteRecord(BaseModel):
    """One write: its kind, when, the rows it wrote or deleted, and what it reported."""

    model_config = _FROZEN
    version: int
    kind: str
    time: str
    n_rows: int = 0
    detail: dict[str, JSONValue] = Field(default_factory=dict)


class RestoreOrigin(BaseModel):
    """Where a restored index came from (``flowsearch restore``): the snapshot, the index it
    was taken of, that index's version, and when the snapshot was taken."""

    model_config = _FROZEN
    snapshot: str
    source: str
    source_version: int
    snapshot_time: str = ""


class Manifest(BaseModel):
    """Everything an index version holds. Change a field with ``model_copy(update=...)``; only
    the version writer publishes one.

    Attributes:
        version: this version's number (1 for a fresh build, +1 per write).
        dim: dimension of the searched vectors.
        schema_: the metadata columns, in order (JSON name ``schema``).
        segments: the live segments, in row order (a version's global row numbers run
            through them).
        skipped: corpus rows skipped so far for a null or blank text.
        next_auto_id: the next row-number id for corpora without an id column.
        next_segment: the number the next segment gets.
        last_write: the write that published this version (the full log is ``history.jsonl``).
        restored_from: the snapshot this index was restored from (kept by later writes).
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    format: Literal["flowsearch-index"] = FORMAT
    format_version: int = FORMAT_VERSION
    version: int = 1
    encoder: EncoderSpec
    dim: int
    calibration: CalibrationSpec
    ann_requested: str = "auto"
    lexical: LexicalSpec | None = None
    #: how long documents are cut into passages (None: not cut, truncated to the window)
    passages: PassageSpec | None = None
    columns: Columns
    schema_: tuple[SchemaColumn, ...] = Field(default=(), alias="schema")
    segments: tuple[SegmentRecord, ...] = ()
    density: DensityStats | None = None
    held_out: HeldOut | None = None
    #: how close the corpus's own rows sit to each other, what queries and new rows are judged
    #: against (an older release's ``held_out`` is read in its place;
    #: ``flowsearch.space.reference.reference_of``)
    reference: ReferenceRecord | None = None
    skipped: int = 0
    next_auto_id: int = 0
    next_segment: int = 1
    created: str = ""
    updated: str | None = None
    flowsearch_version: str = ""
    last_write: WriteRecord | None = None
    restored_from: RestoreOrigin | None = None

    @property
    def n_rows(self) -> int:
        """Rows in the segments, deleted ones included."""
        return sum(s.n_rows for s in self.segments)

    @property
    def n_deleted(self) -> int:
        """Rows deleted (never returned; gone after compaction)."""
        return sum(s.n_deleted for s in self.segments)

    @property
    def n_live(self) -> int:
        """Rows a search can return."""
        return self.n_rows - self.n_deleted

    @property
    def metadata_columns(self) -> tuple[str, ...]:
        """The metadata columns' names, in order."""
        return tuple(c.name for c in self.schema_)

    def path(self, index_dir: str | os.PathLike[str], relpath: str = "") -> Path:
        """Absolute path of ``relpath`` (relative to the index directory)."""
        return Path(index_dir) / relpath if relpath else Path(index_dir)

    def to_json_dict(self) -> dict[str, object]:
        """The JSON form (what ``manifest.json`` holds, without its checksum)."""
        return self.model_dump(mode="json", by_alias=True)
