r"""Linear calibrators: the baselines of Li et al. 2020 (section 4.3) and BERT-whitening.

- ``none``: identity.
- ``sn``: standard normalisation, ``(u - mu) / sigma`` per dimension.
- ``natsv``: "nulling away the top-k singular vectors" (Mu et al. 2018, all-but-the-top):
  centre, then remove the projection on the top-k principal directions.
- ``sn-natsv``: ``sn`` followed by ``natsv``.
- ``whitening``: ``(u - mu) W`` with ``W = U diag(S^-power)`` from the SVD ``U S U^T`` of the
  covariance (Su et al. 2021; ``power`` 1/2 is full whitening), optionally keeping only the first
  ``k`` columns (dimension reduction), optionally with the covariance shrunk toward the
  identity, ``S + shrinkage * tr(S)/d`` (Ledoit and Wolf 2004).
- ``gaussian``: whitening's map, and the log-density of the fitted full-covariance Gaussian.

Degenerate input (constant dimensions, duplicated rows, fewer rows than dimensions) gives zero
or near-zero variances. Dividing by them would blow noise up to infinity, so scales are floored:
``sn`` at a small fraction of the median standard deviation, ``whitening`` at the smallest
eigenvalue the data really has (directions the corpus does not span are scaled like its
least-varying real direction, no more).

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
    Mu and Viswanath, "All-but-the-Top: Simple and Effective Postprocessing for Word
    Representations", ICLR 2018.
    Su et al., "Whitening Sentence Representations for Better Semantics and Faster
    Retrieval", arXiv:2103.15316, 2021.
    Ledoit and Wolf, "A well-conditioned estimator for large-dimensional covariance matrices",
    Journal of Multivariate Analysis, 2004.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, cast

import numpy as np
import numpy.typing as npt

from flowsearch.calibration import maps
from flowsearch.calibration.base import Calibrator, CalibratorConfig, as_matrix, register
from flowsearch.calibration.maps import LOG_2PI, standardise, unstandardise, unwhiten, whiten
from flowsearch.calibration.state import BadState, Spec, require_positive
from flowsearch.errors import BadInput

__all__ = [
    "FULL_POWER",
    "Gaussian",
    "Identity",
    "NullTopSingular",
    "SNNullTop",
    "StandardNormalization",
    "Whitening",
]

#: sigma below this fraction of the median sigma counts as a constant dimension.
_SN_FLOOR = 1e-3
#: Eigenvalues below this fraction of the largest are numerically zero.
_EIG_RTOL = 1e-9
#: The exponent of full whitening (eigenvalues ^ -1/2), the default strength.
FULL_POWER = 0.5


def _vector(d: int) -> Spec:
    return Spec((d,), "float64")


def _check_k(k: object, name: str, minimum: int) -> int | None:
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < minimum:
        raise BadInput(f"{name}: k must be an integer >= {minimum}, got {k!r}", param="k")
    return int(k)


class _Strength(TypedDict, total=False):
    power: float
    shrinkage: float


def _natsv_check(k: object, name: str) -> int:
    """:func:`_check_k` for the count of directions NATSV nulls, which None is not (whitening's
    ``k=None`` keeps every dimension)."""
    checked = _check_k(k, name, 1)
    if checked is None:
        raise BadInput(f"{name}: k must be an integer >= 1, got None", param="k")
    return checked


def _natsv_k(config: CalibratorConfig) -> int:
    """NATSV's ``k``: an int (its constructor refuses None)."""
    return cast(int, config["k"])


def _check_strength(power: float, shrinkage: float) -> _Strength:
    """The non-default strength options, validated (defaults stay out of the config, so a
    calibrator saved before they existed loads with the same config as it was saved with)."""
    out = _Strength()
    for name, value, low, high in (("power", power, 0.0, FULL_POWER),
                                   ("shrinkage", shrinkage, 0.0, float("inf"))):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise BadInput(f"whitening: {name} must be a number, got {value!r}", param=name)
        if not (low <= float(value) <= high) or not np.isfinite(float(value)):
            bound = f"in [{low}, {high}]" if np.isfinite(high) else f">= {low}"
            raise BadInput(f"whitening: {name} must be {bound}, got {value!r}", param=name)
    if float(power) != FULL_POWER:
        out["power"] = float(power)
    if float(shrinkage) != 0.0:
        out["shrinkage"] = float(shrinkage)
    return out


@register("none")
class Identity(Calibrator):
    """No calibration: vectors pass through unchanged."""

    _invertible = True

    def _fit(self, U: np.ndarray) -> None:
        pass

    def _transform(self, U: np.ndarray) -> np.ndarray:
        return U

    def _inverse(self, Z: np.ndarray) -> np.ndarray:
        return Z

    def state(self) -> dict[str, np.ndarray]:
        return {"dim": np.array([self.dim_in], dtype=np.int64)}

    def _state_spec(self, tensors: Mapping[str, np.ndarray]) -> dict[str, Spec]:
        return {"dim": Spec((1,), "int64")}

    def _check_values(self, tensors: Mapping[str, np.ndarray]) -> None:
        if int(tensors["dim"][0]) != self.dim_in:
            raise BadState(f"tensor 'dim' is {int(tensors['dim'][0])}, dim_in is {self.dim_in}")

    def _load_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        pass


@register("sn")
class StandardNormalization(Calibrator):
    r"""Standard normalisation (SN): ``(u - mu) / sigma`` per dimension.

    Example:
        >>> U = np.random.default_rng(0).normal(3.0, 2.0, size=(500, 3))
        >>> Z = StandardNormalization().fit(U).transform(U)
        >>> bool(np.allclose(Z.std(axis=0), 1, atol=1e-5))
        True
    """

    _invertible = True

    def _fit(self, U: np.ndarray) -> None:
        self.mu = U.mean(axis=0)
        sigma = U.std(axis=0)
        positive = sigma[sigma > 0]
        floor = _SN_FLOOR * float(np.median(positive)) if positive.size else 1.0
        self.sigma = np.maximum(sigma, max(floor, 1e-30))

    def _transform(self, U: np.ndarray) -> np.ndarray:
        return standardise(U, self.mu, self.sigma)

    def _inverse(self, Z: np.ndarray) -> np.ndarray:
        return unstandardise(Z, self.mu, self.sigma)

    def state(self) -> dict[str, np.ndarray]:
        return {"mu": self.mu, "sigma": self.sigma}

    def _state_spec(self, tensors: Mapping[str, np.ndarray]) -> dict[str, Spec]:
        d = self._need_fitted()
        return {"mu": _vector(d), "sigma": _vector(d)}

    def _check_values(self, tensors: Mapping[str, np.ndarray]) -> None:
        require_positive(tensors, ["sigma"])

    def _load_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.mu, self.sigma = tensors["mu"], tensors["sigma"]


@register("natsv")
class NullTopSingular(Calibrator):
    r"""Nulls away the top-``k`` singular vectors (NATSV) of the centred vectors.

    Arguments:
        k: How many leading principal directions to remove, ``1 <= k < d`` (the paper tunes
            1..20 on STS-B dev; its Table 5 reports k = 10 alone and k = 6 after SN).
    """

    def __init__(self, k: int = 6) -> None:
        super().__init__(k=_natsv_check(k, "natsv"))

    def _fit(self, U: np.ndarray) -> None:
        k = _natsv_k(self.config)
        if k >= U.shape[1]:
            raise BadInput(f"natsv: k={k} must be smaller than the dimension {U.shape[1]}")
        self.mu = U.mean(axis=0)
        _, _, vt = np.linalg.svd(U - self.mu, full_matrices=False)
        self.directions = vt[:k].T.copy()

    def _transform(self, U: np.ndarray) -> np.ndarray:
        X = U - self.mu
        out: np.ndarray = X - (X @ self.directions) @ self.directions.T
        return out

    def state(self) -> dict[str, np.ndarray]:
        return {"mu": self.mu, "directions": self.directions}

    def _state_spec(self, tensors: Mapping[str, np.ndarray]) -> dict[str, Spec]:
        d = self._need_fitted()
        return {"mu": _vector(d), "directions": Spec((d, _natsv_k(self.config)), "float64")}

    def _check_values(self, tensors: Mapping[str, np.ndarray]) -> None:
        if _natsv_k(self.config) >= self._need_fitted():
            raise BadState(f"k={self.config['k']} is not below dim_in={self.dim_in}")

    def _load_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.mu, self.directions = tensors["mu"], tensors["directions"]


@register("sn-natsv")
class SNNullTop(Calibrator):
    """Standard normalisation, then NATSV on the normalised vectors (paper's SN + NATSV).

    Arguments:
        k: As for ``natsv``.
    """

    _PARTS = ("sn.", "natsv.")

    def __init__(self, k: int = 6) -> None:
        super().__init__(k=_natsv_check(k, "sn-natsv"))
        self._sn = StandardNormalization()
        self._natsv = NullTopSingular(k=_natsv_k(self.config))

    def _fit(self, U: np.ndarray) -> None:
        self._sn.fit(U)
        self._natsv.fit(self._sn.transform64(U))

    def _transform(self, U: np.ndarray) -> np.ndarray:
        return self._natsv.transform64(self._sn.transform64(U))

    def state(self) -> dict[str, np.ndarray]:
        return {
            **{f"sn.{k}": v for k, v in self._sn.state().items()},
            **{f"natsv.{k}": v for k, v in self._natsv.state().items()},
        }

    def _state_spec(self, tensors: Mapping[str, np.ndarray]) -> dict[str, Spec]:
        d = self._need_fitted()
        directions = Spec((d, _natsv_k(self.config)), "float64")
        return {"sn.mu": _vector(d), "sn.sigma": _vector(d), "natsv.mu": _vector(d),
                "natsv.directions": directions}  # fmt: skip

    def _load_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        d = self._need_fitted()
        for part, prefix in ((self._sn, "sn."), (self._natsv, "natsv.")):
            part.restore(
                {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}, d
            )


@register("whitening")
class Whitening(Calibrator):
    r"""BERT-whitening: ``z = (u - mu) W[:, :k]``, ``W = U diag(S^-power)``, ``U S U^T = cov``.

    Arguments:
        k: Keep the first ``k`` whitened dimensions (largest variance first), ``k <= d``;
            ``None`` keeps all of them, which makes the map invertible.
        power: The strength, in ``[0, 0.5]``: each principal direction is divided by its
            variance to this power. ``0.5`` (default) is full whitening (identity covariance);
            ``0.25`` is partial whitening (the spread of standard deviations is
            square-rooted); ``0`` only centres and rotates.
        shrinkage: ``lambda >= 0``: whiten with ``S + lambda * tr(S)/d`` instead of ``S``;
            ``0`` (default) is none. Large values tend toward centring only.

    Every strength is a full-rank linear map, so the calibrator stays invertible (with
    ``k=None``). Only non-default strengths are written to the config.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> U = rng.normal(size=(2000, 4)) @ np.diag([10.0, 1.0, 0.1, 0.01])
        >>> Z = Whitening().fit(U).transform(U)
        >>> bool(np.allclose(np.cov(Z.T, bias=True), np.eye(4), atol=1e-4))
        True
        >>> Zp = Whitening(power=0.25).fit(U).transform(U)  # std devs 10 : 0.01 become ~3 : 0.1
        >>> [round(float(s), 1) for s in Zp.std(axis=0)]
        [3.2, 1.0, 0.3, 0.1]
    """

    def __init__(
        self, k: int | None = None, power: float = FULL_POWER, shrinkage: float = 0.0
    ) -> None:
        super().__init__(k=_check_k(k, "whitening", 1), **_check_strength(power, shrinkage))

    @property
    def power(self) -> float:
        """The exponent of the eigenvalues (0.5 = full whitening)."""
        return float(self.config.get("power", FULL_POWER))

    @property
    def shrinkage(self) -> float:
        """The shrinkage toward the identity (0 = none)."""
        return float(self.config.get("shrinkage", 0.0))

    @property
    def invertible(self) -> bool:
        return self.config["k"] is None or self.config["k"] == self.dim_in

    @property
    def dim_out(self) -> int | None:
        if self.dim_in is None:
            return None
        return int(self.config["k"] or self.dim_in)

    def _fit(self, U: np.ndarray) -> None:
        k = self.config["k"]
        if k is not None and k > U.shape[1]:
            raise BadInput(f"whitening: k={k} exceeds the dimension {U.shape[1]}", param="k")
        self.mu = U.mean(axis=0)
        cov = np.zeros((U.shape[1], U.shape[1]))
        chunk = maps.FIT_CHUNK_ROWS
        for start in range(0, len(U), chunk):  # centred in chunks: no copy of U
            X = U[start : start + chunk] - self.mu
            cov += X.T @ X
        cov /= U.shape[0]
        eigvecs, eigvals, _ = np.linalg.svd(cov)
        real = eigvals > _EIG_RTOL * max(float(eigvals[0]), 1e-300)
        floor = float(eigvals[real][-1]) if real.any() else 1.0
        self.fit_stats = {"rank": int(real.sum()), "condition_number": float(eigvals[0] / floor)}
        variances = np.maximum(eigvals, floor)
        if self.shrinkage:
            variances = variances + self.shrinkage * float(eigvals.mean())  # tr(cov) / d
        # full whitening keeps the first release's expression (bit-identical scales)
        self.scales = np.sqrt(variances) if self.power == FULL_POWER else variances**self.power
        self.rotation = eigvecs
        self._fit_variances(np.maximum(eigvals, floor))

    def _fit_variances(self, variances: np.ndarray) -> None:
        """Hook for :class:`Gaussian`: the floored principal variances of the fit."""

    def _transform(self, U: np.ndarray) -> np.ndarray:
        k = self.dim_out
        return whiten(U, self.mu, self.rotation[:, :k], self.scales[:k])

    def _inverse(self, Z: np.ndarray) -> np.ndarray:
        return unwhiten(Z, self.mu, self.rotation, self.scales)

    def state(self) -> dict[str, np.ndarray]:
        return {"mu": self.mu, "rotation": self.rotation, "scales": self.scales}

    def _state_spec(self, tensors: Mapping[str, np.ndarray]) -> dict[str, Spec]:
        d = self._need_fitted()
        return {"mu": _vector(d), "rotation": Spec((d, d), "float64"), "scales": _vector(d)}

    def _check_values(self, tensors: Mapping[str, np.ndarray]) -> None:
        require_positive(tensors, ["scales"])
        if self.config["k"] is not None and self.config["k"] > self._need_fitted():
            raise BadState(f"k={self.config['k']} exceeds dim_in={self.dim_in}")

    def _load_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.mu, self.rotation, self.scales = tensors["mu"], tensors["rotation"], tensors["scales"]


@register("gaussian")
class Gaussian(Whitening):
    r"""A full-covariance Gaussian of the corpus: searches its whitening, scores its density.

    The map is :class:`Whitening`'s (same ``k``, ``power`` and ``shrinkage``); ``log_prob`` is
    the log-density of ``u`` under ``N(mu, cov)``, the maximum-likelihood Gaussian (principal
    variances floored as for the map, never shrunk), whatever strength the map has: a density
    at the cost of one matrix product.

    Example:
        >>> U = np.random.default_rng(0).normal(size=(4000, 3)) * [2.0, 1.0, 0.5]
        >>> g = Gaussian(power=0.25).fit(U)
        >>> exact = -0.5 * (3 * np.log(2 * np.pi) + 2 * np.log(2.0 * 1.0 * 0.5))  # at the mean
        >>> bool(abs(g.log_prob(np.zeros((1, 3)))[0] - exact) < 0.02)
        True
    """

    def _fit_variances(self, variances: np.ndarray) -> None:
        self.variances = variances

    def _log_prob_of_rotated(self, X: np.ndarray) -> np.ndarray:
        maha = (X * X / self.variances).sum(axis=1)
        const = float(np.log(self.variances).sum()) + len(self.variances) * LOG_2PI
        out: np.ndarray = -0.5 * (maha + const)
        return out

    def log_prob(self, U: npt.ArrayLike) -> np.ndarray:
        """Per-row log-density of ``U`` ``(n, dim_in)`` under the fitted Gaussian: float64
        ``(n,)``."""
        X = (as_matrix(U, self._need_fitted()) - self.mu) @ self.rotation
        return self._log_prob_of_rotated(X)

    def transform_and_log_prob(self, U: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(transform(U), log_prob(U))`` from one rotation of ``U`` (what a query needs):
        float32 ``(n, dim_out)``, float64 ``(n,)``."""
        X = (as_matrix(U, self._need_fitted()) - self.mu) @ self.rotation
        k = self.dim_out
        Z = (X[:, :k] / self.scales[:k]).astype(np.float32)
        return Z, self._log_prob_of_rotated(X)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "variances": self.variances}

    def _state_spec(self, tensors: Mapping[str, np.ndarray]) -> dict[str, Spec]:
        return {**super()._state_spec(tensors), "variances": _vector(self._need_fitted())}

    def _check_values(self, tensors: Mapping[str, np.ndarray]) -> None:
        super()._check_values(tensors)
        require_positive(tensors, ["variances"])

    def _load_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        super()._load_state(tensors)
        self.variances = tensors["variances"]
