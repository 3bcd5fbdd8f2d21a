r"""One served index: its Searcher, kept on the newest version, and its queue of writes.

A :class:`Service` is what the routes of one index share (``flowsearch serve --index`` has one;
``--root`` one per index, :mod:`flowsearch.server.indexes`): the Searcher, searched
concurrently from FastAPI's thread pool, and the server's own writes, run one at a time in
arrival order (each waits its turn without holding a worker thread), after each of which the
Searcher moves to the published version. Versions published by other processes are picked up
at most :data:`REFRESH_SECONDS` later.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fastapi.concurrency import run_in_threadpool

from flowsearch.search.searcher import Searcher
from flowsearch.server.metrics import Metrics

__all__ = ["REFRESH_SECONDS", "Service"]

LOG = logging.getLogger(__name__)

#: How stale the served version may be after another process (e.g. ``flowsearch upsert``)
#: published a new one; the server's own writes are served at once.
REFRESH_SECONDS = 1.0

T = TypeVar("T")


class Service:
    """The process's Searcher and its write queue (what the routes share)."""

    def __init__(
        self, index_dir: Path, searcher: Searcher, metrics: Metrics, name: str | None = None
    ) -> None:
        self.index_dir = index_dir
        self.searcher = searcher
        self.metrics = metrics
        #: how metrics and messages name it (the directory's name unless given)
        self.name = name or index_dir.name
        self._queue = asyncio.Lock()  # FIFO: writers are served in the order they came
        self._write_lock = threading.Lock()
        self._checked = time.monotonic()

    def reader(self) -> Searcher:
        """The Searcher, moved to a version another process published if it is time to look."""
        now = time.monotonic()
        if now - self._checked >= REFRESH_SECONDS:
            self._checked = now
            self.refresh()
        return self.searcher

    def refresh(self) -> None:
        try:
            if self.searcher.refresh():
                self.metrics.refreshed(self.name)
        except Exception:  # keep serving the pinned version; the next look may succeed
            LOG.warning("could not move to the newest version of %s", self.index_dir, exc_info=True)

    async def write(self, func: Callable[[], T]) -> T:
        """Run one write after the ones queued before it; serve its version from then on."""
        async with self._queue:
            return await run_in_threadpool(self._write_now, func)

    def _write_now(self, func: Callable[[], T]) -> T:
        with self._write_lock:  # also one at a time for writes from other threads
            result = func()
            self.refresh()
            self._checked = time.monotonic()
            return result
