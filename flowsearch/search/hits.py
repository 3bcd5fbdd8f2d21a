r"""Joining a search's global rows to hits: id, text, metadata, scores, the passage a document
was found by; dropping weak hits.

Example:
    >>> above([[Hit(id="a", score=0.9, rank=1, text="t"), Hit(id="b", score=0.1, rank=2,
    ...          text="u")]], 0.5)[0][0].id
    'a'
"""

from __future__ import annotations

import numpy as np

from flowsearch.lexical.tokens import term_spans_batch, tokenize
from flowsearch.search.results import Highlight, Hit
from flowsearch.storage.rows import RowRecord

__all__ = ["above", "build_hits", "with_marks"]


def build_hits(
    by_row: dict[int, RowRecord],
    columns: tuple[str, ...],
    scores: np.ndarray,
    rows: np.ndarray,
    parts: tuple[np.ndarray, np.ndarray],
) -> list[list[Hit]]:
    """Hits for global ``rows`` (q, k) from their records (``by_row``: id, text, metadata and,
    for a passage of several, ``passage``), with their scores and component scores (raw
    cosine, raw BM25; NaN: not scored). A hit has a highlight when the dense side scored one
    of a document's passages; the lexical side scores the whole document."""
    out = []
    as_lists = (np.asarray(a, np.float64).tolist() for a in (scores, parts[0], parts[1]))
    for q_rows, q_scores, q_dense, q_lexical in zip(np.asarray(rows).tolist(), *as_lists,
                                                    strict=True):  # fmt: skip
        hits: list[Hit] = []
        for row, score, d, x in zip(q_rows, q_scores, q_dense, q_lexical, strict=False):
            if row < 0:
                continue
            rec = by_row[row]
            meta = rec["metadata"]
            passage = rec.get("passage")
            highlight = None
            # a passage of several, unless the lexical side alone scored it on the document's
            # first passage: BM25 scores a document whole there (flowsearch.lexical.postings),
            # so no passage is its best (an index written before scores passages: any row)
            whole = d != d and passage is not None and passage[0] == 0
            if passage is not None and passage[1] > 1 and not whole:
                highlight = _highlight(rec["text"], passage[2])
            hits.append(
                Hit.of(
                    rec["id"],
                    score,
                    len(hits) + 1,
                    rec["text"],
                    {c: meta.get(c) for c in columns} if columns else dict(meta),
                    None if d != d else d,  # NaN: not scored
                    None if x != x else x,
                    highlight,
                )
            )
        out.append(hits)
    return out


def _highlight(text: str, start: int) -> Highlight:
    """A passage (starting at ``start`` in its document) without its edge whitespace."""
    body = text.strip()
    at = start + (text.find(body) if body else 0)
    return Highlight(start=at, end=at + len(body), text=body)


def with_marks(hits: list[list[Hit]], queries: list[str]) -> list[list[Hit]]:
    """Each query's hits with their :attr:`Hit.marks`: the words of the text whose index term
    (the lexical side's tokeniser) is one of the query's."""
    out = []
    for query, per_query in zip(queries, hits, strict=True):
        spans = term_spans_batch([h.text for h in per_query], tokenize(query))
        out.append([h.marked(s) for h, s in zip(per_query, spans, strict=True)])
    return out


def above(hits: list[list[Hit]], min_score: float | None) -> list[list[Hit]]:
    """Each query's hits scoring at least ``min_score`` (ranks kept: they were best first).

    ``min_score`` was checked before the search (``arguments.checked_min_score``).
    """
    if min_score is None:
        return hits
    return [[h for h in per_query if h.score >= min_score] for per_query in hits]
