"""Readers keep their version: a pinned ``Searcher`` answers from the version it opened — every
mode, with and without ``where`` — while other processes write, compact and clean up, until
``refresh()``; and a reader never sees a mix of two versions while a writer process publishes.

The writes run as real processes (``flowsearch`` commands through the fork server), so nothing
the test process holds (no lock, no cache) helps the reader."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import sentences, write_corpus

from flowsearch.search.searcher import Searcher
from flowsearch.storage import manifest as mf

from .conftest import QUERIES

MODES = ("dense", "lexical", "hybrid")
WHERES = (None, "year >= 2005", "topic = 'cat' OR year < 1995")


def _answer(searcher: Searcher, queries: list[str], mode: str, where: str | None) -> list:
    """One call (one pinned version): each query's (id, rounded score) hits."""
    results = searcher.query_batch(queries, k=6, mode=mode, where=where)
    return [[(h.id, round(h.score, 5)) for h in r.hits] for r in results]


def _all_answers(searcher: Searcher, queries: list[str]) -> dict:
    return {(m, w): _answer(searcher, queries, m, w) for m in MODES for w in WHERES}


@contextlib.contextmanager
def _opened(index: Path, encoder) -> Iterator[Searcher]:
    searcher = Searcher.open(index, encoder=encoder)
    try:
        yield searcher
    finally:
        searcher.close()


def _texts(corpus: Path, ids: list[str]) -> list[str]:
    import pyarrow.parquet as pq

    table = pq.read_table(corpus).to_pydict()
    by_id = dict(zip(table["id"], table["text"], strict=True))
    return [by_id[i] for i in ids]


def test_pinned_reader_answers_from_its_version_through_writes_and_compaction(
    cli, index, built, corpora, encoder
):
    """Another process upserts, deletes, compacts everything into one new segment and writes
    again (so the pinned version's segment directory is removed from disk): the Searcher opened
    before keeps answering exactly as its version did — its first filtered query comes after
    all that — and moves on with ``refresh()``."""
    queries = [*QUERIES, *_texts(corpora["base"], ["d0", "d20", "d33"])]
    pinned = Searcher.open(index, encoder=encoder)
    version = pinned.manifest.version
    (segment,) = pinned.manifest.segments
    with _opened(built, encoder) as same:  # an untouched copy of that version
        expected = _all_answers(same, queries)

    writes = [
        ("upsert", corpora["changed"]),  # d0..d9 replaced: a new segment, a deletion file
        ("delete", "d20", "d21", "d33"),  # a second deletion file
        ("compact", "--full"),  # everything merged into one new segment
        ("delete", "d40", "d41"),  # cleanup now drops what the compaction replaced
    ]
    for args in writes:
        result = cli.run(*args, "--index", index)
        assert result.code == 0, result.err
    current = mf.read(index)
    assert current.version == version + len(writes)
    assert [s.name for s in current.segments] != [segment.name]
    assert not (index / segment.dir).exists()  # the pinned version's files are gone from disk

    assert pinned.manifest.version == version
    assert _all_answers(pinned, queries) == expected  # every mode, every filter
    assert any(expected.values()) and len({str(v) for v in expected.values()}) > 3

    assert pinned.refresh() and pinned.manifest.version == current.version
    moved = _all_answers(pinned, queries)
    with _opened(index, encoder) as fresh:
        assert moved == _all_answers(fresh, queries) != expected
    ids = {h[0] for hits in moved[("hybrid", None)] for h in hits}
    assert not ids & {"d20", "d21", "d33", "d40", "d41"}  # deleted rows are gone for it now
    pinned.close()


def test_pinned_reader_after_two_writes_filters_in_every_mode(cli, index, built, corpora, encoder):
    """The second release's failure: a pinned Searcher, two writes by another process, then
    its first query with ``where`` (it read files by path that the cleanup had removed)."""
    pinned = Searcher.open(index, encoder=encoder)
    assert not pinned.refresh()  # nothing new: a no-op
    for args in (("upsert", corpora["changed"]), ("delete", "d1", "d2", "d20")):
        assert cli.run(*args, "--index", index).code == 0
    with _opened(built, encoder) as same:  # an untouched copy of the pinned version
        for mode in MODES:
            for where in ("year >= 2005", "topic = 'dog'"):
                want = _answer(same, QUERIES, mode, where)
                assert _answer(pinned, QUERIES, mode, where) == want, (mode, where)
    pinned.close()


# -- no mix of versions -----------------------------------------------------------------------


def _writes(corpora, tmp_path: Path) -> list[tuple[str, ...]]:
    extra = write_corpus(tmp_path / "extra.parquet", n=15, seed=9, id_prefix="f")
    return [
        ("add", str(corpora["more"])),
        ("upsert", str(corpora["changed"])),
        ("delete", "d20", "d21", "e3", "d33"),
        ("compact", "--full"),
        ("add", str(extra)),
        ("delete", "f2", "d0", "d5"),
    ]


def test_readers_never_see_a_mix_of_versions(cli, index, corpora, encoder, tmp_path):
    """A writer process publishes six versions (adds, an upsert, deletes, a full compaction)
    while four reader threads search without pause (every mode, with and without a filter) and
    refresh at random moments: every answer is wholly the answer of one version, the one the
    reader was on when it asked or the one it moved to meanwhile."""
    import shutil

    queries = [*QUERIES, *_texts(corpora["base"], ["d0", "d5", "d20", "d33"])]
    queries += _texts(corpora["more"], ["e3"])
    writes = _writes(corpora, tmp_path)
    # what each version answers: the same writes replayed on a copy, one at a time
    replay = tmp_path / "replay"
    shutil.copytree(index, replay)
    expected: dict[int, dict] = {}
    with _opened(replay, encoder) as s:
        expected[s.manifest.version] = _all_answers(s, queries)
    for args in writes:
        assert cli.run(*args, "--index", replay).code == 0
        with _opened(replay, encoder) as s:
            expected[s.manifest.version] = _all_answers(s, queries)
    assert len(expected) == len(writes) + 1
    values = list(expected.values())
    changes = [sum(a[k] != b[k] for k in a) for a, b in zip(values, values[1:])]
    for args, changed in zip(writes, changes, strict=True):
        # every write changes several answers, so a mix would show; the full compaction none
        # (the same rows in one segment: a mix with the segments it replaced holds rows twice)
        assert changed >= 3 if args[0] != "compact" else changed == 0, (args, changes)

    searcher = Searcher.open(index, encoder=encoder)
    seen: list[tuple[int, int, tuple, list]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        keys = list(expected[1])
        try:
            while not stop.is_set():
                key = keys[int(rng.integers(len(keys)))]
                before = searcher.manifest.version
                got = _answer(searcher, queries, *key)
                seen.append((before, searcher.manifest.version, key, got))
                if rng.random() < 0.3:
                    searcher.refresh()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    try:
        for args in writes:  # each a separate process
            started = cli.start(*args, "--index", index)
            n = len(seen)
            result = cli.wait(started)
            assert result.code == 0, result.err
            while len(seen) < n + 8 and all(t.is_alive() for t in threads):
                threading.Event().wait(0.01)  # some answers while and after it publishes
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    searcher.refresh()
    assert searcher.manifest.version == max(expected)
    # the reader's version when it asked and when it answered bracket the one that answered
    mixed = [
        (before, after, key)
        for before, after, key, got in seen
        if got not in [expected[v][key] for v in range(before, after + 1)]
    ]
    assert mixed == [] and len(seen) > 50
    versions = {after for _, after, _, _ in seen}
    assert len(versions) >= 4, versions  # the readers did move along while the writes ran
    searcher.close()


@pytest.mark.parametrize("where", ["year >= 2005", None])
def test_refresh_reuses_the_segments_both_versions_share(index, corpora, encoder, where):
    """A refresh after a small write opens only the new segment: the old segment's reader
    (its open files) is the same object in both versions."""
    from flowsearch.writes.upsert import add_to_index

    searcher = Searcher.open(index, encoder=encoder)
    old_reader = searcher.version.segments[0]
    add_to_index(index, [{"id": "z1", "text": sentences(1, seed=99)[0], "year": 2020}],
                 encoder=encoder)  # fmt: skip
    assert searcher.refresh()
    assert len(searcher.version.segments) == 2 and searcher.version.segments[0] is old_reader
    hits = searcher.search(sentences(1, seed=99)[0], k=1, where=where, mode="dense")
    assert [h.id for h in hits] == ["z1"]
    searcher.close()
