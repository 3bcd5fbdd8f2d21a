r"""Searching only the rows a filter kept: a FAISS pre-filter that returns the true top-k.

:func:`filtered_search` takes the rows a ``where`` predicate matched
(:meth:`flowsearch.search.filters.MetadataFilter.rows`) and the deleted rows to skip, and searches
only the rest: up to :data:`EXACT_BELOW` searchable rows by brute force over their own vectors
(exact for any index), more through FAISS with an ID-selector bitmap (:func:`search_params`), so the
answer is the top-k among matching rows, never a post-filtered top-k. An approximate index that
found fewer than k of them is searched again exhaustively. When few rows are removed (deleted
rows, a filter keeping most), an unfiltered search a little deeper than k finds the top-k among
the rest for almost every query, at FAISS's fast path (a selector disables its matrix products);
the few it leaves short take the selector's way (:data:`POSTFILTER_MAX_REMOVED_SHARE`).

Example:
    >>> import faiss
    >>> index = faiss.IndexFlatIP(2)
    >>> index.add(np.eye(2, dtype=np.float32))
    >>> filtered_search(index, np.ones((1, 2), np.float32), 2, np.array([1]))[1].tolist()
    [[1, -1]]
"""

from __future__ import annotations

import logging
import math
from typing import Any

import faiss
import numpy as np

from flowsearch.ann import io as ann_io

__all__ = [
    "EXACT_BELOW",
    "POSTFILTER_MARGIN",
    "POSTFILTER_MAX_REMOVED_SHARE",
    "allowed_rows",
    "filtered_search",
    "prepare_index",
    "search_params",
]

#: A filter or deletions leaving at most this many rows of a segment searchable are searched by
#: brute force over those rows' vectors (faster there than FAISS's ID selector).
EXACT_BELOW = 16_384
#: A filter or deletions removing at most this share of a segment's rows are searched without
#: FAISS's ID selector (which costs FAISS its matrix-product path): an unfiltered top-(k / kept
#: share + :data:`POSTFILTER_MARGIN`), the removed rows dropped, and only the queries left short
#: of k searched again through the selector (exact for Flat).
POSTFILTER_MAX_REMOVED_SHARE = 0.25
#: Extra candidates per query on that path (removed rows among a query's nearest).
POSTFILTER_MARGIN = 16

LOG = logging.getLogger(__name__)

# faiss's bundled stubs lack the search-parameter and selector classes' keyword constructors.
_faiss: Any = faiss


def _keep_mask(
    ntotal: int, rows: np.ndarray | None, excluded: np.ndarray | None
) -> np.ndarray | None:
    """bool (ntotal,): searchable rows; None when nothing is filtered or excluded."""
    if excluded is not None:
        excluded = np.asarray(excluded)
        if excluded.dtype == np.bool_:
            if excluded.shape != (ntotal,):
                raise ValueError(f"excluded mask has shape {excluded.shape}, index has {ntotal}")
            if not excluded.any():
                excluded = None
        elif excluded.size == 0:
            excluded = None
    if rows is not None and len(rows) == ntotal:
        rows = None  # sorted unique rows covering the index: no filter
    if rows is None and excluded is None:
        return None
    dead = excluded if excluded is not None and excluded.dtype == np.bool_ else None
    if rows is None:
        if dead is not None:  # deletions alone, every query: one pass, no boolean indexing
            alive: np.ndarray = np.logical_not(dead)
            return alive
        keep = np.ones(ntotal, dtype=bool)
    else:
        keep = np.zeros(ntotal, dtype=bool)
        keep[np.asarray(rows, dtype=np.int64)] = True
    if dead is not None:
        np.logical_and(keep, np.logical_not(dead), out=keep)
    elif excluded is not None:
        keep[excluded] = False  # row numbers
    return keep


def allowed_rows(
    ntotal: int, rows: np.ndarray | None = None, excluded: np.ndarray | None = None
) -> np.ndarray | None:
    """The searchable rows: ``rows`` (all when None) minus ``excluded``.

    Args:
        ntotal: rows in the index.
        rows: int64 (m,) sorted unique row numbers a filter matched, or None for every row.
        excluded: deleted rows, as a bool mask (ntotal,) or int row numbers; None for none.

    Returns:
        Sorted unique int64 rows, or None when nothing is filtered or excluded (search all).
    """
    keep = _keep_mask(ntotal, rows, excluded)
    return None if keep is None else np.flatnonzero(keep).astype(np.int64)


def prepare_index(index: faiss.Index) -> faiss.Index:
    """Let an IVF index reconstruct rows (a direct map, 8 bytes per row), in place.

    Then a selective filter on it is searched exactly by brute force over the matching rows
    instead of through the probed lists. Call once when the index is opened, before searching
    from several threads (it modifies the index). Other indexes are returned unchanged.
    """
    if _refine(index) is not None:  # it reconstructs from its re-rank vectors
        return index
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and ivf.direct_map.no():
        ivf.make_direct_map()
    return index


def _refine(index: faiss.Index) -> Any:
    """The index as an ``IndexRefine`` (an approximate index plus an exact re-rank), or None."""
    refine = faiss.downcast_index(index)
    return refine if isinstance(refine, faiss.IndexRefine) else None


def search_params(index: faiss.Index, rows: np.ndarray) -> Any:
    """FAISS search parameters selecting ``rows`` (a bitmap), keeping the index's own knobs.

    An IVF index keeps its ``nprobe``/``max_codes``, an HNSW index its ``efSearch``, an index
    with an exact re-rank (``IndexRefine``) its ``k_factor`` and its base index's knobs. The
    bitmap (``ntotal / 8`` bytes) measured faster than ``IDSelectorBatch`` at every selectivity.

    Args:
        index: the FAISS index to search.
        rows: int64 row numbers to search, or a bool mask of shape (ntotal,).
    """
    rows = np.asarray(rows)
    if rows.dtype == np.bool_ and rows.shape == (index.ntotal,):
        bitmap = rows
    else:
        bitmap = np.zeros(index.ntotal, dtype=bool)
        bitmap[rows] = True
    params: Any
    refine = _refine(index)
    if refine is not None:  # the selector goes to the base index; the re-rank sees its picks
        base = search_params(faiss.downcast_index(refine.base_index), bitmap)
        params = _faiss.IndexRefineSearchParameters(
            k_factor=refine.k_factor, base_index_params=base
        )
        params.referenced_objects = [base]
        return params
    packed = np.packbits(bitmap, bitorder="little")
    selector = _faiss.IDSelectorBitmap(packed)
    ivf = faiss.try_extract_index_ivf(index)
    hnsw = faiss.downcast_index(index)
    if ivf is not None:
        params = _faiss.SearchParametersIVF(sel=selector, nprobe=ivf.nprobe)
        params.max_codes = ivf.max_codes
    elif isinstance(hnsw, faiss.IndexHNSW):
        params = _faiss.SearchParametersHNSW(sel=selector, efSearch=hnsw.hnsw.efSearch)
    else:
        params = _faiss.SearchParameters(sel=selector)
    # The parameters hold raw pointers: keep the selector and its bitmap alive with them.
    params.referenced_objects = [selector, packed]
    return params


def _exact(
    index: faiss.Index, queries: np.ndarray, k: int, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Brute force over the vectors of ``rows``; None when the index cannot reconstruct them."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and ivf.direct_map.no() and _refine(index) is None:
        return None  # an IVF index reconstructs only with a direct map (make_direct_map)
    try:
        vectors = index.reconstruct_batch(rows)
    except RuntimeError:  # e.g. IVF without a direct map
        return None
    scores, local = faiss.knn(queries, vectors, min(k, len(rows)), metric=index.metric_type)
    if index.metric_type == faiss.METRIC_INNER_PRODUCT:
        scores = scores.astype(np.float32)
    found = np.where(local >= 0, rows[np.maximum(local, 0)], -1)
    return scores, found


def _pad(
    scores: np.ndarray, found: np.ndarray, k: int, fill: float
) -> tuple[np.ndarray, np.ndarray]:
    if found.shape[1] >= k:
        return scores, found
    extra = k - found.shape[1]
    pad_s = np.full((len(found), extra), fill, dtype=np.float32)
    pad_i = np.full((len(found), extra), -1, dtype=np.int64)
    return np.hstack([scores, pad_s]), np.hstack([found, pad_i])


def filtered_search(
    index: faiss.Index,
    queries: np.ndarray,
    k: int,
    rows: np.ndarray | None = None,
    *,
    excluded: np.ndarray | None = None,
    exact_below: int | None = None,
    knob: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k among the searchable rows only (a pre-filter), shaped like ``index.search``.

    When at most :data:`POSTFILTER_MAX_REMOVED_SHARE` of the rows are removed, an
    unfiltered search a little deeper than k is read past them (:func:`_postfiltered`; queries
    it leaves short take the selector). Otherwise up to ``exact_below`` searchable rows are
    searched by brute force over their own vectors (exact for every index type); more go
    through FAISS with an ID selector. For a Flat index
    every answer is the exact top-k among the searchable rows; for an ANN index a query that
    found fewer than ``min(k, searchable)`` hits (its probed lists or graph neighbourhood held too
    few matching rows) is searched again exhaustively, so it never returns fewer than k hits
    when k rows are searchable.

    Args:
        index: a CPU FAISS index whose ids are its rows (a segment's local rows).
        queries: float32 (q, d).
        k: hits per query.
        rows: int64 row numbers a filter matched (:meth:`MetadataFilter.rows`); None: all.
        excluded: deleted rows never to return, bool mask (ntotal,) or int64 row numbers.
        exact_below: the brute-force/selector switch (default :data:`EXACT_BELOW`).
        knob: the search's ``efSearch`` / ``nprobe`` instead of the index's own
            (:func:`flowsearch.ann.io.knob_params`; an exhaustive re-search ignores it).

    Returns:
        ``(scores float32 (q, k'), rows int64 (q, k'))`` with ``k' = min(k, ntotal)`` (memory
        grows with the rows, never with a huge k), best first; -1 rows (and the metric's worst
        score) pad when fewer than k' rows are searchable.
    """
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    exact_below = EXACT_BELOW if exact_below is None else exact_below
    k = max(1, min(int(k), max(index.ntotal, 1)))
    ip = index.metric_type == faiss.METRIC_INNER_PRODUCT
    fill = float(-np.finfo(np.float32).max if ip else np.finfo(np.float32).max)
    mask = _keep_mask(index.ntotal, rows, excluded)
    if mask is None:
        scores, found = ann_io.search(index, queries, min(k, max(index.ntotal, 1)), knob)
        return _pad(scores, found, k, fill)
    count = int(np.count_nonzero(mask))
    if count == 0:
        empty = np.zeros((len(queries), 0), dtype=np.float32)
        return _pad(empty, empty.astype(np.int64), k, fill)
    kk = min(k, count)
    if 1.0 - count / index.ntotal <= POSTFILTER_MAX_REMOVED_SHARE:
        scores, found, short = _postfiltered(index, queries, kk, mask, count, fill, knob)
        if len(short):
            again = _selected(index, queries[short], kk, mask, knob)
            scores[short], found[short] = again
        return _pad(scores, found, k, fill)
    if count <= exact_below:
        result = _exact(index, queries, k, np.flatnonzero(mask).astype(np.int64))
        if result is not None:
            return _pad(*result, k, fill)
    return _pad(*_selected(index, queries, kk, mask, knob), k, fill)


def _postfiltered(
    index: faiss.Index,
    queries: np.ndarray,
    k: int,
    mask: np.ndarray,
    count: int,
    fill: float,
    knob: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-k searchable rows read off an unfiltered search deep enough that k of them are
    usually among it, and the queries (int64 positions) where they were not. A row ranked
    below k searchable ones cannot be in their top-k, so for Flat the answer is exact."""
    depth = math.ceil(k * index.ntotal / count) + POSTFILTER_MARGIN
    scores, found = ann_io.search(index, queries, min(depth, index.ntotal), knob)
    kept = found >= 0
    kept[kept] = mask[found[kept]]
    # searchable rows first, best first, equal scores to the lower row (as the exact paths)
    worse = -scores if index.metric_type == faiss.METRIC_INNER_PRODUCT else scores
    order = np.lexsort((found, worse, ~kept), axis=-1)[:, :k]
    scores = np.take_along_axis(scores, order, axis=1)
    found = np.take_along_axis(found, order, axis=1)
    kept = np.take_along_axis(kept, order, axis=1)
    scores[~kept], found[~kept] = fill, -1
    return scores, found, np.flatnonzero(kept.sum(axis=1) < k)


def _takes_selector(index: faiss.Index) -> bool:
    """Whether FAISS passes search parameters (an ID selector) to this index: faiss 1.15's
    RaBitQ fast-scan without inverted lists (``auto``'s scan tier) rejects them."""
    refine = _refine(index)
    base = faiss.downcast_index(refine.base_index if refine is not None else index)
    return not isinstance(base, faiss.IndexRaBitQFastScan)


def _selected(
    index: faiss.Index, queries: np.ndarray, kk: int, mask: np.ndarray, knob: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-kk through FAISS's ID selector; queries short of kk hits searched exhaustively.
    An index that takes no selector is searched exhaustively over the searchable rows (exact
    over its re-rank vectors: at most what ``Flat`` costs over them)."""
    if not _takes_selector(index):
        return _exhaustive(index, queries, kk, mask)
    params = search_params(index, mask)
    if knob is not None and isinstance(params, _faiss.SearchParametersHNSW):
        params.efSearch = int(knob)
    elif knob is not None and isinstance(params, _faiss.SearchParametersIVF):
        params.nprobe = int(knob)
    scores, found = index.search(queries, kk, params=params)
    short = np.flatnonzero((found >= 0).sum(axis=1) < kk)
    if len(short):
        LOG.debug("%d filtered queries short of %d hits: exhaustive search", len(short), kk)
        again = _exhaustive(index, queries[short], kk, mask)
        scores[short], found[short] = again
    return scores, found


def _exhaustive(
    index: faiss.Index, queries: np.ndarray, k: int, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every searchable row (bool mask) considered: brute force, or IVF probing all its lists."""
    result = _exact(index, queries, k, np.flatnonzero(rows).astype(np.int64))
    if result is not None:
        return result
    if not _takes_selector(index):  # nothing to reconstruct from either: read the whole order
        ip = index.metric_type == faiss.METRIC_INNER_PRODUCT
        fill = float(-np.finfo(np.float32).max if ip else np.finfo(np.float32).max)
        scores, found, _ = _postfiltered(index, queries, k, rows, 1, fill)
        return scores, found
    params = search_params(index, rows)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        inner = params.base_index_params if _refine(index) is not None else params
        inner.nprobe = ivf.nlist
        inner.max_codes = 0
    elif isinstance(params, _faiss.SearchParametersHNSW):
        params.efSearch = max(params.efSearch, 4 * k, 256)
    return index.search(queries, k, params=params)
