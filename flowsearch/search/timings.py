r"""Where a search spends its time: seconds per stage, for whoever asks (the server's metrics).

A caller that wants the stages of the searches it runs wraps them in :func:`collect`; the
search marks its stages with :func:`stage` (``encode``: the queries through the encoder and
calibrator; ``search``: every segment's vector and BM25 search; ``fuse``: the hybrid's fusion;
``rows``: hits joined to their rows; ``rerank``: a reranking stage, where one runs). A stage
met twice (a search that goes deeper) adds up. Nobody collecting, a stage costs one context
variable lookup: searches pay nothing for a feature they do not use.

Example:
    >>> with collect() as seconds:
    ...     with stage("encode"):
    ...         pass
    >>> sorted(seconds)
    ['encode']
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["STAGES", "collect", "stage"]

#: The stages a search marks.
STAGES = ("encode", "search", "fuse", "rows", "rerank")

_ACTIVE: ContextVar[dict[str, float] | None] = ContextVar("flowsearch_timings", default=None)


@contextlib.contextmanager
def collect() -> Iterator[dict[str, float]]:
    """Seconds per stage of the searches run inside (this thread or task only)."""
    seconds: dict[str, float] = {}
    token = _ACTIVE.set(seconds)
    try:
        yield seconds
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark a stage of a search (timed only when someone collects)."""
    seconds = _ACTIVE.get()
    if seconds is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
