r"""The HTTP API of ``flowsearch serve``: thin FastAPI routes over one :class:`Searcher`.

Every route calls the same library object a Python user has (``Searcher.search``/``query``/
``info``, :func:`flowsearch.upsert`, :func:`flowsearch.delete`) and formats its answer as JSON;
the server decides nothing about search itself. What it adds is the HTTP boundary:

- request models with strict types and bounds (:class:`SearchRequest`, :class:`UpsertRequest`,
  :class:`DeleteRequest`; ``extra="forbid"``), so a malformed body is a 422 naming the field;
- error mapping: :class:`FlowsearchError` (bad input the library refused) is a 400, the index's
  writer lock held by another process a 409, anything else a logged 500 ``internal error``
  without a traceback; every error body is ``{"detail": "<one line>"}``;
- an optional API key (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``) on every route but
  ``/health`` (and the static schema at ``/openapi.json`` and ``/docs``);
- one Searcher per process, searched concurrently from FastAPI's thread pool; writes serialized
  in the process by a lock (and across processes by the index's own file lock), after which the
  Searcher moves to the published version; versions published by other processes are picked up
  at most :data:`REFRESH_SECONDS` later.

Example:
    $ flowsearch serve --index idx --port 8000
    $ curl -s localhost:8000/search -d '{"query": "how does sourdough rise?", "k": 3}'
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.params import Depends as DependsParam
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.exceptions import HTTPException as StarletteHTTPException

from flowsearch.errors import FlowsearchError
from flowsearch.jsonable import json_safe
from flowsearch.search.searcher import Searcher

__all__ = [
    "DeleteRequest",
    "SearchRequest",
    "UpsertRequest",
    "create_app",
    "serve",
]

LOG = logging.getLogger(__name__)

#: Bounds of a request (a body outside them is a 422 before the library sees it).
MAX_K = 10_000
MAX_QUERIES = 1_000
MAX_QUERY_CHARS = 10_000
MAX_WHERE_CHARS = 10_000
MAX_RECORDS = 10_000
MAX_IDS = 100_000
MAX_ID_CHARS = 1_000
MAX_BODY_BYTES = 64 * 2**20
#: How stale the served version may be after another process (e.g. ``flowsearch upsert``)
#: published a new one; the server's own writes are served at once.
REFRESH_SECONDS = 1.0

_LOCKED = "another flowsearch process is writing"  # directory._lock's refusal

QueryText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]
RecordId = (
    Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)]
    | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
)


class SearchRequest(BaseModel):
    """Body of ``POST /search``: one query (answered with ``hits``) or a list (``results``)."""

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


class SafeJSONResponse(JSONResponse):
    """JSON that never fails to render: NaN/inf become null, numpy scalars plain numbers,
    anything else JSON does not know (dates, bytes) its ``str``."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(json_safe(content), ensure_ascii=False, allow_nan=False, default=str)
        return text.encode("utf-8")


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> SafeJSONResponse:
    return SafeJSONResponse({"detail": detail}, status_code=status, headers=headers)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _validation_detail(exc: RequestValidationError) -> str:
    """The first few problems of a refused body, each as ``field: message``."""
    problems = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(part) for part in err.get("loc", ()) if part != "body")
        msg = err.get("msg", "invalid")
        problems.append(_one_line(f"{loc}: {msg}" if loc else msg, 200))
    more = len(exc.errors()) - len(problems)
    return "invalid request: " + "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


class _Service:
    """The process's Searcher and write lock (what the routes share)."""

    def __init__(self, index_dir: Path) -> None:
        self.index_dir = index_dir
        self.searcher = Searcher.open(index_dir)
        self.write_lock = threading.Lock()
        self._checked = time.monotonic()

    def reader(self) -> Searcher:
        """The Searcher, moved to a version another process published if it is time to look."""
        now = time.monotonic()
        if now - self._checked >= REFRESH_SECONDS:
            self._checked = now
            self.refresh()
        return self.searcher

    def refresh(self) -> None:
        try:
            self.searcher.refresh()
        except Exception:  # keep serving the pinned version; the next look may succeed
            LOG.warning("could not move to the newest version of %s", self.index_dir, exc_info=True)

    def write(self, func: Callable[[], Any]) -> Any:
        """Run one write (serialized in the process) and serve its version from now on."""
        with self.write_lock:
            result = func()
            self.refresh()
            self._checked = time.monotonic()
            return result


# module-level, so the route signature's annotations resolve (postponed evaluation)
_BEARER = HTTPBearer(auto_error=False, description="Authorization: Bearer KEY")
_X_API_KEY = APIKeyHeader(name="X-API-Key", auto_error=False, description="X-API-Key: KEY")


def _auth(api_key: str | None) -> Sequence[DependsParam]:
    """The dependency that checks the API key (none when no key is set)."""
    if api_key is None:
        return []
    if not api_key.strip():
        raise FlowsearchError("the API key is empty; pass a key or leave FLOWSEARCH_API_KEY unset")
    expected = api_key.encode("utf-8")

    def check(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
        x_api_key: Annotated[str | None, Depends(_X_API_KEY)],
    ) -> None:
        given = [credentials.credentials if credentials else None, x_api_key]
        # compare every candidate (no early exit) in constant time, as bytes (any characters)
        ok = [hmac.compare_digest(g.encode("utf-8"), expected) for g in given if g is not None]
        if not any(ok):
            raise HTTPException(
                401,
                "missing or wrong API key; send Authorization: Bearer KEY or X-API-Key: KEY",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return [Depends(check)]


def create_app(index_dir: str | os.PathLike[str], api_key: str | None = None) -> FastAPI:
    """The FastAPI app serving one index (its Searcher is opened here, before any request).

    Args:
        index_dir: the index directory.
        api_key: when set, every route except ``/health``, ``/openapi.json`` and ``/docs``
            needs ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``.

    Raises:
        FlowsearchError: no index there, a damaged one, or an empty ``api_key``.
    """
    guard = _auth(api_key)
    service = _Service(Path(index_dir).expanduser())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        service.searcher.close()  # release the shard files on shutdown

    import flowsearch

    app = FastAPI(
        title="flowsearch",
        version=flowsearch.__version__,
        description="Semantic search over a calibrated (BERT-flow) index.",
        default_response_class=SafeJSONResponse,
        lifespan=lifespan,
    )
    app.state.service = service

    @app.middleware("http")
    async def bounded_body(request: Request, call_next: Any) -> Response:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > MAX_BODY_BYTES):
            return _error(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
        response: Response = await call_next(request)
        return response

    @app.exception_handler(FlowsearchError)
    async def bad_input(request: Request, exc: FlowsearchError) -> Response:
        message = _one_line(str(exc), 1000)
        return _error(409 if message.startswith(_LOCKED) else 400, message)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> Response:
        return _error(422, _validation_detail(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _error(exc.status_code, _one_line(str(exc.detail)), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        LOG.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal error")

    @app.get("/health")
    def health() -> dict[str, Any]:
        """Liveness and the number of live rows (open even with an API key)."""
        return {"status": "ok", "rows": len(service.reader())}

    @app.get("/info", dependencies=guard)
    def info() -> dict[str, Any]:
        """What the served index version holds: the ``flowsearch info --json`` document."""
        return service.reader().info().to_dict()

    @app.post("/search", dependencies=guard)
    def search(body: SearchRequest) -> dict[str, Any]:
        """One query -> ``{"query", "hits", "density"}`` (as ``flowsearch query --json``);
        a list -> ``{"results": [[hit, ...], ...]}``, one hit list per query."""
        searcher = service.reader()
        if isinstance(body.query, str):
            result = searcher.query(body.query, k=body.k, where=body.where, mode=body.mode)
            return result.to_dict()
        hits = searcher.search(body.query, k=body.k, where=body.where, mode=body.mode)
        return {"results": [[hit.to_dict() for hit in per_query] for per_query in hits]}

    @app.post("/upsert", dependencies=guard)
    def upsert(body: UpsertRequest) -> dict[str, Any]:
        """Insert or replace records by id -> the library's summary (``upserted``, ...)."""
        from flowsearch import upsert as upsert_records

        summary: dict[str, Any] = service.write(
            lambda: upsert_records(service.index_dir, body.records)
        )
        return summary

    @app.post("/delete", dependencies=guard)
    def delete(body: DeleteRequest) -> dict[str, Any]:
        """Delete records by id -> ``{"deleted": n, "missing": [ids not found], "version"}``."""
        from flowsearch import delete as delete_ids

        result = service.write(lambda: delete_ids(service.index_dir, list(body.ids)))
        deleted: dict[str, Any] = result.to_dict()
        return deleted

    return app


def serve(
    index_dir: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    log_level: str = "warning",
) -> None:
    """Serve an index over HTTP until SIGTERM or Ctrl-C (what ``flowsearch serve`` runs).

    The index is opened before the port is bound, so a missing or damaged index fails at
    once. SIGTERM shuts down gracefully (requests in flight finish, files are released) and
    returns normally, so the process exits 0.

    Args:
        index_dir: the index directory.
        host: the address to bind (loopback by default: reachable from this machine only).
        port: the TCP port.
        api_key: required on every route but ``/health`` and the docs; None reads
            ``$FLOWSEARCH_API_KEY`` (unset: no key).
        log_level: uvicorn's log level (``info`` logs every request).

    Raises:
        FlowsearchError: no index, a damaged one, an empty API key, or a port that cannot be
            bound.
    """
    import uvicorn

    if api_key is None:
        api_key = os.environ.get("FLOWSEARCH_API_KEY")
    app = create_app(index_dir, api_key=api_key)
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30
    )
    server = uvicorn.Server(config)

    def stop(signum: int, frame: Any) -> None:
        # uvicorn replaces this while it runs, then restores it and re-raises the SIGTERM it
        # caught: here that is a no-op, so a graceful shutdown ends the process with code 0
        server.should_exit = True

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if in_main else None
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when it cannot bind
        if server.started:
            raise
        raise FlowsearchError(
            f"cannot listen on {host}:{port} (in use or not allowed); choose another --port"
        ) from exc
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        app.state.service.searcher.close()
