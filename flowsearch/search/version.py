r"""One version of an index: opened for searching (:class:`Version`), or described.

A :class:`Version` is everything a search reads, pinned together: the manifest, the searched
space (encoder and calibrator), the open segments with their offsets in the version's global
row order, each segment's deleted rows, the version's BM25 side and, made on first use, its
metadata filter. :func:`load` opens a manifest's files, reusing the segments, calibrator and
deletion masks an earlier version of the same searcher already opened (a :class:`Opened`
cache), so a refresh after a small write costs what the write added.

Example:
    >>> index_info("flowsearch_index").manifest.n_rows  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict, TypeVar, cast

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from flowsearch.encode.protocol import TextEncoder
from flowsearch.errors import IndexDamaged, check_bool, check_path
from flowsearch.jsonable import JSONValue
from flowsearch.lexical.bm25 import CACHE_BYTES, Bm25
from flowsearch.lexical.weights import Method, check_method
from flowsearch.search.segment import SegmentReader, read_deleted
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import manifest as mf
from flowsearch.storage.rows import RowCache
from flowsearch.storage.verify import Verification, size_on_disk, verify

if TYPE_CHECKING:
    from flowsearch.lexical.postings import Postings
    from flowsearch.search.filters import MetadataFilter, VersionFilter
    from flowsearch.search.scores import FusionReference
    from flowsearch.space.reference import Reference

__all__ = [
    "IndexInfo",
    "Opened",
    "Version",
    "index_history",
    "bm25_params",
    "index_info",
    "live_documents",
    "load",
    "open_current",
    "sizes",
]

LOG = logging.getLogger(__name__)

T = TypeVar("T")
_OPEN_RETRIES = 3


class IndexInfo(BaseModel):
    """What an index version holds (its manifest), its size on disk and what was verified."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    path: str
    manifest: mf.Manifest
    bytes: dict[str, int]
    verified: Verification
    #: live documents (a document cut into passages is several live rows; None: not counted)
    n_documents: int | None = None

    def to_dict(self) -> dict[str, object]:
        """The ``info --json`` document: the manifest's fields, ``path``, ``n_rows``,
        ``n_live`` (live rows: passages), ``n_deleted``, ``n_documents`` (live documents),
        ``bytes``, ``verified``."""
        return {
            "path": self.path,
            **self.manifest.to_json_dict(),
            "n_rows": self.manifest.n_rows,
            "n_live": self.manifest.n_live,
            "n_deleted": self.manifest.n_deleted,
            "n_documents": self.n_documents,
            "bytes": self.bytes,
            "verified": self.verified.to_dict(),
        }


def sizes(index_dir: Path, manifest: mf.Manifest) -> dict[str, int]:
    """Bytes on disk of the version's segments, calibrator and total."""
    root = Path(index_dir)
    out = {"segments": 0, "calibrator": size_on_disk(root / manifest.calibration.path)}
    for seg in manifest.segments:
        out["segments"] += sum(r.bytes for r in seg.files.values())
    out["total"] = out["segments"] + out["calibrator"]
    return out


def live_documents(
    index_dir: Path,
    manifest: mf.Manifest,
    known: dict[tuple[str, str, str | None], int] | None = None,
) -> int:
    """Live documents of a version (its live rows, less the second and later passages of the
    documents cut into passages: one small column read per segment that has them; none when
    the index does not cut). ``known``: counts by (segment, directory, deletions), reused
    and filled (a refresh re-reads only the segments a write changed)."""
    from flowsearch.storage.passages import count_documents

    if manifest.passages is None:
        return sum(s.n_live for s in manifest.segments)
    known = {} if known is None else known
    total = 0
    for s in manifest.segments:
        key = (s.name, s.dir, s.deletions)
        if key not in known:
            known[key] = count_documents(manifest.path(index_dir, s.dir), s)
        total += known[key]
    return total


def open_current(index_dir: Path, opener: Callable[[mf.Manifest], T]) -> T:
    """Read the current manifest and call ``opener(manifest)`` to open that version's files;
    if they vanish meanwhile (two writes published and cleaned up), read it again and retry.

    Raises:
        IndexDamaged: a file still missing after retrying with the current version.
    """
    last: Exception | None = None
    for _ in range(_OPEN_RETRIES):
        manifest = mf.read(index_dir)
        try:
            return opener(manifest)
        except FileNotFoundError as exc:
            last = exc
            if mf.read(index_dir).version == manifest.version:
                break
    raise IndexDamaged(f"index file missing under {index_dir} ({last})", "rebuild the index")


def index_info(index_dir: str | os.PathLike[str], verify: bool = False) -> IndexInfo:
    """Describe the current version of an index without loading its model.

    Args:
        index_dir: the index directory.
        verify: hash every file and check the history log (by default: sizes, and hashes of
            files up to ``storage.verify.CHEAP_CHECKSUM_BYTES``).

    Raises:
        NotFound: no index there.
        IndexDamaged: a file that is missing or differs.
    """
    root = check_path(index_dir, "index_dir", "an index directory")
    check_bool(verify, "verify")

    def describe(manifest: mf.Manifest) -> IndexInfo:
        from flowsearch.storage.verify import verify as check

        checked = check(root, manifest, checksums=verify)
        return IndexInfo(
            path=str(root.resolve()),
            manifest=manifest,
            bytes=sizes(root, manifest),
            verified=checked,
            n_documents=live_documents(root, manifest),
        )

    return open_current(root, describe)


def index_history(index_dir: str | os.PathLike[str]) -> list[mf.WriteRecord]:
    """The writes an index has seen, oldest first (its ``history.jsonl``).

    Raises:
        NotFound: no index there. IndexDamaged: a line that is not a record.
    """
    from flowsearch.storage import history

    root = check_path(index_dir, "index_dir", "an index directory")
    mf.read(root)
    return history.read(root)


@dataclass
class Opened:
    """What a searcher has opened, reused across its versions: segment readers by (name,
    directory), deletion masks and live documents by file, the calibrator's space by directory,
    the row cache, and the bytes each version's BM25 may keep for recent terms."""

    cache: RowCache = field(default_factory=RowCache)
    lexical_cache_bytes: int = CACHE_BYTES
    segments: dict[tuple[str, str], SegmentReader] = field(default_factory=dict)
    deleted: dict[tuple[str, str, str | None], np.ndarray | None] = field(default_factory=dict)
    documents: dict[tuple[str, str, str | None], int] = field(default_factory=dict)
    spaces: dict[str, SearchSpace] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keep_only(self, manifest: mf.Manifest) -> list[SegmentReader]:
        """Forget what ``manifest`` does not use; returns the segment readers forgotten (the
        caller closes them once no search runs on an older version)."""
        used = {(s.name, s.dir) for s in manifest.segments}
        gone = [r for key, r in self.segments.items() if key not in used]
        self.segments = {k: r for k, r in self.segments.items() if k in used}
        dels = {(s.name, s.dir, s.deletions) for s in manifest.segments}
        self.deleted = {k: v for k, v in self.deleted.items() if k in dels}
        self.documents = {k: v for k, v in self.documents.items() if k in dels}
        self.spaces = {k: v for k, v in self.spaces.items() if k == manifest.calibration.path}
        return gone


@dataclass
class Version:
    """Everything a search reads, for one pinned version.

    Attributes:
        offsets: int64 (segments + 1,): segment ``i`` holds global rows
            ``offsets[i] .. offsets[i+1] - 1``.
        deleted: per segment, its deleted rows as a bool mask, or None.
        lexical: the version's BM25 side over all segments, or None.
        n_documents: live documents (:func:`live_documents`), counted when the version is
            opened, while its files are certainly there; None for a shard's part of one.
    """

    root: Path
    manifest: mf.Manifest
    space: SearchSpace
    segments: list[SegmentReader]
    offsets: np.ndarray
    deleted: list[np.ndarray | None]
    verified: Verification
    lexical: Bm25 | None = None
    n_documents: int | None = None
    # each read once: None not yet, False measured as none
    _reference: Reference | Literal[False] | None = None
    _fusion: FusionReference | Literal[False] | None = None
    _dense: tuple[np.ndarray | None, int] | None = None
    _filter: VersionFilter | None = None
    _filter_lock: threading.Lock = field(default_factory=threading.Lock)
    _knobs: list[int | None] | Literal[False] | None = None
    #: the search page's pictures of this version, by sample size (kept by search.pictures)
    pictures: dict[int, object] = field(default_factory=dict)

    @property
    def passages_per_document(self) -> float:
        """Live rows per live document (1.0 when no document is cut into passages), which the
        hybrid's default weight reads (:func:`flowsearch.search.fusion.default_weight`)."""
        if not self.n_documents:
            return 1.0
        return max(self.manifest.n_live / self.n_documents, 1.0)

    def knobs(self) -> list[int | None] | None:
        """Per segment, the search knob (``efSearch`` / ``nprobe``) that makes the merged top
        10 of this version's segments reach the recall their tunings aimed for, from each
        segment's recorded recall curve and its share of the live rows
        (:func:`flowsearch.ann.merged.choose_knobs`); None for a segment searched as tuned
        (exact, no curve). None for one segment. Chosen once per version."""
        if self._knobs is None:
            self._knobs = self._choose_knobs() or False
        return self._knobs or None

    def _choose_knobs(self) -> list[int | None] | None:
        from flowsearch.ann import merged
        from flowsearch.ann.merged import Curve, choose_knobs
        from flowsearch.ann.policy import DEFAULT

        records = self.manifest.segments
        if len(records) < 2:
            return None
        curves: list[Curve | float] = []
        for seg in records:
            tuning = seg.ann.tuning
            if tuning is not None and tuning.curve is not None:
                c = tuning.curve
                curves.append(Curve(c.name, c.values, c.found))
            else:  # exact, a user's index, or tuned before curves were recorded: as it is
                curves.append(1.0 if tuning is None else min(tuning.recall, 1.0))
        if not any(isinstance(c, Curve) for c in curves):
            return None
        targets = [s.ann.tuning.target for s in records if s.ann.tuning is not None]
        target = max(targets, default=DEFAULT.target_recall)  # what the writes tuned for
        return choose_knobs(curves, [s.n_live for s in records],
                            target=target, skew=merged.MERGED_SKEW)  # fmt: skip

    @property
    def n_rows(self) -> int:
        return int(self.offsets[-1])

    def fusion(self) -> FusionReference | None:
        """The version's :class:`~flowsearch.search.scores.FusionReference`: the mean cosine
        between its live rows, from its segments' recorded vector sums minus their deleted
        rows' vectors (read back once per version). None (a background of 0) under two live
        rows, or for a segment of the second release not yet converted by a write."""
        if self._fusion is None:
            self._fusion = self._measure_fusion() or False
        return self._fusion or None

    def _measure_fusion(self) -> FusionReference | None:
        from flowsearch.search.scores import build_reference

        total, n_live = self.dense_statistics()
        return build_reference(total, n_live) if total is not None and n_live >= 2 else None

    def dense_statistics(self) -> tuple[np.ndarray | None, int]:
        """(the sum of the live rows' searched vectors, float64 (dim,), or None when a segment
        did not record its sum; the live rows): what the dense background is built from, and
        what a shard holding some of a version's segments adds to the others' (read once)."""
        if self._dense is None:
            dim, total = self.manifest.dim, np.zeros(self.manifest.dim, dtype=np.float64)
            known = True
            for seg, reader, dead in zip(self.manifest.segments, self.segments, self.deleted,
                                         strict=True):  # fmt: skip
                summed = seg.vectors_summed(dim)
                if summed is None:
                    known = False
                    break
                total += summed
                if dead is not None and dead.any():
                    total -= reader.vectors(np.flatnonzero(dead)).astype(np.float64).sum(axis=0)
            self._dense = (total if known else None, int(self.manifest.n_live))
        return self._dense

    def reference(self) -> Reference | None:
        """The version's :class:`~flowsearch.space.reference.Reference` (read once), or None."""
        if self._reference is None:
            from flowsearch.space.reference import reference_of

            self._reference = reference_of(self.manifest) or False
        return self._reference or None

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global rows -> (segment index, local row), int64 arrays."""
        rows = np.asarray(rows, dtype=np.int64)
        seg = np.searchsorted(self.offsets, rows, side="right") - 1
        return seg, rows - self.offsets[seg]

    def split(self, rows: np.ndarray | None) -> list[np.ndarray | None]:
        """Sorted global rows -> per segment sorted local rows (None in: None for all)."""
        if rows is None:
            return [None] * len(self.segments)
        cuts = np.searchsorted(rows, self.offsets)
        return [rows[cuts[i] : cuts[i + 1]] - self.offsets[i] for i in range(len(self.segments))]

    def metadata_filter(self, database: MetadataFilter) -> VersionFilter:
        """The version's :class:`~flowsearch.search.filters.VersionFilter`, made on first use
        in the searcher's filter ``database`` (closed when this version is garbage-collected,
        so searches still running on it finish first)."""
        with self._filter_lock:
            if self._filter is None:
                from flowsearch.search.filters import SegmentRef
                from flowsearch.storage.schema import type_of

                refs = [
                    SegmentRef(
                        name=f"{seg.record.name}@{seg.record.dir}",
                        offset=int(self.offsets[i]),
                        n_rows=seg.n_rows,
                        load=seg.filter_table,
                    )
                    for i, seg in enumerate(self.segments)
                ]
                m = self.manifest
                id_type = pa.int64() if m.columns.id_type == "int" else pa.string()
                schema = [("id", id_type), ("text", pa.string())]
                schema += [(c.name, type_of(c)) for c in m.schema_]
                self._filter = database.version(refs, schema)
                weakref.finalize(self, self._filter.close)
            return self._filter


def load(
    root: Path,
    manifest: mf.Manifest,
    opened: Opened,
    *,
    verify_all: bool = False,
    encoder: TextEncoder | None = None,
    model: str | os.PathLike[str] | None = None,
    gpu: bool = False,
    mmap: bool = False,
    with_encoder: bool = True,
) -> Version:
    """Open one version's files, reusing what ``opened`` holds (raises FileNotFoundError if
    a file vanished meanwhile: see :func:`open_current`). ``with_encoder=False``: the space
    has no encoder (a shard that is given searched vectors, never texts to embed)."""
    with opened.lock:
        fresh = [s.name for s in manifest.segments if (s.name, s.dir) not in opened.segments]
        new_space = manifest.calibration.path not in opened.spaces
        checked = verify(
            root,
            manifest,
            checksums=verify_all,
            segments=None if verify_all else fresh,
            calibrator=verify_all or new_space,
        )
        if new_space:
            opened.spaces[manifest.calibration.path] = SearchSpace.open(
                root, manifest, encoder, model=model, with_encoder=with_encoder
            )
        space = opened.spaces[manifest.calibration.path]
        if space.spec != manifest.calibration:
            space = SearchSpace(space.calibrator, manifest.calibration, space.encoder)
        readers, masks = [], []
        for seg in manifest.segments:
            key = (seg.name, seg.dir)
            if key not in opened.segments:
                opened.segments[key] = SegmentReader.open(
                    root, seg, dim=manifest.dim, cache=opened.cache, mmap=mmap, gpu=gpu
                )
            readers.append(opened.segments[key])
            dkey = (seg.name, seg.dir, seg.deletions)
            if dkey not in opened.deleted:
                opened.deleted[dkey] = read_deleted(root / seg.dir, seg)
            masks.append(opened.deleted[dkey])
        n_documents = live_documents(root, manifest, opened.documents)
    counts = [s.n_rows for s in manifest.segments]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    lexical = None
    if manifest.lexical is not None:
        postings = [r.postings for r in readers]
        if any(p is None for p in postings):
            raise IndexDamaged("a segment lacks its postings", "rebuild the index")
        lexical = Bm25(
            list(zip(cast("list[Postings]", postings), masks, strict=True)),  # none is None
            cache_bytes=opened.lexical_cache_bytes,
            **bm25_params(manifest.lexical.params),
        )
    return Version(root, manifest, space, readers, offsets, masks, checked, lexical, n_documents)


class _Bm25Params(TypedDict, total=False):
    """What :class:`~flowsearch.lexical.bm25.Bm25` takes of the manifest's BM25 parameters."""

    k1: float
    b: float
    method: Method


def bm25_params(params: Mapping[str, JSONValue]) -> _Bm25Params:
    """The manifest's ``k1``, ``b`` and ``method`` (those it holds), as :class:`Bm25` takes them.

    Raises:
        IndexDamaged: ``k1`` or ``b`` is not a number.
        BadInput: an unknown method (as :class:`Bm25` refuses it).
    """
    out: _Bm25Params = {}
    if "k1" in params:
        out["k1"] = _bm25_number(params, "k1")
    if "b" in params:
        out["b"] = _bm25_number(params, "b")
    if "method" in params:
        method = params["method"]
        check_method(method if isinstance(method, str) else repr(method))
        out["method"] = cast("Method", method)  # one of METHODS: checked
    return out


def _bm25_number(params: Mapping[str, JSONValue], key: str) -> float:
    value = params[key]
    if not isinstance(value, (int, float)):
        raise IndexDamaged(f"the manifest's BM25 {key} is {value!r}", "rebuild the index")
    return value
