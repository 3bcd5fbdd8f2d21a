r"""An on-disk cache of encoded sentence vectors, so a sweep over calibrators encodes once.

Encoding is by far the cost of an evaluation (minutes on a CPU), while fitting and applying a
calibrator takes seconds. Vectors are stored as ``.npy`` files keyed by everything that changes
them: the model id and content revision, the pooling, ``max_length``, any other field of the
encoder's ``describe()`` (backend, quantisation, static variant), the dataset name, and a hash of
the exact texts (so an edited data file can never be served stale vectors).

Layout (root is ``$FLOWSEARCH_CACHE``, else ``~/.cache/flowsearch``)::

    root/vectors/<model-slug>-<revision>/<pooling>-L<max_length>/<dataset>-<texts-sha>.npy

Files are written to a temporary name in the same folder and renamed into place, so a crashed or
concurrent run never leaves a half-written file under the final name.

Example:
    >>> cache = VectorCache("/tmp/fs-cache")  # doctest: +SKIP
    >>> U = cache.encode(encoder, texts, dataset="stsb-raw")  # doctest: +SKIP
    >>> U = cache.encode(encoder, texts, dataset="stsb-raw")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

__all__ = ["SupportsEncode", "VectorCache", "default_cache_dir"]

LOG = logging.getLogger(__name__)


class SupportsEncode(Protocol):
    """What the cache needs of an encoder: :class:`flowsearch.encode.encoder.Encoder` fits."""

    def describe(self) -> dict[str, object]: ...

    def encode(
        self, texts: Sequence[str], batch_size: int = 64, progress: bool | None = None
    ) -> np.ndarray: ...


def default_cache_dir() -> Path:
    """``$FLOWSEARCH_CACHE`` if set, else ``~/.cache/flowsearch``."""
    env = os.environ.get("FLOWSEARCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "flowsearch"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-80:] or "model"


def _texts_digest(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        # Length-prefixed so that ["ab", "c"] and ["a", "bc"] differ.
        raw = text.encode("utf-8")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()[:16]


class VectorCache:
    r"""Encoded vectors on disk, keyed by encoder settings, dataset and texts.

    Arguments:
        root: cache folder; ``None`` means :func:`default_cache_dir`.
        enabled: ``False`` turns the cache into a pass-through (always encodes, never writes).

    Attributes:
        hits: number of :meth:`encode` calls served from disk.
        misses: number of :meth:`encode` calls that ran the encoder.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, enabled: bool = True) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.enabled = enabled
        self.hits = 0
        self.misses = 0

    def path_for(self, description: dict[str, object], dataset: str, texts: Sequence[str]) -> Path:
        """The ``.npy`` path for these texts under this encoder description and dataset name."""
        model = _slug(str(description.get("model", "model")))
        revision = _slug(str(description.get("revision", "unknown")))[:16]
        pooling = _slug(str(description.get("pooling", "pool")))
        max_length = description.get("max_length")
        # every other field that changes the vectors (backend, quantisation, the static
        # variant, ...) keys the folder too: int8 vectors must never be served for fp32 ones
        core = ("model", "revision", "pooling", "max_length", "dim")
        extra = {k: v for k, v in sorted(description.items()) if k not in core and v is not None}
        tag = ""
        if extra and extra != {"backend": "torch"}:
            tag = "-" + hashlib.sha256(repr(extra).encode()).hexdigest()[:10]
        folder = self.root / "vectors" / f"{model}-{revision}" / f"{pooling}-L{max_length}{tag}"
        return folder / f"{_slug(dataset)}-{_texts_digest(texts)}.npy"

    def encode(
        self,
        encoder: SupportsEncode,
        texts: Sequence[str],
        dataset: str,
        batch_size: int = 64,
        progress: bool | None = None,
    ) -> np.ndarray:
        """Vectors of ``texts`` from the cache, or from ``encoder`` (then stored).

        Args:
            encoder: anything with ``describe()`` and ``encode(texts, batch_size, progress)``.
            texts: the texts, in the order the rows should come back.
            dataset: a short name for the file (part of the key, with a hash of ``texts``).
            batch_size: passed to the encoder on a miss.
            progress: passed to the encoder on a miss.

        Returns:
            float32 array of shape ``(len(texts), dim)``.
        """
        texts = list(texts)
        path = self.path_for(encoder.describe(), dataset, texts)
        if self.enabled and path.is_file():
            try:
                vectors: np.ndarray = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                LOG.warning("cache file %s unreadable (%s); encoding again", path, exc)
            else:
                if vectors.ndim == 2 and vectors.shape[0] == len(texts):
                    self.hits += 1
                    LOG.info("cache hit: %s (%d vectors)", path, len(texts))
                    return vectors.astype(np.float32, copy=False)
                LOG.warning("cache file %s has shape %s; encoding again", path, vectors.shape)
        self.misses += 1
        LOG.info("encoding %d texts of %s", len(texts), dataset)
        vectors = np.asarray(
            encoder.encode(texts, batch_size=batch_size, progress=progress), dtype=np.float32
        )
        if self.enabled:
            self._write(path, vectors)
        return vectors

    @staticmethod
    def _write(path: Path, vectors: np.ndarray) -> None:
        """Atomically write ``vectors`` to ``path`` (temp file in the same folder, then rename)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as handle:
                    np.save(handle, vectors, allow_pickle=False)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            # A read-only or full disk must not fail an evaluation that already has its vectors.
            LOG.warning("could not write vector cache %s: %s", path, exc)
