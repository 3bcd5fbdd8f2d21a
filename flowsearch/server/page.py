r"""``/``: the search page, served from static files shipped in the package (no CDN, no build).

The page (``static/index.html``, ``page.js``, ``page.css``: plain HTML, CSS and JavaScript)
searches through ``POST /search`` and shows the index through ``GET /info``, ``GET /history``
and ``GET /space`` (the pictures' numbers, computed by :mod:`flowsearch.search.pictures`). The
page's own files hold nothing of the index, so they are served without the API key, like
``/docs``; every call the page makes for data sends the key (``X-API-Key``) the user typed into
it or passed in the URL's fragment (``/#key=KEY``), kept in the tab's ``sessionStorage``.

Example:
    >>> sorted(PAGE_FILES)
    ['index.html', 'page.css', 'page.js']
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response

from flowsearch.server.boundary import error_response

__all__ = ["PAGE_FILES", "STATIC_DIR", "STATIC_URL", "add_page"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_URL = "/static"
#: The files the page is made of, and their media types (nothing else of the package is served).
PAGE_FILES = {
    "index.html": "text/html; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
}
#: The page may load only its own files and call only this server.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def add_page(app: FastAPI) -> None:
    """Serve the page at ``/`` and its files under :data:`STATIC_URL`."""

    def send(name: str) -> Response:
        path = STATIC_DIR / name
        if name not in PAGE_FILES or not path.is_file():
            return error_response(404, "Not Found")
        return FileResponse(path, media_type=PAGE_FILES[name], headers=_HEADERS)

    @app.get("/", include_in_schema=False)
    def page() -> Response:
        return send("index.html")

    @app.get(STATIC_URL + "/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        return send(name)
