r"""Choosing a vector index: ``auto``'s factory by segment size, and checking a user's factory.

Every index here is FAISS with inner product on L2-normalised vectors (cosine similarity), and
its ids are the segment's local rows, assigned in insertion order. ``"auto"`` chooses per
segment, by the :class:`~flowsearch.ann.policy.AnnPolicy` a write is given: exact ``Flat`` up to
``flat_max_rows`` rows (a segment's own size, so an index of many segments gets an approximate
index in each of its larger ones); above that its ``graph_factory`` (``HNSW32``, ``efSearch``
tuned by :func:`flowsearch.ann.tune.tune`); above ``graph_max_rows``, IVF-PQ with an exact
re-rank (:func:`large_factory`). Why these (measured): ``docs/SCALE.md``.

Example:
    >>> auto_factory(1_000)
    'Flat'
    >>> large_factory(1_000_000, 384)
    'IVF1024,PQ48,RFlat'
"""

from __future__ import annotations

import math
import re

import faiss

from flowsearch.ann.policy import DEFAULT, AnnPolicy
from flowsearch.errors import BadInput

__all__ = [
    "auto_factory",
    "check_factory",
    "ivf_factory",
    "large_factory",
    "mmap_flags",
    "new_index",
    "reason",
    "refined",
]


def reason(exc: BaseException) -> str:
    """FAISS's message without the C++ signature and source location."""
    lines = str(exc).strip().splitlines()
    return re.split(r"\.(?:cpp|h):\d+: ", lines[-1])[-1][:200] if lines else type(exc).__name__


def _make(dim: int, factory: str) -> faiss.Index:
    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise BadInput(
            f"FAISS rejects index factory {factory!r} ({reason(exc)}); try 'auto' or 'Flat'"
        ) from None


def auto_factory(n_rows: int, policy: AnnPolicy = DEFAULT, *, dim: int | None = None) -> str:
    """The factory string ``"auto"`` stands for at ``n_rows`` rows of ``dim`` dimensions.

    ``Flat`` (exact) up to ``policy.flat_max_rows``; above, ``policy.graph_factory``
    (``HNSW32``), whose ``efSearch`` is then tuned (:func:`flowsearch.ann.tune.tune`). Not IVF
    at that size: on a calibrated (whitened, isotropic) space an inverted file has no cluster
    structure to exploit (benchmarks/RESULTS.md). HNSW needs no training and adds rows one by
    one (streaming). Above ``policy.graph_max_rows`` the vectors no longer belong in RAM:
    :func:`large_factory`.

    Raises:
        ValueError: ``dim`` missing when the large factory is chosen.
    """
    if n_rows <= policy.flat_max_rows:
        return "Flat"
    if n_rows <= policy.graph_max_rows:
        return policy.graph_factory
    if dim is None:
        raise ValueError("auto_factory needs dim above graph_max_rows (for the PQ code size)")
    return large_factory(n_rows, dim)


def _pq_subquantizers(dim: int) -> int:
    """Sub-quantizers of the large factory's PQ: about one per 8 dimensions (48 at 384), the
    largest such count that divides ``dim``."""
    m = max(1, dim // 8)
    while dim % m:
        m -= 1
    return m


def large_factory(n_rows: int, dim: int) -> str:
    """``IVF{nlist},PQ{m},RFlat``: IVF-PQ whose candidates are re-ranked exactly.

    ``nlist`` is the power of two nearest ``sqrt(n)``, with at least 39 training rows per list;
    ``m`` is :func:`_pq_subquantizers` (codes of ``m`` bytes). ``RFlat`` keeps the
    full-precision vectors (4 * dim bytes per row) for the re-rank, in the same file: on disk,
    memory-mapped when searching (:func:`mmap_flags`). Bare PQ loses too much recall@10 on these
    spaces (benchmarks/RESULTS.md); the re-rank wins it back.
    """
    nlist = 2 ** round(math.log2(math.sqrt(max(n_rows, 1))))
    while nlist > 1 and nlist * 39 > n_rows:
        nlist //= 2
    return f"IVF{nlist},PQ{_pq_subquantizers(dim)},RFlat"


def refined(factory: str) -> bool:
    """Whether a factory string ends in an exact re-rank (``,RFlat`` or ``,Refine(...)``)."""
    return bool(re.search(r"(^|,)\s*(RFlat|Refine\()", factory))


def mmap_flags(factory: str) -> int:
    """The FAISS read flags that memory-map an index of ``factory`` (faiss 1.15).

    ``IO_FLAG_MMAP_IFC`` maps flat code arrays: ``Flat``, HNSW's vectors, and, for an IVF index
    with a re-rank, both the re-rank vectors and the inverted lists (opening one leaves the
    anonymous memory unchanged). A plain IVF index needs
    ``IO_FLAG_MMAP`` for its lists; combining both flags fails on IVF files.
    """
    ivf = "IVF" in factory.upper()
    flags = faiss.IO_FLAG_MMAP if ivf and not refined(factory) else faiss.IO_FLAG_MMAP_IFC
    return int(flags) | int(faiss.IO_FLAG_READ_ONLY)


def ivf_factory(n_rows: int) -> str:
    """``IVF{nlist},Flat`` with ``nlist`` the power of two nearest ``4 * sqrt(n)`` (FAISS's rule
    of thumb), keeping at least 39 training points per list (what ``auto`` chose before HNSW)."""
    nlist = 2 ** round(math.log2(4 * math.sqrt(max(n_rows, 1))))
    while nlist > 1 and nlist * 39 > n_rows:
        nlist //= 2
    return f"IVF{nlist},Flat"


def check_factory(factory: str, dim: int) -> None:
    """Fail early (before any encoding) on a factory string FAISS rejects at dimension ``dim``.

    Raises:
        BadInput: naming the factory and FAISS's reason.
    """
    if factory == "auto":
        return
    index = _make(dim, factory)
    if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        raise BadInput(
            f"index factory {factory!r}: IDMap is not supported (flowsearch assigns the ids); "
            "drop the 'IDMap,' prefix"
        )


def new_index(dim: int, factory: str, policy: AnnPolicy = DEFAULT) -> faiss.Index:
    """An empty inner-product FAISS index of ``dim`` dimensions from a resolved factory string;
    an HNSW graph is built with ``efConstruction`` = ``policy.ef_construction`` (kept in the
    index file, so later adds use it too).

    Raises:
        BadInput: a factory string FAISS rejects.
    """
    index = _make(dim, factory)
    graph = faiss.downcast_index(index)
    if isinstance(graph, faiss.IndexHNSW):
        graph.hnsw.efConstruction = policy.ef_construction
    return index
