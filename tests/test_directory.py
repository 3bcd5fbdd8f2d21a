"""The index directory: versions published atomically, readers pinned, leftovers cleaned,
one writer at a time, every file verified."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from corpus_helpers import write_corpus
from flowsearch.writes.rewrite import delete

from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.search.version import index_info
from flowsearch.storage import directory as directory
from flowsearch.storage import manifest as mf
from flowsearch.writes.build import build_index
from flowsearch.writes.upsert import add_to_index


@pytest.fixture()
def index(tmp_path, model_dir) -> Path:
    out = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=60), out, model=str(model_dir))
    return out


def _versions(index: Path) -> list[str]:
    return sorted(p.name for p in (index / "versions").iterdir())


def test_writes_publish_new_versions_and_keep_one_behind(index, tmp_path):
    assert _versions(index) == ["v000001"]
    add_to_index(write_corpus(tmp_path / "a.parquet", n=5, id_prefix="a", seed=1), index)
    assert _versions(index) == ["v000001", "v000002"]
    assert mf.read(index).root == "versions/v000002"
    delete(index, ["a0"])
    assert _versions(index) == ["v000002", "v000003"]  # older than the previous one: gone
    shard = "shards/part-00000.parquet"
    m = mf.read(index)
    # unchanged files are shared (hard links), never copied or rewritten
    assert os.path.samefile(m.path(index, shard), index / "versions/v000002" / shard)


def test_reader_keeps_its_version_until_refresh(index, tmp_path):
    searcher = Searcher.open(index)
    before = [h.id for h in searcher.search("the cat", k=60, mode="dense")]
    add_to_index(write_corpus(tmp_path / "a.parquet", n=5, id_prefix="a", seed=1), index)
    delete(index, ["d0", "d1"])
    # two writes later the reader's version directory is gone, yet it answers from its snapshot
    assert not (index / "versions/v000001").exists()
    assert [h.id for h in searcher.search("the cat", k=60, mode="dense")] == before
    assert searcher.refresh() is True and searcher.manifest.version == 3
    after = {h.id for h in searcher.search("the cat", k=100, mode="dense")}
    assert len(after) == 63 and not {"d0", "d1"} & after and {"a0", "a4"} <= after
    assert searcher.refresh() is False


def test_a_failed_build_leaves_nothing_and_the_next_write_cleans_a_killed_one(index, tmp_path):
    before = (index / mf.MANIFEST_NAME).read_text()
    with pytest.raises(FlowsearchError), directory.write_version(index) as build:
        (build.path / "junk").write_text("x")
        raise FlowsearchError("simulated failure")
    assert [p.name for p in (index / "versions").iterdir() if p.name.startswith(".")] == []
    # a build killed outright (no cleanup ran) leaves its directory; it is never taken for a
    # version, and the next writer removes it (it holds the lock, so no build is alive)
    dead = index / "versions" / ".build-deadbeef"
    dead.mkdir()
    (dead / "index.faiss").write_text("partial")
    assert index_info(index).manifest.version == 1
    assert (index / mf.MANIFEST_NAME).read_text() == before
    add_to_index(write_corpus(tmp_path / "a.parquet", n=3, id_prefix="a", seed=1), index)
    assert not dead.exists()


def test_one_writer_at_a_time(index, tmp_path):
    extra = write_corpus(tmp_path / "a.parquet", n=3, id_prefix="a", seed=1)
    with (
        directory.write_version(index),
        pytest.raises(FlowsearchError, match="another flowsearch process is writing"),
    ):
        add_to_index(extra, index)
    add_to_index(extra, index)  # the lock is released with the block


def test_build_refuses_foreign_and_existing_targets(tmp_path, model_dir):
    corpus = write_corpus(tmp_path / "c.parquet", n=20)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FlowsearchError, match="not a flowsearch index"):
        build_index(corpus, foreign, model=str(model_dir))
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(FlowsearchError, match="is a file"):
        build_index(corpus, tmp_path / "file", model=str(model_dir))
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir))
    with pytest.raises(FlowsearchError, match="overwrite=True"):
        build_index(corpus, out, model=str(model_dir))
    assert build_index(corpus, out, model=str(model_dir), overwrite=True)["version"] == 2


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda v: _flip(v / "shards/part-00000.parquet"), "checksum mismatch.*part-00000"),
        (lambda v: _flip(v / "calibrator/weights.safetensors"), "checksum mismatch.*weights"),
        (lambda v: os.truncate(v / "index.faiss", 10), "index.faiss has 10 bytes"),
        (lambda v: (v / "index.faiss").unlink(), "missing.*index.faiss"),
        (lambda v: (v / "shards/extra.parquet").write_bytes(b"x"), "unexpected file.*extra"),
        (lambda v: (v / "lexical/vocab.json").write_text("[]"), "vocab.json"),
    ],
)
def test_verify_names_the_damaged_file(index, damage, message):
    m = mf.read(index)
    damage(m.path(index))
    with pytest.raises(FlowsearchError, match=message):
        index_info(index, verify=True)
    with pytest.raises(FlowsearchError, match=message):
        Searcher.open(index, verify=True)


def test_a_hand_edited_manifest_is_caught(index):
    path = index / mf.MANIFEST_NAME
    text = path.read_text()
    path.write_text(text.replace('"factory": "Flat"', '"factory": "HNSW32"', 1))
    with pytest.raises(FlowsearchError, match="manifest.json was changed after it was written"):
        Searcher.open(index)
    with pytest.raises(FlowsearchError, match="manifest.json was changed"):
        index_info(index)
    path.write_text(text)
    assert len(Searcher.open(index)) == 60


def test_info_says_what_was_hashed(index, monkeypatch):
    assert index_info(index).verified.not_hashed == ()
    monkeypatch.setattr(directory, "CHEAP_CHECKSUM_BYTES", 100)
    cheap = index_info(index).verified
    assert cheap.not_hashed and cheap.hashed + len(cheap.not_hashed) == cheap.files
    assert index_info(index, verify=True).verified.not_hashed == ()
