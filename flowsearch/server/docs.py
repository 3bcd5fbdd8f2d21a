r"""``/docs``: Swagger UI served from this machine, so the API's page works offline.

FastAPI's default page loads Swagger UI from a CDN (blank without a network). Here its
JavaScript, stylesheet and icon come from the ``swagger-ui-bundle-v2`` package (Swagger UI 5,
which reads the OpenAPI 3.1 schema FastAPI writes; the ``server`` extra installs it) and are
served under ``/docs/assets/``. ``/docs``, its assets and ``/openapi.json`` need no API key: they
describe the API and hold nothing of the index (no rows, no paths, no model); the page's
*Authorize* button takes the key for the calls it makes.

Example:
    >>> ASSETS_URL
    '/docs/assets'
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from flowsearch.errors import MissingExtra
from flowsearch.server.boundary import error_response

__all__ = ["ASSETS_URL", "DOCS_URL", "add_docs", "swagger_ui_dir"]

DOCS_URL = "/docs"
ASSETS_URL = "/docs/assets"
_ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")


def swagger_ui_dir() -> Path:
    """The directory of the installed Swagger UI files.

    Raises:
        MissingExtra: the package that ships them is not installed.
    """
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        raise MissingExtra(
            "the API page needs Swagger UI (package swagger-ui-bundle-v2)",
            "install the server extra: pip install 'flowsearch[server]'",
        ) from None
    return Path(str(swagger_ui_path))


def add_docs(app: FastAPI, openapi_url: str) -> None:
    """Serve Swagger UI at :data:`DOCS_URL` and its files under :data:`ASSETS_URL`.

    Args:
        app: an app made with ``docs_url=None`` and ``redoc_url=None`` (no CDN pages).
        openapi_url: where the app serves its schema.
    """
    try:
        root: Path | None = swagger_ui_dir()
    except MissingExtra as exc:
        root, missing = None, exc

    @app.get(DOCS_URL, include_in_schema=False)
    def docs() -> Response:
        if root is None:
            return error_response(missing.http_status, missing.render("http"))
        page: HTMLResponse = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon-32x32.png",
        )
        return page

    @app.get(ASSETS_URL + "/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        # only the three files the page loads: nothing else of the package is served
        if root is None or name not in _ASSETS:
            return error_response(404, "Not Found")
        from fastapi.responses import FileResponse

        return FileResponse(root / name)
