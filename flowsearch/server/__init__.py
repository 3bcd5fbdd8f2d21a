"""The HTTP API (``flowsearch serve``): thin FastAPI routes over one Searcher and the writes.

May import the library's public layers (``search``, ``writes``); holds no search or storage
logic of its own.
"""

from flowsearch.server.app import (
    MAX_K,
    MAX_QUERIES,
    MAX_QUERY_CHARS,
    REFRESH_SECONDS,
    DeleteRequest,
    SearchRequest,
    UpsertRequest,
    create_app,
    serve,
)

__all__ = [
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
