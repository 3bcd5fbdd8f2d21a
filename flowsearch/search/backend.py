r"""Who holds a searcher's segments: the :class:`ShardBackend` protocol and its local kind.

A :class:`~flowsearch.search.searcher.Searcher` pins a version and answers through its shards
(:mod:`flowsearch.search.shards`); a backend opens those shards, moves them to a newer version
and releases them. :class:`LocalBackend` holds every segment in this process as one shard;
:class:`~flowsearch.search.ray_shards.RayBackend` spreads them over Ray actors. The searcher
asks either the same questions, so it has no branch of its own per engine.

Example:
    >>> backend, version = LocalBackend.open("idx")  # doctest: +SKIP
    >>> len(backend.shards(version))  # doctest: +SKIP
    1
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from flowsearch.ann import io as ann_io
from flowsearch.encode.protocol import TextEncoder
from flowsearch.search import shards as sh
from flowsearch.search.dense import SegmentHelpers, segment_threads
from flowsearch.search.options import SearchOptions
from flowsearch.search.version import Opened, Version, load, open_current
from flowsearch.storage.rows import RowCache

if TYPE_CHECKING:
    from flowsearch.search.filters import MetadataFilter

__all__ = ["LocalBackend", "ShardBackend"]


class ShardBackend(Protocol):
    """What a searcher needs of whoever holds its segments (local or Ray)."""

    def shards(self, version: Version) -> sh.Shards:
        """The shards answering for ``version`` (the pinned one, or one a query still runs on)."""
        ...

    def refresh(self, encoder: TextEncoder | None) -> Version:
        """Open the index's current version (reusing ``encoder`` and what is already open)
        and move every shard to it before returning it."""
        ...

    def vectors(self, version: Version) -> np.ndarray:
        """Every stored searched vector of ``version``, float32 (rows, dim), in global row
        order.

        Raises:
            BadInput: the backend does not hold the vectors in this process.
        """
        ...

    def describe(self) -> str:
        """How it answers, for the searcher's ``repr`` (empty for the local one)."""
        ...

    def close(self) -> None:
        """Release every file, thread and worker it holds."""
        ...


class LocalBackend:
    """Every segment of a version in this process, answering as one shard.

    Owns what the searcher's queries share: the opened files (:class:`Opened`, with its row
    cache), the filter database (made on first use), the helper threads of one query's
    segments (:class:`~flowsearch.search.dense.SegmentHelpers`) and, on a GPU, the lock of
    its indexes.
    """

    def __init__(
        self, root: Path, options: SearchOptions, *, gpu: bool = False, mmap: bool = False
    ) -> None:
        self.root = root
        self.options = options
        self.gpu, self.mmap = gpu, mmap
        self.opened = Opened(
            cache=RowCache(options.row_cache_bytes),
            lexical_cache_bytes=options.lexical_cache_bytes,
        )
        self.helpers = SegmentHelpers(segment_threads(options.segment_threads))
        #: held while a GPU's indexes are searched (FAISS GPU indexes are not thread-safe)
        self.gpu_lock = threading.Lock()
        self._filters: MetadataFilter | None = None
        self._filters_lock = threading.Lock()
        self._local: tuple[Version, sh.InProcess] | None = None

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
        options: SearchOptions | None = None,
    ) -> tuple[LocalBackend, Version]:
        """Open the index's current version here (see :meth:`Searcher.open`)."""
        root = Path(index_dir).expanduser()
        backend = cls(root, options or SearchOptions(), gpu=gpu and ann_io.num_gpus() > 0,
                      mmap=mmap)  # fmt: skip
        version = open_current(
            root,
            lambda m: load(
                root,
                m,
                backend.opened,
                verify_all=verify,
                encoder=encoder,
                model=model,
                gpu=backend.gpu,
                mmap=mmap,
            ),  # fmt: skip
        )
        return backend, version

    def filter_database(self) -> MetadataFilter:
        """The filter database ``where`` runs in (made on first use)."""
        with self._filters_lock:
            if self._filters is None:
                from flowsearch.search.filters import MetadataFilter

                self._filters = MetadataFilter(
                    timeout=self.options.filter_timeout,
                    memory_limit=self.options.filter_memory_bytes,
                )
            return self._filters

    def shards(self, version: Version) -> sh.Shards:
        local = self._local
        if local is None or local[0] is not version:
            one = sh.SegmentSet(version, filters=self.filter_database,
                                gpu_lock=self.gpu_lock if self.gpu else None,
                                helpers=self.helpers)  # fmt: skip
            local = self._local = (version, sh.InProcess([one]))
        return local[1]

    def refresh(self, encoder: TextEncoder | None) -> Version:
        version = open_current(
            self.root,
            lambda m: load(
                self.root, m, self.opened, encoder=encoder, gpu=self.gpu, mmap=self.mmap
            ),  # fmt: skip
        )
        self.opened.keep_only(version.manifest)  # dropped readers close when unused
        return version

    def vectors(self, version: Version) -> np.ndarray:
        parts = [seg.reader.vectors("vector") for seg in version.segments]
        parts = [p for p in parts if len(p)]
        if not parts:
            return np.zeros((0, version.manifest.dim), dtype=np.float32)
        return np.concatenate(parts).astype(np.float32, copy=False)

    def describe(self) -> str:
        return ""

    def close(self) -> None:
        self.helpers.close()
        with self.opened.lock:
            for reader in self.opened.segments.values():
                reader.close()
            self.opened.segments.clear()
        with self._filters_lock:
            if self._filters is not None:
                self._filters.close()
                self._filters = None
        self._local = None
