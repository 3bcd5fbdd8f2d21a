r"""One forward pass, every pooling: the benchmark's way to keep the sweep under 30 minutes.

Encoding dominates the cost of the STS sweep, and the five poolings (``cls``, ``mean``,
``last2avg``, ``first_last_avg``, ``static``) all read the same forward pass's hidden states.
:class:`MultiPoolEncoder` runs the model once per batch with ``output_hidden_states=True`` and
pools every way; :meth:`MultiPoolEncoder.view` hands out one object per pooling that looks like
a :class:`flowsearch.Encoder` to :class:`flowsearch.evaluation.VectorCache` (same ``describe()``,
hence the same cache files ``flowsearch eval`` reads later).

It reuses the Encoder's tokenizer, padding and model (private attributes), so
:meth:`MultiPoolEncoder.verify` compares its output with ``Encoder(pooling=p).encode`` on a sample
before a run trusts it; the benchmark falls back to one Encoder per pooling if they differ.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowsearch.encoder import Encoder

__all__ = ["MultiPoolEncoder", "PoolingView"]

LOG = logging.getLogger(__name__)

ALL_POOLINGS = ("cls", "mean", "last2avg", "first_last_avg", "static")


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
        import torch

        base = self.base
        started = time.perf_counter()
        out = {p: np.empty((len(texts), base.dim), dtype=np.float32) for p in self.poolings}
        ids = base._tokenizer(
            texts,
            truncation=True,
            max_length=base.max_length,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        order = np.argsort([-len(x) for x in ids], kind="stable")
        last_report = started
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                batch = base._padded([ids[i] for i in rows])
                hs = base._model(**batch, output_hidden_states=True, return_dict=True).hidden_states
                mask = batch["attention_mask"].unsqueeze(-1).to(hs[-1].dtype)
                count = mask.sum(dim=1).clamp(min=1)
                layers = {
                    "mean": hs[-1],
                    "last2avg": (hs[-1] + hs[-2]) / 2,
                    "first_last_avg": (hs[1] + hs[-1]) / 2,
                    "static": hs[0],
                }
                for p in self.poolings:
                    vec = hs[-1][:, 0] if p == "cls" else (layers[p] * mask).sum(dim=1) / count
                    out[p][rows] = vec.float().cpu().numpy()
                now = time.perf_counter()
                if now - last_report > 30:
                    done = min(start + batch_size, len(order))
                    rate = done / (now - started)
                    print(f"  encoded {done}/{len(texts)} ({rate:.0f}/s)", file=sys.stderr)
                    last_report = now
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        self.texts_encoded += len(texts)
        LOG.info("encoded %d texts x %d poolings in %.1fs", len(texts), len(self.poolings), elapsed)
        return out

    def verify(self, texts: list[str], atol: float = 1e-4) -> dict[str, float]:
        """Max |difference| per pooling against ``Encoder(pooling=p).encode`` on ``texts``."""
        counters = (self.seconds, self.texts_encoded)
        mine = self._run(texts, 16)
        self.seconds, self.texts_encoded = counters  # a check, not part of the sweep's encoding
        diffs = {}
        for p in self.poolings:
            ref = Encoder(
                self.base.model_id if self.base.model_id != _default() else None,
                pooling=p,
                max_length=self.base.max_length,
            )
            diffs[p] = float(np.abs(ref.encode(texts, batch_size=16) - mine[p]).max())
        bad = {p: d for p, d in diffs.items() if d > atol}
        if bad:
            LOG.warning("multi-pool encoding differs from Encoder: %s", bad)
        return diffs


def _default() -> str:
    from flowsearch.encoder import DEFAULT_MODEL

    return DEFAULT_MODEL
