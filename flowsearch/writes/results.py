r"""What a write returns: one :class:`WriteResult` for build, add, upsert, delete, compact and
recalibrate (typed; the CLI's ``--json`` and the server print its ``to_dict()``).

Example:
    >>> r = WriteResult(kind="delete", index="idx", version=3, n_live=10, n_deleted=2)
    >>> r.n_deleted, r.to_dict()["kind"]
    (2, 'delete')
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Unpack  # typing.Unpack is 3.11+

from flowsearch.progress import Stages
from flowsearch.space.drift import DriftReport
from flowsearch.storage import manifest as mf

__all__ = ["WriteCounts", "WriteResult", "result_of"]

# The second release returned dicts; their keys still read (``result["rows"]``).
_OLD_KEYS = {
    "rows": "n_live",
    "added": "n_written",
    "upserted": "n_written",
    "inserted": "n_inserted",
    "replaced": "n_replaced",
    "deleted": "n_deleted",
    "dropped": "n_dropped",
    "skipped": "n_skipped",
    # counts were named n_* in the third release (docs/ARCHITECTURE.md)
    "segments": "n_segments",
    "merged": "n_merged",
}


class WriteResult(BaseModel):
    """What one write did.

    Attributes:
        kind: ``build``, ``add``, ``upsert``, ``delete``, ``compact`` or ``recalibrate``.
        index: the index directory.
        version: the version the write published (the current one when it wrote nothing).
        n_live: rows a search can return, after the write.
        n_written: build, add, upsert: documents the write stored (a document cut into
            passages is several rows); compact, recalibrate: rows rewritten.
        n_inserted: upsert: rows whose id was new.
        n_replaced: upsert: rows that replaced a live row of the same id.
        n_deleted: delete: rows deleted.
        missing: delete: ids that were not in the index (or deleted before).
        n_dropped: compact: deleted rows dropped from the rewritten segments.
        n_skipped: rows skipped for a null or blank text.
        n_segments: segments in the version after the write.
        n_merged: segments the write merged into one (its merge policy, or ``compact``).
        n_retuned: compact: segments whose ``auto`` index an older tuning rule had tuned,
            tuned again (their files kept).
        dim: dimension of the searched vectors.
        calibration: the calibration asked for; ``space``: what is searched.
        factory: the vector index of the segment the write made (or the largest).
        decision: why that space, in words.
        bytes: the version's size on disk after the write; ``bytes_freed`` by compact.
        drift: add/upsert: how the new rows sit against the corpus (a report), or None.
        seconds: time per stage, and ``total``.
    """

    model_config = ConfigDict(frozen=True)
    kind: str
    index: str
    version: int
    n_live: int = 0
    n_written: int = 0
    n_inserted: int = 0
    n_replaced: int = 0
    n_deleted: int = 0
    missing: list[object] = Field(default_factory=list)
    n_dropped: int = 0
    n_skipped: int = 0
    n_segments: int = 0
    n_merged: int = 0
    n_retuned: int = 0
    dim: int | None = None
    calibration: str | None = None
    space: str | None = None
    factory: str | None = None
    decision: str | None = None
    bytes: int = 0
    bytes_freed: int = 0
    drift: DriftReport | None = None
    seconds: dict[str, float] = Field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """A JSON-able dict of the fields (the drift report as its own dict)."""
        out = self.model_dump(mode="json", exclude={"drift"})
        out["drift"] = None if self.drift is None else self.drift.to_dict()
        return out

    def __getitem__(self, key: str) -> object:
        """Read a field by name (or by the second release's dict key, e.g. ``"rows"``)."""
        name = _OLD_KEYS.get(key, key)
        if name not in type(self).model_fields:
            raise KeyError(key)
        value = getattr(self, name)
        return value.to_dict() if hasattr(value, "to_dict") else value  # the dicts of old

    def get(self, key: str, default: object = None) -> object:
        """:meth:`__getitem__` with a default."""
        try:
            return self[key]
        except KeyError:
            return default


class WriteCounts(TypedDict, total=False):
    """What a write tells :func:`result_of` beyond the manifest: :class:`WriteResult`'s fields
    of the same names (``factory``: the segment the write made; else the largest's)."""

    n_written: int
    n_inserted: int
    n_replaced: int
    n_deleted: int
    missing: list[object]
    n_dropped: int
    n_skipped: int
    n_merged: int
    n_retuned: int
    bytes_freed: int
    drift: DriftReport | None
    factory: str | None


def result_of(
    kind: str, target: Path, manifest: mf.Manifest, st: Stages, **fields: Unpack[WriteCounts]
) -> WriteResult:
    """The :class:`WriteResult` of a published version."""
    from flowsearch.search.version import sizes

    total = sum(st.seconds.values())
    biggest = max(manifest.segments, key=lambda s: s.n_rows, default=None)
    counts = WriteCounts(factory=biggest.ann.factory if biggest else None)
    counts.update(fields)  # a factory given wins
    return WriteResult(
        kind=kind,
        index=str(target),
        version=manifest.version,
        n_live=manifest.n_live,
        n_segments=len(manifest.segments),
        dim=manifest.dim,
        calibration=manifest.calibration.name,
        space=manifest.calibration.space,
        decision=manifest.calibration.decision,
        bytes=sizes(target, manifest)["total"],
        seconds={**{k: round(v, 3) for k, v in st.seconds.items()}, "total": round(total, 3)},
        **counts,
    )
