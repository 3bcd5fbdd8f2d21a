r"""The flow calibrator's trainable form, in torch: imported only to fit a flow or to differentiate
one, never to load a calibrator or to run one.

:class:`~flowsearch.calibration.flow.FlowCalibrator` keeps its inference form frozen in numpy
(:mod:`~flowsearch.calibration.stepmath`); this module holds what needs the torch modules:
building the seeded :class:`~flowsearch.calibration.glow.GlowFlow`, its float32 training rows,
fitting it, moving its parameters to and from the saved arrays (format 1), and the whole
differentiable map ``u -> z`` for autograd checks.

Example:
    >>> flow = build({"levels": 2, "depth": 1, "width": 4, "permutation": "reverse", "seed": 0}, 6)
    >>> again = from_saved({"levels": 2, "depth": 1, "width": 4, "permutation": "reverse",
    ...                     "seed": 1}, 6, to_saved(flow))
    >>> all(torch.equal(a.float(), b) for a, b in zip(again.parameters(), flow.parameters()))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from flowsearch.calibration import maps
from flowsearch.calibration.base import FlowConfig
from flowsearch.calibration.glow import GlowFlow
from flowsearch.calibration.steps import Compose, SetAside, Step, Whiten
from flowsearch.calibration.training import Fit, maximise_likelihood, single_thread

__all__ = ["build", "fit", "from_saved", "single_thread", "to_saved", "training_rows", "whole_map"]


class _Whitening(Protocol):
    """What the whitening front layer offers here (a fitted ``linear.Whitening``)."""

    mu: np.ndarray
    rotation: np.ndarray
    scales: np.ndarray

    def transform64(self, U: np.ndarray) -> np.ndarray: ...


def build(config: FlowConfig, dim: int) -> GlowFlow:
    """An unfitted float32 flow of ``dim`` channels from a flow calibrator's config (``levels``,
    ``depth``, ``width``, ``permutation``, ``seed``); the seed fixes its initial weights and
    permutations, without touching torch's global generator."""
    gen = torch.Generator().manual_seed(config["seed"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config["seed"])
        shape = (config["levels"], config["depth"], config["width"])
        return GlowFlow(dim, *shape, config["permutation"], gen)


def training_rows(U: np.ndarray, active: np.ndarray, whitening: _Whitening | None) -> Tensor:
    """The flow's input rows as float32 ``(n, len(active))``: ``U``'s active columns, whitened
    first when there is a front layer. Built in chunks
    (:data:`~flowsearch.calibration.maps.FIT_CHUNK_ROWS`): no float64 copy of ``U``."""
    every = len(active) == U.shape[1]
    data = torch.empty((len(U), len(active)), dtype=torch.float32)
    chunk = maps.FIT_CHUNK_ROWS
    for start in range(0, len(U), chunk):
        part = U[start : start + chunk]
        part = part if every else part[:, active]
        if whitening is not None:
            part = whitening.transform64(part)
        data[start : start + len(part)] = torch.from_numpy(part.astype(np.float32))
    return data


def fit(
    config: FlowConfig,
    data: Tensor,
    bits: Callable[[float], float],
    callback: Callable[[int, int, float], None] | None = None,
) -> tuple[GlowFlow, Fit]:
    """Builds a flow for ``data``'s columns and fits it by maximum likelihood
    (:func:`~flowsearch.calibration.training.maximise_likelihood` with the config's ``epochs``,
    ``lr``, ``batch_size``, ``init_rows``, ``seed``); returns it in float64, in eval mode."""
    module = build(config, data.shape[1])
    done = maximise_likelihood(
        module, data, epochs=config["epochs"], lr=config["lr"], batch_size=config["batch_size"],
        init_rows=config["init_rows"], seed=config["seed"], bits=bits, callback=callback,
    )  # fmt: skip
    return module.eval().double(), done


def to_saved(
    module: GlowFlow, floats: type[np.floating[Any]] = np.float32
) -> dict[str, np.ndarray]:
    """The flow's parameters as the saved form names them (format 1): float32 (or ``floats``)
    and int64 numpy arrays."""
    names = module.file_names()
    return {
        names[k]: v.detach().cpu().numpy().astype(floats if v.is_floating_point() else np.int64)
        for k, v in module.state_dict().items()
    }


def from_saved(config: FlowConfig, dim: int, saved: Mapping[str, np.ndarray]) -> GlowFlow:
    """The trainable flow (float64, eval mode) holding the saved arrays (checked against
    :func:`~flowsearch.calibration.glowmath.saved_spec`)."""
    module = build(config, dim)
    names = module.file_names()
    module.load_state_dict({k: torch.from_numpy(np.asarray(saved[v])) for k, v in names.items()})
    return module.eval().double()


def whole_map(
    module: GlowFlow,
    whitening: _Whitening | None,
    fixed: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> SetAside:
    """The calibrator's whole map as one differentiable step (float64):
    ``SetAside(active -> [Whiten ->] flow; constant -> (u - mu) / scale)``, ``fixed`` being
    ``(active, constant, mu, scale)``. Shares ``module``'s parameters."""
    inner: Step = module
    if whitening is not None:
        w = whitening
        front = Whiten(*(torch.from_numpy(a) for a in (w.mu, w.rotation, w.scales)))
        inner = Compose({"whiten": front, "flow": module})
    return SetAside(inner, *(torch.from_numpy(np.asarray(a)) for a in fixed))
