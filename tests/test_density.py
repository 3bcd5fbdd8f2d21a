"""Density statistics, drift reports and query reports: finite, meaningful, or not shown."""

from __future__ import annotations

import numpy as np
import pytest

from flowsearch.space.reference import (
    DRIFT_WARN_STD,
    MAX_HELD_OUT,
    MIN_HELD_OUT,
    MIN_ROWS_PER_DIM,
    best_other_score,
    density_stats,
    drift_report,
    held_out_stats,
    query_report,
    reliable,
    split_fit_rows,
)
from flowsearch.storage.manifest import DensityStats, HeldOut, from_dict, to_dict

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


def _held(n: int = 1000) -> HeldOut:
    # held-out rows' best scores spread evenly over [0.4, 0.8]: p05 = 0.42, median 0.6
    top = np.linspace(0.4, 0.8, n)
    return held_out_stats(np.random.default_rng(0).normal(100, 10, n), top, n)


def test_split_holds_out_a_tenth_never_fitted():
    fit, held = split_fit_rows(5000, fit_sample=200_000)
    assert len(held) == 500 and len(fit) == 4500
    assert not np.intersect1d(fit, held).size and np.union1d(fit, held).size == 5000
    assert np.all(np.diff(fit) > 0) and np.all(np.diff(held) > 0)
    fit2, held2 = split_fit_rows(5000, fit_sample=200_000)
    assert np.array_equal(held, held2)  # seeded


def test_split_large_corpus_caps_held_out_and_keeps_the_fit_sample():
    fit, held = split_fit_rows(100_000, fit_sample=10_000)
    assert len(held) == MAX_HELD_OUT and len(fit) == 10_000
    assert not np.intersect1d(fit, held).size


def test_split_small_corpus_holds_none_out():
    fit, held = split_fit_rows(MIN_HELD_OUT * 10 - 20, fit_sample=200_000)
    assert len(held) == 0 and len(fit) == MIN_HELD_OUT * 10 - 20


def test_best_other_score_skips_the_row_itself():
    scores = np.array([[1.0, 0.7], [0.9, 0.8], [1.0, -np.inf]])
    rows = np.array([[5, 2], [3, 9], [7, -1]])
    got = best_other_score(scores, rows, np.array([5, 9, 7]))
    assert got[0] == pytest.approx(0.7) and got[1] == pytest.approx(0.9) and np.isnan(got[2])


def test_held_out_stats_are_from_the_held_out_rows_only():
    lp = np.r_[np.full(50, 10.0), np.full(50, 20.0)]
    held = held_out_stats(lp[50:], np.linspace(0, 1, 50), 50)
    assert held.density is not None and held.density.mean_log_prob == 20.0
    assert held.rows == 50 and held.top_score[held.percents.index(50.0)] == pytest.approx(0.5)
    no_flow = held_out_stats(None, np.array([0.5, np.nan, 0.7]), 3)
    assert no_flow.density is None and len(no_flow.top_score) == len(no_flow.percents)


def test_verdicts_against_held_out_top_scores():
    held = _held()
    fine = query_report(95.0, CORPUS, 5000, 32, held_out=held, top_score=0.6)
    assert fine.verdict == "in-distribution" and fine.top_score_percentile == pytest.approx(50, 1)
    odd = query_report(95.0, CORPUS, 5000, 32, held_out=held, top_score=0.41)
    assert odd.verdict == "out-of-distribution" and odd.top_score_percentile < 5
    # the density figures are shown against the held-out rows, not the rows the flow saw
    assert fine.corpus_mean == pytest.approx(held.density.mean_log_prob)
    # a short query's low log-density alone does not make it out of distribution
    short = query_report(-500.0, CORPUS, 5000, 32, held_out=held, top_score=0.7)
    assert short.verdict == "in-distribution" and short.gap_std > 50


def test_not_judged_without_a_comparable_top_score_or_enough_held_out_rows():
    lexical = query_report(95.0, CORPUS, 5000, 32, held_out=_held(), top_score=None)
    assert lexical.verdict == "not judged" and "lexical" in lexical.reason
    few = query_report(95.0, CORPUS, 5000, 32, held_out=_held(MIN_HELD_OUT - 1), top_score=0.6)
    assert few.verdict == "not judged" and "too few rows held out" in few.reason
    nan = query_report(95.0, CORPUS, 5000, 32, held_out=_held(), top_score=float("nan"))
    assert nan.verdict == "not judged" and nan.top_score is None


def test_old_index_without_held_out_statistics_is_not_judged():
    old = query_report(50.0, CORPUS, fit_rows=5000, dim=32)  # no held_out: built before them
    assert old.verdict == "not judged" and "held-out" in old.reason
    assert old.log_density == 50.0 and old.gap_std == pytest.approx(5.0)  # figures still shown


@pytest.mark.parametrize(
    ("lp", "corpus", "fit_rows"),
    [
        (-6.7e33, DensityStats(-6e26, 3.5e13, 0, 0, 0, 3), 3),  # a 3-row flow
        (float("-inf"), CORPUS, 5000),
        (50.0, DensityStats(float("nan"), 10.0, 0, 0, 0, 1000), 5000),
        (50.0, CORPUS, 10),  # too few rows per dimension
    ],
)
def test_nothing_non_finite_or_absurd_is_shown(lp, corpus, fit_rows):
    for held in (None, _held()):
        rep = query_report(lp, corpus, fit_rows, 32, held_out=held, top_score=0.6)
        shown = [v for v in rep.to_dict().values() if isinstance(v, float)]
        assert all(np.isfinite(shown))
        if held is None or fit_rows < 1000 or not np.isfinite(lp):  # else: the held-out figures
            assert rep.log_density is None and rep.gap_std is None and rep.corpus_mean is None


def test_caption_shows_only_finite_figures():
    from flowsearch.cli.output import density_caption as _density_caption

    rep = query_report(-6.7e33, DensityStats(-6e26, 3.5e13, 0, 0, 0, 3), 3, 32, held_out=_held(),
                       top_score=0.41)  # fmt: skip
    caption = _density_caption(rep)
    assert caption.startswith("out-of-distribution") and "e+" not in caption
    assert "log-density" not in caption and "top score 0.410" in caption


def _manifest_dict() -> dict:
    return {
        "format": "flowsearch-index",
        "format_version": 2,
        "encoder": {"model": "m", "revision": "r", "pooling": "mean", "max_length": 8, "dim": 4},
        "dim": 4,
        "calibration": {"name": "auto", "calibrator": "whitening-flow", "space": "encoder"},
        "faiss": {"factory": "Flat"},
        "columns": {"text": "text", "id": "id"},
        "rows": 0,
        "density": {"mean_log_prob": 1.0, "std_log_prob": 2.0, "p01": 0.0, "p05": 0.0,
                    "median": 1.0, "rows": 10},
    }  # fmt: skip


def test_old_manifest_without_held_out_loads():
    m = from_dict(_manifest_dict())
    assert m.held_out is None and m.density is not None


def test_held_out_round_trips_through_the_manifest():
    import json
    from dataclasses import replace

    m = replace(from_dict(_manifest_dict()), held_out=_held(200))
    again = from_dict(json.loads(json.dumps(to_dict(m))))
    assert again.held_out == m.held_out


def test_build_holds_out_rows_the_flow_did_not_see(tmp_path, model_dir):
    """A 600-row index: 60 rows held out of the fit, their statistics in the manifest, and
    queries judged against them (a corpus text's best score is the top of the scale)."""
    import pyarrow.parquet as pq
    from corpus_helpers import write_corpus

    from flowsearch import Searcher, build_index
    from flowsearch.calibration import load_calibrator

    corpus = write_corpus(tmp_path / "c.parquet", n=600, seed=5)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), calibration="flow")
    s = Searcher.open(tmp_path / "idx")
    m = s.manifest
    _, held = split_fit_rows(600, 200_000)
    assert m.held_out is not None and m.held_out.rows == len(held) == 60
    assert m.calibration.fit_rows == 540
    raw = np.asarray(pq.read_table(corpus).column("text").to_pylist())
    cal = load_calibrator(m.path(tmp_path / "idx", "calibrator"))
    U = s.encoder.encode(list(raw[held]))
    expect = density_stats(cal.log_prob(U))
    assert m.held_out.density.mean_log_prob == pytest.approx(expect.mean_log_prob, rel=1e-4)
    assert len(m.held_out.top_score) == len(m.held_out.percents) > 0
    result = s.query(str(raw[held[0]]), k=3, mode="dense")
    assert result.density.verdict == "in-distribution"
    assert result.density.top_score == pytest.approx(1.0, abs=1e-4)
    filtered = s.query(str(raw[0]), k=3, where="year >= 2000", mode="dense")
    assert filtered.density.verdict == "not judged" and filtered.density.top_score is None
