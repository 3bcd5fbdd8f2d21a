"""Crash safety: writes killed (SIGKILL, SIGINT) at random moments leave the previous version (or
the new one, once published) whole, verifiable and answering as before; the next write cleans up.

Every write kind runs as a real process (forked from a server that has torch imported, see
``forkserver.py``): a first build, a build over an index, add, upsert, delete, compact,
``compact --full``, recalibrate, and an upsert that makes a tenth small segment, so the writes'
size-tiered policy merges the tier. There is no stage hook in the library: what the index
directory holds tells the stage (:func:`facts`): a build's scratch ``raw.f32``, a staged
segment's rows, vector index, keys and postings, a staged calibrator, a deletion file of the
next version, two staged segments (a merge), a final-named directory or a temporary manifest
that no published manifest names yet ("publishing"). The commands run on a slow disk (every
``fsync`` takes :data:`SLOW_DISK` seconds first), which widens the windows between a write's
durable steps to where a kill can be aimed at them. Each command is run once to the end while
the directory is polled, which measures each stage's window; the kill delays are drawn, seeded,
inside those windows. The stage a kill really landed in is read from the directory afterwards
and tallied (``test_report_landed_stages``, run with ``-s``).

The default suite kills each kind :data:`FAST_TRIALS` times, at seeded stages; ``-m slow`` runs
:data:`SLOW_TRIALS` per kind, every stage at least twice.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import siblings, write_corpus

from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.storage import history
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import CALIBRATORS_DIR, SEGMENTS_DIR, STAGE_PREFIX
from flowsearch.storage.verify import verify
from flowsearch.storage.writer import referenced
from flowsearch.writes.build import build_index
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import add_to_index

from .conftest import answers, answers_of, leftovers

#: kill trials per write kind in the default suite, and with ``-m slow``
FAST_TRIALS = 2
SLOW_TRIALS = 16
#: seconds every fsync of a killed command takes (a busy disk)
SLOW_DISK = 0.02
LANDED: collections.Counter = collections.Counter()

_BUILD = ["startup", "encoding", "fitting", "rows", "vector index", "keys", "postings"]
_SEGMENT = ["rows", "vector index", "keys", "postings"]
#: Per write kind, the stages in the order it goes through them.
SEQUENCES = {
    "index (new)": [*_BUILD, "calibrator", "publishing", "published"],
    "index": [*_BUILD, "calibrator", "publishing", "published"],
    "add": ["startup", "encoding", *_SEGMENT, "publishing", "published"],
    "upsert": ["startup", "encoding", *_SEGMENT, "deletions", "publishing", "published"],
    "delete": ["startup", "deletions", "publishing", "published"],
    "compact": ["startup", *_SEGMENT, "publishing", "published"],
    "compact --full": ["startup", *_SEGMENT, "publishing", "published"],
    "recalibrate": ["startup", "calibrator", *_SEGMENT, "publishing", "published"],
    "merge": ["startup", "encoding", *_SEGMENT, "deletions", "merging", "publishing", "published"],
}


def facts(index: Path, base_version: int) -> set[str]:
    """What the index directory shows of a write going on from ``base_version``."""
    out = {"startup"}
    try:
        manifest: mf.Manifest | None = mf.read(index)
    except FlowsearchError:
        manifest = None
    if manifest is not None and manifest.version > base_version:
        return out | {"published"}
    if list(index.glob(f".{mf.MANIFEST_NAME}.tmp-*")):
        out.add("publishing")
    keep = referenced(manifest)
    next_deletions = f"deleted-v{base_version + 1:06d}.npy"
    for kind in (SEGMENTS_DIR, CALIBRATORS_DIR):
        for path in _entries(index / kind):
            rel = f"{kind}/{path.name}"
            if path.name.startswith(STAGE_PREFIX):
                out |= _stage_facts(kind, path)
            elif rel not in keep:
                out.add("publishing")  # renamed into place, the manifest not yet replaced
            elif kind == SEGMENTS_DIR and any(n.lstrip(".").startswith(next_deletions)
                                              for n in _names(path)):  # fmt: skip
                out.add("deletions")
    staged = [p for p in _entries(index / SEGMENTS_DIR) if p.name.startswith(STAGE_PREFIX)]
    if sum("raw.f32" not in _names(p) for p in staged) >= 2:
        out.add("merging")  # a second segment staged beside a finished one
    return out


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _names(folder: Path) -> set[str]:
    return {p.name for p in _entries(folder)}


def _stage_facts(kind: str, path: Path) -> set[str]:
    names = _names(path)
    if kind == CALIBRATORS_DIR:
        return {"calibrator"} if names else set()
    if "raw.f32" in names:  # the build's scratch: raw vectors, written chunk by chunk
        try:
            encoded = (path / "raw.f32").stat().st_size > 0
        except OSError:
            encoded = False
        return {"encoding", "fitting"} if encoded else {"encoding"}
    out = {"encoding"}  # a write's segment: staged before its first rows are encoded
    if any(n.startswith("rows-") for n in names):
        out.add("rows")
    if "ann.faiss" in names:
        out.add("vector index")
    if "keys.npy" in names:
        out.add("keys")
    if "postings" in names:
        out.add("postings")
    return out


def stage(index: Path, base_version: int, kind: str) -> str:
    """The furthest stage of ``kind``'s sequence the directory shows."""
    shown = facts(index, base_version)
    return next(s for s in reversed(SEQUENCES[kind]) if s in shown)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture(scope="module")
def bases(tmp_path_factory, built, encoder) -> dict[str, Path | None]:
    """The index each kind starts from: the built one (one segment of 60 rows), with 10 rows
    deleted, and with nine small segments (8 adds of 3 rows), with rows deleted too."""
    root = tmp_path_factory.mktemp("bases")
    plain = root / "plain"
    shutil.copytree(built, plain)
    deleted = root / "deleted"
    shutil.copytree(built, deleted)
    delete(deleted, [f"d{i}" for i in range(40, 50)])
    segmented = root / "segmented"
    shutil.copytree(built, segmented)
    for i in range(8):
        small = write_corpus(root / f"small{i}.parquet", n=3, seed=20 + i, id_prefix=f"s{i}-")
        add_to_index(segmented, small, encoder=encoder, merge_segments=False)
    assert len(mf.read(segmented).segments) == 9  # the next write merges them (Flat budget)
    segmented_deleted = root / "segmented-deleted"
    shutil.copytree(segmented, segmented_deleted)
    delete(segmented_deleted, ["d5", "s3-1", "s7-0"])
    return {
        "none": None,
        "plain": plain,
        "deleted": deleted,
        "segmented": segmented,
        "segmented-deleted": segmented_deleted,
    }


def _commands(corpora, model_dir) -> dict[str, tuple[str, list[str]]]:
    build = ["index", corpora["more"], "--model", model_dir, "--calibration", "flow"]
    return {
        "index (new)": ("none", build),
        "index": ("plain", [*build, "--overwrite"]),
        "add": ("plain", ["add", corpora["more"]]),
        "upsert": ("plain", ["upsert", corpora["changed"]]),
        "delete": ("plain", ["delete", "d1", "d2", "d3"]),
        "compact": ("deleted", ["compact"]),
        "compact --full": ("segmented-deleted", ["compact", "--full"]),
        "recalibrate": ("plain", ["recalibrate", "--calibration", "whitening"]),
        "merge": ("segmented", ["upsert", corpora["changed"]]),
    }


def _copy(base: Path | None, target: Path) -> None:
    if base is not None:
        shutil.copytree(base, target)


def _measure(cli, args: list, index: Path, base_version: int, kind: str) -> list[tuple]:
    """Run once to completion, polling: [(stage, first seen, last seen)] in seconds from start."""
    started = cli.start(*args, "--index", index, fsync_delay=SLOW_DISK)
    t0 = time.perf_counter()
    seen: dict[str, list[float]] = {}
    while not _is_zombie(started[0]):
        now = time.perf_counter() - t0
        seen.setdefault(stage(index, base_version, kind), [now, now])[1] = now
        time.sleep(0.001)
    total = time.perf_counter() - t0
    result = cli.wait(started)
    assert result.code == 0, result.err
    windows = sorted((t[0], t[1], name) for name, t in seen.items())
    print(f"{kind} measured:", ", ".join(f"{n} {a:.3f}-{b:.3f}s" for a, b, n in windows),
          f"of {total:.3f}s")  # fmt: skip
    out = []
    for i, (first, last, name) in enumerate(windows):
        end = windows[i + 1][0] if i + 1 < len(windows) else total
        out.append((name, first, max(last, end)))
    return out


def _aims(windows: list[tuple], kind: str, slow: bool) -> list[tuple]:
    """The windows the trials aim at: every one in turn (slow), or a seeded few."""
    rng = np.random.default_rng(sorted(SEQUENCES).index(kind))
    if slow:
        return [windows[t % len(windows)] for t in range(max(SLOW_TRIALS, 2 * len(windows)))]
    pre = [w for w in windows if w[0] != "published"] or windows
    return [pre[i] for i in rng.permutation(len(pre))[:FAST_TRIALS]]


def _files(m: mf.Manifest) -> int:
    sample = m.reference.sample if m.reference is not None else None  # its base and deltas
    pieces = sum(len(p.files) for p in sample.pieces) if sample is not None else 0
    return sum(len(s.files) for s in m.segments) + len(m.calibration.files) + pieces


def _check_after(cli, index: Path, base: mf.Manifest | None, new: mf.Manifest, old: list,
                 new_answers: list, encoder, landed: str, args: list = ()) -> None:  # fmt: skip
    """The guarantees after a kill (see the module docstring); ``args``: the command (a first
    build killed before it published is run again)."""
    base_version = base.version if base is not None else 0
    try:
        m = mf.read(index)
    except FlowsearchError:
        assert base is None and landed not in ("published", "finished"), landed
        return _check_no_index(cli, index, args, new, new_answers, encoder)
    assert m.version in (base_version, base_version + 1), m.version
    if landed in ("published", "finished"):
        assert m.version == base_version + 1
    whole = new if m.version == new.version else base
    assert whole is not None
    # the version is one of the two, segment for segment
    assert [(s.name, s.n_rows, s.n_deleted) for s in m.segments] == [
        (s.name, s.n_rows, s.n_deleted) for s in whole.segments
    ]
    assert m.calibration.path == whole.calibration.path
    # `info --verify`: every file's checksum and the log; a killed write left nothing it sees
    result = cli.run("info", "--verify", "--json", "--index", index)
    assert result.code == 0, result.err
    checked = json.loads(result.out)["verified"]
    assert checked["n_files"] == checked["n_hashed"] == _files(m)
    assert checked["history_records"] in (m.version - 1, m.version)  # the last may follow
    searcher = Searcher.open(index, verify=True, encoder=encoder)
    try:
        got = answers(searcher)
    finally:
        searcher.close()
    assert got == (new_answers if m.version == new.version else old), landed
    # the next write succeeds, removes what the killed one left, and verifies
    gone = got[0][0][0]
    assert delete(index, [gone]).n_deleted == 1
    assert leftovers(index, previous=m) == []
    after = mf.read(index)
    verify(index, after, checksums=True)
    assert [r.version for r in history.read(index)] == list(range(1, after.version + 1))


def _check_no_index(
    cli, index: Path, args: list, new: mf.Manifest, new_answers: list, encoder
) -> None:
    """A first build killed before it published: no index, and the same build run again
    makes the whole new one, leaving nothing of the killed run."""
    with pytest.raises(FlowsearchError, match="not a flowsearch index|no index"):
        Searcher.open(index)
    result = cli.run(*args, "--index", index)
    assert result.code == 0, result.err
    m = mf.read(index)
    assert [(s.name, s.n_rows) for s in m.segments] == [(s.name, s.n_rows) for s in new.segments]
    assert answers_of(index, encoder, verify=True) == new_answers
    assert leftovers(index) == []
    assert [r.version for r in history.read(index)] == [1]


def _trials(kind, cli, bases, corpora, model_dir, encoder, tmp_path, slow: bool) -> None:
    source_key, args = _commands(corpora, model_dir)[kind]
    base_dir = bases[source_key]
    base = mf.read(base_dir) if base_dir is not None else None
    base_version = base.version if base is not None else 0
    old = answers_of(base_dir, encoder) if base_dir is not None else []

    measured = tmp_path / "measured"
    _copy(base_dir, measured)
    windows = _measure(cli, args, measured, base_version, kind)
    new = mf.read(measured)
    new_answers = answers_of(measured, encoder, verify=True)
    assert new_answers != old or kind.startswith("compact")  # compaction keeps the answers

    rng = np.random.default_rng(100 + sorted(SEQUENCES).index(kind))
    order = SEQUENCES[kind]
    for trial, (name, lo, hi) in enumerate(_aims(windows, kind, slow)):
        delay = float(rng.uniform(0, hi - lo))
        index = tmp_path / f"trial{trial}"
        _copy(base_dir, index)
        started = cli.start(*args, "--index", index, fsync_delay=SLOW_DISK)
        # wait until the write reaches the aimed stage (or later), then a random part of it
        while order.index(stage(index, base_version, kind)) < order.index(name):
            if _is_zombie(started[0]):
                break
            time.sleep(0.002)
        time.sleep(delay)
        os.kill(started[0], signal.SIGKILL)
        result = cli.wait(started)
        landed = stage(index, base_version, kind)
        if result.code == 0:
            landed = "finished"
        else:
            assert result.code == -signal.SIGKILL, result.err
        LANDED[(kind, landed)] += 1
        print(f"{kind} trial {trial}: aimed {name} +{delay:.3f}s, landed {landed}")
        _check_after(cli, index, base, new, old, new_answers, encoder, landed, args)
        shutil.rmtree(index)


@pytest.mark.parametrize("kind", list(SEQUENCES))
def test_sigkill_at_random_moments(kind, cli, bases, corpora, model_dir, encoder, tmp_path):
    _trials(kind, cli, bases, corpora, model_dir, encoder, tmp_path, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SEQUENCES))
def test_sigkill_at_every_stage(kind, cli, bases, corpora, model_dir, encoder, tmp_path):
    """The full set: every measured stage of every kind aimed at, at least twice."""
    _trials(kind, cli, bases, corpora, model_dir, encoder, tmp_path, slow=True)


def test_the_merge_trial_merges(bases, corpora, encoder, tmp_path):
    """What the "merge" kind runs: an upsert whose segment is the tenth small one, so the write
    merges all ten (the replaced rows dropped), not an upsert beside nine: the lowest tier's
    four smallest into one, the other six (past the Flat budget) into another."""
    from flowsearch.writes.upsert import upsert

    index = tmp_path / "idx"
    shutil.copytree(bases["segmented"], index)
    result = upsert(index, corpora["changed"], encoder=encoder)
    assert result.n_merged == 10 and result.n_segments == 2 and result.n_replaced == 10
    segments = mf.read(index).segments
    assert all(s.n_deleted == 0 for s in segments)
    assert sum(s.n_rows for s in segments) == 60 + 8 * 3


def test_sigint_during_index(cli, bases, corpora, model_dir, encoder, tmp_path):
    """Ctrl-C: exit 130, one line on stderr, the previous version intact (or, when the signal
    came after the atomic switch, the new one whole), nothing staged left, next write cleans."""
    base_dir = bases["plain"]
    base = mf.read(base_dir)
    old = answers_of(base_dir, encoder)
    _, args = _commands(corpora, model_dir)["index"]
    # what the command publishes when it runs to the end (a signal can arrive after the atomic
    # switch, while the process is still summing up: then the new version is the whole one)
    finished = tmp_path / "finished"
    shutil.copytree(base_dir, finished)
    assert cli.wait(cli.start(*args, "--index", finished)).code == 0
    new = mf.read(finished)
    new_answers = answers_of(finished, encoder, verify=True)
    assert new_answers != old
    rng = np.random.default_rng(7)
    interrupted = 0
    for trial in range(2):
        index = tmp_path / f"int{trial}"
        shutil.copytree(base_dir, index)
        started = cli.start(*args, "--index", index)
        while stage(index, base.version, "index") == "startup" and not _is_zombie(started[0]):
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
        assert siblings(index) == []  # staged directories removed on the way out
        landed = stage(index, base.version, "index")  # "published" after the switch
        _check_after(cli, index, base, new, old, new_answers, encoder, landed)
    assert interrupted >= 1


class Killed(BaseException):
    """What a SIGKILL is to the code it stops: nothing after it runs (no except, no cleanup of
    the killed call's own)."""


def test_crash_between_segment_rename_and_manifest(
    cli, index, model_dir, corpora, encoder, monkeypatch
):
    """The narrowest window (the new segments renamed into place, the old manifest), made
    deterministic: readers keep the old version, the next write removes the orphans."""
    from flowsearch.storage import writer

    old = answers_of(index, encoder)
    base = mf.read(index)

    def die(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(writer, "atomic_write_text", die)
    with pytest.raises(Killed):
        build_index(corpora["more"], index, model=str(model_dir), overwrite=True)
    monkeypatch.undo()
    assert stage(index, base.version, "index") == "publishing"
    orphans = sorted(p.name for p in (index / SEGMENTS_DIR).iterdir())
    assert orphans == ["s000001", "s000002"]  # s000002 named, never published
    _check_after(cli, index, base, base, old, old, encoder, "publishing")
    assert not (index / SEGMENTS_DIR / "s000002").exists()


def test_crash_inside_a_deletion_file_write(cli, index, encoder, monkeypatch):
    """A delete killed inside its deletion file's atomic write leaves a temporary file in a
    published segment's directory: readers and `info --verify` ignore it, the next write
    removes it (it used to make every open fail with "unexpected file")."""
    import tempfile

    from flowsearch.storage import deletions

    old = answers_of(index, encoder)
    base = mf.read(index)

    def killed_inside(target, write, **_):  # atomic_write up to the rename, then the kill
        fd, tmp = tempfile.mkstemp(prefix=f".{Path(target).name}.tmp-", dir=Path(target).parent)
        os.close(fd)
        write(tmp)
        raise Killed

    monkeypatch.setattr(deletions, "atomic_write", killed_inside)
    with pytest.raises(Killed):
        delete(index, ["d7"])
    monkeypatch.undo()
    temp = list((index / base.segments[0].dir).glob(".deleted-v000002.npy.tmp-*"))
    assert len(temp) == 1 and stage(index, base.version, "delete") == "deletions"
    _check_after(cli, index, base, base, old, old, encoder, "deletions")
    assert not temp[0].exists()


def test_first_build_killed_while_writing_its_manifest(tmp_path, model_dir, corpora):
    """A first build killed inside the manifest's atomic write leaves its segment and
    calibrator renamed into place and a hidden temporary manifest (no history line yet): the
    directory is still ours, not an index, and the rerun cleans it."""
    index = tmp_path / "idx"
    build_index(corpora["more"], index, model=str(model_dir), lexical=False)
    (index / "manifest.json").rename(index / ".manifest.json.tmp-x1y2z3")
    (index / "history.jsonl").unlink()  # appended after the manifest: not reached
    assert not mf.is_index_dir(index)
    with pytest.raises(FlowsearchError, match="not a flowsearch index"):
        Searcher.open(index)
    build_index(corpora["more"], index, model=str(model_dir), lexical=False)
    entries = [".lock", "calibrators", "history.jsonl", "manifest.json", "references",
               "segments"]  # fmt: skip
    assert sorted(p.name for p in index.iterdir()) == entries
    assert leftovers(index) == []
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
        print("\nkill trials by (kind, stage):")
        for (kind, where), n in sorted(LANDED.items()):
            print(f"  {kind:15s} {where:13s} {n}")
        print(f"  total {sum(LANDED.values())}")
