"""Choosing and fitting an index's calibrator: auto's decision and its reasons."""

from __future__ import annotations

import numpy as np
import pytest

from flowsearch.calibration import make_calibrator
from flowsearch.calibration.fitting import AUTO_FITS, fit_for_index, load_fitted
from flowsearch.density import MIN_ROWS_PER_DIM
from flowsearch.errors import FlowsearchError
from flowsearch.manifest import AutoDecision


def _cone(n, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, d)) * 0.2 + 5.0).astype(np.float32)  # mean cosine near 1


def _isotropic(n, d=8, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def test_auto_calibrates_an_anisotropic_corpus_with_enough_rows():
    cal, spec = fit_for_index(_cone(40 * MIN_ROWS_PER_DIM), "auto")
    assert spec.calibrated and cal.name == AUTO_FITS == spec.calibrator
    assert spec.auto == AutoDecision("mean_cosine", 0.33, True)
    assert spec.anisotropy["mean_cosine"] > 0.9 and "search in the flow space" in spec.decision


def test_auto_keeps_the_encoder_space_when_isotropic_or_too_small():
    _, iso = fit_for_index(_isotropic(200), "auto")
    assert iso.space == "encoder" and iso.auto.calibrated is False
    _, small = fit_for_index(_cone(MIN_ROWS_PER_DIM * 8 - 1), "auto")
    assert small.space == "encoder" and f"< {MIN_ROWS_PER_DIM} x dim 8" in small.decision


def test_a_named_calibration_is_always_searched():
    _, spec = fit_for_index(_isotropic(100), "whitening")
    assert spec.calibrated and spec.auto is None and spec.fit_rows == 100 and spec.dim_out == 8


def test_a_calibrator_fitted_elsewhere(tmp_path):
    make_calibrator("whitening").fit(_isotropic(100)).save(tmp_path / "cal")
    loaded = load_fitted(tmp_path / "cal", "auto", 8)
    cal, spec = fit_for_index(_isotropic(50), "auto", loaded=loaded, loaded_from=tmp_path / "cal")
    assert cal is loaded and spec.fitted_on == str((tmp_path / "cal").resolve())
    with pytest.raises(FlowsearchError, match="contradicts"):
        load_fitted(tmp_path / "cal", "flow", 8)
    with pytest.raises(FlowsearchError, match="fitted on 8-d"):
        load_fitted(tmp_path / "cal", "auto", 16)
