r"""One place for the tuning constants: :class:`Settings`, read at call time.

Every number that trades speed, memory or quality (when ``auto`` switches index type, how many
rows a segment or a Parquet row group holds, how long a filter may run, ...) is a field here
with its reason, instead of a module global. Code reads :func:`current` when it runs, so a
test or an application changes a setting for a block with :func:`override`, without patching
modules::

    with override(flat_max_rows=500):
        build_index(...)

Settings are process-wide (not per thread): change them around work, not during it.

Example:
    >>> current().flat_max_rows
    100000
    >>> with override(flat_max_rows=10):
    ...     current().flat_max_rows
    10
    >>> current().flat_max_rows
    100000
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Settings", "current", "override"]


@dataclass(frozen=True)
class Settings:
    """The tuning constants (see each field's comment for the measurement behind it)."""

    # --- ann: which vector index, and how hard it searches --------------------------------
    #: Largest segment ``auto`` indexes exactly (Flat). A single Flat query costs 2.85 ms at
    #: 50k rows and 6.15 ms at 100k against 3.34 ms for a tuned HNSW at 200k (bench_speed).
    flat_max_rows: int = 100_000
    #: What ``auto`` builds above :attr:`flat_max_rows`.
    graph_factory: str = "HNSW32"
    #: Largest segment ``auto`` indexes with :attr:`graph_factory`; above, IVF-PQ with an exact
    #: re-rank: HNSW32 holds ~1.8 KB per row in RAM at dim 384 (docs/SCALE.md).
    graph_max_rows: int = 2_000_000
    #: recall@10 against exact search that ``auto`` tunes for.
    target_recall: float = 0.95
    #: Norm of the noise that moves a tuning query off its row (probe queries).
    query_noise: float = 0.5
    #: Largest HNSW efSearch the tuning tries.
    max_ef_search: int = 1024
    #: Largest re-rank depth (k_factor) the tuning tries.
    max_k_factor: int = 64
    #: A re-ranked index is tuned until probe queries miss this share of what the target
    #: allows (0.98 for 0.95): probes overstated real queries' recall by 0.02-0.03 at 1M rows.
    rerank_miss_share: float = 0.4
    #: IVF training: k-means on at most this many rows per list, for this many iterations.
    ivf_train_per_list: int = 64
    ivf_train_iterations: int = 10
    #: Batches up to this many queries search FAISS on the calling thread alone (waking
    #: OpenMP threads for one query cost tens of ms on a busy machine, bench_speed).
    one_thread_max_queries: int = 1
    #: A filter or deletions leaving at most this many rows of a segment searchable are
    #: searched by brute force over those rows' vectors (faster than an ID selector up to at
    #: least 16k of 200k rows, bench_filters).
    exact_below: int = 16_384

    # --- calibration: memory and speed of the calibrators ---------------------------------
    #: Rows a calibrator centres or converts at a time while fitting (whitening's covariance,
    #: the flow's constant-dimension check and float32 training matrix): the extra memory is
    #: this many float64 rows, not a copy of the corpus.
    calibration_fit_chunk_rows: int = 16_384
    #: Rows the flow's inference map (float64 numpy) takes at a time: bounds each of its
    #: temporaries to this many rows (unchunked, every operation on 20k x 384 rows allocates
    #: 61 MB afresh); the whitening front's one large product runs on a whole block.
    calibration_block_rows: int = 4096
    #: Largest matrix product (multiply-adds) in one chunk of the flow's steps; a block runs
    #: through them in chunks of rows that keep every product of the coupling networks below
    #: it. OpenBLAS computes a product below 2^19 multiply-adds on the calling thread and
    #: splits larger ones over its threads, which on a busy machine then wait for each other:
    #: at load 9 on 2 cores, an (86 x 192) @ (192 x 32) product took 5-50 times as long as an
    #: (84 x 192) one (benchmarks/bench_flow_steps.py measures the whole map).
    calibration_chunk_macs: int = 500_000

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (unknown names are refused)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)


_CURRENT = Settings()


def current() -> Settings:
    """The settings in force now."""
    return _CURRENT


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[Settings]:
    """Change settings for the block (process-wide), then restore them."""
    global _CURRENT
    before = _CURRENT
    _CURRENT = before.replace(**changes)
    try:
        yield _CURRENT
    finally:
        _CURRENT = before
