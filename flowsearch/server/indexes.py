r"""``flowsearch serve --root DIR``: every index directory under DIR behind one server.

:class:`IndexRoot` finds the indexes (the directories right under the root that hold a
manifest), opens each on its first request and keeps it open (a :class:`Service`: its Searcher
and write queue, the same one ``serve --index`` has), and builds new ones. An index made under
the root by another process is served from its first request, without a restart.

Names are checked before anything is read: letters, digits, ``.``, ``_`` and ``-``, at most
:data:`~flowsearch.server.models.MAX_NAME_CHARS`, not starting with ``.`` (so never ``..`` and
never a path); a name whose directory is a link leading out of the root is refused. A bad name
is a 400, a name with no index a 404, a build over an existing name a 409, each one line.

Routes (:func:`add_index_routes`; each index's own are ``serve --index``'s under
``/indexes/{name}``, from the same code): ``GET /indexes`` lists the indexes (name, live rows,
documents, model, default mode, version), ``POST /indexes/{name}`` builds one from records.

Example:
    >>> check_name("news-2024")
    'news-2024'
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.params import Depends as DependsParam
from pydantic import BaseModel, ConfigDict

from flowsearch.errors import BadInput, FlowsearchError, NotFound
from flowsearch.search.searcher import Searcher
from flowsearch.search.version import live_documents
from flowsearch.server.boundary import SafeJSONResponse
from flowsearch.server.metrics import Metrics
from flowsearch.server.models import (
    MAX_NAME_CHARS,
    CreateRequest,
    ErrorDetail,
    WriteResult,
    error_responses,
)
from flowsearch.server.service import Service
from flowsearch.storage import manifest as mf

__all__ = ["NAME_PATTERN", "IndexEntry", "IndexRoot", "add_index_routes", "check_name"]

#: What an index's name may be.
NAME_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}")


class IndexEntry(BaseModel):
    """One index of ``GET /indexes``."""

    model_config = ConfigDict(frozen=True)
    name: str
    #: live rows (passages) and live documents
    rows: int
    documents: int | None
    model: str
    #: the mode a search without one uses (``hybrid`` with a lexical side, else ``dense``)
    mode: str
    version: int
    #: whether this server has it open already
    open: bool


def check_name(name: str) -> str:
    """``name`` if it may name an index.

    Raises:
        BadInput: it may not (one line saying what a name may be).
    """
    if not NAME_PATTERN.fullmatch(name):
        raise BadInput(
            f"{name[:MAX_NAME_CHARS]!r} is not an index name: use letters, digits, '.', '_' and "
            f"'-', at most {MAX_NAME_CHARS} characters, not starting with '.'",
            "choose another name",
        )
    return name


class IndexRoot:
    """The indexes under one directory, opened on first use and kept open.

    Args:
        root: the directory whose subdirectories are the indexes.
        open_searcher: opens one index (``Searcher.open`` with the server's options).
        metrics: the app's metrics (each Service counts into them).
        services: the app's list of open services (appended to as indexes open).
    """

    def __init__(
        self,
        root: Path,
        open_searcher: Callable[[Path], Searcher],
        metrics: Metrics,
        services: list[Service],
    ) -> None:
        if not root.is_dir():
            raise NotFound(
                f"no directory at {root} to serve the indexes of",
                "pass an existing directory to {root}",
                cli="pass an existing directory to --root",
            )
        self.root = root
        self._resolved = root.resolve()
        self._open_searcher = open_searcher
        self._metrics = metrics
        self._services = services
        self._open: dict[str, Service] = {}
        self._lock = threading.Lock()
        self._building = asyncio.Lock()

    def path_of(self, name: str) -> Path:
        """The directory of index ``name`` (which may not exist yet).

        Raises:
            BadInput: a bad name, or a link that leads out of the root.
        """
        path = self.root / check_name(name)
        if path.is_symlink() and path.resolve().parent != self._resolved:
            raise BadInput(f"index {name!r} is a link leading out of the served root")
        return path

    def service(self, name: str) -> Service:
        """Index ``name``'s Service (opened now if this is its first request).

        Raises:
            BadInput: a bad name. NotFound: no index of that name.
        """
        found = self._open.get(name)
        if found is not None:
            return found
        path = self.path_of(name)
        with self._lock:
            found = self._open.get(name)
            if found is not None:
                return found
            if not mf.is_index_dir(path):
                raise NotFound(
                    f"no index named {name!r} is served here",
                    "GET /indexes lists them; POST /indexes/NAME builds one",
                )
            service = Service(path, self._open_searcher(path), self._metrics, name)
            self._open[name] = service
            self._services.append(service)
            return service

    def entries(self) -> list[IndexEntry]:
        """Every index under the root, by name (a damaged one is left out of the list; its
        own routes say what is wrong)."""
        out = []
        for path in sorted(self.root.iterdir()):
            name = path.name
            if not NAME_PATTERN.fullmatch(name) or not mf.is_index_dir(path):
                continue
            try:
                out.append(self._entry(name, path))
            except (FlowsearchError, OSError):
                continue
        return out

    def _entry(self, name: str, path: Path) -> IndexEntry:
        service = self._open.get(name)
        if service is not None:
            version = service.reader().version
            manifest, documents = version.manifest, version.n_documents
        else:
            self.path_of(name)  # no link out of the root
            manifest = mf.read(path)
            documents = live_documents(path, manifest)
        return IndexEntry(
            name=name,
            rows=manifest.n_live,
            documents=documents,
            model=manifest.encoder.model,
            mode="hybrid" if manifest.lexical is not None else "dense",
            version=manifest.version,
            open=service is not None,
        )

    async def create(self, name: str, body: CreateRequest) -> WriteResult:
        """Build index ``name`` from ``body``'s records (one build at a time).

        Raises:
            HTTPException: 409, the name is taken. BadInput, NotFound: as the build says.
        """
        from flowsearch.writes.build import build_index

        path = self.path_of(name)
        model, pooling, max_length = None, "mean", None
        if body.like is not None:
            encoder = self.service(body.like).searcher.manifest.encoder
            model, pooling, max_length = encoder.model, encoder.pooling, encoder.max_length
        async with self._building:
            if path.exists() or path.is_symlink():
                raise HTTPException(
                    409, f"an index named {name!r} already exists; choose another name"
                )
            with self._metrics.writing(name, "create"):
                return await run_in_threadpool(
                    build_index, body.records, path, text_column=body.text_column,
                    id_column=body.id_column, model=model, pooling=pooling,
                    max_length=max_length, calibration=body.calibration, wait=body.wait,
                )  # fmt: skip


def add_index_routes(app: FastAPI, indexes: IndexRoot, guard: Sequence[DependsParam]) -> None:
    """``GET /health``, ``GET /indexes`` and ``POST /indexes/{name}`` of a root's server."""

    @app.get("/health")
    def health() -> dict[str, str | int]:
        """Liveness, the number of indexes and their live rows (open even with an API key)."""
        entries = indexes.entries()
        return {"status": "ok", "indexes": len(entries), "rows": sum(e.rows for e in entries)}

    key = (401,) if guard else ()  # the error statuses each route documents in /openapi.json
    taken: dict[int | str, dict[str, Any]] = {
        409: {"model": ErrorDetail, "description": "An index of that name exists already"}
    }

    @app.get("/indexes", dependencies=guard, response_model=list[IndexEntry],
             responses=error_responses(*key))  # fmt: skip
    def list_indexes() -> SafeJSONResponse:
        """The indexes served (every index directory under the root), by name."""
        return SafeJSONResponse([e.model_dump(mode="json") for e in indexes.entries()])

    @app.post("/indexes/{name}", dependencies=guard, response_model=WriteResult, status_code=201,
              responses={**error_responses(400, *key, 404, 413, 422), **taken})  # fmt: skip
    async def create(name: str, body: CreateRequest) -> SafeJSONResponse:
        """Build a new index ``name`` from records (as ``/upsert`` takes them), encoded as the
        index ``like`` is (default: the bundled model) -> the build's :class:`WriteResult`;
        409 if the name is taken."""
        result = await indexes.create(name, body)
        return SafeJSONResponse(result.to_dict(), status_code=201)
