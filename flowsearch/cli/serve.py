r"""``flowsearch serve``: the HTTP API over one index, or every index under ``--root`` (FastAPI +
uvicorn; extra ``server``).

Example:
    $ flowsearch serve --index idx --port 8000 --api-key KEY
    $ flowsearch serve --root indexes/ --api-key KEY
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Annotated

import typer

from flowsearch.cli.app import app, user_errors
from flowsearch.cli.options import DEFAULT_INDEX, IndexDir, RerankModel
from flowsearch.errors import BadInput, MissingExtra

__all__ = ["serve_cmd"]


@app.command("serve")
@user_errors
def serve_cmd(
    index: IndexDir = DEFAULT_INDEX,
    root: Annotated[
        Path | None,
        typer.Option(
            help="Serve every index directory under this one instead (/indexes/NAME/...).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="FLOWSEARCH_API_KEY",
            help="Require this key on every route but /health and the docs. Prefer setting "
            "FLOWSEARCH_API_KEY: a key given here shows in `ps` to every user of the machine.",
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(help="local: this process; ray: the segments spread over Ray actors."),
    ] = "local",
    shards: Annotated[
        int | None,
        typer.Option(
            help="With --engine ray: how many actors (capped at the segments; default one "
            "per CPU of the cluster).",
            show_default=False,
        ),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="With --engine ray: the Ray cluster to join (default $RAY_ADDRESS, else a "
            "local Ray).",
            show_default=False,
        ),
    ] = None,
    rerank: RerankModel = None,
) -> None:
    """Serve the index over HTTP until Ctrl-C or SIGTERM (prints where, and what it serves)."""
    try:
        from flowsearch.server import serve
    except ImportError as exc:
        raise MissingExtra(
            f"the server needs its extra ({exc.name} is missing)",
            "install it: pip install 'flowsearch[server]'",
        ) from None
    if root is not None and index != DEFAULT_INDEX:
        raise BadInput("pass --index (one index) or --root (every index under it), not both")
    serve(None if root is not None else index, host=host, port=port, api_key=api_key,
          engine=engine, shards=shards, address=address, root=root,
          reranker=rerank)  # fmt: skip
    # The server has stopped and released the index; the process ends now. Without this, the
    # interpreter's last garbage collection walks the whole heap (the model, the index's
    # caches) and SIGTERM took seconds to end the process; exit handlers still run.
    gc.freeze()
