r"""Answering queries against a published index: :class:`Searcher`.

``Searcher.open`` reads the manifest once and pins that version: its searched space (encoder
and calibrator), and its segments, opened and checked against the manifest. It keeps answering
from that version — every mode and ``where`` — however many writes happen meanwhile, until
:meth:`Searcher.refresh` moves it to the newest one (reusing the encoder and every segment the
two versions share). A batch of queries costs one encoder call; each segment is searched with
its own vector index and the answers merged (:mod:`flowsearch.search.dense`); hits are joined
to their rows by decoding only the row groups that hold them.

Example:
    >>> s = Searcher.open("flowsearch_index")  # doctest: +SKIP
    >>> [(h.rank, h.id, round(h.score, 3)) for h in s.search("a query", k=3)]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import overload

import numpy as np

from flowsearch.encode.protocol import TextEncoder
from flowsearch.errors import BadInput, check_bool, check_path
from flowsearch.search import arguments as args
from flowsearch.search import shards as sh
from flowsearch.search.backend import LocalBackend, ShardBackend
from flowsearch.search.documents import document_hits
from flowsearch.search.hits import above, with_marks
from flowsearch.search.modes import MODES, Mode
from flowsearch.search.options import SearchOptions
from flowsearch.search.rerank import DEFAULT_RERANK_DEPTH, Reranker, checked_depth
from flowsearch.search.results import Hit, QueryResult
from flowsearch.search.timings import stage
from flowsearch.search.version import IndexInfo, Version, sizes
from flowsearch.space.reports import QueryReport
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import MANIFEST_NAME

__all__ = ["MODES", "Hit", "Mode", "QueryResult", "SearchOptions", "Searcher"]

LOG = logging.getLogger(__name__)


def _stat(root: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(root / MANIFEST_NAME)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Searcher:
    """Searches one index directory. Use :meth:`open`; safe to share between threads.

    Args:
        index_dir: the index directory.
        version: the pinned version.
        backend: who holds its segments (:class:`~flowsearch.search.backend.ShardBackend`).
        options: the searcher's knobs.
    """

    def __init__(
        self,
        index_dir: Path,
        version: Version,
        backend: ShardBackend,
        options: SearchOptions | None = None,
        reranker: Reranker | None = None,
        rerank_depth: int = DEFAULT_RERANK_DEPTH,
    ) -> None:
        self.root = Path(index_dir)
        self.reranker = reranker
        self.rerank_depth = checked_depth(rerank_depth)
        self._backend = backend
        self._version = version
        self.options = options or SearchOptions()
        self._stat = _stat(self.root)
        self._refresh_lock = threading.Lock()
        self._statistics = sh.StatisticsCache()
        self._closed = False

    @classmethod
    def open(
        cls,
        index_dir: str | os.PathLike[str],
        verify: bool = False,
        *,
        encoder: TextEncoder | None = None,
        model: str | os.PathLike[str] | None = None,
        gpu: bool = True,
        mmap: bool = False,
        engine: str = "local",
        shards: int | None = None,
        address: str | None = None,
        options: SearchOptions | None = None,
        reranker: str | os.PathLike[str] | Reranker | None = None,
        rerank_depth: int = DEFAULT_RERANK_DEPTH,
    ) -> Searcher:
        """Open an index directory at its current version.

        Args:
            index_dir: the index to search.
            verify: check the sha256 of every file (by default sizes, and the checksums of
                files up to ``storage.verify.CHEAP_CHECKSUM_BYTES``).
            encoder: reuse a loaded Encoder (must match the manifest's model, pooling, ...).
            model: where the index's model directory is now, if it has moved since the index
                was built (checked against the recorded content hash).
            gpu: move the vector indexes to the GPU(s) when FAISS sees any.
            mmap: memory-map the vector indexes instead of reading them into RAM.
            engine: ``local`` (this process) or ``ray``: the segments spread over ``shards``
                Ray actors, same interface and answers (:mod:`flowsearch.search.ray_shards`).
            shards: with ``engine="ray"``, how many actors (default: one per Ray node's CPU
                count, at most the segments); capped at the number of segments.
            address: with ``engine="ray"``, the Ray cluster to join (else ``RAY_ADDRESS``,
                else the Ray this process initialised, else a local one).
            options: the searcher's knobs (threads, caches, filter and shard bounds;
                :class:`~flowsearch.search.options.SearchOptions`), held for its lifetime.
            reranker: a sentence-transformers ``CrossEncoder`` (Hugging Face id or local
                directory) or a loaded :class:`~flowsearch.search.rerank.Reranker`: every
                search is then reranked by it unless asked ``rerank=False``.
            rerank_depth: first-stage documents the cross-encoder reads per query (at least
                ``k``): deeper finds what the first stage ranked low, for one cross-encoder
                pass per extra document.

        Raises:
            NotFound: no index there.
            IndexDamaged: a missing or corrupt file.
            BadInput: a mismatched encoder or calibrator, an unknown engine, ``shards`` < 1,
                an unreachable ``address``, ``options`` that are not SearchOptions.
            MissingExtra: ``engine="ray"`` without the ``ray`` extra.
            NotFound: no cross-encoder where ``reranker`` names one.
        """
        index_dir = check_path(index_dir, "index_dir", "an index directory")
        verify, gpu, mmap = (check_bool(v, n) for v, n in ((verify, "verify"), (gpu, "gpu"),
                                                           (mmap, "mmap")))  # fmt: skip
        rerank_depth = checked_depth(rerank_depth)
        if reranker is not None and not isinstance(reranker, Reranker):
            reranker = Reranker.load(reranker)
        if options is not None and not isinstance(options, SearchOptions):
            raise BadInput(f"options must be SearchOptions, got {type(options).__name__}",
                           "pass options=SearchOptions(...)", param="options")  # fmt: skip
        options = options or SearchOptions()
        backend: ShardBackend
        if engine == "ray":
            from flowsearch.search.ray_shards import RayBackend

            backend, version = RayBackend.start(index_dir, verify, encoder=encoder, model=model,
                                                shards=shards, address=address,
                                                options=options)  # fmt: skip
            return cls(version.root, version, backend, options, reranker, rerank_depth)
        if engine != "local":
            raise BadInput(f"unknown engine {engine!r}", "use {engine='local'} or 'ray'",
                           param="engine")  # fmt: skip
        if shards is not None or address is not None:
            raise BadInput("shards and address need engine='ray'", "pass {engine='ray'}",
                           param="engine")  # fmt: skip
        backend, version = LocalBackend.open(index_dir, verify, encoder=encoder, model=model,
                                             gpu=gpu, mmap=mmap, options=options)  # fmt: skip
        return cls(version.root, version, backend, options, reranker, rerank_depth)

    # -- the pinned version ----------------------------------------------------------------

    @property
    def manifest(self) -> mf.Manifest:
        """The pinned version's manifest."""
        return self._version.manifest

    @property
    def encoder(self) -> TextEncoder | None:
        """The encoder queries go through."""
        return self._version.space.encoder

    @property
    def space(self) -> SearchSpace:
        """The searched space of the pinned version."""
        return self._version.space

    @property
    def version(self) -> Version:
        """The pinned version (what a search reads)."""
        return self._version

    def refresh(self) -> bool:
        """Move to the index's current version if a newer one was published. Cheap when none
        was (one ``stat``); otherwise it opens only what the new version adds. Returns True
        when the version changed."""
        with self._refresh_lock:
            stat = _stat(self.root)
            if stat == self._stat:
                return False
            current_version = self._version
            manifest = mf.read(self.root)
            self._stat = stat
            if manifest.version == current_version.manifest.version:
                return False
            # every shard moves before any answer comes from the new version
            self._version = self._backend.refresh(current_version.space.encoder)
            LOG.info("now on version %d of %s", self._version.manifest.version, self.root)
            return True

    def close(self) -> None:
        """Release the pinned version's files, the filter database and the helper threads
        (with ``engine="ray"``: stop the shards, and Ray when the searcher started it). A
        search after it raises BadInput."""
        self._closed = True
        self._backend.close()

    def __len__(self) -> int:
        return int(self.manifest.n_live)

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"Searcher({str(self.root)!r}, version={m.version}, n_live={len(self)}, "
            f"segments={len(m.segments)}, space={m.calibration.space!r}"
            f"{self._backend.describe()})"
        )

    def info(self) -> IndexInfo:
        """What the pinned version holds (as ``flowsearch info``)."""
        v = self._version
        assert v.n_documents is not None  # counted when the version was opened
        return IndexInfo(
            path=str(self.root.resolve()),
            manifest=v.manifest,
            bytes=sizes(self.root, v.manifest),
            verified=v.verified,
            n_documents=v.n_documents,
        )

    def embed(self, queries: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """Queries -> (float32 (q, dim) in the searched space, float64 (q,) log-density or None)."""
        return self._version.space.embed(queries)

    @property
    def default_mode(self) -> Mode:
        """``hybrid`` when the index has a lexical side, else ``dense``."""
        return "hybrid" if self._version.manifest.lexical is not None else "dense"

    # -- searching -------------------------------------------------------------------------

    @overload
    def search(
        self,
        query: str,
        k: int = 10,
        where: str | None = None,
        mode: Mode | None = None,
        min_score: float | None = None,
        rerank: bool | None = None,
    ) -> list[Hit]: ...

    @overload
    def search(
        self,
        query: list[str],
        k: int = 10,
        where: str | None = None,
        mode: Mode | None = None,
        min_score: float | None = None,
        rerank: bool | None = None,
    ) -> list[list[Hit]]: ...

    def search(
        self,
        query: str | list[str],
        k: int = 10,
        where: str | None = None,
        mode: Mode | None = None,
        min_score: float | None = None,
        rerank: bool | None = None,
    ) -> list[Hit] | list[list[Hit]]:
        """Top-``k`` hits for one query (a list of :class:`Hit`) or a list of queries (one list
        each), best first. Deleted rows are never returned; ``k`` above the number of rows is
        the number of rows.

        Args:
            query: a query, or a list of them.
            k: hits per query.
            where: a SQL predicate over the metadata columns (evaluated by DuckDB), e.g.
                ``"year >= 2020 AND lang = 'en'"``: a pre-filter, the top-k among matching rows.
            mode: ``dense`` (the encoder), ``lexical`` (BM25) or ``hybrid`` (both, fused);
                None: :attr:`default_mode`.
            min_score: drop hits whose ``score`` is below this (in [0, 1]; the first stage's
                score, before a rerank).
            rerank: reorder the first stage's top :attr:`rerank_depth` documents by the
                searcher's cross-encoder (each hit's ``rerank_score``); None: when the searcher
                has one.

        Raises:
            BadInput: a query that is not a non-blank string, k < 1, a bad ``where``, an unknown
                mode or one the index cannot serve, a ``min_score`` outside [0, 1],
                ``rerank=True`` on a searcher without a reranker.
        """
        single = isinstance(query, str)
        queries = args.checked_queries(query)
        k = args.checked_k(k)
        min_score = args.checked_min_score(min_score)
        if not queries:
            return []
        hits = self._ranked(self._version, queries, k, where, mode, min_score, rerank)[0]
        return hits[0] if single else hits

    def query(
        self,
        query: str,
        k: int = 10,
        where: str | None = None,
        mode: Mode | None = None,
        min_score: float | None = None,
        rerank: bool | None = None,
    ) -> QueryResult:
        """One query's hits with its report (what ``flowsearch query`` prints)."""
        if not isinstance(query, str):
            raise BadInput(f"query must be a string, got {type(query).__name__}", param="query")
        return self.query_batch([query], k, where, mode, min_score, rerank)[0]

    def query_batch(
        self,
        queries: list[str],
        k: int = 10,
        where: str | None = None,
        mode: Mode | None = None,
        min_score: float | None = None,
        rerank: bool | None = None,
    ) -> list[QueryResult]:
        """Several queries' results, each with its report, from one version (one encoder call
        for all, and one cross-encoder call when reranked)."""
        version = self._version
        queries = args.checked_queries(queries)
        k, min_score = args.checked_k(k), args.checked_min_score(min_score)
        hits, lp, top = self._ranked(version, queries, k, where, mode, min_score, rerank)
        out = []
        for i, text in enumerate(queries):
            report = self._report(
                version, None if lp is None else float(lp[i]), None if top is None else top[i]
            )
            out.append(QueryResult(query=text, hits=hits[i], report=report))
        return out

    def _reranker(self, rerank: bool | None) -> Reranker | None:
        """The reranker a search asked for (``rerank``) uses, or None."""
        if rerank is None or rerank is False:
            return self.reranker if rerank is None else None
        if rerank is not True:
            raise BadInput(f"rerank must be true or false, got {rerank!r}", param="rerank")
        if self.reranker is None:
            raise BadInput("this searcher has no reranker",
                           "open it with {reranker='MODEL'} (a CrossEncoder id or directory)",
                           cli="pass --rerank MODEL",
                           http="start the server with --rerank MODEL, or leave out "
                                '"rerank"')  # fmt: skip
        return self.reranker

    def _ranked(
        self,
        version: Version,
        queries: list[str],
        k: int,
        where: str | None,
        mode: Mode | None,
        min_score: float | None,
        rerank: bool | None,
    ) -> tuple[list[list[Hit]], np.ndarray | None, np.ndarray | None]:
        """:meth:`_run`, ``min_score`` applied, then reranked when asked: the first stage finds
        ``max(k, rerank_depth)`` documents, the cross-encoder orders them, the top ``k`` stay."""
        reranker = self._reranker(rerank)
        depth = k if reranker is None else max(k, self.rerank_depth)
        hits, lp, top = self._run(version, queries, depth, where, mode)
        hits = above(hits, min_score)
        if reranker is not None:
            with stage("rerank"):
                hits = reranker.rerank(queries, hits, k)
        return hits, lp, top

    def _shards(self, version: Version) -> sh.Shards:
        """Who answers for ``version`` (locally one shard holding every segment; the Ray
        backend's actors)."""
        return self._backend.shards(version)

    def _run(
        self,
        version: Version,
        queries: list[str],
        k: int,
        where: str | None,
        mode: Mode | None,
        vectors: np.ndarray | None = None,
    ) -> tuple[list[list[Hit]], np.ndarray | None, np.ndarray | None]:
        """(hits, query log-densities or None, best dense score over the whole index or None).

        Scores (see :mod:`flowsearch.search.scores`): dense, the cosine's place between the
        corpus's background and 1; lexical, BM25 as a share of the query's upper bound,
        stretched so that a full match reads high; hybrid, their weighted mean
        (:func:`flowsearch.search.fusion.fuse`, each candidate scored by both sides). Asked of
        the version's shards with the version's statistics (:func:`flowsearch.search.shards.run`);
        with passages, deeper until the rows hold ``k`` documents."""
        if self._closed:
            raise BadInput(f"this Searcher of {self.root} was closed", "open it again")
        mode = args.checked_mode(version, mode)
        shards = self._shards(version)
        lp = None
        if vectors is None and mode != "lexical":  # embedded once, however deep the search goes
            with stage("encode"):
                vectors, lp = version.space.embed(queries)
        n_live = max(version.manifest.n_live, 1)
        k = min(k, n_live)
        depth = k  # rows searched: deeper until they hold k documents (k counts documents)
        top = None
        while True:
            ranked = sh.run(shards, version.manifest, self._statistics, queries, depth, where,
                            mode, vectors=vectors,
                            passages_per_document=version.passages_per_document,
                            hybrid_candidates=self.options.hybrid_candidates,
                            hybrid_weight=self.options.hybrid_weight)  # fmt: skip
            if ranked is None:
                return [[] for _ in queries], None, None
            top = ranked.top if top is None else top
            with stage("rows"):
                hits, done = document_hits(shards, version.manifest, ranked, k)
            if done or depth >= n_live:
                return with_marks(hits, queries), lp, top
            depth = min(depth * 4, n_live)

    def query_report(
        self, top_score: float | None, log_density: float | None = None
    ) -> QueryReport:
        """Judge a query from its best dense score over the whole index (see
        :func:`flowsearch.space.reports.query_report`)."""
        return self._report(self._version, log_density, top_score)

    @staticmethod
    def _report(
        version: Version, log_density: float | None, top_score: float | None
    ) -> QueryReport:
        from flowsearch.space.reports import query_report

        return query_report(top_score, version.reference(), log_density)

    def search_vectors(self, Z: np.ndarray, k: int = 10) -> list[list[Hit]]:
        """Top-``k`` hits for vectors already in the searched space (float32 (q, dim),
        L2-normalised; what :meth:`embed` returns).

        Raises:
            BadInput: another dimension, or values that are not finite.
        """
        version = self._version
        try:
            Z = np.atleast_2d(np.asarray(Z, dtype=np.float32))
        except (TypeError, ValueError) as exc:
            raise BadInput(f"vectors must be an array of numbers ({exc})", param="Z") from None
        if Z.ndim != 2 or Z.shape[1] != version.manifest.dim:
            raise BadInput(
                f"vectors have shape {Z.shape}, the index searches dim {version.manifest.dim}"
            )
        if not np.isfinite(Z).all():
            raise BadInput("vectors hold NaN or infinite values", "pass finite vectors")
        k = args.checked_k(k)
        queries = [""] * len(Z)  # the dense side reads vectors only
        return self._run(version, queries, k, None, "dense", vectors=Z)[0]

    def vectors(self) -> np.ndarray:
        """Every stored vector of the searched space, float32 (rows, dim), in global row
        order (deleted rows included). Not with ``engine="ray"`` (the shards hold them)."""
        return self._backend.vectors(self._version)
