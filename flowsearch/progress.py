r"""Stage timings and rich progress on stderr for long jobs (indexing, adding).

Progress is drawn only when stderr is a terminal (or when asked), so pipes and ``--json`` output
stay clean; timings are always kept for the summary.

Example:
    >>> st = Stages(show=False)
    >>> with st.timed("encode"), st.task("encoding", total=3) as advance:
    ...     advance(3)
    >>> sorted(st.seconds)
    ['encode']
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Stages"]


class Stages:
    """Times named stages and shows their progress.

    Args:
        show: draw progress bars; None draws them when stderr is a terminal.
    """

    def __init__(self, show: bool | None = None) -> None:
        self.show = sys.stderr.isatty() if show is None else show
        self.seconds: dict[str, float] = {}
        self._progress: Any = None

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the block's wall time to stage ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    @contextlib.contextmanager
    def live(self) -> Iterator[None]:
        """Keep one rich progress display open on stderr for the block."""
        if not self.show:
            yield
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._progress = progress
        with progress:
            try:
                yield
            finally:
                self._progress = None

    @contextlib.contextmanager
    def task(self, description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        """A progress bar for the block; yields ``advance(n_rows)``."""
        bar = self._progress
        if bar is None:
            yield lambda n: None
            return
        task = bar.add_task(description, total=total, rate="")

        def advance(n: int) -> None:
            bar.advance(task, n)
            speed = bar.tasks[task].speed
            if speed:
                bar.update(task, rate=f"{speed:,.0f} rows/s")

        try:
            yield advance
        finally:
            if total is None:
                bar.update(task, total=1, completed=1)

    @contextlib.contextmanager
    def status(self, description: str, follow: str | None = None) -> Iterator[None]:
        """An indeterminate (spinner) line for a step without a row count.

        Args:
            description: what the step does.
            follow: a logger whose INFO messages (e.g. the flow's loss) are shown on the line.
        """
        bar = self._progress
        if bar is None:
            yield
            return
        task = bar.add_task(description, total=None, rate="")
        logger = logging.getLogger(follow) if follow else None
        handler = _LineHandler(lambda msg: bar.update(task, rate=msg))
        saved = (logger.level, logger.propagate) if logger else None
        if logger is not None:
            logger.addHandler(handler)
            if not logger.isEnabledFor(logging.INFO):  # quiet run: show here, log nowhere else
                logger.setLevel(logging.INFO)
                logger.propagate = False
        try:
            yield
        finally:
            if logger is not None and saved is not None:
                logger.removeHandler(handler)
                logger.setLevel(saved[0])
                logger.propagate = saved[1]
            bar.update(task, total=1, completed=1)


class _LineHandler(logging.Handler):
    """Sends each log message to a callback (the progress line's text)."""

    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self._show = show

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self._show(record.getMessage()[:60])
