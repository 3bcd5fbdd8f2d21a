r"""Passages back to documents: a hit is a document, scored by its best passage.

A document longer than the encoder's window is several rows, one per passage
(:mod:`flowsearch.storage.passages`). Both sides search passages; :func:`document_hits` keeps
each query's best-scoring passage of each document (the first in score order) until ``k``
documents, and the hit carries that passage as its ``highlight`` and the whole document as its
``text`` (rebuilt from its passages: :func:`flowsearch.encode.passages.joined` over the rows
beside it). When the ranked rows hold fewer than ``k`` documents and the search was not
exhausted, the caller searches deeper: ``k`` counts documents exactly, with filters and
deletions (a document's passages are deleted together, and share its metadata). Records come
through the shards (:func:`flowsearch.search.shards.records_of`), so the same grouping serves
one process and Ray shards alike.

Best passage (the maximum) rather than a sum or mean of passage scores: measured on
long-document dev sets by the study ``passages`` (RESULTS.md, "Passages"). The rows' scores
already speak for their documents: BM25 scores a long document whole on each of its rows
(:mod:`flowsearch.lexical.postings`), and the dense side adds its centroid to each passage's
cosine (:mod:`flowsearch.search.document_scores`), so the best row is the document's score.

Example:
    >>> hits, done = document_hits(shards, manifest, ranked, k)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from flowsearch.ingest.passages import joined
from flowsearch.search import shards as sh
from flowsearch.search.hits import build_hits
from flowsearch.search.results import Hit
from flowsearch.storage import manifest as mf
from flowsearch.storage.rows import RowRecord

__all__ = ["best_passages", "document_hits", "document_texts"]

Records = dict[int, RowRecord]


def _cut(record: RowRecord) -> bool:
    """Whether a record is one passage of a document of several."""
    passage = record.get("passage")
    return passage is not None and int(passage[1]) > 1


def best_passages(
    by_row: Records,
    scores: np.ndarray,
    rows: np.ndarray,
    parts: tuple[np.ndarray, np.ndarray],
    k: int,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Per query, the first (best) row of each document, at most ``k`` documents, in order.

    Args:
        by_row: the records of ``rows`` (id, ...), by global row.
        scores, rows, parts: a search's scored rows (q, d), best first, -1 rows where none.
        k: documents per query.

    Returns:
        ``(scores, rows, parts)`` of the kept rows ((q, k), -1 padded), and bool (q,): whether
        the query has ``k`` documents or its rows were all there are (fewer valid than ``d``).
    """
    n_q, depth = rows.shape
    keep = np.full((n_q, k), -1, dtype=np.int64)
    out_scores = np.zeros((n_q, k), dtype=np.float64)
    out_parts = (np.full((n_q, k), np.nan), np.full((n_q, k), np.nan))
    done = np.zeros(n_q, dtype=bool)
    for qi in range(n_q):
        seen: set[int | str] = set()
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


def document_texts(shards: sh.Shards, version: int, by_row: Records) -> dict[int, str]:
    """The whole text of the document each row (a passage of several) belongs to: its sibling
    rows (consecutive rows of one segment, so of one shard) read and joined."""
    cut = {row: rec for row, rec in by_row.items() if _cut(rec)}
    if not cut:
        return {}
    firsts = {row: row - int(rec["passage"][0]) for row, rec in cut.items()}
    wanted = np.unique(
        np.concatenate(
            [np.arange(first, first + int(cut[row]["passage"][1])) for row, first in firsts.items()]
        )
    )
    siblings = sh.records_of(shards, version, wanted)
    texts: dict[int, str] = {}
    for row, first in firsts.items():
        recs = [siblings[r] for r in range(first, first + int(cut[row]["passage"][1]))]
        spans = [rec["passage"] for rec in recs]
        texts[row] = joined([rec["text"] for rec in recs], [p[2] for p in spans],
                            [p[3] for p in spans])  # fmt: skip
    return texts


def document_hits(
    shards: sh.Shards, manifest: mf.Manifest, ranked: sh.Ranked, k: int
) -> tuple[list[list[Hit]], bool]:
    """Each query's top ``k`` documents from its ranked rows, and whether every query got ``k``
    documents or all there are (False: search deeper). Rows that are each a whole document
    (every row of an index without long documents) are hits as they stand."""
    by_row = sh.records_of(shards, manifest.version, ranked.rows)
    columns = manifest.metadata_columns
    if not any(_cut(rec) for rec in by_row.values()):
        scores, rows, parts = ranked.scores, ranked.rows, ranked.parts
        hits = build_hits(by_row, columns, scores[:, :k], rows[:, :k],
                          (parts[0][:, :k], parts[1][:, :k]))  # fmt: skip
        return hits, True
    scores, rows, parts, done = best_passages(by_row, ranked.scores, ranked.rows, ranked.parts, k)
    hits = build_hits(by_row, columns, scores, rows, parts)
    texts = document_texts(shards, manifest.version, {int(r): by_row[int(r)] for r in
                                                      rows[rows >= 0]})  # fmt: skip
    if texts:
        for qi, per_query in enumerate(hits):
            valid = rows[qi][rows[qi] >= 0]
            hits[qi] = [
                h.model_copy(update={"text": texts[int(row)]}) if int(row) in texts else h
                for h, row in zip(per_query, valid, strict=True)
            ]
    return hits, bool(done.all())
