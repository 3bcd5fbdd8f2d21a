"""Anisotropy statistics: isotropic data reads low, a narrow cone reads high and gets calibrated."""

from __future__ import annotations

import numpy as np
import pytest

from flowsearch.calibration.anisotropy import STATISTICS, anisotropy_stats
from flowsearch.space.fitting import AUTO_STATISTIC, AUTO_THRESHOLD, should_calibrate


def _isotropic(n: int = 3000, d: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d))


def _narrow_cone(n: int = 3000, d: int = 64, seed: int = 0) -> np.ndarray:
    """A common offset direction plus a steeply decaying spectrum: BERT-like anisotropy."""
    rng = np.random.default_rng(seed)
    scales = 0.7 ** np.arange(d)
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    offset = rng.standard_normal(d)
    offset *= 4.0 / np.linalg.norm(offset)
    return offset + (rng.standard_normal((n, d)) * scales) @ basis.T


def test_isotropic_gaussian_reads_low() -> None:
    stats = anisotropy_stats(_isotropic())
    assert set(stats) == set(STATISTICS)
    assert all(isinstance(v, float) for v in stats.values())
    assert abs(stats["mean_cosine"]) < 0.02
    assert stats["top1_var"] < 0.05  # about 1/64 plus sampling noise
    assert stats["top10_var"] < 0.25
    assert stats["rank_deficit"] < 0.1
    assert stats["gauss_gain"] < 0.05
    assert not should_calibrate(stats)


def test_narrow_cone_reads_high_and_is_calibrated() -> None:
    stats = anisotropy_stats(_narrow_cone())
    assert stats["mean_cosine"] > 0.5
    assert stats["top1_var"] > 0.4
    assert stats["top10_var"] > 0.9
    assert stats["rank_deficit"] > 0.8
    assert should_calibrate(stats)


def test_mean_cosine_is_the_mean_over_distinct_pairs() -> None:
    X = np.random.default_rng(1).standard_normal((40, 5)) + 0.5
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    cos = unit @ unit.T
    expected = (cos.sum() - np.trace(cos)) / (40 * 39)
    assert anisotropy_stats(X)["mean_cosine"] == pytest.approx(expected, abs=1e-12)


def test_degenerate_input_stays_finite() -> None:
    X = _narrow_cone(n=50, d=128)  # fewer rows than dimensions
    X[:, [3, 7]] = 1e-32  # constant dimensions, as in MiniLM's mean vectors
    X[10:20] = X[0]  # duplicated rows
    stats = anisotropy_stats(X)
    assert all(np.isfinite(v) for v in stats.values())


def test_subsampling_is_deterministic_and_close() -> None:
    X = _narrow_cone(n=5000)
    a = anisotropy_stats(X, seed=3, max_rows=2000)
    b = anisotropy_stats(X, seed=3, max_rows=2000)
    full = anisotropy_stats(X)
    assert a == b
    assert a["mean_cosine"] == pytest.approx(full["mean_cosine"], abs=0.02)


def test_rule_uses_declared_statistic() -> None:
    assert AUTO_STATISTIC in STATISTICS
    assert should_calibrate({AUTO_STATISTIC: AUTO_THRESHOLD + 1e-6})
    assert not should_calibrate({AUTO_STATISTIC: AUTO_THRESHOLD - 1e-6})
    with pytest.raises(KeyError):
        should_calibrate({})


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError):
        anisotropy_stats(np.zeros((1, 4)))
    with pytest.raises(ValueError):
        anisotropy_stats(np.full((3, 4), np.nan))
