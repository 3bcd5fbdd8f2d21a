"""Fixtures of the reliability suite: a small built index, copies of it to damage, a fork server
that runs ``flowsearch`` commands as real processes, and snapshots of what an index stores."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from corpus_helpers import siblings, write_corpus

from flowsearch.storage import manifest as mf

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
QUERIES = ["the cat and the dog", "red train on the river", "music song piano", "old book page"]


@dataclass
class Result:
    """A finished command: exit code, stdout, stderr."""

    code: int
    out: str
    err: str


class ForkServer:
    """Client of ``forkserver.py`` (see there): ``start`` a command, ``wait`` for it."""

    def __init__(self, scratch: Path) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env["OMP_NUM_THREADS"] = "1"  # see one_torch_thread
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "forkserver.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(REPO),
        )
        self.scratch = scratch
        self.count = 0
        self.lock = threading.Lock()
        self.ready = False  # it imports torch meanwhile: read its greeting on first use

    def _ask(self, req: dict | None) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if req is not None:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        return json.loads(line)

    def start(
        self,
        *args: str,
        cwd: Path | None = None,
        env: dict | None = None,
        fsync_delay: float | None = None,
    ) -> tuple:
        """Fork ``flowsearch ARGS``; returns ``(pid, out_file, err_file)``. ``fsync_delay``:
        seconds every ``os.fsync`` of the command takes first (a slow disk)."""
        with self.lock:
            self.count += 1
            out = self.scratch / f"cmd{self.count}.out"
            err = self.scratch / f"cmd{self.count}.err"
            req = {"run": list(map(str, args)), "out": str(out), "err": str(err)}
            req.update(cwd=str(cwd or self.scratch), env=env or {}, fsync_delay=fsync_delay)
            if not self.ready:
                self.ready = "ready" in self._ask(None)
            return self._ask(req)["pid"], out, err

    def wait(self, started: tuple, timeout: float = 120) -> Result:
        pid, out, err = started
        with self.lock:
            code = self._ask({"wait": pid, "timeout": timeout})["status"]
        return Result(code, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def run(self, *args: str, **kwargs) -> Result:
        return self.wait(self.start(*args, **kwargs))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # it exits at end of input (its children were all waited for)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """Tiny models on a shared 2-core machine: two torch threads spend their time waiting on
    each other (a 32-dim query took 0.75 s instead of 5 ms); run this package on one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def cli(tmp_path_factory) -> ForkServer:
    server = ForkServer(tmp_path_factory.mktemp("forkserver"))
    yield server
    server.close()


@pytest.fixture(scope="session")
def corpora(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("corpora")
    return {
        "base": write_corpus(root / "base.parquet", n=60),
        "more": write_corpus(root / "more.parquet", n=20, seed=1, id_prefix="e"),
        "changed": write_corpus(root / "changed.parquet", n=10, seed=2),  # ids d0..d9
    }


@pytest.fixture(scope="session")
def built(tmp_path_factory, model_dir, corpora) -> Path:
    """A calibrated (flow) index of 60 rows with a lexical part; never modified."""
    from flowsearch.writes.build import build_index

    out = tmp_path_factory.mktemp("built") / "idx"
    build_index(corpora["base"], out, model=str(model_dir), calibration="flow")
    return out


@pytest.fixture(scope="session")
def encoder(model_dir):
    from flowsearch.encode.encoder import Encoder

    return Encoder(str(model_dir))


@pytest.fixture()
def index(built, tmp_path) -> Path:
    """A private copy of :func:`built` to write to or damage."""
    out = tmp_path / "idx"
    shutil.copytree(built, out)
    return out


def snapshot(index: Path) -> tuple:
    """What an index stores: the manifest's bytes and every file with its content hash."""
    index = Path(index)
    path = index / mf.MANIFEST_NAME
    manifest = path.read_bytes() if path.exists() else b""
    files = sorted(
        (p.relative_to(index).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest())
        for p in index.rglob("*")
        if p.is_file() and p.name != ".lock"
    )
    return manifest, tuple(files)


def answers(searcher, queries=QUERIES, **kwargs) -> list:
    """Comparable answers: (id, rounded score) per hit, per query."""
    return [[(h.id, round(h.score, 5)) for h in searcher.search(q, k=5, **kwargs)] for q in queries]


def leftovers(index: Path, previous: mf.Manifest | None = None) -> list[str]:
    """What no reader may need any more and a write must not leave: scratch (staging
    directories, temporary manifests, stray entries: ``corpus_helpers.siblings``), and segment
    directories, calibrators and deletion files that neither the current version nor
    ``previous`` (the version before it, which readers may still hold) references."""
    from flowsearch.storage.writer import referenced

    index = Path(index)
    keep = referenced(mf.read(index)) | referenced(previous)
    found = siblings(index)
    for kind in ("segments", "calibrators"):
        folder = index / kind
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            rel = f"{kind}/{path.name}"
            if path.name.startswith("."):
                continue  # scratch: siblings() has it
            if rel not in keep:
                found.append(rel)
            elif kind == "segments":  # e.g. a deletion file of a write that died
                files = (f.relative_to(index).as_posix() for f in path.rglob("*") if f.is_file())
                found += [f for f in files if f not in keep]
    return sorted(found)


def one_error_line(result: Result) -> None:
    """The CLI's bad-input contract: exit 2, one ``error:`` line on stderr, no traceback."""
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert result.code == 2, (result.code, result.err[-2000:])
    assert "Traceback" not in result.err, result.err[-2000:]
    assert len(lines) == 1, result.err
    assert lines[0].startswith("error:"), lines


def answers_of(index: Path, encoder, verify: bool = False, **kwargs) -> list:
    """:func:`answers` of a freshly opened (and closed) Searcher on ``index``."""
    from flowsearch.search.searcher import Searcher

    searcher = Searcher.open(index, verify=verify, encoder=encoder)
    try:
        return answers(searcher, **kwargs)
    finally:
        searcher.close()
