r"""Interrupting DuckDB queries that outlive their deadline.

Each :class:`~flowsearch.search.filters.MetadataFilter` (one per Searcher) owns one
:class:`Watchdog`: a Searcher's filters are never delayed by another's, and closing the filter
stops its thread. An interrupt is sent under the watchdog's lock, and :meth:`Watchdog.forget`
takes that lock, so once ``forget`` returns the cursor is never interrupted for that query (a
late interrupt would otherwise stop the next query run on the pooled cursor).

Example:
    >>> class Cursor:
    ...     def interrupt(self) -> None: ...
    >>> dog = Watchdog(period=0.01)
    >>> dog.forget(dog.watch(Cursor(), 5.0))
    >>> dog.close()
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

__all__ = ["Watchdog"]


class Watchdog:
    """Interrupts DuckDB cursors that outlive their deadline (each once).

    One daemon thread polling a few times a second, started on first use: a timer thread per
    predicate costs a thread start on every query, which on a busy machine waits for the
    scheduler.
    """

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[float, Any]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def watch(self, cursor: Any, timeout: float) -> int:
        """Interrupt ``cursor`` (anything with ``interrupt()``) ``timeout`` seconds from now
        unless :meth:`forget` is called first with the token returned."""
        with self._lock:
            self._next += 1
            self._watched[self._next] = (time.monotonic() + timeout, cursor)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="flowsearch-where-watchdog")
                self._thread.daemon = True
                self._thread.start()
            return self._next

    def forget(self, token: int) -> None:
        """Stop watching the cursor of ``token`` (no interrupt reaches it after this returns)."""
        with self._lock:
            self._watched.pop(token, None)

    def close(self) -> None:
        """Stop the thread (what is still watched is not interrupted)."""
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
            self._watched.clear()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 * self.period + 1)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now = time.monotonic()
            with self._lock:
                late = [t for t, (deadline, _) in self._watched.items() if deadline <= now]
                for token in late:
                    _, cursor = self._watched.pop(token)
                    with contextlib.suppress(Exception):
                        cursor.interrupt()
