r"""One place for the tuning constants: :class:`Settings`, read at call time.

Every number that trades speed, memory or quality (when ``auto`` switches index type, how many
rows a segment or a Parquet row group holds, how long a filter may run, ...) is a field here
with its reason, instead of a module global. Code reads :func:`current` when it runs, so a
test or an application changes a setting for a block with :func:`override`, without patching
modules::

    with override(part_rows=500):
        build_index(...)

Settings are process-wide (not per thread): change them around work, not during it.

Example:
    >>> current().part_rows
    50000
    >>> with override(part_rows=10):
    ...     current().part_rows
    10
    >>> current().part_rows
    50000
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

    # --- storage: segments and their files ------------------------------------------------
    #: Rows per Parquet part of a segment (about 150 MB at dim 384 with short passages).
    part_rows: int = 50_000
    #: Rows per Parquet row group: the unit decoded to join one hit to its row.
    row_group_rows: int = 1024
    #: Files at most this large are checksummed on every open; larger ones with verify=True.
    cheap_checksum_bytes: int = 16 * 2**20

    # --- calibration: what auto fits -------------------------------------------------------
    #: When ``auto`` keeps the encoder's space, the flow it fits serves only the raw
    #: log-density figures, so it is fitted on at most this many of the fit rows (a seeded
    #: uniform sample; ~130 rows per dimension at 384). Fitting it on 200k rows added 0.84 GB to
    #: the ingest's peak memory, on 50k nothing above the vectors themselves (bench_speed).
    density_fit_rows: int = 50_000

    # --- search -----------------------------------------------------------------------------

    # --- search: where filters (DuckDB) ----------------------------------------------------

    # --- lexical: BM25 postings ------------------------------------------------------------
    #: Texts tokenised at a time while building postings: bounds the memory of the Python
    #: token lists (a few MB per chunk of short texts) while numpy does the rest in bulk.
    lexical_build_chunk: int = 8192
    #: Segments with at least this many terms find a query term by bisection in their sorted
    #: vocabulary instead of a dictionary: ~0.7 us a lookup instead of 0.04, but nothing to
    #: build on open (a million-term dictionary took 1.5 s on the shared 2-core machine).
    lexical_bisect_min_terms: int = 100_000

    # --- space: the reference queries and new rows are judged against (space/reference.py) ---
    #: Share of the corpus the build keeps out of the calibrator's fit (the rows the reference
    #: is measured on when there are enough of them).
    held_out_share: float = 0.10
    #: At most this many rows are held out (enough for a 1st percentile; scoring them is cheap).
    held_out_max: int = 2000
    #: Fewer held-out rows than this are none (a corpus under 500 rows holds none out; its
    #: reference is measured leave-one-out instead).
    held_out_min: int = 50
    #: A reference needs at least this many measured rows (its 5th percentile is then the 3rd
    #: lowest row; fewer say nothing about what is usual).
    reference_min_rows: int = 50
    #: A leave-one-out reference measures at most this many rows (a seeded sample); the
    #: reference sample keeps at most this many probes.
    reference_max_rows: int = 2000
    #: Rows of the reference sample new rows are judged against (``space/sample.py``): a drift
    #: check reads this many vectors whatever the corpus holds (3 MB at 384 dimensions, as
    #: float16).
    reference_sample_rows: int = 4096
    #: A write that changes the reference sample saves what changed (a delta: a few KB for
    #: 1,000 rows into 1M) on the last base, until the deltas since it would pass this share
    #: of the base's bytes, or their count :attr:`reference_delta_max`; then a new base (the
    #: whole sample, 4.7 MB). So a write pays at most about twice its delta, and a drift check
    #: reads at most about twice a base (benchmarks/RESULTS.md, bench_storage writes).
    reference_delta_share: float = 1.0
    reference_delta_max: int = 32
    #: A query whose best dense score is below this percentile of the reference is out of
    #: distribution: 2% of in-domain questions flagged and 87% of off-domain sentences caught
    #: with the bundled model's ``mean`` (benchmarks/RESULTS.md, bench_density_length).
    ood_percentile: float = 5.0
    #: Confidence of the interval around new rows' median percentile (order statistics).
    drift_confidence: float = 0.95
    #: New rows sit apart from the corpus when their median percentile is below this with
    #: :attr:`drift_confidence` (most of them less like the corpus than 3/4 of its passages).
    drift_apart_percentile: float = 25.0
    #: Fewer new rows than this are described, never judged as drift (5 rows all below the
    #: 25th percentile happen by chance once in 1,024 batches: 0.25^5).
    drift_min_rows: int = 5
    #: A write scores at most this many of its new rows (a seeded sample) for the drift report,
    #: each against the reference sample (before it, against the whole index: 5.2 s of a 5.4 s
    #: upsert into 1M Flat rows). 100 is the largest batch bench_drift
    #: measured (mean: 0% false alarms, 80% of other sets' batches caught); the median's 95%
    #: interval from 100 uniform percentiles is about +-10 points, inside the verdict's steps.
    drift_max_rows: int = 100

    # --- encode: texts to raw vectors ----------------------------------------------------
    #: Texts the ``static`` pooling tokenises and averages at once: bounds its memory (the
    #: token ids of 8192 passages) while keeping each sparse product large.
    static_chunk_texts: int = 8192
    #: ``Encoder.encode(progress=None)`` draws a progress bar from this many texts on (a
    #: query or a small batch never does).
    progress_min_texts: int = 2000

    # --- evaluation ----------------------------------------------------------------------
    #: ``eval retrieval`` scores a BEIR directory whose qrels name corpus ids its corpus lacks
    #: (those passages are unreachable, as BEIR's and MTEB's evaluators score them: some
    #: official releases are so), and refuses one where more than this share of the qrels'
    #: judgements miss: most missing means the qrels belong to another corpus.
    qrels_missing_max_share: float = 0.5

    # --- search: hybrid fusion (flowsearch.search.fusion.fuse) ----------------------------

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
