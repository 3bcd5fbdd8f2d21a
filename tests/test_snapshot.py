"""Snapshots and restores (``flowsearch.snapshot`` / ``restore``, ``flowsearch snapshot|restore``).

A snapshot is one version, whole: searched as it was, verified file by file, and never a mix of
versions while a writer thread upserts and compacts the index.
"""

from __future__ import annotations

import json
import shutil
import tarfile
import threading
from pathlib import Path

import pytest
from corpus_helpers import write_corpus

import flowsearch
from flowsearch.cli import main
from flowsearch.errors import BadInput, IndexDamaged, NotFound
from flowsearch.search.searcher import Searcher
from flowsearch.search.version import index_info
from flowsearch.storage import manifest as mf
from flowsearch.storage import snapshot as snap
from flowsearch.writes.build import build_index
from flowsearch.writes.compact import compact
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import upsert


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("snapshot")
    corpus = write_corpus(root / "c.parquet", n=40, seed=3)
    build_index(corpus, root / "idx", model=str(model_dir), calibration="none")
    return root / "idx"


@pytest.fixture
def index(built: Path, tmp_path: Path) -> Path:
    """A copy of the built index a test may write to (copied, not linked)."""
    shutil.copytree(built, tmp_path / "idx")
    return tmp_path / "idx"


def _answers(index_dir: Path) -> list[tuple[str, float]]:
    with _closing(Searcher.open(index_dir)) as s:
        return [(h.id, round(h.score, 6)) for h in s.search("the river runs", k=5)]


class _closing:
    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher

    def __enter__(self) -> Searcher:
        return self.searcher

    def __exit__(self, *exc: object) -> None:
        self.searcher.close()


def test_snapshot_and_restore_directory(built: Path, tmp_path: Path) -> None:
    taken = flowsearch.snapshot(built, tmp_path / "snap")
    current = mf.read(built)
    assert taken.version == current.version and taken.n_live == current.n_live
    assert taken.n_files > 0 and taken.n_linked == taken.n_files  # same file system: links
    assert (tmp_path / "snap" / snap.SNAPSHOT_NAME).is_file()
    restored = flowsearch.restore(tmp_path / "snap", tmp_path / "new")
    assert restored.source_version == current.version and restored.version == current.version + 1
    info = index_info(tmp_path / "new", verify=True)
    origin = info.manifest.restored_from
    assert origin is not None and origin.source_version == current.version
    assert origin.snapshot == str((tmp_path / "snap").resolve())
    assert info.manifest.last_write is not None and info.manifest.last_write.kind == "restore"
    assert info.to_dict()["restored_from"]["source"] == str(built.resolve())
    assert _answers(tmp_path / "new") == _answers(built)
    assert not list(tmp_path.glob(".*tmp-*"))


def test_snapshot_tar_and_restore(built: Path, tmp_path: Path) -> None:
    taken = flowsearch.snapshot(built, tmp_path / "b.tar")
    assert taken.n_linked == 0 and tarfile.is_tarfile(tmp_path / "b.tar")
    flowsearch.restore(tmp_path / "b.tar", tmp_path / "new")
    assert _answers(tmp_path / "new") == _answers(built)
    # the restored index takes writes, and keeps naming its snapshot
    delete(tmp_path / "new", [mf.read(built).segments[0].name + "-no-such-id"])
    assert mf.read(tmp_path / "new").restored_from is not None


def test_copies_where_links_are_refused(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across file systems (os.link raises EXDEV) every file is copied: a snapshot that shares
    no inode with the index, whole and verified."""
    import errno
    import os

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    taken = flowsearch.snapshot(built, tmp_path / "snap")
    assert taken.n_files > 0 and taken.n_linked == 0
    copied = [p for p in (tmp_path / "snap" / "segments").rglob("*") if p.is_file()]
    assert copied and all(p.stat().st_nlink == 1 for p in copied)
    index_info(tmp_path / "snap", verify=True)
    flowsearch.restore(tmp_path / "snap", tmp_path / "new")
    assert _answers(tmp_path / "new") == _answers(built)


def test_refusals(built: Path, index: Path, tmp_path: Path) -> None:
    (tmp_path / "there").mkdir()
    with pytest.raises(BadInput, match="already exists"):
        flowsearch.snapshot(built, tmp_path / "there")
    with pytest.raises(NotFound, match="no index"):
        flowsearch.snapshot(tmp_path / "nothing", tmp_path / "s")
    with pytest.raises(NotFound, match="does not exist"):
        flowsearch.snapshot(built, tmp_path / "no" / "such" / "s")
    with pytest.raises(NotFound, match="no snapshot"):
        flowsearch.restore(tmp_path / "nothing", tmp_path / "r")
    with pytest.raises(BadInput, match="not a flowsearch snapshot"):
        flowsearch.restore(built, tmp_path / "r")  # an index, not a snapshot
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    with pytest.raises(BadInput, match=r"not a readable snapshot archive \(not a tar archive\)"):
        flowsearch.restore(tmp_path / "junk.tar", tmp_path / "r")
    flowsearch.snapshot(built, tmp_path / "whole.tar")
    with tarfile.open(tmp_path / "whole.tar") as tar:  # an interrupted copy: cut in a file
        big = max(tar.getmembers(), key=lambda m: m.size)
    cut = (tmp_path / "whole.tar").read_bytes()[: big.offset_data + big.size // 2]
    (tmp_path / "cut.tar").write_bytes(cut)
    with pytest.raises(BadInput, match=r"not a readable snapshot archive \(unexpected end"):
        flowsearch.restore(tmp_path / "cut.tar", tmp_path / "r")
    for name in ("whole.tar", "cut.tar"):
        (tmp_path / name).unlink()
    with pytest.raises(BadInput, match="inside the index"):
        flowsearch.snapshot(index, index / "backup")
    flowsearch.snapshot(built, tmp_path / "s")
    with pytest.raises(BadInput, match="already exists"):
        flowsearch.restore(tmp_path / "s", tmp_path / "there")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "junk.tar", "s", "there"]


def test_a_lost_file_is_refused(index: Path, tmp_path: Path) -> None:
    part = next((index / "segments").rglob("rows-*.parquet"))
    part.unlink()
    with pytest.raises(IndexDamaged, match=f"index file missing: {part}"):
        flowsearch.snapshot(index, tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_damaged_index_is_refused_with_the_verify_error(index: Path, tmp_path: Path) -> None:
    part = next((index / "segments").rglob("rows-*.parquet"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only a checksum sees it
    part.write_bytes(bytes(data))
    with pytest.raises(IndexDamaged) as refused:
        flowsearch.snapshot(index, tmp_path / "s")
    assert f"checksum mismatch for {part}" in str(refused.value)
    with pytest.raises(IndexDamaged) as verified:
        index_info(index, verify=True)
    assert str(verified.value) == str(refused.value)
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".*tmp-*"))


def test_damaged_snapshot_is_refused(built: Path, tmp_path: Path) -> None:
    flowsearch.snapshot(built, tmp_path / "s.tar")
    shutil.copytree(built, tmp_path / "copy")  # a snapshot directory of copied files
    flowsearch.snapshot(tmp_path / "copy", tmp_path / "s")
    for part in (tmp_path / "s" / "segments").rglob("rows-*.parquet"):
        part.unlink()
        part.write_bytes(b"x")
    with pytest.raises(IndexDamaged, match="the snapshot .* is damaged"):
        flowsearch.restore(tmp_path / "s", tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_a_write_during_the_copy_starts_it_again(
    index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [f"d{i}" for i in range(3)]
    real = snap._link_or_copy
    calls = {"n": 0}

    def racing(src: Path, dst: Path) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:  # three writes between reading the manifest and the first file:
            delete(index, ids[:1])  # the first version's segment is cleaned up
            compact(index, full=True)
            delete(index, ids[1:2])
        return real(src, dst)

    monkeypatch.setattr(snap, "_link_or_copy", racing)
    taken = flowsearch.snapshot(index, tmp_path / "s")
    assert taken.version == mf.read(index).version == 4
    index_info(tmp_path / "s", verify=True)


def test_snapshots_while_a_writer_runs(index: Path, tmp_path: Path) -> None:
    encoder = Searcher.open(index).encoder
    stop, errors = threading.Event(), []

    def writer() -> None:
        try:
            for i in range(6):
                records = [{"id": f"w{i}-{j}", "text": f"new text {i} {j}"} for j in range(3)]
                upsert(index, records, encoder=encoder, wait=30)
                if i % 2:
                    compact(index, full=True, wait=30)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    taken = []
    while not stop.is_set() or not taken:
        taken.append(flowsearch.snapshot(index, tmp_path / f"s{len(taken)}"))
    thread.join()
    assert not errors
    assert len({r.version for r in taken}) >= 2  # taken while versions were published
    for result in taken:
        info = index_info(result.path, verify=True)  # every file by sha256: one version
        assert info.manifest.version == result.version
        assert info.manifest.n_live == result.n_live
    last = taken[-1]
    flowsearch.restore(last.path, tmp_path / "restored")
    with _closing(Searcher.open(tmp_path / "restored", verify=True)) as s:
        assert len(s) == last.n_live


def test_cli(built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", str(tmp_path / "s.tar"), "--index", str(built)]) == 0
    assert "snapshot of" in capsys.readouterr().err
    assert main(["restore", str(tmp_path / "s.tar"), "--index", str(tmp_path / "r")]) == 0
    assert main(["info", "--index", str(tmp_path / "r")]) == 0
    assert "restored from" in capsys.readouterr().out
    assert main(["info", "--index", str(tmp_path / "r"), "--json"]) == 0
    origin = json.loads(capsys.readouterr().out)["restored_from"]  # the version it came from
    assert origin["source_version"] == mf.read(built).version
    assert origin["source"] == str(built.resolve())
    assert main(["snapshot", str(tmp_path / "s.tar"), "--index", str(built)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "already exists" in err and "Traceback" not in err
    assert main(["restore", str(tmp_path / "s.tar")]) == 2  # --index is required
