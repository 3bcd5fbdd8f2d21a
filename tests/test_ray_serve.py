"""Serving an index from Ray shards (``Searcher.open(..., engine="ray")``) against the local
Searcher, on one multi-node Ray cluster made on this machine for the module (a head and two
worker nodes, ``ray.cluster_utils.Cluster``), and a worker node lost while queries run.

Slow (a Ray cluster and its actors cost tens of seconds on 2 shared cores): run by
``make test-ray``."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from shard_helpers import QUERIES, WHERES, assert_same, segmented, write_again  # noqa: E402

from flowsearch.errors import BadInput, Unavailable  # noqa: E402
from flowsearch.search.options import SearchOptions  # noqa: E402
from flowsearch.search.searcher import Searcher  # noqa: E402

pytestmark = pytest.mark.slow

NODE = {"num_cpus": 1}


@pytest.fixture(scope="module")
def cluster() -> Any:
    from ray._private import ray_constants

    # every node on the loopback address (Ray would otherwise give this machine's outward
    # address, which a sandbox may not let the nodes reach), in this process and the nodes'
    loopback = pytest.MonkeyPatch()
    loopback.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    loopback.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    made = Cluster(initialize_head=True, connect=True,
                   head_node_args={**NODE, "include_dashboard": False})  # fmt: skip
    workers = [made.add_node(**NODE) for _ in range(2)]
    made.wait_for_nodes()
    try:
        yield made, workers
    finally:
        ray.shutdown()
        made.shutdown()
        loopback.undo()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    return segmented(tmp_path_factory.mktemp("ray-serve"), model_dir)


@pytest.fixture(scope="module")
def pair(cluster: Any, index: Path) -> Any:
    local = Searcher.open(index)
    on_ray = Searcher.open(index, engine="ray", shards=3)
    yield local, on_ray
    on_ray.close()


def test_every_mode_and_filter_answers_as_local(pair: Any) -> None:
    local, on_ray = pair
    assert "engine='ray', shards=3" in repr(on_ray)
    for mode in ("dense", "lexical", "hybrid"):
        for where in WHERES:
            for k in (1, 25):
                assert_same(on_ray.search(QUERIES, k=k, where=where, mode=mode),
                            local.search(QUERIES, k=k, where=where, mode=mode))  # fmt: skip
    got = on_ray.query_batch(QUERIES, k=6, min_score=0.15)
    want = local.query_batch(QUERIES, k=6, min_score=0.15)
    for g, w in zip(got, want, strict=True):
        assert_same(g.hits, w.hits)
        assert g.report == w.report
    assert_same(on_ray.query(QUERIES[0], k=4).hits, local.query(QUERIES[0], k=4).hits)
    assert_same(on_ray.search(QUERIES[1]), local.search(QUERIES[1]))  # default mode
    Z, _ = local.embed(QUERIES)
    assert_same(on_ray.search_vectors(Z, k=5), local.search_vectors(Z, k=5))
    assert on_ray.info().manifest == local.info().manifest
    with pytest.raises(BadInput, match="where"):
        on_ray.search("x", where="no_such_column = 1")


WORDS = ["cat", "dog", "red", "car", "music", "piano", "river", "old", "book", "the", "zq"]


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
    k=st.integers(1, 40),
    mode=st.sampled_from(["dense", "lexical", "hybrid"]),
    where=st.sampled_from(WHERES),
)
def test_random_queries_answer_as_local(pair: Any, words: list[str], k: int, mode: str,
                                        where: str | None) -> None:  # fmt: skip
    local, on_ray = pair
    query = " ".join(words)
    assert_same(on_ray.search(query, k=k, mode=mode, where=where),
                local.search(query, k=k, mode=mode, where=where))  # fmt: skip


def test_shards_are_capped_and_checked(cluster: Any, index: Path) -> None:
    with pytest.raises(BadInput, match="shards"):
        Searcher.open(index, engine="ray", shards=0)
    many = Searcher.open(index, engine="ray", shards=50)
    try:
        assert len(many._backend.actors) == 5  # one per segment at most
        loads = [len(spec.manifest.segments) for spec in many._backend.current.specs]
        assert loads == [1] * 5
    finally:
        many.close()


def test_refresh_moves_every_shard_after_writes(cluster: Any, index: Path,
                                                tmp_path: Path) -> None:  # fmt: skip
    copy = shutil.copytree(index, tmp_path / "idx")
    local, on_ray = Searcher.open(copy), Searcher.open(copy, engine="ray", shards=2)
    try:
        before = on_ray.search(QUERIES, k=8, mode="hybrid")
        held = {s.name for spec in on_ray._backend.current.specs for s in spec.manifest.segments}
        write_again(copy, tmp_path)
        assert_same(on_ray.search(QUERIES, k=8, mode="hybrid"), before, 0)  # still pinned
        assert on_ray.refresh() and local.refresh()
        assert on_ray.manifest.version == local.manifest.version
        specs = on_ray._backend.current.specs
        assert {spec.version for spec in specs} == {local.manifest.version}
        now = {s.name for spec in specs for s in spec.manifest.segments}
        assert held <= now and len(now - held) == 1  # the upsert's segment, nothing reopened
        for mode in ("dense", "lexical", "hybrid"):
            for where in (None, "topic = 'dog'"):
                assert_same(on_ray.search(QUERIES, k=9, mode=mode, where=where),
                            local.search(QUERIES, k=9, mode=mode, where=where))  # fmt: skip
        assert not on_ray.refresh()
    finally:
        on_ray.close()


def _with_a_shard_on_a_worker(
    index: Path, workers: list[Any], options: SearchOptions | None = None
) -> tuple[Searcher, Any]:
    """A Ray searcher of 2 shards with one on a worker node, and that node. Shards are placed
    on the live nodes in turn by a *soft* affinity, so a busy node's shard may start on the
    head instead (it did once in a loaded run): open again, up to three times."""
    placed: list[Any] = []
    for _ in range(3):
        on_ray = Searcher.open(index, engine="ray", shards=2, options=options)
        placed = ray.get([a.node.remote() for a in on_ray._backend.actors])
        victim = next((w for w in workers if w.node_id in placed), None)
        if victim is not None:
            return on_ray, victim
        on_ray.close()
        time.sleep(2.0)
    raise AssertionError(f"no shard started on a worker node in 3 tries: {placed}")


def test_a_lost_node_gives_the_same_answer_or_unavailable(cluster: Any, index: Path) -> None:
    """Runs last: it removes a worker node. Every query in flight while the node goes either
    answers as the local searcher or raises Unavailable within the timeout; afterwards the
    restarted shard answers as before."""
    made, workers = cluster
    local = Searcher.open(index)
    want = local.search(QUERIES, k=10, mode="hybrid")
    options = SearchOptions(shard_timeout=20.0)
    on_ray, victim = _with_a_shard_on_a_worker(index, workers, options)
    try:
        outcomes: list[Any] = []
        done = threading.Event()

        def ask() -> None:
            while not done.is_set():
                started = time.monotonic()
                try:
                    outcomes.append((on_ray.search(QUERIES, k=10, mode="hybrid"),
                                     time.monotonic() - started))  # fmt: skip
                except Unavailable as exc:
                    outcomes.append((exc, time.monotonic() - started))

        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(1.0)
        made.remove_node(victim, allow_graceful=False)
        time.sleep(8.0)
        done.set()
        asking.join(timeout=60)
        assert not asking.is_alive()  # never a hang
        assert outcomes
        for answer, seconds in outcomes:
            assert seconds < 20.0 + 10.0
            if not isinstance(answer, Unavailable):
                assert_same(answer, want)
        deadline = time.monotonic() + 60
        while True:  # the shard restarts on a node with room and reopens its segments
            try:
                assert_same(on_ray.search(QUERIES, k=10, mode="hybrid"), want)
                break
            except Unavailable:
                assert time.monotonic() < deadline
        now = ray.get([a.node.remote() for a in on_ray._backend.actors])
        assert victim.node_id not in now  # restarted on a node that is left
    finally:
        on_ray.close()
