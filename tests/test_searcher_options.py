"""SearchOptions: each knob's range, and two searchers with different options answering side by
side in one process, each per its own options (nothing process-wide)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields

import pytest
from shard_helpers import QUERIES, segmented

from flowsearch.errors import BadInput
from flowsearch.search import shards as sh
from flowsearch.search.options import SearchOptions
from flowsearch.search.searcher import Searcher
from flowsearch.search.segment import SegmentReader


@pytest.fixture(scope="module")
def index(tmp_path_factory, model_dir):
    return segmented(tmp_path_factory.mktemp("options"), model_dir)


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("segment_threads", -1),
        ("segment_threads", 1.5),
        ("hybrid_candidates", 0),
        ("hybrid_candidates", True),
        ("row_cache_bytes", -1),
        ("lexical_cache_bytes", -1),
        ("filter_memory_bytes", 1000),
        ("filter_timeout", 0.0),
        ("filter_timeout", float("nan")),
        ("shard_timeout", -5),
        ("shard_timeout", "60"),
    ],
)
def test_every_option_is_range_checked(name, bad):
    with pytest.raises(BadInput, match=name) as caught:
        SearchOptions(**{name: bad})
    assert "\n" not in str(caught.value)


def test_every_option_says_what_it_trades():
    import inspect

    from flowsearch.search import options

    lines = inspect.getsource(options.SearchOptions).splitlines()
    for f in fields(SearchOptions):
        at = next(i for i, line in enumerate(lines) if line.startswith(f"    {f.name}:"))
        assert lines[at - 1].strip().startswith("#:"), f.name  # its one line of trade-off


def test_open_refuses_options_that_are_not_search_options(index):
    with pytest.raises(BadInput, match="SearchOptions"):
        Searcher.open(index, options={"segment_threads": 1})  # type: ignore[arg-type]


def test_two_searchers_with_different_options_answer_side_by_side(index, monkeypatch):
    """One searcher searches in turn with few hybrid candidates, the other with helper threads
    and many; asked concurrently from several threads, each answers as it does alone, with its
    own candidates per side and on its own threads."""
    narrow = Searcher.open(index, options=SearchOptions(segment_threads=1, hybrid_candidates=10))
    wide = Searcher.open(index, options=SearchOptions(segment_threads=3, hybrid_candidates=60))
    assert narrow.options.hybrid_candidates == 10 and wide.options.segment_threads == 3
    alone = {
        id(s): [s.search(q, k=5, mode=m) for q in QUERIES for m in ("dense", "hybrid")]
        for s in (narrow, wide)
    }
    asked: dict[int, set[int]] = {}  # shard -> the candidates per side it was asked for
    threads: dict[int, set[str]] = {}  # segment reader -> threads it was searched on
    plain_answer, plain_search = sh.SegmentSet.answer, SegmentReader.search
    lock = threading.Lock()

    def answer(self, request):
        with lock:
            asked.setdefault(id(self), set()).add(request.k)
        return plain_answer(self, request)

    def search(self, *args):
        with lock:
            threads.setdefault(id(self), set()).add(threading.current_thread().name)
        return plain_search(self, *args)

    monkeypatch.setattr(sh.SegmentSet, "answer", answer)
    monkeypatch.setattr(SegmentReader, "search", search)

    def ask(job):
        s, q, m = job
        return id(s), q, m, s.search(q, k=5, mode=m)

    jobs = [(s, q, m) for _ in range(3) for q in QUERIES for m in ("dense", "hybrid")
            for s in (narrow, wide)]  # fmt: skip
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(ask, jobs))
    order = [(q, m) for q in QUERIES for m in ("dense", "hybrid")]
    for owner, q, m, hits in done:
        want = alone[owner][order.index((q, m))]
        assert [h.id for h in hits] == [h.id for h in want]
        assert [h.score for h in hits] == pytest.approx([h.score for h in want], abs=1e-6)
    shard = {id(s): s._shards(s.version).shards[0] for s in (narrow, wide)}  # type: ignore[attr-defined]
    assert asked[id(shard[id(narrow)])] == {5, 10}  # k for dense, its 10 for hybrid
    assert asked[id(shard[id(wide)])] == {5, 60}
    # the narrow one searched its segments on the asking threads only; the wide one also on
    # its own helpers (threads another searcher never uses)
    readers = {id(s): [id(r) for r in s.version.segments] for s in (narrow, wide)}
    assert not set(readers[id(narrow)]) & set(readers[id(wide)])  # each opened its own
    used = {t for r in readers[id(narrow)] for t in threads.get(r, ())}
    assert used and not any(t.startswith("flowsearch-segments") for t in used)
    assert narrow._backend.helpers._pool is None  # type: ignore[attr-defined]
    assert wide._backend.helpers._pool is not None  # type: ignore[attr-defined]
    narrow.close()
    wide.close()
    assert wide._backend.helpers.executor() is None  # type: ignore[attr-defined]


def test_close_shuts_the_helper_threads_down(index):
    s = Searcher.open(index, options=SearchOptions(segment_threads=2))
    s.search("river water", k=3, mode="dense")
    pool = s._backend.helpers._pool  # type: ignore[attr-defined]
    assert pool is not None
    s.close()
    assert pool._shutdown


def test_the_cache_budgets_reach_the_caches(index):
    """``row_cache_bytes`` bounds the searcher's row cache and ``lexical_cache_bytes`` its BM25
    block cache (each searcher its own, whatever the other's)."""
    small = Searcher.open(index, options=SearchOptions(row_cache_bytes=12_345,
                                                       lexical_cache_bytes=4_321))  # fmt: skip
    default = Searcher.open(index)
    try:
        assert small._backend.opened.cache._cache.maxsize == 12_345  # type: ignore[attr-defined]
        assert small.version.lexical is not None and small.version.lexical.cache_bytes == 4_321
        defaults = SearchOptions()
        assert default._backend.opened.cache._cache.maxsize == defaults.row_cache_bytes  # type: ignore[attr-defined]
        assert default.version.lexical is not None
        assert default.version.lexical.cache_bytes == defaults.lexical_cache_bytes
        assert [h.id for h in small.search("river water", k=5)] == [
            h.id for h in default.search("river water", k=5)
        ]
    finally:
        small.close()
        default.close()
