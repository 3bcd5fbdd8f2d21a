"""The shard seam in one process: a version's segments split over several shards answer
exactly as one searcher holding them all (the core of serving on Ray, checked without Ray)."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shard_helpers import QUERIES, WHERES, assert_same, segmented, split_searcher, write_again

from flowsearch.errors import BadInput
from flowsearch.lexical.bm25 import Bm25, Statistics, query_terms
from flowsearch.lexical.postings import Postings
from flowsearch.search import shards as sh
from flowsearch.search.searcher import Searcher

GROUPS = [[[0, 3], [1], [2, 4]], [[4], [0, 1, 2, 3]], [[0], [1], [2], [3], [4]]]


@pytest.fixture(scope="module")
def index(tmp_path_factory, model_dir):
    return segmented(tmp_path_factory.mktemp("shards"), model_dir)


def test_bm25_statistics_of_parts_add_up_to_the_whole() -> None:
    texts = [f"tide {'moon ' * (i % 3)}rain {i}" for i in range(30)] + ["sun", "moon tide"] * 5
    parts = [Postings.build(texts[:12]), Postings.build(texts[12:31]), Postings.build(texts[31:])]
    masks = [None, np.arange(19) % 4 == 0, None]
    whole = Bm25(list(zip(parts, masks)))
    queries = ["tides and the moon", "rain sun", "moon moon", "absent words"]
    terms = query_terms(queries)
    halves = [Bm25([(p, m)]) for p, m in zip(parts, masks)]
    summed = Statistics.summed([h.statistics(terms) for h in halves])
    assert summed == whole.statistics(terms)
    assert summed.n_live == whole.n_live and summed.avg_length == whole.avg_length
    offsets = np.cumsum([0] + [p.n_rows for p in parts])
    for query in queries:
        assert whole.upper_bound(query) == halves[0].upper_bound(query, summed)
        s_all, r_all = whole.search(query, k=100)
        pieces = []
        for i, h in enumerate(halves):
            s, r = h.search(query, k=100, statistics=summed)
            pieces.append((s, r))
            live = r[r >= 0]
            np.testing.assert_array_equal(
                h.score_rows(query, live, summed), whole.score_rows(query, live + offsets[i])
            )
        s_m, r_m = sh.dense.merge_top_k(pieces, offsets, 100)
        np.testing.assert_array_equal(r_m, r_all)
        np.testing.assert_array_equal(s_m, s_all)  # bit for bit: the same weights


def test_statistics_missing_a_term_is_refused() -> None:
    stats = Statistics(3, 9, {"tide": 1})
    with pytest.raises(BadInput, match="document frequency"):
        stats.df_of("moon")


@pytest.mark.parametrize("groups", GROUPS)
def test_split_answers_as_one(index, groups) -> None:
    one, split = Searcher.open(index), split_searcher(index, groups)
    assert len(one.version.segments) == 5
    for mode in ("dense", "lexical", "hybrid"):
        for where, k in zip([None, *WHERES], [1, 30, 30, 4, 5]):
            want = one.search(QUERIES, k=k, where=where, mode=mode)
            assert_same(split.search(QUERIES, k=k, where=where, mode=mode), want, 1e-9)
    want = one.query_batch(QUERIES, k=5, min_score=0.2)
    got = split.query_batch(QUERIES, k=5, min_score=0.2)
    for g, w in zip(got, want, strict=True):
        assert_same(g.hits, w.hits, 1e-9)
        assert g.report == w.report
    Z, _ = one.embed(QUERIES)
    assert_same(split.search_vectors(Z, k=7), one.search_vectors(Z, k=7), 1e-9)


def test_split_after_writes_and_refresh(index, tmp_path) -> None:
    copy = shutil.copytree(index, tmp_path / "idx")
    one, split = Searcher.open(copy), split_searcher(copy, GROUPS[0])
    before = split.search(QUERIES, k=8, mode="hybrid")
    write_again(copy, tmp_path)
    assert_same(split.search(QUERIES, k=8, mode="hybrid"), before, 0)  # pinned
    assert split.refresh() and one.refresh()
    assert len(one.version.segments) == 6
    for mode in ("dense", "lexical", "hybrid"):
        assert_same(split.search(QUERIES, k=9, mode=mode), one.search(QUERIES, k=9, mode=mode))
        where = "topic = 'dog'"
        assert_same(split.search(QUERIES, k=9, mode=mode, where=where),
                    one.search(QUERIES, k=9, mode=mode, where=where))  # fmt: skip


def test_a_shard_refuses_another_version(index) -> None:
    s = Searcher.open(index)
    shard = sh.SegmentSet(s.version)
    with pytest.raises(BadInput, match="refresh"):
        shard.statistics(s.version.manifest.version + 1, [])


WORDS = ["cat", "dog", "red", "car", "music", "piano", "river", "old", "book", "the", "zq"]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
    k=st.integers(1, 40),
    mode=st.sampled_from(["dense", "lexical", "hybrid"]),
    groups=st.sampled_from(GROUPS),
)
def test_split_answers_as_one_on_random_queries(index, words, k, mode, groups) -> None:
    query = " ".join(words)
    one, split = _pair(index, groups)
    assert_same(split.search(query, k=k, mode=mode), one.search(query, k=k, mode=mode), 1e-9)


_PAIRS: dict[Any, tuple[Searcher, Searcher]] = {}


def _pair(index: Any, groups: list[list[int]]) -> tuple[Searcher, Searcher]:
    key = (str(index), str(groups))
    if key not in _PAIRS:
        _PAIRS[key] = (Searcher.open(index), split_searcher(index, groups))
    return _PAIRS[key]


def test_ray_engine_without_ray_names_the_extra(index, monkeypatch) -> None:
    import sys

    from flowsearch.errors import MissingExtra

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    with pytest.raises(MissingExtra, match=r"flowsearch\[ray\]"):
        Searcher.open(index, engine="ray", shards=2)


def test_engine_shards_and_address_are_checked(index) -> None:
    from flowsearch.search import ray_shards

    with pytest.raises(BadInput, match="engine"):
        Searcher.open(index, engine="spark")
    with pytest.raises(BadInput, match="engine='ray'"):
        Searcher.open(index, shards=2)
    with pytest.raises(BadInput, match="shards"):
        Searcher.open(index, engine="ray", shards=0)
    for address in ("127.0.0.1:1", "nohost"):
        with pytest.raises(BadInput, match="address") as caught:
            ray_shards._reachable(address)
        assert caught.value.param == "address"


def test_an_address_other_than_the_joined_cluster_is_refused(monkeypatch) -> None:
    import types

    from flowsearch.search import ray_shards

    context = types.SimpleNamespace(gcs_address="10.0.0.5:6379")
    fake = types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context)
    monkeypatch.setattr(ray_shards, "_import_ray", lambda: fake)
    for same in (None, "auto", "10.0.0.5:6379", "ray://10.0.0.5:10001"):
        assert ray_shards.connect(same) == (fake, False)
    with pytest.raises(BadInput, match="already connected to Ray at '10.0.0.5:6379'") as caught:
        ray_shards.connect("10.0.0.6:6379")
    assert caught.value.param == "address"


def test_shards_start_on_the_live_nodes_in_turn() -> None:
    """Each shard names its node (softly, so a lost node's shard starts elsewhere): Ray's
    best-effort SPREAD once put both shards of a 3-node cluster on the head node."""
    pytest.importorskip("ray")
    from types import SimpleNamespace

    from flowsearch.search.ray_shards import _placements

    a, b, c = ("a" * 56, "b" * 56, "c" * 56)  # Ray's node ids: 28 bytes in hex
    nodes = [{"NodeID": c, "Alive": True}, {"NodeID": a, "Alive": True},
             {"NodeID": b, "Alive": False}]  # fmt: skip
    places = _placements(SimpleNamespace(nodes=lambda: nodes), 5)
    assert [p.node_id for p in places] == [a, c, a, c, a]
    assert all(p.soft for p in places)
    assert _placements(SimpleNamespace(nodes=lambda: []), 2) == ["SPREAD", "SPREAD"]


def test_segments_are_balanced_by_rows_and_keep_their_shard(index) -> None:
    from flowsearch.search.ray_shards import assign, specs

    m = Searcher.open(index).manifest
    where = assign(m, 2)
    assert set(where) == {s.name for s in m.segments} and set(where.values()) == {0, 1}
    rows = [sum(s.n_live for s in m.segments if where[s.name] == i) for i in range(2)]
    biggest = max(s.n_live for s in m.segments)
    assert abs(rows[0] - rows[1]) <= biggest
    fewer = m.model_copy(update={"segments": m.segments[1:]})
    assert all(assign(fewer, 2, where)[s.name] == where[s.name] for s in fewer.segments)
    starts = np.cumsum([0] + [s.n_rows for s in m.segments])[:-1].tolist()
    parts = specs(m, where, 2)
    assert sorted(b for p in parts for b in p.base) == starts
    for p in parts:  # each shard's segments in version order, with their global first rows
        names = [s.name for s in p.manifest.segments]
        assert names == [s.name for s in m.segments if where[s.name] == parts.index(p)]
        assert list(p.base) == [starts[[s.name for s in m.segments].index(n)] for n in names]


def test_statistics_cache_answers_while_another_reader_moves_it_to_a_newer_version() -> None:
    """A reader still on version 1 gathers its statistics while another reader moves the shared
    cache to version 2: it gets version 1's figures (it once failed an internal assert)."""
    from flowsearch.search.shards import Statistics as Whole
    from flowsearch.search.shards import StatisticsCache

    cache = StatisticsCache()

    def stats(version: int, df: dict[str, int]) -> Whole:
        return Whole(version, 10 * version, None, Statistics(10 * version, 50, df))

    class Racing:
        def statistics(self, version: int, terms) -> list[Whole]:
            if version == 1:  # meanwhile, a reader of version 2 takes the cache
                cache.get(Steady(), 2, ["heat"])
            return [stats(version, {t: version for t in terms})]

    class Steady:
        def statistics(self, version: int, terms) -> list[Whole]:
            return [stats(version, {t: version for t in terms})]

    got = cache.get(Racing(), 1, ["heat", "dog"])  # type: ignore[arg-type]
    assert got.version == 1 and got.n_live == 10
    assert got.lexical is not None and got.lexical.df == {"heat": 1, "dog": 1}
    assert cache.version == 2 and cache.get(Steady(), 2, ["heat"]).lexical.df == {"heat": 2}  # type: ignore[arg-type, union-attr]


def test_a_ray_shard_searches_its_segments_in_turn_unless_set(index):
    """Shards already search in parallel (one actor per CPU): an actor searches a query's
    segments in turn when ``segment_threads`` is the default (every core), and with as many
    threads as set otherwise."""
    from flowsearch.search import ray_shards
    from flowsearch.search.options import SearchOptions
    from flowsearch.storage import manifest as mf

    m = mf.read(index)
    spec = ray_shards.specs(m, ray_shards.assign(m, 1), 1)[0]
    default = ray_shards.ShardServer(str(index))
    assert default.helpers is None and default._move(spec)._helpers is None
    three = ray_shards.ShardServer(str(index), options=SearchOptions(segment_threads=3))
    assert three.helpers is not None and three.helpers.threads == 3
    assert three._move(spec)._helpers is three.helpers
    ok, answer = three.statistics(spec, ["tide"])
    assert ok and answer.n_live == m.n_live


def test_a_single_query_searches_every_segment_on_one_faiss_thread(index, monkeypatch):
    """With helper threads (the default) or a filter that leaves one segment, each segment
    search of a single query runs on one FAISS thread, as every single query's does."""
    import faiss

    from flowsearch.search.options import SearchOptions
    from flowsearch.search.segment import SegmentReader

    seen: list[int] = []
    plain = SegmentReader.search

    def search(self, *args):
        seen.append(faiss.omp_get_max_threads())
        return plain(self, *args)

    monkeypatch.setattr(SegmentReader, "search", search)
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)  # so that one thread is a choice, not the machine's only
    try:
        s = Searcher.open(index, options=SearchOptions(segment_threads=2))
        s.search("tide moon", k=5, mode="dense")
        assert len(seen) == len(s.version.segments) > 1 and set(seen) == {1}
        seen.clear()
        s.search("tide moon", k=5, mode="dense", where="id LIKE 'a1-%'")
        s.close()
        assert seen == [1]  # one segment holds the rows the filter kept
    finally:
        faiss.omp_set_num_threads(before)
