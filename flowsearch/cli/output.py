r"""What the commands print: one JSON document on stdout, tables on stdout, summaries on stderr.

User-supplied text (queries, passages, ids, paths) is printed literally: rich markup in it is
text, control characters are shown as escapes instead of acting on the terminal. An id that
would print like another (leading or trailing whitespace, invisible or bidirectional-control
characters) is shown quoted with escapes (:func:`shown_id`); the id itself is as given.

Example:
    >>> visible("red \x1b[31m text\n")
    'red \\x1b[31m text '
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

from flowsearch.jsonable import to_json

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from flowsearch.search.results import Hit
    from flowsearch.space.reports import QueryReport
    from flowsearch.writes.results import WriteResult

__all__ = [
    "counted",
    "report_caption",
    "literal",
    "shown_id",
    "print_json",
    "print_summary",
    "snippet",
    "stderr_console",
    "stdout_console",
    "visible",
]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def print_json(doc: object) -> None:
    """Print ``doc`` as one JSON document on stdout (NaN and infinities as null)."""
    sys.stdout.write(to_json(doc) + "\n")


def stdout_console() -> Console:
    """A rich console on stdout that never wraps what it prints into the terminal's width."""
    from rich.console import Console

    return Console(soft_wrap=True)


def stderr_console() -> Console:
    """A rich console on stderr without highlighting (summaries, reports)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def visible(text: object) -> str:
    """User-supplied text made safe for a terminal: control characters (ESC, ...) shown as
    escapes instead of acting; newlines and tabs as spaces. Print it as markup-free text."""
    text = str(text).replace("\n", " ").replace("\t", " ")
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def shown_id(value: object) -> str:
    r"""An id as the command line prints it: as it is when that cannot be mistaken for another
    id, else quoted with escapes (Python's ``repr``), so ``'a '`` and ``a``, or an id carrying
    a bidirectional control (``'a\u202eb'``), print apart. Quotes at its ends are quoted too.

    Example:
        >>> shown_id("doc-1"), shown_id(17), shown_id("doc-1 "), shown_id("x\u202ey")
        ('doc-1', '17', "'doc-1 '", "'x\\u202ey'")
    """
    if not isinstance(value, str):
        return str(value)
    plain = value and value.isprintable() and value == value.strip()
    return value if plain and not value.startswith(("'", '"')) else repr(value)


def literal(text: object) -> Text:
    """A rich ``Text`` that prints ``text`` literally (no markup, control characters visible)."""
    from rich.text import Text

    return Text(visible(text))


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``counted(1, "row")`` is ``"1 row"``,
    ``counted(1200, "deleted row")`` is ``"1,200 deleted rows"``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def snippet(hit: Hit, width: int = 90) -> str:
    """A hit's text on one line in about ``width`` characters: the window
    :meth:`~flowsearch.search.results.Hit.window` chooses (in its best passage, around the
    query's words), an ellipsis where text is cut off."""
    h = hit.highlight
    lo, hi = (h.start, h.end) if h is not None else (0, len(hit.text))
    start, end = hit.window(width - 2)  # room for the ellipses
    shown = " ".join(visible(hit.text[start:end]).split())
    return ("…" if start > lo else "") + shown + ("…" if end < hi else "")


def print_summary(result: WriteResult, verb: str) -> None:
    """A write's result (documents written, live passages, version, space, timings, drift) on
    stderr (a document cut into passages is several; ``info --history`` counts passages)."""
    from rich.text import Text

    err = stderr_console()
    secs = ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items() if k != "total")
    line = Text()
    line.append(verb, style="bold")
    line.append(
        f" {counted(result.n_written, 'document')} -> {visible(result.index)} "
        f"(version {result.version}, {counted(result.n_live, 'live passage')} in "
        f"{counted(result.n_segments, 'segment')}, dim {result.dim}, "
        f"{result.bytes / 2**20:.1f} MiB) in {result.seconds.get('total', 0.0):.1f}s [{secs}]"
    )
    err.print(line)
    if result.n_skipped:
        err.print(f"skipped {counted(result.n_skipped, 'row')} with a null or blank text")
    if result.n_merged:
        err.print(f"merged {result.n_merged} small segments into one")
    drift = result.drift
    if drift is not None:
        err.print(Text(drift.to_words(), style="bold yellow" if drift.warn else ""))


def report_caption(report: QueryReport | None) -> str:
    """The query report in words (the raw figures are in ``--json`` and ``--explain``)."""
    return str(report.to_words()) if report is not None else ""
