r"""The math of a flow's steps without torch, and their frozen (inference) form.

A step's math is a small class of static functions (a *math class*), written with
:mod:`~flowsearch.calibration.maps` so that they run on torch tensors and numpy arrays alike:

- ``coefs(...)``: the *coefficients* the map needs, from the step's parameters (e.g.
  ``exp(logs)``); learned steps read their parameters through a :data:`Params` lookup by name;
- ``call(c, x) -> (y, log|det dy/dx|)`` and ``inv(c, y) -> x``.

The torch modules of :mod:`~flowsearch.calibration.steps` and
:mod:`~flowsearch.calibration.glow` hold the parameters and run these functions on tensors
(fitting, autograd checks); a :class:`Frozen` step runs the *same* functions on float64 numpy
coefficients (inference). A frozen step comes either from a module (``Step.freeze``) or
straight from a saved calibrator's arrays (:mod:`~flowsearch.calibration.glowmath`), so loading
a calibrator for inference never imports torch. There is one definition of each step's math.

Rows are the batch: ``x`` is ``(n, d)``. The log-determinant is a scalar for every step here,
since none has a Jacobian that depends on ``x``: a 0-d tensor in torch, a float when frozen.

Here: the protocol every step form follows (:class:`Bijection`), the frozen forms
(:class:`Frozen`, :class:`Chunked`), and the math of the composites (:class:`ComposeMath` in
sequence, :class:`SplitMath` for multi-scale factoring out, :class:`SetAsideMath` for constant
channels, which :func:`constant_channels` finds) and of :class:`WhitenMath`, a fixed whitening
map.

References:
    Dinh, Sohl-Dickstein and Bengio, "Density estimation using Real NVP", ICLR 2017
    (factoring out half the dimensions at each scale, section 3.6).
    Su et al., "Whitening Sentence Representations for Better Semantics and Faster Retrieval",
    arXiv:2103.15316, 2021 (the whitening map).

Example:
    >>> mu, rotation, scales = np.zeros(2), np.eye(2), np.array([2.0, 4.0])
    >>> whiten = Frozen(WhitenMath, WhitenMath.coefs(mu, rotation, scales))
    >>> y, ladj = whiten(np.array([[2.0, 4.0]]))
    >>> y.tolist(), round(ladj, 4)  # log|det| = -log(2 * 4)
    ([[1.0, 1.0]], -2.0794)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeAlias

import numpy as np

from flowsearch.calibration import maps
from flowsearch.calibration.maps import (
    A,
    cat,
    log,
    standardise,
    undo_order,
    unstandardise,
    unwhiten,
    whiten,
    zero,
)
from flowsearch.errors import BadInput

__all__ = [
    "STD_FLOOR",
    "Bijection",
    "Chunked",
    "ComposeMath",
    "Frozen",
    "Params",
    "SetAsideMath",
    "SplitMath",
    "StepMath",
    "WhitenMath",
    "compose",
    "constant_channels",
    "scoped",
]

#: A channel whose spread is below this fraction of the typical one counts as constant.
STD_FLOOR = 1e-3
#: Largest matrix product (multiply-adds) in one chunk of the flow's steps: OpenBLAS runs a
#: product below about this size on the calling thread and splits larger ones over its
#: threads, which on a busy machine then wait for each other.
CHUNK_MACS = 500_000

#: A step's parameters by name: its state-dict key, which is also its name in the saved form
#: below the step's prefix (tensors of a torch module, or float64 / int64 arrays of a file).
Params: TypeAlias = Callable[[str], A]


def scoped(params: Params[A], prefix: str) -> Params[A]:
    """The parameters below ``prefix`` (a child step's, e.g. ``"norm1."``)."""
    return lambda name: params(prefix + name)


class Bijection(Protocol[A]):
    """What a composite step calls its parts through: a torch step (tensors), a
    :class:`Frozen` or :class:`Chunked` one (float64 arrays)."""

    def __call__(self, x: A) -> tuple[A, A | float]: ...

    def inverse(self, y: A) -> A: ...


class StepMath:
    """A step's math: subclasses define ``coefs`` (with the parameters it needs) and these two."""

    @staticmethod
    def call(c: Any, x: A) -> tuple[A, A | float]:
        """``(f(x), log|det df/dx|)`` for rows ``x`` ``(n, d_in)``: ``(n, d_out)`` and a scalar
        (a 0-d tensor for tensors, a float for arrays)."""
        raise NotImplementedError

    @staticmethod
    def inv(c: Any, y: A) -> A:
        """``f^-1(y)`` for rows ``y`` ``(n, d_out)``."""
        raise NotImplementedError


class Frozen:
    """A step's inference form: its math class's ``call`` / ``inv`` on numpy coefficients.

    Calling it takes and returns float64 numpy arrays, as a torch step does tensors.

    Arguments:
        math: The step's math class.
        coefs: Its coefficients: float64 arrays, int64 index arrays, floats, ints, and frozen
            child steps.
    """

    __slots__ = ("coefs", "math")

    def __init__(self, math: type[StepMath], coefs: Any) -> None:
        self.math = math
        self.coefs = coefs

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        """``(y, log|det dy/dx|)`` for float64 rows ``x``."""
        y, ladj = self.math.call(self.coefs, x)
        return y, float(ladj)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """``x`` such that ``self(x)[0] == y``."""
        return self.math.inv(self.coefs, y)

    def __repr__(self) -> str:
        return f"Frozen({self.math.__name__.removesuffix('Math')})"


class Chunked:
    """A frozen step run over its rows in chunks: rows are independent, so the result is the
    step's own; every temporary, and every matrix product, stays as small as a chunk. The
    step's log-determinant must not depend on the rows (true of every step here).

    Arguments:
        inner: The frozen step.
        macs_per_row: Multiply-adds per row of the step's largest matrix product; a chunk has
            ``CHUNK_MACS // macs_per_row`` rows (read at call time).
    """

    __slots__ = ("inner", "macs_per_row")

    def __init__(self, inner: Bijection[np.ndarray], macs_per_row: int) -> None:
        self.inner = inner
        self.macs_per_row = macs_per_row

    def rows(self) -> int:
        """Rows per chunk now."""
        return max(1, CHUNK_MACS // self.macs_per_row)

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


# -- composites ----------------------------------------------------------------------------


class ComposeCoefs(NamedTuple, Generic[A]):
    """The steps in order."""

    steps: tuple[Bijection[A], ...]


class ComposeMath(StepMath):
    r"""Steps in sequence: ``f = f_n o ... o f_1``; ``log|det|`` is the sum of theirs."""

    @staticmethod
    def coefs(steps: Sequence[Bijection[A]]) -> ComposeCoefs[A]:
        return ComposeCoefs(tuple(steps))

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


def compose(steps: Sequence[Bijection[np.ndarray]]) -> Frozen:
    """Frozen steps in sequence, as one frozen step."""
    return Frozen(ComposeMath, ComposeMath.coefs(steps))


class SplitCoefs(NamedTuple, Generic[A]):
    """Channels that go on, and the step they go through."""

    keep: int
    inner: Bijection[A]


class SplitMath(StepMath):
    r"""Multi-scale factoring out: ``y = [x[:, keep:], inner(x[:, :keep])]``.

    The last ``d - keep`` channels leave the flow here, straight to the prior; the first
    ``keep`` go on through ``inner``. ``log|det|`` is ``inner``'s.
    """

    @staticmethod
    def coefs(keep: int, inner: Bijection[A]) -> SplitCoefs[A]:
        return SplitCoefs(keep, inner)

    @staticmethod
    def call(c: SplitCoefs[A], x: A) -> tuple[A, A | float]:
        y, ladj = c.inner(x[:, : c.keep])
        return cat([x[:, c.keep :], y]), ladj

    @staticmethod
    def inv(c: SplitCoefs[A], y: A) -> A:
        out = y.shape[1] - c.keep
        return cat([c.inner.inverse(y[:, out:]), y[:, :out]])


class WhitenCoefs(NamedTuple, Generic[A]):
    """Mean ``(d,)``, rotation ``(d, d)``, scales ``(d,)``, log-det ``-sum(log scales)``."""

    mu: A
    rotation: A
    scales: A
    ladj: A | float


class WhitenMath(StepMath):
    r"""A fixed whitening map ``y = ((x - mu) R) / s`` (R orthogonal);
    ``log|det| = -sum(log s)``."""

    @staticmethod
    def coefs(mu: A, rotation: A, scales: A) -> WhitenCoefs[A]:
        """From the mean ``(d,)``, the orthogonal rotation ``(d, d)`` and the positive scales
        ``(d,)``."""
        return WhitenCoefs(mu, rotation, scales, -log(scales).sum())

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


class SetAsideMath(StepMath):
    r"""Constant channels set aside: ``y = [inner(x[:, active]), (x[:, constant] - mu) / scale]``.

    A channel that is constant over the corpus carries no information and would give the
    likelihood an unbounded direction; it gets this fixed standardisation instead of the flow.
    ``log|det| = inner's - sum(log scale)``.
    """

    @staticmethod
    def coefs(inner: Bijection[A], active: A, constant: A, mu: A, scale: A) -> SetAsideCoefs[A]:
        """From the inner step, disjoint sorted int64 channel indices covering ``range(d)``, and
        the constant channels' mean and (positive) scale ``(len(constant),)``."""
        order = undo_order(active, constant)
        return SetAsideCoefs(inner, active, constant, mu, scale, order, -log(scale).sum())

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


def constant_channels(U: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which channels of ``U`` ``(n, d)`` a flow sets aside, and their fixed map: ``(active,
    constant, mu, scale)``, the int64 indices of the channels with spread and of those whose
    spread is below :data:`STD_FLOOR` of the typical (median) one, and the latter's mean and
    scale (the typical spread) for :class:`SetAsideMath`.

    Raises:
        BadInput: every channel is constant.
    """
    mean = U.mean(axis=0)
    square = np.zeros(U.shape[1])
    chunk = maps.FIT_CHUNK_ROWS
    for start in range(0, len(U), chunk):  # centred in chunks: no (n, d) temporary
        square += ((U[start : start + chunk] - mean) ** 2).sum(axis=0)
    std = np.sqrt(square / len(U))
    typical = float(np.median(std)) or 1.0
    constant = std < STD_FLOOR * typical
    if constant.all():
        raise BadInput("flow: every dimension is constant; the vectors carry no signal")
    active, constant_idx = np.flatnonzero(~constant), np.flatnonzero(constant)
    return (
        active,
        constant_idx,
        U[:, constant_idx].mean(axis=0),
        np.full(len(constant_idx), typical),
    )
