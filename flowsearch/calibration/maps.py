r"""The math of every calibration map, written once for numpy arrays and torch tensors alike.

Each function here is one map (or its inverse) of a calibrator or of a flow step, on a batch of
rows ``x`` of shape ``(n, d)``. The same function serves both sides of a calibrator:

- fitting and autograd: torch tensors (float32 while training, float64 for checks), where the
  operations are those of ``torch.nn`` layers (:func:`linear` is ``torch.nn.functional.linear``)
  so gradients and float32 rounding are the layers' own;
- inference: float64 numpy arrays, with no torch call (a query's few rows cost less than torch's
  dispatch and thread pool).

This module imports no torch: the linear calibrators use it without loading torch. The functions
are generic over :data:`A` (``np.ndarray`` or ``torch.Tensor``); every argument of one call is of
the same kind.

Example:
    >>> x = np.array([[1.0, 2.0], [3.0, 4.0]])
    >>> standardise(x, mu=np.array([2.0, 3.0]), scale=np.array([1.0, 2.0])).tolist()
    [[-1.0, -0.5], [1.0, 0.5]]
    >>> log_normal(np.zeros((1, 2))).round(4).tolist()  # -log(2 pi)
    [-1.8379]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "LOG_2PI",
    "A",
    "actnorm",
    "actnorm_inverse",
    "cat",
    "exp",
    "linear",
    "log",
    "log_normal",
    "relu",
    "standardise",
    "undo_order",
    "unstandardise",
    "unwhiten",
    "whiten",
    "zero",
]

#: ``log(2 pi)``, the standard normal's normalising constant per dimension.
LOG_2PI = math.log(2 * math.pi)
#: Rows a calibrator centres or converts at a time while fitting (whitening's covariance, the
#: flow's constant-channel check and float32 training matrix): the extra memory is this many
#: float64 rows, not a copy of the corpus.
FIT_CHUNK_ROWS = 16_384

#: An array of either kind: every map takes and returns one kind.
A = TypeVar("A", np.ndarray, "Tensor")


def relu(h: A) -> A:
    """``max(h, 0)`` elementwise."""
    if isinstance(h, np.ndarray):
        out: np.ndarray = np.maximum(h, 0.0)
        return out
    return h.relu()


def cat(parts: Sequence[A]) -> A:
    """Concatenates ``(n, d_i)`` blocks along the columns into ``(n, sum d_i)``."""
    if isinstance(parts[0], np.ndarray):
        out: np.ndarray = np.concatenate(parts, axis=1)
        return out
    import torch

    return torch.cat(list(parts), dim=1)


def exp(x: A) -> A:
    """``e^x`` elementwise."""
    if isinstance(x, np.ndarray):
        out: np.ndarray = np.exp(x)
        return out
    return x.exp()


def log(x: A) -> A:
    """The natural logarithm elementwise."""
    if isinstance(x, np.ndarray):
        out: np.ndarray = np.log(x)
        return out
    return x.log()


def undo_order(first: A, second: A) -> A:
    """The column order that puts ``[x[:, first], x[:, second]]`` back as ``x``, for disjoint
    int64 index vectors covering ``range(d)``: ``argsort(concat(first, second))``."""
    if isinstance(first, np.ndarray):
        out: np.ndarray = np.argsort(np.concatenate([first, second]))
        return out
    import torch

    return torch.argsort(torch.cat([first, second]))


def linear(x: A, weight: A, bias: A | None = None) -> A:
    """``x @ weight.T + bias``: ``x`` ``(n, d_in)``, ``weight`` ``(d_out, d_in)``, ``bias``
    ``(d_out,)`` or None. On tensors, ``torch.nn.functional.linear`` (as ``nn.Linear`` does)."""
    if isinstance(x, np.ndarray):
        out: np.ndarray = x @ weight.T
        return out if bias is None else out + bias
    import torch.nn.functional as F

    return F.linear(x, weight, bias)


def zero(x: A) -> A | float:
    """The log-determinant of a volume-preserving map on ``x``: a 0-d tensor of ``x``'s dtype
    for tensors (autograd adds it), a Python float for arrays (cheaper to add than a 0-d
    array, which matters for a query's few rows)."""
    if isinstance(x, np.ndarray):
        return 0.0
    return x.new_zeros(())


def standardise(x: A, mu: A, scale: A) -> A:
    """``(x - mu) / scale`` per column (``mu``, ``scale``: ``(d,)``)."""
    z: A = (x - mu) / scale
    return z


def unstandardise(z: A, mu: A, scale: A) -> A:
    """The inverse of :func:`standardise`: ``z * scale + mu``."""
    x: A = z * scale + mu
    return x


def whiten(x: A, mu: A, rotation: A, scales: A) -> A:
    """``((x - mu) @ rotation) / scales``: centre, rotate onto ``rotation``'s columns
    ``(d, k)``, divide each by its scale ``(k,)``."""
    z: A = ((x - mu) @ rotation) / scales
    return z


def unwhiten(z: A, mu: A, rotation: A, scales: A) -> A:
    """The inverse of :func:`whiten` for an orthogonal ``(d, d)`` rotation:
    ``(z * scales) @ rotation.T + mu``."""
    x: A = (z * scales) @ rotation.T + mu
    return x


def actnorm(x: A, bias: A, scale: A) -> A:
    """Glow's activation normalisation: ``(x + bias) * scale`` per column."""
    y: A = (x + bias) * scale
    return y


def actnorm_inverse(y: A, bias: A, inv_scale: A) -> A:
    """The inverse of :func:`actnorm`: ``y * inv_scale - bias`` (``inv_scale = 1 / scale``)."""
    x: A = y * inv_scale - bias
    return x


def log_normal(z: A) -> A:
    """Per-row log-density of ``z`` ``(n, d)`` under the standard normal ``N(0, I_d)``: ``(n,)``."""
    lp: A = -0.5 * ((z**2).sum(1) + z.shape[1] * LOG_2PI)
    return lp
