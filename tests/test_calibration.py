"""Every calibrator: the shared protocol, saving, and the linear ones' definitions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flowsearch.calibration import load_calibrator, make_calibrator, names
from flowsearch.errors import FlowsearchError

NAMES = names()
SMALL = {"flow": {"width": 8, "levels": 2}, "whitening-flow": {"width": 8, "levels": 2}}


@pytest.fixture(scope="module")
def U() -> np.ndarray:
    rng = np.random.default_rng(0)
    scales = np.geomspace(3.0, 0.01, 16)
    return rng.normal(size=(1500, 16)) * scales @ np.linalg.qr(rng.normal(size=(16, 16)))[0] + 2


def test_registry_names():
    assert set(NAMES) == {
        "none",
        "flow",
        "whitening-flow",
        "whitening",
        "gaussian",
        "sn",
        "natsv",
        "sn-natsv",
    }


@pytest.mark.parametrize("name", NAMES)
def test_protocol_shapes_save_and_load(name, U, tmp_path):
    cal = make_calibrator(name, **SMALL.get(name, {}))
    assert not cal.fitted
    assert cal.fit(U) is cal and cal.fitted and cal.dim_in == 16
    Z = cal.transform(U)
    assert Z.dtype == np.float32 and Z.shape == (len(U), cal.dim_out)
    assert np.isfinite(Z).all()
    assert cal.transform(U[0]).shape == (1, cal.dim_out)  # a single vector is one row
    cal.save(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["name"] == name and meta["dim_in"] == 16
    assert not list(tmp_path.glob("*.pkl")) and (tmp_path / "weights.safetensors").is_file()
    loaded = load_calibrator(tmp_path)
    assert type(loaded) is type(cal) and loaded.config == cal.config
    np.testing.assert_array_equal(loaded.transform(U), Z)


@pytest.mark.parametrize("name", ["none", "sn", "whitening", "gaussian", "flow", "whitening-flow"])
def test_invertible_ones_round_trip(name, U):
    cal = make_calibrator(name, **SMALL.get(name, {})).fit(U)
    assert cal.invertible
    back = cal.inverse(cal.transform(U)).astype(np.float64)
    assert np.abs(back - U).max() / np.abs(U).max() < 1e-4


@pytest.mark.parametrize("name, kw", [("natsv", {}), ("sn-natsv", {}), ("whitening", {"k": 4})])
def test_lossy_ones_refuse_inverse(name, kw, U):
    cal = make_calibrator(name, **kw).fit(U)
    with pytest.raises(NotImplementedError):
        cal.inverse(cal.transform(U))


@pytest.mark.parametrize("name", ["none", "sn", "natsv", "whitening"])
def test_only_the_flows_and_the_gaussian_have_a_density(name, U):
    with pytest.raises(NotImplementedError):
        make_calibrator(name).fit(U).log_prob(U)


def test_sn_standardises(U):
    Z = make_calibrator("sn").fit(U).transform(U)
    np.testing.assert_allclose(Z.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(Z.std(axis=0), 1, atol=1e-4)


def test_natsv_removes_top_directions(U):
    cal = make_calibrator("natsv", k=3).fit(U)
    Z = cal.transform(U).astype(np.float64)
    X = U - U.mean(axis=0)
    top = np.linalg.svd(X, full_matrices=False)[2][:3]
    assert np.abs(Z @ top.T).max() < 1e-4
    # what is left is untouched: the rest of the spectrum is the same
    rest = np.linalg.svd(X, compute_uv=False)[3:]
    np.testing.assert_allclose(np.linalg.svd(Z, compute_uv=False)[:13], rest, rtol=1e-4)


def test_sn_natsv_is_sn_then_natsv(U):
    sn = make_calibrator("sn").fit(U)
    natsv = make_calibrator("natsv", k=2).fit(sn.transform(U).astype(np.float64))
    both = make_calibrator("sn-natsv", k=2).fit(U)
    expected = natsv.transform(sn.transform(U).astype(np.float64))
    np.testing.assert_allclose(both.transform(U), expected, atol=1e-4)


def test_whitening_gives_identity_covariance_and_k_dims(U):
    full = make_calibrator("whitening").fit(U)
    np.testing.assert_allclose(np.cov(full.transform(U).T, bias=True), np.eye(16), atol=1e-3)
    reduced = make_calibrator("whitening", k=5).fit(U)
    Zk = reduced.transform(U)
    assert Zk.shape == (len(U), 5) and reduced.dim_out == 5
    # the k kept dimensions are the leading ones of the full whitening
    np.testing.assert_allclose(Zk, full.transform(U)[:, :5], atol=1e-4)


@pytest.mark.parametrize(
    "name, kw, fragment",
    [
        ("whitening", {"k": 0}, "k must be"),
        ("natsv", {"k": "6"}, "k must be"),
        ("natsv", {"k": None}, "natsv: k must be an integer >= 1, got None"),
        ("sn-natsv", {"k": None}, "sn-natsv: k must be an integer >= 1, got None"),
        ("flow", {"depth": 2.5}, "depth"),
        ("flow", {"colour": "red"}, "bad option"),
        ("pca", {}, "unknown calibration"),
    ],
)
def test_bad_configuration(name, kw, fragment):
    with pytest.raises(FlowsearchError, match=fragment):
        make_calibrator(name, **kw)


def test_bad_fit_input(U):
    with pytest.raises(FlowsearchError, match="at least 2"):
        make_calibrator("sn").fit(U[:1])
    with pytest.raises(FlowsearchError, match="shape"):
        make_calibrator("sn").fit(np.zeros((3, 2, 2)))
    with pytest.raises(FlowsearchError, match="exceeds"):
        make_calibrator("whitening", k=17).fit(U)
    with pytest.raises(FlowsearchError, match="smaller than"):
        make_calibrator("natsv", k=16).fit(U)


def test_load_errors(tmp_path, U):
    with pytest.raises(FlowsearchError, match="no saved calibrator"):
        load_calibrator(tmp_path)
    make_calibrator("sn").fit(U).save(tmp_path)
    (tmp_path / "weights.safetensors").write_bytes(b"garbage")
    with pytest.raises(FlowsearchError, match="unreadable"):
        load_calibrator(tmp_path)


# -- whitening strength (issue 16): power and shrinkage ------------------------------------

STRENGTHS = [
    {},
    {"power": 0.25},
    {"power": 0.0},
    {"shrinkage": 0.1},
    {"power": 0.375, "shrinkage": 1.0},
    {"power": 0.25, "k": 6},
]


def _spectrum(U):
    X = U - U.mean(axis=0)
    vecs, vals, _ = np.linalg.svd(X.T @ X / len(U))
    return vecs, vals


@pytest.mark.parametrize("kw", STRENGTHS, ids=str)
def test_whitening_strength_scales_each_direction(kw, U):
    cal = make_calibrator("whitening", **kw).fit(U)
    Z = cal.transform(U).astype(np.float64)
    _, vals = _spectrum(U)
    power, shrink = kw.get("power", 0.5), kw.get("shrinkage", 0.0)
    # variance along principal direction i: eig_i / (eig_i + shrink * mean(eig)) ^ (2 power)
    expected = vals / (vals + shrink * vals.mean()) ** (2 * power)
    k = kw.get("k", 16)
    cov = np.cov(Z.T, bias=True)
    np.testing.assert_allclose(np.diag(cov), expected[:k], rtol=1e-3)
    assert np.abs(cov - np.diag(np.diag(cov))).max() < 1e-5 * expected.max()  # decorrelated


@pytest.mark.parametrize("kw", [s for s in STRENGTHS if "k" not in s], ids=str)
def test_whitening_round_trips_at_every_strength(kw, U, tmp_path):
    cal = make_calibrator("whitening", **kw).fit(U)
    assert cal.invertible
    Z = cal.transform(U)
    back = cal.inverse(Z).astype(np.float64)
    assert np.abs(back - U).max() / np.abs(U).max() < 1e-5
    cal.save(tmp_path)
    loaded = load_calibrator(tmp_path)
    assert loaded.config == cal.config and (loaded.power, loaded.shrinkage) == (
        kw.get("power", 0.5),
        kw.get("shrinkage", 0.0),
    )
    np.testing.assert_array_equal(loaded.transform(U), Z)
    np.testing.assert_array_equal(loaded.inverse(Z), cal.inverse(Z))


def test_default_whitening_is_unchanged(U, tmp_path):
    cal = make_calibrator("whitening").fit(U)
    # no new config keys: manifests and saved calibrators of earlier releases compare equal
    assert cal.config == {"k": None}
    assert make_calibrator("whitening", power=0.5, shrinkage=0).config == {"k": None}
    # bit for bit the earlier map: scales are sqrt of the floored eigenvalues
    X = U - U.mean(axis=0)
    vecs, vals, _ = np.linalg.svd(X.T @ X / len(U))
    np.testing.assert_array_equal(cal.scales, np.sqrt(vals))
    np.testing.assert_array_equal(
        cal.transform(U), (((U - U.mean(axis=0)) @ vecs) / np.sqrt(vals)).astype(np.float32)
    )
    # a calibrator saved before strengths existed (config {"k": null}) loads as full whitening
    cal.save(tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    assert meta["config"] == {"k": None}
    loaded = load_calibrator(tmp_path)
    assert (loaded.power, loaded.shrinkage) == (0.5, 0.0)


def test_weaker_whitening_keeps_more_of_the_spectrum(U):
    def spread(kw):
        std = make_calibrator("whitening", **kw).fit(U).transform(U).std(axis=0)
        return std.max() / std.min()

    raw = np.sqrt(_spectrum(U)[1])
    assert spread({}) < 1.01  # full: every direction alike
    for weaker in ({"shrinkage": 0.1}, {"power": 0.25}, {"power": 0.375, "shrinkage": 1.0}):
        assert 1.5 < spread(weaker) < spread({"power": 0.0}) / 2
    assert spread({"power": 0.0}) == pytest.approx(raw.max() / raw.min(), rel=1e-3)


@pytest.mark.parametrize(
    "kw, fragment",
    [
        ({"power": -0.1}, "power must be in"),
        ({"power": 0.6}, "power must be in"),
        ({"power": "0.25"}, "power must be a number"),
        ({"power": True}, "power must be a number"),
        ({"shrinkage": -1.0}, "shrinkage must be >= 0"),
        ({"shrinkage": float("nan")}, "shrinkage must be"),
        ({"shrinkage": float("inf")}, "shrinkage must be"),
    ],
)
def test_bad_whitening_strength(kw, fragment):
    with pytest.raises(FlowsearchError, match=fragment):
        make_calibrator("whitening", **kw)


@pytest.mark.parametrize("kw", [{}, {"power": 0.25}, {"shrinkage": 0.5}], ids=str)
def test_gaussian_is_whitening_with_the_fitted_gaussians_density(kw, U, tmp_path):
    g = make_calibrator("gaussian", **kw).fit(U)
    np.testing.assert_array_equal(
        g.transform(U), make_calibrator("whitening", **kw).fit(U).transform(U)
    )
    mu, cov = U.mean(axis=0), np.cov(U.T, bias=True)
    diff = U[:50] - mu
    _, logdet = np.linalg.slogdet(cov)
    expected = -0.5 * (
        (diff @ np.linalg.inv(cov) * diff).sum(axis=1) + logdet + 16 * np.log(2 * np.pi)
    )
    # the density does not depend on the strength of the map
    np.testing.assert_allclose(g.log_prob(U[:50]), expected, rtol=1e-6)
    g.save(tmp_path)
    np.testing.assert_array_equal(load_calibrator(tmp_path).log_prob(U[:50]), g.log_prob(U[:50]))


def test_gaussian_gives_both_from_one_pass(U):
    g = make_calibrator("gaussian", power=0.25, k=8).fit(U)
    Z, lp = g.transform_and_log_prob(U[:20])
    np.testing.assert_allclose(Z, g.transform(U[:20]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lp, g.log_prob(U[:20]), rtol=1e-12)
