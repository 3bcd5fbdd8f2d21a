r"""The HTTP API's bodies: what a request may hold, and the typed shape of every answer.

Requests are strict (no coercion, no unknown field, bounded sizes), so a malformed body is a 422
naming the field before the library sees it. Responses carry the same JSON as the library's
``to_dict()`` and the command line's ``--json``: a field absent there (the component scores of a
non-hybrid hit) is absent here too (routes serialize with ``exclude_unset``). When the library's
results become pydantic models themselves, these response models give way to them: the field
names are theirs.

Example:
    >>> SearchRequest.model_validate({"query": "tides", "k": 3}).k
    3
    >>> HitModel.model_validate({"rank": 1, "id": "p1", "score": 0.5, "text": "t",
    ...                          "metadata": {}}).model_dump(exclude_unset=True)
    {'rank': 1, 'id': 'p1', 'score': 0.5, 'text': 't', 'metadata': {}}
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ID_CHARS",
    "MAX_IDS",
    "MAX_K",
    "MAX_QUERIES",
    "MAX_QUERY_CHARS",
    "MAX_RECORDS",
    "MAX_WHERE_CHARS",
    "BatchResultModel",
    "DeleteRequest",
    "DeleteResultModel",
    "HitModel",
    "QueryReportModel",
    "QueryResultModel",
    "SearchRequest",
    "UpsertRequest",
    "UpsertResultModel",
]

#: Bounds of a request (a body outside them is a 422 before the library sees it).
MAX_K = 10_000
MAX_QUERIES = 1_000
MAX_QUERY_CHARS = 10_000
MAX_WHERE_CHARS = 10_000
MAX_RECORDS = 10_000
MAX_IDS = 100_000
MAX_ID_CHARS = 1_000
#: Largest request body, counted as it arrives (a Content-Length above it, or a chunked body
#: that grows past it, is a 413).
MAX_BODY_BYTES = 64 * 2**20

QueryText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]
RecordId = (
    Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
    | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
)


# -- requests -----------------------------------------------------------------------------------


class SearchRequest(BaseModel):
    """Body of ``POST /search``: one query, or a list of them (each answered the same way)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    query: QueryText | Annotated[list[QueryText], Field(min_length=1, max_length=MAX_QUERIES)]
    k: Annotated[int, Field(ge=1, le=MAX_K)] = 10
    where: Annotated[str, StringConstraints(max_length=MAX_WHERE_CHARS)] | None = None
    mode: Literal["dense", "lexical", "hybrid"] | None = None


class UpsertRequest(BaseModel):
    """Body of ``POST /upsert``: records with the index's id and text columns (and metadata)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    records: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=MAX_RECORDS)]


class DeleteRequest(BaseModel):
    """Body of ``POST /delete``: the ids to remove (strings or 64-bit integers)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ids: Annotated[list[RecordId], Field(min_length=1, max_length=MAX_IDS)]


# -- responses ----------------------------------------------------------------------------------


class HitModel(BaseModel):
    """One hit, as ``query --json`` prints it (``flowsearch.search.searcher.hit_dict``)."""

    rank: int = Field(description="1-based position in the hit list")
    id: int | str = Field(description="the record's id, as indexed")
    score: float = Field(description="relevance in [0, 1], comparable across queries")
    text: str
    metadata: dict[str, Any] = Field(description="the record's other columns")
    dense_score: float | None = Field(None, description="hybrid only: the cosine of the hit")
    lexical_score: float | None = Field(None, description="hybrid only: the hit's BM25 score")


class QueryReportModel(BaseModel):
    """What the index says about a query (``flowsearch.space.reference.QueryReport``)."""

    log_density: float | None = None
    corpus_mean: float | None = None
    corpus_std: float | None = None
    gap_std: float | None = None
    verdict: str = Field(description="in-distribution, out-of-distribution or not judged")
    reason: str | None = None
    top_score: float | None = None
    top_score_percentile: float | None = None


class QueryResultModel(BaseModel):
    """One query's answer: its hits, best first, and its report (``QueryResult.to_dict()``)."""

    query: str
    hits: list[HitModel]
    density: QueryReportModel


class BatchResultModel(BaseModel):
    """A list of queries' answers, in the order asked, each as a single query's."""

    results: list[QueryResultModel]


class UpsertResultModel(BaseModel):
    """The summary :func:`flowsearch.upsert` returns (``upsert --json``)."""

    model_config = ConfigDict(extra="allow")  # the library's summary may say more

    index: str
    version: int
    rows: int = Field(description="live rows after the write")
    upserted: int = Field(description="records written")
    inserted: int = Field(description="of them, new ids")
    replaced: int = Field(description="of them, ids that replaced a row")
    skipped: int = Field(0, description="records skipped for a null or blank text")
    drift: dict[str, Any] | None = Field(None, description="the new rows against the corpus")


class DeleteResultModel(BaseModel):
    """What :func:`flowsearch.delete` did (``delete --json``)."""

    deleted: int
    missing: list[int | str] = Field(description="ids that were not in the index")
    version: int | None = Field(description="the version the deletion published (or the same)")
