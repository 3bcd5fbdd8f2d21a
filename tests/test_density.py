"""Density statistics, drift reports and query reports: finite, meaningful, or not shown."""

from __future__ import annotations

import numpy as np
import pytest

from flowsearch.density import (
    DRIFT_WARN_STD,
    MIN_ROWS_PER_DIM,
    density_stats,
    drift_report,
    query_report,
    reliable,
)
from flowsearch.manifest import DensityStats

CORPUS = DensityStats(100.0, 10.0, 75.0, 80.0, 100.0, 1000)


def test_density_stats():
    lp = np.arange(101, dtype=float)
    stats = density_stats(lp)
    assert stats.mean_log_prob == 50 and stats.median == 50 and stats.rows == 101
    assert stats.p01 == pytest.approx(1.0) and stats.p05 == pytest.approx(5.0)


def test_drift_warns_at_the_threshold_only():
    near = drift_report(np.array([95.0, 99.0, 104.0]), CORPUS)
    assert not near["warn"] and near["gap_std"] == pytest.approx(0.0667, abs=1e-3)
    at = drift_report(np.array([100.0 - 10.0 * DRIFT_WARN_STD]), CORPUS)
    assert at["warn"] and at["gap_std"] == pytest.approx(DRIFT_WARN_STD)
    below = drift_report(np.array([100.0 - 9.9 * DRIFT_WARN_STD]), CORPUS)
    assert not below["warn"]
    far = drift_report(np.array([70.0, 80.0, 88.0]), CORPUS)
    assert far["warn"] and far["share_below_p01"] == pytest.approx(1 / 3)


def test_drift_is_not_judged_on_an_unreliable_flow_or_non_finite_figures():
    far = np.array([0.0, 1.0])
    assert drift_report(far, CORPUS, is_reliable=False)["warn"] is False
    bad = drift_report(np.array([-np.inf]), CORPUS)
    assert bad["warn"] is False and bad["reliable"] is False and bad["gap_std"] is None


def test_reliable_needs_rows_per_dimension():
    assert reliable(MIN_ROWS_PER_DIM * 384, 384) and not reliable(300, 384)


def test_query_report_verdicts():
    fine = query_report(95.0, CORPUS, fit_rows=5000, dim=32)
    assert fine.verdict == "in-distribution" and fine.gap_std == pytest.approx(0.5)
    odd = query_report(50.0, CORPUS, fit_rows=5000, dim=32)
    assert odd.verdict == "out-of-distribution" and odd.gap_std == pytest.approx(5.0)
    small = query_report(50.0, CORPUS, fit_rows=10, dim=32)
    assert small.verdict == "not judged" and "too few rows" in small.reason
    assert small.gap_std is None and small.log_density == 50.0
    none = query_report(None, CORPUS, fit_rows=5000, dim=32)
    assert none.verdict == "not judged" and none.log_density is None
    huge = query_report(-6.7e33, DensityStats(-6e26, 3.5e13, 0, 0, 0, 3), 3, 32)
    assert huge.gap_std is None  # a 3-row flow's figures are never judged
    inf = query_report(float("-inf"), CORPUS, fit_rows=5000, dim=32)
    assert inf.verdict == "not judged" and inf.log_density is None
