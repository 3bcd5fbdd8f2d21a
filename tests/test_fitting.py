"""Choosing and fitting an index's calibrator: auto's decision and its reasons."""

from __future__ import annotations

import numpy as np
import pytest

from flowsearch.calibration import make_calibrator
from flowsearch.errors import BadInput
from flowsearch.space.fitting import AUTO_FITS, AUTO_SEARCHES, fit_for_index, load_fitted
from flowsearch.space.reference import MIN_ROWS_PER_DIM
from flowsearch.storage.manifest import AutoDecision


def _cone(n, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, d)) * 0.2 + 5.0).astype(np.float32)  # mean cosine near 1


def _isotropic(n, d=8, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)


def test_auto_searches_partial_whitening_on_an_anisotropic_corpus_with_enough_rows():
    U = _cone(40 * MIN_ROWS_PER_DIM)
    cal, spec = fit_for_index(U, "auto")
    name, config = AUTO_SEARCHES
    assert (name, config) == ("gaussian", {"power": 0.25})
    assert spec.calibrated and cal.name == name == spec.calibrator
    assert spec.config == {"k": None, "power": 0.25} == cal.config
    assert spec.auto == AutoDecision(statistic="mean_cosine", threshold=0.33, calibrated=True)
    assert spec.anisotropy["mean_cosine"] > 0.9
    assert "search in the gaussian space (gaussian, power=0.25)" in spec.decision
    assert np.isfinite(cal.log_prob(U[:5])).all()  # a density for the drift and query reports
    # the searched map is partial whitening of the corpus: the spread of the principal
    # standard deviations is square-rooted, not flattened
    std = cal.transform(U).std(axis=0)
    raw = np.sqrt(np.linalg.eigvalsh(np.cov(U.T, bias=True)))
    assert std.max() / std.min() == pytest.approx(np.sqrt(raw.max() / raw.min()), rel=1e-3)


def test_auto_keeps_the_encoder_space_when_isotropic_or_too_small():
    cal, iso = fit_for_index(_isotropic(200), "auto")
    assert iso.space == "encoder" and iso.auto.calibrated is False
    # the encoder space keeps a density model for the drift and query reports
    assert (
        cal.name == AUTO_FITS == iso.calibrator and np.isfinite(cal.log_prob(_isotropic(5))).all()
    )
    assert "search in the encoder space" in iso.decision
    cal, small = fit_for_index(_cone(MIN_ROWS_PER_DIM * 8 - 1), "auto")
    assert small.space == "encoder" and f"< {MIN_ROWS_PER_DIM} x dim 8" in small.decision
    assert cal.name == AUTO_FITS


def test_a_density_only_flow_is_fitted_on_a_sample(monkeypatch):
    from flowsearch.space import fitting

    with monkeypatch.context() as patched:
        patched.setattr(fitting, "DENSITY_FIT_ROWS", 150)
        cal, iso = fit_for_index(_isotropic(400), "auto")
    assert iso.space == "encoder" and iso.fit_rows == 150 and cal.name == AUTO_FITS
    assert iso.anisotropy == fit_for_index(_isotropic(400), "none")[1].anisotropy  # all rows
    # a searched space is fitted on every row: the sample is for the density alone
    _, cone = fit_for_index(_cone(400), "auto")
    assert cone.space == "calibrated" and cone.fit_rows == 400
    _, named = fit_for_index(_isotropic(400), "whitening-flow")
    assert named.fit_rows == 400


def test_auto_beats_raw_and_full_whitening_on_a_synthetic_retrieval_task():
    """Passages and their queries share a topic (8 dims) in a narrow cone; 2 strong directions
    hold noise that differs between a query and its passage (raw cosine suffers), 6 weak ones
    tiny noise (full whitening blows it up to the topic's scale, as it did length for static
    vectors). Partial whitening, what auto searches, damps the first and amplifies the second
    only half-way (log-scale): it must beat both."""
    rng = np.random.default_rng(1)
    n, topics = 600, 40
    centres = rng.normal(size=(topics, 16)) * np.r_[np.zeros(2), np.ones(8), np.zeros(6)]
    label = rng.integers(topics, size=n)

    def side():
        noise = rng.normal(size=(n, 16)) * np.r_[np.full(2, 2.0), np.full(8, 0.3), np.full(6, 0.05)]
        return centres[label] + noise + 4.0  # the common offset makes a narrow cone

    passages, queries = side(), side()

    def accuracy(calibration):
        from flowsearch.space.search_space import SearchSpace

        space = SearchSpace(*fit_for_index(passages, calibration))
        P, Q = space.project(passages, False)[0], space.project(queries, False)[0]
        return float((label[np.argmax(Q @ P.T, axis=1)] == label).mean())

    raw, full, auto = accuracy("none"), accuracy("whitening"), accuracy("auto")
    assert full < raw - 0.05  # the failure the rule guards against
    assert auto > raw + 0.02 and auto > full + 0.1


def test_a_named_calibration_is_always_searched():
    _, spec = fit_for_index(_isotropic(100), "whitening")
    assert spec.calibrated and spec.auto is None and spec.fit_rows == 100 and spec.dim_out == 8


def test_a_calibrator_fitted_elsewhere(tmp_path):
    make_calibrator("whitening").fit(_isotropic(100)).save(tmp_path / "cal")
    loaded = load_fitted(tmp_path / "cal", "auto", 8)
    cal, spec = fit_for_index(_isotropic(50), "auto", loaded=loaded, loaded_from=tmp_path / "cal")
    assert cal is loaded and spec.fitted_on == str((tmp_path / "cal").resolve())
    with pytest.raises(BadInput, match="contradicts") as caught:
        load_fitted(tmp_path / "cal", "flow", 8)
    assert caught.value.param == "calibration" and "--calibration" in caught.value.render("cli")
    with pytest.raises(BadInput, match="fitted on 8-d") as caught:
        load_fitted(tmp_path / "cal", "auto", 16)
    assert caught.value.param == "calibrator" and caught.value.exit_code == 2


@pytest.mark.parametrize("pooling", ["static", "embedding_layer"])
def test_auto_calibrates_a_non_contextual_pooling_whatever_its_mean_cosine(pooling):
    """Model2Vec's mean cosine sits under the threshold, yet partial whitening helps it on every
    dev set (issue 16): auto calibrates non-contextual poolings by their kind."""
    from flowsearch.space.fitting import AUTO_CALIBRATES_POOLINGS

    assert pooling in AUTO_CALIBRATES_POOLINGS
    U = _isotropic(40 * MIN_ROWS_PER_DIM)
    cal, spec = fit_for_index(U, "auto", pooling=pooling)
    assert spec.anisotropy["mean_cosine"] < 0.33  # the statistic alone would keep it raw
    assert spec.calibrated and spec.space == "calibrated" and cal.name == AUTO_SEARCHES[0]
    assert spec.config["power"] == 0.25 and spec.auto is not None and spec.auto.calibrated
    assert f"but pooling '{pooling}' is non-contextual" in spec.decision
    assert "search in the gaussian space" in spec.decision


@pytest.mark.parametrize("pooling", [None, "mean", "cls", "last2avg", "first_last_avg"])
def test_auto_judges_contextual_poolings_by_the_statistic(pooling):
    """Contrastive ``mean`` must stay raw (calibration cost it 0.025-0.12 nDCG@10); only the
    non-contextual kinds bypass the statistic."""
    _, spec = fit_for_index(_isotropic(40 * MIN_ROWS_PER_DIM), "auto", pooling=pooling)
    assert spec.space == "encoder" and "non-contextual" not in spec.decision
    _, cone = fit_for_index(_cone(40 * MIN_ROWS_PER_DIM), "auto", pooling=pooling)
    assert cone.space == "calibrated"


def test_a_non_contextual_pooling_still_needs_enough_rows():
    cal, spec = fit_for_index(_isotropic(MIN_ROWS_PER_DIM * 8 - 1), "auto", pooling="static")
    assert spec.space == "encoder" and cal.name == AUTO_FITS
    assert f"< {MIN_ROWS_PER_DIM} x dim 8" in spec.decision


def test_a_named_calibration_ignores_the_pooling():
    _, spec = fit_for_index(_isotropic(100), "none", pooling="static")
    assert spec.space == "encoder"


@pytest.mark.parametrize("name", ["whitening", "gaussian", "sn"])
def test_a_named_covariance_fit_on_too_few_rows_is_flagged(name, caplog):
    """Whitening 12 rows of 16 dimensions makes the rows equidistant (every best cosine
    -1/(n-1)): the decision, the log and ``info``'s line say it overfits; a per-dimension
    standardisation (sn) needs no covariance and is not flagged."""
    from flowsearch.space.reports import describe_space

    U = _isotropic(12, d=16)
    with caplog.at_level("WARNING", logger="flowsearch"):
        cal, spec = fit_for_index(U, name)
    flagged = name != "sn"
    assert ("12 rows < 3 x dim 16: too few, it overfits" in spec.decision) is flagged
    assert any("fewer than 3 per dimension" in r.message for r in caplog.records) is flagged
    assert ("too few for 16 dimensions, it overfits" in describe_space(spec)) is flagged
    if name == "whitening":  # what the flag is about: every row equally far from every other
        Z = cal.transform(U)
        Z = Z / np.linalg.norm(Z, axis=1, keepdims=True)
        cos = (Z @ Z.T)[~np.eye(len(U), dtype=bool)]
        np.testing.assert_allclose(cos, -1 / (len(U) - 1), atol=1e-3)
    _, enough = fit_for_index(_isotropic(MIN_ROWS_PER_DIM * 16, d=16), name)
    assert "too few" not in enough.decision and "too few" not in describe_space(enough)
