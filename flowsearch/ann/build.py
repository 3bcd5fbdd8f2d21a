r"""Building a vector index: train on a sample, add chunk by chunk, tune the search knob.

Building streams: train on a sample, then add vectors chunk by chunk, so memory does not grow
with the segment beyond the index itself. ``auto``'s approximate indexes are then tuned: the
search knob (HNSW ``efSearch``, IVF ``nprobe``, a re-rank's ``k_factor``) is raised until
recall@10 against exact search reaches ``Settings.target_recall`` on queries that look like
queries: held-out rows (each left out of its own answer) moved by noise
(:func:`held_out_queries`); the recall is then checked on other such queries, not tuned on,
and recorded (:func:`tune`, :class:`Tuning`).

Every segment's index starts here (:func:`segment_index`), and every write builds it with
:func:`train`, :func:`add` and :func:`finished`. ``auto``'s graph over a large segment
(``Settings.projected_graph_min_rows``; off by default) is a :class:`ProjectedGraph`:
built over the rows' first principal components, it becomes an ordinary HNSW index of the
full vectors.

Example:
    >>> x = np.eye(4, dtype=np.float32)
    >>> index, factory, params = build(x, "auto")
    >>> factory, index.search(x[:1], 2)[1].tolist()
    ('Flat', [[0, 1]])
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from flowsearch.ann.factory import auto_factory, new_index, reason
from flowsearch.ann.merged import Curve
from flowsearch.errors import BadInput
from flowsearch.settings import Settings, current

__all__ = [
    "Projection",
    "ProjectedGraph",
    "TUNER_VERSION",
    "add",
    "as_f32",
    "build",
    "check_projection_settings",
    "finished",
    "projection_for",
    "projection_of",
    "segment_index",
    "Tuning",
    "exact_knn",
    "held_out_queries",
    "knob_ladder",
    "probe_queries",
    "recall_at_k",
    "recall_curve",
    "search_knob",
    "train",
    "training_sample",
    "tune",
    "tune_search",
]

LOG = logging.getLogger(__name__)

#: The version of :func:`tune`'s rule, recorded with every segment's tuning: raised whenever
#: the rule changes what it picks, so ``compact`` re-tunes segments an older rule tuned.
#: 2: 768 probes, the larger of two thirds' picks, noise 1.5 per decade of rows (before it,
#: unrecorded: fewer probes and one pick, which left 20k-50k-row segments under the target
#: on real queries).
TUNER_VERSION = 2


def as_f32(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {x.shape}")
    return x


@dataclass(frozen=True)
class Projection:
    """How a :class:`ProjectedGraph` is built: its graph over the rows' first ``dims``
    principal components (fitted on ``sample_rows`` seeded rows), at ``ef_construction``."""

    dims: int
    ef_construction: int
    sample_rows: int


def _positive(name: str, value: object, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "a positive integer" if least == 1 else f"an integer of at least {least}"
        raise BadInput(
            f"Settings.{name} must be {kind}, got {value!r}",
            fix=f"set {name} to a whole number of at least {least} (its default: "
            f"{getattr(Settings(), name)})",
        )
    return value


def check_projection_settings() -> Projection:
    """The projected graph's settings, checked (before a build encodes anything): the
    :class:`Projection` they describe.

    Raises:
        BadInput: a projected-graph setting is not a positive integer, or its sample holds
            fewer rows than its components.
    """
    s = current()
    _positive("projected_graph_min_rows", s.projected_graph_min_rows, least=0)  # 0: off
    dims = _positive("projected_graph_dims", s.projected_graph_dims)
    ef = _positive("projected_graph_ef_construction", s.projected_graph_ef_construction)
    sample = _positive("projected_graph_sample_rows", s.projected_graph_sample_rows)
    if sample < dims:
        raise BadInput(
            f"Settings.projected_graph_sample_rows ({sample}) is below projected_graph_dims "
            f"({dims}): a PCA needs at least as many rows as components",
            fix="raise projected_graph_sample_rows or lower projected_graph_dims",
        )
    return Projection(dims, ef, sample)


def projection_for(factory: str, n_rows: int, dim: int) -> Projection | None:
    """How ``auto``'s graph ``factory`` over ``n_rows`` rows of ``dim`` dimensions is built:
    a :class:`Projection` when ``Settings.projected_graph_min_rows`` is set (not 0: off, the
    default) and the segment has at least that many rows, ``factory`` is a plain ``HNSW<M>``
    graph and ``Settings.projected_graph_dims`` is below ``dim``; else None (built over the
    full vectors).

    Raises:
        BadInput: a projected-graph setting is not a positive integer, or its sample holds
            fewer rows than its components.
    """
    projection = check_projection_settings()
    least = current().projected_graph_min_rows
    if not least or n_rows < least or projection.dims >= dim or _graph_m(factory) is None:
        return None
    return projection


def _graph_m(factory: str) -> int | None:
    """``M`` of a plain ``HNSW<M>`` factory (full vectors, no codes or re-rank), else None."""
    found = re.fullmatch(r"HNSW(\d+)(?:,Flat)?", factory.strip())
    return int(found.group(1)) if found else None


class ProjectedGraph:
    """An HNSW graph being built over the rows' first principal components, beside the full
    rows; :meth:`finish` returns an ordinary ``IndexHNSWFlat`` of the full vectors with that
    graph (so searches and their scores are exact inner products over the full vectors).

    Each distance the build computes reads ``dims`` floats instead of ``d``: at 1M ``static``
    rows, HNSW32 over 128 of 384 components at ``efConstruction`` 28 built in 190 s against
    415 s for the full graph at 40, for the same recall at each ``efSearch`` within 0.01
    (benchmarks/RESULTS.md, bench_ann_study). The components are those of the rows' second
    moments (a PCA of the sample and its mirror image, so centred on 0): the projection keeps
    the inner products the graph is built by, not distances about the rows' mean.

    Streams as an index does: :meth:`train` fits the PCA on a sample (seeded, at most
    ``Projection.sample_rows``), then :meth:`add` inserts chunks (projected into the graph,
    full rows into the storage). FAISS's thread settings apply to both, as to any build.
    """

    def __init__(self, dim: int, m: int, projection: Projection) -> None:
        self.d = dim
        self.m = m
        self.projection = projection
        self._pca = faiss.PCAMatrix(dim, projection.dims)
        self._low = faiss.IndexHNSWFlat(projection.dims, m, faiss.METRIC_INNER_PRODUCT)
        self._low.hnsw.efConstruction = projection.ef_construction
        self._full = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)

    @property
    def is_trained(self) -> bool:
        return bool(self._pca.is_trained)

    @property
    def ntotal(self) -> int:
        return int(self._low.ntotal)

    def train(self, sample: np.ndarray, seed: int = 0) -> None:
        """Fit the projection on at most ``Projection.sample_rows`` of ``sample`` (float32
        (m, d), a uniform sample of the rows to come; seeded)."""
        sample = as_f32(sample)
        if len(sample) < self.projection.dims:
            raise BadInput(
                f"cannot fit {self.projection.dims} principal components on {len(sample)} rows",
                fix="lower Settings.projected_graph_dims or raise projected_graph_min_rows",
            )
        if len(sample) > self.projection.sample_rows:
            pick = np.random.default_rng(seed).choice(
                len(sample), size=self.projection.sample_rows, replace=False
            )
            sample = sample[np.sort(pick)]
        self._pca.train(np.concatenate([sample, -sample]))  # mean 0: second moments

    def add(self, vectors: np.ndarray) -> None:
        """Insert rows (float32 (n, d)); their ids continue from :attr:`ntotal`."""
        if not self.is_trained:
            raise RuntimeError("the projection is not trained: train() first")
        vectors = as_f32(vectors)
        self._low.add(self._pca.apply(vectors))
        self._full.storage.add(vectors)

    def finish(self) -> faiss.Index:
        """The ``IndexHNSWFlat`` of the full vectors with the graph built so far (the
        projected rows are then freed; nothing can be added to this object after)."""
        full = self._full
        full.hnsw = self._low.hnsw  # a copy of the graph; searches read the full vectors
        full.ntotal = self._low.ntotal
        self._low.reset()
        return full


#: What a segment's index is while it is built: a FAISS index or a projected graph.
BuildIndex = faiss.Index | ProjectedGraph


def segment_index(
    dim: int, requested: str, n_rows: int, factory: str | None = None
) -> tuple[BuildIndex, str]:
    """The empty index a segment of ``n_rows`` rows gets for ``requested`` (``auto`` or a
    factory string) and its resolved factory (``factory``: already resolved): ``auto``'s graph
    over at least ``Settings.projected_graph_min_rows`` rows is a :class:`ProjectedGraph`
    (:func:`projection_for`), anything else :func:`new_index`."""
    resolved = factory or (auto_factory(n_rows, dim=dim) if requested == "auto" else requested)
    projection = projection_for(resolved, n_rows, dim) if requested == "auto" else None
    m = _graph_m(resolved)
    if projection is not None and m is not None:
        return ProjectedGraph(dim, m, projection), resolved
    return new_index(dim, resolved), resolved


def finished(index: BuildIndex) -> faiss.Index:
    """The FAISS index a build leaves: a :class:`ProjectedGraph` finished, others as they are."""
    return index.finish() if isinstance(index, ProjectedGraph) else index


def projection_of(index: BuildIndex) -> Projection | None:
    """How ``index`` is being built (a :class:`ProjectedGraph`'s projection), else None."""
    return index.projection if isinstance(index, ProjectedGraph) else None


def _add(index: BuildIndex, vectors: np.ndarray, factory: str) -> None:
    try:
        index.add(vectors)
    except RuntimeError as exc:
        raise BadInput(
            f"FAISS cannot add vectors to index {factory!r} ({reason(exc)}); "
            "use 'auto', 'Flat' or an IVF/HNSW factory (ids are assigned by flowsearch)"
        ) from None


def training_sample(
    index: BuildIndex,
    rows: np.ndarray,
    project: Callable[..., tuple[np.ndarray, Any]],
    *,
    max_rows: int = 262_144,
    probe_rows: int = 4_096,
    seed: int = 0,
) -> np.ndarray:
    """The vectors an index is trained and tuned on: ``project(rows)`` for at most ``max_rows``
    of ``rows`` (float (m, d) raw vectors) when the index needs training, else for only
    ``probe_rows`` of them (the tuning queries are drawn from these): projecting a whole fit
    sample at once costs several copies of it in memory, for nothing when nothing is trained.
    """
    keep = max_rows if not index.is_trained else probe_rows
    if isinstance(index, ProjectedGraph) and not index.is_trained:
        keep = min(keep, index.projection.sample_rows)
    if len(rows) > keep:
        pick = np.random.default_rng(seed).choice(len(rows), size=keep, replace=False)
        rows = rows[np.sort(pick)]
    return project(rows, want_density=False)[0]


def train(
    index: BuildIndex, sample: np.ndarray, factory: str, *, max_rows: int = 262_144, seed: int = 0
) -> None:
    """Train ``index`` (if it needs training) on at most ``max_rows`` of ``sample`` (float32
    (m, d), a uniform sample of the vectors to come).

    IVF indexes train on at most ``Settings.ivf_train_per_list`` rows per list (10,000 at
    least, for a PQ's 256 centroids per sub-quantizer) for ``Settings.ivf_train_iterations``
    k-means iterations: at 1M rows FAISS's defaults (256 rows per list, 25 iterations) did not
    finish in 6 CPU-minutes.
    The PQ's k-means (256 centroids per sub-quantizer) gets the same bounds: at most 16,384
    residuals, 10 iterations. IVF-PQ skips FAISS's polysemous training (re-ordering the PQ codes
    for Hamming-distance filtering, which flowsearch never turns on): on 8,000 rows it made
    training 10x slower.

    Raises:
        BadInput: FAISS cannot train this factory on so few rows.
    """
    if index.is_trained:
        return
    sample = as_f32(sample)
    if isinstance(index, ProjectedGraph):
        index.train(sample, seed=seed)
        return
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:  # k-means costs rows x lists x dim per iteration: bound both factors
        max_rows = min(max_rows, max(current().ivf_train_per_list * int(ivf.nlist), 10_000))
        ivf.cp.niter = current().ivf_train_iterations
        ivfpq: Any = faiss.downcast_index(ivf)
        if isinstance(ivfpq, faiss.IndexIVFPQ):
            # FAISS's default; nothing here searches with it, and it was 90% of training time
            ivfpq.do_polysemous_training = False  # type: ignore[attr-defined]
            ivfpq.pq.cp.niter = (
                current().ivf_train_iterations
            )  # the PQ's k-means: 256 centroids per
            ivfpq.pq.cp.max_points_per_centroid = current().ivf_train_per_list  # sub-quantizer
    if len(sample) > max_rows:
        rng = np.random.default_rng(seed)
        sample = sample[np.sort(rng.choice(len(sample), size=max_rows, replace=False))]
    try:
        index.train(sample)
    except RuntimeError as exc:
        raise BadInput(
            f"cannot train FAISS index {factory!r} on {len(sample)} rows ({reason(exc)}); "
            "use a smaller factory (e.g. fewer IVF lists) or 'auto'"
        ) from None


def add(index: BuildIndex, vectors: np.ndarray, factory: str | None = None) -> None:
    """Append vectors (float32 (n, d)); their ids continue from ``index.ntotal``."""
    _add(index, as_f32(vectors), factory or type(index).__name__)


def build(
    vectors: np.ndarray,
    factory: str = "auto",
    *,
    flat_max_rows: int | None = None,
    graph_max_rows: int | None = None,
    target_recall: float | None = None,
    chunk_rows: int = 65_536,
) -> tuple[faiss.Index, str, str]:
    """An index over vectors already in memory (float32 (n, d), unit rows), built the way ingest
    streams it: train on a sample, add chunk by chunk, tune ``auto``'s search parameter.

    Returns ``(index, resolved factory, params)``; ``params`` as :func:`tune_search` gives it
    (``""`` unless ``factory`` is ``auto`` and approximate).
    """
    vectors = as_f32(vectors)
    resolved = factory
    if factory == "auto":
        resolved = auto_factory(
            len(vectors), flat_max_rows, graph_max_rows=graph_max_rows, dim=vectors.shape[1]
        )
    building, _ = segment_index(vectors.shape[1], factory, len(vectors), resolved)
    train(building, vectors, resolved)
    for start in range(0, len(vectors), chunk_rows):
        add(building, vectors[start : start + chunk_rows], resolved)
    index = finished(building)
    params = ""
    if factory == "auto":
        chunks = lambda: (vectors[i : i + chunk_rows] for i in range(0, len(vectors), chunk_rows))  # noqa: E731
        params, _ = tune_search(
            index, vectors, chunks, target=target_recall, sample_rows=np.arange(len(vectors))
        )
    return index, resolved, params


def recall_at_k(found: np.ndarray, truth: np.ndarray, k: int = 10) -> float:
    """Mean share of each row of ``truth[:, :k]`` found in ``found[:, :k]`` (int64 (q, >=k))."""
    hits = [
        len(set(f[:k].tolist()) & set(t[:k].tolist())) for f, t in zip(found, truth, strict=True)
    ]
    return float(np.mean(hits) / k) if hits else 1.0


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
    ``Settings.query_noise`` is chosen so the recall these queries see matches real queries'.
    """
    sample = as_f32(sample)
    noise = current().query_noise if noise is None else noise
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(sample), size=min(n_queries, len(sample)), replace=False)
    scale = noise / math.sqrt(sample.shape[1])
    queries = (sample[pick] + rng.normal(scale=scale, size=(len(pick), sample.shape[1]))).astype(
        np.float32
    )
    queries /= np.linalg.norm(queries, axis=1, keepdims=True) + 1e-12
    return queries


def search_knob(index: faiss.Index) -> tuple[str, int] | None:
    """The search-time parameter that trades recall for speed, with its largest useful value:
    ``("nprobe", nlist)`` for IVF, ``("efSearch", Settings.max_ef_search)`` for HNSW,
    ``("k_factor_rf", Settings.max_k_factor)`` for any other index with an exact re-rank (a
    scan of codes, ``auto``'s scan tier: the re-rank depth is its only knob), None for exact
    indexes."""
    try:
        return "nprobe", int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        pass
    if isinstance(faiss.downcast_index(index), faiss.IndexHNSW):
        return "efSearch", current().max_ef_search
    if isinstance(faiss.downcast_index(index), faiss.IndexRefine):
        return "k_factor_rf", current().max_k_factor
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
    bisecting the last doubling to within an eighth of it (recall is monotone in these knobs up
    to sampling noise); the knob is left set to it."""
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
    while high - low > max(1, high // 8):
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
    """

    params: str
    recall: float
    tuned_recall: float
    target: float
    k: int
    queries: int
    noise: float
    curve: Curve | None = None


def held_out_queries(
    sample: np.ndarray,
    n_queries: int = 512,
    noise: float | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Tuning queries that look like queries: ``(queries float32 (q, d), source positions
    int64 (q,))``. Each is a row of ``sample`` (unit vectors, some of the indexed rows) moved
    by Gaussian noise of norm about ``noise`` (``Settings.query_noise``) and re-normalised;
    searching it, its own row is left out of both the answer and the truth
    (:func:`tune`), so it stands for a query whose text is *not* in the corpus, at the
    distance from its nearest rows that real queries have (the noise measured so,
    ``benchmarks/bench_ann_study.py``).
    """
    sample = as_f32(sample)
    noise = current().query_noise if noise is None else noise
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(sample), size=min(n_queries, len(sample)), replace=False)
    scale = noise / math.sqrt(sample.shape[1])
    queries = sample[pick] + rng.normal(scale=scale, size=(len(pick), sample.shape[1]))
    queries = queries.astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True) + 1e-12
    return queries, pick.astype(np.int64)


def noise_for_rows(n_rows: int) -> float:
    """The noise a segment of ``n_rows`` rows tunes its knob at: ``Settings.query_noise`` from
    ``Settings.query_noise_rows`` rows on, raised by ``Settings.query_noise_per_decade`` per
    tenfold fewer rows below (real queries are harder than held-out rows in a small corpus,
    bench_tuner).

    Example:
        >>> noise_for_rows(1_000_000), round(noise_for_rows(20_000), 2)
        (1.2, 1.8)
    """
    s = current()
    fewer = math.log10(s.query_noise_rows / max(n_rows, 1))
    return s.query_noise + s.query_noise_per_decade * max(0.0, fewer)


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
) -> Tuning:
    """Set the ``nprobe`` (IVF) or ``efSearch`` (HNSW) that makes recall@k against exact search
    reach ``target`` on :func:`held_out_queries`: the smallest value (from 16; doubled, then
    the last doubling bisected) that reaches it on the first third of them and the one for the
    second third are found apart and the larger is set (a margin as wide as their sampling
    error); then measure the recall it gives on the last third (rows it was not chosen on):
    that is the recall recorded (:attr:`Tuning.recall`).

    ``sample_rows`` are the positions in the index of ``sample``'s rows: with them each query's
    own row is left out of the answer and the truth (a held-out row); without them (None) it
    stays in (the row itself is then usually its query's nearest neighbour, an easier query).

    An index with an exact re-rank (:func:`refined`) has a second knob, the re-rank depth
    ``k_factor``: ``nprobe`` is chosen with the deepest re-rank (``Settings.max_k_factor``), then
    twice the smallest ``k_factor`` that still reaches the target at that ``nprobe``; the target
    is raised for it (``Settings.rerank_miss_share``). Twice: at 1M rows and the ``nprobe``
    tuning picks, re-ranking 4x more candidates cost 4% of the QPS (scanning the lists
    dominates) and is where real queries' recall kept rising.

    Args:
        index: a trained, filled index.
        sample: float32 (m, d), some of the indexed vectors (the queries' sources).
        chunks: returns an iterator over all the vectors added to ``index``, in order (for the
            exact answers, computed chunk by chunk).
        sample_rows: int64 (m,), ``sample``'s positions in the index.
        target: recall@k to reach (``Settings.target_recall``).
        k: neighbours compared.
        n_queries: queries drawn (two thirds to choose, one third to check).
        seed: sampling seed.
        noise: norm of the noise that moves each query off its row (default:
            :func:`noise_for_rows` of the index's rows for the knob, ``Settings.query_noise``
            for the recall curve).
    """
    knob = search_knob(index)
    target = current().target_recall if target is None else target
    curve_noise = current().query_noise if noise is None else noise
    noise = noise_for_rows(index.ntotal) if noise is None else noise
    if knob is None:
        return Tuning("", 1.0, 1.0, target, k, 0, noise)
    name, largest = knob
    queries, truth, source = _probes(sample, sample_rows, chunks, n_queries, noise, seed, k)
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
        _set_knob(index, "k_factor_rf", current().max_k_factor)
        aim = 1.0 - (1.0 - target) * current().rerank_miss_share
    params = ""
    short = False
    if name == "k_factor_rf":  # the re-rank depth is the only knob: tuned below
        tuned = tuning.recall(index)
    else:
        first = 1 if name == "nprobe" else 16
        # the larger of the knobs two independent sets of queries choose: near the target a
        # recall curve is flat, so one set's sampling error moved the knob 1.8x between seeds
        # and real queries fell short in half the runs at 20k rows (bench_tuner)
        picks = [_smallest(index, name, first, largest, c, aim) for c in choosers]
        value = max(v for v, _ in picks)
        short = any(v >= largest and r < aim for v, r in picks)
        _set_knob(index, name, value)
        tuned = tuning.recall(index)
        params = f"{name}={value}"
    if rerank:
        depth, _ = _smallest(
            index, "k_factor_rf", 1, current().max_k_factor, tuning, min(aim, tuned)
        )
        depth = min(2 * depth, current().max_k_factor)  # twice as deep: nearly free (see above)
        _set_knob(index, "k_factor_rf", depth)
        tuned = tuning.recall(index)
        params = ",".join(p for p in (params, f"k_factor_rf={depth}") if p)
    checked = check.recall(index)
    if short:  # the largest knob tried and still short on a choosing third
        more = "raise Settings.max_ef_search" if name == "efSearch" else "use finer codes"
        LOG.warning(
            "this segment's vector index reached recall@%d %.3f on held-out rows at its largest "
            "%s (%d), below the target %g: %s, or index it exactly (index_factory='Flat')",
            k, tuned, name, value, target, more,
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
    return Tuning(params, checked, tuned, target, k, len(check.queries), noise, curve)


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

    def recall(self, index: faiss.Index) -> float:
        extra = 0 if self.source is None else 1
        _, found = index.search(self.queries, self.k + extra)
        if self.source is not None:
            found = _drop_source(found, self.source, self.k)
        return recall_at_k(found, self.truth, self.k)

    def found_by_rank(self, index: faiss.Index) -> np.ndarray:
        """float64 (k,): the share of the queries whose true rank-r row the index finds."""
        extra = 0 if self.source is None else 1
        _, found = index.search(self.queries, self.k + extra)
        if self.source is not None:
            found = _drop_source(found, self.source, self.k)
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
) -> tuple[str, float]:
    """:func:`tune`'s ``(params, recall on the check queries)``."""
    t = tune(
        index, sample, chunks, sample_rows=sample_rows, target=target, k=k,
        n_queries=n_queries, seed=seed, noise=noise,
    )  # fmt: skip
    return t.params, t.recall
