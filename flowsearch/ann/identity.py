r"""The exact inner-product twin of a linear calibrator's cosine ranking.

A linear calibrator maps a raw vector ``x`` to ``z = ((x - mu) @ R) / s`` (``R`` the (d, k)
rotation, ``s`` the (k,) scales: whitening, ``gaussian``). Ranking rows by the cosine of the
calibrated vectors ``cos(z_q, z_x)`` is the same as ranking them by the inner product
``u . v`` of

- ``v = (x - mu) / |z_x|`` for every row (the raw space's geometry, centred, rescaled), and
- ``u = (x_q - mu) @ R diag(s^-2) @ R^T`` for a query (the factor ``1/|z_q|`` is the same
  for every row of one query, so it does not change the ranking),

because ``z_q . z_x = (x_q - mu) R S^-2 R^T (x - mu)^T``. The scores differ from the cosines
only by the query's factor ``|z_q|``, which :func:`twin_queries` divides out. So an index can
be built on ``v`` (the raw space's cluster structure) and answer the calibrated space's queries
with no loss;
:func:`linear_twin` makes both sides (``benchmarks/bench_ann_study.py`` measures whether that
pays, ``tests/test_ann_tuning.py`` checks the identity).

Example:
    >>> rng = np.random.default_rng(0)
    >>> x, q = rng.normal(size=(50, 4)), rng.normal(size=(3, 4))
    >>> mu, rot, s = x.mean(0), np.linalg.qr(rng.normal(size=(4, 4)))[0], np.array([3., 2, 1, .5])
    >>> v, u = linear_twin(x, q, mu, rot, s)
    >>> z, zq = (x - mu) @ rot / s, (q - mu) @ rot / s
    >>> unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)
    >>> bool(np.allclose(u @ v.T, unit(zq) @ unit(z).T, atol=1e-5))
    True
"""

from __future__ import annotations

import numpy as np

__all__ = ["linear_twin", "twin_queries", "twin_rows"]


def twin_rows(
    x: np.ndarray, mu: np.ndarray, rotation: np.ndarray, scales: np.ndarray
) -> np.ndarray:
    """``v = (x - mu) / |((x - mu) @ R) / s|``: float32 (n, d)."""
    centred = np.asarray(x, np.float64) - mu
    norms = np.linalg.norm((centred @ rotation) / scales, axis=1, keepdims=True)
    v: np.ndarray = (centred / np.maximum(norms, 1e-12)).astype(np.float32)
    return v


def twin_queries(
    q: np.ndarray, mu: np.ndarray, rotation: np.ndarray, scales: np.ndarray
) -> np.ndarray:
    """``u = (q - mu) @ R diag(s^-2) R^T``, divided by ``|z_q|`` so that ``u . v`` is the
    calibrated cosine itself: float32 (m, d)."""
    centred = np.asarray(q, np.float64) - mu
    z = (centred @ rotation) / scales
    u = (z / scales) @ rotation.T
    out: np.ndarray = (u / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)).astype(
        np.float32
    )
    return out


def linear_twin(
    x: np.ndarray, q: np.ndarray, mu: np.ndarray, rotation: np.ndarray, scales: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(v, u)``: rows and queries whose inner products are the calibrated space's cosines
    (:func:`twin_rows`, :func:`twin_queries`)."""
    return twin_rows(x, mu, rotation, scales), twin_queries(q, mu, rotation, scales)
