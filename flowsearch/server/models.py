r"""The HTTP API's bodies: what a request may hold, and the typed shape of every answer.

Requests are strict (no coercion, no unknown field, bounded sizes), so a malformed body is a 422
naming the field before the library sees it. Answers are the library's own models
(:class:`~flowsearch.search.results.QueryResult`, :class:`~flowsearch.writes.results.WriteResult`):
the same JSON as their ``to_dict()`` and the command line's ``--json``, and one JSON schema.

Example:
    >>> SearchRequest.model_validate({"query": "tides", "k": 3}).k
    3
    >>> sorted(Hit.model_json_schema()["properties"])[:3]
    ['dense_score', 'highlight', 'id']
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from flowsearch.ingest.columns import MAX_ID_CHARS
from flowsearch.jsonable import find_in_json
from flowsearch.search.modes import Mode
from flowsearch.search.pictures import SpacePictures
from flowsearch.search.results import Hit, QueryResult
from flowsearch.storage.records import WriteRecord
from flowsearch.writes.results import WriteResult

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ID_CHARS",
    "MAX_IDS",
    "MAX_K",
    "MAX_QUERIES",
    "MAX_QUERY_CHARS",
    "MAX_RECORDS",
    "MAX_WAIT_SECONDS",
    "MAX_WHERE_CHARS",
    "MAX_NAME_CHARS",
    "BatchResult",
    "CreateRequest",
    "DeleteRequest",
    "ErrorDetail",
    "Hit",
    "QueryResult",
    "SearchRequest",
    "SpacePictures",
    "UpsertRequest",
    "WriteRecord",
    "WriteResult",
    "error_responses",
]

#: Bounds of a request (a body outside them is a 422 before the library sees it).
MAX_K = 10_000
MAX_QUERIES = 1_000
MAX_QUERY_CHARS = 10_000
MAX_WHERE_CHARS = 10_000
MAX_RECORDS = 10_000
MAX_IDS = 100_000
#: Longest index or column name a body may give.
MAX_NAME_CHARS = 100
#: Longest a write may wait for another process's write (it holds the server's write queue).
MAX_WAIT_SECONDS = 600.0
#: Largest request body, counted as it arrives (a Content-Length above it, or a chunked body
#: that grows past it, is a 413).
MAX_BODY_BYTES = 64 * 2**20

QueryText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]
#: Seconds a write waits for another process that holds the index's lock (absent: a 409 at once).
WaitSeconds = Annotated[float, Field(ge=0.0, le=MAX_WAIT_SECONDS, allow_inf_nan=False)] | None
RecordId = (
    Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
    | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
)


# -- requests -----------------------------------------------------------------------------------


class SearchRequest(BaseModel):
    """Body of ``POST /search``: one query, or a list of them (each answered the same way)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        # what /docs fills its "Try it out" body with: a body any index answers
        json_schema_extra={"examples": [{"query": "how does sourdough rise?", "k": 5}]},
    )

    query: QueryText | Annotated[list[QueryText], Field(min_length=1, max_length=MAX_QUERIES)]
    k: Annotated[int, Field(ge=1, le=MAX_K)] = 10
    where: Annotated[str, StringConstraints(max_length=MAX_WHERE_CHARS)] | None = None
    mode: Mode | None = None
    #: Drop hits whose score (in [0, 1], comparable across queries) is below this.
    min_score: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    rerank: Annotated[
        bool | None,
        Field(description="Rerank the top hits by the server's cross-encoder (serve --rerank "
              "MODEL); null: when it has one; true on a server without one is a 400."),
    ] = None  # fmt: skip


class UpsertRequest(BaseModel):
    """Body of ``POST /upsert``: records with the index's id and text columns (and metadata)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"records": [{"id": "doc-1", "text": "Sourdough rises as its yeasts make gas."}]}
            ]
        },
    )

    records: Annotated[list[dict[str, object]], Field(min_length=1, max_length=MAX_RECORDS)]
    wait: WaitSeconds = None

    @field_validator("records")
    @classmethod
    def _json_numbers(cls, records: list[dict[str, object]]) -> list[dict[str, object]]:
        """Refuse NaN and Infinity: JSON has neither (the parser takes them as literals)."""
        for i, record in enumerate(records):
            where = _non_finite(record, f"records[{i}]")
            if where is not None:
                raise ValueError(f"{where} is NaN or infinite, which JSON does not have; send null")
        return records


def _non_finite(value: object, path: str) -> str | None:
    """Where in a parsed JSON value a NaN or infinity is (its path), or None."""
    keys = find_in_json(value, lambda v: isinstance(v, float) and not math.isfinite(v))
    return None if keys is None else path + "".join(f"[{k!r}]" for k in keys)


class CreateRequest(UpsertRequest):
    """Body of ``POST /indexes/{name}`` (serving a root): the new index's records, as
    ``/upsert`` takes them, and how to encode them."""

    #: encode as this served index does (its model, pooling and window); absent: the bundled
    #: default model
    like: Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)] | None = None
    #: ``auto``, a calibrator name (``flow``, ``whitening``, ...) or ``none``
    calibration: Annotated[str, StringConstraints(min_length=1, max_length=32)] = "auto"
    text_column: Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)] = "text"
    id_column: Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)] = "id"


class DeleteRequest(BaseModel):
    """Body of ``POST /delete``: the ids to remove (strings or 64-bit integers)."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"ids": ["doc-1"]}]}
    )

    ids: Annotated[list[RecordId], Field(min_length=1, max_length=MAX_IDS)]
    wait: WaitSeconds = None


# -- responses ----------------------------------------------------------------------------------
# The library's own models: one JSON shape and one JSON schema for the library's ``to_dict()``,
# the command line's ``--json`` and these answers (``SpacePictures`` for ``GET /space``,
# ``WriteRecord`` for ``GET /history``).


class BatchResult(BaseModel):
    """A list of queries' answers, in the order asked, each as a single query's."""

    results: list[QueryResult]


class ErrorDetail(BaseModel):
    """Every error's body: one line saying what is wrong and how to fix it."""

    detail: str


#: What each error status of the API means, for ``/openapi.json``.
_ERRORS = {
    400: "Bad input the library refused: a where filter, a mode the index cannot serve, a "
    "record without the index's columns, ...",
    401: "Missing or wrong API key (the server was started with one)",
    404: "No index of that name is served (serving a root: GET /indexes lists them)",
    409: "Another process holds the index's write lock (send wait to queue behind it)",
    413: f"The request body is larger than {MAX_BODY_BYTES} bytes",
    422: "The body is not JSON, or a field is missing, mistyped or out of bounds",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route that may answer these error statuses."""
    return {s: {"model": ErrorDetail, "description": _ERRORS[s]} for s in statuses}
