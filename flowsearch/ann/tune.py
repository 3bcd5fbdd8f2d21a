r"""Tuning a vector index's search knob: probe queries, the noise by rows, recall curves.

``auto``'s approximate indexes are tuned after they are filled: the search knob (HNSW
``efSearch``, IVF ``nprobe``, a re-rank's ``k_factor``) is raised until recall@10 against exact
search reaches the policy's ``target_recall`` (:class:`~flowsearch.ann.policy.AnnPolicy`) on
queries that look like queries: held-out rows (each left out of its own answer) moved by noise
(:func:`held_out_queries`, :func:`noise_for_rows`), or the user's own queries where they give
them (``compact(tune_queries=...)``); the recall is then checked on other such queries, not
tuned on, and recorded (:func:`tune`, :class:`Tuning`) with the knob's recall
curve (:func:`recall_curve`), which a search over several segments chooses each one's knob from
(:mod:`flowsearch.ann.merged`). :func:`tune_segment` is what every write runs on a segment.

Example:
    >>> import faiss
    >>> x = np.random.default_rng(0).normal(size=(2000, 16)).astype(np.float32)
    >>> x /= np.linalg.norm(x, axis=1, keepdims=True)
    >>> index = faiss.index_factory(16, "HNSW16", faiss.METRIC_INNER_PRODUCT)
    >>> index.add(x)
    >>> tuned = tune_segment(index, lambda: [x])
    >>> tuned.params.startswith("efSearch="), tuned.recall >= 0.9
    (True, True)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import faiss
import numpy as np

from flowsearch.ann.io import as_f32
from flowsearch.ann.merged import Curve
from flowsearch.ann.policy import DEFAULT, AnnPolicy

__all__ = [
    "MAX_K_FACTOR",
    "MIN_USER_QUERIES",
    "NOISE_PROBES",
    "USER_QUERIES",
    "QUERY_NOISE",
    "QUERY_NOISE_PER_DECADE",
    "QUERY_NOISE_ROWS",
    "RERANK_MISS_SHARE",
    "SAMPLING_Z",
    "SAMPLE_ROWS",
    "BISECT_STEP",
    "GRAPH_MAX_SCAN_SHARE",
    "TUNER_VERSION",
    "Tuning",
    "exact_index",
    "exact_knn",
    "held_out_queries",
    "knob_ladder",
    "noise_for_rows",
    "probe_queries",
    "recall_at_k",
    "recall_curve",
    "search_knob",
    "tune",
    "tune_search",
    "tune_segment",
]

LOG = logging.getLogger(__name__)

#: The version of :func:`tune`'s rule, recorded with every segment's tuning: raised whenever
#: the rule changes what it picks, so ``compact`` re-tunes segments an older rule tuned.
#: 2: the larger of two thirds' picks, and the noise raised per decade of fewer rows.
#: 3: the last doubling bisected to a 32nd (not an 8th); a graph short at ``max_ef_search``
#: searched deeper while it stays cheap (:data:`GRAPH_MAX_SCAN_SHARE`), else exactly.
TUNER_VERSION = 3

#: :attr:`Tuning.probes` of held-out rows moved by noise, and of the user's own queries.
NOISE_PROBES, USER_QUERIES = "noise", "queries"
#: Tuning on the user's queries, the knob is chosen for the target plus this many standard
#: errors of the choosing queries' recall (their spread, at the knob the target alone gives):
#: they are a sample of what users will ask, so the target is met at a one-sided 95% lower
#: bound (benchmarks/RESULTS.md, "ANN", has what the knob did without it).
SAMPLING_Z = 1.645
#: The fewest queries of the user's a tuning accepts: a third of them checks the knob, and the
#: recall of fewer than about 30 is too coarse to tell 0.95 from 0.9.
MIN_USER_QUERIES = 90

#: Norm of the noise that moves a probe query off its held-out row: the one whose recall stays
#: at or below real queries' at every knob value (benchmarks/RESULTS.md, the tuner's study).
QUERY_NOISE = 1.2
#: Segments of at least this many rows tune their knob at :data:`QUERY_NOISE`; in a smaller one
#: real queries are harder than held-out rows, so the noise is raised (:func:`noise_for_rows`).
QUERY_NOISE_ROWS = 50_000
#: How much the noise rises per tenfold fewer rows than :data:`QUERY_NOISE_ROWS` (errs on the
#: safe side of the curve real queries follow).
QUERY_NOISE_PER_DECADE = 1.5
#: Largest re-rank depth (``k_factor``) the tuning tries.
MAX_K_FACTOR = 64
#: A re-ranked index is tuned until probe queries miss this share of what the target allows
#: (probes overstate real queries' recall through a re-rank).
RERANK_MISS_SHARE = 0.4
#: Rows of a segment (a seeded sample) :func:`tune_segment` draws its probe queries from.
SAMPLE_ROWS = 4096
#: The last doubling of a knob is bisected until its step is at most this share of the knob.
BISECT_STEP = 1 / 32
#: Past ``AnnPolicy.max_ef_search`` a graph's ``efSearch`` is raised only while one query
#: computes distances to at most this share of the segment's rows; past it the segment is
#: searched exactly (``Flat``). A graph's distance costs more than an exact scan's (random
#: reads, not a streamed matrix product), so at the cap the graph is only a few times faster
#: than ``Flat``, not ten: benchmarks/RESULTS.md, "ANN", has the measured curve.
GRAPH_MAX_SCAN_SHARE = 0.1


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    """Mean share of each row of ``truth[:, :k]`` found in ``found[:, :k]`` (int64 (q, >=k)).

    A truth row padded with -1 (a segment of fewer than ``k`` other rows) is judged on the rows
    it has: finding all of them is recall 1, and a -1 in both is no hit."""
    shares = []
    for f, t in zip(found, truth, strict=True):
        true = {int(r) for r in t[:k] if r >= 0}
        if true:
            shares.append(len(true.intersection(f[:k].tolist())) / len(true))
    return float(np.mean(shares)) if shares else 1.0


def exact_knn(
    queries: np.ndarray, chunks: Iterable[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by inner product over vectors given chunk by chunk (rows numbered in order):
    ``(scores float32 (q, k), rows int64 (q, k))``. Memory is one chunk plus the results."""
    queries = as_f32(queries)
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    start = 0
    for chunk in chunks:
        chunk = as_f32(chunk)
        if not len(chunk):
            continue
        scores, rows = faiss.knn(
            queries, chunk, min(k, len(chunk)), metric=faiss.METRIC_INNER_PRODUCT
        )
        heap.add_result(scores, np.where(rows >= 0, rows + start, -1))
        start += len(chunk)
    heap.finalize()
    return heap.D, heap.I


def probe_queries(
    sample: np.ndarray, n_queries: int = 256, noise: float | None = None, seed: int = 0
) -> np.ndarray:
    """Tuning queries: a seeded sample of ``sample``'s rows (unit vectors) moved by Gaussian
    noise of norm about ``noise``, re-normalised: float32 (min(n_queries, m), d).

    A query near the data but not one of its points has its neighbours spread over several IVF
    lists (or HNSW regions), as a real query's are; ``noise`` sets how far from the data, and
    the default :data:`QUERY_NOISE` is chosen so the recall these queries see matches real queries'.
    """
    sample = as_f32(sample)
    noise = QUERY_NOISE if noise is None else noise
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(sample), size=min(n_queries, len(sample)), replace=False)
    scale = noise / math.sqrt(sample.shape[1])
    queries = (sample[pick] + rng.normal(scale=scale, size=(len(pick), sample.shape[1]))).astype(
        np.float32
    )
    queries /= np.linalg.norm(queries, axis=1, keepdims=True) + 1e-12
    return queries


def search_knob(index: faiss.Index, policy: AnnPolicy = DEFAULT) -> tuple[str, int] | None:
    """The search-time parameter that trades recall for speed, with its largest useful value:
    ``("nprobe", nlist)`` for IVF, ``("efSearch", policy.max_ef_search)`` for HNSW,
    ``("k_factor_rf", MAX_K_FACTOR)`` for any other index with an exact re-rank (a scan of
    codes: the re-rank depth is its only knob), None for exact indexes."""
    try:
        return "nprobe", int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        pass
    if isinstance(faiss.downcast_index(index), faiss.IndexHNSW):
        return "efSearch", policy.max_ef_search
    if isinstance(faiss.downcast_index(index), faiss.IndexRefine):
        return "k_factor_rf", MAX_K_FACTOR
    return None


def _set_knob(index: faiss.Index, name: str, value: int) -> None:
    if name == "nprobe":
        faiss.extract_index_ivf(index).nprobe = value
    elif name == "k_factor_rf":
        faiss.downcast_index(index).k_factor = value  # type: ignore[attr-defined]
    else:
        faiss.downcast_index(index).hnsw.efSearch = value  # type: ignore[attr-defined]


def _smallest(
    index: faiss.Index, name: str, first: int, largest: int, queries: _Queries, target: float
) -> tuple[int, float]:
    """The smallest value of knob ``name`` from ``first`` whose recall@k on ``queries``
    reaches ``target`` (``largest`` and its recall when none does), found by doubling and then
    bisecting the last doubling to within :data:`BISECT_STEP` of it (recall is monotone in these
    knobs up to sampling noise); the knob is left set to it."""
    value, below = first, None
    while True:
        _set_knob(index, name, value)
        recall = queries.recall(index)
        if recall >= target or value >= largest:
            break
        below, value = value, min(value * 2, largest)
    if recall < target or below is None:
        return value, recall
    low, high, best = below, value, recall  # low misses, high reaches
    while high - low > max(1, int(high * BISECT_STEP)):
        mid = (low + high) // 2
        _set_knob(index, name, mid)
        got = queries.recall(index)
        if got >= target:
            high, best = mid, got
        else:
            low = mid
    _set_knob(index, name, high)
    return high, best


@dataclass(frozen=True)
class Tuning:
    """What :func:`tune` chose and the recall it checked.

    Attributes:
        params: the parameter string to store (``"efSearch=64"``, ``"nprobe=64,k_factor_rf=16"``;
            ``""`` for an exact index).
        recall: recall@k against exact search on the *check* queries (held-out rows the
            knob was not chosen on).
        tuned_recall: recall@k on the queries the knob was chosen on.
        target: the recall@k aimed for.
        k: neighbours compared.
        queries: check queries.
        noise: the norm of the noise each held-out row was moved by.
        curve: the knob's recall curve below the chosen value, on every held-out query
            (:func:`recall_curve`): what a search over several segments chooses each one's
            knob from (:mod:`flowsearch.ann.merged`); None for an exact index or one with a
            re-rank (two knobs).
        exact: why the segment is to be searched exactly instead (its graph short of the
            target at the deepest search worth a graph, in words); then ``params`` is ``""``,
            ``recall`` 1 and the index is to be replaced by :func:`exact_index` of it. None:
            the index is kept.
        probes: what the queries were: :data:`NOISE_PROBES` (held-out rows moved by noise)
            or :data:`USER_QUERIES` (the user's own, embedded).
    """

    params: str
    recall: float
    tuned_recall: float
    target: float
    k: int
    queries: int
    noise: float
    curve: Curve | None = None
    exact: str | None = None
    probes: str = NOISE_PROBES


def held_out_queries(
    sample: np.ndarray,
    n_queries: int = 512,
    noise: float | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Tuning queries that look like queries: ``(queries float32 (q, d), source positions
    int64 (q,))``. Each is a row of ``sample`` (unit vectors, some of the indexed rows) moved
    by Gaussian noise of norm about ``noise`` (default :data:`QUERY_NOISE`) and re-normalised;
    searching it, its own row is left out of both the answer and the truth
    (:func:`tune`), so it stands for a query whose text is *not* in the corpus, at the
    distance from its nearest rows that real queries have.
    """
    sample = as_f32(sample)
    noise = QUERY_NOISE if noise is None else noise
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(sample), size=min(n_queries, len(sample)), replace=False)
    scale = noise / math.sqrt(sample.shape[1])
    queries = sample[pick] + rng.normal(scale=scale, size=(len(pick), sample.shape[1]))
    queries = queries.astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True) + 1e-12
    return queries, pick.astype(np.int64)


def noise_for_rows(n_rows: int) -> float:
    """The noise a segment of ``n_rows`` rows tunes its knob at: :data:`QUERY_NOISE` from
    :data:`QUERY_NOISE_ROWS` rows on, raised by :data:`QUERY_NOISE_PER_DECADE` per tenfold
    fewer rows below (real queries are harder than held-out rows in a small corpus).

    Example:
        >>> noise_for_rows(1_000_000), round(noise_for_rows(20_000), 2)
        (1.2, 1.8)
    """
    fewer = math.log10(QUERY_NOISE_ROWS / max(n_rows, 1))
    return QUERY_NOISE + QUERY_NOISE_PER_DECADE * max(0.0, fewer)


def _drop_source(rows: np.ndarray, source: np.ndarray, k: int) -> np.ndarray:
    """Each row of ``rows`` (int64 (q, >k)) without its query's ``source`` row, first ``k``."""
    out = np.full((len(rows), k), -1, dtype=np.int64)
    for i, (found, src) in enumerate(zip(rows, source, strict=True)):
        kept = found[found != src][:k]
        out[i, : len(kept)] = kept
    return out


def tune(
    index: faiss.Index,
    sample: np.ndarray,
    chunks: Callable[[], Iterable[np.ndarray]],
    *,
    sample_rows: np.ndarray | None = None,
    target: float | None = None,
    k: int = 10,
    n_queries: int = 768,
    seed: int = 0,
    noise: float | None = None,
    policy: AnnPolicy = DEFAULT,
    queries: np.ndarray | None = None,
) -> Tuning:
    """Set the ``nprobe`` (IVF) or ``efSearch`` (HNSW) that makes recall@k against exact search
    reach ``target`` on :func:`held_out_queries` (or on the user's ``queries``): the smallest
    value (from 16; doubled, then the last doubling bisected) that reaches it on the first
    third of them and the one for the second third are found apart and the larger is set (a
    margin as wide as their sampling error); then measure the recall it gives on the last
    third (rows it was not chosen on): that is the recall recorded (:attr:`Tuning.recall`).

    ``sample_rows`` are the positions in the index of ``sample``'s rows: with them each query's
    own row is left out of the answer and the truth (a held-out row); without them (None) it
    stays in (the row itself is then usually its query's nearest neighbour, an easier query).

    An index with an exact re-rank (:func:`refined`) has a second knob, the re-rank depth
    ``k_factor``: ``nprobe`` is chosen with the deepest re-rank (:data:`MAX_K_FACTOR`), then
    twice the smallest ``k_factor`` that still reaches the target at that ``nprobe``; the target
    is raised for it (:data:`RERANK_MISS_SHARE`). Twice: scanning the lists dominates the cost,
    so a deeper re-rank is nearly free, and it is where real queries' recall kept rising.

    Args:
        index: a trained, filled index.
        sample: float32 (m, d), some of the indexed vectors (the queries' sources).
        chunks: returns an iterator over all the vectors added to ``index``, in order (for the
            exact answers, computed chunk by chunk).
        sample_rows: int64 (m,), ``sample``'s positions in the index.
        target: recall@k to reach (default ``policy.target_recall``).
        k: neighbours compared.
        n_queries: queries drawn (two thirds to choose, one third to check).
        seed: sampling seed.
        noise: norm of the noise that moves each query off its row (default:
            :func:`noise_for_rows` of the index's rows for the knob, :data:`QUERY_NOISE` for
            the recall curve).
        policy: the largest ``efSearch`` tried and the default target.
        queries: float32 (q, d), the user's own queries in the searched space, at least
            :data:`MIN_USER_QUERIES`, tuned on instead of held-out rows (so ``sample``,
            ``sample_rows``, ``n_queries`` and ``noise`` are unused): a seeded order of them
            split in thirds, the first two together choosing the smallest knob whose recall
            on them is the target plus :data:`SAMPLING_Z` standard errors (or, on a graph
            that cannot reach that, the target itself), the last third checking it; the
            recall curve drawn on all. An index with an exact re-rank is tuned as for
            held-out rows (its raised target, no sampling margin). None: held-out rows.
    """
    knob = search_knob(index, policy)
    target = policy.target_recall if target is None else target
    curve_noise = QUERY_NOISE if noise is None else noise
    noise = noise_for_rows(index.ntotal) if noise is None else noise
    kind = NOISE_PROBES if queries is None else USER_QUERIES
    if queries is not None:
        noise = curve_noise = 0.0
    if knob is None:
        return Tuning("", 1.0, 1.0, target, k, 0, noise, probes=kind)
    name, largest = knob
    source: np.ndarray | None = None
    if queries is None:
        queries, truth, source = _probes(sample, sample_rows, chunks, n_queries, noise, seed, k)
    else:
        queries, truth = _user_queries(queries, chunks, seed, k)
    n = len(queries)
    halves: tuple[slice, ...]
    if n >= 3:  # two thirds choose (each third on its own), the last third checks
        cut = (n // 3, 2 * n // 3)
        parts = (slice(0, cut[1]), slice(cut[1], None))
        halves = (slice(0, cut[0]), slice(cut[0], cut[1]))
    else:
        parts = (slice(0, 1), slice(1, None)) if n > 1 else (slice(None),) * 2
        halves = (parts[0],)
    tuning = _Queries(queries[parts[0]], truth[parts[0]], _at(source, parts[0]), k)
    check = _Queries(queries[parts[1]], truth[parts[1]], _at(source, parts[1]), k)
    choosers = [_Queries(queries[h], truth[h], _at(source, h), k) for h in halves]
    rerank = isinstance(faiss.downcast_index(index), faiss.IndexRefine)
    aim = target
    if rerank:
        _set_knob(index, "k_factor_rf", MAX_K_FACTOR)
        aim = 1.0 - (1.0 - target) * RERANK_MISS_SHARE
    params = ""
    short = False
    if name == "k_factor_rf":  # the re-rank depth is the only knob: tuned below
        tuned = tuning.recall(index)
    else:
        first = min(1 if name == "nprobe" else 16, largest)  # never past the policy's cap
        # the larger of the knobs two independent sets of queries choose: near the target a
        # recall curve is flat, so one set's sampling error moves the knob a long way
        aims = [aim]
        if kind == USER_QUERIES and not rerank:  # a sample of what users ask: the knob whose
            # recall on the two choosing thirds together is the target at a one-sided 95%
            # confidence (its lower bound), instead of the larger of two thirds' picks; a
            # graph that reaches only the target itself keeps the knob that reaches it
            choosers = [tuning]
            _set_knob(index, name, _smallest(index, name, first, largest, tuning, aim)[0])
            aims = [min(1.0, aim + SAMPLING_Z * tuning.sampling_error(index)), aim]
        cap = largest
        for aim in aims:
            largest = cap
            picks = [_smallest(index, name, first, largest, c, aim) for c in choosers]
            short = any(v >= largest and r < aim for v, r in picks)
            if short and name == "efSearch":  # deeper, while the graph stays worth searching
                deepest = _deepest_worth(index, largest, choosers)
                if deepest > largest:
                    picks = [_smallest(index, name, largest, deepest, c, aim) for c in choosers]
                    largest = deepest
                    short = any(v >= largest and r < aim for v, r in picks)
            if not short:
                break
        value = max(v for v, _ in picks)
        _set_knob(index, name, value)
        tuned = tuning.recall(index)
        params = f"{name}={value}"
    if rerank:
        depth, _ = _smallest(index, "k_factor_rf", 1, MAX_K_FACTOR, tuning, min(aim, tuned))
        depth = min(2 * depth, MAX_K_FACTOR)  # twice as deep: nearly free (see above)
        _set_knob(index, "k_factor_rf", depth)
        tuned = tuning.recall(index)
        params = ",".join(p for p in (params, f"k_factor_rf={depth}") if p)
    checked = check.recall(index)
    if short and name == "efSearch":  # no graph search worth making reaches the target
        why = (f"graph reached recall@{k} {checked:.3f} at efSearch {value} (target "
               f"{target:g}), the deepest search computing distances to at most "
               f"{GRAPH_MAX_SCAN_SHARE:.0%} of its rows")  # fmt: skip
        LOG.warning("this segment is searched exactly (Flat): its %s; a graph built with a "
                    "higher AnnPolicy.ef_construction may reach it", why)  # fmt: skip
        return Tuning("", 1.0, 1.0, target, k, len(check.queries), noise, exact=why, probes=kind)
    if short:  # the largest knob tried and still short on a choosing third
        more = "use finer codes"
        LOG.warning(
            "this segment's vector index reached recall@%d %.3f on %s at its largest %s (%d), "
            "below the target %g: %s, or index it exactly (index_factory='Flat')",
            k, tuned, "your queries" if kind == USER_QUERIES else "held-out rows", name, value,
            target, more,
        )  # fmt: skip
    curve = None
    if not rerank:  # what a search over several segments allocates knobs from: at the
        # standard noise (a segment's own top ranks, what it gives a merged top k, are easy)
        if curve_noise != noise:
            queries, truth, source = _probes(
                sample, sample_rows, chunks, n_queries, curve_noise, seed, k
            )
        every = _Queries(queries, truth, source, k)
        curve = recall_curve(index, name, knob_ladder(first if name == "nprobe" else k, value),
                             every)  # fmt: skip
        _set_knob(index, name, value)
    LOG.info(
        "%s gives recall@%d=%.3f on %d tuning queries, %.3f on %d check queries",
        params, k, tuned, len(tuning.queries), checked, len(check.queries),
    )  # fmt: skip
    return Tuning(params, checked, tuned, target, k, len(check.queries), noise, curve, probes=kind)


def _deepest_worth(index: faiss.Index, start: int, choosers: list[_Queries]) -> int:
    """The largest ``efSearch`` (``start`` doubled) at which one query of ``choosers`` computes
    distances to at most :data:`GRAPH_MAX_SCAN_SHARE` of the graph's rows on average, or
    ``start`` when already the next doubling does not (counted by FAISS's HNSW statistics,
    process-wide: a search on another thread meanwhile makes it smaller, never larger)."""
    n_queries = sum(len(c.queries) for c in choosers)
    budget = GRAPH_MAX_SCAN_SHARE * index.ntotal
    value = start
    while n_queries and value * 2 <= index.ntotal:
        _set_knob(index, "efSearch", value * 2)
        stats = faiss.cvar.hnsw_stats  # type: ignore[attr-defined]
        stats.reset()
        for c in choosers:
            index.search(c.queries, c.k + (0 if c.source is None else 1))
        if stats.ndis / n_queries > budget:
            break
        value *= 2
    _set_knob(index, "efSearch", value)
    return value


def exact_index(index: faiss.Index) -> faiss.Index:
    """An exact (``Flat``) inner-product index of the vectors ``index`` holds, in its row order:
    what a segment whose graph cannot reach its target (:attr:`Tuning.exact`) is searched
    with. A graph's own stored vectors are copied, so nothing is recomputed."""
    inner = faiss.downcast_index(index)
    vectors = (faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSW)
               else inner).reconstruct_n(0, index.ntotal)  # fmt: skip
    flat = faiss.IndexFlatIP(index.d)
    flat.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return flat


def _probes(
    sample: np.ndarray,
    sample_rows: np.ndarray | None,
    chunks: Callable[[], Iterable[np.ndarray]],
    n_queries: int,
    noise: float,
    seed: int,
    k: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """:func:`held_out_queries` with their exact top ``k`` (each without its own row when
    ``sample_rows`` are given): ``(queries, truth, source rows or None)``."""
    queries, pick = held_out_queries(sample, n_queries, noise=noise, seed=seed)
    extra = 1 if sample_rows is not None else 0
    source = np.asarray(sample_rows, np.int64)[pick] if sample_rows is not None else None
    _, truth = exact_knn(queries, chunks(), k + extra)
    if source is not None:
        truth = _drop_source(truth, source, k)
    return queries, truth, source


def _user_queries(
    queries: np.ndarray, chunks: Callable[[], Iterable[np.ndarray]], seed: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The user's ``queries`` (unit rows, float32 (q, d)) in a seeded order (a log's queries
    come in time order; the thirds :func:`tune` splits them in should not) with their exact
    top ``k``: ``(queries, truth)``."""
    queries = as_f32(queries)
    if queries.ndim != 2 or len(queries) < MIN_USER_QUERIES:
        raise ValueError(f"tune: give at least {MIN_USER_QUERIES} queries as a (q, d) array, "
                         f"got shape {queries.shape}")  # fmt: skip
    queries = queries[np.random.default_rng(seed).permutation(len(queries))]
    queries = queries / (np.linalg.norm(queries, axis=1, keepdims=True) + 1e-12)
    return queries, exact_knn(queries, chunks(), k)[1]


def knob_ladder(first: int, last: int) -> list[int]:
    """The knob values a recall curve is measured at: ``first``, then steps of about 1.5x and
    2x alternately (10, 15, 20, 30, 40, 60, ...), up to and including ``last``."""
    out, value = [], max(1, first)
    while value < last:
        out.append(value)
        half = value * 3 // 2
        if value < half < last:
            out.append(half)
        value *= 2
    return [*out, last]


def recall_curve(index: faiss.Index, name: str, values: list[int], queries: _Queries) -> Curve:
    """For each value of knob ``name`` (ascending), the share of ``queries`` whose true rank-r
    neighbour (r = 1..k) the search finds: ``Curve.found[i][r - 1]``. A search finds its
    rank-r neighbour wherever it asks for at least r rows (its answers are exactly scored and
    sorted), so the curve serves any k. The knob is left at the last value."""
    found = []
    for value in values:
        _set_knob(index, name, value)
        found.append(tuple(round(x, 4) for x in queries.found_by_rank(index).tolist()))
    return Curve(name, tuple(values), tuple(found))


def _at(source: np.ndarray | None, part: slice) -> np.ndarray | None:
    return None if source is None else source[part]


@dataclass(frozen=True)
class _Queries:
    """Queries with their exact answers (and the rows to leave out of the index's answers)."""

    queries: np.ndarray
    truth: np.ndarray
    source: np.ndarray | None
    k: int

    def found(self, index: faiss.Index) -> np.ndarray:
        """int64 (q, k): each query's answer from ``index``, without its own row."""
        extra = 0 if self.source is None else 1
        _, found = index.search(self.queries, self.k + extra)
        if self.source is not None:
            found = _drop_source(found, self.source, self.k)
        return np.asarray(found)

    def recall(self, index: faiss.Index) -> float:
        return recall_at_k(self.found(index), self.truth, self.k)

    def sampling_error(self, index: faiss.Index) -> float:
        """The standard error of :meth:`recall` as the mean of the queries' own recalls."""
        pairs = zip(self.found(index), self.truth, strict=True)
        per = np.array([recall_at_k(f[None], t[None], self.k) for f, t in pairs])
        if len(per) < 2:
            return 0.0
        # per-query recall is bounded and skewed: a sample missing the hard queries has a high
        # mean and a small spread at once, so the spread is floored at a binomial one's
        mean = float(per.mean())
        var = max(float(per.var(ddof=1)), mean * (1.0 - mean) / self.k)
        return math.sqrt(var / len(per))

    def found_by_rank(self, index: faiss.Index) -> np.ndarray:
        """float64 (k,): the share of the queries whose true rank-r row the index finds."""
        found = self.found(index)
        truth = self.truth[:, : self.k]
        valid = truth >= 0  # a segment of fewer than k + 1 rows has no deeper ranks
        hit = (truth[:, :, None] == found[:, None, : self.k]).any(axis=2) & valid
        counts = valid.sum(axis=0)
        return np.where(counts > 0, hit.sum(axis=0) / np.maximum(counts, 1), 1.0)


def tune_search(
    index: faiss.Index,
    sample: np.ndarray,
    chunks: Callable[[], Iterable[np.ndarray]],
    target: float | None = None,
    k: int = 10,
    n_queries: int = 768,
    seed: int = 0,
    noise: float | None = None,
    sample_rows: np.ndarray | None = None,
    policy: AnnPolicy = DEFAULT,
) -> tuple[str, float]:
    """:func:`tune`'s ``(params, recall on the check queries)``."""
    t = tune(
        index, sample, chunks, sample_rows=sample_rows, target=target, k=k,
        n_queries=n_queries, seed=seed, noise=noise, policy=policy,
    )  # fmt: skip
    return t.params, t.recall


def tune_segment(
    index: faiss.Index,
    chunks: Callable[[], Iterable[np.ndarray]],
    policy: AnnPolicy = DEFAULT,
    *,
    seed: int = 0,
    queries: np.ndarray | None = None,
) -> Tuning:
    """Tune a segment's approximate ``index`` (filled with every vector ``chunks()`` yields, in
    order) as every write does: :func:`tune` on held-out rows of a seeded uniform sample of at
    most :data:`SAMPLE_ROWS` of them, for ``policy``; or, given them, on the user's own
    ``queries`` (float32 (q, d) in the searched space)."""
    if queries is not None:
        return tune(index, np.zeros((0, index.d), np.float32), chunks, policy=policy,
                    seed=seed, queries=queries)  # fmt: skip
    sample, positions = _sample(chunks(), int(index.ntotal), SAMPLE_ROWS, seed)
    return tune(index, sample, chunks, sample_rows=positions, policy=policy)


def _sample(
    chunks: Iterable[np.ndarray], n_rows: int, n: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded uniform sample of at most ``n`` of ``n_rows`` vectors given chunk by chunk, and
    their positions (int64)."""
    rate = min(1.0, n / max(n_rows, 1))
    rng = np.random.default_rng(seed)
    picked, positions, start = [], [], 0
    for chunk in chunks:
        keep = np.ones(len(chunk), bool) if rate >= 1 else rng.random(len(chunk)) < rate
        picked.append(as_f32(chunk)[keep])
        positions.append(start + np.flatnonzero(keep))
        start += len(chunk)
    if not picked:
        return np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.int64)
    return np.concatenate(picked), np.concatenate(positions).astype(np.int64)
