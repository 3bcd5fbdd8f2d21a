r"""Fitting a flow by maximum likelihood: data-dependent initialisation, then Adam.

As BERT-flow's reference code does: every actnorm is initialised on a batch so that it outputs
zero mean and unit variance (Glow), then the flow's parameters follow Adam on the negative
log-likelihood of mini-batches drawn without replacement, reshuffled every pass.

Reference:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
    Kingma and Dhariwal, "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS 2018.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import Tensor

from flowsearch.calibration.glow import GlowFlow
from flowsearch.errors import BadInput

__all__ = ["Fit", "maximise_likelihood", "single_thread"]

LOG = logging.getLogger(__name__)


class Fit(NamedTuple):
    """What a fit measured: optimiser steps, and bits per dimension of the first and last
    batch (before each step's update)."""

    steps: int
    first_bits: float
    last_bits: float


@contextmanager
def single_thread() -> Iterator[None]:
    """Runs torch on one thread for the block, then restores the thread count.

    A fit's operations are tiny, and several threads spend their time synchronising. torch's
    setting is process-wide, so this is used only around a fit (never concurrent with
    queries); inference does not touch torch at all.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def maximise_likelihood(
    flow: GlowFlow,
    data: Tensor,
    *,
    epochs: float,
    lr: float,
    batch_size: int,
    init_rows: int,
    seed: int,
    bits: Callable[[float], float],
    callback: Callable[[int, int, float], None] | None = None,
) -> Fit:
    r"""Fits ``flow`` in place to the rows of ``data`` (float32 ``(n, d)``).

    Arguments:
        flow: A freshly built flow (float32).
        data: The training rows.
        epochs: Passes over the rows (fractions allowed); steps ``ceil(epochs * n / batch)``.
        lr: Adam's learning rate.
        batch_size: Rows per step (at most ``n``).
        init_rows: Rows of the data-dependent initialisation (the first of a seeded shuffle).
        seed: Seeds the shuffles (``seed + 1``, as the first release did).
        bits: Turns a batch's mean negative log-likelihood (nats) into bits per dimension.
        callback: Called as ``callback(step, total_steps, bits_per_dim)`` after every step.

    Raises:
        BadInput: the likelihood became non-finite (diverged).
    """
    n = len(data)
    gen = torch.Generator().manual_seed(seed + 1)
    order = torch.randperm(n, generator=gen)
    flow.train()
    flow.initialize(data[order[: min(n, init_rows)]])
    opt = torch.optim.Adam(flow.parameters(), lr=lr)
    bs = min(batch_size, n)
    total = max(1, math.ceil(epochs * n / bs))
    first = last = float("nan")
    position = 0
    for step in range(total):
        if position + bs > n:
            order, position = torch.randperm(n, generator=gen), 0
        last = bits(_descend(flow, opt, data[order[position : position + bs]]))
        position += bs
        if not math.isfinite(last):
            raise BadInput(
                "flow fitting diverged (non-finite likelihood)",
                fix="lower lr or check the vectors",
                param="lr",
            )
        first = last if step == 0 else first
        if callback is not None:
            callback(step + 1, total, last)
        if step % 100 == 0 or step == total - 1:
            LOG.info("flow step %d/%d: %.4f bits/dim", step + 1, total, last)
    return Fit(total, first, last)


def _descend(flow: GlowFlow, opt: torch.optim.Optimizer, batch: Tensor) -> float:
    """One Adam step on the batch's mean negative log-likelihood; returns that loss (nats)."""
    loss = -flow.log_prob(batch).mean()
    opt.zero_grad(set_to_none=True)
    torch.autograd.backward(loss)
    opt.step()
    return loss.item()
