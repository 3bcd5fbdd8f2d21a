r"""Joining a search's global rows to hits: id, text, metadata, scores; dropping weak hits.

Example:
    >>> above([[Hit(id="a", score=0.9, rank=1, text="t"), Hit(id="b", score=0.1, rank=2,
    ...          text="u")]], 0.5)[0][0].id
    'a'
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from flowsearch.search import dense
from flowsearch.search.results import Highlight, Hit
from flowsearch.search.version import Version

__all__ = ["above", "fetch", "scored_hits", "scored_rows", "to_hits"]


def to_hits(
    version: Version,
    scores: np.ndarray,
    rows: np.ndarray,
    parts: tuple[np.ndarray, np.ndarray],
) -> list[list[Hit]]:
    """Hits for global ``rows`` (q, k) with their scores and component scores (a row that is
    one passage of several gets its :class:`Highlight`)."""
    by_row = fetch(version, rows)
    columns = version.manifest.metadata_columns
    out = []
    for qi in range(len(rows)):
        hits: list[Hit] = []
        for j, row in enumerate(rows[qi]):
            if row < 0:
                continue
            rec = by_row[int(row)]
            d, x = float(parts[0][qi, j]), float(parts[1][qi, j])
            meta = rec["metadata"]
            passage = rec.get("passage")
            highlight = None
            if passage is not None and passage[1] > 1:
                highlight = _highlight(rec["text"], passage[2])
            hits.append(
                Hit.model_construct(
                    id=rec["id"],
                    score=float(scores[qi, j]),
                    rank=len(hits) + 1,
                    text=rec["text"],
                    metadata={c: meta.get(c) for c in columns} if columns else dict(meta),
                    dense_score=None if np.isnan(d) else d,
                    lexical_score=None if np.isnan(x) else x,
                    highlight=highlight,
                )
            )
        out.append(hits)
    return out


def _highlight(text: str, start: int) -> Highlight:
    """A passage (starting at ``start`` in its document) without its edge whitespace."""
    body = text.strip()
    at = start + (text.find(body) if body else 0)
    return Highlight(start=at, end=at + len(body), text=body)


def fetch(version: Version, rows: np.ndarray) -> dict[int, dict[str, Any]]:
    """The records (``RowReader.records``) of the valid (>= 0) global ``rows``, by row."""
    valid = np.unique(rows[rows >= 0])
    by_row: dict[int, dict[str, Any]] = {}
    if valid.size:
        seg_of, local = version.locate(valid)
        for s in np.unique(seg_of):
            pick = np.flatnonzero(seg_of == s)
            fetched = version.segments[int(s)].reader.records(local[pick])
            by_row.update(zip(valid[pick].tolist(), fetched, strict=True))
    return by_row


def above(hits: list[list[Hit]], min_score: float | None) -> list[list[Hit]]:
    """Each query's hits scoring at least ``min_score`` (ranks kept: they were best first).

    ``min_score`` was checked before the search (``arguments.checked_min_score``).
    """
    if min_score is None:
        return hits
    return [[h for h in per_query if h.score >= min_score] for per_query in hits]


def scored_hits(
    version: Version,
    queries: list[str],
    k: int,
    Z: np.ndarray | None,
    dense_hits: tuple[np.ndarray, np.ndarray] | None,
    lexical_hits: tuple[np.ndarray, np.ndarray] | None,
) -> list[list[Hit]]:
    """Hits from each side's raw top candidates (``(scores, global rows)``, None for a side
    not searched), their scores made scores with a meaning (:mod:`flowsearch.search.scores`)
    and, with both sides, fused (:func:`flowsearch.search.fusion.fuse`, each candidate scored
    by both sides)."""
    return to_hits(version, *scored_rows(version, queries, k, Z, dense_hits, lexical_hits))


def scored_rows(
    version: Version,
    queries: list[str],
    k: int,
    Z: np.ndarray | None,
    dense_hits: tuple[np.ndarray, np.ndarray] | None,
    lexical_hits: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """What :func:`scored_hits` makes hits of: ``(scores (q, k'), global rows (q, k'), (raw
    cosines, raw BM25))``, best first, -1 rows where none."""
    from flowsearch.search.fusion import fuse
    from flowsearch.search.scores import normalise_dense, normalise_lexical

    reference = version.fusion()
    upper = None
    if lexical_hits is not None:
        upper = np.array([version.lexical.upper_bound(q) for q in queries], np.float64)
    if dense_hits is not None and lexical_hits is not None:
        assert Z is not None and upper is not None
        kind: Literal["transformer", "static"] = (
            "static" if version.manifest.encoder.pooling == "static" else "transformer"
        )
        of_lexical = dense.cosines(version.segments, version.offsets, Z, lexical_hits[1])
        of_dense = _bm25_of(version, queries, dense_hits[1])
        fused = fuse(dense_hits, lexical_hits, reference, k, upper=upper, kind=kind,
                     dense_of_lexical=of_lexical, lexical_of_dense=of_dense)  # fmt: skip
        parts = (fused.dense_scores, fused.lexical_scores)
        return fused.scores, fused.rows, parts
    if dense_hits is not None:
        cos, found = dense_hits
        parts = (cos, np.full_like(cos, np.nan))
        return normalise_dense(cos, reference), found, parts
    assert lexical_hits is not None and upper is not None
    bm25, found = lexical_hits
    parts = (np.full_like(bm25, np.nan), bm25)
    return normalise_lexical(bm25, upper), found, parts


def _bm25_of(version: Version, queries: list[str], rows: np.ndarray) -> np.ndarray:
    """Each query's BM25 for each of its ``rows`` (int64 (q, c), -1 for none): float64."""
    out = np.full(rows.shape, np.nan)
    for qi, query in enumerate(queries):
        valid = rows[qi] >= 0
        if valid.any():
            out[qi, valid] = version.lexical.score_rows(query, rows[qi, valid])
    return out
