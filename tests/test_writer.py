"""The version writer (flowsearch.storage.writer): versions published atomically, cleanup that
keeps the current and the previous version, one writer at a time, leftovers of dead writers
removed, every file verified, the history log kept whole."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import segment_dirs, siblings, write_corpus
from segment_helpers import add_segment, build

from flowsearch.errors import BadInput, FlowsearchError, IndexDamaged, IndexLocked, NotFound
from flowsearch.search.searcher import Searcher
from flowsearch.search.version import index_info
from flowsearch.storage import history
from flowsearch.storage import manifest as mf
from flowsearch.storage import verify as storage_verify
from flowsearch.storage.layout import HISTORY_NAME, MANIFEST_NAME
from flowsearch.storage.writer import open_writer
from flowsearch.writes.build import build_index
from flowsearch.writes.compact import compact
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import add_to_index


@pytest.fixture(scope="module")
def built(tmp_path_factory, model_dir) -> Path:
    """A real index (tiny model, no calibration: fast) with two segments and a deletion."""
    tmp = tmp_path_factory.mktemp("writer")
    out = tmp / "idx"
    build_index(write_corpus(tmp / "c.parquet", n=40), out, model=str(model_dir),
                calibration="none")  # fmt: skip
    add_to_index(out, write_corpus(tmp / "a.parquet", n=5, id_prefix="a", seed=1))
    delete(out, ["d3", "a1"])
    return out


@pytest.fixture()
def index(built, tmp_path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "idx"))


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _referenced_files(root: Path, m: mf.Manifest) -> set[str]:
    out = {f"{m.calibration.path}/{f}" for f in m.calibration.files}
    sample = m.reference.sample if m.reference is not None else None
    if sample:  # the reference sample
        out |= {f"{sample.path}/{f}" for f in sample.files}
    for seg in m.segments:
        out |= {f"{seg.dir}/{f}" for f in seg.files}
    return out


def test_a_version_is_published_in_one_step_with_everything_it_names(tmp_path):
    root = tmp_path / "idx"
    first = build(root, [["a", "b"]])
    inode = (root / MANIFEST_NAME).stat().st_ino
    with open_writer(root) as writer:
        assert writer.base == first and writer.number == 2
        record = add_segment(writer, ["c"], seed=9)
        staged = writer.segment_path(record)
        assert staged.parent.name == "segments" and staged.name.startswith(".stage-")
        assert mf.read(root) == first  # nothing is current before publish
        published = writer.publish(kind="add", n_rows=1)
    assert not staged.exists() and (root / record.dir).is_dir()
    assert (root / MANIFEST_NAME).stat().st_ino != inode  # replaced, never edited in place
    m = mf.read(root)
    assert m == published and m.version == 2 and m.last_write.kind == "add"
    assert [s.name for s in m.segments] == [first.segments[0].name, record.name]
    assert _referenced_files(root, m) <= _tree(root)
    raw = json.loads((root / MANIFEST_NAME).read_text())
    assert raw["checksum"] == mf.checksum(raw) and raw["format_version"] == 3
    assert m.created == first.created and m.updated == m.last_write.time


def test_cleanup_keeps_the_current_and_the_previous_version(tmp_path):
    root = tmp_path / "idx"
    v1 = build(root, [["a", "b", "c"], ["d", "e"]])
    s1, s2 = (s.name for s in v1.segments)
    versions = [v1]

    def write(change):
        with open_writer(root) as writer:
            change(writer)
            versions.append(writer.publish(kind="test", n_rows=1))
        current, previous = versions[-1], versions[-2]
        # on disk: exactly the files of the current and the previous version (and the log)
        assert _tree(root) - {".lock"} == (
            _referenced_files(root, current)
            | _referenced_files(root, previous)
            | {MANIFEST_NAME, HISTORY_NAME}
        )

    write(lambda w: w.delete_rows(s1, np.array([0])))  # v2: s1 + deleted-v000002
    write(lambda w: w.delete_rows(s1, np.array([1])))  # v3: deleted-v000003
    write(lambda w: w.delete_rows(s2, np.array([0])))  # v4: deleted-v000002 of s1 is gone
    assert not (root / "segments" / s1 / "deleted-v000002.npy").exists()

    def merge_all(w):
        from flowsearch.writes.merge import merge

        merge(w, [s1, s2], dim=v1.dim, requested="Flat", lexical=True, schema=())

    write(merge_all)  # v5: one new segment; s1, s2 stay for version 4's readers
    assert (root / "segments" / s1).is_dir() and (root / "segments" / s2).is_dir()
    write(lambda w: None)  # v6: nothing of version 4 is left
    assert sorted(p.name for p in (root / "segments").iterdir()) == [versions[-1].segments[0].name]
    assert [r.version for r in history.read(root)] == [1, 2, 3, 4, 5, 6]


def test_a_failed_write_publishes_nothing_and_leaves_no_stage(tmp_path):
    root = tmp_path / "idx"
    build(root, [["a", "b"]])
    before = {p: (root / p).read_bytes() for p in _tree(root)}
    with pytest.raises(RuntimeError, match="simulated"), open_writer(root) as writer:
        add_segment(writer, ["c"])
        writer.delete_rows(writer.segments[0].name, np.array([0]))
        raise RuntimeError("simulated failure")
    after = _tree(root)
    # the deletion file written into the published segment is not referenced by any
    # manifest; everything else is as it was, and no stage is left
    assert {p: (root / p).read_bytes() for p in before} == before
    assert all(".stage-" not in p for p in after) and siblings(root) == []
    assert after - set(before) <= {"segments/s000001/deleted-v000002.npy"}
    index_info(root, verify=True)
    with open_writer(root) as writer:  # the next writer removes the orphan deletion file
        writer.publish(kind="test", n_rows=0)
    assert "segments/s000001/deleted-v000002.npy" not in _tree(root)


def test_a_ctrl_c_as_the_tidy_up_begins_leaves_no_stage(tmp_path, monkeypatch):
    """The window behind the flaky ``test_sigint_during_index`` (issue 41): a write has
    published, its scratch stage (a build's raw vectors) is not yet removed, and one SIGINT
    arrives before the tidy-up holds Ctrl-C back. The stage is gone all the same."""
    import signal

    from flowsearch.storage import writer as writer_module

    root = tmp_path / "idx"
    build(root, [["a", "b"]])
    real = writer_module._interrupts_deferred
    sent: list[int] = []

    def signal_first():  # a Ctrl-C arriving as the tidy-up begins (os.kill raises it here)
        if not sent:
            sent.append(signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real()

    monkeypatch.setattr(writer_module, "_interrupts_deferred", signal_first)
    with pytest.raises(KeyboardInterrupt), open_writer(root) as writer:
        scratch = writer.stage()  # never renamed into place: only the tidy-up removes it
        (scratch / "raw.f32").write_bytes(bytes(16))
        add_segment(writer, ["c"])
        writer.publish(kind="add", n_rows=1)
    assert sent == [signal.SIGINT]
    assert siblings(root) == [] and not scratch.exists()
    assert mf.read(root).version == 2  # published before the signal came
    index_info(root, verify=True)


def test_a_failed_first_build_leaves_nothing(tmp_path, model_dir):
    root = tmp_path / "new" / "idx"
    with pytest.raises(RuntimeError), open_writer(root, new=True) as writer:
        add_segment(writer, ["a"])
        raise RuntimeError("simulated failure")
    assert not root.exists()
    # and through build_index: interrupted while encoding
    corpus = write_corpus(tmp_path / "c.parquet", n=10)
    from flowsearch.encode.encoder import Encoder

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Encoder, "encode", interrupted)
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, root, model=str(model_dir), calibration="none")
    assert not root.exists()


def test_a_failed_first_build_into_an_empty_directory_leaves_it_empty(tmp_path):
    root = tmp_path / "idx"
    root.mkdir()
    with pytest.raises(RuntimeError), open_writer(root, new=True) as writer:
        add_segment(writer, ["a"])
        raise RuntimeError("simulated failure")
    assert list(root.iterdir()) == []


def test_a_killed_writers_leftovers_are_ignored_then_removed_by_the_next(tmp_path):
    root = tmp_path / "idx"
    build(root, [["a", "b"]])
    before = mf.read(root)
    # what a SIGKILL can leave: a stage of each kind, a segment renamed into place but never
    # published, a deletion file it wrote, a temporary manifest
    dead = [
        root / "segments" / ".stage-deadbeef" / "ann.faiss",
        root / "calibrators" / ".stage-0badf00d" / "config.json",
        root / "segments" / "s000009" / "rows-00000.parquet",
        root / "calibrators" / "c000009" / "config.json",
        root / "segments" / "s000001" / "deleted-v000002.npy",
        root / f".{MANIFEST_NAME}.tmp-1234",
    ]
    for path in dead:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    assert siblings(root) == [
        f".{MANIFEST_NAME}.tmp-1234",
        "calibrators/.stage-0badf00d",
        "segments/.stage-deadbeef",
    ]
    assert index_info(root, verify=True).manifest == before  # never taken for a version
    with open_writer(root) as writer:
        writer.publish(kind="test", n_rows=0)
    assert not any(p.exists() for p in dead) and siblings(root) == []
    assert not (root / "segments" / "s000009").exists()
    assert not (root / "segments" / ".stage-deadbeef").exists()


def test_a_killed_deletion_write_does_not_break_the_index(tmp_path):
    root = tmp_path / "idx"
    build(root, [["a", "b"]])
    (root / "segments" / "s000001" / ".deleted-v000002.npy.tmp-x1y2z3").write_bytes(b"part")
    index_info(root, verify=True)
    with open_writer(root) as writer:
        writer.publish(kind="test", n_rows=0)
    assert not (root / "segments" / "s000001" / ".deleted-v000002.npy.tmp-x1y2z3").exists()


def test_one_writer_at_a_time_and_wait_waits_for_it(tmp_path):
    root = tmp_path / "idx"
    build(root, [["a", "b", "c"]])
    with open_writer(root):
        with pytest.raises(IndexLocked, match="another flowsearch process is writing") as info:
            delete(root, ["a"])
        assert info.value.param == "wait" and "waited not at all" in str(info.value)
        started = time.monotonic()
        with pytest.raises(IndexLocked, match=r"waited for 0.3 s"):
            delete(root, ["a"], wait=0.3)
        assert time.monotonic() - started >= 0.3
    assert mf.read(root).version == 1  # nothing was written meanwhile
    acquired, released = threading.Event(), []

    def hold():
        with open_writer(root):
            acquired.set()
            time.sleep(0.5)
            released.append(time.monotonic())

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert acquired.wait(30)
        result = delete(root, ["a"], wait=30)  # waits for the holder, then writes
        done = time.monotonic()
    finally:
        holder.join()
    assert released and done >= released[0]
    assert result.n_deleted == 1 and result.version == 2
    assert delete(root, ["b"]).version == 3  # the lock is released with each write


def test_build_refuses_foreign_and_existing_targets(tmp_path, model_dir):
    corpus = write_corpus(tmp_path / "c.parquet", n=12)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(BadInput, match="not a flowsearch index .*notes.txt"):
        build_index(corpus, foreign, model=str(model_dir), calibration="none")
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadInput, match="is a file"):
        build_index(corpus, tmp_path / "file", model=str(model_dir), calibration="none")
    with pytest.raises(BadInput, match="is a file"):
        open_writer(tmp_path / "file", new=True).__enter__()
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    with pytest.raises(BadInput, match="overwrite=True") as info:
        build_index(corpus, out, model=str(model_dir), calibration="none")
    assert info.value.param == "overwrite"
    again = build_index(corpus, out, model=str(model_dir), calibration="none", overwrite=True)
    m = mf.read(out)
    assert again.version == 2 and m.segments[0].name == "s000002"  # names are never reused
    assert [r.kind for r in history.read(out)] == ["build", "build"]
    with pytest.raises(NotFound, match="no index at"):
        delete(tmp_path / "nothing", ["d1"])
    assert not (tmp_path / "nothing").exists()
    with pytest.raises(NotFound, match="not a flowsearch index"):
        delete(foreign, ["d1"])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _segment_dir(index: Path, at: int = 0) -> Path:
    return index / mf.read(index).segments[at].dir


def _seg(index: Path, at: int = 0) -> Path:
    return _segment_dir(index, at)


DAMAGE = {
    "part flipped": (lambda i: _flip(_seg(i) / "rows-00000.parquet"), "mismatch.*s000001/rows-0"),
    "calibrator flipped": (
        lambda i: _flip(i / mf.read(i).calibration.path / "weights.safetensors"),
        "checksum mismatch.*c000001/weights",
    ),
    "ann truncated": (lambda i: os.truncate(_seg(i, 1) / "ann.faiss", 10), "2/ann.faiss has 10 b"),
    "ann missing": (lambda i: (_seg(i) / "ann.faiss").unlink(), "missing.*s000001/ann.faiss"),
    "postings": (lambda i: (_seg(i) / "postings/vocab.json").write_text("[]"), "vocab.json"),
    "keys flipped": (lambda i: _flip(_seg(i) / "keys.npy"), "checksum mismatch.*keys.npy"),
    "deletions flipped": (
        lambda i: _flip(_seg(i) / mf.read(i).segments[0].deletions),
        "checksum mismatch.*s000001/deleted-v000003",
    ),
}


@pytest.mark.parametrize("what", DAMAGE)
def test_verify_names_the_damaged_file(index, what):
    damage, message = DAMAGE[what]
    damage(index)
    with pytest.raises(IndexDamaged, match=message):
        index_info(index, verify=True)
    with pytest.raises(IndexDamaged, match=message):
        Searcher.open(index, verify=True)


def test_a_hand_edited_manifest_is_caught(index):
    path = index / MANIFEST_NAME
    text = path.read_text()
    path.write_text(text.replace('"factory": "Flat"', '"factory": "HNSW32"', 1))
    with pytest.raises(IndexDamaged, match="manifest.json was changed after it was written"):
        Searcher.open(index)
    with pytest.raises(IndexDamaged, match="manifest.json was changed"):
        index_info(index)
    with pytest.raises(IndexDamaged, match="manifest.json was changed"):
        delete(index, ["d1"])  # nor does a writer build on it
    path.write_text(text)
    assert len(Searcher.open(index)) == 43


def test_info_says_what_was_hashed(index, monkeypatch):
    m = mf.read(index)
    files = sum(len(s.files) for s in m.segments) + len(m.calibration.files)
    sample = m.reference.sample  # the reference sample: its base and deltas
    files += sum(len(piece.files) for piece in sample.pieces)
    plain = index_info(index).verified
    assert (plain.n_files, plain.n_hashed, plain.not_hashed) == (files, files, ())
    assert plain.history_records is None  # the log is read only when verifying
    with monkeypatch.context() as patched:
        patched.setattr(storage_verify, "CHEAP_CHECKSUM_BYTES", 100)
        cheap = index_info(index).verified
    assert cheap.not_hashed and cheap.n_hashed + len(cheap.not_hashed) == cheap.n_files == files
    assert all(Path(p).stat().st_size > 100 for p in cheap.not_hashed)
    full = index_info(index, verify=True).verified
    assert full.not_hashed == () and full.n_hashed == files and full.history_records == 3


def test_the_history_log_one_line_per_write_repaired_by_the_next_writer(index):
    assert [(r.version, r.kind) for r in history.read(index)] == [
        (1, "build"),
        (2, "add"),
        (3, "delete"),
    ]
    path = index / HISTORY_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    # a crash between publishing version 3 and appending its line, or inside the append
    path.write_bytes(b"".join(lines[:2]) + lines[2][:25])
    assert index_info(index, verify=True).verified.history_records == 2  # one short: allowed
    result = delete(index, ["d5"])
    assert [(r.version, r.kind) for r in history.read(index)] == [
        (1, "build"),
        (2, "add"),
        (3, "delete"),  # re-appended from the manifest's last_write
        (4, "delete"),
    ]
    assert result.version == 4 and path.read_bytes().endswith(b"\n")
    assert index_info(index, verify=True).verified.history_records == 4


def test_info_verify_checks_the_history_which_opening_never_reads(index):
    path = index / HISTORY_NAME
    record = mf.WriteRecord(version=9, kind="delete", time="t")
    with open(path, "a") as handle:
        handle.write(json.dumps(record.model_dump(mode="json")) + "\n")
    with pytest.raises(IndexDamaged, match="records version 9, newer than the manifest's 3"):
        index_info(index, verify=True)
    path.write_text("not json\n")
    with pytest.raises(IndexDamaged, match="line 1 is not a write record"):
        index_info(index, verify=True)
    index_info(index)  # without verify the log is not read
    assert len(Searcher.open(index)) == 43


def test_a_pinned_reader_keeps_its_version_after_cleanup_removed_its_files(index, tmp_path):
    searcher = Searcher.open(index)
    m = searcher.manifest
    before = [h.id for h in searcher.search("the cat", k=50, mode="dense")]
    lexical = [h.id for h in searcher.search("cat dog", k=10, mode="lexical")]
    assert len(before) == 43 and not {"d3", "a1"} & set(before)
    compact(index, full=True)  # one new segment
    delete(index, ["d0", "d1"])  # two writes later the reader's segments are gone
    assert not any((index / s.dir).exists() for s in m.segments)
    assert [h.id for h in searcher.search("the cat", k=50, mode="dense")] == before
    assert [h.id for h in searcher.search("cat dog", k=10, mode="lexical")] == lexical
    assert searcher.manifest == m
    assert searcher.refresh() is True and searcher.manifest.version == 5
    after = [h.id for h in searcher.search("the cat", k=50, mode="dense")]
    assert len(after) == 41 and set(after) == set(before) - {"d0", "d1"}
    assert searcher.refresh() is False


def test_a_pinned_reader_filters_on_its_version_after_cleanup(index):
    searcher = Searcher.open(index)
    want = [h.id for h in searcher.search("the cat", k=5, where="year >= 2000", mode="dense")]
    compact(index, full=True)
    delete(index, [want[0]])
    assert [
        h.id for h in searcher.search("the cat", k=5, where="year >= 2000", mode="dense")
    ] == want


def test_a_write_errors_name_the_problem_in_one_line(index):
    with pytest.raises(FlowsearchError) as info:
        delete(index, "d1")
    assert info.value.param == "ids" and "\n" not in str(info.value)


@pytest.mark.parametrize("where", ["fsync_tree", "rename", "atomic_write_text"])
def test_a_publish_that_fails_midway_leaves_the_previous_version_whole(tmp_path, where):
    """The disk fails while the version is being placed (before, between or at the manifest's
    replacement): the previous version stays current and whole, and the next writer removes
    what was placed."""
    from flowsearch.errors import WriteFailed
    from flowsearch.storage import writer as writer_mod

    root = tmp_path / "idx"
    build(root, [["a", "b"]])
    before = mf.read(root)
    manifest_bytes = (root / MANIFEST_NAME).read_bytes()
    calls = []

    def failing(real):
        def call(*args, **kwargs):
            calls.append(args)
            if len(calls) == 2:  # the second call: something was placed already
                raise OSError(28, "No space left on device")
            return real(*args, **kwargs)

        return call

    target = os if where == "rename" else writer_mod
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(target, where, failing(getattr(target, where)))
        with (
            pytest.raises(WriteFailed, match="the disk is full .*idx is unchanged") as info,
            open_writer(root) as writer,
        ):
            add_segment(writer, ["c"], seed=3)
            add_segment(writer, ["d"], seed=4)
            writer.delete_rows(before.segments[0].name, np.array([0]))
            if where == "atomic_write_text":
                calls.append(("placed",))  # fail at the manifest itself
            writer.publish(kind="add", n_rows=2)
    assert "\n" not in str(info.value)
    assert (root / MANIFEST_NAME).read_bytes() == manifest_bytes and mf.read(root) == before
    assert index_info(root, verify=True).manifest == before
    with open_writer(root) as writer:
        writer.publish(kind="test", n_rows=0)
    assert segment_dirs(root) == [s.name for s in before.segments] and siblings(root) == []
