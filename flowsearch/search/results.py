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

__all__ = ["Highlight", "Hit", "QueryResult", "snippet_window"]


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
            when the dense side did not score the row); for a passage of a longer document,
            the mean of its cosine and its document's centroid's
            (:mod:`flowsearch.search.document_scores`).
        lexical_score: the raw BM25 score (None when the lexical side did not score the row).
        rerank_score: with a reranker, the cross-encoder's score of (query, the hit's best
            passage), by which the hits are ordered (None: not reranked); ``score`` stays the
            first stage's.
        highlight: for a document cut into passages (longer than the encoder's window), the
            passage that scored best on the dense side (``dense_score`` is that passage's;
            BM25 scores the whole document); None for a document read whole, and in
            ``lexical`` mode.
        marks: where the query's words are in ``text``: (start, end) character offsets of each
            word whose index term is one of the query's (stemmed, as BM25 counts them:
            ``cuts`` for ``cutting``), in order; what the search page marks and
            :meth:`window` centres on.
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
    marks: list[tuple[int, int]] = Field(default_factory=list)

    @classmethod
    def of(
        cls,
        id: int | str,  # noqa: A002 (the field's name)
        score: float,
        rank: int,
        text: str,
        metadata: dict[str, object],
        dense_score: float | None,
        lexical_score: float | None,
        highlight: Highlight | None,
    ) -> Hit:
        """A hit from values already of the fields' types, unchecked: what
        :meth:`model_construct` makes from every field, without its per-call bookkeeping (a
        search builds ``k`` of them per query)."""
        # every field, in the model's order (what model_dump walks); the rest at their defaults
        values: dict[str, object] = {
            "id": id, "score": score, "rank": rank, "text": text, "metadata": metadata,
            "dense_score": dense_score, "lexical_score": lexical_score, "rerank_score": None,
            "highlight": highlight, "marks": [],
        }  # fmt: skip
        return cls._unchecked(values, set(_HIT_FIELDS))

    def marked(self, marks: list[tuple[int, int]]) -> Hit:
        """This hit with its :attr:`marks` (offsets already of the field's type), unchecked:
        what ``model_copy(update={"marks": marks})`` makes, without its per-call bookkeeping
        (a search marks ``k`` hits per query)."""
        return self._unchecked({**self.__dict__, "marks": marks}, {*self.model_fields_set, "marks"})

    @classmethod
    def _unchecked(cls, values: dict[str, object], fields_set: set[str]) -> Hit:
        """A hit holding ``values`` (every field, in the model's order) as they are: what
        pydantic's own unchecked construction leaves on an instance."""
        hit = object.__new__(cls)
        object.__setattr__(hit, "__dict__", values)
        object.__setattr__(hit, "__pydantic_fields_set__", fields_set)
        object.__setattr__(hit, "__pydantic_extra__", None)
        object.__setattr__(hit, "__pydantic_private__", None)
        return hit

    def to_dict(self) -> dict[str, object]:
        """The JSON form: rank, id, score, text, metadata, dense_score, lexical_score,
        rerank_score, highlight, marks."""
        return self.model_dump(mode="json")

    def window(self, width: int) -> tuple[int, int]:
        """The ``width`` characters of ``text`` to show of this hit: within its best passage
        (``highlight``) when it has one, where the most of its :attr:`marks` fall (the first
        such place), else the start.

        Example:
            >>> hit = Hit(id=1, score=1.0, rank=1, text="x" * 50 + " tide", marks=[(51, 55)])
            >>> hit.window(10)
            (45, 55)
        """
        return snippet_window(len(self.text), self.marks, width, self.highlight)


def snippet_window(
    length: int, marks: list[tuple[int, int]], width: int, within: Highlight | None = None
) -> tuple[int, int]:
    """The (start, end) of the ``width`` characters of a text of ``length`` to show: inside
    ``within`` (a passage) when given, placed to hold the most ``marks`` (the earliest such
    place, the words a little in from its start), else from its start.

    The one rule for cutting a hit's text (the command line's table, anything that shows a
    snippet).
    """
    lo, hi = (within.start, within.end) if within is not None else (0, length)
    width = max(width, 1)
    if hi - lo <= width:
        return lo, hi
    inside = [(a, b) for a, b in marks if lo <= a and b <= hi]
    best, start, j = 0, lo, 0
    for i, (a, _) in enumerate(inside):  # a window starting at each mark; words do not overlap
        j = max(j, i)
        while j < len(inside) and inside[j][1] <= a + width:
            j += 1
        if j - i > best:
            best, start = j - i, a
    if best:
        start -= min(width // 10, start - lo)  # a little of what leads up to the first word
    start = min(start, hi - width)
    return start, start + width


#: The fields :meth:`Hit.of` is given (its ``model_fields_set``, as validation would record).
_HIT_FIELDS = frozenset(
    ("id", "score", "rank", "text", "metadata", "dense_score", "lexical_score", "highlight")
)


class QueryResult(BaseModel):
    """One query's hits and what the index says about the query (its report)."""

    model_config = ConfigDict(frozen=True)
    query: str
    hits: list[Hit]
    report: QueryReport | None = None

    def to_dict(self) -> dict[str, object]:
        """``{"query", "hits": [...], "report": {...}}`` (``query --json`` and the server)."""
        return {
            "query": self.query,
            "hits": [h.to_dict() for h in self.hits],
            "report": None if self.report is None else self.report.to_dict(),
        }
