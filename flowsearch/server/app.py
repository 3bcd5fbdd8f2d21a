r"""The HTTP API of ``flowsearch serve``: thin FastAPI routes over one :class:`Searcher`.

Every route calls the same library object a Python user has (``Searcher.query``/``info``,
:func:`flowsearch.upsert`, :func:`flowsearch.delete`) and answers with the JSON its
``to_dict()`` gives (the command line's ``--json``); the server decides nothing about search
itself. What it adds is the HTTP boundary (:mod:`flowsearch.server.boundary`: bodies bounded and
read as JSON, errors mapped once by class) and:

- typed bodies (:mod:`flowsearch.server.models`): strict requests, and response models that
  document each answer's shape in ``/openapi.json``;
- an optional API key (``Authorization: Bearer KEY`` or ``X-API-Key: KEY``) on ``/info``,
  ``/history``, ``/space``, ``/search``, ``/upsert``, ``/delete``, ``/metrics`` and
  ``/indexes...``; ``/health``, ``/docs``,
  ``/openapi.json`` and the search page's files (``/``, :mod:`flowsearch.server.page`) stay open
  (liveness, and pages that hold nothing of the index: their calls send the key);
- one Searcher per served index (:class:`~flowsearch.server.service.Service`), searched
  concurrently from FastAPI's thread pool;
- a queue for writes: the server's own writes run one at a time, in arrival order, each waiting
  its turn (no 409 between its own clients) without holding a worker thread while it waits;
  after each, the Searcher moves to the published version. Versions published by other
  processes are picked up at most :data:`REFRESH_SECONDS` later; a write while another process
  holds the index's lock is a 409;
- one index's routes written once (:func:`_index_routes`): at the top with ``--index``, under
  ``/indexes/{name}`` with ``--root`` (:mod:`flowsearch.server.indexes`: the listing, the
  builds, the name checks);
- ``GET /metrics`` on every server (:mod:`flowsearch.server.metrics`).

Example:
    $ flowsearch serve --index idx --port 8000
    $ curl -s localhost:8000/search -d '{"query": "how does sourdough rise?", "k": 3}'
    $ flowsearch serve --root indexes/ --port 8000
    $ curl -s localhost:8000/indexes/news/search -d '{"query": "tides"}'
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi.params import Depends as DependsParam
from fastapi.responses import PlainTextResponse, Response
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from flowsearch.errors import BadInput
from flowsearch.search.options import SearchOptions
from flowsearch.search.rerank import Reranker
from flowsearch.search.searcher import Searcher
from flowsearch.server.boundary import BodyGuard, SafeJSONResponse, install_error_handlers
from flowsearch.server.docs import add_docs
from flowsearch.server.indexes import IndexRoot, add_index_routes
from flowsearch.server.metrics import CONTENT_TYPE, Metrics
from flowsearch.server.models import (
    BatchResult,
    DeleteRequest,
    QueryResult,
    SearchRequest,
    SpacePictures,
    UpsertRequest,
    WriteRecord,
    WriteResult,
    error_responses,
)
from flowsearch.server.page import add_page
from flowsearch.server.service import REFRESH_SECONDS, Service

__all__ = ["REFRESH_SECONDS", "Service", "create_app"]

LOG = logging.getLogger(__name__)

OPENAPI_URL = "/openapi.json"

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
    expected = api_key.encode("utf-8", "surrogateescape")  # an environment's bytes as they were

    def check(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
        x_api_key: Annotated[str | None, Depends(_X_API_KEY)],
    ) -> None:
        given = [credentials.credentials if credentials else None, x_api_key]
        # compare every candidate (no early exit) in constant time, as bytes: the header's own
        # bytes (Starlette decodes them as Latin-1, which gives them back) against the key's UTF-8
        ok = [hmac.compare_digest(g.encode("latin-1"), expected) for g in given if g is not None]
        if not any(ok):
            raise HTTPException(
                401,
                "missing or wrong API key; send Authorization: Bearer KEY or X-API-Key: KEY",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return [Depends(check)]


def create_app(
    index_dir: str | os.PathLike[str] | None = None,
    api_key: str | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
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
    """The FastAPI app serving one index (its Searcher is opened here, before any request),
    or every index under ``root`` (:mod:`flowsearch.server.indexes`: each opened on first use).

    Args:
        index_dir: the index directory (routes ``/search``, ``/info``, ...).
        root: instead of ``index_dir``, a directory of index directories (routes
            ``/indexes``, ``/indexes/{name}/search``, ...).
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
    if (index_dir is None) == (root is None):
        raise BadInput("serve one index or a root of indexes", "pass {index_dir} or {root}")
    services: list[Service] = []
    metrics = Metrics(lambda: [(s.name, s.searcher) for s in services])
    catalog = None
    loaded = None
    if reranker is not None:  # loaded once, shared by every index served
        loaded = Reranker.load(reranker)
    if root is not None:
        if engine != "local":
            raise BadInput("a root of indexes is served locally", "leave {engine} out")
        opener = functools.partial(Searcher.open, verify=verify, options=options, mmap=mmap,
                                   gpu=gpu, reranker=loaded)  # fmt: skip
        catalog = IndexRoot(Path(root).expanduser(), opener, metrics, services)
    else:
        assert index_dir is not None
        path = Path(index_dir).expanduser()
        searcher = Searcher.open(path, verify=verify, engine=engine, shards=shards,
                                 address=address, options=options, model=model, mmap=mmap,
                                 gpu=gpu, reranker=loaded)  # fmt: skip
        services.append(Service(path, searcher, metrics))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        for service in list(services):
            service.searcher.close()  # release the indexes' files on shutdown

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
    app.state.metrics = metrics
    app.state.services = services  # every open index (closed on shutdown)
    app.add_middleware(BodyGuard)
    install_error_handlers(app)
    add_docs(app, OPENAPI_URL)
    add_page(app)
    _add_metrics(app, metrics, guard)
    if catalog is not None:
        app.state.indexes = catalog
        add_index_routes(app, catalog, guard)
        # a bad name is a 400, a name with no index a 404, on every route of an index
        app.include_router(_index_routes(catalog.service, guard), prefix="/indexes/{name}",
                           responses=error_responses(400, 404))  # fmt: skip
    else:
        app.state.service = services[0]
        _add_routes(app, services[0], guard)
    return app


def _add_metrics(app: FastAPI, metrics: Metrics, guard: Sequence[DependsParam]) -> None:
    @app.get("/metrics", dependencies=guard, response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {}}}})  # fmt: skip
    def scrape() -> Response:
        """What the server did (searches, writes, latencies, refreshes) and what it serves
        (rows, segments per index), in the Prometheus text format."""
        return Response(metrics.render(), media_type=CONTENT_TYPE)


def _add_routes(app: FastAPI, service: Service, guard: Sequence[DependsParam]) -> None:
    @app.get("/health")
    @app.head("/health", include_in_schema=False)  # what uptime probes send
    def health() -> dict[str, str | int]:
        """Liveness and the number of live rows (open even with an API key)."""
        return {"status": "ok", "rows": len(service.reader())}

    app.include_router(_index_routes(lambda: service, guard))


def _index_routes(resolve: Callable[..., Service], guard: Sequence[DependsParam]) -> APIRouter:
    """The routes of one index, which ``resolve`` (a dependency) names: the one served, or the
    one the path's ``{name}`` names under a root."""
    router = APIRouter()
    served = Depends(resolve)  # each route's Service
    key = (401,) if guard else ()  # the error statuses each route documents in /openapi.json
    read, body, write = error_responses(*key), (400, *key, 413, 422), (409,)

    @router.get("/info", dependencies=guard, responses=read)
    def info(service: Service = served) -> SafeJSONResponse:
        """What the served index version holds: the ``flowsearch info --json`` document."""
        return SafeJSONResponse(service.reader().info().to_dict())

    @router.get("/history", dependencies=guard, response_model=list[WriteRecord], responses=read)
    def history(service: Service = served) -> SafeJSONResponse:
        """The writes the index has seen, oldest first (``flowsearch info --history --json``)."""
        from flowsearch.search.version import index_history

        records = index_history(service.index_dir)
        return SafeJSONResponse([r.model_dump(mode="json") for r in records])

    @router.get("/space", dependencies=guard, response_model=SpacePictures, responses=read)
    def space(service: Service = served) -> SafeJSONResponse:
        """What calibration did to the space, for the search page's pictures: the eigenvalue
        spectrum of a sample of raw and searched vectors, and the reference's histogram
        (:func:`flowsearch.search.pictures.space_pictures`; cached per version)."""
        from flowsearch.search.pictures import space_pictures

        return SafeJSONResponse(space_pictures(service.reader().version).to_dict())

    @router.post("/search", dependencies=guard, response_model=QueryResult | BatchResult,
                 responses=error_responses(*body))  # fmt: skip
    def search(body: SearchRequest, service: Service = served) -> SafeJSONResponse:
        """One query -> its hits and report (as ``flowsearch query --json``); a list of
        queries -> ``{"results": [...]}``, each query's answer in that same shape. With
        ``serve --rerank MODEL`` the hits are reranked (``rerank_score``) unless
        ``"rerank": false``; ``"rerank": true`` without one is a 400."""
        queries = [body.query] if isinstance(body.query, str) else body.query
        searcher = service.reader()
        # one call: every query of a batch is answered from the same version
        with service.metrics.searching(service.name, body.mode or searcher.default_mode):
            results = searcher.query_batch(
                queries, k=body.k, where=body.where, mode=body.mode, min_score=body.min_score,
                rerank=body.rerank,
            )  # fmt: skip
        answers = [result.to_dict() for result in results]
        if isinstance(body.query, str):
            return SafeJSONResponse(answers[0])
        return SafeJSONResponse({"results": answers})

    @router.post("/upsert", dependencies=guard, response_model=WriteResult,
                 responses=error_responses(*body, *write))  # fmt: skip
    async def upsert(body: UpsertRequest, service: Service = served) -> SafeJSONResponse:
        """Insert or replace records by id -> the write's :class:`WriteResult` (``n_written``,
        ``n_inserted``, ``n_replaced``, ``drift``, ...), as ``flowsearch upsert --json``."""
        from flowsearch.writes.upsert import upsert as upsert_records

        # the server's own encoder: a write never loads a second copy of the model
        encoder = service.searcher.encoder
        with service.metrics.writing(service.name, "upsert"):
            result = await service.write(
                lambda: upsert_records(
                    service.index_dir, body.records, encoder=encoder, wait=body.wait
                )
            )
        return SafeJSONResponse(result.to_dict())

    @router.post("/delete", dependencies=guard, response_model=WriteResult,
                 responses=error_responses(*body, *write))  # fmt: skip
    async def delete(body: DeleteRequest, service: Service = served) -> SafeJSONResponse:
        """Delete records by id -> the write's :class:`WriteResult` (``n_deleted``, ``missing``:
        the ids not found, ``version``), as ``flowsearch delete --json``."""
        from flowsearch.writes.delete import delete as delete_ids

        with service.metrics.writing(service.name, "delete"):
            result = await service.write(
                lambda: delete_ids(service.index_dir, list(body.ids), wait=body.wait)
            )
        return SafeJSONResponse(result.to_dict())

    return router
