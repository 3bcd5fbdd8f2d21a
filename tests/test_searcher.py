"""Searcher: hit lists, agreement with brute force, verification, refusals, threads, end to end."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from corpus_helpers import (
    model_dir_fixture,  # noqa: F401 - the `model_dir` fixture
    sentences,
    write_corpus,
)

from flowsearch.encoder import Encoder
from flowsearch.errors import FlowsearchError
from flowsearch.ingest import build_index
from flowsearch.searcher import Hit, Searcher

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("searcher")
    corpus = write_corpus(root / "c.parquet", n=150, seed=3)
    build_index(corpus, root / "idx", model=str(model_dir))
    return root / "idx"


@pytest.fixture(scope="module")
def searcher(index_dir):
    return Searcher.open(index_dir)


def test_hits_are_ranked_joined_and_typed(searcher, index_dir):
    corpus = pq.read_table(index_dir.parent / "c.parquet").to_pylist()
    hits = searcher.search(corpus[7]["text"], k=5)
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))
    top = hits[0]
    assert isinstance(top, Hit) and top.id == "d7" and top.text == corpus[7]["text"]
    assert top.metadata == {"topic": corpus[7]["topic"], "year": corpus[7]["year"]}
    assert top.score == pytest.approx(1.0, abs=1e-5)
    assert top.log_density is not None and np.isfinite(top.log_density)
    assert len({h.log_density for h in hits}) == 1  # the query's, on every hit
    assert json.loads(json.dumps(top.to_dict()))["id"] == "d7"


def test_batch_equals_singles_and_k_is_clamped(searcher):
    queries = sentences(4, seed=11)
    batch = searcher.search(queries, k=3)
    assert len(batch) == 4
    for q, hits in zip(queries, batch, strict=True):
        single = searcher.search(q, k=3)
        assert [h.id for h in single] == [h.id for h in hits]
        np.testing.assert_allclose([h.score for h in single], [h.score for h in hits], rtol=1e-5)
    assert len(searcher.search("the cat", k=1000)) == 150
    assert searcher.search([], k=3) == []
    with pytest.raises(FlowsearchError, match="k must be"):
        searcher.search("the cat", k=0)
    with pytest.raises(FlowsearchError, match="strings"):
        searcher.search([1, 2], k=3)


def test_search_vectors_and_brute_force_agree(searcher):
    queries = sentences(6, seed=12)
    Z, lp = searcher.embed(queries)
    assert lp is not None and lp.shape == (6,)
    by_text = searcher.search(queries, k=10)
    by_vec = searcher.search_vectors(Z, k=10)
    stored = searcher.vectors()
    brute = Z @ stored.T
    for i in range(len(queries)):
        order = np.argsort(-brute[i], kind="stable")[:10]
        ids = [f"d{j}" for j in order]
        assert [h.id for h in by_text[i]] == [h.id for h in by_vec[i]] == ids
        assert [h.score for h in by_text[i]] == [h.score for h in by_vec[i]]
        np.testing.assert_allclose([h.score for h in by_vec[i]], brute[i, order], rtol=1e-5)
    with pytest.raises(FlowsearchError, match="dim"):
        searcher.search_vectors(np.ones((1, 5), np.float32))


def test_threads_get_the_same_answers(searcher):
    queries = sentences(24, seed=13)
    serial = [[h.id for h in searcher.search(q, k=5)] for q in queries]
    with ThreadPoolExecutor(max_workers=6) as pool:
        threaded = list(pool.map(lambda q: [h.id for h in searcher.search(q, k=5)], queries))
    assert threaded == serial


def test_verify_catches_corruption(tmp_path, index_dir):
    import shutil

    copy = tmp_path / "idx"
    shutil.copytree(index_dir, copy)
    Searcher.open(copy, verify=True)
    shard = next((copy / "shards").glob("*.parquet"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(FlowsearchError, match="checksum mismatch"):
        Searcher.open(copy, verify=True)
    (copy / "index.faiss").unlink()
    with pytest.raises(FlowsearchError, match="missing"):
        Searcher.open(copy)


def test_mismatched_encoder_or_calibrator_is_refused(tmp_path, index_dir, model_dir):
    with pytest.raises(FlowsearchError, match="pooling"):
        Searcher.open(index_dir, encoder=Encoder(str(model_dir), pooling="cls"))
    import shutil

    copy = tmp_path / "idx"
    shutil.copytree(index_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["calibration"]["config"]["depth"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FlowsearchError, match="calibrator"):
        Searcher.open(copy)
    with pytest.raises(FlowsearchError, match="no index"):
        Searcher.open(tmp_path / "nothing")


def test_bundled_model_finds_the_right_passage(tmp_path):
    """End to end on the bundled all-MiniLM-L6-v2 and the shipped sample corpus."""
    corpus = REPO / "data" / "sample.parquet"
    queries = json.loads((REPO / "tests" / "sample_queries.json").read_text())
    start = time.perf_counter()
    build_index(corpus, tmp_path / "idx")
    searcher = Searcher.open(tmp_path / "idx", verify=True)
    results = searcher.search([q["query"] for q in queries], k=3)
    misses = [
        (q["query"], q["expected_id"], [h.id for h in hits])
        for q, hits in zip(queries, results, strict=True)
        if hits[0].id != q["expected_id"]
    ]
    assert misses == []
    assert len(queries) >= 5 and time.perf_counter() - start < 120


@pytest.mark.parametrize("factory", ["IVF2,Flat", "HNSW8"])
def test_other_factories_are_built_and_searched(tmp_path, model_dir, factory):
    corpus = write_corpus(tmp_path / "c.parquet", n=90, seed=5)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), index_factory=factory)
    searcher = Searcher.open(tmp_path / "idx")
    assert searcher.manifest["index"]["factory"] == factory
    texts = pq.read_table(corpus).column("text").to_pylist()
    hits = searcher.search(texts[:5], k=3)
    assert [h[0].id for h in hits] == [f"d{i}" for i in range(5)]


def test_open_searcher_keeps_its_index_through_a_rebuild(tmp_path, model_dir, monkeypatch):
    from flowsearch import store

    monkeypatch.setattr(store, "SHARD_ROWS", 10)  # several shards
    corpus = write_corpus(tmp_path / "a.parquet", n=60, seed=11)
    table = pq.read_table(corpus)
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    s = Searcher.open(out)
    assert len(s.manifest["shards"]) == 6
    # rebuild the same directory from the same rows in reverse order
    pq.write_table(table.take(list(range(59, -1, -1))), tmp_path / "b.parquet")
    build_index(tmp_path / "b.parquet", out, model=str(model_dir), calibration="none",
                overwrite=True)  # fmt: skip
    ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
    for i in (0, 7, 25, 59):
        hit = s.search(texts[i], k=1)[0]
        assert (hit.id, hit.text) == (ids[i], texts[i]) and hit.score > 0.999
    fresh = Searcher.open(out)
    assert [h.id for h in fresh.search(texts[7], k=5)] == [h.id for h in s.search(texts[7], k=5)]


def test_numpy_integer_k(searcher):
    hits = searcher.search("the cat", k=np.int64(4))
    assert [h.rank for h in hits] == [1, 2, 3, 4]
    assert len(searcher.search_vectors(searcher.embed(["the dog"])[0], k=np.int32(2))[0]) == 2
    for bad in (True, 2.0, 0, np.int64(-1)):
        with pytest.raises(FlowsearchError, match="k must be a positive integer"):
            searcher.search("the cat", k=bad)


def test_embed_takes_one_flow_pass_when_it_can(searcher, monkeypatch):
    cal = searcher.calibrator
    assert searcher.space == "calibrated" and searcher.has_density
    U = searcher.encoder.encode(["the red car"], progress=False)
    Z_want = cal.transform(U)
    Z_want /= np.linalg.norm(Z_want, axis=1, keepdims=True)
    lp_want = cal.log_prob(U)

    def twice(*args, **kwargs):
        raise AssertionError("a second flow pass")

    monkeypatch.setattr(cal, "log_prob", twice)
    monkeypatch.setattr(cal, "transform", twice)
    Z, lp = searcher.embed(["the red car"])
    assert Z.dtype == np.float32 and lp.dtype == np.float64
    np.testing.assert_allclose(Z, Z_want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lp, lp_want, rtol=1e-6)


def test_index_on_gpu_is_searched_under_the_lock(index_dir, monkeypatch):
    from flowsearch import index as fx

    held: list[bool] = []
    box: dict[str, Searcher] = {}

    class Moved:  # what faiss.index_cpu_to_all_gpus returns is not always named Gpu*
        def __init__(self, inner):
            self.inner, self.ntotal, self.d = inner, inner.ntotal, inner.d

        def search(self, q, k):
            held.append(box["s"]._index_lock.locked())
            return self.inner.search(q, k)

    monkeypatch.setattr(fx, "num_gpus", lambda: 1)
    monkeypatch.setattr(fx, "to_gpu", Moved)
    box["s"] = Searcher.open(index_dir)
    assert isinstance(box["s"].index, Moved)
    assert len(box["s"].search("the cat", k=3)) == 3 and held == [True]
    assert not isinstance(Searcher.open(index_dir, gpu=False).index, Moved)


def test_open_encoder_takes_the_manifest_source_for_a_relative_model_name(index_dir):
    from flowsearch.searcher import open_encoder

    info = json.loads((index_dir / "manifest.json").read_text())["encoder"]
    assert info["model"] == info["source"] and Path(info["source"]).is_absolute()
    old_style = {**info, "model": "tiny-bert"}  # a relative name, as older manifests kept it
    assert open_encoder(old_style).model_id == info["source"]
