r"""What the commands print: one JSON document on stdout, tables on stdout, summaries on stderr.

User-supplied text (queries, passages, ids, paths) is printed literally: rich markup in it is
text, control characters are shown as escapes instead of acting on the terminal.

Example:
    >>> visible("red \x1b[31m text\n")
    'red \\x1b[31m text '
"""

from __future__ import annotations

import re
import sys
from typing import Any

from flowsearch.jsonable import to_json

__all__ = [
    "density_caption",
    "literal",
    "print_json",
    "print_summary",
    "snippet",
    "stderr_console",
    "stdout_console",
    "visible",
]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def print_json(doc: Any) -> None:
    """Print ``doc`` as one JSON document on stdout (NaN and infinities as null)."""
    sys.stdout.write(to_json(doc) + "\n")


def stdout_console() -> Any:
    """A rich console on stdout that never wraps what it prints into the terminal's width."""
    from rich.console import Console

    return Console(soft_wrap=False)


def stderr_console() -> Any:
    """A rich console on stderr without highlighting (summaries, reports)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def visible(text: Any) -> str:
    """User-supplied text made safe for a terminal: control characters (ESC, ...) shown as
    escapes instead of acting; newlines and tabs as spaces. Print it as markup-free text."""
    text = str(text).replace("\n", " ").replace("\t", " ")
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def literal(text: Any) -> Any:
    """A rich ``Text`` that prints ``text`` literally (no markup, control characters visible)."""
    from rich.text import Text

    return Text(visible(text))


def snippet(text: str, width: int = 90) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    text = " ".join(visible(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_summary(summary: dict[str, Any], verb: str) -> None:
    """A write's summary (rows, version, space, timings, drift) on stderr."""
    from rich.text import Text

    err = stderr_console()
    secs = ", ".join(f"{k} {v:.1f}s" for k, v in summary["seconds"].items() if k != "total")
    rows = summary.get("added", summary["rows"])
    line = Text()
    line.append(verb, style="bold")
    line.append(
        f" {rows:,} rows -> {visible(summary['index'])} "
        f"(version {summary['version']}, dim {summary['dim']}, {summary['space']} space via "
        f"{summary['calibration']}, {summary['factory']}, {summary['bytes'] / 2**20:.1f} MiB) in "
        f"{summary['seconds']['total']:.1f}s [{secs}]"
    )
    err.print(line)
    if summary.get("skipped"):
        err.print(f"skipped {summary['skipped']:,} rows with a null or blank text")
    drift = summary.get("drift")
    if drift and drift.get("gap_std") is not None:
        line = Text(
            f"drift: new rows' mean log-density {drift['mean_log_prob']:.1f} vs corpus "
            f"{drift['corpus_mean_log_prob']:.1f} ({drift['gap_std']:.2f} corpus std below)"
        )
        if drift["warn"]:
            line.append("  out of distribution: refit with recalibrate", style="bold yellow")
        if not drift.get("reliable", True):
            line.append("  (corpus too small to judge drift)")
        err.print(line)


def density_caption(report: Any) -> str:
    """The query report in one line: the verdict and the figures it rests on (finite ones)."""
    parts = []
    if report.top_score is not None:
        where = (
            f", percentile {report.top_score_percentile:.0f} of held-out rows"
            if report.top_score_percentile is not None
            else ""
        )
        parts.append(f"top score {report.top_score:.3f}{where}")
    if report.log_density is not None and report.corpus_mean is not None:
        parts.append(
            f"log-density {report.log_density:.1f} "
            f"(rows {report.corpus_mean:.1f} ± {report.corpus_std:.1f})"
        )
    verdict = report.verdict if report.reason is None else f"not judged: {report.reason}"
    return "; ".join([verdict, *parts])
