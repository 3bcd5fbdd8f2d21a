r"""The HTTP boundary: bodies read with a bound, JSON whatever the content type says, errors mapped.

- :class:`BodyGuard` (ASGI middleware) counts a request body's bytes as they arrive, so a
  chunked body is held to :data:`~flowsearch.server.models.MAX_BODY_BYTES` as well as one with a
  Content-Length (413 either way, closing the connection), and reads a POST body as JSON
  whatever its Content-Type says: the API takes nothing else, and ``curl -d`` sends
  ``application/x-www-form-urlencoded``.
- :func:`install_error_handlers` maps errors once: a
  :class:`~flowsearch.errors.FlowsearchError` to its class's ``http_status`` (a plain one, bad
  input, to 400) with its message as HTTP spells the fix (``"overwrite": true``); a refused body
  to 422 naming the field; anything else to a logged 500 ``internal error`` without a traceback.
  Every error body is ``{"detail": "<one line>"}``.

Example:
    >>> one_line("a\n  b", 10)
    'a b'
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from flowsearch.errors import FlowsearchError
from flowsearch.jsonable import json_safe
from flowsearch.server.models import MAX_BODY_BYTES

__all__ = ["BodyGuard", "SafeJSONResponse", "error_response", "install_error_handlers", "one_line"]

LOG = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SafeJSONResponse(JSONResponse):
    """JSON that never fails to render and reads as ``--json`` does: NaN/inf become null, numpy
    scalars plain numbers, anything else JSON does not know (dates, bytes) its ``str``."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(json_safe(content), ensure_ascii=False, allow_nan=False, default=str)
        return text.encode("utf-8")


def error_response(
    status: int, detail: str, headers: dict[str, str] | None = None
) -> SafeJSONResponse:
    """``{"detail": detail}`` with ``status``."""
    return SafeJSONResponse({"detail": detail}, status_code=status, headers=headers)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class BodyGuard:
    """ASGI middleware: a request body of at most ``max_bytes`` (counted as it streams in),
    read as JSON on POST whatever its Content-Type.

    The body is read whole before the app sees it (the app reads it whole anyway). A body
    that grows past the bound is not kept: the rest is read and dropped, up to twice the bound,
    so the client, which sends its whole body before it reads an answer, gets the 413 (not a
    reset connection); a body longer still, or one that declares a length over the bound, is
    answered at once. A 413 closes the connection, so nothing after it is parsed.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._too_large(scope, receive, send)
            return
        body, dropped = bytearray(), 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left: nobody to answer
            if dropped:
                dropped += len(message.get("body", b""))
            else:
                body += message.get("body", b"")
                if len(body) > self.max_bytes:  # too large: read the rest, but keep nothing
                    dropped, body = len(body), bytearray()
            if dropped > 2 * self.max_bytes:  # it goes on: stop reading it
                await self._too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        if dropped:
            await self._too_large(scope, receive, send)
            return
        if scope["method"] == "POST":
            headers.append((b"content-type", b"application/json"))
        else:
            headers = list(scope.get("headers", []))
        await self.app({**scope, "headers": headers}, _replay(bytes(body), receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        # and close the connection: what is left of the body is never parsed (uvicorn's h11
        # protocol, parsing it after an early answer, logged a traceback on a malformed rest)
        response = error_response(
            413,
            f"the request body is larger than {self.max_bytes} bytes; send less per request",
            headers={"connection": "close"},
        )
        await response(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read ahead once, then waits on the client's."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# A step of pydantic's error location that names a member of a union (``constrained-str``,
# ``list[constrained-str]``, ``int``), not a field the client sent.
_UNION_MEMBER = re.compile(r"^(constrained-\w+|\w+\[.*\]|str|int|float|bool|list|dict)$")


def _validation_detail(exc: RequestValidationError) -> str:
    """The first few problems of a refused body, each as ``field: message``: a body that is
    not JSON says so, and a field that may take several forms (a query or a list of queries)
    is named once, its members' messages joined by "or"."""
    errors = exc.errors()
    broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if broken is not None:
        why = (broken.get("ctx") or {}).get("error", "JSON decode error")
        return one_line(f"the body is not valid JSON ({why}); send one JSON object", 300)
    by_field: dict[str, list[str]] = {}
    for err in errors:
        parts = [str(p) for p in err.get("loc", ()) if p != "body"]
        loc = ".".join(p for p in parts if not _UNION_MEMBER.match(p))
        msg = err.get("msg", "invalid")
        if msg not in by_field.setdefault(loc, []):
            by_field[loc].append(msg)
    problems = [
        one_line(f"{loc}: {' or '.join(msgs)}" if loc else " or ".join(msgs), 200)
        for loc, msgs in list(by_field.items())[:3]
    ]
    more = len(by_field) - len(problems)
    return "invalid request: " + "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


def install_error_handlers(app: FastAPI) -> None:
    """Map every error a route can raise to ``{"detail": ...}`` with its status (see above)."""

    @app.exception_handler(FlowsearchError)
    async def flowsearch_error(request: Request, exc: FlowsearchError) -> Response:
        return error_response(exc.http_status, one_line(exc.render("http"), 1000))

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> Response:
        return error_response(422, _validation_detail(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = getattr(exc, "headers", None)
        return error_response(exc.status_code, one_line(str(exc.detail)), headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        LOG.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal error")
