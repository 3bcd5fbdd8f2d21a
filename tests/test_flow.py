"""The BERT-flow calibrator: exact inverse, exact log-density, training, degenerate input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flowsearch.calibration import load_calibrator, make_calibrator
from flowsearch.calibration.glow import GlowFlow
from flowsearch.errors import FlowsearchError


def cone(n: int, d: int, cond: float = 3600.0, seed: int = 0) -> np.ndarray:
    """A narrow cone: a large common offset plus a steeply decaying spectrum, rotated."""
    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.normal(size=(d, d)))[0]
    scales = np.geomspace(1.0, 1.0 / math.sqrt(cond), d)
    return (rng.normal(size=(n, d)) * scales) @ q + 5.0 * q[0]


def _perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Moves every parameter off its initial value, so zero-initialised couplings act."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


@pytest.mark.parametrize("levels, depth, dim", [(1, 1, 2), (2, 2, 7), (3, 3, 16)])
def test_inverse_is_exact(levels, depth, dim):
    U = cone(600, dim)
    cal = make_calibrator("flow", levels=levels, depth=depth, width=8, epochs=3).fit(U)
    Z = cal.transform(U)
    assert Z.shape == U.shape and Z.dtype == np.float32
    rel = np.abs(cal.inverse(Z).astype(np.float64) - U).max() / np.abs(U).max()
    assert rel < 1e-4
    # a bijection both ways, at full precision, even for a flow far from its fitted state
    _perturb(cal.module)
    cal._assemble()  # the frozen inference form is rebuilt after any parameter change
    G = np.random.default_rng(1).normal(size=(50, dim))
    assert np.abs(cal._transform(cal._inverse(G)) - G).max() < 1e-9
    assert np.abs(cal._inverse(cal._transform(U)) - U).max() / np.abs(U).max() < 1e-9


@pytest.mark.parametrize("name", ["flow", "whitening-flow"])
def test_log_prob_is_change_of_variables_with_autograd_jacobian(name):
    U = cone(400, 6)
    U[:, 2] = 1e-32  # a constant dimension takes the set-aside path; it must count too
    cal = make_calibrator(name, levels=2, depth=2, width=8).fit(U)
    assert cal.fit_stats["constant_dims"] == 1
    _perturb(cal.module, seed=3)
    cal._assemble()
    lp = cal.log_prob(U[:5])
    assert lp.shape == (5,) and lp.dtype == np.float64
    for u, expected in zip(torch.from_numpy(U[:5]), lp):
        z = cal.torch_forward(u[None])[0][0]
        jac = torch.autograd.functional.jacobian(lambda x: cal.torch_forward(x[None])[0][0], u)
        _, logabsdet = torch.linalg.slogdet(jac)
        log_normal = -0.5 * (z.pow(2).sum() + len(z) * math.log(2 * math.pi))
        assert float((log_normal + logabsdet).detach()) == pytest.approx(expected, abs=1e-6)


def test_gradients_reach_every_parameter():
    flow = GlowFlow(10, levels=2, depth=2, width=8)
    x = torch.randn(64, 10)
    flow.initialize(x)
    _perturb(flow)
    (-flow.log_prob(x).mean()).backward()
    for name, p in flow.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_training_raises_likelihood_and_whitens_a_cone():
    U = cone(10_000, 24)
    cov_in = np.linalg.eigvalsh(np.cov(U.T))
    assert cov_in.max() / cov_in.min() > 1000
    cal = make_calibrator("flow", epochs=5, levels=2).fit(U)
    stats = cal.fit_stats
    assert stats["bits_per_dim_last_batch"] < stats["bits_per_dim_first_batch"] - 0.5
    cov = np.cov(cal.transform(U).T)
    eig = np.linalg.eigvalsh(cov)
    assert eig.max() / eig.min() < 10
    assert np.abs(cov - np.eye(24)).max() < 0.3


def test_fit_is_deterministic_for_a_seed_and_save_load_is_identical(tmp_path):
    U = cone(800, 12)
    a = make_calibrator("flow", seed=7, width=8).fit(U)
    b = make_calibrator("flow", seed=7, width=8).fit(U)
    c = make_calibrator("flow", seed=8, width=8).fit(U)
    np.testing.assert_array_equal(a.transform(U), b.transform(U))
    assert not np.array_equal(a.transform(U), c.transform(U))
    a.save(tmp_path / "cal")
    loaded = load_calibrator(tmp_path / "cal")
    assert loaded.config == a.config and loaded.fit_stats == a.fit_stats
    np.testing.assert_array_equal(loaded.transform(U), a.transform(U))
    np.testing.assert_array_equal(loaded.log_prob(U), a.log_prob(U))
    np.testing.assert_array_equal(loaded.inverse(a.transform(U)), a.inverse(a.transform(U)))


def _nearest_neighbour_recall(cal, U: np.ndarray, noise: float = 1e-3) -> float:
    """Share of rows whose slightly perturbed copy finds the row itself by cosine."""
    rng = np.random.default_rng(5)
    Q = U + noise * U.std(axis=0).mean() * rng.normal(size=U.shape)
    Z, Zq = cal.transform(U), cal.transform(Q)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    Zq /= np.linalg.norm(Zq, axis=1, keepdims=True)
    return float(np.mean((Zq @ Z.T).argmax(axis=1) == np.arange(len(U))))


@pytest.mark.parametrize("name", ["flow", "whitening"])
def test_constant_dimensions_stay_finite_and_useful(name):
    # all-MiniLM-L6-v2's mean vectors: three dimensions at ~1e-32 for every sentence
    U = cone(3000, 48)
    U[:, [5, 17, 40]] = 1e-32
    cal = make_calibrator(name).fit(U)
    Z = cal.transform(U)
    assert np.isfinite(Z).all() and np.isfinite(cal.inverse(Z)).all()
    assert _nearest_neighbour_recall(cal, U[:500]) > 0.95
    if name == "flow":
        assert np.isfinite(cal.log_prob(U)).all()
        assert cal.fit_stats["constant_dims"] == 3


@pytest.mark.parametrize("name", ["flow", "whitening"])
def test_duplicated_rows_stay_finite(name):
    U = np.repeat(cone(200, 32), 10, axis=0)
    cal = make_calibrator(name).fit(U)
    Z = cal.transform(U)
    assert np.isfinite(Z).all()
    assert _nearest_neighbour_recall(cal, U[::10]) > 0.95


@pytest.mark.parametrize("name", ["flow", "whitening"])
def test_fewer_rows_than_dimensions(name):
    U = cone(60, 128)
    cal = make_calibrator(name).fit(U)
    Z = cal.transform(U)
    assert np.isfinite(Z).all()
    # an unseen query far outside the corpus's span must not explode either
    q = cone(5, 128, seed=9)
    assert np.isfinite(cal.transform(q)).all()
    assert _nearest_neighbour_recall(cal, U) > 0.95


def test_every_row_identical_does_not_crash():
    U = np.ones((100, 8))
    U[:, 0] = np.linspace(0, 1, 100)  # one informative dimension
    Z = make_calibrator("flow", levels=2).fit(U).transform(U)
    assert np.isfinite(Z).all()
    with pytest.raises(FlowsearchError, match="constant"):
        make_calibrator("flow").fit(np.ones((10, 8)))


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(FlowsearchError, match="levels"):
        make_calibrator("flow", levels=0)
    # more levels than halvings: the last levels run on one channel, still a bijection
    U = cone(100, 6)
    deep = make_calibrator("flow", levels=4, width=4).fit(U)
    assert np.abs(deep.inverse(deep.transform(U)) - U).max() / np.abs(U).max() < 1e-4
    with pytest.raises(FlowsearchError, match="permutation"):
        make_calibrator("flow", permutation="shuffle")
    with pytest.raises(FlowsearchError, match="not fitted"):
        make_calibrator("flow").transform(np.zeros((1, 4)))
    cal = make_calibrator("flow", width=4).fit(cone(200, 8))
    with pytest.raises(FlowsearchError, match="8"):
        cal.transform(np.zeros((2, 9)))
    with pytest.raises(FlowsearchError, match="NaN"):
        cal.transform(np.full((2, 8), np.nan))


def test_random_permutation_option_and_fractional_epochs():
    U = cone(1000, 16)
    cal = make_calibrator("flow", permutation="random", epochs=0.25, batch_size=50).fit(U)
    assert cal.fit_stats["steps"] == 5
    assert np.abs(cal.inverse(cal.transform(U)) - U).max() / np.abs(U).max() < 1e-4


def test_transform_and_log_prob_in_one_pass():
    U = cone(300, 10)
    cal = make_calibrator("flow", width=8, levels=2).fit(U)
    Z, lp = cal.transform_and_log_prob(U)
    np.testing.assert_array_equal(Z, cal.transform(U))
    np.testing.assert_allclose(lp, cal.log_prob(U), rtol=1e-12)
    assert Z.dtype == np.float32 and lp.dtype == np.float64
    Z0, lp0 = cal.transform_and_log_prob(np.empty((0, 10)))
    assert Z0.shape == (0, 10) and lp0.shape == (0,)


def test_whitening_flow_starts_from_whitened_vectors(tmp_path):
    U = cone(3000, 16)
    cal = make_calibrator("whitening-flow", width=8)
    assert cal.config["prewhiten"] is True
    cal.fit(U)
    eig = np.linalg.eigvalsh(np.cov(cal.transform(U).T))
    assert eig.max() / eig.min() < 3  # the reference flow leaves ~40 here after one epoch
    assert np.abs(cal.inverse(cal.transform(U)) - U).max() / np.abs(U).max() < 1e-4
    cal.save(tmp_path)
    loaded = load_calibrator(tmp_path)
    assert loaded.name == "whitening-flow"
    np.testing.assert_array_equal(loaded.transform(U), cal.transform(U))
    np.testing.assert_array_equal(loaded.log_prob(U), cal.log_prob(U))


@pytest.mark.parametrize("name", ["flow", "whitening-flow"])
def test_frozen_inference_form_equals_the_module(name):
    U = cone(500, 13)
    U[:, 4] = 1e-32
    cal = make_calibrator(name, levels=3, depth=2, width=8).fit(U)
    _perturb(cal.module, seed=11)  # every parameter matters, zero-initialised ones included
    cal._assemble()
    with torch.no_grad():
        z_module, ld_module = cal.torch_forward(torch.from_numpy(U))
    z, lp = cal.transform_and_log_prob(U)
    np.testing.assert_allclose(cal._transform(U), z_module.numpy(), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(z, z_module.numpy(), rtol=1e-6, atol=1e-6)  # float32
    expected_lp = -0.5 * ((z_module**2).sum(1) + 13 * math.log(2 * math.pi)) + ld_module
    np.testing.assert_allclose(lp, expected_lp.numpy(), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("name", ["flow", "whitening-flow"])
def test_chunking_does_not_change_the_numbers_nor_touch_torch(name, monkeypatch):
    """Inference runs the frozen numpy map in blocks of rows, the flow in chunks of them: any
    size gives the same numbers (constant dimensions included), and torch's process-wide thread
    count is never touched (queries run beside each other)."""
    from flowsearch.calibration import flow, stepmath

    rng = np.random.default_rng(3)
    U = rng.normal(size=(600, 12)) @ rng.normal(size=(12, 12))
    U[:, 5] = 0.25  # a constant dimension
    cal = make_calibrator(name, seed=0, levels=2, depth=2, width=16).fit(U)
    Q = U[:37] + rng.normal(scale=0.1, size=(37, 12))
    threads = torch.get_num_threads()
    z_one, lp_one = cal.transform_and_log_prob(Q)
    assert torch.get_num_threads() == threads
    with monkeypatch.context() as patched:  # chunks of 1 row
        patched.setattr(flow, "BLOCK_ROWS", 7)
        patched.setattr(stepmath, "CHUNK_MACS", 1)
        z_five, lp_five = cal.transform_and_log_prob(Q)
        back = cal.inverse(z_five)
    # float64 maps of the same rows (BLAS may sum in another order for another row count);
    # the float32 outputs agree to their last bit or so
    np.testing.assert_allclose(z_five, z_one, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lp_five, lp_one, rtol=1e-12)
    np.testing.assert_allclose(back, cal.inverse(z_one), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(cal.transform(Q), z_one, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(cal.log_prob(Q), lp_one, rtol=1e-12)
    np.testing.assert_allclose(cal.transform(Q[:1]), z_one[:1], rtol=1e-6, atol=1e-6)
