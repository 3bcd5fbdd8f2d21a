r"""BERT-flow's Glow on vectors without torch: its steps' math, its layout, its saved arrays.

``u -> z`` in ``levels`` levels; each is ``depth`` steps of actnorm -> fixed channel
permutation -> additive coupling ``y2 = x2 + g(x1)``. Between levels the last half of the
channels is factored out under the standard-normal prior (multi-scale, no squeeze: vectors have
no spatial axes to fold); ``z`` is every factored-out part in level order, then the last level's
output. Additive couplings and permutations preserve volume, so ``log|det dz/du|`` is the
actnorms' ``sum(log s)``.

Here, all without torch (the trainable modules are in :mod:`~flowsearch.calibration.glow`):

- each step's math (:class:`ActNormMath`, :class:`PermutationMath`, :class:`CouplingMath` with
  its network :class:`ShiftNetMath`), written once for tensors and arrays (see
  :mod:`~flowsearch.calibration.stepmath`);
- :func:`layout`, the multi-scale layout, which the torch flow, the saved form's list of arrays
  (:func:`saved_spec`) and the frozen flow (:func:`frozen_flow`) are all built from;
- :func:`frozen_flow`: the flow's inference form straight from its saved arrays.

The saved form (``weights.safetensors``, format 1) names each step's arrays as the first
release's module did: ``steps.{level}.{step}.{actnorm|coupling}...`` (float32) and
``steps.{level}.{step}.perm`` / ``inv_perm`` (int64).

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020
    (reference code bohanli/BERT-flow, ``flow/glow_ops_1x1.py``).
    Kingma and Dhariwal, "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS 2018
    (actnorm, section 3.1; the multi-scale architecture, figure 2).
    Dinh, Krueger and Bengio, "NICE: Non-linear Independent Components Estimation", ICLR 2015
    (additive coupling, section 3.2).

Example:
    >>> specs = saved_spec(dim=6, n_levels=2, depth=1, width=4)
    >>> specs["steps.0.0.coupling.net.fc1.weight"], specs["steps.1.0.perm"]
    (Spec(shape=(4, 3), dtype='float32'), Spec(shape=(3,), dtype='int64'))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Generic, NamedTuple, TypeVar

import numpy as np

from flowsearch.calibration.maps import A, actnorm, actnorm_inverse, cat, exp, linear, relu, zero
from flowsearch.calibration.state import Spec
from flowsearch.calibration.stepmath import (
    Bijection,
    Chunked,
    Frozen,
    Params,
    SplitMath,
    StepMath,
    compose,
    scoped,
)

__all__ = [
    "LOGSCALE_FACTOR",
    "ActNormMath",
    "CouplingMath",
    "PermutationMath",
    "ShiftNetMath",
    "chunked",
    "frozen_flow",
    "halves",
    "layout",
    "saved_spec",
]

#: Glow's ``logscale_factor``: log-scales are stored divided by it, which speeds up their
#: optimisation (3, as in Glow's and BERT-flow's code; the saved form assumes it).
LOGSCALE_FACTOR = 3.0


def halves(d: int) -> tuple[int, int]:
    """How ``d`` channels split: the kept (first) part gets the odd channel."""
    return d - d // 2, d // 2


# -- the steps' math -------------------------------------------------------------------------


class ActNormCoefs(NamedTuple, Generic[A]):
    """Bias ``(d,)``, scale ``exp(f logs)`` and its inverse ``(d,)``, log-det ``f sum(logs)``."""

    bias: A
    scale: A
    inv_scale: A
    ladj: A | float


class ActNormMath(StepMath):
    r"""Glow's actnorm: ``y = (x + b) * exp(f * logs)`` per channel;
    ``log|det| = f * sum(logs)``."""

    @staticmethod
    def coefs(p: Params[A], factor: float = LOGSCALE_FACTOR) -> ActNormCoefs[A]:
        """From the parameters ``bias`` and ``logs`` ``(d,)``."""
        log_s = p("logs") * factor
        return ActNormCoefs(p("bias"), exp(log_s), exp(-log_s), log_s.sum())

    @staticmethod
    def call(c: ActNormCoefs[A], x: A) -> tuple[A, A | float]:
        return actnorm(x, c.bias, c.scale), c.ladj

    @staticmethod
    def inv(c: ActNormCoefs[A], y: A) -> A:
        return actnorm_inverse(y, c.bias, c.inv_scale)


class PermutationCoefs(NamedTuple, Generic[A]):
    """The permutation and its inverse, int64 ``(d,)``."""

    perm: A
    inv_perm: A


class PermutationMath(StepMath):
    r"""A fixed channel permutation ``y = x[:, perm]``; volume preserving (``log|det| = 0``)."""

    @staticmethod
    def coefs(p: Params[A]) -> PermutationCoefs[A]:
        """From the buffers ``perm`` and ``inv_perm``."""
        return PermutationCoefs(p("perm"), p("inv_perm"))

    @staticmethod
    def call(c: PermutationCoefs[A], x: A) -> tuple[A, A | float]:
        return x[:, c.perm], zero(x)

    @staticmethod
    def inv(c: PermutationCoefs[A], y: A) -> A:
        return y[:, c.inv_perm]


class ShiftNetCoefs(NamedTuple, Generic[A]):
    """The three linear maps' weights ``(out, in)``, the two actnorms', the last bias, scale."""

    w1: A
    norm1: ActNormCoefs[A]
    w2: A
    norm2: ActNormCoefs[A]
    w3: A
    b3: A
    s3: A


class ShiftNetMath:
    r"""The coupling's network ``g``: linear -> actnorm -> ReLU -> linear -> actnorm -> ReLU ->
    linear scaled by ``exp(f * logs)``, as in BERT-flow's reference code (``glow_ops_1x1.py``).
    Not a bijection: a function of the coupling's first half."""

    @staticmethod
    def coefs(p: Params[A]) -> ShiftNetCoefs[A]:
        """From ``fc1.weight``, ``norm1.*``, ``fc2.weight``, ``norm2.*``, ``out.linear.*`` and
        ``out.logs``."""
        s3 = exp(p("out.logs") * LOGSCALE_FACTOR)
        return ShiftNetCoefs(
            p("fc1.weight"),
            ActNormMath.coefs(scoped(p, "norm1.")),
            p("fc2.weight"),
            ActNormMath.coefs(scoped(p, "norm2.")),
            p("out.linear.weight"),
            p("out.linear.bias"),
            s3,
        )

    @staticmethod
    def call(c: ShiftNetCoefs[A], x: A) -> A:
        """``g(x)``: ``(n, d_in)`` to ``(n, d_out)``."""
        h = relu(actnorm(linear(x, c.w1), c.norm1.bias, c.norm1.scale))
        h = relu(actnorm(linear(h, c.w2), c.norm2.bias, c.norm2.scale))
        shift: A = linear(h, c.w3, c.b3) * c.s3
        return shift


class CouplingCoefs(NamedTuple, Generic[A]):
    """Channels of the conditioning half, and the network (None with one channel)."""

    d1: int
    net: ShiftNetCoefs[A] | None


class CouplingMath(StepMath):
    r"""NICE's additive coupling: ``y1 = x1``, ``y2 = x2 + g(x1)``; ``log|det| = 0``.

    ``x1`` is the first ``d - d // 2`` channels. With a single channel there is nothing to
    condition on and the step is the identity.
    """

    @staticmethod
    def coefs(p: Params[A], dim: int) -> CouplingCoefs[A]:
        """For ``dim`` channels, from the network's parameters ``net.*``."""
        d1, d2 = halves(dim)
        return CouplingCoefs(d1, ShiftNetMath.coefs(scoped(p, "net.")) if d2 else None)

    @staticmethod
    def call(c: CouplingCoefs[A], x: A) -> tuple[A, A | float]:
        if c.net is None:
            return x, zero(x)
        x1 = x[:, : c.d1]
        return cat([x1, x[:, c.d1 :] + ShiftNetMath.call(c.net, x1)]), zero(x)

    @staticmethod
    def inv(c: CouplingCoefs[A], y: A) -> A:
        if c.net is None:
            return y
        y1 = y[:, : c.d1]
        return cat([y1, y[:, c.d1 :] - ShiftNetMath.call(c.net, y1)])


# -- the layout ------------------------------------------------------------------------------

S = TypeVar("S")


def layout(
    dim: int,
    n_levels: int,
    depth: int,
    step: Callable[[int, int, int], S],
    split: Callable[[int, dict[str, S]], S],
    level: int = 0,
) -> dict[str, S]:
    """The multi-scale layout from ``level`` on: ``depth`` steps named ``step{i}``, each
    ``step(dim, level, i)``, then (unless it is the last level) ``"split"``:
    ``split(keep, the next level's layout on the first keep channels)``. The steps are made in
    this order, so that a seed draws the same initial weights as the first release."""
    out = {f"step{index}": step(dim, level, index) for index in range(depth)}
    if level + 1 < n_levels:
        # Once a level is down to one channel its couplings have nothing to condition on and
        # act as the identity; the actnorms still fit that channel's scale.
        keep = halves(dim)[0]
        out["split"] = split(keep, layout(keep, n_levels, depth, step, split, level + 1))
    return out


def chunked(flow: Bijection[np.ndarray], dim: int, width: int) -> Chunked:
    """The frozen flow run in chunks of rows whose largest matrix product (the first level's
    coupling network: ``(d - d // 2) x width`` per row) stays below
    :data:`~flowsearch.calibration.stepmath.CHUNK_MACS` (see
    :class:`~flowsearch.calibration.stepmath.Chunked`)."""
    return Chunked(flow, halves(dim)[0] * width)


def _step_spec(dim: int, width: int, prefix: str) -> dict[str, Spec]:
    """One step's saved arrays: actnorm, permutation, and the coupling's network if any."""
    d1, d2 = halves(dim)
    specs = {f"{prefix}actnorm.{k}": Spec((dim,), "float32") for k in ("bias", "logs")}
    specs.update({f"{prefix}{k}": Spec((dim,), "int64") for k in ("perm", "inv_perm")})
    if d2:
        net = f"{prefix}coupling.net."
        specs[f"{net}fc1.weight"] = Spec((width, d1), "float32")
        specs[f"{net}fc2.weight"] = Spec((width, width), "float32")
        for norm in ("norm1", "norm2"):
            specs.update({f"{net}{norm}.{k}": Spec((width,), "float32") for k in ("bias", "logs")})
        specs[f"{net}out.linear.weight"] = Spec((d2, width), "float32")
        specs.update({f"{net}out.{k}": Spec((d2,), "float32") for k in ("linear.bias", "logs")})
    return specs


def saved_spec(dim: int, n_levels: int, depth: int, width: int) -> dict[str, Spec]:
    """Every array of a saved flow (format 1) with its shape and dtype, by name."""
    specs: dict[str, Spec] = {}

    def step(d: int, level: int, index: int) -> None:
        specs.update(_step_spec(d, width, f"steps.{level}.{index}."))

    layout(dim, n_levels, depth, step, lambda keep, inner: None)
    return specs


def frozen_flow(
    saved: Mapping[str, np.ndarray], dim: int, n_levels: int, depth: int, width: int
) -> Chunked:
    """The flow's inference form from its saved arrays (checked against :func:`saved_spec`):
    float arrays taken at float64, as a frozen module's are."""

    def params(name: str) -> np.ndarray:
        value = saved[name]
        return value.astype(np.float64) if value.dtype.kind == "f" else value.astype(np.int64)

    def step(d: int, level: int, index: int) -> Bijection[np.ndarray]:
        p = scoped(params, f"steps.{level}.{index}.")
        return compose(
            [
                Frozen(ActNormMath, ActNormMath.coefs(scoped(p, "actnorm."))),
                Frozen(PermutationMath, PermutationMath.coefs(p)),  # format 1: at the step's level
                Frozen(CouplingMath, CouplingMath.coefs(scoped(p, "coupling."), d)),
            ]
        )

    def split(keep: int, inner: dict[str, Bijection[np.ndarray]]) -> Bijection[np.ndarray]:
        return Frozen(SplitMath, SplitMath.coefs(keep, compose(list(inner.values()))))

    return chunked(compose(list(layout(dim, n_levels, depth, step, split).values())), dim, width)
