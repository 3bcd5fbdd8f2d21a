r"""Reading, writing and searching vector indexes, on the CPU or the GPU.

Example:
    >>> index = faiss.IndexFlatIP(2)
    >>> index.add(np.eye(2, dtype=np.float32))
    >>> search(index, np.array([[1.0, 0.5]], np.float32), 5)[1].tolist()
    [[0, 1]]
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from flowsearch.ann.factory import mmap_flags, reason
from flowsearch.errors import IndexDamaged

__all__ = [
    "as_f32",
    "knob_params",
    "num_gpus",
    "read_index",
    "search",
    "set_params",
    "single_threaded",
    "to_gpu",
    "write_index",
]

LOG = logging.getLogger(__name__)

# faiss's bundled stubs lack the inverted-list classes' SWIG attributes.
_faiss: Any = faiss


def as_f32(x: np.ndarray) -> np.ndarray:
    """``x`` as FAISS reads vectors: a C-contiguous float32 (n, d) array.

    Raises:
        ValueError: ``x`` is not 2-D.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {x.shape}")
    return x


def set_params(index: faiss.Index, params: str) -> None:
    """Apply a search-time parameter string such as ``"nprobe=16"`` (no-op when empty)."""
    if params:
        faiss.ParameterSpace().set_index_parameters(index, params)  # type: ignore[arg-type]


def single_threaded(fn: Callable[[], Any]) -> Any:
    """Run ``fn()`` with FAISS's OpenMP limited to one thread (a per-thread setting in OpenMP,
    so other threads' searches keep theirs), then restore the previous limit."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return fn()
    finally:
        faiss.omp_set_num_threads(before)


def search(
    index: faiss.Index, queries: np.ndarray, k: int, knob: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by inner product: ``(scores float32 (q, k), rows int64 (q, k))``, -1 for no hit.
    ``knob``: this search's ``efSearch`` (HNSW) or ``nprobe`` (IVF) instead of the index's own
    (:func:`knob_params`); the index itself is left as it is (readers share it)."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    k = max(1, min(int(k), max(index.ntotal, 1)))
    params = knob_params(index, knob)
    if params is None:
        return index.search(queries, k)
    return index.search(queries, k, params=params)


# Per index (held weakly: a closed segment's index goes with it), its kind ("hnsw", "ivf" or
# "") and the HNSW search parameters made so far, by efSearch: a downcast and a SWIG
# constructor on every search add up over a query's segments.
_KNOBS: weakref.WeakKeyDictionary[Any, tuple[str, dict[int, Any]]] = weakref.WeakKeyDictionary()
_KNOBS_LOCK = threading.Lock()


def knob_params(index: faiss.Index, knob: int | None) -> Any:
    """FAISS search parameters setting an HNSW index's ``efSearch`` or an IVF index's
    ``nprobe`` to ``knob`` for one search; None when ``knob`` is None or the index has no such
    knob (exact, or with a re-rank). HNSW's are made once per index and value and shared
    (FAISS only reads them); IVF's afresh (they copy the index's ``max_codes``)."""
    if knob is None:
        return None
    entry = _KNOBS.get(index)
    if entry is None:
        inner = faiss.downcast_index(index)
        kind = ("hnsw" if isinstance(inner, faiss.IndexHNSW)
                else "ivf" if isinstance(inner, faiss.IndexIVF) else "")  # fmt: skip
        with _KNOBS_LOCK:
            entry = _KNOBS.setdefault(index, (kind, {}))
    kind, made = entry
    if kind == "hnsw":
        params = made.get(int(knob))
        if params is None:
            with _KNOBS_LOCK:
                params = made.setdefault(int(knob), _faiss.SearchParametersHNSW(efSearch=int(knob)))
        return params
    if kind == "ivf":
        params = _faiss.SearchParametersIVF(nprobe=int(knob))
        params.max_codes = _faiss.downcast_index(index).max_codes
        return params
    return None


def num_gpus() -> int:
    """GPUs FAISS can use (0 with a CPU-only build)."""
    return int(faiss.get_num_gpus())


def to_gpu(index: faiss.Index) -> faiss.Index:
    """The index on all GPUs when FAISS sees any (a faiss-gpu build); otherwise unchanged."""
    if num_gpus() > 0:
        LOG.info("moving index to %d GPU(s)", num_gpus())
        return faiss.index_cpu_to_all_gpus(index)
    return index


def write_index(index: faiss.Index, path: str | Path) -> None:
    """Save a CPU index (keep the CPU original when searching on a GPU copy)."""
    faiss.write_index(index, str(path))


def read_index(
    path: str | Path, params: str = "", *, mmap: str | None = None, on_disk: bool = False
) -> faiss.Index:
    """Load an index saved by :func:`write_index` and apply its search parameters.

    An IVF index whose inverted lists were merged on disk (``on_disk``:
    :func:`flowsearch.ann.ondisk.merge_on_disk`, the lists' file beside ``path``) finds that
    file in ``path``'s directory wherever the directory has moved
    (``IO_FLAG_ONDISK_SAME_DIR``), read-only: its lists stay on disk when ``mmap`` is given,
    and are copied into RAM otherwise.

    Args:
        path: the index file.
        params: search parameters (:func:`set_params`).
        mmap: the index's factory string to memory-map it (read-only, :func:`mmap_flags`);
            None reads it into RAM.
        on_disk: the index's IVF lists are in a file beside it.

    Raises:
        FileNotFoundError: the file vanished (its version was removed meanwhile).
        IndexDamaged: not a FAISS index.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(path)
    try:
        if on_disk:
            flags = faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY
            index = faiss.read_index(str(path), flags)
            if mmap is None:
                _lists_to_ram(index)
        elif mmap is None:
            index = faiss.read_index(str(path))
        else:
            index = faiss.read_index(str(path), mmap_flags(mmap))
    except RuntimeError as exc:
        raise IndexDamaged(
            f"cannot read FAISS index {path} ({reason(exc)})", "rebuild the index"
        ) from None
    set_params(index, params)
    return index


def _lists_to_ram(index: faiss.Index) -> None:
    """Replace an IVF index's on-disk inverted lists by a copy in RAM."""
    ivf = faiss.extract_index_ivf(index)
    disk: Any = ivf.invlists
    ram = _faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
    for number in range(ivf.nlist):
        size = disk.list_size(number)
        if size:
            ram.add_entries(number, size, disk.get_ids(number), disk.get_codes(number))
    ivf.replace_invlists(ram, True)
    ram.this.disown()
