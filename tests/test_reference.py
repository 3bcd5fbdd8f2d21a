"""The reference: which rows are measured, their percentiles, old records, and the build's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flowsearch.errors import IndexDamaged
from flowsearch.space import reference as space_reference
from flowsearch.space.reference import (
    MIN_ROWS_PER_DIM,
    PERCENTS,
    Reference,
    best_other_score,
    density_stats,
    percentile_of,
    reference_of,
    reference_rows,
    reliable,
    share_words,
    split_fit_rows,
    why_unusable,
)
from flowsearch.storage import manifest as mf


def _ref(n: int = 1000, method: str = "held-out") -> Reference:
    # best scores spread evenly over [0.4, 0.8]: 5th percentile 0.42, median 0.6
    return Reference.from_scores(np.linspace(0.4, 0.8, n), method=method, n_corpus=10 * n)


def test_density_stats():
    lp = np.arange(101, dtype=float)
    stats = density_stats(lp)
    assert stats.mean_log_prob == 50 and stats.median == 50 and stats.n_rows == 101
    assert stats.p01 == pytest.approx(1.0) and stats.p05 == pytest.approx(5.0)


def test_reliable_needs_rows_per_dimension():
    assert reliable(MIN_ROWS_PER_DIM * 384, 384) and not reliable(300, 384)


def test_split_holds_out_a_tenth_never_fitted():
    fit, held = split_fit_rows(5000, fit_sample=200_000)
    assert len(held) == 500 and len(fit) == 4500
    assert not np.intersect1d(fit, held).size and np.union1d(fit, held).size == 5000
    assert np.all(np.diff(fit) > 0) and np.all(np.diff(held) > 0)
    fit2, held2 = split_fit_rows(5000, fit_sample=200_000)
    assert np.array_equal(held, held2)  # seeded


def test_split_large_corpus_caps_held_out_and_keeps_the_fit_sample():
    fit, held = split_fit_rows(100_000, fit_sample=10_000)
    assert len(held) == space_reference.HELD_OUT_MAX and len(fit) == 10_000
    assert not np.intersect1d(fit, held).size


def test_split_small_corpus_holds_none_out_and_follows_the_constants(monkeypatch):
    n = space_reference.HELD_OUT_MIN * 10 - 20
    fit, held = split_fit_rows(n, fit_sample=200_000)
    assert len(held) == 0 and len(fit) == n
    with monkeypatch.context() as patched:
        patched.setattr(space_reference, "HELD_OUT_MIN", 10)
        assert len(split_fit_rows(n, fit_sample=200_000)[1]) == round(n * 0.1)


def test_reference_rows_prefers_held_out_rows_then_leave_one_out():
    held = np.arange(0, 5000, 10)
    rows, method = reference_rows(5000, held)
    assert method == "held-out" and np.array_equal(rows, held)
    rows, method = reference_rows(300, np.zeros(0, np.int64))  # the demo corpus: every row
    assert method == "leave-one-out" and np.array_equal(rows, np.arange(300))
    few = np.arange(space_reference.REFERENCE_MIN_ROWS - 1)
    rows, method = reference_rows(20_000, few)  # too few held out: a seeded sample instead
    assert method == "leave-one-out" and len(rows) == space_reference.REFERENCE_MAX_ROWS
    assert np.all(np.diff(rows) > 0) and rows.max() < 20_000
    assert np.array_equal(rows, reference_rows(20_000, few)[0])
    assert len(reference_rows(1, np.zeros(0, np.int64))[0]) == 0  # a lone row has no other


def test_best_other_score_skips_the_row_itself():
    scores = np.array([[1.0, 0.7], [0.9, 0.8], [1.0, -np.inf]])
    rows = np.array([[5, 2], [3, 9], [7, -1]])
    got = best_other_score(scores, rows, np.array([5, 9, 7]))
    assert got[0] == pytest.approx(0.7) and got[1] == pytest.approx(0.9) and np.isnan(got[2])


def test_percentile_of_interpolates_clamps_and_splits_ties():
    p = np.array([0.0, 25.0, 50.0, 75.0, 100.0])
    q = np.array([0.1, 0.2, 0.2, 0.2, 0.9])  # a tie over the 25th-75th percentiles
    got = percentile_of(np.array([0.0, 0.1, 0.15, 0.2, 0.55, 0.9, 2.0, np.nan]), p, q)
    assert got[:7].tolist() == pytest.approx([0.0, 0.0, 12.5, 50.0, 87.5, 100.0, 100.0])
    assert np.isnan(got[7])


def test_reference_percentiles_match_the_share_of_rows_below():
    scores = np.random.default_rng(0).normal(0.5, 0.1, 800)
    ref = Reference.from_scores(scores, method="held-out", n_corpus=8000)
    assert ref.percents == PERCENTS and len(ref.scores) == 101 and ref.n_measured == 800
    probe = np.array([0.3, 0.42, 0.5, 0.61, 0.7])
    share = np.array([100 * np.mean(scores < x) for x in probe])
    np.testing.assert_allclose(ref.percentiles(probe), share, atol=1.0)
    assert ref.score_at(5.0) == pytest.approx(np.percentile(scores, 5), abs=1e-6)


def test_reference_drops_nan_rows_and_keeps_log_densities_only_when_finite():
    ref = Reference.from_scores(np.array([0.5, np.nan, 0.7]), method="leave-one-out",
                                n_corpus=3, log_densities=np.array([1.0, 2.0, 9.0]))  # fmt: skip
    assert ref.n_measured == 2 and ref.log_density_median == 2.0
    bad = Reference.from_scores(np.array([0.5, 0.7]), method="leave-one-out", n_corpus=2,
                                log_densities=np.array([1.0, -np.inf]))  # fmt: skip
    assert bad.log_density_median is None
    empty = Reference.from_scores(np.array([np.nan]), method="leave-one-out", n_corpus=1)
    assert not empty.measured and empty.n_measured == 0


def test_reference_is_small_and_round_trips_through_json():
    ref = Reference.from_scores(np.random.default_rng(1).random(2000), method="held-out",
                                n_corpus=20_000, space="encoder", mean_cosine=0.04)  # fmt: skip
    text = json.dumps(ref.model_dump())
    assert len(text) < 2500  # the manifest stays small
    assert Reference.model_validate(json.loads(text)) == ref


def test_why_unusable_names_the_missing_reference_and_too_few_rows(monkeypatch):
    assert "no reference" in why_unusable(None)
    few = Reference.from_scores(np.linspace(0, 1, 30), method="leave-one-out", n_corpus=30)
    assert "holds 30 rows, too few" in why_unusable(few)
    assert why_unusable(_ref()) is None
    with monkeypatch.context() as patched:
        patched.setattr(space_reference, "REFERENCE_MIN_ROWS", 10)
        assert why_unusable(few) is None


def test_share_words_never_round_to_all_or_none():
    assert [share_words(p) for p in (96.6, 99.97, 100.0, 0.04, 0.0, 50.2)] == [
        "97%", "99.9%", "all", "0.1%", "none", "50%"]  # fmt: skip


def test_reference_words_say_what_is_measured():
    words = _ref(200, "leave-one-out").to_words()
    assert words.startswith("200 of the corpus's own passages") and "leave-one-out" in words
    assert "less like the corpus than 95% of them is flagged" in words
    assert "held out of the calibrator's fit" in _ref().to_words()


def _manifest(n_rows: int = 0) -> mf.Manifest:
    seg = mf.SegmentRecord(name="s000001", dir="segments/s000001", n_rows=n_rows,
                           ann=mf.AnnRecord(path="ann.faiss", factory="Flat"))  # fmt: skip
    return mf.Manifest(
        encoder=mf.EncoderSpec(model="m", revision="r", pooling="mean", max_length=8, dim=4),
        dim=4,
        calibration=mf.CalibrationSpec(name="auto", calibrator="whitening-flow", space="encoder",
                                       anisotropy={"mean_cosine": 0.05}, fit_rows=5000),
        columns=mf.Columns(text="text", id="id"),
        segments=(seg,),
        density=mf.DensityStats(mean_log_prob=1.0, std_log_prob=2.0, p01=0.0, p05=0.0,
                                median=1.0, rows=10),
    )  # fmt: skip


def test_the_previous_releases_held_out_record_still_gives_a_reference():
    # what the previous release stored: held-out rows' best scores at nine percentiles
    density = mf.DensityStats(mean_log_prob=260.0, std_log_prob=40.0, p01=150.0, p05=190.0,
                              median=262.0, rows=391)  # fmt: skip
    held = mf.HeldOut(n_rows=391, density=density,
                      percents=(1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0),
                      top_score=(0.30, 0.40, 0.45, 0.52, 0.58, 0.64, 0.70, 0.74, 0.80))  # fmt: skip
    m = _manifest(3913).model_copy(update={"held_out": held})
    ref = reference_of(m)
    assert ref is not None and ref.method == "held-out" and ref.n_measured == 391
    assert ref.n_corpus == 3913 and ref.space == "encoder" and ref.mean_cosine == 0.05
    assert ref.score_at(5.0) == 0.40 and ref.percentile(0.55) == pytest.approx(37.5)
    assert ref.log_density_median == 262.0  # 5000 fit rows >= 3 x dim 4: reliable
    cal = m.calibration.model_copy(update={"fit_rows": 5})
    unreliable = m.model_copy(update={"calibration": cal})
    assert reference_of(unreliable).log_density_median is None
    # a corpus under 500 rows held none out: no reference, as before
    assert reference_of(m.model_copy(update={"held_out": mf.HeldOut(n_rows=0)})) is None
    assert reference_of(_manifest()) is None


def test_reference_round_trips_through_the_manifest_and_wins_over_held_out():
    ref = _ref(200, "leave-one-out")
    held = mf.HeldOut(n_rows=60, percents=(5.0, 50.0), top_score=(0.1, 0.2))
    m = _manifest().model_copy(update={"reference": ref, "held_out": held})
    again = mf.from_json(json.loads(json.dumps(m.to_json_dict())))
    assert reference_of(again) == ref
    assert reference_of({"reference": ref}) is ref
    with pytest.raises(IndexDamaged, match="reference is malformed"):
        reference_of({"reference": {"method": "guess", "rows": -1}})


def test_build_measures_held_out_rows_or_every_row_of_a_small_corpus(tmp_path, model_dir):
    """600 rows: the 60 held-out rows make the reference; 120 rows: every row, leave-one-out.
    Either way a corpus text scores 1.0 (the top of the scale) and is judged like the corpus
    when the space is judged at all."""
    import pyarrow.parquet as pq
    from corpus_helpers import write_corpus

    from flowsearch import Searcher, build_index
    from flowsearch.calibration import load_calibrator

    corpus = write_corpus(tmp_path / "c.parquet", n=600, seed=5)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), calibration="flow")
    s = Searcher.open(tmp_path / "idx")
    m = s.manifest
    _, held = split_fit_rows(600, 200_000)
    ref = reference_of(m)
    assert ref is not None and ref.method == "held-out" and ref.n_measured == len(held) == 60
    assert m.calibration.fit_rows == 540 and ref.space == "calibrated" and ref.mean_cosine is None
    raw = np.asarray(pq.read_table(corpus).column("text").to_pylist())
    cal = load_calibrator(tmp_path / "idx" / m.calibration.path)
    Z = s.vectors()
    S = Z[held] @ Z.T
    S[np.arange(len(held)), held] = -np.inf
    expect = Reference.from_scores(S.max(1), method="held-out", n_corpus=600)
    np.testing.assert_allclose(ref.scores, expect.scores, atol=1e-5)
    lp = cal.log_prob(s.encoder.encode(list(raw[held])))
    assert ref.log_density_median == pytest.approx(float(np.median(lp)), rel=1e-4)
    result = s.query(str(raw[held[0]]), k=3, mode="dense")
    assert result.report.verdict == "in-distribution" and result.report.percentile == 100.0
    assert result.report.top_score == pytest.approx(1.0, abs=1e-4)
    filtered = s.query(str(raw[0]), k=3, where="year >= 2000", mode="dense")
    assert filtered.report.verdict == "not judged" and filtered.report.top_score is None

    small = write_corpus(tmp_path / "s.parquet", n=120, seed=6)
    build_index(small, tmp_path / "small", model=str(model_dir), calibration="flow")
    s = Searcher.open(tmp_path / "small")
    ref = reference_of(s.manifest)
    assert ref is not None and ref.method == "leave-one-out" and ref.n_measured == 120
    text = pq.read_table(small).column("text")[7].as_py()
    report = s.query(text, k=1, mode="dense").report
    assert report.verdict == "in-distribution" and report.percentile == 100.0
