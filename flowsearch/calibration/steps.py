r"""The flow's steps: small invertible maps, each with its forward, inverse and log-determinant.

A :class:`Step` is a ``torch.nn.Module`` holding its parameters. Its math is two static
functions of its *coefficients* (what the parameters give, e.g. ``exp(logs)``):

- ``call(c, x) -> (y, log|det dy/dx|)`` and ``inv(c, y) -> x``,

written with :mod:`~flowsearch.calibration.maps`, so they run on torch tensors and on numpy
arrays alike. ``step(x)`` runs them on the live parameters (differentiable: fitting, autograd
checks); :meth:`Step.freeze` copies the coefficients once to float64 numpy and gives a
:class:`Frozen` step that runs the *same* functions without torch (inference). There is one
definition of each step's math.

Rows are the batch: ``x`` is ``(n, d)``; the log-determinant is a scalar (shape ``()``) for
every step here, since none has a Jacobian that depends on ``x``. Composites
(:class:`Compose`, :class:`Split`, :class:`SetAside`) hold other steps and add their
log-determinants.

References:
    Kingma and Dhariwal, "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS 2018
    (actnorm, section 3.1; the multi-scale architecture, figure 2).
    Dinh, Krueger and Bengio, "NICE: Non-linear Independent Components Estimation", ICLR 2015
    (additive coupling, section 3.2).
    Dinh, Sohl-Dickstein and Bengio, "Density estimation using Real NVP", ICLR 2017
    (factoring out half the dimensions at each scale, section 3.6).
    Su et al., "Whitening Sentence Representations for Better Semantics and Faster Retrieval",
    arXiv:2103.15316, 2021 (the whitening map).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, NamedTuple, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn

from flowsearch.calibration.maps import (
    A,
    actnorm,
    actnorm_inverse,
    cat,
    linear,
    relu,
    standardise,
    unstandardise,
    unwhiten,
    whiten,
    zero,
)

__all__ = [
    "STD_FLOOR",
    "ActNorm",
    "AdditiveCoupling",
    "Bijection",
    "Compose",
    "Frozen",
    "Permutation",
    "SetAside",
    "ShiftNet",
    "Split",
    "Step",
    "Whiten",
]

#: A channel whose spread is below this fraction of the typical one counts as constant.
STD_FLOOR = 1e-3


class Bijection(Protocol[A]):
    """What a composite step calls its parts through: a :class:`Step` or a :class:`Frozen`."""

    def __call__(self, x: A) -> tuple[A, A]: ...

    def inverse(self, y: A) -> A: ...


class Step(nn.Module):
    r"""An invertible map ``y = f(x)`` on rows, with ``log|det df/dx|``.

    Subclasses define :meth:`coefs` and the static ``call`` / ``inv``; the rest follows.
    """

    def coefs(self) -> Any:
        """The coefficients ``call`` and ``inv`` need, from the live parameters (a named tuple
        of tensors, ints and child steps)."""
        raise NotImplementedError

    @staticmethod
    def call(c: Any, x: A) -> tuple[A, A]:
        """``(f(x), log|det df/dx|)`` for rows ``x`` ``(n, d_in)``: ``(n, d_out)`` and ``()``."""
        raise NotImplementedError

    @staticmethod
    def inv(c: Any, y: A) -> A:
        """``f^-1(y)`` for rows ``y`` ``(n, d_out)``."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(y, log|det dy/dx|)`` on the live parameters (differentiable)."""
        return self.call(self.coefs(), x)

    def inverse(self, y: Tensor) -> Tensor:
        """``x`` such that ``self(x)[0] == y``."""
        return self.inv(self.coefs(), y)

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        """Data-dependent initialisation on a batch ``x``; returns ``f(x)`` for the next step.
        Only steps with such an initialisation (:class:`ActNorm`) override it."""
        y, _ = self.call(self.coefs(), x)
        return y

    def freeze(self) -> Frozen:
        """The inference form: this step's math on float64 numpy copies of its coefficients.
        Build it again after any parameter change."""
        return Frozen(type(self), _to_numpy(self.coefs()))


class Frozen:
    """A step's inference form: the step's own ``call`` / ``inv`` on numpy coefficients.

    Calling it takes and returns float64 numpy arrays, as :class:`Step` does tensors.
    """

    __slots__ = ("coefs", "step")

    def __init__(self, step: type[Step], coefs: Any) -> None:
        self.step = step
        self.coefs = coefs

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(y, log|det dy/dx|)`` for float64 rows ``x``."""
        return self.step.call(self.coefs, x)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """``x`` such that ``self(x)[0] == y``."""
        return self.step.inv(self.coefs, y)

    def __repr__(self) -> str:
        return f"Frozen({self.step.__name__})"


def _to_numpy(value: Any) -> Any:
    """Coefficients to their inference form: float tensors to float64 arrays, integer ones to
    int64 arrays, child steps frozen, tuples converted element by element."""
    if isinstance(value, Tensor):
        value = value.detach().cpu()
        dtype = torch.float64 if value.is_floating_point() else torch.int64
        return value.to(dtype).numpy()
    if isinstance(value, Step):
        return value.freeze()
    if isinstance(value, tuple):
        parts = [_to_numpy(v) for v in value]
        named = hasattr(value, "_fields")  # a NamedTuple of coefficients
        return cast(Any, type(value))._make(parts) if named else tuple(parts)
    return value


# -- actnorm -------------------------------------------------------------------------------


class ActNormCoefs(NamedTuple, Generic[A]):
    bias: A
    scale: A
    inv_scale: A
    ladj: A


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
    def call(c: ActNormCoefs[A], x: A) -> tuple[A, A]:
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
    def call(c: PermutationCoefs[A], x: A) -> tuple[A, A]:
        return x[:, c.perm], zero(x)

    @staticmethod
    def inv(c: PermutationCoefs[A], y: A) -> A:
        return y[:, c.inv_perm]


# -- additive coupling ---------------------------------------------------------------------


class ShiftNetCoefs(NamedTuple, Generic[A]):
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
        h = relu(ActNorm.call(c.norm1, linear(x, c.w1))[0])
        h = relu(ActNorm.call(c.norm2, linear(h, c.w2))[0])
        shift: A = linear(h, c.w3, c.b3) * c.s3
        return shift

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        """Initialises both actnorms on ``x``'s activations; returns ``g(x)``."""
        h = relu(self.norm1.initialize(linear(x, self.fc1.weight)))
        relu(self.norm2.initialize(linear(h, self.fc2.weight)))
        return self.call(self.coefs(), x)


class CouplingCoefs(NamedTuple, Generic[A]):
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
    def call(c: CouplingCoefs[A], x: A) -> tuple[A, A]:
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


# -- composites ----------------------------------------------------------------------------


class ComposeCoefs(NamedTuple, Generic[A]):
    steps: tuple[Bijection[A], ...]


class Compose(Step):
    r"""Steps in sequence: ``f = f_n o ... o f_1``; ``log|det|`` is the sum of theirs.

    Arguments:
        steps: The steps in order, by name (the name is their key in the state dict).
    """

    def __init__(self, steps: Mapping[str, Step]) -> None:
        super().__init__()
        self.names = tuple(steps)
        for name, step in steps.items():
            self.add_module(name, step)

    def parts(self) -> list[Step]:
        """The steps, in order."""
        return [cast(Step, getattr(self, name)) for name in self.names]

    def coefs(self) -> ComposeCoefs[Tensor]:
        return ComposeCoefs(tuple(self.parts()))

    @staticmethod
    def call(c: ComposeCoefs[A], x: A) -> tuple[A, A]:
        ladj = zero(x)
        for step in c.steps:
            x, step_ladj = step(x)
            ladj = ladj + step_ladj
        return x, ladj

    @staticmethod
    def inv(c: ComposeCoefs[A], y: A) -> A:
        for step in reversed(c.steps):
            y = step.inverse(y)
        return y

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        for step in self.parts():
            x = step.initialize(x)
        return x


class SplitCoefs(NamedTuple, Generic[A]):
    keep: int
    inner: Bijection[A]


class Split(Step):
    r"""Multi-scale factoring out: ``y = [x[:, keep:], inner(x[:, :keep])]``.

    The last ``d - keep`` channels leave the flow here, straight to the prior; the first
    ``keep`` go on through ``inner``. ``log|det|`` is ``inner``'s.

    Arguments:
        keep: Channels that go on.
        inner: The step they go through.
    """

    def __init__(self, keep: int, inner: Step) -> None:
        super().__init__()
        self.keep = keep
        self.inner = inner

    def coefs(self) -> SplitCoefs[Tensor]:
        return SplitCoefs(self.keep, self.inner)

    @staticmethod
    def call(c: SplitCoefs[A], x: A) -> tuple[A, A]:
        y, ladj = c.inner(x[:, : c.keep])
        return cat([x[:, c.keep :], y]), ladj

    @staticmethod
    def inv(c: SplitCoefs[A], y: A) -> A:
        out = y.shape[1] - c.keep
        return cat([c.inner.inverse(y[:, out:]), y[:, :out]])

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        return torch.cat([x[:, self.keep :], self.inner.initialize(x[:, : self.keep])], dim=1)


class WhitenCoefs(NamedTuple, Generic[A]):
    mu: A
    rotation: A
    scales: A
    ladj: A


class Whiten(Step):
    r"""A fixed whitening map ``y = ((x - mu) R) / s`` (R orthogonal); ``log|det| = -sum(log s)``.

    Not fitted by gradient: its arrays come from a fitted whitening calibrator (buffers).

    Arguments:
        mu: Mean ``(d,)``; rotation: orthogonal ``(d, d)``; scales: positive ``(d,)``.
    """

    mu: Tensor
    rotation: Tensor
    scales: Tensor

    def __init__(self, mu: Tensor, rotation: Tensor, scales: Tensor) -> None:
        super().__init__()
        self.register_buffer("mu", mu)
        self.register_buffer("rotation", rotation)
        self.register_buffer("scales", scales)

    def coefs(self) -> WhitenCoefs[Tensor]:
        return WhitenCoefs(self.mu, self.rotation, self.scales, -self.scales.log().sum())

    @staticmethod
    def call(c: WhitenCoefs[A], x: A) -> tuple[A, A]:
        return whiten(x, c.mu, c.rotation, c.scales), c.ladj

    @staticmethod
    def inv(c: WhitenCoefs[A], y: A) -> A:
        return unwhiten(y, c.mu, c.rotation, c.scales)


class SetAsideCoefs(NamedTuple, Generic[A]):
    inner: Bijection[A]
    active: A
    constant: A
    mu: A
    scale: A
    order: A
    ladj: A


class SetAside(Step):
    r"""Constant channels set aside: ``y = [inner(x[:, active]), (x[:, constant] - mu) / scale]``.

    A channel that is constant over the corpus carries no information and would give the
    likelihood an unbounded direction; it gets this fixed standardisation instead of the flow.
    ``log|det| = inner's - sum(log scale)``.

    Arguments:
        inner: The map of the active channels.
        active, constant: Disjoint sorted channel indices covering ``range(d)``, int64.
        mu, scale: The constant channels' mean and (positive) scale, ``(len(constant),)``.
    """

    active: Tensor
    constant: Tensor
    mu: Tensor
    scale: Tensor
    order: Tensor

    def __init__(
        self, inner: Step, active: Tensor, constant: Tensor, mu: Tensor, scale: Tensor
    ) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("active", active)
        self.register_buffer("constant", constant)
        self.register_buffer("mu", mu)
        self.register_buffer("scale", scale)
        self.register_buffer("order", torch.argsort(torch.cat([active, constant])))

    def coefs(self) -> SetAsideCoefs[Tensor]:
        ladj = -self.scale.log().sum()
        return SetAsideCoefs(
            self.inner, self.active, self.constant, self.mu, self.scale, self.order, ladj
        )

    @staticmethod
    def call(c: SetAsideCoefs[A], x: A) -> tuple[A, A]:
        if not len(c.constant):
            return c.inner(x)
        y, ladj = c.inner(x[:, c.active])
        side = standardise(x[:, c.constant], c.mu, c.scale)
        return cat([y, side]), ladj + c.ladj

    @staticmethod
    def inv(c: SetAsideCoefs[A], y: A) -> A:
        if not len(c.constant):
            return c.inner.inverse(y)
        k = len(c.active)
        parts = [c.inner.inverse(y[:, :k]), unstandardise(y[:, k:], c.mu, c.scale)]
        return cat(parts)[:, c.order]
