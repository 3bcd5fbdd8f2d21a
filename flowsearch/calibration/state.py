r"""What a calibrator's saved arrays must look like, and the check that they do.

A fitted calibrator is a set of named arrays (what ``weights.safetensors`` holds). Each
calibrator says which it expects, with their shape and dtype (:class:`Spec`), given its config and
input dimension; :func:`check_state` holds a set of arrays to that and raises :class:`BadState`
naming the first array at fault. The loader turns that into a one-line :class:`BadInput` naming
the file.

Example:
    >>> check_state({"mu": np.zeros(3)}, {"mu": Spec((3,), "float64")})
    >>> check_state({"mu": np.zeros(2)}, {"mu": Spec((3,), "float64")})
    Traceback (most recent call last):
    ...
    flowsearch.calibration.state.BadState: tensor 'mu' has shape (2,), expected (3,)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

__all__ = ["BadState", "Spec", "check_state", "require_permutation", "require_positive"]


class BadState(ValueError):
    """A calibrator's arrays do not fit it (a missing, extra, ill-shaped or non-finite array)."""


class Spec(NamedTuple):
    """An expected array: its shape and its dtype's name (``float64``, ``float32``, ``int64``)."""

    shape: tuple[int, ...]
    dtype: str


def check_state(tensors: Mapping[str, np.ndarray], specs: Mapping[str, Spec]) -> None:
    """Checks that ``tensors`` holds exactly the arrays of ``specs``, each of its shape and
    dtype, and every float one finite.

    Raises:
        BadState: the first problem found, naming the array.
    """
    missing = sorted(set(specs) - set(tensors))
    if missing:
        raise BadState(f"tensor {missing[0]!r} is missing" + _and_more(missing))
    extra = sorted(set(tensors) - set(specs))
    if extra:
        raise BadState(f"unexpected tensor {extra[0]!r}" + _and_more(extra))
    for name, spec in specs.items():
        arr = tensors[name]
        if arr.dtype != np.dtype(spec.dtype):
            raise BadState(f"tensor {name!r} is {arr.dtype}, expected {spec.dtype}")
        if arr.shape != spec.shape:
            raise BadState(f"tensor {name!r} has shape {arr.shape}, expected {spec.shape}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise BadState(f"tensor {name!r} has NaN or infinite values")


def require_positive(tensors: Mapping[str, np.ndarray], names: Iterable[str]) -> None:
    """Raises :class:`BadState` unless every value of the named arrays is above zero (scales
    that are divided by, or whose logarithm is taken)."""
    for name in names:
        if not (tensors[name] > 0).all():
            raise BadState(f"tensor {name!r} has values <= 0 (it holds scales)")


def require_permutation(tensors: Mapping[str, np.ndarray], name: str, inverse: str) -> None:
    """Raises :class:`BadState` unless ``tensors[name]`` is a permutation of ``range(d)`` and
    ``tensors[inverse]`` its inverse."""
    perm, inv = tensors[name], tensors[inverse]
    if not np.array_equal(np.sort(perm), np.arange(len(perm))):
        raise BadState(f"tensor {name!r} is not a permutation of 0..{len(perm) - 1}")
    if not np.array_equal(perm[inv], np.arange(len(perm))):
        raise BadState(f"tensor {inverse!r} is not the inverse of {name!r}")


def _and_more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""
