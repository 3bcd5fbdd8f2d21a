r"""What a step of a flow is, how steps compose, and the fixed maps around a flow.

A :class:`Step` is a small invertible map, a ``torch.nn.Module`` holding its parameters. Its
math is two static functions of its *coefficients* (what the parameters give, e.g.
``exp(logs)``):

- ``call(c, x) -> (y, log|det dy/dx|)`` and ``inv(c, y) -> x``,

written with :mod:`~flowsearch.calibration.maps`, so they run on torch tensors and on numpy
arrays alike. ``step(x)`` runs them on the live parameters (differentiable: fitting, autograd
checks); :meth:`Step.freeze` copies the coefficients once to float64 numpy and gives a
:class:`Frozen` step that runs the *same* functions without torch (inference). There is one
definition of each step's math.

Rows are the batch: ``x`` is ``(n, d)``. The log-determinant is a scalar for every step here,
since none has a Jacobian that depends on ``x``: a 0-d tensor in torch, a float when frozen.

Here: the composites (:class:`Compose` in sequence, :class:`Split` for multi-scale factoring
out, :class:`SetAside` for constant channels) and :class:`Whiten`, a fixed whitening map. The
flow's learned steps are in :mod:`~flowsearch.calibration.glow`.

References:
    Dinh, Sohl-Dickstein and Bengio, "Density estimation using Real NVP", ICLR 2017
    (factoring out half the dimensions at each scale, section 3.6).
    Su et al., "Whitening Sentence Representations for Better Semantics and Faster Retrieval",
    arXiv:2103.15316, 2021 (the whitening map).

Example:
    >>> mu, rotation, scales = torch.zeros(2), torch.eye(2), torch.tensor([2.0, 4.0])
    >>> y, ladj = Whiten(mu, rotation, scales).freeze()(np.array([[2.0, 4.0]]))
    >>> y.tolist(), round(ladj, 4)  # log|det| = -log(2 * 4)
    ([[1.0, 1.0]], -2.0794)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, NamedTuple, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn

from flowsearch.calibration.maps import A, cat, standardise, unstandardise, unwhiten, whiten, zero
from flowsearch.settings import current

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

#: A channel whose spread is below this fraction of the typical one counts as constant.
STD_FLOOR = 1e-3


class Bijection(Protocol[A]):
    """What a composite step calls its parts through: a :class:`Step` (tensors), a
    :class:`Frozen` or :class:`Chunked` one (float64 arrays)."""

    def __call__(self, x: A) -> tuple[A, A | float]: ...

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
    def call(c: Any, x: A) -> tuple[A, A | float]:
        """``(f(x), log|det df/dx|)`` for rows ``x`` ``(n, d_in)``: ``(n, d_out)`` and a scalar
        (a 0-d tensor for tensors, a float for arrays)."""
        raise NotImplementedError

    @staticmethod
    def inv(c: Any, y: A) -> A:
        """``f^-1(y)`` for rows ``y`` ``(n, d_out)``."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(y, log|det dy/dx|)`` on the live parameters (differentiable; a 0-d log-det)."""
        return cast(tuple[Tensor, Tensor], self.call(self.coefs(), x))

    def inverse(self, y: Tensor) -> Tensor:
        """``x`` such that ``self(x)[0] == y``."""
        return self.inv(self.coefs(), y)

    @torch.no_grad()
    def initialize(self, x: Tensor) -> Tensor:
        """Data-dependent initialisation on a batch ``x``; returns ``f(x)`` for the next step.
        Only steps with such an initialisation (:class:`ActNorm`) override it."""
        y, _ = self.call(self.coefs(), x)
        return y

    def freeze(self) -> Bijection[np.ndarray]:
        """The inference form: this step's math on float64 numpy copies of its coefficients
        (a :class:`Frozen`). Build it again after any parameter change."""
        return Frozen(type(self), _to_numpy(self.coefs()))


class Frozen:
    """A step's inference form: the step's own ``call`` / ``inv`` on numpy coefficients.

    Calling it takes and returns float64 numpy arrays, as :class:`Step` does tensors.
    """

    __slots__ = ("coefs", "step")

    def __init__(self, step: type[Step], coefs: Any) -> None:
        self.step = step
        self.coefs = coefs

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        """``(y, log|det dy/dx|)`` for float64 rows ``x``."""
        y, ladj = self.step.call(self.coefs, x)
        return y, float(ladj)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """``x`` such that ``self(x)[0] == y``."""
        return self.step.inv(self.coefs, y)

    def __repr__(self) -> str:
        return f"Frozen({self.step.__name__})"


class Chunked:
    """A frozen step run over its rows in chunks: rows are independent, so the result is the
    step's own; every temporary, and every matrix product, stays as small as a chunk. The
    step's log-determinant must not depend on the rows (true of every step here).

    Arguments:
        inner: The frozen step.
        macs_per_row: Multiply-adds per row of the step's largest matrix product; a chunk has
            ``Settings.calibration_chunk_macs // macs_per_row`` rows (read at call time).
    """

    __slots__ = ("inner", "macs_per_row")

    def __init__(self, inner: Bijection[np.ndarray], macs_per_row: int) -> None:
        self.inner = inner
        self.macs_per_row = macs_per_row

    def rows(self) -> int:
        """Rows per chunk now."""
        return max(1, current().calibration_chunk_macs // self.macs_per_row)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | float]:
        """``(y, log|det dy/dx|)`` as the inner step gives them."""
        size = self.rows()
        if len(x) <= size:
            return self.inner(x)
        parts = [self.inner(x[i : i + size]) for i in range(0, len(x), size)]
        return np.concatenate([y for y, _ in parts]), parts[0][1]

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """``x`` such that ``self(x)[0] == y``."""
        size = self.rows()
        if len(y) <= size:
            return self.inner.inverse(y)
        return np.concatenate([self.inner.inverse(y[i : i + size]) for i in range(0, len(y), size)])


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


class ComposeCoefs(NamedTuple, Generic[A]):
    """The steps in order."""

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
    def call(c: ComposeCoefs[A], x: A) -> tuple[A, A | float]:
        ladj: A | float = zero(x)
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
    """Channels that go on, and the step they go through."""

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
    def call(c: SplitCoefs[A], x: A) -> tuple[A, A | float]:
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
    """Mean ``(d,)``, rotation ``(d, d)``, scales ``(d,)``, log-det ``-sum(log scales)``."""

    mu: A
    rotation: A
    scales: A
    ladj: A | float


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
    def call(c: WhitenCoefs[A], x: A) -> tuple[A, A | float]:
        return whiten(x, c.mu, c.rotation, c.scales), c.ladj

    @staticmethod
    def inv(c: WhitenCoefs[A], y: A) -> A:
        return unwhiten(y, c.mu, c.rotation, c.scales)


class SetAsideCoefs(NamedTuple, Generic[A]):
    """The inner step, the channel indices, the constant channels' mean and scale, the order
    that undoes ``[active, constant]``, and the constant channels' log-det."""

    inner: Bijection[A]
    active: A
    constant: A
    mu: A
    scale: A
    order: A
    ladj: A | float


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
    def call(c: SetAsideCoefs[A], x: A) -> tuple[A, A | float]:
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
