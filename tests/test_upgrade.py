"""Segments written before ``key_ids.arrow`` (flowsearch.storage.upgrade): still written to
correctly, then given the file by ``compact`` without rewriting their rows."""

from __future__ import annotations

import os

import pytest
from corpus_helpers import siblings, write_corpus

from flowsearch.errors import IndexDamaged
from flowsearch.storage import keys
from flowsearch.storage import manifest as mf
from flowsearch.storage.layout import KEY_IDS_FILE
from flowsearch.storage.verify import verify
from flowsearch.writes.build import build_index
from flowsearch.writes.compact import compact
from flowsearch.writes.upsert import add_to_index, upsert


@pytest.fixture
def older(tmp_path, model_dir, monkeypatch):
    """An index of two string-id segments written as before key_ids.arrow existed."""
    root = tmp_path / "idx"
    with monkeypatch.context() as patch:
        patch.setattr(keys, "save_ids", lambda directory, ids: None)
        build_index(write_corpus(tmp_path / "a.parquet", n=40), root, model=str(model_dir),
                    calibration="none")  # fmt: skip
        add_to_index(root, write_corpus(tmp_path / "b.parquet", n=30, seed=3, id_prefix="e"),
                     merge_segments=False)  # fmt: skip
    m = mf.read(root)
    assert len(m.segments) == 2 and not any(KEY_IDS_FILE in s.files for s in m.segments)
    assert not any((root / s.dir / KEY_IDS_FILE).exists() for s in m.segments)
    return root


def test_an_older_index_is_written_correctly_then_upgraded_by_compact(older):
    """Upserts into segments without key_ids.arrow replace exactly the rows of their ids (the
    rows' id column confirms); compact gives a segment it does not rewrite the file by hard
    links (its rows are the same inodes, nothing copied), the index verifies, and writes after
    it replace exactly as well; verify names a damaged or missing key_ids.arrow."""
    root = older
    records = [{"id": "d7", "text": "a new text for d7"}, {"id": "z1", "text": "never seen"}]
    out = upsert(root, records, merge_segments=False)
    assert (out.n_replaced, out.n_inserted) == (1, 1)
    before = mf.read(root)
    first, second, new = before.segments
    assert (before.n_live, first.n_deleted, second.n_deleted) == (71, 1, 0)
    assert KEY_IDS_FILE in new.files  # a segment written now has it
    rows_file = os.stat(root / second.dir / second.parts[0].path).st_ino

    result = compact(root)  # rewrites the first (a deleted row), upgrades the second
    m = mf.read(root)
    assert m.version == before.version + 1 and siblings(root) == []
    assert m.last_write is not None and m.last_write.detail["key_ids"] == 1
    assert result.n_merged == 1 and result.n_written == 39  # the rewrite only
    assert all(KEY_IDS_FILE in s.files for s in m.segments) and m.n_live == 71
    upgraded = next(s for s in m.segments if s.n_rows == 30)
    assert upgraded.name not in {s.name for s in before.segments}  # a new segment, same rows
    assert os.stat(root / upgraded.dir / upgraded.parts[0].path).st_ino == rows_file
    assert upgraded.ann == second.ann and upgraded.vector_sum == second.vector_sum
    verify(root, m, checksums=True)  # the new files checksummed, the ids checked against keys
    assert compact(root).version == m.version  # nothing left to do: no new version

    again = upsert(root, [{"id": "d8", "text": "d8 again"}, {"id": "e2", "text": "e2 again"},
                          {"id": "d7", "text": "d7 again"}], merge_segments=False)  # fmt: skip
    assert (again.n_replaced, again.n_inserted) == (3, 0)
    m = mf.read(root)
    assert m.n_live == 71

    path = root / upgraded.dir / KEY_IDS_FILE
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # same size: only the checksum can tell
    path.write_bytes(bytes(data))
    with pytest.raises(IndexDamaged, match="key_ids.arrow"):
        verify(root, m, checksums=True)
    path.unlink()
    with pytest.raises(IndexDamaged, match="missing.*key_ids.arrow"):
        verify(root, m)


def test_the_compact_command_says_it_gave_older_segments_their_ids(older):
    from typer.testing import CliRunner

    from flowsearch.cli import app

    wide = CliRunner(env={"COLUMNS": "200"})
    done = wide.invoke(app, ["compact", "--index", str(older)])
    assert done.exit_code == 0, done.output
    assert " ".join(done.stderr.split()) == (
        f"compacted {older} (version 3): 70 live passages in 2 segments; "
        "gave 2 older segments key_ids.arrow"
    )
    again = wide.invoke(app, ["compact", "--index", str(older)])
    assert again.exit_code == 0 and again.stderr.startswith("nothing to compact")
