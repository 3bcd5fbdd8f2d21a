"""Concurrency: one Searcher shared by many threads answers as it does serially; a reader never
sees a mix of two versions while writes publish; two writers never corrupt an index."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from corpus_helpers import sentences, write_corpus
from flowsearch.writes.rewrite import delete

from flowsearch.search.searcher import Searcher
from flowsearch.storage import manifest as mf
from flowsearch.writes.upsert import add_to_index, upsert

from .conftest import QUERIES

THREADS, PER_THREAD = 8, 500
WHERES = [None, "year >= 2005", "topic = 'cat'", "year < 1995 OR topic = 'dog'", "year > 3000"]


def _specs() -> list[tuple[str, str, str | None, int]]:
    queries = sentences(12, seed=11, length=(1, 5))
    rng = np.random.default_rng(3)
    return [
        (q, str(rng.choice(["dense", "lexical", "hybrid"])), WHERES[i % len(WHERES)], 1 + i % 7)
        for i, q in enumerate(queries * 4)
    ]


def _run(searcher: Searcher, spec) -> list[tuple]:
    query, mode, where, k = spec
    return [(h.id, h.score, h.rank) for h in searcher.search(query, k=k, mode=mode, where=where)]


def test_threads_answer_as_serial(built, encoder):
    """8 threads x 500 queries (modes and filters mixed) equal the same queries run serially,
    bit for bit, with no exception."""
    searcher = Searcher.open(built, encoder=encoder)
    specs = _specs()
    serial = [_run(searcher, spec) for spec in specs]
    assert any(serial) and not all(serial)  # some filters match nothing: both paths exercised

    def worker(seed: int) -> list[tuple[int, list]]:
        order = np.random.default_rng(seed).integers(0, len(specs), PER_THREAD)
        return [(int(i), _run(searcher, specs[i])) for i in order]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))
    wrong = [(i, got) for done in results for i, got in done if got != serial[i]]
    assert sum(map(len, results)) == THREADS * PER_THREAD
    assert wrong == []
    searcher.close()


def test_readers_during_writes_see_one_version(index, corpora, encoder, tmp_path):
    """A thread searches without pause while add, upsert and delete publish in this thread: every
    answer (one call) is the one of the version the reader was on (the old one until refresh()).
    (Separate calls straddling a refresh() may of course see two versions.)"""
    searcher = Searcher.open(index, encoder=encoder)
    expected = {mf.read(index).version: _fresh(index, encoder)}
    seen: list[tuple[int, int, list]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                before = searcher.manifest.version
                got = answers_of_searcher(searcher)
                seen.append((before, searcher.manifest.version, got))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    extra = write_corpus(tmp_path / "extra.parquet", n=15, seed=9, id_prefix="f")
    try:
        for write in (
            lambda: add_to_index(corpora["more"], index),
            lambda: upsert(index, corpora["changed"]),
            lambda: delete(index, ["d20", "d21", "e3"]),
            lambda: add_to_index(extra, index),
        ):
            write()
            expected[mf.read(index).version] = _fresh(index, encoder)
            n = len(seen)
            while len(seen) < n + 2 and thread.is_alive():  # some answers on the old version
                threading.Event().wait(0.01)
            assert searcher.refresh()
    finally:
        stop.set()
        thread.join()
    assert errors == []
    versions = set()
    for before, after, got in seen:
        assert got in (expected[before], expected[after]), (before, after)
        versions.add(after)
    assert len(versions) == 5 and len(expected) == 5
    assert len({str(v) for v in expected.values()}) == 5  # each write changed the answers
    searcher.close()


def answers_of_searcher(searcher: Searcher) -> list:
    """One call (so one pinned version) answering all of QUERIES."""
    return [[(h.id, round(h.score, 5)) for h in hits] for hits in searcher.search(QUERIES, k=5)]


def _fresh(index, encoder) -> list:
    searcher = Searcher.open(index, encoder=encoder)
    try:
        return answers_of_searcher(searcher)
    finally:
        searcher.close()


@pytest.mark.parametrize("trial", range(2))
def test_two_writers_at_once(cli, index, corpora, encoder, tmp_path, trial):
    """Two `add` processes started together: one fails with the lock's message (exit 2), or both
    succeed one after the other; the index always verifies."""
    extra = write_corpus(tmp_path / "extra.parquet", n=15, seed=9, id_prefix="f")
    first = cli.start("add", corpora["more"], "--index", index)
    second = cli.start("add", extra, "--index", index)
    results = [cli.wait(first), cli.wait(second)]
    codes = sorted(r.code for r in results)
    assert codes in ([0, 0], [0, 2]), [(r.code, r.err) for r in results]
    rows = 60
    for result, added in zip(results, (20, 15), strict=True):
        if result.code == 2:
            assert "another flowsearch process is writing" in result.err
            assert "Traceback" not in result.err
            assert len(result.err.strip().splitlines()) == 1
        else:
            rows += added
    searcher = Searcher.open(index, verify=True, encoder=encoder)
    assert len(searcher) == rows
    searcher.close()


def test_searches_leave_torch_threads_alone(built, encoder, monkeypatch):
    """torch's thread count is process-wide: no search may set it (it used to be flipped to 1
    and back around every flow call, from several threads at once)."""
    import torch

    calls: list[int] = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), real(n)))
    searcher = Searcher.open(built, encoder=encoder)
    assert searcher.manifest.calibration.calibrator == "flow"
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda q: searcher.search(q, k=3, mode="dense"), QUERIES * 5))
    searcher.embed(QUERIES * 300)  # a large batch too
    searcher.close()
    assert calls == []
