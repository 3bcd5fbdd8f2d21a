r"""``serve``: run the API with uvicorn until SIGTERM or Ctrl-C, saying where and what it serves.

On start (once the port is bound) one line on stderr gives the URL, the index, its live rows and
version, and whether a key is required; on stop, one line says it stopped. The index is opened
before the port is bound, so a missing or damaged index fails at once, and a port that cannot be
bound is one error line.

Example:
    $ flowsearch serve --index idx
    flowsearch: serving /home/me/idx (300 documents, version 1) at http://127.0.0.1:8000 (no API
    key; search page at http://127.0.0.1:8000/, docs at http://127.0.0.1:8000/docs); Ctrl-C
    stops
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

from flowsearch.errors import BadInput
from flowsearch.server.app import create_app

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from flowsearch.search.options import SearchOptions
    from flowsearch.search.searcher import Searcher

__all__ = ["serve"]


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _say(line: str) -> None:
    print(f"flowsearch: {line}", file=sys.stderr, flush=True)


def _uvicorn(app: FastAPI, host: str, port: int, log_level: str, started: str) -> uvicorn.Server:
    """A uvicorn server for ``app`` that says ``started`` once its port is bound."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:  # bound: say so (uvicorn exits instead when it cannot bind)
                _say(started)

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30
    )
    return Server(config)


def _check_host(host: str, port: int) -> None:
    """Refuse a host this machine cannot resolve (uvicorn would only say it cannot bind)."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        raise BadInput(
            f"cannot resolve host {host!r} ({why})",
            "give {host} an address such as 127.0.0.1 (this machine only) or 0.0.0.0 (every "
            "interface), or a name this machine resolves",
            cli="give --host an address such as 127.0.0.1 (this machine only) or 0.0.0.0 "
            "(every interface), or a name this machine resolves",
            param="host",
        ) from None


def _holding(searcher: Searcher) -> str:
    """What the served version holds: "100 documents (472 passages)", or "80 documents" when
    no document was cut into passages."""
    rows = len(searcher)
    docs = searcher.version.n_documents
    docs = rows if docs is None else docs
    said = f"{docs:,} document" + ("" if docs == 1 else "s")
    return said if docs == rows else f"{said} ({rows:,} passage{'' if rows == 1 else 's'})"


def serve(
    index_dir: str | os.PathLike[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    log_level: str = "warning",
    *,
    engine: str = "local",
    shards: int | None = None,
    address: str | None = None,
    options: SearchOptions | None = None,
    root: str | os.PathLike[str] | None = None,
    reranker: str | os.PathLike[str] | None = None,
) -> None:
    """Serve an index (or every index under ``root``) over HTTP until SIGTERM or Ctrl-C (what
    ``flowsearch serve`` runs).

    SIGTERM shuts down gracefully (requests in flight finish, files are released) and returns
    normally, so the process exits 0.

    Args:
        index_dir: the index directory.
        root: instead of ``index_dir``, a directory of indexes (each opened on first use;
            :mod:`flowsearch.server.indexes`).
        host: the address to bind (loopback by default: reachable from this machine only).
        port: the TCP port.
        api_key: required on every route but ``/health`` and the docs; None reads
            ``$FLOWSEARCH_API_KEY`` (unset: no key).
        log_level: uvicorn's log level (``info`` logs every request).
        engine, shards, address: how the index is searched (``engine="ray"``: its segments on
            ``shards`` Ray actors of the cluster at ``address``; see :meth:`Searcher.open`).
        options: the served Searcher's knobs (:class:`~flowsearch.search.options.SearchOptions`).
        reranker: a cross-encoder (id or directory) that reranks every search unless its body
            says ``"rerank": false`` (see :meth:`Searcher.open`).

    Raises:
        FlowsearchError: a port out of range (1 to 65535), no index, a damaged one, an empty
            API key, or a port that cannot be bound.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise BadInput(
            f"port must be a TCP port number from 1 to 65535, got {port!r}",
            "choose a port such as {port=8000}",
            param="port",
        )
    _check_host(host, port)
    if api_key is None:
        api_key = os.environ.get("FLOWSEARCH_API_KEY")
    app = create_app(index_dir, api_key=api_key, engine=engine, shards=shards, address=address,
                     options=options, root=root, reranker=reranker)  # fmt: skip
    url = _url(host, port)
    key = "API key required" if api_key else "no API key"
    if root is not None:
        indexes = app.state.indexes
        what = f"{len(indexes.entries())} indexes under {indexes.root.resolve()}"
        served = indexes.root.resolve()
    else:
        searcher = app.state.service.searcher
        what = f"{searcher.root.resolve()} ({_holding(searcher)}, version "
        what += f"{searcher.manifest.version})"
        served = searcher.root.resolve()
    started = (
        f"serving {what} at {url} ({key}; search page at {url}/, docs at {url}/docs); Ctrl-C stops"
    )

    server = _uvicorn(app, host, port, log_level, started)

    def stop(signum: int, frame: FrameType | None) -> None:
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
        raise BadInput(
            f"cannot listen on {host}:{port} (in use or not allowed)",
            "choose another {port}",
            cli="choose another --port",
            param="port",
        ) from exc
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        for service in list(app.state.services):
            service.searcher.close()
    _say(f"stopped serving {served}")
