r"""The seam between one process and many: a *shard* is a set of a version's segments that
answers a query with statistics it is given.

Scores are comparable across shards only when every shard weighs its rows with the whole
version's statistics: BM25's N, total length and the query terms' document frequencies
(:class:`flowsearch.lexical.bm25.Statistics`), and the dense background, from the live rows'
vector sum (:func:`flowsearch.search.scores.build_reference`). So a search runs in two phases
(as Elasticsearch's DFS, or Lucene's ``CollectionStatistics``):

1. *statistics*: each shard reports its part (:meth:`Shard.statistics`); parts add up
   (:meth:`Statistics.summed`). Kept per version (:class:`StatisticsCache`), so a term is asked
   about once per version.
2. *answer*: each shard returns its own top candidates of each side, scored with the global
   statistics, and, for hybrid, each candidate's score on the other side (:meth:`Shard.answer`,
   a :class:`Request` in, an :class:`Answer` out). :func:`run` merges each side exactly
   (:func:`flowsearch.search.dense.merge_top_k`, ties to the lower global row) and fuses or
   normalises as one process does (:mod:`flowsearch.search.fusion`, :mod:`~.scores`); the hits'
   records come from the shards that hold them (:meth:`Shard.records`).

For exact (``Flat``) segments the answer is the one a single process gives over every segment:
a row's cosine and BM25 do not depend on which shard holds it, a side's global top-c is the
merge of each shard's top-c, and a fused score depends only on the row's own two scores, the
query's BM25 upper bound and the dense background. The local :class:`~.searcher.Searcher` is
one :class:`SegmentSet` holding every segment (:class:`InProcess`); the Ray searcher
(:mod:`flowsearch.search.ray_shards`) puts a :class:`SegmentSet` in each actor.

Rows crossing the seam are *global* rows of the version (segment offset + local row), whatever
segments a shard holds; a shard's own :class:`~.version.Version` numbers its rows contiguously,
and :class:`SegmentSet` translates.

Example:
    >>> Statistics.summed([Statistics(1, 2, None, None), Statistics(1, 3, None, None)]).n_live
    5
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, cast

import numpy as np

from flowsearch.ann import io as ann_io
from flowsearch.errors import BadInput
from flowsearch.lexical.bm25 import Statistics as Bm25Statistics
from flowsearch.lexical.bm25 import query_terms, upper_bound
from flowsearch.search import dense, document_scores
from flowsearch.search.modes import Mode
from flowsearch.search.options import SearchOptions
from flowsearch.search.results import Hit
from flowsearch.search.scores import FusionReference, build_reference
from flowsearch.search.segment import SegmentReader
from flowsearch.search.timings import stage
from flowsearch.search.version import Version, bm25_params
from flowsearch.storage import manifest as mf
from flowsearch.storage.rows import RowRecord

if TYPE_CHECKING:
    from flowsearch.lexical.postings import Postings
    from flowsearch.search.filters import MetadataFilter

__all__ = [
    "Answer",
    "InProcess",
    "Request",
    "SegmentSet",
    "Shard",
    "Shards",
    "Statistics",
    "StatisticsCache",
    "hits_of",
    "records_of",
    "run",
    "split",
]

Side = tuple[np.ndarray, np.ndarray]  # (scores (q, c), global rows (q, c)), row -1 = none

#: Batches up to this many queries search FAISS on the calling thread alone: waking FAISS's
#: OpenMP threads for one query costs more than its search on a busy machine.
ONE_THREAD_MAX_QUERIES = 1


@dataclass(frozen=True)
class Statistics:
    """A set of segments' part of a version's statistics, or (summed) the whole version's.

    Attributes:
        version: the version they describe.
        n_live: live rows.
        vector_sum: float64 (dim,), the live rows' searched vectors summed; None when a segment
            did not record its sum (then the background is 0, as in one process).
        lexical: BM25's statistics for the terms asked about; None without a lexical side.
    """

    version: int
    n_live: int
    vector_sum: np.ndarray | None
    lexical: Bm25Statistics | None

    @classmethod
    def summed(cls, parts: Sequence[Statistics]) -> Statistics:
        """The statistics of disjoint parts of one version, together."""
        if not parts:
            raise BadInput("no statistics to sum", param="parts")
        sums = [p.vector_sum for p in parts if p.vector_sum is not None]
        vector_sum = np.sum(np.stack(sums), axis=0) if len(sums) == len(parts) else None
        lexical = [p.lexical for p in parts if p.lexical is not None]
        return cls(
            version=parts[0].version,
            n_live=sum(p.n_live for p in parts),
            vector_sum=vector_sum,
            lexical=Bm25Statistics.summed(lexical) if lexical else None,
        )

    def fusion(self) -> FusionReference | None:
        """The dense background these statistics give (None, a background of 0, without a
        vector sum or under two live rows: as :meth:`Version.fusion`)."""
        if self.vector_sum is None or self.n_live < 2:
            return None
        return build_reference(self.vector_sum, self.n_live)


@dataclass(frozen=True)
class Request:
    """Phase 2: what every shard is asked.

    Attributes:
        version: the version the answer must come from.
        mode: ``dense``, ``lexical`` or ``hybrid`` (checked).
        queries: the query texts (the lexical side reads them).
        vectors: float32 (q, dim) in the searched space (the dense side), or None.
        k: candidates per side per query.
        where: a ``where`` predicate (non-blank) or None.
        statistics: the version's global statistics, with the queries' terms.
    """

    version: int
    mode: Mode
    queries: tuple[str, ...]
    vectors: np.ndarray | None
    k: int
    where: str | None
    statistics: Statistics


@dataclass(frozen=True)
class Answer:
    """One shard's answer to a :class:`Request`; rows are global, -1 pads.

    Attributes:
        matched: rows its segments hold that ``where`` matched (None without a filter).
        dense: ``(cosines float32 (q, c), rows)``, its own top-c, or None (side not asked).
        lexical: ``(BM25 float32 (q, c), rows)``, the same for BM25.
        lexical_of_dense: float64 (q, c): BM25 of each dense candidate (hybrid only).
        dense_of_lexical: float64 (q, c): cosine of each lexical candidate (hybrid only).
        dense_top: float64 (q,): the best cosine of any one of its searchable rows (-inf:
            none), before a long document's rows are re-scored by their document
            (:mod:`~flowsearch.search.document_scores`): what the query verdict reads.
    """

    matched: int | None
    dense: Side | None
    lexical: Side | None
    lexical_of_dense: np.ndarray | None = None
    dense_of_lexical: np.ndarray | None = None
    dense_top: np.ndarray | None = None


class Shard(Protocol):
    """A set of a version's segments that answers with given statistics."""

    def statistics(self, version: int, terms: Sequence[str]) -> Statistics:
        """Its part of ``version``'s statistics, with ``terms``' document frequencies."""
        ...

    def answer(self, request: Request) -> Answer:
        """Its own candidates for ``request`` (see :class:`Answer`)."""
        ...

    def records(self, version: int, rows: np.ndarray) -> list[RowRecord]:
        """The records (id, text, metadata) of global ``rows`` it holds, in that order."""
        ...


class Shards(Protocol):
    """Every shard of a version, asked together (in turn, or in parallel)."""

    def statistics(self, version: int, terms: Sequence[str]) -> list[Statistics]: ...

    def answer(self, request: Request) -> list[Answer]: ...

    def records(self, version: int, rows: Sequence[np.ndarray]) -> list[list[RowRecord]]:
        """Per shard, the records of the rows given to it (``rows[i]`` to shard ``i``)."""
        ...

    def owners(self, rows: np.ndarray) -> np.ndarray:
        """The shard holding each of the version's global ``rows`` (int64 array)."""
        ...

    def __len__(self) -> int: ...


class SegmentSet:
    """A :class:`Shard` over an opened :class:`Version` (all of a version's segments, or some).

    Args:
        version: the opened segments; its rows are numbered contiguously over them.
        base: int64 (segments,): each segment's first *global* row in the whole version.
        filters: returns the filter database ``where`` runs in (made on first use).
        gpu_lock: held while the vector indexes are searched when they are on a GPU (FAISS
            GPU indexes are not thread-safe); None on the CPU.
        helpers: search a single query's segments concurrently (the owner's threads); None:
            in turn.
    """

    def __init__(
        self,
        version: Version,
        base: np.ndarray | None = None,
        filters: Callable[[], MetadataFilter] | None = None,
        gpu_lock: threading.Lock | None = None,
        helpers: dense.SegmentHelpers | None = None,
    ) -> None:
        self.version = version
        self.base = np.asarray(version.offsets[:-1] if base is None else base, np.int64)
        if len(self.base) != len(version.segments):
            raise BadInput(f"{len(self.base)} bases for {len(version.segments)} segments")
        self._filters = filters
        self._gpu_lock = gpu_lock
        self._helpers = helpers
        #: its own rows are the global ones (it holds every segment, in order): no translating
        self._same_rows = bool(np.array_equal(self.base, version.offsets[:-1]))

    @property
    def number(self) -> int:
        """The version number it serves."""
        return int(self.version.manifest.version)

    def _check(self, version: int) -> None:
        if version != self.number:
            raise BadInput(
                f"this shard serves version {self.number}, asked for version {version}",
                "refresh the searcher",
            )

    # -- rows --------------------------------------------------------------------------------

    def to_global(self, rows: np.ndarray) -> np.ndarray:
        """Its own rows -> global rows (-1 stays -1)."""
        rows = np.asarray(rows, np.int64)
        valid = rows >= 0
        if self._same_rows:
            return np.where(valid, rows, -1)
        seg, local = self.version.locate(np.where(valid, rows, 0))
        return np.where(valid, self.base[seg] + local, -1)

    def to_local(self, rows: np.ndarray) -> np.ndarray:
        """Global rows it holds -> its own rows (-1 stays -1)."""
        rows = np.asarray(rows, np.int64)
        valid = rows >= 0
        if self._same_rows:
            if rows.size and int(rows.max()) >= int(self.version.offsets[-1]):
                raise BadInput("a row this shard does not hold", "ask the shard that holds it")
            return np.where(valid, rows, -1)
        order = np.argsort(self.base, kind="stable")
        at = np.searchsorted(self.base[order], np.where(valid, rows, 0), side="right") - 1
        seg = order[np.maximum(at, 0)]
        local = np.where(valid, rows, 0) - self.base[seg]
        sizes = np.diff(self.version.offsets)
        if np.any(valid & ((at < 0) | (local >= sizes[seg]))):
            raise BadInput("a row this shard does not hold", "ask the shard that holds it")
        return np.where(valid, self.version.offsets[seg] + local, -1)

    # -- the protocol ------------------------------------------------------------------------

    def statistics(self, version: int, terms: Sequence[str]) -> Statistics:
        self._check(version)
        v = self.version
        vector_sum, n_live = v.dense_statistics()
        lexical = None if v.lexical is None else v.lexical.statistics(terms)
        return Statistics(self.number, n_live, vector_sum, lexical)

    def answer(self, request: Request) -> Answer:
        self._check(request.version)
        v, q = self.version, len(request.queries)
        rows = self.matching(request.where)
        matched = None if rows is None else len(rows)
        want_dense = request.mode in ("dense", "hybrid")
        want_lexical = request.mode in ("lexical", "hybrid")
        if rows is not None and not len(rows):
            none = (np.zeros((q, 0), np.float32), np.zeros((q, 0), np.int64))
            empty = np.zeros((q, 0))
            hybrid = request.mode == "hybrid"
            return Answer(matched, none if want_dense else None, none if want_lexical else None,
                          empty if hybrid else None, empty if hybrid else None)  # fmt: skip
        stats = request.statistics.lexical
        d = lx = of_dense = of_lexical = top = None
        if want_dense:
            assert request.vectors is not None
            d, top = self.dense(request.vectors, request.k, rows)
        if want_lexical:
            assert v.lexical is not None  # the mode was checked against the manifest
            allowed = None
            if rows is not None:
                allowed = np.zeros(v.n_rows, dtype=bool)
                allowed[rows] = True
            if d is None:
                lx = v.lexical.search(list(request.queries), request.k, allowed=allowed,
                                      statistics=stats)  # fmt: skip
            else:  # hybrid: each query scored once for its candidates and the dense ones'
                lx, of_dense = v.lexical.search_and_score(
                    list(request.queries), request.k, d[1], allowed=allowed, statistics=stats
                )
        if d is not None and lx is not None:
            assert request.vectors is not None
            own = dense.cosines(v.segments, v.offsets, request.vectors, lx[1])
            of_lexical = document_scores.document_cosines(v.segments, v.offsets,
                                                          request.vectors, lx[1], own)  # fmt: skip
        return Answer(
            matched,
            None if d is None else (d[0], self.to_global(d[1])),
            None if lx is None else (lx[0], self.to_global(lx[1])),
            of_dense,
            of_lexical,
            top,
        )

    def records(self, version: int, rows: np.ndarray) -> list[RowRecord]:
        self._check(version)
        own = self.to_local(rows)
        if not len(own):
            return []
        segments = self.version.segments
        if len(segments) == 1 and (own >= 0).all():
            return segments[0].reader.records(own)
        seg_of, local = self.version.locate(own)
        out: list[RowRecord] = [cast(RowRecord, {}) for _ in own]
        for s in np.unique(seg_of):
            pick = np.flatnonzero(seg_of == s)
            fetched = self.version.segments[int(s)].reader.records(local[pick])
            for i, rec in zip(pick.tolist(), fetched, strict=True):
                out[i] = rec
        return out

    # -- the pieces --------------------------------------------------------------------------

    def matching(self, where: str | None) -> np.ndarray | None:
        """Its own rows ``where`` matches, sorted (None without a filter)."""
        if where is None or not where.strip():
            return None
        if self._filters is None:
            raise BadInput("this shard has no filter database", "open it with one")
        found: np.ndarray = self.version.metadata_filter(self._filters()).rows(where)
        return found

    def dense(self, Z: np.ndarray, k: int, rows: np.ndarray | None) -> tuple[Side, np.ndarray]:
        """Top-k of its own searchable rows (``rows`` a filter kept, minus deleted): (cosines,
        its own rows), and each query's best cosine of one row (:attr:`Answer.dense_top`)."""
        v = self.version
        knobs = v.knobs()
        tops = [np.full(len(Z), -np.inf)]

        def rescore(
            seg: SegmentReader, Z: np.ndarray, scores: np.ndarray, found: np.ndarray
        ) -> Side:
            if scores.shape[1]:  # a segment's answer is best first: its first is its best row
                tops.append(np.where(found[:, 0] >= 0, scores[:, 0], -np.inf))
            return document_scores.rescored_segment(seg, Z, scores, found)

        def search(helpers: dense.SegmentHelpers | None = None) -> Side:
            return dense.search_segments(v.segments, v.deleted, v.offsets, Z, k, v.split(rows),
                                         knobs, helpers, rescore)  # fmt: skip

        if self._gpu_lock is not None:
            with self._gpu_lock:
                found = search()
        elif len(Z) <= ONE_THREAD_MAX_QUERIES:  # each search on one FAISS thread
            helpers = self._helpers if len(v.segments) > 1 else None
            found = ann_io.single_threaded(lambda: search(helpers))
        else:
            found = search()
        return found, np.max(np.stack(tops), axis=0).astype(np.float64)


class InProcess:
    """:class:`Shards` that live in this process, asked in turn."""

    def __init__(self, shards: Sequence[SegmentSet]) -> None:
        self.shards = list(shards)
        bases = [(int(b), i) for i, s in enumerate(self.shards) for b in s.base]
        sizes = [n for s in self.shards for n in np.diff(s.version.offsets).tolist()]
        order = np.argsort([b for b, _ in bases], kind="stable")
        self._starts = np.array([bases[i][0] for i in order], np.int64)
        self._ends = self._starts + np.array([sizes[i] for i in order], np.int64)
        self._shard_of = np.array([bases[i][1] for i in order], np.int64)

    def statistics(self, version: int, terms: Sequence[str]) -> list[Statistics]:
        return [s.statistics(version, terms) for s in self.shards]

    def answer(self, request: Request) -> list[Answer]:
        return [s.answer(request) for s in self.shards]

    def records(self, version: int, rows: Sequence[np.ndarray]) -> list[list[RowRecord]]:
        return [s.records(version, r) for s, r in zip(self.shards, rows, strict=True)]

    def owners(self, rows: np.ndarray) -> np.ndarray:
        return owners_of(self._starts, self._shard_of, rows)

    def __len__(self) -> int:
        return len(self.shards)


def owners_of(starts: np.ndarray, shard_of: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The shard of each global row, given each segment's first global row (ascending) and
    its shard."""
    at = np.searchsorted(starts, np.asarray(rows, np.int64), side="right") - 1
    return np.asarray(shard_of[at], np.int64)


def split(
    version: Version,
    groups: Sequence[Sequence[int]],
    *,
    filters: Callable[[], MetadataFilter] | None = None,
    gpu_lock: threading.Lock | None = None,
    helpers: dense.SegmentHelpers | None = None,
) -> InProcess:
    """``version``'s opened segments as shards in this process: shard ``i`` holds the segments
    numbered ``groups[i]`` (every segment once). Nothing is reopened; each shard gets its own
    BM25 side over its segments (what a shard in another process opens)."""
    seen = sorted(i for g in groups for i in g)
    if seen != list(range(len(version.segments))):
        raise BadInput("groups must hold every segment once", param="groups")
    return InProcess([SegmentSet(*subset(version, g), filters, gpu_lock, helpers) for g in groups])


def subset(version: Version, segments: Sequence[int]) -> tuple[Version, np.ndarray]:
    """A :class:`Version` over some of ``version``'s opened segments (rows renumbered
    contiguously) and each one's global first row."""
    from flowsearch.lexical.bm25 import Bm25

    picked = sorted(segments)
    m = version.manifest
    manifest = m.model_copy(update={"segments": tuple(m.segments[i] for i in picked)})
    readers = [version.segments[i] for i in picked]
    masks = [version.deleted[i] for i in picked]
    counts = [r.n_rows for r in readers]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    lexical = None
    if version.lexical is not None:
        assert m.lexical is not None
        # a version with a lexical side has every segment's postings (open_version checks)
        lexical = Bm25([(cast("Postings", r.postings), d) for r, d in zip(readers, masks)],
                       cache_bytes=version.lexical.cache_bytes,
                       **bm25_params(m.lexical.params))  # fmt: skip
    sub = Version(version.root, manifest, version.space, readers, offsets, masks,
                  version.verified, lexical)  # fmt: skip
    return sub, version.offsets[picked]


# -- the driver ----------------------------------------------------------------------------


@dataclass
class StatisticsCache:
    """A version's global statistics, gathered from the shards once per version and term."""

    version: int = -1
    base: Statistics | None = None
    df: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    max_terms: int = 200_000

    def get(self, shards: Shards, version: int, terms: Sequence[str]) -> Statistics:
        """The global statistics of ``version`` with ``terms``' document frequencies (phase
        1: asks the shards only for what it does not hold)."""
        with self.lock:
            if version != self.version:
                self.version, self.base, self.df = version, None, {}
            missing = [t for t in terms if t not in self.df]
            base = self.base
        if base is None or missing:
            whole = Statistics.summed(shards.statistics(version, missing))
            with self.lock:
                if self.version == version:
                    if len(self.df) > self.max_terms:
                        self.df = {}
                    self.base = base = whole
                    if whole.lexical is not None:
                        self.df.update(whole.lexical.df)
                    df = {t: self.df.get(t, 0) for t in terms}
                else:  # another reader moved the cache to a newer version meanwhile
                    base = whole
                    df = dict(whole.lexical.df) if whole.lexical is not None else {}
        else:
            with self.lock:
                df = {t: self.df[t] for t in terms}
        assert base is not None
        if base.lexical is None:
            return base
        lexical = Bm25Statistics(base.lexical.n_live, base.lexical.total_length,
                                 {t: df[t] for t in terms})  # fmt: skip
        return Statistics(version, base.n_live, base.vector_sum, lexical)


@dataclass(frozen=True)
class Ranked:
    """The driver's answer before records: (q, k) arrays; ``log_density`` and ``top`` are
    None as :meth:`Searcher._run` returns them."""

    scores: np.ndarray
    rows: np.ndarray
    parts: tuple[np.ndarray, np.ndarray]
    log_density: np.ndarray | None
    top: np.ndarray | None


def run(
    shards: Shards,
    manifest: mf.Manifest,
    cache: StatisticsCache,
    queries: list[str],
    k: int,
    where: str | None,
    mode: Mode,
    embed: Callable[[list[str]], tuple[np.ndarray, np.ndarray | None]] | None = None,
    vectors: np.ndarray | None = None,
    passages_per_document: float = 1.0,
    hybrid_candidates: int = SearchOptions.hybrid_candidates,
    hybrid_weight: float | None = None,
) -> Ranked | None:
    """One search over every shard (two phases, see the module docstring): the ranked global
    rows with their scores, or None when ``where`` matched no row. ``mode`` is checked;
    ``vectors`` (searched space) stand in for ``embed``'s when given; the hybrid's weight
    falls with ``passages_per_document`` (:func:`flowsearch.search.fusion.default_weight`);
    a hybrid fuses ``hybrid_candidates`` (at least k) of each side, at ``hybrid_weight`` when
    given."""
    from flowsearch.search.fusion import fuse
    from flowsearch.search.scores import normalise_dense, normalise_lexical

    if where is not None and not isinstance(where, str):
        raise BadInput(f"where must be a SQL string, got {type(where).__name__}", param="where")
    where = where if where is not None and where.strip() else None
    version = int(manifest.version)
    k = min(k, max(manifest.n_live, 1))
    candidates = k if mode != "hybrid" else max(k, hybrid_candidates)
    terms = query_terms(queries) if mode != "dense" else []
    stats = cache.get(shards, version, terms)
    Z = lp = None
    if mode != "lexical":
        if vectors is not None:
            Z = vectors
        else:
            assert embed is not None
            Z, lp = embed(queries)
    request = Request(version, mode, tuple(queries), Z, candidates, where, stats)
    with stage("search"):
        answers = shards.answer(request)
    if where is not None and not any(a.matched for a in answers):
        return None
    reference = stats.fusion()
    d = _merged([(a.dense, a.lexical_of_dense) for a in answers], candidates)
    lx = _merged([(a.lexical, a.dense_of_lexical) for a in answers], candidates)
    top = None
    if d is not None and where is None and d[0].shape[1]:
        tops = [a.dense_top for a in answers if a.dense is not None]
        if tops and all(t is not None for t in tops):  # the best row's own cosine
            best = np.max(np.stack([np.asarray(t, np.float64) for t in tops]), axis=0)
            top = np.where(np.isfinite(best), best, np.nan)
        else:
            top = np.where(d[1][:, 0] >= 0, d[0][:, 0], np.nan)
    upper = None
    if lx is not None:
        assert stats.lexical is not None and manifest.lexical is not None

        params = bm25_params(manifest.lexical.params)
        method, k1 = params.get("method", "lucene"), float(params.get("k1", 1.5))
        upper = np.array([upper_bound(q, stats.lexical, method, k1) for q in queries], np.float64)
    if d is not None and lx is not None:
        assert upper is not None
        kind: Literal["transformer", "static"] = (
            "static" if manifest.encoder.pooling == "static" else "transformer"
        )
        with stage("fuse"):
            fused = fuse((d[0], d[1]), (lx[0], lx[1]), reference, k, upper=upper, kind=kind,
                         passages_per_document=passages_per_document, weight=hybrid_weight,
                         dense_of_lexical=lx[2], lexical_of_dense=d[2])  # fmt: skip
        parts = (fused.dense_scores, fused.lexical_scores)
        return Ranked(fused.scores, fused.rows, parts, lp, top)
    if d is not None:
        cos, found = d[0][:, :k], d[1][:, :k]
        return Ranked(normalise_dense(cos, reference), found,
                      (cos, np.full_like(cos, np.nan)), lp, top)  # fmt: skip
    assert lx is not None and upper is not None
    bm25, found = lx[0][:, :k], lx[1][:, :k]
    return Ranked(normalise_lexical(bm25, upper), found,
                  (np.full_like(bm25, np.nan), bm25), lp, top)  # fmt: skip


def _merged(
    sides: list[tuple[Side | None, np.ndarray | None]], k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """Each shard's candidates of one side merged to the global top-k (``merge_top_k``), with
    the other side's score of each carried along (None when not given)."""
    given = [(side, other) for side, other in sides if side is not None]
    if not given:
        return None
    zero = np.zeros(len(given) + 1, np.int64)  # rows are global already
    scores, rows = dense.merge_top_k([side for side, _ in given], zero, k)
    if any(other is None for _, other in given):
        return scores, rows, None
    all_rows = np.concatenate([side[1] for side, _ in given], axis=1)
    all_other = np.concatenate([np.asarray(o, np.float64) for _, o in given], axis=1)
    return scores, rows, _carried(all_rows, all_other, rows)


def _carried(rows: np.ndarray, values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Per query, ``values`` at the position of each of ``wanted`` in ``rows`` (rows are
    distinct within a query; NaN for -1)."""
    q = len(rows)
    out = np.full(wanted.shape, np.nan)
    if not rows.size or not wanted.size:
        return out
    span = int(max(rows.max(), wanted.max())) + 2
    qi = np.arange(q, dtype=np.int64)[:, None]
    keys = np.where(rows >= 0, qi * span + rows, -1).reshape(-1)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    want = np.where(wanted >= 0, qi * span + wanted, -1).reshape(-1)
    at = np.minimum(np.searchsorted(sorted_keys, want), len(sorted_keys) - 1)
    hit = (sorted_keys[at] == want) & (want >= 0)
    flat = out.reshape(-1)
    flat[hit] = values.reshape(-1)[order[at[hit]]]
    return flat.reshape(wanted.shape)


def records_of(shards: Shards, version: int, rows: np.ndarray) -> dict[int, RowRecord]:
    """The records of the valid (>= 0) global ``rows``, by row, asked of the shards holding
    them."""
    valid = np.unique(rows[rows >= 0])
    by_row: dict[int, RowRecord] = {}
    if valid.size and len(shards) == 1:
        by_row.update(zip(valid.tolist(), shards.records(version, [valid])[0], strict=True))
    elif valid.size:
        owner = shards.owners(valid)
        asked = [valid[owner == i] for i in range(len(shards))]
        for wanted, found in zip(asked, shards.records(version, asked), strict=True):
            by_row.update(zip(wanted.tolist(), found, strict=True))
    return by_row


def hits_of(shards: Shards, manifest: mf.Manifest, ranked: Ranked) -> list[list[Hit]]:
    """The ranked rows joined to their records (asked of the shards holding them)."""
    from flowsearch.search.hits import build_hits

    by_row = records_of(shards, manifest.version, ranked.rows)
    return build_hits(by_row, manifest.metadata_columns, ranked.scores, ranked.rows, ranked.parts)
