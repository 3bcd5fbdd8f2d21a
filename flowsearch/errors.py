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

The public API checks its arguments' types with the helpers here (:func:`check_path`,
:func:`check_bool`, :func:`check_int`, :func:`check_text`), so a wrong type is one
:class:`BadInput` naming the parameter, never a ``TypeError`` from deep inside:

    >>> try:
    ...     check_bool("no", "overwrite")
    ... except BadInput as exc:
    ...     print(exc.render("cli"))
    overwrite must be True or False, got 'no'; pass --overwrite or --no-overwrite
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

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
    "check_bool",
    "check_int",
    "check_path",
    "check_text",
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


# --- argument checks of the public API -----------------------------------------------------


def check_path(value: object, param: str = "index_dir", what: str = "a directory") -> Path:
    """``value`` as a :class:`~pathlib.Path` (``~`` expanded), when it is a ``str`` or an
    ``os.PathLike`` of one that the file system can take (no NUL, no lone surrogate).

    Raises:
        BadInput: anything else (None, a number, bytes, a list, ...), naming ``param``.
    """
    fix = f"pass {what} as a str or pathlib.Path"
    if isinstance(value, os.PathLike) and not isinstance(value, Path):
        value = os.fspath(value)
    if not isinstance(value, (str, Path)) or value == "":
        shown = "an empty string" if value == "" else f"{type(value).__name__} {value!r:.60}"
        raise BadInput(f"{param} must be a path, got {shown}", fix, param=param)
    text = str(value)
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise BadInput(f"{param} {text!a} holds a character no file name can", fix) from None
    if "\0" in text:
        raise BadInput(f"{param} {text!a} holds a NUL character", fix, param=param)
    return Path(text).expanduser()


def check_bool(value: object, param: str) -> bool:
    """``value`` when it is a ``bool`` (NumPy's too); a string such as ``"no"`` is refused
    rather than taken as true.

    Raises:
        BadInput: anything else, naming ``param``.
    """
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if isinstance(value, bool) or numpy_bool:
        return bool(value)
    raise BadInput(
        f"{param} must be True or False, got {value!r:.60}",
        f"pass {{{param}=True}} or {{{param}=False}}",
        param=param,
    )


def check_int(value: Any, param: str, minimum: int) -> int:
    """``value`` when it is an integer (not a bool, not a string) >= ``minimum``.

    Raises:
        BadInput: anything else, naming ``param``.
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        got = f"{type(value).__name__} {value!r:.60}"
    elif int(value.__index__()) < minimum:
        got = repr(int(value.__index__()))
    else:
        return int(value.__index__())
    raise BadInput(
        f"{param} must be an integer >= {minimum}, got {got}",
        f"pass {{{param}=N}} with N >= {minimum}",
        param=param,
    )


def check_text(value: object, what: str, param: str | None = None) -> str:
    """``value`` when it is a ``str`` that UTF-8 can store (no lone surrogate such as
    ``"\\ud800"``, which no file, index or JSON body can hold).

    Raises:
        BadInput: anything else, saying ``what`` it is.
    """
    if not isinstance(value, str):
        raise BadInput(f"{what} must be a string, got {type(value).__name__}", param=param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadInput(
            f"{what} {value[:40]!a} holds a lone surrogate at character {exc.start} "
            "(not valid Unicode; no index can store it)",
            "decode the text with errors='replace', or remove the character",
            param=param,
        ) from None
    return value
