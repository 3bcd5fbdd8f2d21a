r"""One version of an index: described (:func:`index_info`) or opened for searching (:func:`load`).

A :class:`Version` is everything a search reads, pinned together: the manifest, the searched
space (encoder and calibrator), the FAISS index (in RAM, memory-mapped, or on the GPU), the
shard reader, the tombstones, the BM25 index and, made on first use, the metadata filter.
:func:`load` opens the files one manifest names and checks them against it;
:class:`~flowsearch.search.searcher.Searcher` pins one and swaps it on refresh.

Example:
    >>> index_info("flowsearch_index").manifest.rows  # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.ann import faiss_index as fx
from flowsearch.errors import FlowsearchError
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage import directory as directory
from flowsearch.storage import manifest as mf
from flowsearch.storage import rows as store

__all__ = ["IndexInfo", "Version", "index_info", "load", "sizes"]


@dataclass(frozen=True)
class IndexInfo:
    """What an index version holds (its manifest), its size on disk and what was verified."""

    path: str
    manifest: mf.Manifest
    bytes: dict[str, int]
    verified: directory.Verification

    def to_dict(self) -> dict[str, Any]:
        """The ``info --json`` document: the manifest's fields, ``path``, ``bytes``,
        ``verified``."""
        return {
            "path": self.path,
            **mf.to_dict(self.manifest),
            "live_rows": self.manifest.live_rows,
            "bytes": self.bytes,
            "verified": self.verified.to_dict(),
        }


def sizes(index_dir: Path, manifest: mf.Manifest) -> dict[str, int]:
    root = manifest.path(index_dir)
    sizes = {"total": directory.size_on_disk(root) if manifest.root != "." else 0}
    for part in (mf.SHARDS_DIR, mf.CALIBRATOR_DIR, mf.FAISS_FILE, mf.LEXICAL_DIR):
        path = root / part
        if path.exists():
            sizes[part] = directory.size_on_disk(path)
    if manifest.root == ".":
        sizes["total"] = sum(v for k, v in sizes.items() if k != "total")
    return sizes


def index_info(index_dir: str | os.PathLike[str], verify: bool = False) -> IndexInfo:
    """Describe the current version of an index without loading its model.

    Args:
        index_dir: the index directory.
        verify: hash every file (by default sizes always, hashes of files up to 16 MiB).

    Raises:
        FlowsearchError: no index, or a file that is missing, extra or differs.
    """
    root = Path(index_dir).expanduser()

    def describe(manifest: mf.Manifest) -> IndexInfo:
        checked = directory.verify(root, manifest, checksums=verify)
        return IndexInfo(str(root.resolve()), manifest, sizes(root, manifest), checked)

    return directory.open_version(root, describe)


@dataclass
class Version:
    """Everything a search reads, for one pinned version."""

    root: Path
    manifest: mf.Manifest
    space: SearchSpace
    faiss_index: Any
    reader: store.RowReader
    verified: directory.Verification
    deleted: np.ndarray | None  # bool (rows,), True for a deleted row; None when none are
    lexical: Any  # LexicalIndex or None
    _filter: Any = None
    _filter_lock: threading.Lock = field(default_factory=threading.Lock)

    def metadata_filter(self) -> Any:
        """The version's :class:`~flowsearch.search.filters.MetadataFilter`, made on first use (it
        loads the id, text and metadata columns)."""
        with self._filter_lock:
            if self._filter is None:
                from flowsearch.search.filters import MetadataFilter

                paths = [self.manifest.path(self.root, s.path) for s in self.manifest.shards]
                self._filter = MetadataFilter(paths, self.manifest.columns.metadata)
            return self._filter

    def matching(self, where: str | None) -> np.ndarray | None:
        """Sorted rows a ``where`` predicate matches; None when there is no predicate."""
        return self.metadata_filter().rows(where) if where and where.strip() else None

    def row_mask(self, rows: np.ndarray | None) -> np.ndarray | None:
        """``rows`` as a bool mask for the BM25 side (None: every row). Deleted rows need no
        mask there: the BM25 index drops them itself on every delete and upsert."""
        if rows is None:
            return None
        mask = np.zeros(self.manifest.rows, dtype=bool)
        mask[rows] = True
        return mask


def _read_faiss(path: Path, manifest: mf.Manifest, mmap: bool) -> Any:
    """The version's FAISS index, read into RAM or memory-mapped (``mmap``, see
    :func:`flowsearch.ann.faiss_index.mmap_flags`)."""
    return fx.read_index(path, manifest.faiss.params, mmap=manifest.faiss.factory if mmap else None)


def load(
    root: Path,
    manifest: mf.Manifest,
    verify: bool,
    encoder: Any,
    model: Any,
    on_gpu: bool,
    mmap: bool = False,
) -> Version:
    """Open one version's files (raises FileNotFoundError if it vanished meanwhile)."""
    checked = directory.verify(root, manifest, checksums=verify)
    space = SearchSpace.open(root, manifest, encoder, model=model)
    path = manifest.path(root, mf.FAISS_FILE)
    if not path.is_file():
        raise FileNotFoundError(path)
    faiss_index = _read_faiss(path, manifest, mmap and not on_gpu)
    if faiss_index.ntotal != manifest.rows or faiss_index.d != manifest.dim:
        raise FlowsearchError(
            f"{path} holds {faiss_index.ntotal} rows of dim {faiss_index.d}, the manifest says "
            f"{manifest.rows} of dim {manifest.dim}; the index is damaged, rebuild it"
        )
    if on_gpu:
        faiss_index = fx.to_gpu(faiss_index)
    elif not mmap:  # a direct map would read every list's ids into RAM (8 bytes per row)
        from flowsearch.ann.prefilter import prepare_index

        prepare_index(faiss_index)  # IVF: a direct map, so selective filters are exact
    deleted = None
    if manifest.tombstones is not None:
        mask = store.read_tombstones(manifest.path(root, manifest.tombstones), manifest.rows)
        deleted = mask if mask.any() else None
    lexical = None
    if manifest.lexical is not None:
        from flowsearch.lexical.legacy import LexicalIndex

        folder = manifest.path(root, manifest.lexical.path)
        if not folder.is_dir():
            raise FileNotFoundError(folder)
        lexical = LexicalIndex.load(folder)
        if lexical.n_rows != manifest.rows:
            raise FlowsearchError(
                f"the lexical index in {folder} has {lexical.n_rows} rows, the manifest "
                f"{manifest.rows}; the index is damaged, rebuild it"
            )
    reader = store.RowReader(manifest.path(root), manifest.shards)
    return Version(root, manifest, space, faiss_index, reader, checked, deleted, lexical)
