r"""BERT-flow's Glow on vectors as trainable torch modules: its steps and the multi-scale flow.

``u -> z`` in ``levels`` levels; each is ``depth`` steps of actnorm (data-dependent
initialisation) -> fixed channel permutation (reversal, as the reference; ``random`` as an
option) -> additive coupling ``y2 = x2 + g(x1)``, with half the channels factored out between
levels (:mod:`~flowsearch.calibration.glowmath` tells the whole map).

The steps (:class:`ActNorm`, :class:`Permutation`, :class:`AdditiveCoupling` with its network
:class:`ShiftNet`) are :class:`~flowsearch.calibration.steps.Step`\ s holding the parameters;
their math (map, inverse, log-determinant, coefficients) is in
:mod:`~flowsearch.calibration.glowmath`, once for torch and for the frozen numpy form, and so is
the layout :class:`GlowFlow` is built from. Used to fit a flow and to differentiate one;
inference restores the frozen form from the saved arrays without this module.

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

Example:
    >>> flow = GlowFlow(6, levels=2, depth=1, width=4)
    >>> z, ladj = flow(torch.randn(5, 6))
    >>> tuple(z.shape), tuple(ladj.shape)
    ((5, 6), ())
    >>> sorted(flow.file_names().values())[:2]
    ['steps.0.0.actnorm.bias', 'steps.0.0.actnorm.logs']
"""

from __future__ import annotations

from typing import Literal, cast

import numpy as np
import torch
from torch import Tensor, nn

from flowsearch.calibration.glowmath import (
    LOGSCALE_FACTOR,
    ActNormCoefs,
    ActNormMath,
    CouplingCoefs,
    CouplingMath,
    PermutationCoefs,
    PermutationMath,
    ShiftNetCoefs,
    ShiftNetMath,
    chunked,
    halves,
    layout,
)
from flowsearch.calibration.maps import linear, log_normal, relu
from flowsearch.calibration.steps import STD_FLOOR, Bijection, Compose, Split, Step

__all__ = [
    "ActNorm",
    "AdditiveCoupling",
    "GlowFlow",
    "GlowStep",
    "Permutation",
    "ShiftNet",
    "halves",
]


class ActNorm(Step):
    r"""Glow's actnorm: ``y = (x + b) * exp(f * logs)`` per channel; ``log|det| = f * sum(logs)``.

    ``logs`` is stored divided by ``f`` (:data:`~flowsearch.calibration.glowmath.LOGSCALE_FACTOR`,
    3 as in Glow's code), which speeds up its optimisation. :meth:`initialize` sets ``b`` and
    ``logs`` so that a batch comes out with zero mean and unit variance per channel, except that
    a (near-)constant channel keeps a neutral scale: blowing it up to unit variance would amplify
    whatever later steps add to it, step after step, until overflow.

    Arguments:
        dim: Channels.
    """

    math = ActNormMath

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))
        self.logs = nn.Parameter(torch.zeros(dim))

    def coefs(self) -> ActNormCoefs[Tensor]:
        return ActNormMath.coefs(self.param)

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=0)
        std = (x - mean).pow(2).mean(dim=0).sqrt()
        typical = std.median()
        typical = typical if typical > 0 else std.new_tensor(1.0)
        std = torch.where(std < STD_FLOOR * typical, typical, std)
        self.bias.copy_(-mean)
        self.logs.copy_(-std.log() / LOGSCALE_FACTOR)
        return self.forward(x)[0]


class Permutation(Step):
    r"""A fixed channel permutation ``y = x[:, perm]``; volume preserving (``log|det| = 0``).

    BERT-flow's reference code reverses the channels between couplings (Glow's "reverse"
    option), so that each half is transformed in turn.

    Arguments:
        perm: A permutation of ``range(d)``, int64 ``(d,)``.
    """

    math = PermutationMath
    perm: Tensor
    inv_perm: Tensor

    def __init__(self, perm: Tensor) -> None:
        super().__init__()
        self.register_buffer("perm", perm)
        self.register_buffer("inv_perm", torch.argsort(perm))

    def coefs(self) -> PermutationCoefs[Tensor]:
        return PermutationMath.coefs(self.param)


class _ZeroLinear(nn.Module):
    """``(W x + b) * exp(f logs)`` with everything zero at first: the coupling starts inert."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)
        self.logs = nn.Parameter(torch.zeros(d_out))
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)


class ShiftNet(nn.Module):
    r"""The coupling's network ``g``: linear -> actnorm -> ReLU -> linear -> actnorm -> ReLU ->
    zero-initialised linear, as in BERT-flow's reference code (``glow_ops_1x1.py``); its math is
    :class:`~flowsearch.calibration.glowmath.ShiftNetMath`.

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
        return ShiftNetMath.coefs(lambda name: cast(Tensor, self.get_parameter(name)))

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        """Initialises both actnorms on ``x``'s activations; returns ``g(x)``."""
        h = relu(self.norm1.initialize(linear(x, self.fc1.weight)))
        relu(self.norm2.initialize(linear(h, self.fc2.weight)))
        return ShiftNetMath.call(self.coefs(), x)


class AdditiveCoupling(Step):
    r"""NICE's additive coupling: ``y1 = x1``, ``y2 = x2 + g(x1)``; ``log|det| = 0``.

    ``x1`` is the first ``d - d // 2`` channels. With a single channel there is nothing to
    condition on and the step is the identity.

    Arguments:
        dim: Channels.
        width: Hidden width of ``g`` (:class:`ShiftNet`).
    """

    math = CouplingMath

    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.dim = dim
        self.d1 = halves(dim)[0]
        self.net = ShiftNet(self.d1, dim // 2, width) if dim // 2 else None

    def coefs(self) -> CouplingCoefs[Tensor]:
        return CouplingMath.coefs(self.param, self.dim)

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        if self.net is None:
            return x
        x1 = x[:, : self.d1]
        return torch.cat([x1, x[:, self.d1 :] + self.net.initialize(x1)], dim=1)


# -- the flow ------------------------------------------------------------------------------


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


class GlowFlow(Compose):
    r"""The multi-scale flow ``u -> z`` (same dimension), differentiable.

    ``flow(u)`` gives ``(z, log|det dz/du|)``, ``flow.inverse(z)`` gives ``u``. Its layout is
    :func:`~flowsearch.calibration.glowmath.layout`'s.

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
        def step(d: int, level: int, index: int) -> Step:
            if permutation == "reverse":
                perm = torch.arange(d - 1, -1, -1)
            else:
                perm = torch.randperm(d, generator=generator)
            return GlowStep(d, width, perm, level, index)

        super().__init__(layout(dim, levels, depth, step, lambda k, s: Split(k, Compose(s))))
        self.dim, self.width = dim, width

    def freeze(self) -> Bijection[np.ndarray]:
        """The frozen flow, run in chunks of rows (see
        :func:`~flowsearch.calibration.glowmath.chunked`)."""
        return chunked(super().freeze(), self.dim, self.width)

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
