r"""The errors users see: a small hierarchy, each told in one line with its fix.

Every error flowsearch raises on purpose is a :class:`FlowsearchError` (a ``ValueError``): a
problem the caller can fix, never a bug. Its subclasses say what kind of problem it is, so each
surface maps it once (the command line to an exit code, the server to an HTTP status) instead of
reading the message:

==========================  =====================================================  ====  =====
class                       when                                                   exit  HTTP
==========================  =====================================================  ====  =====
:class:`BadInput`           an argument, a record, a corpus, a filter is wrong       2    400
:class:`NotFound`           no index (or no model, no data) where one was named      2    404
:class:`IndexLocked`        another process holds the index's writer lock            2    409
:class:`IndexDamaged`       a file of the index is missing, changed or unreadable    2    500
:class:`WriteFailed`        the disk refused a write (full, permissions)             2    507
:class:`MissingExtra`       an optional dependency is not installed                  2    501
:class:`Unavailable`        a part of a distributed index did not answer in time     2    503
==========================  =====================================================  ====  =====

A message names the problem and how to fix it. The fix differs per surface (a Python keyword
argument, a command-line flag, a JSON field): an error built with ``param=`` names the offending
parameter, and :meth:`FlowsearchError.render` writes its fix for the surface asked, e.g.
``pass overwrite=True`` in Python, ``pass --overwrite`` on the command line.

Example:
    >>> err = BadInput("an index already exists at idx", fix="pass {overwrite=True} to replace it",
    ...                param="overwrite")
    >>> str(err)
    'an index already exists at idx; pass overwrite=True to replace it'
    >>> err.render("cli")
    'an index already exists at idx; pass --overwrite to replace it'
    >>> err.render("http")
    'an index already exists at idx; pass "overwrite": true to replace it'
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

__all__ = [
    "BadInput",
    "FlowsearchError",
    "IndexDamaged",
    "IndexLocked",
    "MissingExtra",
    "NotFound",
    "Surface",
    "Unavailable",
    "WriteFailed",
]

#: Where an error is shown: Python (the library), the command line, or the HTTP API.
Surface = Literal["python", "cli", "http"]

# ``{name=value}`` in a fix: a parameter as each surface spells it.
_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:=([^{}]*))?\}")


def _spell(name: str, value: str | None, surface: Surface) -> str:
    if surface == "cli":
        flag = "--" + name.replace("_", "-")
        if value in (None, "", "True"):
            return flag
        if value == "False":
            return "--no-" + name.replace("_", "-")
        return f"{flag} {value.strip(chr(39))}"
    if surface == "http":
        if value is None:
            return f'"{name}"'
        shown = {"True": "true", "False": "false", "None": "null"}.get(value, value)
        return f'"{name}": {shown}'
    return name if value is None else f"{name}={value}"


class FlowsearchError(ValueError):
    r"""A problem with what the caller gave us (a path, a column, an option), not a bug.

    Args:
        problem: what is wrong, in one line.
        fix: how to fix it; ``{name}`` or ``{name=value}`` spell a parameter per surface.
        param: the parameter (keyword argument, flag, JSON field) at fault, if one is.
        cli: a fix for the command line only (instead of ``fix``).
        http: a fix for the HTTP API only.

    Attributes:
        exit_code: the command line's exit code for it.
        http_status: the HTTP status the server answers with.
    """

    exit_code: ClassVar[int] = 2
    http_status: ClassVar[int] = 400

    def __init__(
        self,
        problem: str,
        fix: str | None = None,
        *,
        param: str | None = None,
        cli: str | None = None,
        http: str | None = None,
    ) -> None:
        self.problem = " ".join(str(problem).split())
        self.fix = fix
        self.param = param
        self._fixes: dict[str, str | None] = {"python": fix, "cli": cli or fix, "http": http or fix}
        super().__init__(self.render("python"))

    def render(self, surface: Surface = "python") -> str:
        """The one-line message as ``surface`` shows it (its own spelling of the fix)."""
        fix = self._fixes.get(surface)
        if not fix:
            return self.problem
        fix = _PARAM.sub(lambda m: _spell(m.group(1), m.group(2), surface), fix)
        return f"{self.problem}; {' '.join(fix.split())}"

    def __reduce__(self) -> tuple[object, ...]:  # picklable across processes (Ray, fork)
        return (_rebuild, (type(self), self.problem, self.fix, self.param, self._fixes))


def _rebuild(
    cls: type[FlowsearchError],
    problem: str,
    fix: str | None,
    param: str | None,
    fixes: dict[str, str | None],
) -> FlowsearchError:
    err = cls(problem, fix, param=param, cli=fixes.get("cli"), http=fixes.get("http"))
    return err


class BadInput(FlowsearchError):
    """An argument, a record, a corpus or a filter is wrong (exit 2, HTTP 400)."""


class NotFound(FlowsearchError):
    """No index, model or data where one was named (exit 2, HTTP 404)."""

    http_status = 404


class IndexLocked(FlowsearchError):
    """Another process holds the index's writer lock (exit 2, HTTP 409)."""

    http_status = 409


class IndexDamaged(FlowsearchError):
    """A file of the index is missing, changed or unreadable (exit 2, HTTP 500)."""

    http_status = 500


class WriteFailed(FlowsearchError):
    """The disk refused a write: full, read-only or not permitted (exit 2, HTTP 507)."""

    http_status = 507


class MissingExtra(FlowsearchError):
    """An optional dependency (an extra such as ``server`` or ``ray``) is missing (HTTP 501)."""

    http_status = 501


class Unavailable(FlowsearchError):
    """A part of an index served from several processes (a Ray shard) did not answer in time
    or was lost, so no whole answer exists; retrying may succeed (exit 2, HTTP 503)."""

    http_status = 503
