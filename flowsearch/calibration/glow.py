r"""BERT-flow's Glow on vectors: the flow's steps composed into a multi-scale flow.

``u -> z`` in ``levels`` levels; each is ``depth`` steps of actnorm (data-dependent
initialisation) -> fixed channel permutation (reversal, as the reference; ``random`` as an
option) -> additive coupling ``y2 = x2 + g(x1)``. Between levels the last half of the channels
is factored out under the standard-normal prior (multi-scale, no squeeze: vectors have no
spatial axes to fold); ``z`` is every factored-out part in level order, then the last level's
output. Additive couplings and permutations preserve volume, so ``log|det dz/du|`` is the
actnorms' ``sum(log s)``.

The saved form (``weights.safetensors``, format 1) names each step's tensors as the first
release's module did, ``steps.{level}.{step}.{actnorm|coupling}...`` and
``steps.{level}.{step}.perm`` / ``inv_perm``; :meth:`GlowFlow.file_names` maps them.

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020
    (reference code bohanli/BERT-flow, ``flow/glow_ops_1x1.py``).
    Kingma and Dhariwal, "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS 2018.
    Dinh, Sohl-Dickstein and Bengio, "Density estimation using Real NVP", ICLR 2017.

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

import torch
from torch import Tensor

from flowsearch.calibration.maps import log_normal
from flowsearch.calibration.steps import (
    ActNorm,
    AdditiveCoupling,
    Compose,
    Permutation,
    Split,
    Step,
)

__all__ = ["GlowFlow", "GlowStep", "halves"]


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
        self.dim = dim

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
