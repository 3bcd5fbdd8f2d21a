r"""Interrupting DuckDB queries that outlive their deadline.

Example:
    >>> class Cursor:
    ...     def interrupt(self) -> None: ...
    >>> dog = Watchdog(period=0.01)
    >>> dog.forget(dog.watch(Cursor(), 5.0))
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

__all__ = ["Watchdog"]


class Watchdog:
    """Interrupts DuckDB cursors that outlive their deadline.

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

    def watch(self, cursor: Any, timeout: float) -> int:
        """Interrupt ``cursor`` (anything with ``interrupt()``) ``timeout`` seconds from now
        unless :meth:`forget` is called first with the token returned."""
        with self._lock:
            self._next += 1
            self._watched[self._next] = (time.monotonic() + timeout, cursor)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flowsearch-where-watchdog")
                self._thread.daemon = True
                self._thread.start()
            return self._next

    def forget(self, token: int) -> None:
        """Stop watching the cursor of ``token``."""
        with self._lock:
            self._watched.pop(token, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.period)
            now = time.monotonic()
            with self._lock:
                late = [c for deadline, c in self._watched.values() if deadline <= now]
            for cursor in late:
                with contextlib.suppress(Exception):
                    cursor.interrupt()
