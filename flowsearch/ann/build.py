r"""Building a vector index: train on a sample, add chunk by chunk.

Building streams: train on a sample, then add vectors chunk by chunk, so memory does not grow
with the segment beyond the index itself. Every segment's index starts here
(:func:`segment_index`: ``auto`` resolved by the segment's size and the
:class:`~flowsearch.ann.policy.AnnPolicy`, :mod:`flowsearch.ann.factory`), and every write fills
it with :func:`train` and :func:`add`; ``auto``'s approximate indexes are then tuned
(:mod:`flowsearch.ann.tune`). :func:`build` does all three over vectors already in memory.

Example:
    >>> x = np.eye(4, dtype=np.float32)
    >>> index, factory, params = build(x, "auto")
    >>> factory, index.search(x[:1], 2)[1].tolist()
    ('Flat', [[0, 1]])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import faiss
import numpy as np

from flowsearch.ann.factory import auto_factory, new_index, reason
from flowsearch.ann.io import as_f32
from flowsearch.ann.policy import DEFAULT, AnnPolicy
from flowsearch.ann.tune import exact_index, tune
from flowsearch.errors import BadInput

__all__ = [
    "IVF_TRAIN_ITERATIONS",
    "IVF_TRAIN_PER_LIST",
    "add",
    "build",
    "segment_index",
    "train",
    "training_sample",
]

#: IVF training (and an IVF-PQ's codebooks): k-means on at most this many rows per list, for
#: :data:`IVF_TRAIN_ITERATIONS` iterations: FAISS's defaults take too long on a large segment.
IVF_TRAIN_PER_LIST = 64
IVF_TRAIN_ITERATIONS = 10


def segment_index(
    dim: int,
    requested: str,
    n_rows: int,
    factory: str | None = None,
    policy: AnnPolicy = DEFAULT,
) -> tuple[faiss.Index, str]:
    """The empty index a segment of ``n_rows`` rows gets for ``requested`` (``auto`` or a
    factory string) and its resolved factory (``factory``: already resolved), under
    ``policy`` (:func:`~flowsearch.ann.factory.new_index`)."""
    resolved = factory or (
        auto_factory(n_rows, policy, dim=dim) if requested == "auto" else requested
    )
    return new_index(dim, resolved, policy), resolved


def _add(index: faiss.Index, vectors: np.ndarray, factory: str) -> None:
    try:
        index.add(vectors)
    except RuntimeError as exc:
        raise BadInput(
            f"FAISS cannot add vectors to index {factory!r} ({reason(exc)}); "
            "use 'auto', 'Flat' or an IVF/HNSW factory (ids are assigned by flowsearch)"
        ) from None


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
    index: faiss.Index,
    sample: np.ndarray,
    factory: str,
    *,
    max_rows: int = 262_144,
    seed: int = 0,
) -> None:
    """Train ``index`` (if it needs training) on at most ``max_rows`` of ``sample`` (float32
    (m, d), a uniform sample of the vectors to come).

    IVF indexes train on at most :data:`IVF_TRAIN_PER_LIST` rows per list (10,000 at least,
    for a PQ's 256 centroids per sub-quantizer) for :data:`IVF_TRAIN_ITERATIONS` k-means
    iterations; the PQ's k-means (256 centroids per sub-quantizer) gets the same bounds. IVF-PQ
    skips FAISS's polysemous training (re-ordering the PQ codes for Hamming-distance filtering,
    which flowsearch never turns on), most of the training's time otherwise.

    Raises:
        BadInput: FAISS cannot train this factory on so few rows.
    """
    if index.is_trained:
        return
    sample = as_f32(sample)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:  # k-means costs rows x lists x dim per iteration: bound both factors
        max_rows = min(max_rows, max(IVF_TRAIN_PER_LIST * int(ivf.nlist), 10_000))
        ivf.cp.niter = IVF_TRAIN_ITERATIONS
        ivfpq: Any = faiss.downcast_index(ivf)
        if isinstance(ivfpq, faiss.IndexIVFPQ):
            ivfpq.do_polysemous_training = False  # type: ignore[attr-defined]
            ivfpq.pq.cp.niter = IVF_TRAIN_ITERATIONS  # the PQ's k-means: 256 centroids per
            ivfpq.pq.cp.max_points_per_centroid = IVF_TRAIN_PER_LIST  # sub-quantizer
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


def add(index: faiss.Index, vectors: np.ndarray, factory: str | None = None) -> None:
    """Append vectors (float32 (n, d)); their ids continue from ``index.ntotal``."""
    _add(index, as_f32(vectors), factory or type(index).__name__)


def build(
    vectors: np.ndarray,
    factory: str = "auto",
    policy: AnnPolicy = DEFAULT,
    *,
    chunk_rows: int = 65_536,
) -> tuple[faiss.Index, str, str]:
    """An index over vectors already in memory (float32 (n, d), unit rows), built the way ingest
    streams it: train on a sample, add chunk by chunk, tune ``auto``'s search parameter for
    ``policy``.

    Returns ``(index, resolved factory, params)``; ``params`` as
    :func:`~flowsearch.ann.tune.tune` chose them (``""`` unless ``factory`` is ``auto`` and
    approximate); a graph ``auto`` cannot tune to its target comes back as ``Flat``
    (:attr:`~flowsearch.ann.tune.Tuning.exact`).
    """
    vectors = as_f32(vectors)
    index, resolved = segment_index(vectors.shape[1], factory, len(vectors), policy=policy)
    train(index, vectors, resolved)
    for start in range(0, len(vectors), chunk_rows):
        add(index, vectors[start : start + chunk_rows], resolved)
    params = ""
    if factory == "auto":
        chunks = lambda: (vectors[i : i + chunk_rows] for i in range(0, len(vectors), chunk_rows))  # noqa: E731
        tuned = tune(index, vectors, chunks, sample_rows=np.arange(len(vectors)), policy=policy)
        params = tuned.params
        if tuned.exact is not None:  # no graph search worth making reaches the target
            index, resolved = exact_index(index), "Flat"
    return index, resolved, params
