"""Deletion files (flowsearch.storage.deletions) and how the version writer keeps them: one
file per change, listing every deleted row of its segment, older ones kept for older readers."""

from __future__ import annotations

import numpy as np
import pytest
from segment_helpers import build

from flowsearch.errors import IndexDamaged
from flowsearch.storage import deletions
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import deletions_file
from flowsearch.storage.writer import open_writer


def test_write_keeps_sorted_unique_rows_and_reads_back_as_rows_or_mask(tmp_path):
    path = tmp_path / deletions_file(7)
    assert path.name == "deleted-v000007.npy"
    assert deletions.write(path, np.array([9, 3, 3, 0])) == 3
    assert deletions.read_rows(path, 10).tolist() == [0, 3, 9]
    assert deletions.read_rows(path, 10).dtype == np.int64
    assert deletions.read(path, 10).tolist() == [i in (0, 3, 9) for i in range(10)]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # written atomically: no temp
    assert deletions.write(path, np.array([], dtype=np.int64)) == 0  # replaced whole
    assert not deletions.read(path, 4).any()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (np.array([0, 10]), "does not list rows of its segment"),  # row 10 of 10 rows
        (np.array([-1]), "does not list rows of its segment"),
        (np.array([1.0, 2.0]), "does not list rows of its segment"),  # not int64
        (np.array([[1, 2]]), "does not list rows of its segment"),  # not 1-D
        (np.array(["a"], dtype=object), "is unreadable"),  # a pickle is never loaded
        (b"not numpy", "is unreadable"),
    ],
)
def test_a_file_that_is_not_a_row_list_of_its_segment_is_damage(tmp_path, content, message):
    path = tmp_path / "deleted-v000002.npy"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        np.save(path, content, allow_pickle=True)
    with pytest.raises(IndexDamaged, match=f"{path.name} {message}".replace(".", r"\.")):
        deletions.read(path, 10)


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):  # its version was cleaned up: the reader retries
        deletions.read_rows(tmp_path / "deleted-v000001.npy", 3)


def test_each_write_adds_a_file_with_every_deleted_row_and_cleanup_keeps_two_versions(tmp_path):
    root = tmp_path / "idx"
    first = build(root, [["a", "b", "c", "d"], ["e", "f"]])
    name, other = first.segments[0].name, first.segments[1].name
    folder = root / first.segments[0].dir
    for version, rows in ((2, [1]), (3, [3, 1]), (4, [0])):
        with open_writer(root) as writer:
            record = writer.delete_rows(name, np.array(rows))
            writer.publish(kind="delete", n_rows=len(rows))
        assert record.deletions == deletions_file(version)
    m = mf.read(root)
    seg = m.segments[0]
    assert (seg.n_rows, seg.n_deleted, m.n_live) == (4, 3, 3)
    assert deletions.read_rows(folder / seg.deletions, 4).tolist() == [0, 1, 3]  # the union
    assert seg.deletions in seg.files and deletions_file(3) not in seg.files  # one per version
    # the previous version's file stays for readers pinned to it; older ones are removed
    assert sorted(p.name for p in folder.glob("deleted-v*")) == [
        deletions_file(3),
        deletions_file(4),
    ]
    assert m.segments[1].deletions is None and m.segments[1].name == other
    assert not list((root / m.segments[1].dir).glob("deleted-v*"))


def test_a_writes_deletion_files_are_flushed_together_before_the_manifest(tmp_path, monkeypatch):
    """Deletion files are written without a flush each; publish flushes every one of them and
    its segment's directory in one batch, before the manifest names them (a crash before it
    leaves the previous version whole, the files unreferenced)."""
    from flowsearch.storage import writer as writer_mod

    root = tmp_path / "idx"
    first = build(root, [["a", "b", "c"], ["d", "e"], ["f"]])
    flushed: list[tuple[set, int]] = []
    real = writer_mod.fsync_paths

    def record(paths):
        paths = list(paths)
        flushed.append(({p.relative_to(root).as_posix() for p in paths}, mf.read(root).version))
        real(paths)

    monkeypatch.setattr(writer_mod, "fsync_paths", record)
    with open_writer(root) as writer:
        for seg, rows in zip(first.segments[:2], ([0, 2], [1]), strict=True):
            writer.delete_rows(seg.name, np.array(rows))
        writer.publish(kind="delete", n_rows=3)
    dirs = [s.dir for s in first.segments[:2]]
    name = deletions_file(2)
    assert flushed == [({*dirs, *(f"{d}/{name}" for d in dirs)}, 1)]  # before version 2
    m = mf.read(root)
    assert m.version == 2 and [s.n_deleted for s in m.segments] == [2, 1, 0]
