r"""Ingest as a user runs it (``flowsearch index`` in a child process) with its peak RSS.

The child's peak resident set size comes from ``os.wait4`` (the kernel's ``ru_maxrss`` of that
one child, in KiB on Linux), so nothing else this benchmark does is counted in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common.harness import ROOT

__all__ = ["run_ingest"]


def run_ingest(corpus: Path, index_dir: Path, *args: str) -> dict[str, Any]:
    """Run ``flowsearch index CORPUS --index DIR --overwrite --json ARGS`` (niced, through
    ``flowsearch.cli.main``: the package has no ``__main__``) and return
    its JSON summary plus ``wall_s`` and ``peak_rss_bytes``.

    Raises:
        RuntimeError: the command failed (its stderr tail in the message).
    """
    cmd = [
        "nice", "-n", "5", sys.executable, "-c", "from flowsearch.cli import main; main()",
        "index", str(corpus), "--index", str(index_dir), "--overwrite", "--json", *args,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}  # this checkout's
    out_path, err_path = index_dir.with_suffix(".out"), index_dir.with_suffix(".err")
    start = time.perf_counter()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = err_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {tail}")
    summary = json.loads(out_path.read_text())
    return {
        **summary,
        "wall_s": wall,
        "peak_rss_bytes": int(usage.ru_maxrss) * 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }
