r"""The calibrator protocol and its registry.

A calibrator maps raw sentence vectors ``U`` (shape ``(n, d)``) to a space where cosine
similarity is better behaved. Every calibrator is fitted without labels on the corpus's own
vectors (the "target" setting of Li et al. 2020) and then applied unchanged to queries.
Saving and loading are in :mod:`~flowsearch.calibration.files`.

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import ClassVar, Literal, TypedDict, TypeVar, cast

import numpy as np
import numpy.typing as npt
from typing_extensions import Unpack  # typing.Unpack is 3.11+

from flowsearch.calibration.state import Spec, check_state
from flowsearch.errors import BadInput
from flowsearch.jsonable import JSONObject

__all__ = [
    "CALIBRATORS",
    "Calibrator",
    "CalibratorConfig",
    "FlowConfig",
    "as_config",
    "as_matrix",
    "check_rows",
    "json_config",
    "make_calibrator",
    "names",
    "register",
]


class FlowConfig(TypedDict, total=False):
    """The flows' hyper-parameters (``flow``, ``whitening-flow``); each is checked by
    :class:`~flowsearch.calibration.flow.FlowCalibrator`, which documents them."""

    levels: int
    depth: int
    width: int
    epochs: float
    lr: float
    batch_size: int
    seed: int
    permutation: Literal["reverse", "random"]
    init_rows: int
    prewhiten: bool


class CalibratorConfig(FlowConfig, total=False):
    """Every hyper-parameter a calibrator of this release takes (each takes some of them, and
    its constructor checks their values): the flows' (:class:`FlowConfig`), ``k`` (``natsv``,
    ``sn-natsv``, ``whitening``, ``gaussian``; None: all dimensions), and the whitening
    strengths ``power`` and ``shrinkage``. What :attr:`Calibrator.config` holds: JSON scalars."""

    k: int | None
    power: float
    shrinkage: float


def as_config(config: Mapping[str, object]) -> CalibratorConfig:
    """``config`` (a saved ``config.json``'s, a caller's dict) as calibrator options, unchecked
    here: each calibrator's constructor checks the values it takes (BadInput) and refuses
    names it does not take (TypeError, BadInput from :func:`make_calibrator`)."""
    return cast(CalibratorConfig, config)


def json_config(config: CalibratorConfig) -> JSONObject:
    """``config`` as the JSON object it is (a copy): every option is a JSON scalar."""
    out: JSONObject = {}
    for key, value in config.items():
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise TypeError(f"calibrator option {key}={value!r} is not a JSON scalar")
        out[key] = value
    return out


#: name -> calibrator class; filled by :func:`register`.
CALIBRATORS: dict[str, type[Calibrator]] = {}


def names() -> list[str]:
    """Every calibrator name :func:`make_calibrator` accepts, sorted."""
    return sorted(CALIBRATORS)


C = TypeVar("C", bound="type[Calibrator]")


def register(name: str) -> Callable[[C], C]:
    """Class decorator: make a calibrator available to :func:`make_calibrator` as ``name``."""

    def wrap(cls: C) -> C:
        cls.name = name
        CALIBRATORS[name] = cls
        return cls

    return wrap


def check_rows(U: npt.ArrayLike, dim: int | None = None, what: str = "U") -> np.ndarray:
    """``U`` as a finite float32 or float64 matrix ``(n, dim)`` (a copy only if it was neither).

    A single vector of ``dim`` values is taken as one row.

    Raises:
        BadInput: not numeric, not 2-d, another dimension than ``dim``, NaN or infinite values.
    """
    try:
        arr = np.asarray(U)
        if arr.dtype not in (np.float32, np.float64):
            arr = arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise BadInput(f"{what} must be a numeric array of shape (n, d)") from exc
    if arr.ndim == 1 and dim is not None and arr.shape[0] == dim:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise BadInput(f"{what} must have shape (n, d), got {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise BadInput(
            f"{what} has {arr.shape[1]} dimensions but the calibrator was fitted on {dim}",
            fix="use the same encoder and pooling as when it was fitted",
        )
    if not np.isfinite(arr).all():
        raise BadInput(f"{what} contains NaN or infinite values", fix="check the encoder output")
    return arr


def as_matrix(U: npt.ArrayLike, dim: int | None = None, what: str = "U") -> np.ndarray:
    """``U`` as a finite float64 matrix ``(n, dim)``; see :func:`check_rows`."""
    return check_rows(U, dim, what).astype(np.float64, copy=False)


class Calibrator(ABC):
    r"""Maps raw sentence vectors to a calibrated space.

    Subclasses implement :meth:`_fit`, :meth:`_transform` and, where they can,
    :meth:`_inverse` / :meth:`log_prob`; and for saving, :meth:`state`, :meth:`_state_spec`
    and :meth:`_load_state`.

    Attributes:
        name: The registry name.
        config: The JSON-able hyper-parameters (what :func:`make_calibrator` was given).
        dim_in: Input dimension once fitted, else None.
        fit_stats: Figures measured while fitting (e.g. the flow's log-likelihood), JSON-able.
    """

    name: ClassVar[str] = "?"
    #: Whether :meth:`inverse` exists for this calibrator class (see :attr:`invertible`).
    _invertible: ClassVar[bool] = False

    def __init__(self, **config: Unpack[CalibratorConfig]) -> None:
        self.config: CalibratorConfig = config.copy()
        self.dim_in: int | None = None
        self.fit_stats: JSONObject = {}

    @property
    def invertible(self) -> bool:
        """Whether :meth:`inverse` exists (for some calibrators it depends on the config)."""
        return self._invertible

    @property
    def fitted(self) -> bool:
        """True once :meth:`fit` (or loading) has set the calibrator up."""
        return self.dim_in is not None

    @property
    def dim_out(self) -> int | None:
        """Output dimension (the input's, unless the calibrator reduces it); None unfitted."""
        return self.dim_in

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        state = "fitted" if self.fitted else "unfitted"
        return f"{type(self).__name__}({args}) [{state}, dim_in={self.dim_in}]"

    # -- public protocol -------------------------------------------------------------------

    def fit(self, U: npt.ArrayLike) -> Calibrator:
        """Fits on raw vectors ``U`` ``(n, d)``, ``n >= 2``, and returns ``self``.

        Raises:
            BadInput: fewer than 2 rows, or ``U`` not a finite matrix.
        """
        arr = as_matrix(U)
        if arr.shape[0] < 2:
            raise BadInput(f"{self.name} calibration needs at least 2 vectors, got {arr.shape[0]}")
        self.dim_in = arr.shape[1]
        self._fit(arr)
        return self

    def transform(self, U: npt.ArrayLike) -> np.ndarray:
        """Maps raw vectors ``(n, dim_in)`` to the calibrated space: float32 ``(n, dim_out)``.

        Raises:
            BadInput: unfitted, or ``U`` not a finite matrix of ``dim_in`` columns.
        """
        return self._transform(as_matrix(U, self._need_fitted())).astype(np.float32)

    def inverse(self, Z: npt.ArrayLike) -> np.ndarray:
        """Maps calibrated vectors ``(n, dim_out)`` back to raw ones: float32 ``(n, dim_in)``.

        Raises:
            NotImplementedError: the calibrator is not invertible (see :attr:`invertible`).
            BadInput: unfitted, or ``Z`` not a finite matrix of ``dim_out`` columns.
        """
        if not self.invertible:
            raise NotImplementedError(f"the {self.name!r} calibrator is not invertible")
        self._need_fitted()
        return self._inverse(as_matrix(Z, self.dim_out, "Z")).astype(np.float32)

    def log_prob(self, U: npt.ArrayLike) -> np.ndarray:
        """Per-row log-density of ``U`` ``(n, dim_in)`` under the fitted model: float64 ``(n,)``.

        Raises:
            NotImplementedError: the calibrator has no density (only the flows and ``gaussian``
                have one).
        """
        raise NotImplementedError(f"the {self.name!r} calibrator has no density")

    def transform64(self, U: np.ndarray) -> np.ndarray:
        """The fitted map at float64, unchecked: float64 ``(n, dim_out)``. For calibrators
        built from others (the flow's whitening front layer, SN then NATSV), which check their
        own input once."""
        self._need_fitted()
        return self._transform(np.asarray(U, dtype=np.float64))

    def inverse64(self, Z: np.ndarray) -> np.ndarray:
        """The inverse map at float64, unchecked (see :meth:`transform64`)."""
        self._need_fitted()
        return self._inverse(np.asarray(Z, dtype=np.float64))

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Writes ``config.json`` and ``weights.safetensors`` into ``directory`` (created if
        needed; each file replaced atomically). See :func:`~flowsearch.calibration.files.save`.

        Raises:
            BadInput: the calibrator is not fitted.
        """
        from flowsearch.calibration.files import save

        save(self, directory)

    def restore(self, tensors: Mapping[str, np.ndarray], dim_in: int) -> Calibrator:
        """Sets the fitted state from :meth:`state`'s arrays, checked first.

        Raises:
            BadState: an array is missing, extra, of another shape or dtype, non-finite, or
                otherwise impossible (the loader names the file).
        """
        self.dim_in = int(dim_in)
        check_state(tensors, self._state_spec(tensors))
        self._check_values(tensors)
        self._load_state(tensors)
        return self

    # -- for subclasses --------------------------------------------------------------------

    @abstractmethod
    def _fit(self, U: np.ndarray) -> None:
        """Fits on float64 ``(n, dim_in)``, ``n >= 2`` (``dim_in`` is set)."""

    @abstractmethod
    def _transform(self, U: np.ndarray) -> np.ndarray:
        """The map: float64 ``(n, dim_in)`` to float64 ``(n, dim_out)``."""

    def _inverse(self, Z: np.ndarray) -> np.ndarray:
        """The inverse map: float64 ``(n, dim_out)`` to float64 ``(n, dim_in)``."""
        raise NotImplementedError(f"the {self.name!r} calibrator is not invertible")

    @abstractmethod
    def state(self) -> dict[str, np.ndarray]:
        """The fitted arrays, by name (what ``weights.safetensors`` holds)."""

    @abstractmethod
    def _state_spec(self, tensors: Mapping[str, np.ndarray]) -> dict[str, Spec]:
        """The arrays :meth:`state` gives for this config and ``dim_in``: name -> shape, dtype
        (``tensors``: the arrays at hand, for calibrators whose shapes depend on them)."""

    def _check_values(self, tensors: Mapping[str, np.ndarray]) -> None:  # noqa: B027 - optional
        """Raises :class:`~flowsearch.calibration.state.BadState` for arrays of the right shape
        that this calibrator cannot use (e.g. a scale <= 0). Called after the shapes check."""

    @abstractmethod
    def _load_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Sets the fitted state from checked arrays (``dim_in`` is set)."""

    def _need_fitted(self) -> int:
        if self.dim_in is None:
            raise BadInput(f"the {self.name!r} calibrator is not fitted", fix="call fit(U) first")
        return self.dim_in


def make_calibrator(name: str, **config: Unpack[CalibratorConfig]) -> Calibrator:
    r"""Creates an unfitted calibrator by registry name.

    Arguments:
        name: One of :func:`names`: ``none``, ``flow``, ``whitening-flow``, ``whitening``,
            ``gaussian``, ``sn``, ``natsv``, ``sn-natsv``.
        config: Hyper-parameters, e.g. ``make_calibrator("flow", levels=2, depth=3)``,
            ``make_calibrator("whitening", k=256)``, ``make_calibrator("natsv", k=6)``.

    Raises:
        BadInput: an unknown name (``param="calibration"``), an unknown or invalid option.

    Example:
        >>> cal = make_calibrator("sn")
        >>> cal.fit(np.random.default_rng(0).normal(size=(50, 4))).transform(np.ones((1, 4))).shape
        (1, 4)
    """
    cls = CALIBRATORS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise BadInput(
            f"unknown calibration {name!r}",
            fix=f"choose one of {', '.join(names())}",
            param="calibration",
        )
    try:
        return cls(**config)
    except TypeError as exc:
        raise BadInput(f"bad option for the {name!r} calibrator: {exc}") from exc
