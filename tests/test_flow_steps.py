"""Every step of the flow: exact inverse, log-determinant against autograd, gradients reach every
parameter, and the frozen numpy form computes the same as the torch module."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from flowsearch.calibration.glow import ActNorm, AdditiveCoupling, GlowFlow, GlowStep, Permutation
from flowsearch.calibration.maps import log_normal
from flowsearch.calibration.steps import Compose, SetAside, Split, Step, Whiten


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _whiten(d: int) -> Whiten:
    gen = _gen(1)
    rotation = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0]
    scales = torch.rand(d, generator=gen, dtype=torch.float64) + 0.2
    return Whiten(torch.randn(d, generator=gen, dtype=torch.float64), rotation, scales)


def _set_aside(inner: Step, active: list[int], constant: list[int]) -> SetAside:
    c = len(constant)
    mu, scale = torch.linspace(-1, 1, c, dtype=torch.float64), torch.full((c,), 0.3).double()
    return SetAside(inner, torch.tensor(active), torch.tensor(constant), mu, scale)


def _glow_step() -> GlowStep:
    return GlowStep(6, 4, torch.randperm(6, generator=_gen(2)), level=0, index=0)


#: name -> (builder, input dimension)
STEPS: dict[str, tuple[Callable[[], Step], int]] = {
    "actnorm": (lambda: ActNorm(5), 5),
    "permutation": (lambda: Permutation(torch.randperm(6, generator=_gen(0))), 6),
    "coupling": (lambda: AdditiveCoupling(7, width=4), 7),
    "coupling-one-channel": (lambda: AdditiveCoupling(1, width=4), 1),
    "split": (lambda: Split(3, ActNorm(3)), 5),
    "whiten": (lambda: _whiten(4), 4),
    "set-aside": (lambda: _set_aside(ActNorm(4), [0, 2, 3, 5], [1, 4]), 6),
    "set-aside-nothing": (lambda: _set_aside(ActNorm(3), [0, 1, 2], []), 3),
    "compose": (
        lambda: Compose({"w": _whiten(4), "a": ActNorm(4), "c": AdditiveCoupling(4, 3)}),
        4,
    ),
    "glow-step": (_glow_step, 6),
    "glow": (lambda: GlowFlow(7, levels=3, depth=2, width=4), 7),
    "glow-deeper-than-halvings": (lambda: GlowFlow(3, levels=4, depth=1, width=4), 3),
    "glow-random": (
        lambda: GlowFlow(8, levels=2, depth=2, width=4, permutation="random", generator=_gen(3)),
        8,
    ),  # fmt: skip
}


def build(name: str) -> tuple[Step, torch.Tensor]:
    """The step in float64, initialised on a batch as a fit starts, then with every parameter
    moved off its value (so that zero-initialised couplings act); and that batch."""
    make, dim = STEPS[name]
    torch.manual_seed(0)
    step = make().double()
    gen = _gen(4)
    x = torch.randn(32, dim, generator=gen, dtype=torch.float64)
    step.initialize(x)
    with torch.no_grad():
        for p in step.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return step, x


@pytest.mark.parametrize("name", STEPS)
def test_inverse_undoes_forward(name):
    step, x = build(name)
    y, ladj = step(x)
    assert y.shape == x.shape and ladj.shape == ()
    torch.testing.assert_close(step.inverse(y), x, rtol=0, atol=1e-10)
    z = torch.randn(x.shape, generator=_gen(5), dtype=torch.float64)
    torch.testing.assert_close(step(step.inverse(z))[0], z, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", STEPS)
def test_log_det_is_the_autograd_jacobians(name):
    step, x = build(name)
    _, ladj = step(x)
    for row in x[:3]:
        jac = torch.autograd.functional.jacobian(lambda r: step(r[None])[0][0], row)
        sign, logabsdet = torch.linalg.slogdet(jac)
        assert float(sign) != 0  # invertible at this point
        assert float(logabsdet) == pytest.approx(float(ladj.detach()), abs=1e-9)


@pytest.mark.parametrize("name", STEPS)
def test_gradients_reach_every_parameter_and_the_input(name):
    step, x = build(name)
    x.requires_grad_(True)
    z, ladj = step(x)
    (-(log_normal(z) + ladj).mean()).backward()
    assert x.grad is not None and x.grad.abs().sum() > 0  # what comes before it trains too
    for pname, p in step.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", STEPS)
def test_frozen_form_computes_the_same_in_numpy(name):
    step, x = build(name)
    frozen = step.freeze()
    with torch.no_grad():
        y, ladj = step(x)
    y_np, ladj_np = frozen(x.numpy())
    assert isinstance(y_np, np.ndarray) and y_np.dtype == np.float64
    np.testing.assert_allclose(y_np, y.numpy(), rtol=1e-12, atol=1e-12)
    assert float(ladj_np) == pytest.approx(float(ladj), abs=1e-12)
    np.testing.assert_allclose(frozen.inverse(y_np), x.numpy(), rtol=0, atol=1e-10)


def test_actnorm_initialises_to_zero_mean_unit_variance_and_spares_constant_channels():
    x = (
        torch.randn(500, 4, generator=_gen(6), dtype=torch.float64)
        * torch.tensor([3.0, 0.5, 1.0, 0.0]).double()
        + torch.tensor([1.0, -2.0, 0.0, 7.0]).double()
    )
    norm = ActNorm(4).double()
    y = norm.initialize(x)
    torch.testing.assert_close(y.mean(0), torch.zeros(4).double(), rtol=0, atol=1e-12)
    torch.testing.assert_close(y[:, :3].std(0, unbiased=False), torch.ones(3).double())
    # the constant channel is centred, and scaled like a typical channel (the median spread),
    # not blown up to unit variance
    typical = float(x.std(0, unbiased=False).median())
    assert float(norm.coefs().scale[3].detach()) == pytest.approx(1 / typical)


def test_glow_factors_out_half_per_level():
    """z = [the last half of level 0's output, level 1 applied to its first half]."""
    flow = GlowFlow(8, levels=2, depth=1, width=4).double()
    inner = flow.split.inner
    x = torch.randn(3, 8, generator=_gen(7), dtype=torch.float64)
    level0 = flow.step0(x)[0]
    z, _ = flow(x)
    torch.testing.assert_close(z[:, :4], level0[:, 4:])
    torch.testing.assert_close(z[:, 4:], inner(level0[:, :4])[0])


def test_file_names_are_the_first_releases():
    flow = GlowFlow(7, levels=2, depth=2, width=4)
    names = flow.file_names()
    assert set(names) == set(flow.state_dict())
    assert names["step0.actnorm.logs"] == "steps.0.0.actnorm.logs"
    assert names["step1.permutation.inv_perm"] == "steps.0.1.inv_perm"
    assert names["split.inner.step1.coupling.net.out.linear.bias"] == (
        "steps.1.1.coupling.net.out.linear.bias"
    )
    assert len(set(names.values())) == len(names)


def test_the_seed_draws_the_same_flow():
    def draw(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return GlowFlow(9, levels=2, depth=2, width=4).state_dict()

    a, b, c = draw(1), draw(1), draw(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_log_normal_is_the_standard_normal_density():
    z = np.array([[0.0, 0.0], [1.0, -2.0]])
    expected = [-math.log(2 * math.pi), -math.log(2 * math.pi) - 2.5]
    np.testing.assert_allclose(log_normal(z), expected)
    torch.testing.assert_close(log_normal(torch.from_numpy(z)), torch.tensor(expected).double())
