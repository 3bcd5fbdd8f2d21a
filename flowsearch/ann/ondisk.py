r"""IVF lists filled in parts and merged on disk (the Ray engine builds big segments so).

Example:
    >>> mergeable(faiss.index_factory(8, "IVF2,Flat", faiss.METRIC_INNER_PRODUCT))
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np

__all__ = ["fill_part", "merge_on_disk", "mergeable"]

# faiss's bundled stubs lack the inverted-list classes' SWIG attributes.
_faiss: Any = faiss


def mergeable(index: faiss.Index) -> bool:
    """Whether parts of ``index`` filled separately can be merged on disk (:func:`merge_on_disk`):
    IVF-family indexes, with or without a pre-transform, but not with a re-rank (its full vectors
    are a flat array inside the index file, not inverted lists)."""
    return faiss.try_extract_index_ivf(index) is not None and not isinstance(
        faiss.downcast_index(index), faiss.IndexRefine
    )


def fill_part(trained: bytes | np.ndarray, vectors: np.ndarray, first_row: int, path: Path) -> int:
    """Add ``vectors`` (rows ``first_row`` on, as their ids) to a copy of the trained, empty index
    serialised in ``trained`` (``faiss.serialize_index``) and write it to ``path`` atomically (a
    retried task overwrites it whole). Returns the rows added."""
    index = faiss.deserialize_index(np.frombuffer(trained, dtype=np.uint8))
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index.add_with_ids(vectors, np.arange(first_row, first_row + len(vectors), dtype=np.int64))
    tmp = Path(path).with_name(f".{Path(path).name}.tmp-{os.getpid()}")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)
    return len(vectors)


def merge_on_disk(trained: faiss.Index, parts: list[Path], data_path: Path) -> faiss.Index:
    """``trained`` (a trained, empty IVF-family index) holding the rows of every part (files
    written by :func:`fill_part`, in row order), its inverted lists in one file, ``data_path``
    (beside the index file it is written to, under the name FAISS will look for: see
    :func:`flowsearch.ann.io.read_index`).

    Memory: the parts are memory-mapped one list at a time by FAISS's
    ``OnDiskInvertedLists.merge_from_multiple``; nothing holds the whole index.
    """
    ivf = faiss.extract_index_ivf(trained)
    if trained.ntotal:
        raise ValueError("merge_on_disk needs an empty index")
    opened = [faiss.read_index(str(p), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY) for p in parts]
    lists = _faiss.InvertedListsPtrVector()
    for part in opened:  # the parts stay referenced (``opened``) while FAISS reads their lists
        lists.push_back(faiss.extract_index_ivf(part).invlists)
    merged = _faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(data_path))
    total = merged.merge_from_multiple(lists.data(), lists.size(), False, False)
    del opened
    ivf.replace_invlists(merged, True)
    merged.this.disown()  # owned by the index now
    ivf.ntotal = trained.ntotal = total
    return trained
