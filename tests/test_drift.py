"""Drift of new rows: judged by their median percentile with the uncertainty a handful allows."""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy.stats import binom

from flowsearch.space import drift
from flowsearch.space.drift import DriftReport, drift_report, median_interval
from flowsearch.space.reference import Reference

SCORES = np.random.default_rng(0).normal(0.55, 0.08, 2000)  # the corpus's own best scores


def _ref(**kw) -> Reference:
    return Reference.from_scores(SCORES, method="held-out", n_corpus=20_000, **kw)


@pytest.mark.parametrize("n", [6, 20, 100, 501])
def test_median_interval_has_the_stated_coverage(n):
    low, high, coverage = median_interval(np.arange(float(n)), 0.95)
    j = int(low) + 1  # x(j) = j - 1 for these values
    assert high == n - j  # symmetric order statistics
    assert coverage == pytest.approx(1 - 2 * binom.cdf(j - 1, n, 0.5))
    assert coverage >= 0.95 and 1 - 2 * binom.cdf(j, n, 0.5) < 0.95  # the narrowest such


def test_median_interval_of_a_handful_is_its_range_and_says_so():
    assert median_interval(np.array([30.0, 10.0, 20.0, 40.0, 50.0]), 0.95) == (
        10.0, 50.0, pytest.approx(1 - 2 * 0.5**5))  # fmt: skip
    assert median_interval(np.array([42.0]), 0.95) == (42.0, 42.0, 0.0)


def test_rows_like_the_corpus_rarely_alarm_and_far_rows_are_caught():
    """Batches drawn from the corpus's own distribution alarm at most 1% of the time, whatever
    their size. Rows 1.875 standard deviations lower fall below the corpus's 25th percentile
    with probability 0.885: a batch of 5 is caught when all five do (0.885^5 = 0.54), of 20 when
    15 do (0.98), of 100 when 61 do (1.0)."""
    ref = _ref()
    rng = np.random.default_rng(1)
    for n in (5, 20, 100):
        same = [drift_report(rng.normal(0.55, 0.08, n), ref) for _ in range(400)]
        assert np.mean([r.warn for r in same]) <= 0.01
        far = [drift_report(rng.normal(0.40, 0.08, n), ref) for _ in range(200)]
        caught = np.mean([r.warn for r in far])
        assert caught >= {5: 0.4, 20: 0.93, 100: 1.0}[n], (n, caught)
    big = [drift_report(rng.normal(0.55, 0.08, 100), ref) for _ in range(200)]
    assert np.mean([r.verdict == "like the corpus" for r in big]) >= 0.9


def test_each_verdict_and_its_words():
    ref = _ref(space="encoder")
    at = lambda q, n: np.full(n, np.percentile(SCORES, q))  # noqa: E731
    apart = drift_report(at(2, 20), ref)
    assert apart.verdict == "apart from the corpus" and apart.warn
    assert apart.median_percentile == pytest.approx(2, abs=0.5) and apart.share_flagged == 1.0
    words = apart.to_words()
    assert words.startswith("the 20 new rows sit apart from the corpus: median percentile 2")
    assert "100% of them are less like it than 95% of its own passages" in words
    assert "nothing needs doing" in words and "delete them" in words
    assert "recalibrate" in drift_report(at(2, 20), _ref(space="calibrated")).to_words()

    lower = drift_report(np.r_[at(20, 10), at(40, 10)], ref)
    assert lower.verdict == "a little apart" and not lower.warn
    assert "nothing to do" in lower.to_words()
    close = drift_report(np.full(30, 1.0), ref)  # repeats of rows the index holds
    assert close.verdict == "closer than its own passages" and not close.warn
    assert "may repeat passages the index already holds" in close.to_words()
    like = drift_report(np.percentile(SCORES, np.linspace(10, 90, 50)), ref)
    assert like.verdict == "like the corpus" and like.median_percentile == pytest.approx(50, 1)
    assert like.to_words().startswith("the 50 new rows sit like the corpus: median percentile")
    assert re.search(r"\(9[5-9]% interval \d+-\d+\)$", like.to_words())
    wide = drift_report(np.percentile(SCORES, [2, 5, 60, 80, 95]), ref)
    assert wide.verdict == "too few to tell" and "range 2-95" in wide.to_words()


def test_a_handful_is_described_never_alarmed(monkeypatch):
    ref = _ref()
    low = np.full(4, SCORES.min() - 0.1)  # four rows below every passage of the corpus
    report = drift_report(low, ref)
    assert report.verdict == "too few to tell" and not report.warn
    assert report.to_words() == (
        "the 4 new rows: median percentile 0 (range 0-0); too few to tell whether they differ "
        "from the corpus"
    )
    one = drift_report(low[:1], ref)
    assert one.to_words() == (
        "the new row is less like the corpus than all of its own passages (percentile 0); one "
        "row is too few to call drift"
    )
    typical = drift_report(np.array([np.median(SCORES)]), ref).to_words()
    assert "closer to the corpus than 50% of its own passages" in typical
    with monkeypatch.context() as patched:
        patched.setattr(drift, "DRIFT_MIN_ROWS", 3)
        assert drift_report(low, ref).warn


def test_not_judged_and_raw_figures():
    assert drift_report(np.array([0.5, 0.6]), None).verdict == "not judged"
    nothing = drift_report(np.array([np.nan, np.nan]), _ref())
    assert nothing.verdict == "not judged" and "no new row" in nothing.reason
    assert nothing.to_words().startswith("drift not judged: ")
    # the two ordinary sentences: raw log-densities stay out of the words
    ref = _ref(log_densities=np.full(2000, 657.7))
    two = drift_report(np.array([0.2, 0.25]), ref, np.array([-14239.7, -14100.0]))
    assert not re.search(r"log|std|\d\.\d|\d{3}", two.to_words())
    assert two.log_density_median == pytest.approx(-14169.85)
    assert "median log-density -14169.9 (passages' 657.7" in two.to_explain()
    no_density = drift_report(np.array([0.2, 0.25]), _ref(), np.array([-1.0, -2.0]))
    assert no_density.log_density_median is None


def test_a_sample_of_a_large_write_names_both_counts():
    report = drift_report(np.percentile(SCORES, np.linspace(10, 90, 50)), _ref(), rows=10_000)
    assert (report.n_rows, report.n_scored, report.n_judged) == (10_000, 50, 50)
    # issue 32: the words count rows written as rows, and the judged sample as a sample
    words = report.to_words()
    assert words.startswith("the 10,000 new rows (50 of them judged, a seeded sample) sit like")
    assert "50 of the 10,000" not in words
    sampled = drift_report(np.full(300, 0.5)[:100], _ref(), rows=300, sample=4096)
    assert sampled.to_words().startswith("the 300 new rows (100 of them judged, a seeded sample)")
    assert sampled.to_explain().startswith(
        "100 of 300 new rows scored against 4,096 rows of the index (its reference sample)"
    )
    unmatched = drift_report(np.r_[np.full(20, 0.5), np.full(5, np.nan)], _ref())
    assert unmatched.to_words().startswith(
        "the 25 new rows (20 of them judged, the others had no row to compare with)"
    )
    whole = drift_report(np.full(20, 0.5), _ref())
    assert whole.to_words().startswith("the 20 new rows sit")
    assert DriftReport.from_record(report.to_dict()) == report  # as the history stores it
    old = {"mean_log_prob": -14239.7, "corpus_mean_log_prob": 657.7, "gap_std": 8471.83,
           "share_below_p01": 1.0, "reliable": True, "warn": True}  # fmt: skip
    assert DriftReport.from_record(old) is None and DriftReport.from_record(None) is None


def test_upsert_judges_an_edited_row_against_the_others_not_its_old_self(tmp_path, model_dir):
    """The issue's case: one word prepended to a passage and upserted. Its best score is taken
    against the rows the index keeps (not the row it replaces, which would score ~1.0), and a
    single row is described, never an alarm."""
    import pyarrow.parquet as pq
    from corpus_helpers import write_corpus

    from flowsearch import Searcher, build_index, upsert

    corpus = write_corpus(tmp_path / "c.parquet", n=120, seed=4)
    build_index(corpus, tmp_path / "idx", model=str(model_dir))
    row = pq.read_table(corpus).slice(5, 1).to_pylist()[0]
    row["text"] = "big " + row["text"]
    drift = upsert(tmp_path / "idx", [row])["drift"]
    Z = Searcher.open(tmp_path / "idx").vectors()  # row 5 deleted, its new version is row 120
    kept = np.delete(np.arange(120), 5)
    best = float((Z[kept] @ Z[120]).max())
    # against the reference sample (every row of this corpus), held as float16: ~1e-4 apart
    assert best < 0.999 and drift["median_score"] == pytest.approx(best, abs=2e-3)
    assert drift["n_judged"] == 1 and drift["warn"] is False
    assert DriftReport.model_validate(drift).to_words().endswith("one row is too few to call drift")
