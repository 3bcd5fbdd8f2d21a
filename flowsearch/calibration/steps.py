r"""A flow's steps as trainable torch modules, the composites, and the fixed whitening map.

A :class:`Step` is a small invertible map, a ``torch.nn.Module`` holding its parameters. Its
math is its *math class* (:mod:`~flowsearch.calibration.stepmath`): static functions of its
*coefficients* (what the parameters give, e.g. ``exp(logs)``), written once for tensors and
numpy arrays. ``step(x)`` runs them on the live parameters (differentiable: fitting, autograd
checks); :meth:`Step.freeze` copies the coefficients once to float64 numpy and gives a
:class:`~flowsearch.calibration.stepmath.Frozen` step that runs the *same* functions without
torch (inference). A saved calibrator is restored into that frozen form without building these
modules at all (:func:`~flowsearch.calibration.glowmath.frozen_flow`): this module, and torch,
are imported only to fit a flow or to differentiate one.

Here: :class:`Step`, the composites (:class:`Compose` in sequence, :class:`Split` for
multi-scale factoring out, :class:`SetAside` for constant channels) and :class:`Whiten`, a
fixed whitening map. The flow's learned steps are in :mod:`~flowsearch.calibration.glow`.

Example:
    >>> mu, rotation, scales = torch.zeros(2), torch.eye(2), torch.tensor([2.0, 4.0])
    >>> y, ladj = Whiten(mu, rotation, scales).freeze()(np.array([[2.0, 4.0]]))
    >>> y.tolist(), round(ladj, 4)  # log|det| = -log(2 * 4)
    ([[1.0, 1.0]], -2.0794)
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import Any, ClassVar, cast

import numpy as np
import torch
from torch import Tensor, nn

from flowsearch.calibration.stepmath import (
    STD_FLOOR,
    Bijection,
    Chunked,
    ComposeCoefs,
    ComposeMath,
    Frozen,
    SetAsideCoefs,
    SetAsideMath,
    SplitCoefs,
    SplitMath,
    StepMath,
    WhitenCoefs,
    WhitenMath,
)

__all__ = [
    "STD_FLOOR",
    "Bijection",
    "Chunked",
    "Compose",
    "Frozen",
    "SetAside",
    "Split",
    "Step",
    "Whiten",
]


class Step(nn.Module):
    r"""An invertible map ``y = f(x)`` on rows, with ``log|det df/dx|``.

    Subclasses name their math class (:attr:`math`) and define :meth:`coefs`; the rest follows.
    """

    #: The step's math: ``call`` and ``inv`` on its coefficients.
    math: ClassVar[type[StepMath]] = StepMath

    def coefs(self) -> Any:
        """The coefficients the math needs, from the live parameters (a named tuple of tensors,
        ints and child steps)."""
        raise NotImplementedError

    def param(self, name: str) -> Tensor:
        """A parameter or buffer by its state-dict key (e.g. ``net.fc1.weight``): the
        :data:`~flowsearch.calibration.stepmath.Params` lookup the math classes read."""
        return cast(Tensor, reduce(getattr, name.split("."), self))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(y, log|det dy/dx|)`` on the live parameters (differentiable; a 0-d log-det)."""
        return cast(tuple[Tensor, Tensor], self.math.call(self.coefs(), x))

    def inverse(self, y: Tensor) -> Tensor:
        """``x`` such that ``self(x)[0] == y``."""
        return self.math.inv(self.coefs(), y)

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        """Data-dependent initialisation on a batch ``x``; returns ``f(x)`` for the next step.
        Only steps with such an initialisation (``ActNorm``) override it."""
        return self.forward(x)[0]

    def freeze(self) -> Bijection[np.ndarray]:
        """The inference form: this step's math on float64 numpy copies of its coefficients
        (a :class:`~flowsearch.calibration.stepmath.Frozen`). Build it again after any
        parameter change."""
        return Frozen(self.math, _to_numpy(self.coefs()))


def _to_numpy(value: Any) -> Any:
    """Coefficients to their inference form: float tensors to float64 arrays (0-d ones, the
    log-determinants, to floats), integer ones to int64 arrays, child steps frozen, tuples
    converted element by element."""
    if isinstance(value, Tensor):
        value = value.detach().cpu()
        if value.is_floating_point() and value.dim() == 0:
            return float(value)
        dtype = torch.float64 if value.is_floating_point() else torch.int64
        return value.to(dtype).numpy()
    if isinstance(value, Step):
        return value.freeze()
    if isinstance(value, tuple):
        parts = [_to_numpy(v) for v in value]
        named = hasattr(value, "_fields")  # a NamedTuple of coefficients
        return cast(Any, type(value))._make(parts) if named else tuple(parts)
    return value


# -- composites ----------------------------------------------------------------------------


class Compose(Step):
    r"""Steps in sequence: ``f = f_n o ... o f_1``; ``log|det|`` is the sum of theirs.

    Arguments:
        steps: The steps in order, by name (the name is their key in the state dict).
    """

    math = ComposeMath

    def __init__(self, steps: Mapping[str, Step]) -> None:
        super().__init__()
        self.names = tuple(steps)
        for name, step in steps.items():
            self.add_module(name, step)

    def parts(self) -> list[Step]:
        """The steps, in order."""
        return [cast(Step, getattr(self, name)) for name in self.names]

    def coefs(self) -> ComposeCoefs[Tensor]:
        return ComposeMath.coefs(self.parts())

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        for step in self.parts():
            x = step.initialize(x)
        return x


class Split(Step):
    r"""Multi-scale factoring out: ``y = [x[:, keep:], inner(x[:, :keep])]``
    (:class:`~flowsearch.calibration.stepmath.SplitMath`).

    Arguments:
        keep: Channels that go on.
        inner: The step they go through.
    """

    math = SplitMath

    def __init__(self, keep: int, inner: Step) -> None:
        super().__init__()
        self.keep = keep
        self.inner = inner

    def coefs(self) -> SplitCoefs[Tensor]:
        return SplitMath.coefs(self.keep, self.inner)

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        return torch.cat([x[:, self.keep :], self.inner.initialize(x[:, : self.keep])], dim=1)


class Whiten(Step):
    r"""A fixed whitening map ``y = ((x - mu) R) / s`` (R orthogonal); ``log|det| = -sum(log s)``
    (:class:`~flowsearch.calibration.stepmath.WhitenMath`).

    Not fitted by gradient: its arrays come from a fitted whitening calibrator (buffers).

    Arguments:
        mu: Mean ``(d,)``; rotation: orthogonal ``(d, d)``; scales: positive ``(d,)``.
    """

    math = WhitenMath
    mu: Tensor
    rotation: Tensor
    scales: Tensor

    def __init__(self, mu: Tensor, rotation: Tensor, scales: Tensor) -> None:
        super().__init__()
        self.register_buffer("mu", mu)
        self.register_buffer("rotation", rotation)
        self.register_buffer("scales", scales)

    def coefs(self) -> WhitenCoefs[Tensor]:
        return WhitenMath.coefs(self.mu, self.rotation, self.scales)


class SetAside(Step):
    r"""Constant channels set aside: ``y = [inner(x[:, active]), (x[:, constant] - mu) / scale]``
    (:class:`~flowsearch.calibration.stepmath.SetAsideMath`).

    Arguments:
        inner: The map of the active channels.
        active, constant: Disjoint sorted channel indices covering ``range(d)``, int64.
        mu, scale: The constant channels' mean and (positive) scale, ``(len(constant),)``.
    """

    math = SetAsideMath
    active: Tensor
    constant: Tensor
    mu: Tensor
    scale: Tensor

    def __init__(
        self, inner: Step, active: Tensor, constant: Tensor, mu: Tensor, scale: Tensor
    ) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("active", active)
        self.register_buffer("constant", constant)
        self.register_buffer("mu", mu)
        self.register_buffer("scale", scale)

    def coefs(self) -> SetAsideCoefs[Tensor]:
        return SetAsideMath.coefs(self.inner, self.active, self.constant, self.mu, self.scale)
