"""Loading a saved calibrator: its files read and checked (:mod:`~flowsearch.calibration.files`),
then the calibrator the config names made from the registry and given its arrays.

Example:
    >>> import tempfile
    >>> import numpy as np
    >>> from flowsearch.calibration import make_calibrator
    >>> cal = make_calibrator("sn").fit(np.random.default_rng(0).normal(size=(20, 3)))
    >>> folder = tempfile.mkdtemp()
    >>> cal.save(folder)
    >>> load(folder).transform(np.zeros((1, 3))).shape
    (1, 3)
"""

from __future__ import annotations

import os
from pathlib import Path

from flowsearch.calibration.base import Calibrator, as_config, make_calibrator, names
from flowsearch.calibration.files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    SavedConfig,
    malformed,
    read_config,
    read_weights,
    require_files,
)
from flowsearch.calibration.state import BadState
from flowsearch.errors import FlowsearchError, check_path

__all__ = ["load", "load_stored"]


def load_stored(directory: str | os.PathLike[str]) -> Calibrator:
    """:func:`load` for the calibrator an index holds: a file beside its two is a stray of the
    index (reported by ``info --verify``, removed by the next write), not read and not refused."""
    return load(directory, stored=True)


def load(directory: str | os.PathLike[str], *, stored: bool = False) -> Calibrator:
    """Loads a calibrator written by ``Calibrator.save`` (:mod:`~flowsearch.calibration.files`).

    Raises:
        NotFound: no such directory, or ``config.json`` / ``weights.safetensors`` missing.
        BadInput: anything else wrong (``param="calibrator"``): a file beside the two, invalid
            JSON, a missing or ill-typed key, an unknown calibrator, a newer format, an
            unreadable weights file, a missing, extra, ill-shaped, wrong-dtype or non-finite
            array, arrays that disagree with the config.
    """
    path = check_path(directory, "directory", "a calibrator directory")
    cfg_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    require_files(path, cfg_path, weights_path, stored=stored)
    meta = read_config(cfg_path)
    cal = _make(cfg_path, meta)
    tensors = read_weights(weights_path)
    try:
        cal.restore(tensors, meta["dim_in"])
    except BadState as exc:
        raise malformed(weights_path, f"{exc} for the {cal.name} calibrator") from None
    cal.fit_stats = dict(meta.get("fit_stats", {}))
    return cal


def _make(cfg_path: Path, meta: SavedConfig) -> Calibrator:
    """The unfitted calibrator the config names, with its options."""
    if meta["name"] not in names():
        raise malformed(
            cfg_path,
            f"unknown calibrator {meta['name']!r} (this flowsearch knows {', '.join(names())})",
        )
    try:
        return make_calibrator(meta["name"], **as_config(meta["config"]))
    except FlowsearchError as exc:
        raise malformed(cfg_path, f"bad 'config': {exc.problem}") from None
