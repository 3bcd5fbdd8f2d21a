"""The flow restored from its saved arrays without torch is the torch flow's own frozen form:
the same layout, the same arrays under the same names, the same numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flowsearch.calibration import load_calibrator
from flowsearch.calibration.glow import GlowFlow
from flowsearch.calibration.glowmath import frozen_flow, saved_spec
from flowsearch.calibration.trainable import to_saved

ASSETS = Path(__file__).parent / "assets"

#: name -> GlowFlow(dim, levels, depth, width, permutation)
FLOWS = {
    "reference": (7, 3, 2, 4, "reverse"),
    "deeper-than-halvings": (3, 4, 1, 4, "reverse"),
    "one-channel": (1, 2, 2, 4, "reverse"),
    "random": (8, 2, 2, 4, "random"),
}


def perturbed(name: str) -> tuple[GlowFlow, np.ndarray]:
    """The flow in float64, initialised on a batch as a fit starts, then every parameter moved
    off its value (so that zero-initialised couplings act); and that batch."""
    dim, levels, depth, width, permutation = FLOWS[name]
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    flow = GlowFlow(dim, levels, depth, width, permutation, gen).double()
    x = torch.randn(40, dim, generator=gen, dtype=torch.float64)
    flow.initialize(x)
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return flow, x.numpy()


@pytest.mark.parametrize("name", FLOWS)
def test_saved_spec_lists_the_modules_arrays(name):
    dim, levels, depth, width, _ = FLOWS[name]
    flow, _ = perturbed(name)
    saved = to_saved(flow)
    specs = saved_spec(dim, levels, depth, width)
    assert {k: (v.shape, str(v.dtype)) for k, v in saved.items()} == {
        k: (s.shape, s.dtype) for k, s in specs.items()
    }


@pytest.mark.parametrize("name", FLOWS)
def test_frozen_from_arrays_equals_the_modules_frozen_form(name):
    dim, levels, depth, width, _ = FLOWS[name]
    flow, x = perturbed(name)
    restored = frozen_flow(to_saved(flow, np.float64), dim, levels, depth, width)
    y, ladj = restored(x)
    y_module, ladj_module = flow.freeze()(x)
    np.testing.assert_allclose(y, y_module, rtol=1e-12, atol=1e-12)
    assert float(ladj) == pytest.approx(float(ladj_module), abs=1e-12)
    with torch.no_grad():
        y_torch, ladj_torch = flow(torch.from_numpy(x))
    np.testing.assert_allclose(y, y_torch.numpy(), rtol=1e-12, atol=1e-12)
    assert float(ladj) == pytest.approx(float(ladj_torch), abs=1e-12)
    np.testing.assert_allclose(restored.inverse(y), x, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    "folder",
    [
        ASSETS / "calibrators" / "flow",
        ASSETS / "calibrators" / "flow-random",
        ASSETS / "calibrators" / "whitening-flow",
        ASSETS / "index_v1" / "calibrator",
    ],
    ids=lambda p: p.parent.name if p.name == "calibrator" else p.name,
)
def test_a_loaded_flow_runs_what_its_torch_module_computes(folder):
    """Loading restores the frozen form from the arrays (no module); the module, built on
    demand from the same arrays, computes the same map and log-determinant."""
    cal = load_calibrator(folder)
    assert cal._module is None  # nothing of torch was built to load it
    U = np.random.default_rng(0).normal(size=(6, cal.dim_in))
    z, lp = cal.transform_and_log_prob(U)
    on_file = cal.state()
    with torch.no_grad():
        z_torch, ladj = cal.torch_forward(torch.from_numpy(U))  # builds the module
    assert cal._module is not None
    np.testing.assert_allclose(cal._transform(U), z_torch.numpy(), rtol=1e-12, atol=1e-10)
    log_normal = -0.5 * ((z_torch**2).sum(1) + cal.dim_in * np.log(2 * np.pi))
    np.testing.assert_allclose(lp, (log_normal + ladj).numpy(), rtol=1e-12, atol=1e-9)
    # the arrays it would save are the same, from the file or from the module
    from_module = cal.state()
    assert on_file.keys() == from_module.keys()
    for key, value in on_file.items():
        np.testing.assert_array_equal(from_module[key], value, err_msg=key)
        assert from_module[key].dtype == value.dtype, key
    # and the frozen form rebuilt from the module is the one loading gave
    cal._assemble()
    np.testing.assert_array_equal(cal.transform_and_log_prob(U)[1], lp)
    np.testing.assert_array_equal(cal.transform_and_log_prob(U)[0], z)
