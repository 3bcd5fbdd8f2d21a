r"""One segment opened for searching: its rows, its vector index and its postings.

A :class:`SegmentReader` opens every file of its segment when it is made and holds the handles
(Parquet memory maps, the FAISS index in RAM or memory-mapped, the postings' arrays), so it keeps
answering after a later write's cleanup removed the files: that is how a pinned reader keeps its
version (see :mod:`flowsearch.storage.writer`). Segments are immutable, so a reader is shared by
every version that contains its segment: a searcher's ``refresh()`` opens only new segments.

Example:
    >>> seg = SegmentReader.open(Path("idx"), manifest.segments[0], dim=384)  # doctest: +SKIP
    >>> seg.reader.records([0])[0]["id"]  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from flowsearch.ann import io as ann_io
from flowsearch.ann.prefilter import filtered_search, prepare_index
from flowsearch.errors import IndexDamaged
from flowsearch.storage import deletions
from flowsearch.storage.manifest import SegmentRecord
from flowsearch.storage.rows import RowCache, RowReader

if TYPE_CHECKING:
    from flowsearch.lexical.postings import Postings

__all__ = ["SegmentReader", "read_deleted"]

LOG = logging.getLogger(__name__)


class SegmentReader:
    """A segment's files, open (see the module docstring).

    Attributes:
        record: the segment's record as first opened (its deletion file varies by version).
        folder: its directory.
        reader: its row reader.
        ann: its FAISS index (ids are local rows).
        postings: its BM25 postings, or None.
    """

    def __init__(
        self,
        record: SegmentRecord,
        folder: Path,
        rows: RowReader,
        ann: Any,
        postings: Postings | None,
    ) -> None:
        self.record = record
        self.folder = folder
        self.reader = rows
        self.ann = ann
        self.postings = postings
        self._table: pa.Table | None = None
        self._passages: tuple[np.ndarray, np.ndarray] | None = None
        self._passages_read = False

    def passages(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Each local row's passage number and its document's passage count (int32 arrays,
        read once), or None when every row is a whole document."""
        if not self._passages_read:
            r = self.reader
            if r.passage_columns:
                table = r.table(list(r.passage_columns[:2]))
                number, count = (np.asarray(table.column(i).to_numpy(), np.int32) for i in (0, 1))
                if np.any(count > 1):
                    self._passages = (number, count)
            self._passages_read = True
        return self._passages

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """Searched vectors at local ``rows``, float32 (len(rows), dim): read back from the
        vector index when it can (exact for Flat, HNSW and IVF-Flat; decoded codes for PQ),
        else from the rows' Parquet row groups (a memory-mapped IVF without a direct map)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return np.zeros((0, self.ann.d), dtype=np.float32)
        try:
            return np.asarray(self.ann.reconstruct_batch(rows), dtype=np.float32)
        except (RuntimeError, AttributeError):
            return self.reader.vectors_at(rows)

    @classmethod
    def open(
        cls,
        index_dir: Path,
        record: SegmentRecord,
        *,
        dim: int,
        cache: RowCache | None = None,
        mmap: bool = False,
        gpu: bool = False,
    ) -> SegmentReader:
        """Open a segment's files.

        Raises:
            FileNotFoundError: a file vanished (its version was removed meanwhile: retry).
            IndexDamaged: a file that does not match the record.
        """
        folder = Path(index_dir) / record.dir
        rows = RowReader(folder, record.parts, cache)
        try:
            ann = ann_io.read_index(
                folder / record.ann.path,
                record.ann.params,
                mmap=record.ann.factory if mmap and not gpu else None,
                on_disk=record.ann.data is not None,
            )
            if ann.ntotal != record.n_rows or ann.d != dim:
                raise IndexDamaged(
                    f"{folder / record.ann.path} holds {ann.ntotal} rows of dim {ann.d}, the "
                    f"manifest says {record.n_rows} of dim {dim}",
                    "the index is damaged; rebuild it",
                )
            if gpu:
                ann = ann_io.to_gpu(ann)
            elif not mmap:  # a direct map would read every list's ids into RAM
                prepare_index(ann)  # IVF: a direct map, so selective filters are exact
            postings = None
            if record.postings is not None:
                from flowsearch.lexical.postings import Postings

                postings = Postings.load(folder / record.postings)
        except BaseException:
            rows.close()
            raise
        return cls(record, folder, rows, ann, postings)

    @property
    def n_rows(self) -> int:
        return self.record.n_rows

    def search(
        self,
        queries: np.ndarray,
        k: int,
        rows: np.ndarray | None,
        deleted: np.ndarray | None,
        knob: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k local rows among ``rows`` (None: all) minus ``deleted`` (bool mask or None):
        ``(scores float32 (q, k'), local rows int64 (q, k'))``, -1 where none. ``knob``: this
        search's ``efSearch`` / ``nprobe`` (None: the segment's tuned one)."""
        if rows is None and deleted is None:
            return ann_io.search(self.ann, queries, k, knob)
        return filtered_search(self.ann, queries, k, rows, excluded=deleted, knob=knob)

    def filter_table(self) -> pa.Table:
        """The columns a ``where`` filter reads (id, text, metadata, the passage columns when
        the segment has them), in local row order, read through the open part files."""
        if self._table is None:
            r = self.reader
            self._table = r.table(["id", "text", *r.metadata_columns, *r.passage_columns])
        return self._table

    def close(self) -> None:
        """Release the files."""
        self.reader.close()
        self._table = None
        with contextlib.suppress(Exception):
            self.ann = None


def read_deleted(folder: Path, record: SegmentRecord) -> np.ndarray | None:
    """A version's deleted rows of a segment as a bool mask (None when none are)."""
    if record.deletions is None or record.n_deleted == 0:
        return None
    mask = deletions.read(folder / record.deletions, record.n_rows)
    return mask if mask.any() else None
