"""The query verdict and the searched space, in words: percentiles of the corpus, no raw
figures in the words, reasons when not judged."""

from __future__ import annotations

import re

import numpy as np
import pytest

from flowsearch.space import reference as space_reference
from flowsearch.space.reference import Reference
from flowsearch.space.reports import describe_space, query_report
from flowsearch.storage.manifest import AutoDecision, CalibrationSpec


def _ref(**kw) -> Reference:
    # best scores spread evenly over [0.4, 0.8]: 5th percentile 0.42, median 0.6
    return Reference.from_scores(np.linspace(0.4, 0.8, 1001), method="held-out",
                                 n_corpus=10_000, **kw)  # fmt: skip


def test_verdict_is_the_percentile_among_the_corpus_passages(monkeypatch):
    ref = _ref()
    fine = query_report(0.6, ref)
    assert fine.verdict == "in-distribution" and fine.percentile == pytest.approx(50.0, abs=0.2)
    assert fine.to_words() == (
        "like the corpus: this query is closer to it than 50% of the corpus's own passages"
    )
    odd = query_report(0.412, ref)
    assert odd.verdict == "out-of-distribution" and odd.percentile == pytest.approx(3.0, abs=0.2)
    assert odd.to_words().startswith(
        "unlike the corpus: this query is less like it than 97% of the corpus's own passages"
    )
    nonsense = query_report(0.1, ref)
    assert nonsense.percentile == 0.0 and "than all of the corpus's own passages" in (
        nonsense.to_words()
    )
    # the cut sits exactly at the reference's 5th percentile
    assert query_report(0.4201, ref).verdict == "in-distribution"
    assert query_report(0.4199, ref).verdict == "out-of-distribution"
    with monkeypatch.context() as patched:
        patched.setattr(space_reference, "OOD_PERCENTILE", 10.0)
        assert query_report(0.43, ref).verdict == "out-of-distribution"


def test_words_hold_no_raw_figures_but_the_report_and_explain_do():
    ref = _ref(log_densities=np.full(1001, 262.0))
    report = query_report(0.55, ref, log_density=-1130360.5)
    words = report.to_words()
    assert not re.search(r"\d\.\d|log|std|-\d", words)  # no scores, densities or deviations
    assert report.top_score == 0.55 and report.log_density == -1130360.5
    assert report.reference_cut == pytest.approx(0.42) and report.reference_median == 0.6
    explain = report.to_explain()
    assert "best dense score 0.550" in explain and "5th percentile 0.420" in explain
    assert "log-density -1130360.5 (passages' median 262.0" in explain
    assert set(report.to_dict()) >= {"verdict", "percentile", "top_score", "log_density"}


def test_log_density_is_dropped_without_a_reliable_reference_median():
    report = query_report(0.55, _ref(), log_density=-6.7e33)  # a flow fitted on 3 rows
    assert report.log_density is None and report.reference_log_density is None
    assert "log-density" not in report.to_explain()


def test_not_judged_reasons_in_words():
    ref = _ref()
    lexical = query_report(None, ref)
    assert lexical.verdict == "not judged" and "lexical mode, or a filter" in lexical.reason
    assert lexical.to_words() == f"not judged: {lexical.reason}"
    assert query_report(float("nan"), ref).top_score is None
    missing = query_report(0.6, None)
    assert missing.verdict == "not judged" and "no reference" in missing.reason
    few = Reference.from_scores(np.linspace(0.4, 0.8, 12), method="leave-one-out", n_corpus=12)
    assert "holds 12 rows, too few" in query_report(0.6, few).reason


def test_an_anisotropic_encoder_space_is_not_judged_a_calibrated_one_is():
    # static vectors searched raw (a corpus too small to calibrate): every passage is close to
    # every other, and the demo's in-domain questions all fell below the 5th percentile
    raw_static = _ref(space="encoder", mean_cosine=0.71)
    report = query_report(0.3, raw_static)
    assert report.verdict == "not judged" and "mean cosine 0.71" in report.reason
    assert report.top_score == 0.3 and report.reference_cut == pytest.approx(0.42)
    assert query_report(0.3, _ref(space="encoder", mean_cosine=0.04)).verdict != "not judged"
    assert query_report(0.3, _ref(space="calibrated")).verdict == "out-of-distribution"


def _spec(**kw) -> CalibrationSpec:
    base = {"name": "auto", "calibrator": "whitening-flow", "space": "encoder",
            "anisotropy": {"mean_cosine": 0.04}, "fit_rows": 300, "dim_out": 384}  # fmt: skip
    return CalibrationSpec(**{**base, **kw})


@pytest.mark.parametrize(
    ("spec", "pooling", "expected"),
    [
        (_spec(), "mean",
         "searches the encoder's own space (auto: its vectors are already spread out, mean "
         "cosine 0.04); a whitening-flow was fitted on 300 rows and kept for density"),
        (_spec(anisotropy={"mean_cosine": 0.71}), "static",
         "searches the encoder's own space (auto: 300 rows are too few to calibrate 384 "
         "dimensions); a whitening-flow was fitted on 300 rows and kept for density"),
        (_spec(calibrator="gaussian", space="calibrated", config={"power": 0.25},
               anisotropy={"mean_cosine": 0.2}, fit_rows=2250, auto=AutoDecision(
                   statistic="mean_cosine", threshold=0.33, calibrated=True)), "static",
         "searches a partial whitening of the encoder's space (auto: static pooling), fitted "
         "on 2,250 rows"),
        (_spec(calibrator="gaussian", space="calibrated", config={"power": 0.25},
               anisotropy={"mean_cosine": 0.41}, fit_rows=5000), "first_last_avg",
         "searches a partial whitening of the encoder's space (auto: its vectors are "
         "anisotropic, mean cosine 0.41 > 0.33), fitted on 5,000 rows"),
        (_spec(name="whitening", calibrator="whitening", space="calibrated", fit_rows=5000),
         "mean", "searches a whitening of the encoder's space, fitted on 5,000 rows "
         "(calibration=whitening)"),
        (_spec(name="flow", calibrator="flow", space="calibrated", fitted_on="/m/nli_flow"),
         "mean", "searches a normalizing flow (BERT-flow) of the encoder's space, fitted "
         "elsewhere (/m/nli_flow)"),
        (_spec(name="none", calibrator="none"), "mean",
         "searches the encoder's own space (no calibration)"),
    ],
)  # fmt: skip
def test_describe_space_in_one_line(spec, pooling, expected):
    assert describe_space(spec, pooling) == expected
    assert describe_space(spec.__dict__, pooling) == expected  # its JSON form works too


def test_describe_space_reads_a_non_contextual_decision_without_the_pooling():
    spec = _spec(calibrator="gaussian", space="calibrated", config={"power": 0.25},
                 decision="mean_cosine=0.2000 <= 0.33, but pooling 'static' is non-contextual: "
                 "search in the gaussian space", fit_rows=2250)  # fmt: skip
    assert "(auto: a non-contextual pooling)" in describe_space(spec)


def test_query_caption_is_the_verdict_in_words():
    from flowsearch.cli.output import report_caption as _density_caption

    report = query_report(0.41, _ref(log_densities=np.zeros(1001)), log_density=-6.7e33)
    caption = _density_caption(report)
    assert caption == report.to_words() and caption.startswith("unlike the corpus")
    assert "e+" not in caption and "log-density" not in caption
