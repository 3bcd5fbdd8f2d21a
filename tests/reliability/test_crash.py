"""Crash safety: writes killed (SIGKILL, SIGINT) at random moments leave the previous version (or
the new one, once published) whole, verifiable and answering as before; the next write cleans up.

Every write command runs as a real process (forked from a server that has torch imported, see
``forkserver.py``). There is no stage hook in the library, so each command's run is measured once
while the index directory is polled (what its build directory holds tells the stage), and the
kill delays are drawn, seeded, inside each measured stage window in turn. The stage a kill really
landed in is read from the directory afterwards and reported.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from flowsearch.writes.rewrite import delete

from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.storage import directory as directory
from flowsearch.storage import manifest as mf
from flowsearch.writes.build import build_index

from .conftest import answers, answers_of, leftovers

#: kill trials per command (>= 20 in all)
TRIALS = {"index": 6, "add": 4, "upsert": 4, "delete": 3, "compact": 3, "recalibrate": 3}
LANDED: collections.Counter = collections.Counter()
ORDER = [
    "startup",
    "started",
    "encoding",
    "fitting",
    "shards",
    "faiss",
    "lexical",
    "publishing",
    "published",
]


def stage(index: Path, base_version: int) -> str:
    """Where a write to ``index`` (from ``base_version``) is, from what is on disk."""
    try:
        version = mf.read(index).version
    except FlowsearchError:
        version = 0
    if version > base_version:
        return "published"
    versions = index / "versions"
    if (versions / f"v{base_version + 1:06d}").exists():
        return "publishing"
    builds = list(versions.glob(".build-*")) if versions.is_dir() else []
    if not builds:
        return "startup"
    build = builds[0]
    names = {p.name for p in build.iterdir()} if build.exists() else set()
    if "lexical" in names:
        return "lexical"
    if "index.faiss" in names:
        return "faiss"
    if names & {"shards", "calibrator", "tombstones.npy"} or any("tomb" in n for n in names):
        return "shards"
    raw = build / "_work" / "raw.f32"
    if raw.exists():
        return "fitting" if raw.stat().st_size else "encoding"
    return "started"  # a build directory, nothing in it yet (add/upsert: encoding)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def bases(tmp_path_factory, built) -> dict[str, Path]:
    """The index each command starts from (compact: one with deleted rows)."""
    root = tmp_path_factory.mktemp("bases")
    plain = root / "plain"
    shutil.copytree(built, plain)
    deleted = root / "deleted"
    shutil.copytree(built, deleted)
    delete(deleted, [f"d{i}" for i in range(40, 50)])
    return {"plain": plain, "deleted": deleted}


def _commands(corpora, model_dir) -> dict[str, tuple[str, list[str]]]:
    return {
        "index": (
            "plain",
            [
                "index",
                corpora["more"],
                "--model",
                model_dir,
                "--calibration",
                "flow",
                "--overwrite",
            ],
        ),  # fmt: skip
        "add": ("plain", ["add", corpora["more"]]),
        "upsert": ("plain", ["upsert", corpora["changed"]]),
        "delete": ("plain", ["delete", "d1", "d2", "d3"]),
        "compact": ("deleted", ["compact"]),
        "recalibrate": ("plain", ["recalibrate", "--calibration", "whitening"]),
    }


def _measure(
    cli, args: list[str], index: Path, base_version: int
) -> list[tuple[str, float, float]]:
    """Run once to completion, polling: [(stage, first seen, last seen)] in seconds from start."""
    started = cli.start(*args, "--index", index)
    t0 = time.perf_counter()
    seen: dict[str, list[float]] = {}
    while not _is_zombie(started[0]):
        now = time.perf_counter() - t0
        seen.setdefault(stage(index, base_version), [now, now])[1] = now
        time.sleep(0.001)
    total = time.perf_counter() - t0
    result = cli.wait(started)
    assert result.code == 0, result.err
    windows = sorted((t[0], t[1], name) for name, t in seen.items() if name != "published")
    print(
        "measured:", ", ".join(f"{n} {a:.3f}-{b:.3f}s" for a, b, n in windows), f"of {total:.3f}s"
    )
    out = []
    for i, (first, last, name) in enumerate(windows):
        end = windows[i + 1][0] if i + 1 < len(windows) else total
        out.append((name, first, max(last, end)))
    return out


def _check_after(
    index: Path, base_version: int, old: list, new: list, encoder, landed: str
) -> None:
    """The guarantees after a kill (see the module docstring)."""
    version = mf.read(index).version
    assert version in (base_version, base_version + 1), version
    if landed == "published":
        assert version == base_version + 1
    searcher = Searcher.open(index, verify=True, encoder=encoder)
    try:
        got = answers(searcher)
    finally:
        searcher.close()
    assert got == (old if version == base_version else new), landed
    root = mf.read(index).root
    for junk in (index / "versions").iterdir():
        if f"versions/{junk.name}" != root:
            assert not mf.is_index_dir(junk)  # no leftover looks like an index
    # the next write succeeds, removes what the killed one left, and verifies
    gone = got[0][0][0]
    assert delete(index, [gone]).deleted == 1
    assert not list((index / "versions").glob(".build-*"))
    assert leftovers(index) == []
    assert not [p for p in index.iterdir() if p.name.startswith(".manifest.json.tmp")]
    directory.verify(index, mf.read(index), checksums=True)


@pytest.mark.parametrize("command", list(TRIALS))
def test_sigkill_at_random_moments(command, cli, bases, corpora, model_dir, encoder, tmp_path):
    source_key, args = _commands(corpora, model_dir)[command]
    base = bases[source_key]
    base_version = mf.read(base).version
    old = answers_of(base, encoder)

    measured = tmp_path / "measured"
    shutil.copytree(base, measured)
    windows = _measure(cli, args, measured, base_version)
    new = answers_of(measured, encoder, verify=True)
    assert new != old or command == "compact"

    rng = np.random.default_rng(sorted(TRIALS).index(command))
    for trial in range(TRIALS[command]):
        name, lo, hi = windows[trial % len(windows)]
        delay = float(rng.uniform(0, hi - lo))
        index = tmp_path / f"trial{trial}"
        shutil.copytree(base, index)
        started = cli.start(*args, "--index", index)
        # wait until the write reaches the aimed stage (or later), then a random part of it
        while ORDER.index(stage(index, base_version)) < ORDER.index(name):
            if _is_zombie(started[0]):
                break
            time.sleep(0.002)
        time.sleep(delay)
        os.kill(started[0], signal.SIGKILL)
        result = cli.wait(started)
        landed = stage(index, base_version)
        if result.code == 0:
            landed = "finished"
        else:
            assert result.code == -signal.SIGKILL, result.err
        LANDED[(command, landed)] += 1
        print(f"{command} trial {trial}: aimed {name} +{delay:.3f}s, landed {landed}")
        _check_after(index, base_version, old, new, encoder, landed)
        shutil.rmtree(index)


def test_sigint_during_index(cli, bases, corpora, model_dir, encoder, tmp_path):
    """Ctrl-C: exit 130, one line on stderr, the previous version intact (or, when the signal
    came after the atomic switch, the new one whole), next write cleans."""
    base = bases["plain"]
    base_version = mf.read(base).version
    old = answers_of(base, encoder)
    _, args = _commands(corpora, model_dir)["index"]
    # what the command publishes when it runs to the end (a signal can arrive after the atomic
    # switch, while the process is still summing up: then the new version is the whole one)
    finished = tmp_path / "finished"
    shutil.copytree(base, finished)
    assert cli.wait(cli.start(*args, "--index", finished)).code == 0
    new = answers_of(finished, encoder, verify=True)
    assert new != old
    rng = np.random.default_rng(7)
    interrupted = 0
    for trial in range(2):
        index = tmp_path / f"int{trial}"
        shutil.copytree(base, index)
        started = cli.start(*args, "--index", index)
        while stage(index, base_version) == "startup" and not _is_zombie(started[0]):
            time.sleep(0.001)
        time.sleep(float(rng.uniform(0, 0.05)))
        os.kill(started[0], signal.SIGINT)
        result = cli.wait(started)
        if result.code == 0:  # finished before the signal arrived
            continue
        interrupted += 1
        lines = [line for line in result.err.splitlines() if line.strip()]
        assert result.code == 130, result.err
        assert lines == ["interrupted"], result.err
        assert not list((index / "versions").glob(".build-*"))  # cleaned on the way out
        landed = stage(index, base_version)  # "published" when it came after the switch
        _check_after(index, base_version, old, new, encoder, landed)
    assert interrupted >= 1


def test_crash_between_version_rename_and_manifest(index, model_dir, corpora, encoder, monkeypatch):
    """The narrowest window (a new version directory, the old manifest), made deterministic."""
    old = answers_of(index, encoder)
    base_version = mf.read(index).version

    class Killed(BaseException):
        pass

    def die(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(directory.mf, "write", die)
    with pytest.raises(Killed):
        build_index(corpora["more"], index, model=str(model_dir), overwrite=True)
    monkeypatch.undo()
    assert stage(index, base_version) == "publishing"
    _check_after(index, base_version, old, old, encoder, "publishing")


def test_first_build_killed_while_writing_its_manifest(tmp_path, model_dir, corpora):
    """A first build killed inside the manifest's atomic write leaves a version directory and a
    hidden temporary manifest: the directory is still ours, and the rerun cleans it."""
    index = tmp_path / "idx"
    build_index(corpora["more"], index, model=str(model_dir), lexical=False)
    (index / "manifest.json").rename(index / ".manifest.json.tmp-x1y2z3")
    assert not mf.is_index_dir(index)
    with pytest.raises(FlowsearchError, match="not a flowsearch index"):
        Searcher.open(index)
    build_index(corpora["more"], index, model=str(model_dir), lexical=False)
    assert sorted(p.name for p in index.iterdir()) == [".lock", "manifest.json", "versions"]
    assert Searcher.open(index, verify=True).manifest.version == 1


def test_sigterm_stops_serve_cleanly(cli, index):
    """SIGTERM to `serve` (what a supervisor sends): exit 0, no traceback, the port released."""
    pytest.importorskip("uvicorn")
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    before = mf.read(index)
    started = cli.start("serve", "--index", index, "--port", str(port))
    deadline = time.monotonic() + 90
    while True:
        assert not _is_zombie(started[0]), cli.wait(started).err
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "serve did not come up"
        time.sleep(0.05)
    os.kill(started[0], signal.SIGTERM)
    result = cli.wait(started, timeout=30)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free again
    assert mf.read(index) == before


def test_report_landed_stages():
    """Not a check: prints where the kills landed (run with -s)."""
    if LANDED:
        print("\nkill trials by (command, stage):")
        for (command, where), n in sorted(LANDED.items()):
            print(f"  {command:12s} {where:12s} {n}")
        print(f"  total {sum(LANDED.values())}")
