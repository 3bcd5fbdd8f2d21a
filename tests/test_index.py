"""FAISS wrappers of flowsearch.ann (factory, build, tune, io, prefilter, ondisk) on synthetic
vectors."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from flowsearch.ann import build as ab
from flowsearch.ann import factory as af
from flowsearch.ann import io as aio
from flowsearch.ann import tune as at
from flowsearch.ann.policy import AnnPolicy
from flowsearch.errors import FlowsearchError


def _unit(n: int, dim: int = 16, seed: int = 0, clusters: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    if clusters:  # clustered data, like real embeddings, so IVF has structure to exploit
        centres = np.random.default_rng(1234).normal(size=(clusters, dim)) * 3
        x += centres[rng.integers(clusters, size=n)]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def test_auto_factory_switches_at_threshold():
    flat_max = AnnPolicy().flat_max_rows
    assert af.auto_factory(flat_max) == "Flat"
    assert af.auto_factory(flat_max + 1) == AnnPolicy().graph_factory == "HNSW32"
    assert af.auto_factory(1_000_000) == "HNSW32"
    assert af.auto_factory(1_000, AnnPolicy(flat_max_rows=1_000)) == "Flat"
    assert af.auto_factory(1_001, AnnPolicy(flat_max_rows=1_000)) == "HNSW32"
    small = AnnPolicy(flat_max_rows=10, graph_factory="HNSW8")
    assert af.auto_factory(10, small) == "Flat" and af.auto_factory(11, small) == "HNSW8"
    assert af.auto_factory(11) == "Flat"  # the policy is an argument, not a global


def test_auto_factory_picks_ivf_pq_with_rerank_past_the_graph_threshold():
    graph_max = AnnPolicy().graph_max_rows
    assert af.auto_factory(graph_max, dim=384) == "HNSW32"
    assert af.auto_factory(graph_max + 1, dim=384) == af.large_factory(graph_max + 1, 384)
    assert af.large_factory(1_000_000, 384) == "IVF1024,PQ48,RFlat"
    assert af.large_factory(100_000_000, 768) == "IVF8192,PQ96,RFlat"
    assert af.large_factory(1_000, 100) == "IVF16,PQ10,RFlat"  # m divides dim; >= 39 rows a list
    policy = AnnPolicy(flat_max_rows=1_000, graph_max_rows=2_000)
    assert af.auto_factory(5_000, policy, dim=32) == "IVF64,PQ4,RFlat"
    with pytest.raises(ValueError, match="needs dim"):
        af.auto_factory(graph_max + 1)
    assert af.refined("IVF64,PQ4,RFlat") and af.refined("IVF64,PQ4,Refine(Flat)")
    assert not af.refined("IVF64,PQ4") and not af.refined("HNSW32")


def test_ivf_factory_keeps_enough_training_points_per_list():
    assert af.ivf_factory(2_000) == "IVF32,Flat"  # >= 39 points per list
    assert af.ivf_factory(200_000) == "IVF2048,Flat"
    assert af.ivf_factory(1_000_000) == "IVF4096,Flat"


def _filled(x: np.ndarray, factory: str) -> faiss.Index:
    """What ingest does: an empty index, trained on (a sample of) the vectors, filled in chunks."""
    index = af.new_index(x.shape[1], factory)
    ab.train(index, x, factory)
    for lo in range(0, len(x), 700):
        ab.add(index, x[lo : lo + 700], factory)
    return index


def _brute(q: np.ndarray, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = q @ x.T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, rows, 1), rows


def test_flat_is_exact_inner_product():
    x = _unit(500)
    q = _unit(7, seed=1)
    assert af.auto_factory(len(x)) == "Flat"
    index = _filled(x, "Flat")
    assert index.ntotal == 500 and index.is_trained
    scores, rows = aio.search(index, q, 5)
    want_scores, want_rows = _brute(q, x, 5)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)


def test_exact_knn_over_chunks_equals_brute_force():
    x = _unit(1_000, seed=3)
    q = _unit(9, seed=4)
    chunks = [x[:1], x[1:333], x[333:333], x[333:]]  # uneven, one empty, one of a single row
    scores, rows = at.exact_knn(q, iter(chunks), 12)
    want_scores, want_rows = _brute(q, x, 12)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
    _, few = at.exact_knn(q, [x[:5]], 8)  # fewer rows than k: -1 pads
    assert (few[:, :5] >= 0).all() and (few[:, 5:] == -1).all()


def test_auto_graph_reaches_target_recall_on_fresh_queries():
    x = _unit(6_000, dim=24, clusters=30)
    index, factory, params = ab.build(x, "auto", AnnPolicy(flat_max_rows=1_000, target_recall=0.95))
    assert factory == "HNSW32" and params.startswith("efSearch=")
    q = _unit(300, dim=24, seed=5, clusters=30)  # fresh queries from the same distribution
    _, found = aio.search(index, q, 10)
    _, truth = aio.search(ab.build(x, "Flat")[0], q, 10)
    assert at.recall_at_k(found, truth) >= 0.93  # tuned to 0.95 on its own queries


def test_recall_at_k():
    truth = np.array([[1, 2, 3], [4, 5, 6]])
    assert at.recall_at_k(np.array([[3, 2, 1], [4, 9, 9]]), truth, k=3) == pytest.approx(4 / 6)
    assert at.recall_at_k(np.array([[9, 9, 1], [4, 5, 9]]), truth, k=2) == pytest.approx(2 / 4)


def test_any_factory_string_trains_when_needed(tmp_path):
    x = _unit(2_000, clusters=40)
    q = _unit(50, seed=7, clusters=40)
    index = _filled(x, "IVF16,Flat")
    assert index.is_trained and index.ntotal == 2_000
    aio.set_params(index, "nprobe=1")  # written with nprobe=1 ...
    aio.write_index(index, tmp_path / "i.faiss")
    _, exact = _brute(q, x, 10)
    _, one = aio.search(index, q, 10)
    again = aio.read_index(tmp_path / "i.faiss", "nprobe=16")  # ... read with nprobe=16
    assert faiss.extract_index_ivf(again).nprobe == 16
    _, sixteen = aio.search(again, q, 10)
    np.testing.assert_array_equal(sixteen, exact)  # 16 of 16 lists: exact search
    assert at.recall_at_k(one, exact) < 1.0  # nprobe=1 would not be
    assert faiss.extract_index_ivf(aio.read_index(tmp_path / "i.faiss")).nprobe == 1


def test_train_uses_at_most_max_rows(monkeypatch):
    x = _unit(3_000, clusters=10)
    index = af.new_index(16, "IVF8,Flat")
    seen: list[int] = []
    real = index.train
    monkeypatch.setattr(index, "train", lambda sample: (seen.append(len(sample)), real(sample)))
    ab.train(index, x, "IVF8,Flat", max_rows=1_000)
    assert seen == [1_000] and index.is_trained
    flat = af.new_index(16, "Flat")
    ab.train(flat, x, "Flat")  # nothing to train: a no-op
    assert flat.ntotal == 0


def test_add_continues_row_numbers_and_k_is_clamped():
    x = _unit(30)
    index = _filled(x[:20], "Flat")
    ab.add(index, x[20:])
    scores, rows = aio.search(index, x[25:26], 100)
    assert rows.shape == (1, 30) and rows[0, 0] == 25


def test_bad_factory_is_a_user_error(tmp_path):
    with pytest.raises(FlowsearchError, match="rejects index factory"):
        ab.build(_unit(50), "NoSuchIndex123")
    with pytest.raises(FlowsearchError, match="cannot train"):
        ab.build(_unit(50), "IVF4096,Flat")
    with pytest.raises(FlowsearchError, match="cannot add vectors.*add_with_ids"):
        ab.build(_unit(50), "IDMap,Flat")
    with pytest.raises(FlowsearchError, match="cannot add vectors"):
        ab.add(faiss.index_factory(16, "IDMap,Flat"), _unit(5))
    (tmp_path / "junk.faiss").write_bytes(b"not an index")
    with pytest.raises(FlowsearchError, match="cannot read FAISS index"):
        aio.read_index(tmp_path / "junk.faiss")


@pytest.mark.parametrize(
    ("factory", "dim", "message"),
    [("Bogus9", 16, "rejects index factory"), ("PQ5", 16, "multiple of"),
     ("IDMap,Flat", 16, "IDMap is not supported")],
)  # fmt: skip
def test_check_factory_rejects_before_any_vectors(factory, dim, message):
    with pytest.raises(FlowsearchError, match=message) as info:
        af.check_factory(factory, dim)
    assert "\n" not in str(info.value)
    for ok in ("auto", "Flat", "IVF16,Flat", "HNSW32", "PQ4"):
        af.check_factory(ok, dim)


def test_probe_queries_are_unit_seeded_and_move_with_noise():
    x = _unit(400, dim=32, clusters=8)
    q = at.probe_queries(x, 50, noise=0.5, seed=3)
    assert q.shape == (50, 32) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(q, at.probe_queries(x, 50, noise=0.5, seed=3))
    near = (at.probe_queries(x, 50, noise=0.1) @ x.T).max(axis=1)
    far = (at.probe_queries(x, 50, noise=1.0) @ x.T).max(axis=1)
    assert near.mean() > far.mean() and near.min() > 0.98  # more noise: further from the data
    assert at.probe_queries(x[:10], 50).shape == (10, 32)  # never more queries than rows


def test_tune_search_sets_hnsw_ef_search_and_leaves_flat_alone():
    x = _unit(3_000, dim=24, clusters=30)
    chunks = lambda: iter([x[:1_000], x[1_000:]])  # noqa: E731
    hnsw = af.new_index(24, "HNSW8")
    ab.add(hnsw, x)
    params, recall = at.tune_search(hnsw, x, chunks, target=0.99)
    name, _, value = params.partition("=")
    assert name == "efSearch" and int(value) >= 16 and recall >= 0.97  # on check queries
    assert faiss.downcast_index(hnsw).hnsw.efSearch == int(value)
    aio.set_params(hnsw, params)  # the stored string is one ParameterSpace accepts
    flat = af.new_index(24, "Flat")
    ab.add(flat, x)
    assert at.tune_search(flat, x, chunks) == ("", 1.0)


def test_tune_search_stops_at_the_largest_setting_when_target_is_unreachable():
    x = _unit(2_000, dim=16, clusters=20)
    index, _, _ = ab.build(x, "IVF16,Flat")
    params, recall = at.tune_search(index, x, lambda: iter([x]), target=1.01)
    assert params == "nprobe=16" and recall == 1.0  # all lists: exact, and no endless loop


def _large(x: np.ndarray) -> tuple[faiss.Index, str, str]:
    """``auto`` past lowered thresholds: the IVF-PQ path with its exact re-rank."""
    return ab.build(x, "auto", AnnPolicy(flat_max_rows=500, graph_max_rows=1_000))


def test_large_path_reranks_to_the_target_recall_where_bare_pq_cannot():
    x = _unit(12_000, dim=32, clusters=60)
    index, factory, params = _large(x)
    assert factory == "IVF128,PQ4,RFlat"
    assert isinstance(index, faiss.IndexRefineFlat) and index.ntotal == len(x)
    assert params.startswith("nprobe=") and ",k_factor_rf=" in params
    q = _unit(300, dim=32, seed=9, clusters=60)  # fresh queries from the same distribution
    _, truth = _brute(q, x, 10)
    _, found = aio.search(index, q, 10)
    assert at.recall_at_k(found, truth) >= 0.93  # tuned to 0.95 on its own queries
    faiss.downcast_index(index).k_factor = 1  # the PQ codes' own ranking: far from it
    _, bare = aio.search(index, q, 10)
    assert at.recall_at_k(bare, truth) < 0.8


def test_ivf_training_is_bounded(monkeypatch):
    x = _unit(12_000, dim=32, clusters=20)
    index = af.new_index(32, "IVF16,PQ4,RFlat")
    seen: list[int] = []
    real = index.train
    monkeypatch.setattr(index, "train", lambda sample: (seen.append(len(sample)), real(sample)))
    ab.train(index, x, "IVF16,PQ4,RFlat")
    assert seen == [10_000]  # max(64 rows per list, 10,000), not the 12,000 given
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    assert ivf.cp.niter == ab.IVF_TRAIN_ITERATIONS == ivf.pq.cp.niter
    assert not ivf.do_polysemous_training


def test_large_path_memory_maps_and_prefilters(tmp_path):
    from flowsearch.ann.prefilter import filtered_search, prepare_index

    x = _unit(6_000, dim=32, clusters=40)
    index, factory, params = _large(x)
    aio.write_index(index, tmp_path / "i.faiss")
    mapped = aio.read_index(tmp_path / "i.faiss", params, mmap=factory)
    prepare_index(mapped)  # no direct map needed: it reconstructs from the re-rank vectors
    q = _unit(40, dim=32, seed=3, clusters=40)
    np.testing.assert_array_equal(aio.search(mapped, q, 10)[1], aio.search(index, q, 10)[1])
    dead = np.zeros(len(x), dtype=bool)
    dead[::2] = True
    for exact_below in (10, 100_000):  # through the FAISS selector, and by brute force
        scores, rows = filtered_search(mapped, q, 10, excluded=dead, exact_below=exact_below)
        assert (rows >= 0).all() and not dead[rows].any()
    few = np.arange(0, len(x), 97)
    _, rows = filtered_search(mapped, q, 5, rows=few)  # selective: exact over their vectors
    _, want = _brute(q, x[few], 5)
    np.testing.assert_array_equal(rows, few[want])


def test_single_threaded_runs_on_one_thread_and_restores_the_limit():
    import faiss

    before = faiss.omp_get_max_threads()
    assert aio.single_threaded(faiss.omp_get_max_threads) == 1
    assert faiss.omp_get_max_threads() == before

    def fails():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        aio.single_threaded(fails)
    assert faiss.omp_get_max_threads() == before


def test_ivf_lists_filled_in_parts_and_merged_on_disk_answer_like_one_index(tmp_path):
    from flowsearch.ann import ondisk

    x = _unit(1_200, dim=16, clusters=12)
    q = _unit(20, dim=16, seed=2, clusters=12)
    trained = af.new_index(16, "IVF8,Flat")
    ab.train(trained, x, "IVF8,Flat")
    assert ondisk.mergeable(trained) and not ondisk.mergeable(af.new_index(16, "IVF8,PQ4,RFlat"))
    assert not ondisk.mergeable(af.new_index(16, "Flat"))
    blob = faiss.serialize_index(trained)
    parts = []
    for number, lo in enumerate(range(0, 1_200, 500)):  # 500, 500, 200 rows
        path = tmp_path / f"part-{number}.faiss"
        assert ondisk.fill_part(blob, x[lo : lo + 500], lo, path) == len(x[lo : lo + 500])
        parts.append(path)
    merged = ondisk.merge_on_disk(trained, parts, tmp_path / "ann.ivfdata")
    aio.write_index(merged, tmp_path / "ann.faiss")
    # the directory moves: FAISS finds the lists beside the index file, by its base name
    moved = tmp_path.rename(tmp_path.with_name(tmp_path.name + "-moved"))
    for mmap in (None, "IVF8,Flat"):  # lists copied into RAM, or left on disk
        again = aio.read_index(moved / "ann.faiss", "nprobe=8", mmap=mmap, on_disk=True)
        assert again.ntotal == 1_200
        scores, rows = aio.search(again, q, 10)
        want_scores, want_rows = _brute(q, x, 10)  # every list probed: exact
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5)
    with pytest.raises(ValueError, match="empty index"):
        ondisk.merge_on_disk(again, [], moved / "other.ivfdata")  # already filled


def test_read_index_of_a_vanished_file_is_file_not_found(tmp_path):
    # a reader racing a cleanup retries with the current version on FileNotFoundError
    with pytest.raises(FileNotFoundError):
        aio.read_index(tmp_path / "gone.faiss")


@pytest.mark.parametrize("removed", [0.001, 0.05, 0.2, 0.6])
def test_filtered_search_is_exact_whichever_way_it_goes(removed, monkeypatch):
    """Few rows removed: an unfiltered search a little deeper than k, the removed rows dropped
    (queries left short go through the selector); many: the selector. Either way the answer of
    a Flat index is the brute-force top-k among the rows kept, even for queries whose nearest
    rows are all removed (four near-copies of each, all deleted)."""
    from flowsearch.ann import prefilter

    rng = np.random.default_rng(3)
    base = rng.standard_normal((2880, 16)).astype(np.float32)
    copies = np.repeat(base[:40], 3, axis=0) + 0.001 * rng.standard_normal((120, 16))
    X = np.vstack([base, copies]).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(16)
    index.add(X)
    dead = rng.random(len(X)) < removed
    dead[:40] = dead[2880:] = True
    Q = np.vstack([X[:40] + 0.01 * rng.standard_normal((40, 16)), rng.standard_normal((60, 16))])
    Q = Q.astype(np.float32)
    selected = []
    real = prefilter._selected
    monkeypatch.setattr(
        prefilter, "_selected", lambda i, q, *a: selected.append(len(q)) or real(i, q, *a)
    )
    for k in (1, 10, 50):
        with monkeypatch.context() as patch:  # as shallow as the path gets
            patch.setattr(prefilter, "EXACT_BELOW", 0)
            patch.setattr(prefilter, "POSTFILTER_MARGIN", 0)
            scores, rows = prefilter.filtered_search(index, Q, k, excluded=dead)
        keep = np.flatnonzero(~dead)
        sims = Q @ X[keep].T
        truth = keep[np.argsort(-sims, axis=1, kind="stable")[:, :k]]
        assert not np.isin(rows, np.flatnonzero(dead)).any()
        np.testing.assert_allclose(scores, np.take_along_axis(Q @ X.T, rows, axis=1), atol=1e-5)
        np.testing.assert_allclose(scores, -np.sort(-sims, axis=1)[:, :k], atol=1e-5)
        assert (rows == truth).mean() > 0.99  # ties of float32 scores may swap a pair
    if removed < 0.25:  # the short queries, and only they, went through the selector
        assert selected and all(0 < n < len(Q) for n in selected)
    else:
        assert selected == [len(Q)] * 3


def test_filtered_search_past_deletions_on_an_l2_index_keeps_nearest_first():
    """A factory string may build an L2 index (smaller is nearer): reading past deleted rows
    keeps that order, ties to the lower row."""
    from flowsearch.ann.prefilter import filtered_search

    rng = np.random.default_rng(9)
    X = rng.standard_normal((500, 8)).astype(np.float32)
    X[[3, 7, 9]] = X[2]  # four copies
    index = faiss.IndexFlatL2(8)
    index.add(X)
    dead = np.zeros(len(X), bool)
    dead[[2, 100, 200]] = True
    scores, rows = filtered_search(index, X[2:3] + 1e-4, 5, excluded=dead, exact_below=0)
    keep = np.flatnonzero(~dead)
    dist = ((X[keep] - (X[2] + 1e-4)) ** 2).sum(axis=1)
    assert rows[0, :3].tolist() == [3, 7, 9]  # the tied copies, lowest row first
    np.testing.assert_allclose(scores[0], np.sort(dist)[:5], rtol=1e-4, atol=1e-6)
    assert rows[0].tolist() == keep[np.argsort(dist, kind="stable")[:5]].tolist()
