r"""One forward pass, every pooling: the benchmark's way to keep the sweep under 30 minutes.

Encoding dominates the cost of the STS sweep, and the five poolings (``cls``, ``mean``,
``last2avg``, ``first_last_avg``, ``embedding_layer``) all read one forward pass's hidden states
(``embedding_layer`` is the first release's ``static``: the embedding layer's output).
:class:`MultiPoolEncoder` runs the model once per batch with ``output_hidden_states=True`` and
pools every way; :meth:`MultiPoolEncoder.view` hands out one object per pooling that looks like
a :class:`flowsearch.Encoder` to :class:`flowsearch.evaluation.VectorCache` (same ``describe()``,
hence the same cache files ``flowsearch eval`` reads later).

It calls :meth:`flowsearch.Encoder.encode_poolings`, which the encoder's tests hold equal to
one ``Encoder(pooling=p).encode`` per pooling.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowsearch.encode.encoder import Encoder

__all__ = ["MultiPoolEncoder", "PoolingView"]

LOG = logging.getLogger(__name__)

ALL_POOLINGS = ("cls", "mean", "last2avg", "first_last_avg", "embedding_layer")


def _digest(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()


class PoolingView:
    """An Encoder look-alike for one pooling, served by a :class:`MultiPoolEncoder`."""

    def __init__(self, parent: MultiPoolEncoder, pooling: str) -> None:
        self.parent = parent
        self.pooling = pooling
        self.dim = parent.base.dim
        self.max_length = parent.base.max_length
        self.model_id = parent.base.model_id

    def describe(self) -> dict[str, Any]:
        return {**self.parent.base.describe(), "pooling": self.pooling}

    def encode(
        self, texts: Sequence[str], batch_size: int = 64, progress: bool | None = None
    ) -> np.ndarray:
        return self.parent.encode_all(list(texts), batch_size)[self.pooling]


class MultiPoolEncoder:
    r"""Encodes texts once and returns every pooling's vectors.

    Arguments:
        model: as :class:`flowsearch.Encoder`.
        max_length: as :class:`flowsearch.Encoder`.
        poolings: poolings to compute (a subset of the five).
    """

    def __init__(
        self,
        model: str | None = None,
        max_length: int | None = None,
        poolings: Sequence[str] = ALL_POOLINGS,
    ) -> None:
        self.base = Encoder(model, pooling="mean", max_length=max_length)
        self.poolings = tuple(poolings)
        self._memo: dict[str, dict[str, np.ndarray]] = {}
        self.seconds = 0.0
        self.texts_encoded = 0

    def view(self, pooling: str) -> PoolingView:
        return PoolingView(self, pooling)

    def encode_all(self, texts: list[str], batch_size: int = 64) -> dict[str, np.ndarray]:
        """``{pooling: float32 (n, dim)}`` for ``texts`` (memoised by content)."""
        key = _digest(texts)
        if key not in self._memo:
            self._memo[key] = self._run(texts, batch_size)
        return self._memo[key]

    def _run(self, texts: list[str], batch_size: int) -> dict[str, np.ndarray]:
        started = time.perf_counter()
        out = self.base.encode_poolings(texts, self.poolings, batch_size, progress=True)
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        self.texts_encoded += len(texts)
        LOG.info("encoded %d texts x %d poolings in %.1fs", len(texts), len(self.poolings), elapsed)
        return out
