"""The one exception type users see: a bad input, told in one line with its fix."""

from __future__ import annotations

__all__ = ["FlowsearchError"]


class FlowsearchError(ValueError):
    r"""A problem with what the caller gave us (a path, a column, an option), not a bug.

    The message is one line that names the problem and how to fix it. The CLI prints it on
    stderr and exits with code 2, without a traceback.
    """
