"""Saved calibrators stay readable and give the same numbers, and fits stay reproducible.

``tests/assets/calibrators/`` holds calibrators fitted and saved by flowsearch at commit
f95c3dd (before the flow was rebuilt from small steps), and ``expected.npz`` the outputs that
code gave for them: the float64 map, its inverse and the log-density, on fixed inputs. The
index of the first release (``tests/assets/index_v1/calibrator``) is checked the same way.

Every saved calibrator must load with today's code and give those numbers within 1e-6 (what
indexes in the field rely on: their calibrator files are read as they are). Refitting on the
same seeded data must give the same calibrator as then (see ``test_refit_gives_the_recorded_fit``
for the tolerance).

The fixture was written by ``python tests/test_calibrator_files.py --record`` at that commit; run
it again only to add a case, and say so in the commit.
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from flowsearch.calibration import load_calibrator, make_calibrator

ASSETS = Path(__file__).parent / "assets"
FILES = ASSETS / "calibrators"
EXPECTED = FILES / "expected.npz"

#: case -> (registry name, hyper-parameters, dim, fitted rows, constant dimensions)
CASES: dict[str, tuple[str, dict[str, Any], int, int, list[int]]] = {
    "flow": ("flow", {"levels": 2, "depth": 2, "width": 8, "epochs": 2.0, "seed": 3}, 10, 400, [4]),
    "flow-random": (
        "flow",
        {"levels": 3, "depth": 1, "width": 6, "permutation": "random", "batch_size": 32, "seed": 1},
        9,
        300,
        [],
    ),
    "whitening-flow": (
        "whitening-flow",
        {"levels": 2, "depth": 2, "width": 8, "seed": 2},
        10,
        400,
        [7],
    ),
    "whitening": ("whitening", {}, 8, 300, []),
    "whitening-k": ("whitening", {"k": 4, "power": 0.25, "shrinkage": 0.1}, 8, 300, []),
    "gaussian": ("gaussian", {"power": 0.25}, 8, 300, []),
    "sn": ("sn", {}, 8, 300, []),
    "natsv": ("natsv", {"k": 3}, 8, 300, []),
    "sn-natsv": ("sn-natsv", {"k": 2}, 8, 300, []),
    "none": ("none", {}, 8, 50, []),
}
#: The first release's index: its calibrator (a 32-d flow, levels 3 x depth 3, width 32).
INDEX_V1 = "index_v1"
INVERTIBLE = {"flow", "flow-random", "whitening-flow", "whitening", "gaussian", "sn", "none"}
DENSITY = {"flow", "flow-random", "whitening-flow", "gaussian", INDEX_V1}


def fit_data(case: str) -> np.ndarray:
    """The seeded vectors a case was fitted on: a rotated cone with a decaying spectrum."""
    _, _, dim, rows, constant = CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    q = np.linalg.qr(rng.normal(size=(dim, dim)))[0]
    U = (rng.normal(size=(rows, dim)) * np.geomspace(1.0, 0.02, dim)) @ q + 3.0 * q[0]
    U[:, constant] = 1e-32  # all-MiniLM-L6-v2 has three such dimensions
    return U


def eval_inputs(case: str, dim: int) -> np.ndarray:
    """Rows the outputs are recorded on: three fitted rows and one far outside the corpus."""
    rng = np.random.default_rng(1000 + sum(map(ord, case)))
    if case == INDEX_V1:
        return rng.normal(size=(4, dim))
    U = fit_data(case)
    return np.concatenate([U[:3], 3.0 * U[3:4] + rng.normal(size=(1, dim))])


def latent_inputs(case: str, dim: int) -> np.ndarray:
    """Points of the calibrated space the inverse is recorded on (standard normal)."""
    return np.random.default_rng(2000 + sum(map(ord, case))).normal(size=(3, dim))


def _folder(case: str) -> Path:
    return ASSETS / "index_v1" / "calibrator" if case == INDEX_V1 else FILES / case


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(EXPECTED, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("case", [*CASES, INDEX_V1])
def test_saved_calibrator_gives_the_recorded_numbers(case, expected):
    cal = load_calibrator(_folder(case))
    U = expected[f"{case}/inputs"]
    assert cal.dim_in == U.shape[1]
    np.testing.assert_allclose(cal.transform64(U), expected[f"{case}/transform"], rtol=0, atol=1e-6)
    # the public float32 map: the same, rounded to float32
    public = cal.transform(U)
    assert public.dtype == np.float32
    np.testing.assert_allclose(public, expected[f"{case}/transform"], rtol=1e-6, atol=1e-6)
    if case in INVERTIBLE or case == INDEX_V1:
        Z = expected[f"{case}/latent"]
        np.testing.assert_allclose(cal.inverse64(Z), expected[f"{case}/inverse"], rtol=0, atol=1e-6)
    if case in DENSITY:
        np.testing.assert_allclose(cal.log_prob(U), expected[f"{case}/log_prob"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_refit_gives_the_recorded_fit(case, expected):
    """Fitting the same seeded data gives the recorded calibrator again.

    The linear calibrators are closed forms (an SVD, means, deviations): float64 rounding only,
    so 1e-9. The flows train in float32 with Adam; the steps do the same float32 operations in
    the same order as before, so the fit is the same up to float32 rounding: 1e-5 on the
    float64 map (values of order 1-10), and on the log-density 1e-5 or 1e-7 of its size (its
    values reach -100 and more, where float32 rounding alone is 1e-5: seen with another build of
    the same torch, numpy 2.4 and transformers 5.24).
    """
    name, hyper, dim, _, _ = CASES[case]
    cal = make_calibrator(name, **hyper).fit(fit_data(case))
    U = expected[f"{case}/inputs"]
    tol = 1e-5 if "flow" in name else 1e-9
    np.testing.assert_allclose(cal.transform64(U), expected[f"{case}/transform"], rtol=0, atol=tol)
    if case in DENSITY:
        rtol = 1e-7 if "flow" in name else 0.0
        np.testing.assert_allclose(
            cal.log_prob(U), expected[f"{case}/log_prob"], rtol=rtol, atol=tol
        )
    saved = load_calibrator(_folder(case))
    assert cal.config == saved.config
    # written in the same form: the same arrays under the same names, with the same dtypes
    written = load_file(str(_folder(case) / "weights.safetensors"))
    assert {k: (v.dtype, v.shape) for k, v in cal.state().items()} == {
        k: (v.dtype, v.shape) for k, v in written.items()
    }
    fitted = {k: v for k, v in cal.fit_stats.items() if k != "seconds"}
    recorded = {k: v for k, v in saved.fit_stats.items() if k != "seconds"}
    assert fitted.keys() == recorded.keys()
    for key, value in recorded.items():
        assert math.isclose(fitted[key], value, rel_tol=1e-6, abs_tol=1e-6), key


def record() -> None:
    """Fit and save every case, and write ``expected.npz`` (run at the commit named above)."""
    out: dict[str, np.ndarray] = {}
    for case in [*CASES, INDEX_V1]:
        if case == INDEX_V1:
            cal = load_calibrator(_folder(case))
        else:
            name, hyper, _, _, _ = CASES[case]
            cal = make_calibrator(name, **hyper).fit(fit_data(case))
            shutil.rmtree(_folder(case), ignore_errors=True)
            cal.save(_folder(case))
            cal = load_calibrator(_folder(case))  # record what the saved files give
        assert cal.dim_in is not None
        U = eval_inputs(case, cal.dim_in)
        out[f"{case}/inputs"] = U
        out[f"{case}/transform"] = cal.transform64(U)
        if case in INVERTIBLE or case == INDEX_V1:
            Z = latent_inputs(case, cal.dim_in)
            out[f"{case}/latent"] = Z
            out[f"{case}/inverse"] = cal.inverse64(Z)
        if case in DENSITY:
            out[f"{case}/log_prob"] = cal.log_prob(U)
    np.savez_compressed(EXPECTED, **out)


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_calibrator_files.py --record")
    record()
