r"""The HTTP API of ``flowsearch serve``: thin FastAPI routes over one :class:`Searcher`.

Every route calls the same library object a Python user has (``Searcher.query``/``info``,
:func:`flowsearch.upsert`, :func:`flowsearch.delete`) and answers with the JSON its
``to_dict()`` gives (the command line's ``--json``); the server decides nothing about search
itself. What it adds is the HTTP boundary (:mod:`flowsearch.server.boundary`: bodies bounded and
read as JSON, errors mapped once by class) and:

- typed bodies (:mod:`flowsearch.server.models`): strict requests, and response models that
  document each answer's shape in ``/openapi.json``;
- an optional API key (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``) on ``/info``,
  ``/history``, ``/space``, ``/search``, ``/upsert`` and ``/delete``; ``/health``, ``/docs``,
  ``/openapi.json`` and the search page's files (``/``, :mod:`flowsearch.server.page`) stay open
  (liveness, and pages that hold nothing of the index: their calls send the key);
- one Searcher per process, searched concurrently from FastAPI's thread pool;
- a queue for writes: the server's own writes run one at a time, in arrival order, each waiting
  its turn (no 409 between its own clients) without holding a worker thread while it waits;
  after each, the Searcher moves to the published version. Versions published by other
  processes are picked up at most :data:`REFRESH_SECONDS` later; a write while another process
  holds the index's lock is a 409.

Example:
    $ flowsearch serve --index idx --port 8000
    $ curl -s localhost:8000/search -d '{"query": "how does sourdough rise?", "k": 3}'
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Annotated, TypeVar

from fastapi import Depends, FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.params import Depends as DependsParam
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from flowsearch.errors import BadInput
from flowsearch.search.options import SearchOptions
from flowsearch.search.searcher import Searcher
from flowsearch.server.boundary import BodyGuard, SafeJSONResponse, install_error_handlers
from flowsearch.server.docs import add_docs
from flowsearch.server.models import (
    BatchResult,
    DeleteRequest,
    QueryResult,
    SearchRequest,
    SpacePictures,
    UpsertRequest,
    WriteRecord,
    WriteResult,
)
from flowsearch.server.page import add_page

__all__ = ["REFRESH_SECONDS", "Service", "create_app"]

LOG = logging.getLogger(__name__)

#: How stale the served version may be after another process (e.g. ``flowsearch upsert``)
#: published a new one; the server's own writes are served at once.
REFRESH_SECONDS = 1.0
OPENAPI_URL = "/openapi.json"

T = TypeVar("T")


class Service:
    """The process's Searcher and its write queue (what the routes share)."""

    def __init__(self, index_dir: Path, searcher: Searcher) -> None:
        self.index_dir = index_dir
        self.searcher = searcher
        self._queue = asyncio.Lock()  # FIFO: writers are served in the order they came
        self._write_lock = threading.Lock()
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

    async def write(self, func: Callable[[], T]) -> T:
        """Run one write after the ones queued before it; serve its version from then on."""
        async with self._queue:
            return await run_in_threadpool(self._write_now, func)

    def _write_now(self, func: Callable[[], T]) -> T:
        with self._write_lock:  # also one at a time for writes from other threads
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
        raise BadInput(
            "the API key is empty",
            "pass a key, or leave FLOWSEARCH_API_KEY unset",
            cli="pass a key to --api-key, or leave FLOWSEARCH_API_KEY unset",
            param="api_key",
        )
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


def create_app(
    index_dir: str | os.PathLike[str],
    api_key: str | None = None,
    *,
    engine: str = "local",
    shards: int | None = None,
    address: str | None = None,
    options: SearchOptions | None = None,
    model: str | os.PathLike[str] | None = None,
    verify: bool = False,
    mmap: bool = False,
    gpu: bool = True,
    reranker: str | os.PathLike[str] | None = None,
) -> FastAPI:
    """The FastAPI app serving one index (its Searcher is opened here, before any request).

    Args:
        index_dir: the index directory.
        api_key: when set, every route except ``/health``, ``/docs`` and ``/openapi.json``
            needs ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``.
        engine, shards, address: how the index is searched (see :meth:`Searcher.open`).
        options: the served Searcher's knobs (:class:`SearchOptions`).
        model, verify, mmap, gpu: as :meth:`Searcher.open` takes them (``model``: where the
            index's model directory is now, if it has moved).
        reranker: a cross-encoder (id or directory) reranking every search unless its body
            says ``"rerank": false``.

    Raises:
        FlowsearchError: no index there, a damaged one, or an empty ``api_key``.
    """
    guard = _auth(api_key)
    root = Path(index_dir).expanduser()
    searcher = Searcher.open(root, verify=verify, engine=engine, shards=shards, address=address,
                             options=options, model=model, mmap=mmap, gpu=gpu,
                             reranker=reranker)  # fmt: skip
    service = Service(root, searcher)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        service.searcher.close()  # release the index's files on shutdown

    from flowsearch._version import __version__

    app = FastAPI(
        title="flowsearch",
        version=__version__,
        description="Semantic search over a calibrated (BERT-flow) index.",
        default_response_class=SafeJSONResponse,
        lifespan=lifespan,
        docs_url=None,  # the CDN pages: /docs is served from local files instead
        redoc_url=None,
        openapi_url=OPENAPI_URL,
    )
    app.state.service = service
    app.add_middleware(BodyGuard)
    install_error_handlers(app)
    add_docs(app, OPENAPI_URL)
    add_page(app)
    _add_routes(app, service, guard)
    return app


def _add_routes(app: FastAPI, service: Service, guard: Sequence[DependsParam]) -> None:
    @app.get("/health")
    def health() -> dict[str, str | int]:
        """Liveness and the number of live rows (open even with an API key)."""
        return {"status": "ok", "rows": len(service.reader())}

    @app.get("/info", dependencies=guard)
    def info() -> SafeJSONResponse:
        """What the served index version holds: the ``flowsearch info --json`` document."""
        return SafeJSONResponse(service.reader().info().to_dict())

    @app.get("/history", dependencies=guard, response_model=list[WriteRecord])
    def history() -> SafeJSONResponse:
        """The writes the index has seen, oldest first (``flowsearch info --history --json``)."""
        from flowsearch.search.version import index_history

        records = index_history(service.index_dir)
        return SafeJSONResponse([r.model_dump(mode="json") for r in records])

    @app.get("/space", dependencies=guard, response_model=SpacePictures)
    def space() -> SafeJSONResponse:
        """What calibration did to the space, for the search page's pictures: the eigenvalue
        spectrum of a sample of raw and searched vectors, and the reference's histogram
        (:func:`flowsearch.search.pictures.space_pictures`; cached per version)."""
        from flowsearch.search.pictures import space_pictures

        return SafeJSONResponse(space_pictures(service.reader().version).to_dict())

    @app.post("/search", dependencies=guard, response_model=QueryResult | BatchResult)
    def search(body: SearchRequest) -> SafeJSONResponse:
        """One query -> its hits and report (as ``flowsearch query --json``); a list of
        queries -> ``{"results": [...]}``, each query's answer in that same shape. With
        ``serve --rerank MODEL`` the hits are reranked (``rerank_score``) unless
        ``"rerank": false``; ``"rerank": true`` without one is a 400."""
        queries = [body.query] if isinstance(body.query, str) else body.query
        # one call: every query of a batch is answered from the same version
        results = service.reader().query_batch(
            queries, k=body.k, where=body.where, mode=body.mode, min_score=body.min_score,
            rerank=body.rerank,
        )  # fmt: skip
        answers = [result.to_dict() for result in results]
        if isinstance(body.query, str):
            return SafeJSONResponse(answers[0])
        return SafeJSONResponse({"results": answers})

    @app.post("/upsert", dependencies=guard, response_model=WriteResult)
    async def upsert(body: UpsertRequest) -> SafeJSONResponse:
        """Insert or replace records by id -> the write's :class:`WriteResult` (``n_written``,
        ``n_inserted``, ``n_replaced``, ``drift``, ...), as ``flowsearch upsert --json``."""
        from flowsearch.writes.upsert import upsert as upsert_records

        # the server's own encoder: a write never loads a second copy of the model
        encoder = service.searcher.encoder
        result = await service.write(
            lambda: upsert_records(service.index_dir, body.records, encoder=encoder, wait=body.wait)
        )
        return SafeJSONResponse(result.to_dict())

    @app.post("/delete", dependencies=guard, response_model=WriteResult)
    async def delete(body: DeleteRequest) -> SafeJSONResponse:
        """Delete records by id -> the write's :class:`WriteResult` (``n_deleted``, ``missing``:
        the ids not found, ``version``), as ``flowsearch delete --json``."""
        from flowsearch.writes.delete import delete as delete_ids

        result = await service.write(
            lambda: delete_ids(service.index_dir, list(body.ids), wait=body.wait)
        )
        return SafeJSONResponse(result.to_dict())
