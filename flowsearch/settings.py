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
    10000
    >>> with override(flat_max_rows=10):
    ...     current().flat_max_rows
    10
    >>> current().flat_max_rows
    10000
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
    #: Largest segment ``auto`` indexes exactly (Flat); above, every segment gets a graph. Per
    #: segment, not per index: an index of many segments pays each segment's search, and 10
    #: Flat segments of 20k rows answered 1.8x slower than one HNSW segment of their 200k rows
    #: (bench_storage); with a graph each, see bench_ann_study's segments section. The floor of
    #: the merge tiers (``floor_segment_rows``): every merged segment is a graph.
    flat_max_rows: int = 10_000
    #: What ``auto`` builds above :attr:`flat_max_rows` up to :attr:`scan_max_rows` (off by
    #: default): every row's 1-bit RaBitQ code scanned (FAISS fast-scan), the best ``k_factor``
    #: x k re-ranked exactly (``k_factor`` tuned). Its case is the build: at 200k ``static``
    #: rows, one thread, tuned to ``k_factor`` 64, recall@10 0.999 on real queries at 13.7x
    #: ``Flat``'s speed, built in 1 s + 14 s of tuning, where the default HNSW32
    #: (:attr:`hnsw_ef_construction` 80) took 107 s (encoding the rows: 13 s) for 58x at
    #: recall 0.955. Off by default: slower to query than the graph there and on ``mean``'s
    #: encoder space (50k rows: HNSW32 0.987 at efSearch 64 in 0.21 ms, the scan 0.98 in
    #: 0.4-0.7 ms), and 10 scanned segments answer 2.85x one (each re-ranks its own
    #: candidates). No IVF list: faiss 1.15's IVF-RaBitQ ranks wrongly with inner product
    #: (0.75 against 0.97 at ``IVF1``); its filters are searched exactly over the re-rank
    #: vectors instead of by selector (bench_ann_study).
    scan_factory: str = "RaBitQfs,RFlat"
    #: Largest segment ``auto`` indexes with :attr:`scan_factory` (0: never); above,
    #: :attr:`graph_factory`. A scan's speed-up on ``Flat`` stays ~10x at any size (both read
    #: every row), HNSW32's grows: 46x against the scan's 10.9x at 1M (recall 0.960 / 0.987,
    #: efConstruction 40), though its build took 415 s there against the scan's 8 s (encoding
    #: 1M rows: 62 s): set it where the build's time matters more than the query's.
    scan_max_rows: int = 0
    #: What ``auto`` builds above :attr:`scan_max_rows`.
    graph_factory: str = "HNSW32"
    #: HNSW's ``efConstruction`` (FAISS's default: 40) for every HNSW index flowsearch makes.
    #: A calibrated space is a hard graph search: at 200k static rows, one thread, HNSW32 built
    #: at 40 reached recall@10 0.926 on real queries at efSearch 128 and 0.957 at 512 (2.5 ms);
    #: built at 80, 0.953 at 128 (0.71 ms) and 0.973 at 512, for a 1.45x longer build (87 s
    #: against 60 s); at 16, 0.897 at 1024. As ``auto`` tunes it: at 80, efSearch 104, real
    #: queries 0.955, 58x ``Flat`` (0.57 ms); at 40, efSearch 1024 (the tuner's largest), 0.965,
    #: 4.2x (bench_ann_study). At 1M (bench_storage: bench_serving's corpus, whitened) a build
    #: at 80 took 1,985 s on a third of a core and its tuning stopped at efSearch 1024 with
    #: recall 0.803 on its check rows (it warns); at 40, one core: 415 s.
    #: Cheaper graphs at 1M (bench_ann_study's scale-graph runs, encoding 1M rows: 60-68 s)
    #: lose the recall instead: HNSW16 at 40 built in 197 s reached 0.933 at 20x ``Flat``,
    #: HNSW32 at 24 (over 192 principal components) 170 s and 0.938; HNSW32 at 32 needed 220 s
    #: for 0.961 at 18.6x; HNSW32 at 28 over 128 components 190 s (3.05x its run's encoding)
    #: for 0.951 at 25x. Large segments now take that road: :attr:`projected_graph_min_rows`.
    #: One value at every size: 10 segments of 20k rows built at 160 or 320 needed 3.0x /
    #: 2.8x one 200k segment's vector-search CPU at equal recall@10 0.95 (80: 3.4x, 40: 3.7x;
    #: HNSW16 at 160: 2.9x) for 2.7x / 7.5x the build of 40 (bench_segments), far from the
    #: 1.3x that would pay for a size-dependent value.
    hnsw_ef_construction: int = 80
    #: Segments of at least this many rows get ``auto``'s graph built over their rows' first
    #: :attr:`projected_graph_dims` principal components (a PCA of
    #: :attr:`projected_graph_sample_rows` seeded rows) at :attr:`projected_graph_ef_construction`,
    #: then moved into an ordinary HNSW index of the full vectors: searches and their scores
    #: read the full vectors (``flowsearch.ann.build.ProjectedGraph``; the manifest's ann
    #: record says so, ``info`` shows it). Issue 30's 1M budget (build <= 3x encoding the rows
    #: with ``static``): at 1M static rows, one thread, HNSW32 over 96 components at 32 built in
    #: 145-196 s in four runs, 2.73x, 3.23x, 3.42x and 3.01x their runs' encoding (46.9-68.0 s):
    #: on the line, not clearly under 3x; the full graph at :attr:`hnsw_ef_construction` 40 took
    #: 415 s (6.7x; at 80 about twice that). Recall@10 of real queries 0.954 at efSearch 1024
    #: (23.3-23.5x ``Flat``), which ``auto``'s tuner chose (its largest, :attr:`max_ef_search`):
    #: 20.3x and 21.1x in its runs (bench_ann_study, scale-graph and scale-tune). Below, the
    #: full graph: at 200k real rows the projected one built in 33 s (full, at 80: 107 s) but
    #: tuned to efSearch 1024 for real queries' 0.947 at 4.8x ``Flat`` (full: 0.955 at 58.5x).
    #: The 1M rows are 200k real rows and 4 jittered copies of each: easier for a graph than 1M
    #: distinct rows; on 1M distinct texts (real sentences topped up with splices) real queries
    #: got 0.905 at efSearch 1024, 20.2x ``Flat`` (docs/SCALE.md).
    #: **Off by default (0)**: on 1M distinct texts the projected graph at its largest
    #: efSearch gave real queries 0.905 (the full graph at 80: 0.966, in 2.9x its build), so
    #: it would break ``auto``'s recall promise; set it (e.g. 500_000, the value measured
    #: above) to trade recall for a 3x faster build, as with a fast ``static`` encoder.
    projected_graph_min_rows: int = 0
    #: Principal components the projected graph is built over (at or above the vectors'
    #: dimension the graph is built over the full vectors). At 1M, efConstruction 28: 128
    #: components built in 158 s for 0.950 at efSearch 1024, 96 in 143 s for 0.943.
    projected_graph_dims: int = 96
    #: ``efConstruction`` of the projected graph (:attr:`hnsw_ef_construction` for the others).
    #: At 1M over 96 components: 28 gave 0.943 at efSearch 1024, 32 0.954, 36 0.961 (171 s:
    #: 3.51x its run's encoding); HNSW24 at 32 0.942 (128 s).
    projected_graph_ef_construction: int = 32
    #: Rows (a seeded sample of the segment's first rows, or of the build's fit rows) the
    #: projected graph's PCA is fitted on; the build holds the projected rows (4 bytes x
    #: :attr:`projected_graph_dims` per row) beside the full ones until the graph is moved.
    projected_graph_sample_rows: int = 65_536
    #: Largest segment ``auto`` indexes with :attr:`graph_factory`; above, IVF-PQ with an exact
    #: re-rank: HNSW32 holds ~1.8 KB per row in RAM at dim 384 (docs/SCALE.md).
    graph_max_rows: int = 2_000_000
    #: recall@10 against exact search that ``auto`` tunes for.
    target_recall: float = 0.95
    #: Norm of the noise that moves a tuning query off its held-out row. At 200k static rows
    #: (bench_ann_study) held-out rows at noise 0-1.2 were 0.01-0.02 harder than real queries
    #: at efSearch >= 64 but easier at 16-32 unless moved by 1.2, the one noise tried whose
    #: recall was at or below real queries' at every efSearch (small segments tune to 16-64).
    query_noise: float = 1.2
    #: Segments of at least this many rows tune at :attr:`query_noise`; a smaller one (the
    #: whole of a small index) tunes its knob at a noise raised by :attr:`query_noise_per_decade`
    #: per tenfold fewer rows (:func:`flowsearch.ann.build.noise_for_rows`). At 20,000 real
    #: sentences real queries are harder than held-out rows at 1.2: the tuner chose efSearch
    #: 20-48 and real queries got recall@10 0.83-0.92 in 6 of 6 seeded runs, where 50,000 of
    #: the same sentences matched 1.2 (real 0.94-0.96 at the knobs it chose; bench_tuner).
    query_noise_rows: int = 50_000
    #: See :attr:`query_noise_rows`: at 20,000 rows the noise whose probes' recall curve
    #: follows real queries' near 0.95 is ~1.6 (1.2 + 1.0 x log10(50k / 20k)), so a knob chosen
    #: there lands on the target only on average: 1.0 per decade left real queries at
    #: 0.945-0.955 (3 of 6 seeds under) even with the knob the larger of two thirds' picks.
    #: 1.5 (1.8 at 20k, 2.13 at 12k) errs on the safe side (bench_tuner).
    query_noise_per_decade: float = 1.5
    #: A version of several segments searches each one with the knob its recall curve and
    #: its share of the live rows call for, so that the *merged* top 10 reaches
    #: :attr:`target_recall` (``flowsearch.ann.merged``), not each segment's own top 10.
    merged_knobs: bool = True
    #: How many times its share of the merged top 10 a segment is assumed to give (1: rows
    #: spread over segments as their sizes). At 10 segments of 20k static rows (bench_segments)
    #: real queries' merged recall@10 was 0.937 at 1, 0.954 at 3 and 0.962 at 5 (one segment of
    #: the 200k rows: 0.959; each segment tuned alone: 0.969), partial sentences 0.927, 0.944,
    #: 0.950: the curves come from held-out rows, easier than real queries at the small knobs
    #: a segment then gets, and neighbours crowd into some segments more than their share.
    #: The allocation is not what keeps 10 segments slower than one: at 5 it chose efSearch
    #: 18-60 (414 in all) for 0.960, where 40 each (400) gave 0.968 and 30 each 0.952, and at
    #: equal recall 0.95 the 10 graphs' search costs ~3.4x one graph's CPU whatever the knobs
    #: (bench_segments' equal-recall table).
    merged_skew: float = 5.0
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
    #: A filter or deletions leaving at most this many rows of a segment searchable are
    #: searched by brute force over those rows' vectors (faster than an ID selector up to at
    #: least 16k of 200k rows, bench_filters).
    exact_below: int = 16_384
    #: A filter or deletions removing at most this share of a segment's rows are searched
    #: without FAISS's ID selector: an unfiltered top-(k / kept share + postfilter_margin),
    #: the removed rows dropped, and only the queries left short of k searched again through
    #: the selector (exact for Flat). A selector costs FAISS its matrix-product path: 1,000
    #: queries over 200k Flat rows took 18.6 s with 1,000 rows deleted and 0.8 s without.
    postfilter_max_removed_share: float = 0.25
    #: Extra candidates per query on that path (removed rows among a query's nearest).
    postfilter_margin: int = 16

    # --- storage: segments and their files ------------------------------------------------
    #: Rows per Parquet part of a segment (about 150 MB at dim 384 with short passages).
    part_rows: int = 50_000
    #: Rows per Parquet row group: the unit decoded to join one hit to its row.
    row_group_rows: int = 1024
    #: Files at most this large are checksummed on every open; larger ones with verify=True.
    cheap_checksum_bytes: int = 16 * 2**20

    # --- merging segments (compact and the writes' size-tiered policy) ----------------------
    #: Segments of one size tier (sizes within a factor of ``merge_factor``) that trigger a
    #: merge of that tier, after a write and in ``compact`` (Lucene's segments-per-tier). 100
    #: upserts of 1,000 rows into a one-segment 200k ``auto`` index (bench_storage's policy
    #: stage) left 5 segments at 4 (at most 7 after any write) against 9 at 10 (12), the
    #: hybrid p50 1.58x the one segment's against 1.82x (before the Flat budget: 11 segments,
    #: 2.93x), for 324k rows rewritten by merges against 203k (135k in graphs against 91k;
    #: the worst write 105 s, a 66k-row graph, against 29 s): each row is rewritten more
    #: often (about log base 4 of the index's growth instead of base 10), and the big merges
    #: come sooner and smaller (at 10 the tier of 10k-100k would merge ten 10k+ segments at once).
    segments_per_tier: int = 4
    #: Sizes of neighbouring tiers differ by this factor.
    merge_factor: int = 10
    #: Segments below this many rows count as one (the smallest) tier.
    floor_segment_rows: int = 10_000
    #: Writes merge on their own only tiers whose merged size is at most this many rows (a
    #: write's cost stays bounded; ``compact`` merges bigger tiers).
    write_merge_max_rows: int = 200_000
    #: Segments of at most :attr:`flat_max_rows` live rows (``Flat`` under ``auto``) a write
    #: or ``compact`` leaves; one more and they are all merged into one, which gets a graph
    #: once it passes :attr:`flat_max_rows` (within :attr:`write_merge_max_rows` for a write).
    #: Small segments cost a query the most per row (an exact scan: a 10k-row ``Flat`` segment
    #: took ~3 ms of a query where a 66k-row graph took ~1 ms), and the tiers alone let them
    #: pile up: 100 upserts of 1,000 rows into a 200k ``auto`` index left ten 10k ``Flat``
    #: segments beside the 200k graph, the dense p50 4.3x the one segment's (bench_storage's
    #: policy stage; with this budget and 10 segments per tier: 9 segments, 2.4x).
    flat_segments_max: int = 4

    # --- calibration: what auto fits -------------------------------------------------------
    #: When ``auto`` keeps the encoder's space, the flow it fits serves only the raw
    #: log-density figures, so it is fitted on at most this many of the fit rows (a seeded
    #: uniform sample; ~130 rows per dimension at 384). Fitting it on 200k rows added 0.84 GB to
    #: the ingest's peak memory, on 50k nothing above the vectors themselves (bench_speed).
    density_fit_rows: int = 50_000

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
