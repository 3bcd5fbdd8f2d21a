r"""What the framework retrievers share: a searcher opened on first use, a hit's metadata.

Example:
    >>> from flowsearch.search.results import Hit
    >>> sorted(hit_metadata(Hit(id="a", score=0.5, rank=1, text="t", metadata={"year": 2020})))
    ['dense_score', 'highlight', 'id', 'lexical_score', 'rank', 'rerank_score', 'score', 'year']
"""

from __future__ import annotations

import os
import threading
from typing import Any

from flowsearch.search.modes import Mode
from flowsearch.search.results import Hit
from flowsearch.search.searcher import Searcher

__all__ = ["HIT_KEYS", "OpenOnUse", "hit_metadata"]

#: The keys :func:`hit_metadata` adds to the corpus's metadata columns (they win a clash).
HIT_KEYS = ("id", "score", "rank", "highlight", "dense_score", "lexical_score", "rerank_score")


def hit_metadata(hit: Hit) -> dict[str, Any]:
    """A hit's metadata columns, then its id, score, rank, highlight (``{"start", "end",
    "text"}`` of the best passage, or None), dense, lexical and rerank scores: JSON values."""
    out = dict(hit.metadata)
    plain = hit.to_dict()
    out.update({key: plain[key] for key in HIT_KEYS})
    return out


class OpenOnUse:
    """A :class:`Searcher` of ``index`` opened at the first search (and shared after), or the
    one given. Thread-safe.

    Args:
        index: the index directory, or an open Searcher.
        reranker: a cross-encoder for :meth:`Searcher.open` (with a directory only).
    """

    def __init__(self, index: str | os.PathLike[str] | Searcher, reranker: str | None) -> None:
        self._index = index
        self._reranker = reranker
        self._searcher = index if isinstance(index, Searcher) else None
        self._lock = threading.Lock()

    def get(self) -> Searcher:
        """The searcher, opened now if it was not yet."""
        if self._searcher is None:
            with self._lock:
                if self._searcher is None:
                    assert not isinstance(self._index, Searcher)
                    self._searcher = Searcher.open(self._index, reranker=self._reranker)
        return self._searcher

    def search(self, query: str, k: int, where: str | None, mode: Mode | None) -> list[Hit]:
        """The searcher's hits for one query."""
        return self.get().search(query, k=k, where=where, mode=mode)
