"""The HTTP API (``flowsearch serve``): thin FastAPI routes over one Searcher and the writes.

``models`` holds the request and response bodies, ``boundary`` the body bound and the error
mapping, ``docs`` the offline API page, ``app`` the routes, ``service`` one served index,
``indexes`` a root of them (``serve --root``), ``metrics`` ``GET /metrics``, ``run`` the uvicorn
loop. May import
the library's layers below (``search``, ``writes``); holds no search or storage logic of its own.
"""

from flowsearch.server.app import REFRESH_SECONDS, create_app
from flowsearch.server.models import (
    MAX_BODY_BYTES,
    MAX_K,
    MAX_QUERIES,
    MAX_QUERY_CHARS,
    DeleteRequest,
    SearchRequest,
    UpsertRequest,
)
from flowsearch.server.run import serve

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_K",
    "MAX_QUERIES",
    "MAX_QUERY_CHARS",
    "REFRESH_SECONDS",
    "DeleteRequest",
    "SearchRequest",
    "UpsertRequest",
    "create_app",
    "serve",
]
