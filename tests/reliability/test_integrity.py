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

from .conftest import REPO, one_error_line, snapshot


def _segment_dir(index: Path) -> Path:
    return index / mf.read(index).segments[0].dir


def _flip(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _part(index: Path) -> Path:
    return _segment_dir(index) / mf.read(index).segments[0].parts[0].path


def _flip_part(index: Path) -> Path:
    _flip(_part(index))
    return _part(index)


def _flip_ann(index: Path) -> Path:
    path = _segment_dir(index) / mf.read(index).segments[0].ann.path
    _flip(path, at=len(path.read_bytes()) - 9)  # a vector's byte, not the header
    return path


def _flip_weights(index: Path) -> Path:
    path = index / mf.read(index).calibration.path / "weights.safetensors"
    _flip(path, at=len(path.read_bytes()) - 3)
    return path


def _flip_keys(index: Path) -> Path:
    path = _segment_dir(index) / "keys.npy"
    _flip(path, at=len(path.read_bytes()) - 2)  # an id's key: lookups by id would miss it
    return path


def _flip_deletions(index: Path) -> Path:
    from flowsearch.writes.delete import delete

    assert delete(index, ["d3", "d4"]).n_deleted == 2
    seg = mf.read(index).segments[0]
    path = index / seg.dir / seg.deletions
    _flip(path, at=len(path.read_bytes()) - 8)  # a deleted row's number: d3 would come back
    return path


def _truncate_part(index: Path) -> Path:
    path = _part(index)
    path.write_bytes(path.read_bytes()[:-100])
    return path


def _missing(index: Path) -> Path:
    path = _segment_dir(index) / "postings" / "vocab.json"
    path.unlink()
    return path


def _extra(index: Path) -> Path:
    path = _segment_dir(index) / "rows-00099.parquet"
    shutil.copy(_part(index), path)
    return path


def _extra_pickle_in_postings(index: Path) -> Path:
    path = _segment_dir(index) / "postings" / "state.pkl"
    path.write_bytes(pickle.dumps({"rows": 1}))
    return path


def _hand_edit(index: Path) -> Path:
    path = index / "manifest.json"
    text = path.read_text()
    assert '"n_rows": 60' in text
    path.write_text(text.replace('"n_rows": 60', '"n_rows": 61', 1))
    return path


def _garbled_history(index: Path) -> Path:
    path = index / "history.jsonl"
    path.write_text('{"version": 1, "kind": "build"}\n{"not": "a record"}\n')
    return path


def _history_ahead(index: Path) -> Path:
    path = index / "history.jsonl"
    line = json.loads(path.read_text().splitlines()[-1])
    with open(path, "a") as handle:  # a write the manifest never published
        handle.write(json.dumps({**line, "version": line["version"] + 5}) + "\n")
    return path


#: (damage, caught only with verify): checksums of large files and the history log are read
#: with verify; sizes, the file list and the manifest's own checksum on every open.
DAMAGE = {
    "flipped byte in a rows part": (_flip_part, True),
    "flipped byte in ann.faiss": (_flip_ann, True),
    "flipped byte in the calibrator's weights": (_flip_weights, True),
    "flipped byte in the id keys": (_flip_keys, True),
    "flipped byte in a deletion file": (_flip_deletions, True),
    "truncated rows part": (_truncate_part, False),
    "missing file": (_missing, False),
    "manifest edited by hand": (_hand_edit, False),
    "a line of the history that is not a record": (_garbled_history, True),
    "a history ahead of the manifest": (_history_ahead, True),
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
    if path.name == "history.jsonl":  # the log is never parsed on open: search goes on
        Searcher.open(index, encoder=encoder).close()
        assert cli.run("info", "--index", index).code == 0


@pytest.mark.parametrize("stray", [_extra, _extra_pickle_in_postings])
def test_a_stray_is_no_damage_search_ignores_it_the_next_write_removes_it(
    stray, cli, index, encoder
):
    """A file no version names (a copied part, a pickle) is never read (nor unpickled):
    `info --verify` warns of it, search answers, the next write removes it."""
    path = stray(index)
    Searcher.open(index, verify=True, encoder=encoder).close()
    result = cli.run("info", "--verify", "--index", index)
    assert result.code == 0 and "stray file" in result.err and path.name in result.err
    assert cli.run("delete", "d1", "--index", index).code == 0
    assert not path.exists()
    Searcher.open(index, verify=True, encoder=encoder).close()


def _leave(raw: dict, field: str) -> None:
    seg = raw["segments"][0]
    if field == "part":
        seg["parts"][0]["path"] = "../../../etc/passwd"
    elif field == "segment dir":
        seg["dir"] = "../../../etc"
    elif field == "calibrator dir":
        raw["calibration"]["path"] = "../../../etc"
    elif field == "ann file":
        seg["files"]["../../../etc/passwd"] = seg["files"].pop(seg["ann"]["path"])
        seg["ann"]["path"] = "../../../etc/passwd"
    elif field == "deletion file":
        seg["deletions"] = "../../../etc/passwd"
    elif field in ("postings", "keys"):
        seg[field] = "/etc"
    else:
        raise AssertionError(field)


@pytest.mark.parametrize(
    "field",
    ["part", "segment dir", "calibrator dir", "ann file", "deletion file", "postings", "keys"],
)
def test_manifest_path_leaving_the_index_is_refused_by_the_cli(cli, index, field):
    """A manifest whose checksum was recomputed (a crafted one) but which points at ``../``:
    refused before any file is read, by readers and writers alike."""
    path = index / "manifest.json"
    raw = json.loads(path.read_text())
    _leave(raw, field)
    raw["checksum"] = mf.checksum(raw)
    path.write_text(json.dumps(raw))
    before = snapshot(index)
    for args in (["info"], ["query", "the cat"], ["delete", "d1"], ["compact"]):
        result = cli.run(*args, "--index", index)
        one_error_line(result)
        assert "leaves the index" in result.err or "outside" in result.err, result.err
    assert snapshot(index) == before


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
def test_an_odd_part_name_is_no_traceback(cli, index, corpora, name):
    """A rows part whose name the writer would not give (a crafted, consistent manifest):
    reads work, and a write either works or fails in one line."""
    segment = _segment_dir(index)
    path = index / "manifest.json"
    raw = json.loads(path.read_text())
    seg = raw["segments"][0]
    old = seg["parts"][0]["path"]
    (segment / old).rename(segment / name)
    seg["parts"][0]["path"] = name
    seg["files"][name] = seg["files"].pop(old)
    raw["checksum"] = mf.checksum(raw)
    path.write_text(json.dumps(raw))
    result = cli.run("query", "the cat", "--index", index, "--json")
    assert result.code == 0, result.err
    result = cli.run("add", corpora["more"], "--index", index)
    assert "Traceback" not in result.err, result.err
    if result.code != 0:
        one_error_line(result)
    Searcher.open(index, verify=True)


def test_a_write_after_a_damaged_history_is_one_line(cli, index):
    """A history whose last line is not a record (edited by hand): `info --verify` names it,
    and a write is refused in one line naming it, the index unchanged (or goes on, the log
    repaired); never a traceback."""
    path = _garbled_history(index)
    before = snapshot(index)
    result = cli.run("delete", "d1", "--index", index)
    assert "Traceback" not in result.err, result.err[-3000:]
    if result.code != 0:
        one_error_line(result)
        assert path.name in result.err
        assert snapshot(index) == before


@pytest.mark.parametrize("damage", [_missing, _truncate_part])
def test_a_write_does_not_start_over_a_missing_or_resized_file(damage, cli, index):
    """A delete reads neither the vector index nor the postings, yet the version it would
    publish keeps them: it refuses, naming the file, and publishes nothing."""
    path = damage(index)
    before = snapshot(index)
    result = cli.run("delete", "d1", "--index", index)
    one_error_line(result)
    assert path.name in result.err and "rebuild" in result.err
    assert snapshot(index) == before  # not even a deletion file
