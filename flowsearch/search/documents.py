r"""Passages back to documents: a hit is a document, scored by its best passage.

A document longer than the encoder's window is several rows, one per passage
(:mod:`flowsearch.storage.passages`). Both sides search passages; :func:`document_hits` keeps
each query's best-scoring passage of each document (the first in score order) until ``k``
documents, and the hit carries that passage as its ``highlight`` and the whole document as its
``text`` (rebuilt from its passages: :func:`flowsearch.encode.passages.joined` over the rows
beside it). When ``depth`` passages hold fewer than ``k`` documents and the search was not
exhausted, the caller searches deeper (:func:`complete`): ``k`` counts documents exactly, with
filters and deletions (a document's passages are deleted together, and share its metadata).

Best passage (the maximum) rather than a sum or mean of passage scores: measured on
long-document dev sets in ``benchmarks/bench_passages.py`` (RESULTS.md, "Passages").

Example:
    >>> hits, done = document_hits(version, queries, k, depth, Z, dense, lexical)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flowsearch.encode.passages import joined
from flowsearch.search.hits import fetch, scored_rows, to_hits
from flowsearch.search.results import Hit
from flowsearch.search.version import Version

__all__ = ["best_passages", "document_hits", "document_texts", "has_passages"]


def has_passages(version: Version) -> bool:
    """Whether any segment of the version holds a document of several passages (otherwise
    every row is a document and hits are rows, as before passages)."""
    return any(seg.reader.passage_columns for seg in version.segments)


def best_passages(
    version: Version,
    scores: np.ndarray,
    rows: np.ndarray,
    parts: tuple[np.ndarray, np.ndarray],
    k: int,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Per query, the first (best) row of each document, at most ``k`` documents, in order.

    Args:
        scores, rows, parts: a search's scored rows (q, d), best first, -1 rows where none
            (:func:`flowsearch.search.hits.scored_rows`).
        k: documents per query.

    Returns:
        ``(scores, rows, parts)`` of the kept rows ((q, k), -1 padded), and bool (q,): whether
        the query has ``k`` documents or its rows were all there are (fewer valid than ``d``).
    """
    by_row = fetch(version, rows)
    n_q, depth = rows.shape
    keep = np.full((n_q, k), -1, dtype=np.int64)
    out_scores = np.zeros((n_q, k), dtype=np.float64)
    out_parts = (np.full((n_q, k), np.nan), np.full((n_q, k), np.nan))
    done = np.zeros(n_q, dtype=bool)
    for qi in range(n_q):
        seen: set[Any] = set()
        n = 0
        for j in range(depth):
            row = int(rows[qi, j])
            if row < 0:
                continue
            doc = by_row[row]["id"]
            if doc in seen:
                continue
            seen.add(doc)
            keep[qi, n] = row
            out_scores[qi, n] = scores[qi, j]
            out_parts[0][qi, n] = parts[0][qi, j]
            out_parts[1][qi, n] = parts[1][qi, j]
            n += 1
            if n == k:
                break
        done[qi] = n == k or int((rows[qi] >= 0).sum()) < depth
    return out_scores, keep, out_parts, done


def document_texts(version: Version, rows: np.ndarray) -> dict[int, str]:
    """The whole text of the document each global row (a passage of several) belongs to:
    its sibling rows read and joined."""
    wanted = np.unique(rows[rows >= 0])
    texts: dict[int, str] = {}
    if not wanted.size:
        return texts
    records = fetch(version, wanted)
    seg_of, local = version.locate(wanted)
    for row, s, r in zip(wanted.tolist(), seg_of.tolist(), local.tolist(), strict=True):
        passage = records[row].get("passage")
        if passage is None or passage[1] <= 1:
            continue
        number, count = int(passage[0]), int(passage[1])
        first = r - number
        siblings = version.segments[s].reader.records(np.arange(first, first + count))
        spans = [sib["passage"] for sib in siblings]
        texts[row] = joined([sib["text"] for sib in siblings], [p[2] for p in spans],
                            [p[3] for p in spans])  # fmt: skip
    return texts


def document_hits(
    version: Version,
    queries: list[str],
    k: int,
    depth: int,
    Z: np.ndarray | None,
    dense_hits: tuple[np.ndarray, np.ndarray] | None,
    lexical_hits: tuple[np.ndarray, np.ndarray] | None,
) -> tuple[list[list[Hit]], bool]:
    """Each query's top ``k`` documents from its top ``depth`` passages (each side's raw
    candidates as :func:`flowsearch.search.hits.scored_hits` takes them), and whether every
    query got ``k`` documents or all there are (False: search deeper)."""
    scores, rows, parts = scored_rows(version, queries, depth, Z, dense_hits, lexical_hits)
    scores, rows, parts, done = best_passages(version, scores, rows, parts, k)
    hits = to_hits(version, scores, rows, parts)
    texts = document_texts(version, rows)
    if texts:
        for qi, per_query in enumerate(hits):
            valid = rows[qi][rows[qi] >= 0]
            hits[qi] = [
                h.model_copy(update={"text": texts[int(row)]}) if int(row) in texts else h
                for h, row in zip(per_query, valid, strict=True)
            ]
    return hits, bool(done.all())
