r"""What ``Searcher.refresh()`` and a small write cost as writes accumulate.

A copy of a base index takes ``max(checkpoints)`` writes, each a delete of one id (the cheapest
write: one deletion file and a manifest), while a ``Searcher`` stays open on it. At each
checkpoint (after 1, 100, 1,000, 10,000 writes):

- ``refresh()`` when nothing new was published (``--refresh-repeats`` calls; the goal is under
  5 ms at 10,000 writes);
- ``refresh()`` right after one more write was published (each timed alone, the write not);
- the last writes' own seconds (does a write slow down as the history grows?);
- the sizes of ``manifest.json`` (parsed by every open and every refresh that finds a new
  version: it must not grow with writes) and ``history.jsonl`` (append-only: it does), and the
  number of files in the index directory.

Example:
    >>> out = refresh_costs(data, spec, work, checkpoints=(1, 100))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness
from benchmarks.writes.storage_indexes import BaseSpec, base_index, fresh_copy

__all__ = ["refresh_costs"]

LOG = logging.getLogger(__name__)


def _ms(values: list[float]) -> dict[str, float]:
    ms = np.asarray(values) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "n": len(values),
    }


def refresh_costs(
    data: Path,
    spec: BaseSpec,
    work: Path,
    *,
    checkpoints: tuple[int, ...],
    repeats: int = 200,
    published: int = 20,
) -> dict[str, Any]:
    """The figures above at each of ``checkpoints`` (writes so far), one dict per checkpoint."""
    from flowsearch import Searcher, delete

    base, _ = base_index(data, spec, work)
    index = fresh_copy(base, work / "refresh" / "index")
    searcher = Searcher.open(index)
    searcher.search("warm up the searcher", k=10)
    # ids to delete, one per write: every write must find its id (a miss publishes nothing)
    need = max(checkpoints) + len(checkpoints) * published
    if need > spec.rows:
        raise SystemExit(f"{need} one-id deletes need an index of at least {need} rows")
    ids = iter(np.random.default_rng(5).permutation(spec.rows)[:need].tolist())
    done, write_s, out = 0, [], []
    for checkpoint in sorted(checkpoints):
        while done < checkpoint:
            start = time.perf_counter()
            delete(index, [next(ids)])
            write_s.append(time.perf_counter() - start)
            done += 1
        searcher.refresh()
        idle = []
        for _ in range(repeats):
            start = time.perf_counter()
            changed = searcher.refresh()
            idle.append(time.perf_counter() - start)
            assert not changed
        after_write = []
        for _ in range(published):
            start = time.perf_counter()
            delete(index, [next(ids)])
            write_s.append(time.perf_counter() - start)
            done += 1
            start = time.perf_counter()
            changed = searcher.refresh()
            after_write.append(time.perf_counter() - start)
            assert changed
        searcher.search("a query after the writes", k=10)  # the refreshed version answers
        out.append({
            "writes": checkpoint,
            "refresh_idle": _ms(idle),
            "refresh_after_write": _ms(after_write),
            "write_s": _ms(write_s[-published:]),
            "manifest_bytes": (index / "manifest.json").stat().st_size,
            "history_bytes": (index / "history.jsonl").stat().st_size,
            "files": sum(1 for p in index.rglob("*") if p.is_file()),
            "version": searcher.manifest.version,
            "load": harness.load_average()[0],
        })  # fmt: skip
        LOG.info("refresh after %d writes: %s", checkpoint, out[-1])
    searcher.close()
    return {"index": spec.name, "rows": spec.rows, "checkpoints": out,
            "repeats": repeats, "published": published}  # fmt: skip
