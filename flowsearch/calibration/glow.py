r"""BERT-flow's Glow on vectors: its steps, and their composition into a multi-scale flow.

``u -> z`` in ``levels`` levels; each is ``depth`` steps of actnorm (data-dependent
initialisation) -> fixed channel permutation (reversal, as the reference; ``random`` as an
option) -> additive coupling ``y2 = x2 + g(x1)``. Between levels the last half of the channels
is factored out under the standard-normal prior (multi-scale, no squeeze: vectors have no
spatial axes to fold); ``z`` is every factored-out part in level order, then the last level's
output. Additive couplings and permutations preserve volume, so ``log|det dz/du|`` is the
actnorms' ``sum(log s)``.

The steps (:class:`ActNorm`, :class:`Permutation`, :class:`AdditiveCoupling` with its network
:class:`ShiftNet`) are :class:`~flowsearch.calibration.steps.Step`\ s: each defines its map,
inverse and log-determinant once, for torch and for the frozen numpy form.

The saved form (``weights.safetensors``, format 1) names each step's tensors as the first
release's module did, ``steps.{level}.{step}.{actnorm|coupling}...`` and
``steps.{level}.{step}.perm`` / ``inv_perm``; :meth:`GlowFlow.file_names` maps them.

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020
    (reference code bohanli/BERT-flow, ``flow/glow_ops_1x1.py``).
    Kingma and Dhariwal, "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS 2018
    (actnorm, section 3.1; the multi-scale architecture, figure 2).
    Dinh, Krueger and Bengio, "NICE: Non-linear Independent Components Estimation", ICLR 2015
    (additive coupling, section 3.2).
    Dinh, Sohl-Dickstein and Bengio, "Density estimation using Real NVP", ICLR 2017
    (factoring out half the dimensions at each scale, section 3.6).

Example:
    >>> flow = GlowFlow(6, levels=2, depth=1, width=4)
    >>> z, ladj = flow(torch.randn(5, 6))
    >>> tuple(z.shape), tuple(ladj.shape)
    ((5, 6), ())
    >>> sorted(flow.file_names().values())[:2]
    ['steps.0.0.actnorm.bias', 'steps.0.0.actnorm.logs']
"""

from __future__ import annotations

from typing import Generic, Literal, NamedTuple, cast

import numpy as np
import torch
from torch import Tensor, nn

from flowsearch.calibration.maps import (
    A,
    actnorm,
    actnorm_inverse,
    cat,
    linear,
    log_normal,
    relu,
    zero,
)
from flowsearch.calibration.steps import STD_FLOOR, Bijection, Chunked, Compose, Split, Step

__all__ = [
    "ActNorm",
    "AdditiveCoupling",
    "GlowFlow",
    "GlowStep",
    "Permutation",
    "ShiftNet",
    "halves",
]


# -- actnorm -------------------------------------------------------------------------------


class ActNormCoefs(NamedTuple, Generic[A]):
    """Bias ``(d,)``, scale ``exp(f logs)`` and its inverse ``(d,)``, log-det ``f sum(logs)``."""

    bias: A
    scale: A
    inv_scale: A
    ladj: A | float


class ActNorm(Step):
    r"""Glow's actnorm: ``y = (x + b) * exp(f * logs)`` per channel; ``log|det| = f * sum(logs)``.

    ``logs`` is stored divided by ``logscale_factor`` ``f`` (3, as in Glow's code), which
    speeds up its optimisation. :meth:`initialize` sets ``b`` and ``logs`` so that a batch comes
    out with zero mean and unit variance per channel, except that a (near-)constant channel
    keeps a neutral scale: blowing it up to unit variance would amplify whatever later steps add
    to it, step after step, until overflow.

    Arguments:
        dim: Channels.
        logscale_factor: ``f``.
    """

    def __init__(self, dim: int, logscale_factor: float = 3.0) -> None:
        super().__init__()
        self.logscale_factor = logscale_factor
        self.bias = nn.Parameter(torch.zeros(dim))
        self.logs = nn.Parameter(torch.zeros(dim))

    def coefs(self) -> ActNormCoefs[Tensor]:
        log_s = self.logs * self.logscale_factor
        return ActNormCoefs(self.bias, log_s.exp(), (-log_s).exp(), log_s.sum())

    @staticmethod
    def call(c: ActNormCoefs[A], x: A) -> tuple[A, A | float]:
        return actnorm(x, c.bias, c.scale), c.ladj

    @staticmethod
    def inv(c: ActNormCoefs[A], y: A) -> A:
        return actnorm_inverse(y, c.bias, c.inv_scale)

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=0)
        std = (x - mean).pow(2).mean(dim=0).sqrt()
        typical = std.median()
        typical = typical if typical > 0 else std.new_tensor(1.0)
        std = torch.where(std < STD_FLOOR * typical, typical, std)
        self.bias.copy_(-mean)
        self.logs.copy_(-std.log() / self.logscale_factor)
        y, _ = self.call(self.coefs(), x)
        return y


# -- permutation ---------------------------------------------------------------------------


class PermutationCoefs(NamedTuple, Generic[A]):
    """The permutation and its inverse, int64 ``(d,)``."""

    perm: A
    inv_perm: A


class Permutation(Step):
    r"""A fixed channel permutation ``y = x[:, perm]``; volume preserving (``log|det| = 0``).

    BERT-flow's reference code reverses the channels between couplings (Glow's "reverse"
    option), so that each half is transformed in turn.

    Arguments:
        perm: A permutation of ``range(d)``, int64 ``(d,)``.
    """

    perm: Tensor
    inv_perm: Tensor

    def __init__(self, perm: Tensor) -> None:
        super().__init__()
        self.register_buffer("perm", perm)
        self.register_buffer("inv_perm", torch.argsort(perm))

    def coefs(self) -> PermutationCoefs[Tensor]:
        return PermutationCoefs(self.perm, self.inv_perm)

    @staticmethod
    def call(c: PermutationCoefs[A], x: A) -> tuple[A, A | float]:
        return x[:, c.perm], zero(x)

    @staticmethod
    def inv(c: PermutationCoefs[A], y: A) -> A:
        return y[:, c.inv_perm]


# -- additive coupling ---------------------------------------------------------------------


class ShiftNetCoefs(NamedTuple, Generic[A]):
    """The three linear maps' weights ``(out, in)``, the two actnorms', the last bias, scale."""

    w1: A
    norm1: ActNormCoefs[A]
    w2: A
    norm2: ActNormCoefs[A]
    w3: A
    b3: A
    s3: A


class _ZeroLinear(nn.Module):
    """``(W x + b) * exp(3 logs)`` with everything zero at first: the coupling starts inert."""

    def __init__(self, d_in: int, d_out: int, logscale_factor: float = 3.0) -> None:
        super().__init__()
        self.logscale_factor = logscale_factor
        self.linear = nn.Linear(d_in, d_out)
        self.logs = nn.Parameter(torch.zeros(d_out))
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)


class ShiftNet(nn.Module):
    r"""The coupling's network ``g``: linear -> actnorm -> ReLU -> linear -> actnorm -> ReLU ->
    zero-initialised linear, as in BERT-flow's reference code (``glow_ops_1x1.py``).

    Arguments:
        d_in: Channels it reads (the coupling's first half).
        d_out: Channels it shifts (the second half).
        width: Hidden width.
    """

    def __init__(self, d_in: int, d_out: int, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, width, bias=False)
        self.norm1 = ActNorm(width)
        self.fc2 = nn.Linear(width, width, bias=False)
        self.norm2 = ActNorm(width)
        self.out = _ZeroLinear(width, d_out)
        for fc in (self.fc1, self.fc2):
            nn.init.normal_(fc.weight, std=0.05)

    def coefs(self) -> ShiftNetCoefs[Tensor]:
        out = self.out
        s3 = (out.logs * out.logscale_factor).exp()
        return ShiftNetCoefs(
            self.fc1.weight,
            self.norm1.coefs(),
            self.fc2.weight,
            self.norm2.coefs(),
            out.linear.weight,
            out.linear.bias,
            s3,
        )

    @staticmethod
    def call(c: ShiftNetCoefs[A], x: A) -> A:
        """``g(x)``: ``(n, d_in)`` to ``(n, d_out)``."""
        h = relu(actnorm(linear(x, c.w1), c.norm1.bias, c.norm1.scale))
        h = relu(actnorm(linear(h, c.w2), c.norm2.bias, c.norm2.scale))
        shift: A = linear(h, c.w3, c.b3) * c.s3
        return shift

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        """Initialises both actnorms on ``x``'s activations; returns ``g(x)``."""
        h = relu(self.norm1.initialize(linear(x, self.fc1.weight)))
        relu(self.norm2.initialize(linear(h, self.fc2.weight)))
        return self.call(self.coefs(), x)


class CouplingCoefs(NamedTuple, Generic[A]):
    """Channels of the conditioning half, and the network (None with one channel)."""

    d1: int
    net: ShiftNetCoefs[A] | None


class AdditiveCoupling(Step):
    r"""NICE's additive coupling: ``y1 = x1``, ``y2 = x2 + g(x1)``; ``log|det| = 0``.

    ``x1`` is the first ``d - d // 2`` channels. With a single channel there is nothing to
    condition on and the step is the identity.

    Arguments:
        dim: Channels.
        width: Hidden width of ``g`` (:class:`ShiftNet`).
    """

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.d1 = dim - dim // 2
        self.net = ShiftNet(self.d1, dim // 2, width) if dim // 2 else None

    def coefs(self) -> CouplingCoefs[Tensor]:
        return CouplingCoefs(self.d1, None if self.net is None else self.net.coefs())

    @staticmethod
    def call(c: CouplingCoefs[A], x: A) -> tuple[A, A | float]:
        if c.net is None:
            return x, zero(x)
        x1 = x[:, : c.d1]
        return cat([x1, x[:, c.d1 :] + ShiftNet.call(c.net, x1)]), zero(x)

    @staticmethod
    def inv(c: CouplingCoefs[A], y: A) -> A:
        if c.net is None:
            return y
        y1 = y[:, : c.d1]
        return cat([y1, y[:, c.d1 :] - ShiftNet.call(c.net, y1)])

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        if self.net is None:
            return x
        x1 = x[:, : self.d1]
        return torch.cat([x1, x[:, self.d1 :] + self.net.initialize(x1)], dim=1)


# -- the flow ------------------------------------------------------------------------------


def halves(d: int) -> tuple[int, int]:
    """How ``d`` channels split: the kept (first) part gets the odd channel."""
    return d - d // 2, d // 2


class GlowStep(Compose):
    r"""One step of flow: actnorm -> permutation -> additive coupling.

    Arguments:
        dim: Channels.
        width: Hidden width of the coupling's network.
        perm: The permutation, int64 ``(dim,)``.
        level, index: Where the step sits (names its tensors in the saved form).
    """

    def __init__(self, dim: int, width: int, perm: Tensor, level: int, index: int) -> None:
        super().__init__(
            {
                "actnorm": ActNorm(dim),
                "permutation": Permutation(perm),
                "coupling": AdditiveCoupling(dim, width),
            }
        )
        self.level, self.index = level, index


def _level(
    dim: int,
    level: int,
    shape: tuple[int, int, int],
    permutation: Literal["reverse", "random"],
    generator: torch.Generator | None,
) -> dict[str, Step]:
    """Level ``level``'s steps, then (unless it is the last) the split into the next level.
    Built in this order so that a seed draws the same initial weights as the first release."""
    levels, depth, width = shape
    steps: dict[str, Step] = {}
    for index in range(depth):
        if permutation == "reverse":
            perm = torch.arange(dim - 1, -1, -1)
        else:
            perm = torch.randperm(dim, generator=generator)
        steps[f"step{index}"] = GlowStep(dim, width, perm, level, index)
    if level + 1 < levels:
        # Once a level is down to one channel its couplings have nothing to condition on and
        # act as the identity; the actnorms still fit that channel's scale.
        keep = halves(dim)[0]
        inner = Compose(_level(keep, level + 1, shape, permutation, generator))
        steps["split"] = Split(keep, inner)
    return steps


class GlowFlow(Compose):
    r"""The multi-scale flow ``u -> z`` (same dimension), differentiable.

    ``flow(u)`` gives ``(z, log|det dz/du|)``, ``flow.inverse(z)`` gives ``u``.

    Arguments:
        dim: Input dimension.
        levels: Number of levels; ``levels - 1`` times half the channels are factored out.
        depth: Steps per level.
        width: Hidden width of each coupling's network.
        permutation: ``reverse`` (the reference) or ``random`` (fixed, drawn from ``generator``).
        generator: Random source for ``random`` permutations; the networks' initial weights come
            from torch's global generator (seed it for a reproducible flow).
    """

    def __init__(
        self,
        dim: int,
        levels: int = 3,
        depth: int = 3,
        width: int = 32,
        permutation: Literal["reverse", "random"] = "reverse",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(_level(dim, 0, (levels, depth, width), permutation, generator))
        self.dim, self.width = dim, width

    def freeze(self) -> Bijection[np.ndarray]:
        """The frozen flow, run in chunks of rows whose largest matrix product (the first
        level's coupling network: ``(d - d // 2) x width`` per row) stays below
        ``Settings.calibration_chunk_macs`` (see :class:`~flowsearch.calibration.steps.Chunked`).
        """
        return Chunked(super().freeze(), halves(self.dim)[0] * self.width)

    def log_prob(self, u: Tensor) -> Tensor:
        """``log N(z; 0, I) + log|det dz/du|`` per row: ``(n,)``."""
        z, ladj = cast(tuple[Tensor, Tensor], self(u))
        return log_normal(z) + ladj

    def file_names(self) -> dict[str, str]:
        """Each state-dict key -> its name in the saved form (format 1)."""
        names: dict[str, str] = {}
        for path, module in self.named_modules():
            if isinstance(module, GlowStep):
                for key in module.state_dict():
                    old = key.removeprefix("permutation.")
                    names[f"{path}.{key}"] = f"steps.{module.level}.{module.index}.{old}"
        return names
