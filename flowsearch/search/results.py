r"""What a search returns: :class:`Hit` and :class:`QueryResult` (typed, one JSON shape).

These models are the boundary: the library returns them, ``flowsearch query --json`` prints
their ``to_dict()``, and the server answers with the same JSON (and the same JSON schema,
:meth:`pydantic.BaseModel.model_json_schema`).

Example:
    >>> Hit(id="a", score=0.5, rank=1, text="t").to_dict()["rank"]
    1
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowsearch.space.reports import QueryReport

__all__ = ["Highlight", "Hit", "QueryResult"]


class Highlight(BaseModel):
    """The passage of a long document that matched (its best-scoring one).

    Attributes:
        start: where the passage starts in the document's text (a character offset).
        end: where it ends (exclusive): ``hit.text[start:end] == highlight.text``.
        text: the passage.
    """

    model_config = ConfigDict(frozen=True)
    start: int
    end: int
    text: str


class Hit(BaseModel):
    """One search result.

    Attributes:
        id: the document's id (int or str, as indexed).
        score: the hit's relevance score (see the README's "Scores": in every mode a number
            comparable across queries of one index; larger is better).
        rank: 1-based position in the hit list.
        text: the document's text.
        metadata: the corpus's other columns for this document (None where it lacks one).
        dense_score: the raw cosine between the query and the row in the searched space (None
            when the dense side did not score the row).
        lexical_score: the raw BM25 score (None when the lexical side did not score the row).
        rerank_score: with a reranker, the cross-encoder's score of (query, the hit's best
            passage), by which the hits are ordered (None: not reranked); ``score`` stays the
            first stage's.
        highlight: for a document cut into passages (longer than the encoder's window), the
            passage that scored best (the hit's scores are that passage's); None for a
            document read whole.
    """

    model_config = ConfigDict(frozen=True)
    id: int | str
    score: float
    rank: int
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    dense_score: float | None = None
    lexical_score: float | None = None
    rerank_score: float | None = None
    highlight: Highlight | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: rank, id, score, text, metadata, dense_score, lexical_score,
        rerank_score, highlight."""
        return self.model_dump(mode="json")


class QueryResult(BaseModel):
    """One query's hits and what the index says about the query (its report)."""

    model_config = ConfigDict(frozen=True)
    query: str
    hits: list[Hit]
    report: QueryReport | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"query", "hits": [...], "report": {...}}`` (``query --json`` and the server)."""
        return {
            "query": self.query,
            "hits": [h.to_dict() for h in self.hits],
            "report": None if self.report is None else self.report.to_dict(),
        }
