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
    #: Threads that search one query's segments concurrently (FAISS releases the GIL): the
    #: query's own thread and helpers of one shared pool, each taking the next segment, a
    #: helper only while fewer queries search than there are threads; 1: in turn; 0: the
    #: cores the process may run on, at most 4. Only single queries (batches already use
    #: FAISS's threads). 10 segments of 20k rows on 2 cores: p50 1.01x one segment (dense)
    #: and 1.07-1.10x (hybrid) against 1.32-1.45x / 1.35-1.40x in turn, 1.13-1.20x at equal
    #: recall, for 1.5-1.8x the CPU (bench_segments --stage latency).
    segment_threads: int = 0
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
    #: A filter or deletions removing at most this share of a segment's rows are searched
    #: without FAISS's ID selector: an unfiltered top-(k / kept share + postfilter_margin),
    #: the removed rows dropped, and only the queries left short of k searched again through
    #: the selector (exact for Flat). A selector costs FAISS its matrix-product path: 1,000
    #: queries over 200k Flat rows took 18.6 s with 1,000 rows deleted and 0.8 s without.
    postfilter_max_removed_share: float = 0.25
    #: Extra candidates per query on that path (removed rows among a query's nearest).
    postfilter_margin: int = 16

    # --- storage: segments and their files ------------------------------------------------
    #: Bytes (Arrow size) of decoded row groups a searcher keeps for the join: at 200k rows a
    #: warm join took 0.19 ms with 128 MiB against 1.95 ms with 64 groups (bench_speed).
    row_cache_bytes: int = 128 * 2**20

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

    # --- search -----------------------------------------------------------------------------
    #: Candidates each side contributes to hybrid fusion (at least k).
    hybrid_candidates: int = 100
    #: Seconds a searcher served from Ray shards waits for every shard's answer (a restarted
    #: actor reopening its segments included) before it raises ``Unavailable``.
    shard_timeout: float = 60.0
    #: How often Ray restarts a lost shard actor, and retries a call it lost.
    shard_restarts: int = 3

    # --- search: where filters (DuckDB) ----------------------------------------------------
    #: Seconds a filter may run before it is interrupted (DuckDB checks between vectors of
    #: 2,048 rows, so a filter stops within this plus one vector's work).
    filter_timeout: float = 10.0
    #: DuckDB's ``memory_limit`` for a Searcher's filter database: the segments' filterable
    #: columns (about their text's size: 62 MB for 200k rows of 300 characters,
    #: bench_filter_segments) plus the queries' working memory (hash tables, sorts). Not the
    #: strings a scalar function returns: DuckDB does not count those (see search.predicate).
    filter_memory_bytes: int = 2 * 2**30
    #: DuckDB threads per filter (1: filters of concurrent queries run side by side anyway).
    filter_threads: int = 1
    #: Bytes of matched row numbers kept per version, most recently used first (a tenant
    #: filter repeats on every query).
    filter_rows_cache_bytes: int = 64 * 2**20

    # --- lexical: BM25 postings ------------------------------------------------------------
    #: Bytes of weighed postings (12 per posting) a version's BM25 keeps for recent query
    #: terms: a term met again skips the per-segment gathering and the weighing
    #: (bench_lexical). 0 keeps none.
    lexical_cache_bytes: int = 64 * 2**20

    # --- search: hybrid fusion (flowsearch.search.fusion.fuse) ----------------------------
    #: Dense weight of the hybrid score for a transformer pooling: the best mean nDCG@10 over
    #: the five dev sets for the bundled ``mean`` with the lexical score stretched (match 0.7:
    #: 0.8297 with weights chosen leave-one-set-out, against 0.8286 for the best published
    #: rule and 0.8001 for RRF; bench_fusion_query).
    fusion_dense_weight: float = 0.65
    #: Dense weight for a static pooling (a table lookup, Model2Vec included): its dense side
    #: trails BM25 on question -> passage search (bench_fusion_query: 0.7702 leave-one-set-out
    #: with the lexical score stretched, as without).
    fusion_dense_weight_static: float = 0.3
    #: How fast the default dense weight falls with an index's passages per document p (rows
    #: over documents, 1 when no document is cut): weight - slope x ln p, clipped to [0, 1]
    #: (flowsearch.search.fusion.default_weight); an index of short texts keeps the weight.
    #: 0.1: chosen on the tune halves of two long-document sets whose documents are each one
    #: SQuAD article's QNLI sentences (6.1 and 12.2 passages per document: weights 0.47, 0.40):
    #: test-half nDCG@10 0.9113 against 0.8967 at 0.65 (+0.015, 95% CI +0.009 to +0.020) and
    #: 0.9329 against 0.9185 (+0.014, +0.009 to +0.021); BM25 alone 0.8867 and 0.9146
    #: (bench_fusion_adaptive, "Coherent long documents"). On bench_passages' set, not used to
    #: choose it (120 TF-IDF-grouped documents, 500 questions), the default cut's hybrid went
    #: from 0.807 at slope 0 to 0.836 (254/32: 0.780 -> 0.803; 64/8: 0.843 -> 0.861).
    fusion_length_slope: float = 0.1
    #: The same for a static pooling: 0 (unmeasured on coherent long documents).
    fusion_length_slope_static: float = 0.0

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
