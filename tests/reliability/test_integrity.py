"""Integrity: every kind of damage to a stored index is caught, in one line naming the file, by
``flowsearch info --verify`` (exit 2) and ``Searcher.open(verify=True)``; opening without
verify still checks sizes and the manifest's own checksum; nothing is ever unpickled."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from flowsearch import load_calibrator, make_calibrator
from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.storage import manifest as mf

from .conftest import REPO, one_error_line


def _version_dir(index: Path) -> Path:
    return index / mf.read(index).root


def _flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _shard(index: Path) -> Path:
    return _version_dir(index) / mf.read(index).shards[0].path


def _flip_shard(index: Path) -> Path:
    _flip(_shard(index))
    return _shard(index)


def _flip_faiss(index: Path) -> Path:
    path = _version_dir(index) / "index.faiss"
    _flip(path, at=len(path.read_bytes()) - 9)  # a vector's byte, not the header
    return path


def _flip_weights(index: Path) -> Path:
    path = _version_dir(index) / "calibrator" / "weights.safetensors"
    _flip(path, at=len(path.read_bytes()) - 3)
    return path


def _truncate_shard(index: Path) -> Path:
    path = _shard(index)
    path.write_bytes(path.read_bytes()[:-100])
    return path


def _missing(index: Path) -> Path:
    path = _version_dir(index) / "lexical" / "vocab.json"
    path.unlink()
    return path


def _extra(index: Path) -> Path:
    path = _version_dir(index) / "shards" / "part-00099.parquet"
    shutil.copy(_shard(index), path)
    return path


def _extra_pickle_in_lexical(index: Path) -> Path:
    path = _version_dir(index) / "lexical" / "state.pkl"
    path.write_bytes(pickle.dumps({"rows": 1}))
    return path


def _hand_edit(index: Path) -> Path:
    path = index / "manifest.json"
    path.write_text(path.read_text().replace('"rows": 60', '"rows": 61', 1))
    return path


DAMAGE = {
    "flipped byte in a shard": (_flip_shard, True),
    "flipped byte in index.faiss": (_flip_faiss, True),
    "flipped byte in the calibrator's weights": (_flip_weights, True),
    "truncated shard": (_truncate_shard, False),
    "missing file": (_missing, False),
    "extra file": (_extra, False),
    "pickle in the lexical dir": (_extra_pickle_in_lexical, False),
    "manifest edited by hand": (_hand_edit, False),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_one_line_naming_the_file(kind, cli, index, encoder):
    damage, needs_verify = DAMAGE[kind]
    path = damage(index)
    name = re.escape(path.name)
    with pytest.raises(FlowsearchError, match=name) as caught:
        Searcher.open(index, verify=True, encoder=encoder)
    assert "\n" not in str(caught.value)
    result = cli.run("info", "--verify", "--index", index)
    one_error_line(result)
    assert path.name in result.err
    if not needs_verify:  # sizes, the file list and the manifest's checksum are always checked
        with pytest.raises(FlowsearchError, match=name):
            Searcher.open(index, encoder=encoder)
        one_error_line(cli.run("info", "--index", index))


def test_manifest_path_leaving_the_index_is_refused_by_the_cli(cli, index):
    """A manifest whose checksum was recomputed (a crafted one) but whose shard path is
    ``../``: refused before any file is read."""
    path = index / "manifest.json"
    raw = json.loads(path.read_text())
    raw["shards"][0]["path"] = "../../../etc/passwd"
    raw["checksum"] = mf._checksum(raw)
    path.write_text(json.dumps(raw))
    for args in (["info"], ["query", "the cat"], ["delete", "d1"], ["compact"]):
        result = cli.run(*args, "--index", index)
        one_error_line(result)
        assert "leaves the index" in result.err or "outside" in result.err, result.err


def test_checksum_of_the_manifest_itself_is_checked_without_verify(index, encoder):
    path = index / "manifest.json"
    raw = json.loads(path.read_text())
    raw["calibration"]["space"] = "encoder" if raw["calibration"]["space"] != "encoder" else "x"
    path.write_text(json.dumps(raw))
    with pytest.raises(FlowsearchError, match="manifest.json.*checksum"):
        Searcher.open(index, encoder=encoder)


# -- nothing is unpickled ----------------------------------------------------------------------


@pytest.fixture()
def saved_calibrator(tmp_path) -> Path:
    out = tmp_path / "cal"
    make_calibrator("whitening").fit(np.random.default_rng(0).normal(size=(50, 4))).save(out)
    return out


def test_a_calibrator_dir_of_pickles_is_refused(tmp_path):
    import torch

    folder = tmp_path / "pickled"
    folder.mkdir()
    torch.save({"W": torch.eye(4)}, folder / "weights.pt")
    (folder / "calibrator.pkl").write_bytes(pickle.dumps({"W": np.eye(4)}))
    with pytest.raises(FlowsearchError, match="no saved calibrator"):
        load_calibrator(folder)


@pytest.mark.parametrize("name", ["weights.pt", "weights.bin", "state.pkl", "anything"])
def test_a_pickle_beside_a_calibrator_is_refused(saved_calibrator, name):
    import torch

    if name.endswith((".pt", ".bin")):
        torch.save({"W": torch.eye(4)}, saved_calibrator / name)
    else:
        (saved_calibrator / name).write_bytes(pickle.dumps({"W": np.eye(4)}))
    with pytest.raises(FlowsearchError, match=re.escape(name)):
        load_calibrator(saved_calibrator)


def test_a_clean_calibrator_still_loads(saved_calibrator):
    assert load_calibrator(saved_calibrator).dim_in == 4


def test_the_package_never_unpickles():
    """No pickle.load, torch.load, np.load without allow_pickle=False, or remote code on by
    default, anywhere in the package."""
    banned = re.compile(
        r"pickle\.loads?\(|import pickle|torch\.load\(|allow_pickle\s*=\s*True|joblib|"
        r"trust_remote_code\s*=\s*True|weights_only\s*=\s*False"
    )
    np_load = re.compile(r"np\.load\((?![^)]*allow_pickle=False)")
    found = []
    for path in sorted((REPO / "flowsearch").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if banned.search(line) or np_load.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("name", ["part-x.parquet", "garbage.parquet", "part-.parquet"])
def test_an_odd_shard_name_is_no_traceback(cli, index, corpora, name):
    """A shard whose name the writer would not give (a crafted, consistent manifest): reads
    work, and a write either works or fails in one line."""
    version = _version_dir(index)
    path = index / "manifest.json"
    raw = json.loads(path.read_text())
    old = raw["shards"][0]["path"]
    new = f"shards/{name}"
    (version / old).rename(version / new)
    raw["shards"][0]["path"] = new
    raw["files"][new] = raw["files"].pop(old)
    raw["checksum"] = mf._checksum(raw)
    path.write_text(json.dumps(raw))
    result = cli.run("query", "the cat", "--index", index, "--json")
    assert result.code == 0, result.err
    result = cli.run("add", corpora["more"], "--index", index)
    assert "Traceback" not in result.err, result.err
    if result.code != 0:
        one_error_line(result)
    Searcher.open(index, verify=True)
