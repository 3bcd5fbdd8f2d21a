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


class stage:  # noqa: N801 - used as a function: ``with stage("encode"):``
    """Mark a stage of a search (timed only when someone collects; a plain class, not a
    generator, so that a search nobody times pays one lookup per stage)."""

    __slots__ = ("_name", "_seconds", "_start")

    def __init__(self, name: str) -> None:
        self._name = name
        self._seconds = _ACTIVE.get()
        self._start = 0.0

    def __enter__(self) -> None:
        if self._seconds is not None:
            self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        seconds = self._seconds
        if seconds is not None:
            took = time.perf_counter() - self._start
            seconds[self._name] = seconds.get(self._name, 0.0) + took
