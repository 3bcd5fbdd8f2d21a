"""Markdown tables for the reports: one header, one alignment rule, one row format.

Example:
    >>> head(["rule", "a", "b"], "lrr")
    ['| rule | a | b |', '|---|---:|---:|']
    >>> row(["flow", "0.50", "0.25"])
    '| flow | 0.50 | 0.25 |'
    >>> table(["set", "n"], [["qnli", "3"]], "lr")
    ['| set | n |', '|---|---:|', '| qnli | 3 |', '']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["head", "row", "rule", "table"]


def row(cells: Iterable[object]) -> str:
    """One table line: the cells (as ``str``) between pipes."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def rule(align: str) -> str:
    """The line under the header: per column ``l`` (left, ``---``) or ``r`` (right, ``---:``)."""
    marks = {"l": "---|", "r": "---:|"}
    return "|" + "".join(marks[a] for a in align)


def head(columns: Iterable[object], align: str) -> list[str]:
    """The header line and its alignment rule (``align``: one ``l`` or ``r`` per column)."""
    return [row(columns), rule(align)]


def table(
    columns: Sequence[object], body: Iterable[Iterable[object]], align: str | None = None
) -> list[str]:
    """A whole table: :func:`head`, a :func:`row` per line of ``body``, then a blank line
    (``align``: every column left when None)."""
    return [*head(columns, align or "l" * len(columns)), *(row(cells) for cells in body), ""]
