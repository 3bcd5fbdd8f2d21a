"""The searched space: one projection for rows and queries, density alongside."""

from __future__ import annotations

import numpy as np
import pytest

from flowsearch.calibration import make_calibrator
from flowsearch.errors import FlowsearchError
from flowsearch.space.search_space import SearchSpace, normalise
from flowsearch.storage.manifest import CalibrationSpec


@pytest.fixture(scope="module")
def U():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(400, 6)) @ rng.normal(size=(6, 6)) + 3.0).astype(np.float32)


def test_calibrated_space_is_the_calibrators_output_normalised(U):
    cal = make_calibrator("whitening").fit(U)
    space = SearchSpace(
        cal, CalibrationSpec(name="whitening", calibrator="whitening", space="calibrated")
    )
    Z, lp = space.project(U[:5])
    np.testing.assert_allclose(Z, normalise(cal.transform(U[:5])), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(Z, axis=1), 1.0, atol=1e-6)
    assert lp is None and not space.has_density and space.dim == 6


def test_encoder_space_keeps_raw_vectors_but_reports_the_flow_density(U):
    cal = make_calibrator("flow", seed=0, levels=2, depth=2, width=8).fit(U)
    space = SearchSpace(cal, CalibrationSpec(name="auto", calibrator="flow", space="encoder"))
    Z, lp = space.project(U[:5])
    np.testing.assert_allclose(Z, normalise(U[:5]), atol=1e-6)
    np.testing.assert_allclose(lp, cal.log_prob(U[:5]), rtol=1e-9)
    assert space.project(U[:5], want_density=False)[1] is None


def test_flow_space_gives_vectors_and_density_in_one_pass(U):
    cal = make_calibrator("flow", seed=0, levels=2, depth=2, width=8).fit(U)
    space = SearchSpace(cal, CalibrationSpec(name="flow", calibrator="flow", space="calibrated"))
    Z, lp = space.project(U[:5])
    np.testing.assert_allclose(Z, normalise(cal.transform(U[:5])), atol=1e-5)
    np.testing.assert_allclose(lp, cal.log_prob(U[:5]), rtol=1e-9)


def test_embedding_needs_an_encoder(U):
    space = SearchSpace(
        make_calibrator("none").fit(U),
        CalibrationSpec(name="none", calibrator="none", space="encoder"),
    )
    with pytest.raises(FlowsearchError, match="no encoder"):
        space.embed(["a text"])


def test_normalise_handles_zero_rows():
    out = normalise(np.zeros((2, 3)))
    assert out.dtype == np.float32 and np.isfinite(out).all()
