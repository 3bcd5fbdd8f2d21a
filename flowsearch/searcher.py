r"""Answering queries against a published index: :class:`Searcher` and its :class:`Hit`.

``Searcher.open`` reads and verifies the manifest, then loads the encoder, the calibrator and the
FAISS index once. A batch of queries costs one encoder call and one FAISS call; hits are joined
to their shard rows by decoding only the row groups that hold them.

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

from flowsearch import index as fx
from flowsearch import store
from flowsearch.errors import FlowsearchError
from flowsearch.publish import recover
from flowsearch.space import project

__all__ = ["Hit", "Searcher", "open_encoder"]

LOG = logging.getLogger(__name__)

_IDENTITY = ("model", "revision", "pooling", "max_length", "dim")


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
            for :meth:`Searcher.search_vectors`); far below the corpus's mean log-density means
            an out-of-distribution query.
    """

    id: Any
    score: float
    rank: int
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    log_density: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields."""
        return asdict(self)


def open_encoder(info: dict[str, Any], encoder: Any = None) -> Any:
    """The encoder an index's manifest names (``info`` is its ``encoder`` record).

    Args:
        info: ``{"model", "revision", "pooling", "max_length", "dim", "source"}``.
        encoder: an already loaded Encoder to reuse; it must describe itself identically.

    Raises:
        FlowsearchError: a model, revision, pooling, max_length or dim other than the index's.
    """
    if encoder is None:
        from flowsearch.encoder import Encoder

        source, pooling = info.get("source"), info["pooling"]
        encoder = Encoder(source, pooling=pooling, max_length=info["max_length"])
    got = encoder.describe()
    for key in _IDENTITY:
        if key == "model" and info.get("source") and got.get(key) == info["source"]:
            continue  # the manifest's absolute path of a model it names by a relative one
        if got.get(key) != info.get(key):
            raise FlowsearchError(
                f"encoder {key} {got.get(key)!r} differs from the index's {info.get(key)!r}; "
                "query with the index's model and pooling, or rebuild with --overwrite"
            )
    return encoder


class Searcher:
    """Searches one index directory. Use :meth:`open`; safe to share between threads."""

    def __init__(
        self,
        root: Path,
        manifest: dict[str, Any],
        encoder: Any,
        calibrator: Any,
        index: Any,
        *,
        on_gpu: bool = False,
    ) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self.encoder = encoder
        self.calibrator = calibrator
        self.index = index
        self.space: str = manifest["calibration"]["space"]
        self.has_density = manifest.get("density") is not None
        self._reader = store.RowReader(self.root, manifest["shards"])
        self._encode_lock = threading.Lock()  # torch modules and fast tokenizers
        self._rows_lock = threading.Lock()  # the row-group cache
        self._gpu = on_gpu  # FAISS GPU indexes are not safe to search from several threads
        self._index_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        index_dir: str | os.PathLike[str],
        verify: bool = False,
        *,
        encoder: Any = None,
        gpu: bool = True,
    ) -> Searcher:
        """Open an index directory.

        Args:
            index_dir: the index to search.
            verify: check the sha256 of every file (by default only sizes, and the checksums of
                files up to 16 MiB).
            encoder: reuse a loaded Encoder (must match the manifest's model, pooling, ...).
            gpu: move the FAISS index to the GPU(s) when FAISS sees any.

        Raises:
            FlowsearchError: no index, a missing or corrupt file, or a mismatched encoder or
                calibrator.
        """
        from flowsearch.calibration import load_calibrator

        root = Path(index_dir).expanduser()
        recover(root)
        manifest = store.read_manifest(root)
        store.verify_files(root, manifest, checksums=verify)
        encoder = open_encoder(manifest["encoder"], encoder)
        calibrator = load_calibrator(root / "calibrator")
        record = manifest["calibration"]
        if calibrator.name != record["calibrator"] or calibrator.config != record["config"]:
            raise FlowsearchError(
                f"the calibrator in {root / 'calibrator'} ({calibrator.name}) is not the one the "
                f"manifest names ({record['calibrator']}); rebuild the index with --overwrite"
            )
        index = fx.read_index(root / "index.faiss", manifest["index"]["params"])
        if index.ntotal != manifest["rows"] or index.d != manifest["dim"]:
            raise FlowsearchError(
                f"{root / 'index.faiss'} holds {index.ntotal} rows of dim {index.d}, the manifest "
                f"says {manifest['rows']} of dim {manifest['dim']}; rebuild with --overwrite"
            )
        on_gpu = gpu and fx.num_gpus() > 0
        if on_gpu:
            index = fx.to_gpu(index)
        return cls(root, manifest, encoder, calibrator, index, on_gpu=on_gpu)

    def close(self) -> None:
        """Release the index's shard files (an open Searcher keeps them, even once replaced)."""
        with self._rows_lock:
            self._reader.close()

    def __len__(self) -> int:
        return int(self.manifest["rows"])

    def __repr__(self) -> str:
        return f"Searcher({str(self.root)!r}, rows={len(self)}, space={self.space!r})"

    def embed(self, queries: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """Queries -> (float32 (q, dim) in the searched space, float64 (q,) log-density or None)."""
        with self._encode_lock:
            U = self.encoder.encode(queries, progress=False)
            return project(self.calibrator, self.space, U, want_density=self.has_density)

    @overload
    def search(self, query: str, k: int = 10) -> list[Hit]: ...

    @overload
    def search(self, query: list[str], k: int = 10) -> list[list[Hit]]: ...

    def search(self, query: str | list[str], k: int = 10) -> list[Hit] | list[list[Hit]]:
        """Top-``k`` hits for one query (a list of :class:`Hit`) or a list of queries (one list
        each), best first.

        Raises:
            FlowsearchError: a query that is not a string, or k < 1.
        """
        single = isinstance(query, str)
        queries: list[str] = [query] if isinstance(query, str) else list(query)
        for q in queries:
            if not isinstance(q, str):
                raise FlowsearchError(f"queries must be strings, got {type(q).__name__}")
        if not queries:
            return []
        Z, lp = self.embed(queries)
        hits = self._search(Z, k, lp)
        return hits[0] if single else hits

    def search_vectors(self, Z: np.ndarray, k: int = 10) -> list[list[Hit]]:
        """Top-``k`` hits for vectors already in the searched space.

        Args:
            Z: float32 (q, dim), L2-normalised, in the index's searched space (what
                :meth:`embed` returns; the ``vector`` column of the shards).
            k: hits per query.
        """
        Z = np.atleast_2d(np.asarray(Z, dtype=np.float32))
        if Z.shape[1] != self.manifest["dim"]:
            raise FlowsearchError(
                f"vectors have dim {Z.shape[1]}, the index searches dim {self.manifest['dim']}"
            )
        return self._search(Z, k, None)

    def _search(self, Z: np.ndarray, k: int, lp: np.ndarray | None) -> list[list[Hit]]:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise FlowsearchError(f"k must be a positive integer, got {k!r}")
        k = int(k)
        if self._gpu:
            with self._index_lock:
                scores, rows = fx.search(self.index, Z, k)
        else:
            scores, rows = fx.search(self.index, Z, k)
        valid = rows[rows >= 0]
        with self._rows_lock:
            fetched = self._reader.rows(np.unique(valid)) if valid.size else []
        by_row = dict(zip(np.unique(valid).tolist(), fetched, strict=True))
        out = []
        for qi in range(len(Z)):
            density = None if lp is None else float(lp[qi])
            hits: list[Hit] = []
            for score, row in zip(scores[qi], rows[qi], strict=True):
                if row < 0:
                    continue
                rec = by_row[int(row)]
                hits.append(
                    Hit(
                        id=rec["id"],
                        score=float(score),
                        rank=len(hits) + 1,
                        text=rec["text"],
                        metadata=rec["metadata"],
                        log_density=density,
                    )
                )
            out.append(hits)
        return out

    def vectors(self) -> np.ndarray:
        """All stored vectors of the searched space, float32 (rows, dim), in row order."""
        with self._rows_lock:
            return np.asarray(self._reader.column("vector"), dtype=np.float32)
