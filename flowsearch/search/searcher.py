r"""Answering queries against a published index: :class:`Searcher`, its :class:`Hit` and reports.

``Searcher.open`` reads the manifest once and pins that version: its searched space (encoder
and calibrator), its FAISS index and its shards, checked against the manifest. A batch of
queries costs one encoder call and one FAISS call; hits are joined to their shard rows by
decoding only the row groups that hold them. :meth:`Searcher.refresh` moves to a newer published
version (reusing the loaded encoder); searches running meanwhile finish on the version they
started on.

Example:
    >>> s = Searcher.open("flowsearch_index")  # doctest: +SKIP
    >>> [(h.rank, h.id, round(h.score, 3)) for h in s.search("a query", k=3)]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from flowsearch.ann import faiss_index as fx
from flowsearch.errors import FlowsearchError
from flowsearch.search.version import IndexInfo, Version, sizes
from flowsearch.search.version import load as load_version
from flowsearch.space.reference import reference_of
from flowsearch.space.reports import QueryReport, query_report
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import directory as directory
from flowsearch.storage import manifest as mf

__all__ = [
    "HYBRID_CANDIDATES",
    "HYBRID_WEIGHT",
    "HYBRID_WEIGHT_STATIC",
    "MODES",
    "Hit",
    "QueryResult",
    "Searcher",
    "hit_dict",
]

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hit:
    """One search result.

    Attributes:
        id: the row's id (int or str, as indexed).
        score: inner product of the normalised query and row vectors (cosine similarity).
        rank: 1-based position in the hit list.
        text: the passage.
        metadata: the corpus's other columns for this row.
        log_density: the query's log-density under the index's flow (None without a flow or
            for :meth:`Searcher.search_vectors`); see :meth:`Searcher.query` for its meaning.
    """

    id: Any
    score: float
    rank: int
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    log_density: float | None = None
    dense_score: float | None = None
    lexical_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields."""
        return asdict(self)


#: Search modes: the encoder's side, BM25's side, or both fused.
MODES = ("dense", "lexical", "hybrid")
#: Weight of the dense side in hybrid's convex fusion of min-max normalised scores (Bruch et al.
#: 2022), for transformer poolings: within 0.01 nDCG@10 of each dev set's best weight for the
#: bundled model's ``mean`` (0.5 fell 0.024 short on one), and no worse than 0.5 on the
#: asymmetric set (benchmarks/bench_retrieval.md).
HYBRID_WEIGHT = 0.6
#: Dense weight for ``static`` poolings (a table lookup, Model2Vec included): their dense side
#: trails BM25 on question -> passage search; 0.3 is within 0.004 nDCG@10 of each dev set's best
#: weight for the token table (0.003 for Model2Vec, whose own best is 0.4), where 0.6 falls below
#: BM25 alone on QNLI (benchmarks/RESULTS.md, bench_retrieval).
HYBRID_WEIGHT_STATIC = 0.3
#: Candidates each side contributes to hybrid fusion (at least k).
HYBRID_CANDIDATES = 100


@dataclass(frozen=True)
class QueryResult:
    """A query's hits and its report: how it sits among the corpus's own passages."""

    query: str
    hits: list[Hit]
    density: QueryReport

    def to_dict(self) -> dict[str, Any]:
        """``{"query", "hits": [{"rank", "id", "score", "text", "metadata"}], "density"}``."""
        return {
            "query": self.query,
            "hits": [hit_dict(h) for h in self.hits],
            "density": self.density.to_dict(),
        }


def hit_dict(hit: Hit) -> dict[str, Any]:
    """A hit as ``query --json`` and the HTTP API print it: rank, id, score, text, metadata,
    and the component scores of a hybrid search."""
    out = {key: getattr(hit, key) for key in ("rank", "id", "score", "text", "metadata")}
    if hit.dense_score is not None or hit.lexical_score is not None:
        out.update(dense_score=hit.dense_score, lexical_score=hit.lexical_score)
    return out


class Searcher:
    """Searches one index directory. Use :meth:`open`; safe to share between threads."""

    def __init__(
        self, index_dir: Path, version: Version, *, gpu: bool = False, mmap: bool = False
    ) -> None:
        self.root = Path(index_dir)
        self._version = version
        self._gpu = gpu  # FAISS GPU indexes are not safe to search from several threads
        self._mmap = mmap
        self._index_lock = threading.Lock()
        self._rows_lock = threading.Lock()  # the row-group cache of the pinned reader
        self._refresh_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        index_dir: str | os.PathLike[str],
        verify: bool = False,
        *,
        encoder: Any = None,
        model: str | os.PathLike[str] | None = None,
        gpu: bool = True,
        mmap: bool = False,
    ) -> Searcher:
        """Open an index directory at its current version.

        Args:
            index_dir: the index to search.
            verify: check the sha256 of every file (by default sizes, and the checksums of
                files up to 16 MiB).
            encoder: reuse a loaded Encoder (must match the manifest's model, pooling, ...).
            model: where the index's model directory is now, if it has moved since the index was
                built (checked against the recorded content hash).
            gpu: move the FAISS index to the GPU(s) when FAISS sees any.
            mmap: memory-map the FAISS index instead of reading it into RAM (IVF inverted
                lists, ``Flat`` and the flat storage of HNSW): the OS pages in what searches
                touch, so an index larger than RAM can be searched (an IVF search reads only
                ``nprobe`` lists). Shard rows are always read by position for the hits only.
                Ignored when the index goes to a GPU.

        Raises:
            FlowsearchError: no index, a missing or corrupt file, or a mismatched encoder or
                calibrator.
        """
        root = Path(index_dir).expanduser()
        on_gpu = gpu and fx.num_gpus() > 0
        version = directory.open_version(
            root, lambda m: load_version(root, m, verify, encoder, model, on_gpu, mmap)
        )
        return cls(root, version, gpu=on_gpu, mmap=mmap)

    @property
    def manifest(self) -> mf.Manifest:
        """The pinned version's manifest."""
        return self._version.manifest

    @property
    def encoder(self) -> Any:
        """The encoder queries go through."""
        return self._version.space.encoder

    @property
    def space(self) -> SearchSpace:
        """The searched space of the pinned version."""
        return self._version.space

    def refresh(self) -> bool:
        """Move to the index's current version if a newer one was published (cheap: the
        encoder is reused). Returns True when the version changed."""
        with self._refresh_lock:
            current = self._version
            if mf.read(self.root).version == current.manifest.version:
                return False
            encoder = current.space.encoder
            self._version = directory.open_version(
                self.root,
                lambda m: load_version(self.root, m, False, encoder, None, self._gpu, self._mmap),
            )
            LOG.info("now on version %d of %s", self._version.manifest.version, self.root)
            return True

    def close(self) -> None:
        """Release the pinned version's shard files and its filter database."""
        with self._rows_lock:
            version = self._version
            version.reader.close()
            with version._filter_lock:
                if version._filter is not None:
                    version._filter.close()
                    version._filter = None

    def __len__(self) -> int:
        return int(self.manifest.live_rows)

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"Searcher({str(self.root)!r}, version={m.version}, rows={len(self)}, "
            f"space={m.calibration.space!r})"
        )

    def info(self) -> IndexInfo:
        """What the pinned version holds (as ``flowsearch info``)."""
        v = self._version
        return IndexInfo(
            str(self.root.resolve()), v.manifest, sizes(self.root, v.manifest), v.verified
        )

    def embed(self, queries: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """Queries -> (float32 (q, dim) in the searched space, float64 (q,) log-density or None)."""
        return self._version.space.embed(queries)

    @property
    def default_mode(self) -> str:
        """``hybrid`` when the index has a lexical part, else ``dense``."""
        return "hybrid" if self._version.lexical is not None else "dense"

    @overload
    def search(
        self, query: str, k: int = 10, where: str | None = None, mode: str | None = None
    ) -> list[Hit]: ...

    @overload
    def search(
        self, query: list[str], k: int = 10, where: str | None = None, mode: str | None = None
    ) -> list[list[Hit]]: ...

    def search(
        self,
        query: str | list[str],
        k: int = 10,
        where: str | None = None,
        mode: str | None = None,
    ) -> list[Hit] | list[list[Hit]]:
        """Top-``k`` hits for one query (a list of :class:`Hit`) or a list of queries (one list
        each), best first. Deleted rows are never returned.

        Args:
            query: a query, or a list of them.
            k: hits per query.
            where: a SQL predicate over the metadata columns (evaluated by DuckDB), e.g.
                ``"year >= 2020 AND lang = 'en'"``: a pre-filter, the top-k among matching rows.
            mode: ``dense`` (the encoder), ``lexical`` (BM25) or ``hybrid`` (both, fused);
                None: :attr:`default_mode`.

        Raises:
            FlowsearchError: a query that is not a non-blank string, k < 1, a bad ``where``,
                an unknown mode or one the index cannot serve.
        """
        single = isinstance(query, str)
        queries = _checked_queries(query)
        k = _checked_k(k)
        if not queries:
            return []
        hits = self._run(self._version, queries, k, where, mode)[0]
        return hits[0] if single else hits

    def query(
        self, query: str, k: int = 10, where: str | None = None, mode: str | None = None
    ) -> QueryResult:
        """One query's hits with the density report (what ``flowsearch query`` prints)."""
        version = self._version
        if not isinstance(query, str):
            raise FlowsearchError(f"query must be a string, got {type(query).__name__}")
        hits, lp, top = self._run(version, _checked_queries(query), _checked_k(k), where, mode)
        report = self._report(
            version, None if lp is None else lp[0], None if top is None else top[0]
        )
        return QueryResult(query, hits[0], report)

    def _run(
        self, version: Version, queries: list[str], k: int, where: str | None, mode: str | None
    ) -> tuple[list[list[Hit]], np.ndarray | None, np.ndarray | None]:
        """(hits, query log-densities or None, best dense score over the whole index or None)."""
        mode = self._checked_mode(version, mode)
        rows = version.matching(where)
        if rows is not None and not len(rows):
            return [[] for _ in queries], None, None
        lp = top = None
        dense = lexical = None
        candidates = k if mode != "hybrid" else max(k, HYBRID_CANDIDATES)
        if mode in ("dense", "hybrid"):
            Z, lp = version.space.embed(queries)
            dense = self._dense(version, Z, candidates, rows)
            if rows is None:  # a filter's best row is not the index's: no comparable figure
                top = np.where(dense[1][:, 0] >= 0, dense[0][:, 0], np.nan)
        if mode in ("lexical", "hybrid"):
            lexical = version.lexical.search(queries, candidates, allowed=version.row_mask(rows))
        if dense is not None and lexical is not None:
            from flowsearch.search.fusion import convex

            static = version.manifest.encoder.pooling == "static"
            fused = convex(
                dense, lexical, k, weight=HYBRID_WEIGHT_STATIC if static else HYBRID_WEIGHT
            )
            comps = (fused.dense_scores, fused.lexical_scores)
            return self._hits(version, fused.scores, fused.rows, lp, comps), lp, top
        side = dense if dense is not None else lexical
        assert side is not None
        scores, found = side
        return self._hits(version, scores, found, lp), lp, top

    @staticmethod
    def _checked_mode(version: Version, mode: str | None) -> str:
        if mode is None:
            return "hybrid" if version.lexical is not None else "dense"
        if mode not in MODES:
            raise FlowsearchError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode != "dense" and version.lexical is None:
            raise FlowsearchError(
                f"mode {mode!r} needs a lexical index, and this index was built without one; "
                "use mode='dense' or rebuild it with lexical=True"
            )
        return mode

    def query_report(
        self, log_density: float | None, top_score: float | None = None
    ) -> QueryReport:
        """Judge a query from its log-density (a hit's ``log_density``) and its best dense score
        over the whole index (see :class:`~flowsearch.space.reports.QueryReport`)."""
        return self._report(self._version, log_density, top_score)

    @staticmethod
    def _report(
        version: Version, log_density: float | None, top_score: float | None = None
    ) -> QueryReport:
        return query_report(top_score, reference_of(version.manifest), log_density)

    def search_vectors(self, Z: np.ndarray, k: int = 10) -> list[list[Hit]]:
        """Top-``k`` hits for vectors already in the searched space.

        Args:
            Z: float32 (q, dim), L2-normalised, in the index's searched space (what
                :meth:`embed` returns; the ``vector`` column of the shards).
            k: hits per query.

        Raises:
            FlowsearchError: another dimension, or values that are not finite.
        """
        version = self._version
        Z = np.atleast_2d(np.asarray(Z, dtype=np.float32))
        if Z.ndim != 2 or Z.shape[1] != version.manifest.dim:
            raise FlowsearchError(
                f"vectors have shape {Z.shape}, the index searches dim {version.manifest.dim}"
            )
        if not np.isfinite(Z).all():
            raise FlowsearchError("vectors hold NaN or infinite values; pass finite vectors")
        scores, rows = self._dense(version, Z, _checked_k(k), None)
        return self._hits(version, scores, rows, None)

    def _dense(
        self, version: Version, Z: np.ndarray, k: int, rows: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """FAISS top-k over the searchable rows (``rows`` matched by a filter, minus deleted)."""
        if rows is None and version.deleted is None:
            search = lambda: fx.search(version.faiss_index, Z, k)  # noqa: E731
        else:
            from flowsearch.ann.prefilter import filtered_search

            def search() -> tuple[np.ndarray, np.ndarray]:
                return filtered_search(version.faiss_index, Z, k, rows, excluded=version.deleted)

        if self._gpu:
            with self._index_lock:
                return search()
        if len(Z) <= fx.ONE_THREAD_MAX_QUERIES:
            return fx.single_threaded(search)
        return search()

    def _hits(
        self,
        version: Version,
        scores: np.ndarray,
        rows: np.ndarray,
        lp: np.ndarray | None,
        components: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[list[Hit]]:
        valid = np.unique(rows[rows >= 0])
        with self._rows_lock:
            fetched = version.reader.rows(valid) if valid.size else []
        by_row = dict(zip(valid.tolist(), fetched, strict=True))
        out = []
        for qi in range(len(rows)):
            density = None if lp is None else float(lp[qi])
            hits: list[Hit] = []
            for j, (score, row) in enumerate(zip(scores[qi], rows[qi], strict=True)):
                if row < 0:
                    continue
                rec = by_row[int(row)]
                parts: dict[str, float | None] = {}
                if components is not None:
                    d, x = float(components[0][qi, j]), float(components[1][qi, j])
                    parts = {
                        "dense_score": None if np.isnan(d) else d,
                        "lexical_score": None if np.isnan(x) else x,
                    }
                hits.append(
                    Hit(
                        id=rec["id"],
                        score=float(score),
                        rank=len(hits) + 1,
                        text=rec["text"],
                        metadata=rec["metadata"],
                        log_density=density,
                        **parts,
                    )
                )
            out.append(hits)
        return out

    def vectors(self) -> np.ndarray:
        """All stored vectors of the searched space, float32 (rows, dim), in row order."""
        with self._rows_lock:
            return np.asarray(self._version.reader.column("vector"), dtype=np.float32)


def _checked_queries(query: Any) -> list[str]:
    queries = [query] if isinstance(query, str) else query
    if not isinstance(queries, (list, tuple)):
        raise FlowsearchError(
            f"query must be a string or a list of strings, got {type(query).__name__}"
        )
    for q in queries:
        if not isinstance(q, str):
            raise FlowsearchError(f"queries must be strings, got {type(q).__name__}")
        if not q.strip():
            raise FlowsearchError("the query is empty; pass some text to search for")
    return list(queries)


def _checked_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise FlowsearchError(f"k must be a positive integer, got {k!r}")
    return int(k)
