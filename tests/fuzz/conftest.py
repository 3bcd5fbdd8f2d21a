"""Shared bounds of the fuzz suite (tests/fuzz/): each test's time and memory.

- the hypothesis profile ``"fuzz"`` (registered here, never loaded globally): a fixed seed
  per run (``derandomize``: the default suite stays reproducible, a hole found fails every
  run until fixed), no example deadline (the machine is shared; time is bounded per test by
  ``max_examples``), no database of examples, and no health check for slow data. Use it as
  ``@settings(parent=settings.get_profile("fuzz"), max_examples=N)``;
- ``fuzz.fuzz_limits.FILTER_MEMORY`` / ``FILTER_TIMEOUT``: the filter limits the fuzz tests run
  their filters under (small, so a hole shows without exhausting the machine);
- the autouse fixture ``memory_bound``: the test fails if its process grew by more than
  :data:`MAX_GROWTH_MB` MB of resident memory at any moment (sampled every 20 ms).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

#: Resident memory (MB) a fuzz test may add to its process at any moment.
MAX_GROWTH_MB = 1024

settings.register_profile(
    "fuzz",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.data_too_large],
)  # fmt: skip


def rss_mb() -> float:
    """This process's resident memory (MB), 0 where /proc is missing."""
    status = Path("/proc/self/status")
    if not status.exists():
        return 0.0
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(autouse=True)
def memory_bound() -> Iterator[None]:
    """Fail the test when the process's resident memory grew past the bound while it ran."""
    start = rss_mb()
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], rss_mb())

    sampler = threading.Thread(target=sample, name="fuzz-memory", daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
    grown = peak[0] - start
    assert grown <= MAX_GROWTH_MB, f"the process grew by {grown:.0f} MB (bound {MAX_GROWTH_MB})"
