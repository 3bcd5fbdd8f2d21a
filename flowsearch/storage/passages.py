r"""Passages on disk: the internal columns that tie a segment's rows to their documents.

A document longer than the encoder's window is stored as several rows, one per passage
(:mod:`flowsearch.ingest.passages`), each with the document's id and metadata, the passage's
text in ``text``, and four internal columns (names start with ``__``, which corpora may not
use):

* ``__passage``: the passage's number within its document (0, 1, ...), int32;
* ``__passages``: how many passages the document has, int32;
* ``__passage_start``, ``__passage_end``: the passage's character span in the document's text,
  int64.

A document's passages are consecutive rows of one segment (every write and merge keeps rows in
order, and deletes or keeps a document's rows together), so the row of passage ``p`` of ``n``
at local row ``r`` finds its siblings at ``r - p .. r - p + n - 1`` without a lookup. A segment
whose documents are all one passage (or written before passages) has none of these columns:
each of its rows is a whole document.

Example:
    >>> columns = passage_columns([[(0, 10), (8, 20)], [(0, 5)]])
    >>> columns[PASSAGE].to_pylist(), columns[PASSAGE_END].to_pylist()
    ([0, 1, 0], [10, 20, 5])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flowsearch.storage import deletions
from flowsearch.storage.records import SegmentRecord

__all__ = [
    "PASSAGE",
    "PASSAGES",
    "PASSAGE_COLUMNS",
    "PASSAGE_END",
    "PASSAGE_START",
    "count_documents",
    "has_passages",
    "passage_columns",
    "whole_documents",
]

PASSAGE = "__passage"
PASSAGES = "__passages"
PASSAGE_START = "__passage_start"
PASSAGE_END = "__passage_end"
#: The internal columns, in the order a part holds them (after the metadata columns).
PASSAGE_COLUMNS = (PASSAGE, PASSAGES, PASSAGE_START, PASSAGE_END)
_TYPES = (pa.int32(), pa.int32(), pa.int64(), pa.int64())


def passage_columns(spans: Sequence[Sequence[tuple[int, int]]]) -> dict[str, pa.Array]:
    """The internal columns of the rows of documents cut into ``spans`` (per document, its
    passages' character spans, in order), one row per passage."""
    counts = np.array([len(s) for s in spans], dtype=np.int64)
    number = np.concatenate([np.arange(c) for c in counts]) if len(counts) else np.zeros(0)
    flat = [span for doc in spans for span in doc]
    starts = np.array([a for a, _ in flat], dtype=np.int64)
    ends = np.array([b for _, b in flat], dtype=np.int64)
    values = (number, np.repeat(counts, counts), starts, ends)
    return {
        name: pa.array(np.asarray(v).astype(t.to_pandas_dtype()), t)
        for name, v, t in zip(PASSAGE_COLUMNS, values, _TYPES, strict=True)
    }


def whole_documents(texts: pa.Array | pa.ChunkedArray) -> dict[str, pa.Array]:
    """The internal columns of rows that are each a whole document (one passage)."""
    lengths = pc.utf8_length(texts)
    n = len(texts)
    if isinstance(lengths, pa.ChunkedArray):
        lengths = lengths.combine_chunks()
    return {
        PASSAGE: pa.array(np.zeros(n, np.int32)),
        PASSAGES: pa.array(np.ones(n, np.int32)),
        PASSAGE_START: pa.array(np.zeros(n, np.int64)),
        PASSAGE_END: lengths.cast(pa.int64()).fill_null(0),
    }


def has_passages(schema: pa.Schema) -> bool:
    """Whether a segment's parts carry the passage columns."""
    return PASSAGE in schema.names


def count_documents(folder: Path, seg: SegmentRecord) -> int:
    """Live documents of a segment: its live rows that are a document's first passage (reads
    one small column when the segment has passages)."""
    if not seg.parts:  # an older format's segment: rows are documents
        return seg.n_live
    if not has_passages(pq.read_schema(folder / seg.parts[0].path)):
        return seg.n_live
    first = (
        np.concatenate(
            [
                pq.read_table(folder / part.path, columns=[PASSAGE]).column(PASSAGE).to_numpy()
                for part in seg.parts
            ]
        )
        == 0
    )
    if seg.deletions is not None:
        first &= ~deletions.read(folder / seg.deletions, seg.n_rows)
    return int(first.sum())
