r"""The FAISS index: thin wrappers to choose a factory, train, fill, tune, search, save, use GPUs.

Every FAISS index here uses inner product on L2-normalised vectors (cosine similarity). FAISS ids
are global row numbers, assigned in insertion order, so a hit's id is the row to fetch from the
shards. Building streams: train on a sample, then add chunk by chunk (:func:`new_index`,
:func:`train`, :func:`add`), so memory does not grow with the corpus.

``"auto"`` is exact ``Flat`` up to :data:`AUTO_FLAT_MAX_ROWS` rows; above that ``HNSW32`` whose
``efSearch`` is raised until recall@10 against exact search reaches :data:`AUTO_TARGET_RECALL` on
tuning queries drawn near the corpus's own vectors (:func:`tune_search`, :func:`probe_queries`);
above :data:`AUTO_GRAPH_MAX_ROWS`, IVF-PQ with an exact re-rank (:func:`large_factory`,
``IVF{nlist},PQ{m},RFlat``): the PQ codes pick ``k * k_factor`` candidates from ``nprobe`` lists
and their full-precision vectors re-rank them; both knobs are tuned the same way. The
full-precision vectors sit at the end of ``index.faiss`` and are memory-mapped by
``Searcher.open(..., mmap=True)`` (:func:`mmap_flags`), so serving needs RAM only for the PQ
codes (m + 8 bytes per row).

Example:
    >>> x = np.eye(4, dtype=np.float32)
    >>> index = new_index(4, "Flat")
    >>> add(index, x)
    >>> search(index, x[:1], k=2)[1].tolist()
    [[0, 1]]
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from flowsearch.errors import FlowsearchError
from flowsearch.storage.manifest import IVF_DATA_FILE

__all__ = [
    "AUTO_FLAT_MAX_ROWS",
    "AUTO_GRAPH_FACTORY",
    "AUTO_GRAPH_MAX_ROWS",
    "AUTO_MAX_EF_SEARCH",
    "AUTO_MAX_K_FACTOR",
    "AUTO_QUERY_NOISE",
    "AUTO_RERANK_MISS_SHARE",
    "AUTO_TARGET_RECALL",
    "ONE_THREAD_MAX_QUERIES",
    "add",
    "auto_factory",
    "build",
    "check_factory",
    "exact_knn",
    "ivf_factory",
    "fill_part",
    "large_factory",
    "merge_on_disk",
    "mergeable",
    "mmap_flags",
    "new_index",
    "num_gpus",
    "probe_queries",
    "read_index",
    "recall_at_k",
    "refined",
    "search",
    "search_knob",
    "set_params",
    "single_threaded",
    "to_gpu",
    "train",
    "training_sample",
    "tune_search",
    "write_index",
]

LOG = logging.getLogger(__name__)

# faiss's bundled stubs lack the inverted-list classes' SWIG attributes.
_faiss: Any = faiss

#: Largest corpus "auto" indexes exactly (Flat).
AUTO_FLAT_MAX_ROWS = 100_000
#: What "auto" builds above :data:`AUTO_FLAT_MAX_ROWS`.
AUTO_GRAPH_FACTORY = "HNSW32"
#: recall@10 against exact search that "auto" tunes for.
AUTO_TARGET_RECALL = 0.95
#: Norm of the noise that moves a tuning query off its row (see :func:`probe_queries`).
AUTO_QUERY_NOISE = 0.5
#: Largest HNSW efSearch :func:`tune_search` tries.
AUTO_MAX_EF_SEARCH = 1024
#: Largest corpus "auto" indexes with :data:`AUTO_GRAPH_FACTORY`; above, IVF-PQ with an exact
#: re-rank (:func:`large_factory`). HNSW32 holds every vector plus its graph in RAM, at build and
#: at serving: ~1.8 KB per row at dim 384, ~3.3 KB at 768, so 2M rows are 3.7 / 6.6 GB, the most
#: that fits beside the encoder, BM25 and the page cache on a 16 GB machine; IVF-PQ serves from
#: m + 8 bytes per row (56 at 384) with the re-rank vectors memory-mapped (docs/SCALE.md).
AUTO_GRAPH_MAX_ROWS = 2_000_000
#: Largest re-rank depth (``k_factor``: candidates per wanted hit) :func:`tune_search` tries.
AUTO_MAX_K_FACTOR = 64
#: An index with a re-rank is tuned until its probe queries miss this share of what the target
#: allows (0.98 for 0.95): at 1M real-ish rows (benchmarks/bench_scale.py) real queries' recall@10
#: was 0.02-0.03 below the probe queries' at every setting (0.931 where probes saw 0.953, 0.958
#: where they saw 0.982); more probe noise did not close the gap (0.959 at noise 1.1).
AUTO_RERANK_MISS_SHARE = 0.4
#: IVF training: k-means on at most this many sample rows per list (FAISS warns below 39)...
IVF_TRAIN_PER_LIST = 64
#: ... for this many iterations (FAISS's default is 25): training stays a bounded cost.
IVF_TRAIN_ITERATIONS = 10


def _as_f32(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {x.shape}")
    return x


def auto_factory(
    n_rows: int,
    flat_max_rows: int | None = None,
    *,
    graph_max_rows: int | None = None,
    dim: int | None = None,
) -> str:
    """The factory string ``"auto"`` stands for at ``n_rows`` rows of ``dim`` dimensions.

    ``Flat`` (exact) up to ``flat_max_rows`` (default :data:`AUTO_FLAT_MAX_ROWS`); above,
    ``HNSW32``, whose ``efSearch`` is then tuned by :func:`tune_search`. Not IVF at that size: on
    a calibrated (whitened, isotropic) space an inverted file has no cluster structure to
    exploit, and at 200k static rows ``IVF2048,Flat`` needed half its lists for recall@10 0.94
    (benchmarks/bench_speed.md). HNSW needs no training, adds rows one by one (streaming) and
    costs about 260 bytes per row beside the vectors. Above ``graph_max_rows`` (default
    :data:`AUTO_GRAPH_MAX_ROWS`) the vectors no longer belong in RAM: :func:`large_factory`.
    The defaults are read at call time (tests lower them).

    Raises:
        ValueError: ``dim`` missing when the large factory is chosen.
    """
    flat_max = AUTO_FLAT_MAX_ROWS if flat_max_rows is None else flat_max_rows
    graph_max = AUTO_GRAPH_MAX_ROWS if graph_max_rows is None else graph_max_rows
    if n_rows <= flat_max:
        return "Flat"
    if n_rows <= graph_max:
        return AUTO_GRAPH_FACTORY
    if dim is None:
        raise ValueError("auto_factory needs dim above graph_max_rows (for the PQ code size)")
    return large_factory(n_rows, dim)


def _pq_subquantizers(dim: int) -> int:
    """Sub-quantizers of the large factory's PQ: about one per 8 dimensions (48 at 384), the
    largest such count that divides ``dim``."""
    m = max(1, dim // 8)
    while dim % m:
        m -= 1
    return m


def large_factory(n_rows: int, dim: int) -> str:
    """``IVF{nlist},PQ{m},RFlat``: IVF-PQ whose candidates are re-ranked exactly.

    ``nlist`` is the power of two nearest ``sqrt(n)``, with at least 39 training rows per list;
    ``m`` is :func:`_pq_subquantizers` (codes of ``m`` bytes). ``RFlat`` keeps the
    full-precision vectors (4 * dim bytes per row) for the re-rank, in the same file: on disk,
    memory-mapped when searching (:func:`mmap_flags`). Bare PQ is unusable for recall@10 on
    these spaces (0.55-0.61 at 200k, benchmarks/bench_speed.md); the re-rank wins it back.
    """
    nlist = 2 ** round(math.log2(math.sqrt(max(n_rows, 1))))
    while nlist > 1 and nlist * 39 > n_rows:
        nlist //= 2
    return f"IVF{nlist},PQ{_pq_subquantizers(dim)},RFlat"


def refined(factory: str) -> bool:
    """Whether a factory string ends in an exact re-rank (``,RFlat`` or ``,Refine(...)``)."""
    return bool(re.search(r"(^|,)\s*(RFlat|Refine\()", factory))


def mmap_flags(factory: str) -> int:
    """The FAISS read flags that memory-map an index of ``factory`` (faiss 1.15).

    ``IO_FLAG_MMAP_IFC`` maps flat code arrays: ``Flat``, HNSW's vectors, and, for an IVF index
    with a re-rank, both the re-rank vectors and the inverted lists (measured: anonymous RSS
    unchanged after opening a 54 MB ``IVF256,PQ16,RFlat``). A plain IVF index needs
    ``IO_FLAG_MMAP`` for its lists; combining both flags fails on IVF files.
    """
    ivf = "IVF" in factory.upper()
    flags = faiss.IO_FLAG_MMAP if ivf and not refined(factory) else faiss.IO_FLAG_MMAP_IFC
    return int(flags) | int(faiss.IO_FLAG_READ_ONLY)


def ivf_factory(n_rows: int) -> str:
    """``IVF{nlist},Flat`` with ``nlist`` the power of two nearest ``4 * sqrt(n)`` (FAISS's rule
    of thumb), keeping at least 39 training points per list (what ``auto`` chose before HNSW)."""
    nlist = 2 ** round(math.log2(4 * math.sqrt(max(n_rows, 1))))
    while nlist > 1 and nlist * 39 > n_rows:
        nlist //= 2
    return f"IVF{nlist},Flat"


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
    queries = _as_f32(queries)
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    start = 0
    for chunk in chunks:
        chunk = _as_f32(chunk)
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
    sample: np.ndarray, n_queries: int = 256, noise: float = AUTO_QUERY_NOISE, seed: int = 0
) -> np.ndarray:
    """Tuning queries: a seeded sample of ``sample``'s rows (unit vectors) moved by Gaussian
    noise of norm about ``noise``, re-normalised: float32 (min(n_queries, m), d).

    A query near the data but not one of its points has its neighbours spread over several IVF
    lists (or HNSW regions), as a real query's are; ``noise`` sets how far from the data, and
    :data:`AUTO_QUERY_NOISE` is chosen so the recall these queries see matches real queries'.
    """
    sample = _as_f32(sample)
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
    ``("nprobe", nlist)`` for IVF, ``("efSearch", AUTO_MAX_EF_SEARCH)`` for HNSW, None for exact
    indexes."""
    try:
        return "nprobe", int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        pass
    if isinstance(faiss.downcast_index(index), faiss.IndexHNSW):
        return "efSearch", AUTO_MAX_EF_SEARCH
    return None


def _set_knob(index: faiss.Index, name: str, value: int) -> None:
    if name == "nprobe":
        faiss.extract_index_ivf(index).nprobe = value
    elif name == "k_factor_rf":
        faiss.downcast_index(index).k_factor = value  # type: ignore[attr-defined]
    else:
        faiss.downcast_index(index).hnsw.efSearch = value  # type: ignore[attr-defined]


def _smallest(
    index: faiss.Index,
    name: str,
    first: int,
    largest: int,
    queries: np.ndarray,
    truth: np.ndarray,
    target: float,
    k: int,
) -> tuple[int, float]:
    """The smallest power-of-two multiple of ``first`` for knob ``name`` whose recall@k reaches
    ``target`` (``largest`` and its recall when none does); the knob is left set to it."""
    value = first
    while True:
        _set_knob(index, name, value)
        _, found = index.search(queries, k)
        recall = recall_at_k(found, truth, k)
        if recall >= target or value >= largest:
            return value, recall
        value = min(value * 2, largest)


def tune_search(
    index: faiss.Index,
    sample: np.ndarray,
    chunks: Callable[[], Iterable[np.ndarray]],
    target: float = AUTO_TARGET_RECALL,
    k: int = 10,
    n_queries: int = 256,
    seed: int = 0,
    noise: float = AUTO_QUERY_NOISE,
) -> tuple[str, float]:
    """Set the smallest power-of-two ``nprobe`` (IVF) or ``efSearch`` (HNSW, from 16) whose
    recall@k against exact search reaches ``target`` on :func:`probe_queries` of ``sample``.

    An index with an exact re-rank (:func:`refined`) has a second knob, the re-rank depth
    ``k_factor``: ``nprobe`` is chosen with the deepest re-rank (:data:`AUTO_MAX_K_FACTOR`), then
    twice the smallest ``k_factor`` that still reaches the target at that ``nprobe``; the target
    is raised for it (:data:`AUTO_RERANK_MISS_SHARE`: probe queries flatter IVF-PQ). Twice: at
    1M rows and the ``nprobe`` tuning picks, re-ranking 4x more candidates cost 4% of the QPS
    (scanning the lists dominates) and is where real queries' recall kept rising.

    Returns ``(params, recall)``: the parameter string to store (``"nprobe=32"``,
    ``"efSearch=64"``, ``"nprobe=64,k_factor_rf=16"``, ``""`` for an exact index) and the recall
    reached (the largest value's when none reaches ``target``).

    Args:
        index: a trained, filled index.
        sample: float32 (m, d), some of the indexed vectors (to draw queries near).
        chunks: returns an iterator over all the vectors added to ``index``, in order (for the
            exact answers, computed chunk by chunk).
        target: recall@k to reach.
        k: neighbours compared.
        n_queries: size of the query sample.
        seed: sampling seed.
        noise: norm of the noise that moves each query off its row.
    """
    knob = search_knob(index)
    if knob is None:
        return "", 1.0
    name, largest = knob
    queries = probe_queries(sample, n_queries, noise=noise, seed=seed)
    _, truth = exact_knn(queries, chunks(), k)
    rerank = isinstance(faiss.downcast_index(index), faiss.IndexRefine)
    if rerank:
        _set_knob(index, "k_factor_rf", AUTO_MAX_K_FACTOR)
        target = 1.0 - (1.0 - target) * AUTO_RERANK_MISS_SHARE
    first = 1 if name == "nprobe" else 16
    value, recall = _smallest(index, name, first, largest, queries, truth, target, k)
    params = f"{name}={value}"
    if rerank:
        depth, _ = _smallest(
            index, "k_factor_rf", 1, AUTO_MAX_K_FACTOR, queries, truth, min(target, recall), k
        )
        depth = min(2 * depth, AUTO_MAX_K_FACTOR)  # twice as deep: nearly free (see below)
        _set_knob(index, "k_factor_rf", depth)
        recall = recall_at_k(index.search(queries, k)[1], truth, k)
        params += f",k_factor_rf={depth}"
    LOG.info("%s gives recall@%d=%.3f on %d tuning queries", params, k, recall, len(queries))
    return params, recall


def _reason(exc: BaseException) -> str:
    """FAISS's message without the C++ signature and source location."""
    lines = str(exc).strip().splitlines()
    return re.split(r"\.(?:cpp|h):\d+: ", lines[-1])[-1][:200] if lines else type(exc).__name__


def _make(dim: int, factory: str) -> faiss.Index:
    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise FlowsearchError(
            f"FAISS rejects index factory {factory!r} ({_reason(exc)}); try 'auto' or 'Flat'"
        ) from None


def check_factory(factory: str, dim: int) -> None:
    """Fail early (before any encoding) on a factory string FAISS rejects at dimension ``dim``.

    Raises:
        FlowsearchError: naming the factory and FAISS's reason.
    """
    if factory == "auto":
        return
    index = _make(dim, factory)
    if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        raise FlowsearchError(
            f"index factory {factory!r}: IDMap is not supported (flowsearch assigns the ids); "
            "drop the 'IDMap,' prefix"
        )


def _add(index: faiss.Index, vectors: np.ndarray, factory: str) -> None:
    try:
        index.add(vectors)
    except RuntimeError as exc:
        raise FlowsearchError(
            f"FAISS cannot add vectors to index {factory!r} ({_reason(exc)}); "
            "use 'auto', 'Flat' or an IVF/HNSW factory (ids are assigned by flowsearch)"
        ) from None


def new_index(dim: int, factory: str) -> faiss.Index:
    """An empty inner-product FAISS index of ``dim`` dimensions from a resolved factory string.

    Raises:
        FlowsearchError: a factory string FAISS rejects.
    """
    return _make(dim, factory)


def training_sample(
    index: faiss.Index,
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
    if len(rows) > keep:
        pick = np.random.default_rng(seed).choice(len(rows), size=keep, replace=False)
        rows = rows[np.sort(pick)]
    return project(rows, want_density=False)[0]


def train(
    index: faiss.Index, sample: np.ndarray, factory: str, *, max_rows: int = 262_144, seed: int = 0
) -> None:
    """Train ``index`` (if it needs training) on at most ``max_rows`` of ``sample`` (float32
    (m, d), a uniform sample of the vectors to come).

    IVF indexes train on at most :data:`IVF_TRAIN_PER_LIST` rows per list (10,000 at least, for
    a PQ's 256 centroids per sub-quantizer) for :data:`IVF_TRAIN_ITERATIONS` k-means iterations:
    at 1M rows FAISS's defaults (256 rows per list, 25 iterations) did not finish in 6 CPU-minutes.
    The PQ's k-means (256 centroids per sub-quantizer) gets the same bounds: at most 16,384
    residuals, 10 iterations. IVF-PQ skips FAISS's polysemous training (re-ordering the PQ codes
    for Hamming-distance filtering, which flowsearch never turns on): on 8,000 rows it made
    training 10x slower.

    Raises:
        FlowsearchError: FAISS cannot train this factory on so few rows.
    """
    if index.is_trained:
        return
    sample = _as_f32(sample)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:  # k-means costs rows x lists x dim per iteration: bound both factors
        max_rows = min(max_rows, max(IVF_TRAIN_PER_LIST * int(ivf.nlist), 10_000))
        ivf.cp.niter = IVF_TRAIN_ITERATIONS
        ivfpq: Any = faiss.downcast_index(ivf)
        if isinstance(ivfpq, faiss.IndexIVFPQ):
            # FAISS's default; nothing here searches with it, and it was 90% of training time
            ivfpq.do_polysemous_training = False  # type: ignore[attr-defined]
            ivfpq.pq.cp.niter = IVF_TRAIN_ITERATIONS  # the PQ's k-means: 256 centroids per
            ivfpq.pq.cp.max_points_per_centroid = IVF_TRAIN_PER_LIST  # sub-quantizer
    if len(sample) > max_rows:
        rng = np.random.default_rng(seed)
        sample = sample[np.sort(rng.choice(len(sample), size=max_rows, replace=False))]
    try:
        index.train(sample)
    except RuntimeError as exc:
        raise FlowsearchError(
            f"cannot train FAISS index {factory!r} on {len(sample)} rows ({_reason(exc)}); "
            "use a smaller factory (e.g. fewer IVF lists) or 'auto'"
        ) from None


def set_params(index: faiss.Index, params: str) -> None:
    """Apply a search-time parameter string such as ``"nprobe=16"`` (no-op when empty)."""
    if params:
        faiss.ParameterSpace().set_index_parameters(index, params)  # type: ignore[arg-type]


def add(index: faiss.Index, vectors: np.ndarray, factory: str | None = None) -> None:
    """Append vectors (float32 (n, d)); their ids continue from ``index.ntotal``."""
    _add(index, _as_f32(vectors), factory or type(index).__name__)


#: Batches up to this many queries search FAISS on the calling thread alone. FAISS's CPU
#: indexes (Flat, HNSW, IVF) split a search by query, so one query gains nothing from more
#: OpenMP threads, and on a busy machine waking them costs tens of ms: a single query on a 20k
#: Flat took ~60-75 ms with 2 threads and ~1.3 ms with 1 at load average 12.5
#: (benchmarks/bench_speed.md).
ONE_THREAD_MAX_QUERIES = 1


def single_threaded(fn: Callable[[], Any]) -> Any:
    """Run ``fn()`` with FAISS's OpenMP limited to one thread (a per-thread setting in OpenMP,
    so other threads' searches keep theirs), then restore the previous limit."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        return fn()
    finally:
        faiss.omp_set_num_threads(before)


def search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by inner product: ``(scores float32 (q, k), rows int64 (q, k))``, -1 for no hit."""
    queries = _as_f32(queries)
    k = max(1, min(int(k), max(index.ntotal, 1)))
    return index.search(queries, k)


def build(
    vectors: np.ndarray,
    factory: str = "auto",
    *,
    flat_max_rows: int | None = None,
    graph_max_rows: int | None = None,
    target_recall: float = AUTO_TARGET_RECALL,
    chunk_rows: int = 65_536,
) -> tuple[faiss.Index, str, str]:
    """An index over vectors already in memory (float32 (n, d), unit rows), built the way ingest
    streams it: train on a sample, add chunk by chunk, tune ``auto``'s search parameter.

    Returns ``(index, resolved factory, params)``; ``params`` as :func:`tune_search` gives it
    (``""`` unless ``factory`` is ``auto`` and approximate).
    """
    vectors = _as_f32(vectors)
    resolved = factory
    if factory == "auto":
        resolved = auto_factory(
            len(vectors), flat_max_rows, graph_max_rows=graph_max_rows, dim=vectors.shape[1]
        )
    index = new_index(vectors.shape[1], resolved)
    train(index, vectors, resolved)
    for start in range(0, len(vectors), chunk_rows):
        add(index, vectors[start : start + chunk_rows], resolved)
    params = ""
    if factory == "auto":
        chunks = lambda: (vectors[i : i + chunk_rows] for i in range(0, len(vectors), chunk_rows))  # noqa: E731
        params, _ = tune_search(index, vectors, chunks, target=target_recall)
    return index, resolved, params


def num_gpus() -> int:
    """GPUs FAISS can use (0 with a CPU-only build)."""
    return int(faiss.get_num_gpus())


def to_gpu(index: faiss.Index) -> faiss.Index:
    """The index on all GPUs when FAISS sees any (a faiss-gpu build); otherwise unchanged."""
    if num_gpus() > 0:
        LOG.info("moving index to %d GPU(s)", num_gpus())
        return faiss.index_cpu_to_all_gpus(index)
    return index


def write_index(index: faiss.Index, path: str | Path) -> None:
    """Save a CPU index (keep the CPU original when searching on a GPU copy)."""
    faiss.write_index(index, str(path))


def read_index(path: str | Path, params: str = "", *, mmap: str | None = None) -> faiss.Index:
    """Load an index saved by :func:`write_index` and apply its search parameters.

    An IVF index whose inverted lists were merged on disk (:func:`merge_on_disk`, a
    :data:`IVF_DATA_FILE` beside ``path``) finds that file in ``path``'s directory wherever the
    directory has moved (``IO_FLAG_ONDISK_SAME_DIR``), read-only: its lists stay on disk when
    ``mmap`` is given, and are copied into RAM otherwise (so adding rows never writes into a
    published version's file).

    Args:
        path: the index file.
        params: search parameters (:func:`set_params`).
        mmap: the index's factory string to memory-map it (read-only, :func:`mmap_flags`);
            None reads it into RAM.
    """
    on_disk = Path(path).with_name(IVF_DATA_FILE).is_file()
    try:
        if on_disk:
            flags = faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY
            index = faiss.read_index(str(path), flags)
            if mmap is None:
                _lists_to_ram(index)
        elif mmap is None:
            index = faiss.read_index(str(path))
        else:
            index = faiss.read_index(str(path), mmap_flags(mmap))
    except RuntimeError as exc:
        raise FlowsearchError(
            f"cannot read FAISS index {path} ({_reason(exc)}); rebuild the index"
        ) from None
    set_params(index, params)
    return index


# --- IVF lists filled in parts and merged on disk (the Ray engine) -----------------------------


def mergeable(index: faiss.Index) -> bool:
    """Whether parts of ``index`` filled separately can be merged on disk (:func:`merge_on_disk`):
    IVF-family indexes, with or without a pre-transform, but not with a re-rank (its full vectors
    are a flat array inside the index file, not inverted lists)."""
    return faiss.try_extract_index_ivf(index) is not None and not isinstance(
        faiss.downcast_index(index), faiss.IndexRefine
    )


def fill_part(trained: bytes | np.ndarray, vectors: np.ndarray, first_row: int, path: Path) -> int:
    """Add ``vectors`` (rows ``first_row`` on, as their ids) to a copy of the trained, empty index
    serialised in ``trained`` (``faiss.serialize_index``) and write it to ``path`` atomically (a
    retried task overwrites it whole). Returns the rows added."""
    index = faiss.deserialize_index(np.frombuffer(trained, dtype=np.uint8))
    vectors = _as_f32(vectors)
    index.add_with_ids(vectors, np.arange(first_row, first_row + len(vectors), dtype=np.int64))
    tmp = Path(path).with_name(f".{Path(path).name}.tmp-{os.getpid()}")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)
    return len(vectors)


def merge_on_disk(trained: faiss.Index, parts: list[Path], data_path: Path) -> faiss.Index:
    """``trained`` (a trained, empty IVF-family index) holding the rows of every part (files
    written by :func:`fill_part`, in row order), its inverted lists in one file, ``data_path``
    (:data:`IVF_DATA_FILE`, beside the ``index.faiss`` it is written to: see :func:`read_index`).

    Memory: the parts are memory-mapped one list at a time by FAISS's
    ``OnDiskInvertedLists.merge_from_multiple``; nothing holds the whole index.
    """
    ivf = faiss.extract_index_ivf(trained)
    if trained.ntotal:
        raise ValueError("merge_on_disk needs an empty index")
    opened = [faiss.read_index(str(p), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY) for p in parts]
    lists = _faiss.InvertedListsPtrVector()
    for part in opened:  # the parts stay referenced (``opened``) while FAISS reads their lists
        lists.push_back(faiss.extract_index_ivf(part).invlists)
    merged = _faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(data_path))
    total = merged.merge_from_multiple(lists.data(), lists.size(), False, False)
    del opened
    ivf.replace_invlists(merged, True)
    merged.this.disown()  # owned by the index now
    ivf.ntotal = trained.ntotal = total
    return trained


def _lists_to_ram(index: faiss.Index) -> None:
    """Replace an IVF index's on-disk inverted lists by a copy in RAM."""
    ivf = faiss.extract_index_ivf(index)
    disk: Any = ivf.invlists
    ram = _faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
    for number in range(ivf.nlist):
        size = disk.list_size(number)
        if size:
            ram.add_entries(number, size, disk.get_ids(number), disk.get_codes(number))
    ivf.replace_invlists(ram, True)
    ram.this.disown()
