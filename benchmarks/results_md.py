"""benchmarks/RESULTS.md is shared: each script owns one marker-delimited section of it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["publish", "write_section"]


def write_section(path: Path, body: str, name: str) -> None:
    """Replace (or append) the ``<!-- name:start -->`` ... ``<!-- name:end -->`` section."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.is_file() else "# Benchmark results\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def publish(
    out: str, render: Callable[[dict[str, Any]], str], section: str, report: dict[str, Any] | None
) -> str:
    """Write a run's ``out.json`` (unless ``report`` is None: re-render the stored one), its
    ``out.md`` and its section of RESULTS.md (beside this file); returns the markdown."""
    if report is None:
        report = json.loads(Path(out + ".json").read_text())
    else:
        Path(out + ".json").write_text(json.dumps(report, indent=1) + "\n")
    body = render(report)
    Path(out + ".md").write_text(body)
    write_section(Path(__file__).with_name("RESULTS.md"), body, section)
    return body
