"""benchmarks/RESULTS.md is shared: each script owns one marker-delimited section of it."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["write_section"]


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
