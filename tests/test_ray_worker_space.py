"""The calibrators a Ray worker keeps loaded: one per distinct calibrator, reused, bounded."""

from __future__ import annotations

import threading

import numpy as np

from flowsearch.calibration.linear import Whitening
from flowsearch.storage.manifest import CalibrationSpec
from flowsearch.writes import ray_engine


def _spec(name: str) -> CalibrationSpec:
    return CalibrationSpec(name=name, calibrator="whitening", space="calibrated")


def test_worker_space_is_loaded_once_per_calibrator_and_bounded() -> None:
    ray_engine._SPACES.clear()
    U = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32)
    files = ray_engine._calibrator_bytes(Whitening().fit(U))
    first = ray_engine._worker_space(files, _spec("a"))
    assert ray_engine._worker_space(files, _spec("a")) is first
    Z, _ = first.project(U)
    want = Whitening().fit(U).transform(U)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    assert np.allclose(Z, want, atol=1e-5)  # the loaded calibrator is the saved one
    # a different spec is a different entry; the oldest goes past the bound
    for i in range(ray_engine.WORKER_SPACES + 2):
        ray_engine._worker_space(files, _spec(f"s{i}"))
    assert len(ray_engine._SPACES) == ray_engine.WORKER_SPACES
    assert ray_engine._worker_space(files, _spec("a")) is not first


def test_worker_space_loads_once_under_threads() -> None:
    ray_engine._SPACES.clear()
    U = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32)
    files = ray_engine._calibrator_bytes(Whitening().fit(U))
    got: list[object] = []
    threads = [
        threading.Thread(target=lambda: got.append(ray_engine._worker_space(files, _spec("t"))))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(got) == 8 and all(g is got[0] for g in got)
