r"""The searched space: encoder -> calibrator -> L2-normalise, one object for writes and reads.

:class:`SearchSpace` is what both ingest (projecting the corpus's raw vectors) and the
:class:`~flowsearch.search.searcher.Searcher` (embedding queries) use, so a row and a query always
reach the searched space by the same steps: the raw encoder vector ``u``, the calibrator's ``z``
(only when the manifest's space is ``calibrated``; otherwise ``u`` itself), normalised to unit
length. The calibrator's log-density of ``u`` rides along when it has one (the flow).

Example:
    >>> from flowsearch.calibration import make_calibrator
    >>> from flowsearch.storage.manifest import CalibrationSpec
    >>> U = np.random.default_rng(0).normal(size=(40, 4))
    >>> spec = CalibrationSpec(name="sn", calibrator="sn", space="calibrated")
    >>> space = SearchSpace(make_calibrator("sn").fit(U), spec)
    >>> Z, lp = space.project(U[:3])
    >>> Z.shape, lp is None
    ((3, 4), True)
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flowsearch.encode.protocol import TextEncoder
from flowsearch.errors import BadInput, FlowsearchError, IndexDamaged, NotFound
from flowsearch.storage.manifest import CalibrationSpec, Manifest

if TYPE_CHECKING:
    from flowsearch.calibration.base import Calibrator

__all__ = ["SearchSpace", "normalise"]


def normalise(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, as float32 (a new array)."""
    x = np.array(x, dtype=np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return x


class SearchSpace:
    """Maps raw encoder vectors (and, with an encoder, texts) into an index's searched space.

    Args:
        calibrator: the fitted calibrator.
        spec: the manifest's calibration record (its ``space`` decides whether the calibrator's
            output or the raw vectors are searched).
        encoder: the encoder the vectors come from (needed by :meth:`embed` only).
    """

    def __init__(
        self, calibrator: Calibrator, spec: CalibrationSpec, encoder: TextEncoder | None = None
    ) -> None:
        self.calibrator = calibrator
        self.spec = spec
        self.encoder = encoder
        self.has_density = _has_density(calibrator)
        self._encode_lock = threading.Lock()  # torch modules and fast tokenizers

    @classmethod
    def open(
        cls,
        index_dir: Path,
        manifest: Manifest,
        encoder: TextEncoder | None = None,
        *,
        model: str | os.PathLike[str] | None = None,
        with_encoder: bool = True,
    ) -> SearchSpace:
        """The space of an index version: its calibrator, checked against the manifest, and its
        encoder (``encoder`` reused if given; ``model`` points at a moved model directory).

        Raises:
            IndexDamaged: the calibrator is missing, malformed or not the one the manifest names.
            FlowsearchError: the encoder differs from the index's.
        """
        from flowsearch.encode.encoder import open_encoder

        folder = Path(index_dir) / manifest.calibration.path
        calibrator = load_index_calibrator(folder)
        spec = manifest.calibration
        if calibrator.name != spec.calibrator or calibrator.config != dict(spec.config):
            raise IndexDamaged(
                f"the calibrator in {folder} ({calibrator.name}) is not the one the manifest "
                f"names ({spec.calibrator}); the index is damaged, rebuild it"
            )
        if not with_encoder:
            return cls(calibrator, spec)
        recorded = manifest.encoder
        encoder = open_encoder(recorded.identity(), recorded.source, encoder=encoder, model=model)
        return cls(calibrator, spec, encoder)

    @property
    def dim(self) -> int:
        """Dimension of the searched vectors."""
        dim_in = self.calibrator.dim_in
        assert dim_in is not None, "a search space's calibrator is fitted"
        if self.spec.calibrated:
            return int(self.calibrator.dim_out or dim_in)
        return int(dim_in)

    def project(
        self, raw: np.ndarray, want_density: bool = True
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Raw encoder vectors -> (float32 (n, d) unit rows in the searched space, float64 (n,)
        log-density or None without a density model or when not wanted).

        In the calibrated space a calibrator that gives both in one pass (the flow) is asked once.
        """
        want = want_density and self.has_density
        both = getattr(self.calibrator, "transform_and_log_prob", None)
        if self.spec.calibrated and want and both is not None:
            Z, lp = both(raw)
            return normalise(Z), np.asarray(lp, dtype=np.float64)
        Z = self.calibrator.transform(raw) if self.spec.calibrated else raw
        lp = np.asarray(self.calibrator.log_prob(raw), dtype=np.float64) if want else None
        return normalise(Z), lp

    def require_encoder(self) -> TextEncoder:
        """The encoder, for a caller that needs one.

        Raises:
            FlowsearchError: the space was opened without one.
        """
        if self.encoder is None:
            raise FlowsearchError("this search space has no encoder; open it with one")
        return self.encoder

    def embed(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """Texts -> (float32 (n, d) in the searched space, float64 (n,) log-density or None)."""
        encoder = self.require_encoder()
        with self._encode_lock:
            raw = encoder.encode(texts, progress=False)
        return self.project(raw)


def _has_density(calibrator: object) -> bool:
    """True when the calibrator has a log-density (the flow) — asked of its class, not by a
    trial call."""
    from flowsearch.calibration.base import Calibrator

    method = getattr(type(calibrator), "log_prob", None)
    return method is not None and method is not Calibrator.log_prob


def load_index_calibrator(folder: str | Path) -> Calibrator:
    """The calibrator an index stores in ``folder``. A malformed one is damage to the index
    (:class:`~flowsearch.errors.IndexDamaged`), not the user's input to fix; a missing one raises
    FileNotFoundError, which :func:`~flowsearch.search.version.open_current` retries with the
    current version before calling it damage."""
    from flowsearch.calibration.loader import load_stored

    try:
        return load_stored(folder)
    except NotFound as exc:  # removed by a cleanup meanwhile: open_current reads again
        raise FileNotFoundError(exc.problem) from exc
    except BadInput as exc:
        raise IndexDamaged(
            f"the index's calibrator is unusable: {exc.problem}",
            fix="the index is damaged: rebuild it, or restore its calibrator folder",
        ) from exc
