r"""The BERT-flow calibrator: a Glow-style normalizing flow fitted by maximum likelihood.

The flow maps a raw sentence vector ``u`` to ``z`` with a standard-normal prior; cosine
similarity is then taken between ``z``'s. The whole map is one composed step
(:mod:`~flowsearch.calibration.steps`)::

    SetAside(active dims -> [Whiten ->] GlowFlow; constant dims -> (u - mu) / typical_std)

- :class:`~flowsearch.calibration.glow.GlowFlow` follows the paper's reference code on vectors
  (levels of actnorm -> reverse permutation -> additive coupling, half the channels factored
  out between levels), fitted by :func:`~flowsearch.calibration.training.maximise_likelihood`;
- input dimensions that are constant (spread below 1e-3 of the typical one; all-MiniLM-L6-v2's
  mean vectors have three at about 1e-32) are set aside with a fixed standardisation under the
  same prior, since a flow cannot model a direction without spread;
- ``whitening-flow`` puts a fixed whitening map in front (``prewhiten=True``).

``log p(u) = log N(z; 0, I) + log|det dz/du|``, exactly. Fitting runs in torch (float32,
:mod:`~flowsearch.calibration.trainable`); transform, inverse and density run the same steps'
frozen float64 numpy form, in blocks of :data:`BLOCK_ROWS` rows (the flow
itself in smaller chunks, see :func:`~flowsearch.calibration.glowmath.chunked`). This module
imports no torch: a loaded calibrator restores its frozen form straight from the saved arrays
(:func:`~flowsearch.calibration.glowmath.frozen_flow`), and builds the torch modules only when
asked for them (:attr:`FlowCalibrator.module`, :meth:`FlowCalibrator.torch_forward`).

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
    Kingma and Dhariwal, "Glow: Generative Flow with Invertible 1x1 Convolutions", NeurIPS 2018.
    Dinh, Krueger and Bengio, "NICE: Non-linear Independent Components Estimation", ICLR 2015.
    Su et al., "Whitening Sentence Representations for Better Semantics and Faster
    Retrieval", arXiv:2103.15316, 2021.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Literal, cast

import numpy as np
import numpy.typing as npt
from typing_extensions import Unpack  # typing.Unpack is 3.11+

from flowsearch.calibration.base import Calibrator, FlowConfig, check_rows, register
from flowsearch.calibration.glowmath import frozen_flow, saved_spec
from flowsearch.calibration.linear import Whitening
from flowsearch.calibration.maps import LOG_2PI, log_normal
from flowsearch.calibration.state import BadState, Spec, require_permutation, require_positive
from flowsearch.calibration.stepmath import (
    Bijection,
    Frozen,
    SetAsideMath,
    WhitenMath,
    compose,
    constant_channels,
)
from flowsearch.errors import BadInput

if TYPE_CHECKING:  # torch only where the trainable form is asked for
    from torch import Tensor

    from flowsearch.calibration.glow import GlowFlow
    from flowsearch.calibration.steps import SetAside

__all__ = ["FlowCalibrator", "WhiteningFlowCalibrator"]

#: Rows the flow's inference map (float64 numpy) takes at a time: bounds each of its
#: temporaries to this many rows instead of allocating them afresh for the whole input; the
#: whitening front's one large product runs on a whole block.
BLOCK_ROWS = 4096

_INTEGERS = (("levels", 1), ("depth", 1), ("width", 1), ("batch_size", 1), ("init_rows", 2))


def _check_config(config: Mapping[str, object]) -> None:
    for key, minimum in _INTEGERS:
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise BadInput(f"flow: {key} must be an integer >= {minimum}, got {value!r}", param=key)
    for key in ("epochs", "lr"):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise BadInput(f"flow: {key} must be a positive number, got {value!r}", param=key)
    seed = config["seed"]
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise BadInput(f"flow: seed must be an integer, got {seed!r}", param="seed")
    if config["permutation"] not in ("reverse", "random"):
        raise BadInput("flow: permutation must be 'reverse' or 'random'", param="permutation")


@register("flow")
class FlowCalibrator(Calibrator):
    r"""BERT-flow: fits :class:`~flowsearch.calibration.glow.GlowFlow` to the corpus's vectors.

    Arguments:
        levels: Levels of the multi-scale flow (reference code 3; the paper's Table 7 says 2).
        depth: Steps per level (3).
        width: Coupling network width (32).
        epochs: Passes over the vectors (1 on the target set; fractions allowed).
        lr: Adam learning rate (1e-3).
        batch_size: Vectors per step (64: the reference's 32 sentence pairs).
        seed: Seeds initialisation, permutations and shuffling; a fit is deterministic.
        permutation: ``reverse`` (reference) or ``random``.
        init_rows: Rows of the actnorms' data-dependent initialisation (the reference uses one
            batch; 1024 rows make the initial statistics less noisy).
        prewhiten: Put a fixed whitening map (full rank) in front of the flow, so that the flow
            starts from decorrelated vectors. Not in the paper.

    Attributes:
        module: The trainable flow over the modelled dimensions (torch, float64), None unfitted;
            a loaded calibrator builds it on first access (see :attr:`module`).
        whitening: The whitening front layer (``prewhiten``), else None.
        active, constant: Indices of the modelled and the set-aside (constant) input dimensions.
        callback: Called as ``callback(step, total_steps, bits_per_dim)`` while fitting.

    Example:
        >>> U = np.random.default_rng(0).normal(size=(512, 8)) * [5, 3, 1, 1, .5, .2, .1, .1]
        >>> cal = FlowCalibrator(levels=2, depth=2, width=8).fit(U)
        >>> float(np.abs(cal.inverse(cal.transform(U)) - U).max()) < 1e-6
        True
    """

    _invertible = True

    def __init__(
        self,
        levels: int = 3,
        depth: int = 3,
        width: int = 32,
        epochs: float = 1.0,
        lr: float = 1e-3,
        batch_size: int = 64,
        seed: int = 0,
        permutation: Literal["reverse", "random"] = "reverse",
        init_rows: int = 1024,
        prewhiten: bool = False,
    ) -> None:
        given: dict[str, object] = dict(levels=levels, depth=depth, width=width, epochs=epochs,
                                        lr=lr, batch_size=batch_size, seed=seed,
                                        permutation=permutation, init_rows=init_rows)  # fmt: skip
        _check_config(given)  # the values as given (a caller's, a config.json's), then as kept:
        super().__init__(levels=levels, depth=depth, width=width, epochs=float(epochs),
                         lr=float(lr), batch_size=batch_size, seed=int(seed),
                         permutation=permutation, init_rows=init_rows,
                         prewhiten=bool(prewhiten))  # fmt: skip
        self.whitening: Whitening | None = None
        self.active = self.constant = np.empty(0, np.int64)
        self.constant_mu = self.constant_scale = np.empty(0)
        self.callback: Callable[[int, int, float], None] | None = None
        self._module: GlowFlow | None = None
        self._saved: dict[str, np.ndarray] | None = None  # the flow's arrays, as loaded
        self._bijection: SetAside | None = None
        self._frozen: Bijection[np.ndarray] | None = None

    # -- fitting ---------------------------------------------------------------------------

    def _fit(self, U: np.ndarray) -> None:
        from flowsearch.calibration import trainable  # torch: to fit, not to load or run

        with trainable.single_thread():
            started = time.perf_counter()
            fixed_map = constant_channels(U)
            self.active, self.constant, self.constant_mu, self.constant_scale = fixed_map
            if self.config["prewhiten"]:
                self.whitening = Whitening()
                self.whitening.fit(U if self.constant.size == 0 else U[:, self.active])
            data = trainable.training_rows(U, self.active, self.whitening)
            fixed, to_bits = self._fixed_log_prob(), 1.0 / (U.shape[1] * math.log(2))
            bits = lambda loss: (loss - fixed) * to_bits  # noqa: E731
            self._module, fit = trainable.fit(self.config, data, bits, self.callback)
        self._saved = None
        self._assemble()
        lp = self._log_prob(U)
        self.fit_stats = {
            "steps": fit.steps,
            "rows": len(U),
            "constant_dims": len(self.constant),
            "seconds": round(time.perf_counter() - started, 3),
            "bits_per_dim_first_batch": fit.first_bits,
            "bits_per_dim_last_batch": fit.last_bits,
            "bits_per_dim": float(-lp.mean() * to_bits),
            "mean_log_prob": float(lp.mean()),
            "std_log_prob": float(lp.std()),
        }

    def _fixed_log_prob(self) -> float:
        """What the fixed maps add to the flow's log-density: the constant dimensions at their
        mean, and the whitening's log-determinant."""
        fixed = -0.5 * len(self.constant) * LOG_2PI - np.log(self.constant_scale).sum()
        if self.whitening is not None:
            fixed -= np.log(self.whitening.scales).sum()
        return float(fixed)

    @property
    def module(self) -> GlowFlow | None:
        """The trainable flow (torch, float64) over the modelled dimensions; None unfitted. A
        loaded calibrator builds it from its arrays on first access, which imports torch;
        inference never needs it. After changing its parameters, call :meth:`_assemble`."""
        if self._module is None and self._saved is not None:
            from flowsearch.calibration.trainable import from_saved

            self._module = from_saved(self.config, len(self.active), self._saved)
        return self._module

    def _assemble(self) -> None:
        """Rebuilds the inference form from :attr:`module` (after fitting, or after a change
        of its parameters)."""
        from flowsearch.calibration.trainable import to_saved

        assert self.module is not None, "fit or load first"
        # Through the saved form's arrays, at float64: a fitted calibrator and the same one
        # saved and loaded compute their coefficients alike, to the last bit.
        self._frozen = self._whole(to_saved(self.module, np.float64))
        self._bijection = None  # torch_forward builds it again, on the module as it is

    def _whole(self, saved: Mapping[str, np.ndarray]) -> Frozen:
        """The whole frozen map ``u -> z`` from the flow's arrays (by their saved names):
        ``SetAside(active -> [Whiten ->] flow; constant -> (u - mu) / scale)``."""
        shape = (self.config["levels"], self.config["depth"], self.config["width"])
        inner: Bijection[np.ndarray] = frozen_flow(saved, len(self.active), *shape)
        if self.whitening is not None:
            w = self.whitening
            front = Frozen(WhitenMath, WhitenMath.coefs(w.mu, w.rotation, w.scales))
            inner = compose([front, inner])
        fixed = (self.active, self.constant, self.constant_mu, self.constant_scale)
        return Frozen(SetAsideMath, SetAsideMath.coefs(inner, *fixed))

    # -- inference -------------------------------------------------------------------------

    def _blocks(self, X: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, float64 rows)`` of ``X``, block by block (:data:`BLOCK_ROWS`): the
        map's temporaries stay bounded, and no float64 copy of ``X`` is made."""
        size = BLOCK_ROWS
        for start in range(0, len(X), size):
            yield start, X[start : start + size].astype(np.float64, copy=False)

    def _forward(self, X: np.ndarray, z_out: np.ndarray | None, lp_out: np.ndarray | None) -> None:
        """Runs the map over rows ``X`` into ``z_out`` ``(n, d)`` and/or ``lp_out`` ``(n,)``."""
        assert self._frozen is not None
        for start, x in self._blocks(X):
            z, ladj = self._frozen(x)
            if z_out is not None:
                z_out[start : start + len(x)] = z
            if lp_out is not None:
                lp_out[start : start + len(x)] = log_normal(z) + ladj

    def transform(self, U: npt.ArrayLike) -> np.ndarray:
        """Maps raw vectors ``(n, dim_in)`` to ``z``: float32 ``(n, dim_in)``.

        Raises:
            BadInput: unfitted, or ``U`` not a finite matrix of ``dim_in`` columns.
        """
        X = check_rows(U, self._need_fitted())
        Z = np.empty(X.shape, np.float32)
        self._forward(X, Z, None)
        return Z

    def _transform(self, U: np.ndarray) -> np.ndarray:
        Z = np.empty(U.shape)
        self._forward(U, Z, None)
        return Z

    def _inverse(self, Z: np.ndarray) -> np.ndarray:
        assert self._frozen is not None
        U = np.empty(Z.shape)
        for start, z in self._blocks(Z):
            U[start : start + len(z)] = self._frozen.inverse(z)
        return U

    def _log_prob(self, U: np.ndarray) -> np.ndarray:
        lp = np.empty(len(U))
        self._forward(U, None, lp)
        return lp

    def log_prob(self, U: npt.ArrayLike) -> np.ndarray:
        r"""Log-density of each row of ``U`` ``(n, dim_in)`` under the flow (nats): float64
        ``(n,)``.

        Raises:
            BadInput: unfitted, or ``U`` not a finite matrix of ``dim_in`` columns.
        """
        return self._log_prob(check_rows(U, self._need_fitted()))

    def transform_and_log_prob(self, U: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        r"""``(transform(U), log_prob(U))`` in one pass: float32 ``(n, d)``, float64 ``(n,)``.

        The searcher needs both for every query (the vector to search with, the density to flag
        out-of-distribution queries), and ingest for every row.
        """
        X = check_rows(U, self._need_fitted())
        Z, lp = np.empty(X.shape, np.float32), np.empty(len(X))
        self._forward(X, Z, lp)
        return Z, lp

    def torch_forward(self, u: Tensor) -> tuple[Tensor, Tensor]:
        r"""The differentiable map ``u -> (z, log|det dz/du|)`` (float64 ``(n, d)``, ``()``),
        for checks and research: ``z`` is the flow's output followed by the constant dims'.
        Imports torch (the inference methods do not)."""
        assert self.module is not None, "fit or load first"
        if self._bijection is None:
            from flowsearch.calibration.trainable import whole_map

            fixed = (self.active, self.constant, self.constant_mu, self.constant_scale)
            self._bijection = whole_map(self.module, self.whitening, fixed)
        return cast("tuple[Tensor, Tensor]", self._bijection(u))

    # -- saved form (format 1) -------------------------------------------------------------

    def state(self) -> dict[str, np.ndarray]:
        if self._module is not None:  # fitted, or built from the saved arrays and maybe changed
            from flowsearch.calibration.trainable import to_saved

            flow = to_saved(self._module)
        else:
            assert self._saved is not None, "fit or load first"
            flow = self._saved
        tensors = {f"flow.{k}": v for k, v in flow.items()}
        tensors.update(
            active=self.active.astype(np.int64),
            constant=self.constant.astype(np.int64),
            constant_mu=self.constant_mu,
            constant_scale=self.constant_scale,
        )
        if self.whitening is not None:
            tensors.update({f"whiten.{k}": v for k, v in self.whitening.state().items()})
        return tensors

    def _state_spec(self, tensors: Mapping[str, np.ndarray]) -> dict[str, Spec]:
        d = self._need_fitted()
        dims = {}
        for key in ("active", "constant"):
            arr = tensors.get(key)
            if arr is None or arr.ndim != 1 or arr.dtype != np.int64:
                raise BadState(f"tensor {key!r} is missing or not a 1-d int64 array")
            dims[key] = len(arr)
        both = np.concatenate([tensors["active"], tensors["constant"]])
        if not np.array_equal(np.sort(both), np.arange(d)):
            raise BadState(f"tensors 'active' and 'constant' do not split 0..{d - 1} between them")
        k, c = dims["active"], dims["constant"]
        if k == 0:
            raise BadState("tensor 'active' is empty: no dimension is modelled")
        specs = {
            "active": Spec((k,), "int64"),
            "constant": Spec((c,), "int64"),
            "constant_mu": Spec((c,), "float64"),
            "constant_scale": Spec((c,), "float64"),
        }
        if self.config["prewhiten"]:
            specs["whiten.mu"] = specs["whiten.scales"] = Spec((k,), "float64")
            specs["whiten.rotation"] = Spec((k, k), "float64")
        cfg = self.config
        flow = saved_spec(k, cfg["levels"], cfg["depth"], cfg["width"])
        specs.update({f"flow.{name}": spec for name, spec in flow.items()})
        return specs

    def _check_values(self, tensors: Mapping[str, np.ndarray]) -> None:
        require_positive(tensors, ["constant_scale"])
        if self.config["prewhiten"]:
            require_positive(tensors, ["whiten.scales"])
        for name in tensors:
            if name.startswith("flow.") and name.endswith(".perm"):
                require_permutation(tensors, name, name[: -len("perm")] + "inv_perm")

    def _load_state(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.active, self.constant = tensors["active"], tensors["constant"]
        self.constant_mu, self.constant_scale = tensors["constant_mu"], tensors["constant_scale"]
        if self.config["prewhiten"]:
            whiten = {k[7:]: v for k, v in tensors.items() if k.startswith("whiten.")}
            self.whitening = Whitening()
            self.whitening.restore(whiten, len(self.active))
        self._saved = {k[5:]: v for k, v in tensors.items() if k.startswith("flow.")}
        self._module = self._bijection = None
        self._frozen = self._whole(self._saved)


@register("whitening-flow")
class WhiteningFlowCalibrator(FlowCalibrator):
    r"""The flow with a whitening front layer (``prewhiten=True``): not in the paper.

    On strongly anisotropic vectors fitted on few rows, the reference flow's additive couplings
    and fixed permutations decorrelate slowly; whitening first, the flow then models what
    whitening cannot and keeps the exact density (``docs/CALIBRATION.md``).

    Arguments:
        config: As :class:`FlowCalibrator`'s (``prewhiten`` defaults to True).
    """

    def __init__(self, **config: Unpack[FlowConfig]) -> None:
        config.setdefault("prewhiten", True)
        super().__init__(**config)
