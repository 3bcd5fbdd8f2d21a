"""Malformed calibrator directories (issue 25): each one raises one line naming the file, what
is wrong and the fix, as a FlowsearchError subclass, never a KeyError or a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from flowsearch.calibration import load_calibrator, make_calibrator
from flowsearch.errors import BadInput, FlowsearchError, NotFound
from flowsearch.storage.layout import calibrator_dir

CONFIG, WEIGHTS = "config.json", "weights.safetensors"
FLOW = {"levels": 2, "depth": 1, "width": 4}


@pytest.fixture(scope="module")
def U() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 8)) @ rng.normal(size=(8, 8)) + 1.0


@pytest.fixture(scope="module")
def saved(U, tmp_path_factory) -> Callable[[str], Path]:
    """A fresh copy of a calibrator saved by the current code, per registry name."""
    import shutil

    root = tmp_path_factory.mktemp("saved")
    fits = {"whitening": {}, "natsv": {"k": 3}, "flow": FLOW, "whitening-flow": FLOW}
    for name, hyper in fits.items():
        make_calibrator(name, **hyper).fit(U).save(root / name)
    counter = iter(range(10_000))

    def copy(name: str) -> Path:
        return Path(shutil.copytree(root / name, root / f"copy{next(counter)}"))

    return copy


def _config(folder: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    meta = json.loads((folder / CONFIG).read_text())
    changed = change(meta)
    (folder / CONFIG).write_text(json.dumps(meta if changed is None else changed))


def _weights(folder: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    tensors = load_file(str(folder / WEIGHTS))
    change(tensors)
    save_file(tensors, str(folder / WEIGHTS))


def _check(folder: Path, kind: type[FlowsearchError], file: str, *fragments: str) -> None:
    with pytest.raises(FlowsearchError) as info:
        load_calibrator(folder)
    err = info.value
    message = str(err)
    assert type(err) is kind, message
    assert "\n" not in message and str(folder / file) in message, message
    for fragment in fragments:
        assert fragment in message, message
    if kind is BadInput:
        assert err.param == "calibrator"
        assert "--calibrator" in err.render("cli") and "save it again" in message
        assert "Calibrator.save" not in err.render("cli") and "save it" not in err.render("cli")


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def change(meta: dict[str, Any]) -> None:
        del meta[key]

    return change


# (case, calibrator, mutation, fragments of the message)
CONFIG_CASES: list[tuple[str, str, Callable[[dict[str, Any]], Any], tuple[str, ...]]] = [
    ("only a version", "whitening", lambda m: {"format_version": 1}, ("key 'name' is missing",)),
    ("no dim_in", "whitening", _drop("dim_in"), ("key 'dim_in' is missing",)),
    ("no config", "whitening", _drop("config"), ("key 'config' is missing",)),
    ("no version", "whitening", _drop("format_version"), ("'format_version' is None",)),
    ("version text", "whitening", lambda m: m.update(format_version="1"), ("not an integer",)),
    ("a list", "whitening", lambda m: [m], ("not a JSON object",)),
    ("unknown name", "whitening", lambda m: m.update(name="pca"), ("unknown calibrator 'pca'",)),
    ("name a number", "whitening", lambda m: m.update(name=5), ("'name' is 5, not a string",)),
    ("dim_in zero", "whitening", lambda m: m.update(dim_in=0), ("not a positive integer",)),
    ("dim_in text", "whitening", lambda m: m.update(dim_in="8"), ("not a positive integer",)),
    ("dim_in true", "whitening", lambda m: m.update(dim_in=True), ("not a positive integer",)),
    ("config a list", "whitening", lambda m: m.update(config=[1]), ("'config' is [1]",)),
    ("fit_stats text", "whitening", lambda m: m.update(fit_stats="x"), ("'fit_stats' is 'x'",)),
    ("unknown option", "whitening", lambda m: m["config"].update(colour=1), ("bad 'config'",)),
    ("bad option value", "whitening", lambda m: m["config"].update(k=0), ("k must be",)),
    ("flow option", "flow", lambda m: m["config"].update(levels="3"), ("levels must be",)),
]


@pytest.mark.parametrize(
    "case, name, change, fragments", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES]
)
def test_malformed_config(saved, case, name, change, fragments):
    folder = saved(name)
    _config(folder, change)
    _check(folder, BadInput, CONFIG, *fragments)


def test_config_not_json_nor_text(saved):
    folder = saved("whitening")
    (folder / CONFIG).write_text('{"format_version": 1,')
    _check(folder, BadInput, CONFIG, "not JSON")
    (folder / CONFIG).write_bytes(b"\xff\xfe\x00garbage")
    _check(folder, BadInput, CONFIG, "not JSON")


def test_newer_format_says_upgrade(saved):
    folder = saved("whitening")
    _config(folder, lambda m: m.update(format_version=2))
    with pytest.raises(BadInput, match="format version 2 is newer.*upgrade flowsearch"):
        load_calibrator(folder)


def _set(key: str, value: Any) -> Callable[[dict[str, np.ndarray]], None]:
    return lambda t: t.__setitem__(key, value)


def _nan(key: str) -> Callable[[dict[str, np.ndarray]], None]:
    def change(tensors: dict[str, np.ndarray]) -> None:
        tensors[key] = tensors[key].copy()
        tensors[key].flat[0] = np.nan

    return change


def _first(prefix: str, suffix: str) -> Callable[[dict[str, np.ndarray]], str]:
    return lambda t: next(k for k in sorted(t) if k.startswith(prefix) and k.endswith(suffix))


WEIGHT_CASES: list[tuple[str, str, Callable[[dict[str, np.ndarray]], None], tuple[str, ...]]] = [
    ("missing", "whitening", lambda t: t.pop("rotation"), ("tensor 'rotation' is missing",)),
    ("extra", "whitening", _set("W", np.eye(8)), ("unexpected tensor 'W'",)),
    ("ill-shaped", "whitening", _set("rotation", np.eye(8)[:, :7].copy()), ("shape (8, 7)",)),
    ("wrong dtype", "whitening", _set("mu", np.zeros(8, np.float32)),
     ("is float32, expected float64",)),
    ("non-finite", "whitening", _nan("scales"), ("tensor 'scales' has NaN",)),
    ("zero scale", "whitening", _set("scales", np.zeros(8)), ("values <= 0",)),
    ("natsv shape", "natsv", _set("directions", np.zeros((8, 4))), ("expected (8, 3)",)),
    ("flow tensor missing", "flow", lambda t: t.pop("flow.steps.1.0.actnorm.logs"),
     ("'flow.steps.1.0.actnorm.logs' is missing",)),
    ("flow float64", "flow", lambda t: t.update({"flow.steps.0.0.actnorm.bias": np.zeros(8)}),
     ("is float64, expected float32",)),
    ("flow nan", "flow", _nan("flow.steps.0.0.coupling.net.fc1.weight"), ("has NaN",)),
    ("not a permutation", "flow", _set("flow.steps.0.0.perm", np.zeros(8, np.int64)),
     ("not a permutation",)),
    ("wrong inverse", "flow", _set("flow.steps.0.0.inv_perm", np.arange(8, dtype=np.int64)),
     ("not the inverse",)),
    ("active not int", "flow", _set("active", np.arange(8.0)), ("'active'", "int64")),
    ("dims not split", "flow", _set("active", np.arange(1, 9, dtype=np.int64)),
     ("do not split 0..7",)),
    ("whitening front missing", "whitening-flow", lambda t: t.pop("whiten.rotation"),
     ("'whiten.rotation' is missing",)),
    ("whitening front of another dim", "whitening-flow", _set("whiten.mu", np.zeros(7)),
     ("'whiten.mu' has shape (7,), expected (8,)",)),
]  # fmt: skip


@pytest.mark.parametrize(
    "case, name, change, fragments", WEIGHT_CASES, ids=[c[0] for c in WEIGHT_CASES]
)
def test_malformed_weights(saved, case, name, change, fragments):
    folder = saved(name)
    _weights(folder, change)
    _check(folder, BadInput, WEIGHTS, *fragments)


@pytest.mark.parametrize(
    "name, change, fragment",
    [
        ("whitening", {"dim_in": 9}, "expected (9,)"),  # weights of 8 dimensions
        ("whitening", {"config": {"k": 10}}, "k=10 exceeds dim_in=8"),
        ("natsv", {"config": {"k": 8}}, "expected (8, 8)"),
        ("flow", {"dim_in": 9}, "do not split 0..8"),
        ("flow", {"config": {**FLOW, "levels": 3}}, "is missing"),  # a level more than saved
        ("flow", {"config": {**FLOW, "prewhiten": True}}, "'whiten.mu' is missing"),
        ("whitening-flow", {"config": {**FLOW, "width": 5}}, "expected (5, 4)"),
    ],
)
def test_weights_that_disagree_with_the_config(saved, name, change, fragment):
    folder = saved(name)

    def edit(meta: dict[str, Any]) -> None:
        meta["dim_in"] = change.get("dim_in", meta["dim_in"])
        meta["config"].update(change.get("config", {}))

    _config(folder, edit)
    _check(folder, BadInput, WEIGHTS, fragment)


def test_garbage_weights(saved):
    folder = saved("whitening")
    (folder / WEIGHTS).write_bytes(b"garbage")
    _check(folder, BadInput, WEIGHTS, "unreadable")


@pytest.mark.parametrize("missing", ["directory", CONFIG, WEIGHTS])
def test_missing_directory_or_file(saved, tmp_path, missing):
    folder = tmp_path / "nowhere" if missing == "directory" else saved("whitening")
    if missing != "directory":
        (folder / missing).unlink()
    with pytest.raises(NotFound, match="no saved calibrator") as info:
        load_calibrator(folder)
    assert str(folder) in str(info.value) and "\n" not in str(info.value)
    assert info.value.param == "calibrator" and "--calibrator" in info.value.render("cli")
    # the folder the advice points at is where an index keeps its calibrator
    where = calibrator_dir(1)
    assert where.startswith("calibrators/")
    assert all(where in info.value.render(surface) for surface in ("python", "cli"))


def test_a_file_beside_the_two_is_refused(saved):
    folder = saved("whitening")
    (folder / "weights.pt").write_bytes(b"\x80\x04")
    with pytest.raises(BadInput, match="unexpected file 'weights.pt'") as info:
        load_calibrator(folder)
    assert info.value.param == "calibrator"
    assert load_calibrator(saved("whitening")).dim_in == 8  # a clean copy still loads


def test_an_index_whose_calibrator_is_malformed_is_damaged_not_bad_input(tmp_path, model_dir):
    """The calibrator of an index is not the user's input: a malformed one is IndexDamaged
    (exit 2, HTTP 500) with the index's fix, and the files stay as they were. Opening an index
    notices the change by its recorded size and hash; a calibrator read without that check (a
    Ray worker's copy) is judged by its own contents."""
    from corpus_helpers import write_corpus

    from flowsearch.errors import IndexDamaged
    from flowsearch.search.searcher import Searcher
    from flowsearch.space.search_space import load_index_calibrator
    from flowsearch.storage import manifest as mf
    from flowsearch.writes.build import build_index

    corpus = write_corpus(tmp_path / "c.parquet", n=60, seed=1)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), calibration="whitening")
    folder = tmp_path / "idx" / mf.read(tmp_path / "idx").calibration.path
    (folder / "config.json").write_text('{"name": "whitening"')  # truncated
    before = (folder / "config.json").read_bytes()
    with pytest.raises(IndexDamaged, match="config.json") as caught:
        Searcher.open(tmp_path / "idx")
    assert "rebuild" in caught.value.render("cli")
    assert (folder / "config.json").read_bytes() == before
    with pytest.raises(IndexDamaged, match="calibrator is unusable.*config.json") as caught:
        load_index_calibrator(folder)
    assert "rebuild" in caught.value.render("cli")
