r"""The calibrator protocol, its registry, and saving/loading (JSON + safetensors, never pickle).

A calibrator maps raw sentence vectors ``U`` (float32, shape ``(n, d)``) to a space where cosine
similarity is better behaved. Every calibrator is fitted without labels on the corpus's own
vectors (the "target" setting of Li et al. 2020) and then applied unchanged to queries.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from flowsearch.atomic import atomic_write
from flowsearch.errors import FlowsearchError

__all__ = [
    "CALIBRATORS",
    "Calibrator",
    "as_matrix",
    "load_calibrator",
    "make_calibrator",
    "register",
]

LOG = logging.getLogger(__name__)

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"

#: name -> calibrator class; filled by :func:`register`.
CALIBRATORS: dict[str, type[Calibrator]] = {}
#: Calibrators registered by a module imported on first use (the flow needs torch, which
#: ``import flowsearch.calibration`` must not load).
LAZY: dict[str, str] = {
    "flow": "flowsearch.calibration.flow",
    "whitening-flow": "flowsearch.calibration.flow",
}


def names() -> list[str]:
    """Every calibrator name :func:`make_calibrator` accepts."""
    return sorted(set(CALIBRATORS) | set(LAZY))


C = TypeVar("C", bound="type[Calibrator]")


def register(name: str) -> Callable[[C], C]:
    """Class decorator: make a calibrator available to :func:`make_calibrator` as ``name``."""

    def wrap(cls: C) -> C:
        cls.name = name
        CALIBRATORS[name] = cls
        return cls

    return wrap


def as_matrix(U: Any, dim: int | None = None, what: str = "U") -> np.ndarray:
    """Checks and converts an input to a finite float64 matrix of shape ``(n, dim)``."""
    try:
        arr = np.asarray(U, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise FlowsearchError(f"{what} must be a numeric array of shape (n, d)") from exc
    if arr.ndim == 1 and dim is not None and arr.shape[0] == dim:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise FlowsearchError(f"{what} must have shape (n, d), got {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise FlowsearchError(
            f"{what} has {arr.shape[1]} dimensions but the calibrator was fitted on {dim}; "
            "use the same encoder and pooling as when it was fitted"
        )
    if not np.isfinite(arr).all():
        raise FlowsearchError(f"{what} contains NaN or infinite values; check the encoder output")
    return arr


class Calibrator(ABC):
    r"""Maps raw sentence vectors to a calibrated space.

    Subclasses implement :meth:`_fit`, :meth:`_transform` and, where they can,
    :meth:`_inverse` / :meth:`_log_prob`, plus :meth:`state` / :meth:`_load_state` for saving.

    Attributes:
        name: The registry name.
        config: The JSON-able hyper-parameters (what :func:`make_calibrator` was given).
        dim_in: Input dimension once fitted.
        fit_stats: Figures measured while fitting (e.g. the flow's log-likelihood).
    """

    name: ClassVar[str] = "?"
    #: Whether :meth:`inverse` exists for this calibrator class (see :attr:`invertible`).
    _invertible: ClassVar[bool] = False

    @property
    def invertible(self) -> bool:
        """Whether :meth:`inverse` exists (for some calibrators it depends on the config)."""
        return self._invertible

    def __init__(self, **config: Any) -> None:
        self.config: dict[str, Any] = dict(config)
        self.dim_in: int | None = None
        self.fit_stats: dict[str, Any] = {}

    @property
    def fitted(self) -> bool:
        """True once :meth:`fit` (or loading) has set the calibrator up."""
        return self.dim_in is not None

    @property
    def dim_out(self) -> int | None:
        """Output dimension (the input's, unless the calibrator reduces it)."""
        return self.dim_in

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        state = "fitted" if self.fitted else "unfitted"
        return f"{type(self).__name__}({args}) [{state}, dim_in={self.dim_in}]"

    # -- public protocol -------------------------------------------------------------------

    def fit(self, U: Any) -> Calibrator:
        """Fits on raw vectors ``U`` (shape ``(n, d)``) and returns ``self``."""
        arr = as_matrix(U)
        if arr.shape[0] < 2:
            raise FlowsearchError(
                f"{self.name} calibration needs at least 2 vectors to fit, got {arr.shape[0]}"
            )
        self.dim_in = arr.shape[1]
        self._fit(arr)
        return self

    def transform(self, U: Any) -> np.ndarray:
        """Maps raw vectors ``(n, d)`` to the calibrated space: float32 ``(n, dim_out)``."""
        return self._transform(as_matrix(U, self._need_fitted())).astype(np.float32)

    def transform64(self, U: np.ndarray) -> np.ndarray:
        """The fitted map at float64, unchecked: for calibrators built from others (the flow's
        whitening front layer, SN then NATSV), which check their own input once."""
        self._need_fitted()
        return self._transform(np.asarray(U, dtype=np.float64))

    def inverse64(self, Z: np.ndarray) -> np.ndarray:
        """The inverse map at float64, unchecked (see :meth:`transform64`)."""
        self._need_fitted()
        return self._inverse(np.asarray(Z, dtype=np.float64))

    def restore(self, tensors: dict[str, np.ndarray], dim_in: int) -> Calibrator:
        """Set the fitted state from :meth:`state`'s arrays (as :func:`load_calibrator` does)."""
        self.dim_in = int(dim_in)
        self._load_state(tensors)
        return self

    def inverse(self, Z: Any) -> np.ndarray:
        """Maps calibrated vectors back to the raw space (float32), where invertible."""
        if not self.invertible:
            raise NotImplementedError(f"the {self.name!r} calibrator is not invertible")
        self._need_fitted()
        return self._inverse(as_matrix(Z, self.dim_out, "Z")).astype(np.float32)

    def log_prob(self, U: Any) -> np.ndarray:
        """Per-row log-density of ``U`` under the fitted model, float64 ``(n,)``."""
        raise NotImplementedError(f"the {self.name!r} calibrator has no density")

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Writes ``config.json`` and ``weights.safetensors`` into ``directory`` (atomically)."""
        from safetensors.numpy import save_file

        self._need_fitted()
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        meta = {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "config": self.config,
            "dim_in": self.dim_in,
            "fit_stats": self.fit_stats,
        }
        tensors = {k: np.ascontiguousarray(v) for k, v in self.state().items()}
        atomic_write(path / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp))
        atomic_write(
            path / CONFIG_FILE,
            lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=2, sort_keys=True)),
        )

    # -- for subclasses --------------------------------------------------------------------

    @abstractmethod
    def _fit(self, U: np.ndarray) -> None: ...

    @abstractmethod
    def _transform(self, U: np.ndarray) -> np.ndarray: ...

    def _inverse(self, Z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @abstractmethod
    def state(self) -> dict[str, np.ndarray]:
        """The fitted arrays, by name (what ``weights.safetensors`` holds)."""

    @abstractmethod
    def _load_state(self, tensors: dict[str, np.ndarray]) -> None: ...

    def _need_fitted(self) -> int:
        if self.dim_in is None:
            raise FlowsearchError(f"the {self.name!r} calibrator is not fitted; call fit(U) first")
        return self.dim_in


def make_calibrator(name: str, **config: Any) -> Calibrator:
    r"""Creates an unfitted calibrator by registry name.

    Arguments:
        name: ``none``, ``flow``, ``whitening``, ``sn``, ``natsv`` or ``sn-natsv``.
        config: Hyper-parameters, e.g. ``make_calibrator("flow", levels=2, depth=3)``,
            ``make_calibrator("whitening", k=256)``, ``make_calibrator("natsv", k=6)``.

    Example:
        >>> cal = make_calibrator("sn")
        >>> cal.fit(np.random.default_rng(0).normal(size=(50, 4))).transform(np.ones((1, 4))).shape
        (1, 4)
    """
    if name not in CALIBRATORS and isinstance(name, str) and name in LAZY:
        importlib.import_module(LAZY[name])
    cls = CALIBRATORS.get(name)
    if cls is None:
        raise FlowsearchError(f"unknown calibration {name!r}; choose one of {', '.join(names())}")
    try:
        return cls(**config)
    except TypeError as exc:
        raise FlowsearchError(f"bad option for the {name!r} calibrator: {exc}") from exc


def _refuse_strangers(path: Path) -> None:
    """A calibrator directory holds config.json and weights.safetensors only: anything else (a
    pickle, a torch.save file) is refused rather than ignored, so that no one is led to think
    it was used (and none of it is ever unpickled)."""
    for item in sorted(path.iterdir()):
        if item.name in (CONFIG_FILE, WEIGHTS_FILE) or item.name.startswith("."):
            continue  # .NAME.tmp-*: an interrupted atomic save
        raise FlowsearchError(
            f"unexpected file {item.name!r} in the calibrator directory {path}; a calibrator is "
            f"{CONFIG_FILE} + {WEIGHTS_FILE} only (never pickle): remove it or save the "
            "calibrator again"
        )


def load_calibrator(directory: str | os.PathLike[str]) -> Calibrator:
    """Loads a calibrator written by :meth:`Calibrator.save`."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(directory)
    cfg_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    for required in (cfg_path, weights_path):
        if not required.is_file():
            raise FlowsearchError(
                f"no saved calibrator at {path} ({required.name} missing); "
                "pass a directory written by Calibrator.save or an index's calibrator/ folder"
            )
    _refuse_strangers(path)
    try:
        meta = json.loads(cfg_path.read_text())
        tensors = load_file(str(weights_path))
    except (ValueError, OSError, SafetensorError) as exc:
        raise FlowsearchError(f"the calibrator at {path} is unreadable ({exc}); refit it") from exc
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise FlowsearchError(
            f"the calibrator at {path} was written by a newer flowsearch; upgrade flowsearch"
        )
    cal = make_calibrator(meta["name"], **meta.get("config", {}))
    cal.dim_in = int(meta["dim_in"])
    cal.fit_stats = dict(meta.get("fit_stats", {}))
    cal._load_state(tensors)
    return cal
