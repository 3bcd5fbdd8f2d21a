"""Atomic writes: the target is the old or the new content, never a mix; no leftovers."""

from __future__ import annotations

import os

import pytest

from flowsearch.atomic import atomic_write, atomic_write_text, fsync_tree


def test_replaces_whole_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["a.json"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)


def test_a_failing_write_keeps_the_old_content(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_text(target, "old")

    def broken(tmp: str) -> None:
        with open(tmp, "w") as handle:
            handle.write("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write(target, broken)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["a.json"]


def test_fsync_tree_walks_everything(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f").write_text("x")
    fsync_tree(tmp_path)  # no error on nested directories and files
