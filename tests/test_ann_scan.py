"""``auto``'s scan tier (issue 30; off unless ``Settings.scan_max_rows`` is set): every row's
1-bit RaBitQ code scanned, the best re-ranked exactly; its re-rank depth tuned on held-out rows,
kept through a write and a memory-mapped read, and filtered (FAISS 1.15 passes no ID selector
to it: the searchable rows are searched exactly over the re-rank vectors)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from flowsearch.ann import build as ab
from flowsearch.ann import factory as af
from flowsearch.ann import io as ann_io
from flowsearch.ann.prefilter import filtered_search, search_params
from flowsearch.settings import current, override


def _exact(q: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :k]


def _clustered(n: int, dim: int, clusters: int, seed: int = 0) -> np.ndarray:
    """Unit rows around seeded centres (embeddings have neighbourhoods; pure noise has none)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    x = centres[rng.integers(clusters, size=n)] + 0.35 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _near(x: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Queries near rows of ``x`` (held out of the index) as the tuner draws them."""
    return ab.held_out_queries(x, n, seed=seed)[0]


def test_auto_scans_codes_between_flat_and_the_graph():
    assert current().scan_max_rows == 0 and af.auto_factory(20_000) == "HNSW32"  # off by default
    with override(flat_max_rows=100, scan_max_rows=1_000, graph_max_rows=5_000):
        assert af.auto_factory(100) == "Flat"
        assert af.auto_factory(101) == current().scan_factory == "RaBitQfs,RFlat"
        assert af.auto_factory(1_000) == "RaBitQfs,RFlat"
        assert af.auto_factory(1_001) == "HNSW32"
        assert af.auto_factory(5_001, dim=32) == "IVF64,PQ4,RFlat"
        # a graph threshold below the scan threshold wins: no scan past it
        assert af.auto_factory(600, graph_max_rows=500, dim=32).endswith(",PQ4,RFlat")
    assert af.refined(current().scan_factory)
    assert af.mmap_flags("RaBitQfs,RFlat") & faiss.IO_FLAG_MMAP_IFC


def test_the_scan_index_is_tuned_by_its_rerank_depth_and_keeps_it(tmp_path):
    x, held = np.split(_clustered(4_000, 64, 40, seed=1), [3_000])
    with override(flat_max_rows=1_000, scan_max_rows=10_000):
        index, factory, params = ab.build(x, "auto")
    assert factory == "RaBitQfs,RFlat"
    assert isinstance(faiss.downcast_index(index), faiss.IndexRefine)
    name, depth = params.split("=")
    assert name == "k_factor_rf"
    assert 1 < int(depth) <= current().max_k_factor
    fresh = _near(held, 300, seed=5)  # rows the index never saw
    truth = _exact(fresh, x, 10)
    tuned = ab.recall_at_k(index.search(fresh, 10)[1], truth)
    assert tuned >= 0.95
    # written and read back memory-mapped, the tuned depth is applied again
    path = tmp_path / "scan.faiss"
    ann_io.write_index(index, path)
    again = ann_io.read_index(path, params, mmap=factory)
    assert faiss.downcast_index(again).k_factor == int(depth)
    np.testing.assert_array_equal(again.search(fresh, 10)[1], index.search(fresh, 10)[1])
    # the re-rank is what buys the recall: codes alone (depth 1) lose it
    faiss.downcast_index(index).k_factor = 1
    assert ab.recall_at_k(index.search(fresh, 10)[1], truth) < tuned - 0.1


def test_a_filter_on_the_scan_index_returns_the_exact_top_k_of_matching_rows():
    x = _clustered(3_000, 32, 30, seed=2)
    index = af.new_index(32, "RaBitQfs,RFlat")
    ab.train(index, x, "RaBitQfs,RFlat")
    ab.add(index, x)
    faiss.downcast_index(index).k_factor = 1  # the codes alone would miss most of the top 10
    q = _near(_clustered(200, 32, 30, seed=2), 20, seed=3)
    rows = np.arange(1, 3_000, 3, dtype=np.int64)  # a third of the rows: the selector's range
    with pytest.raises(RuntimeError, match="not supported"):  # why it is not used
        index.search(q, 10, params=search_params(index, rows))
    scores, found = filtered_search(index, q, 10, rows, exact_below=0)
    assert found.shape == (20, 10) and np.isin(found, rows).all()
    np.testing.assert_array_equal(found, rows[_exact(q, x[rows], 10)])
    np.testing.assert_allclose(scores, np.sort(q @ x[rows].T, axis=1)[:, ::-1][:, :10], atol=1e-5)
    # deletions and a few removed rows (the post-filter's range) stay exact at depth 1 too
    excluded = np.zeros(3_000, dtype=bool)
    excluded[_exact(q, x, 3).ravel()] = True  # each query's best rows deleted
    _, found = filtered_search(index, q, 10, None, excluded=excluded)
    assert not excluded[found].any()


def test_a_segment_written_with_the_scan_tier_is_tuned_recorded_and_searchable(tmp_path):
    from test_ann_tuning import _write

    from flowsearch.storage import manifest as mf

    root = tmp_path / "idx"
    with override(flat_max_rows=600, scan_max_rows=5_000):
        m = _write(root, [1_500, 400], "auto", dim=64)
    big, small = m.segments
    assert (big.ann.factory, small.ann.factory) == ("RaBitQfs,RFlat", "Flat")
    assert big.ann.params.startswith("k_factor_rf=") and big.ann.tuning is not None
    assert 0.9 <= big.ann.tuning.recall <= 1.0
    path = next(p for p in root.rglob(big.ann.path) if big.name in str(p))
    index = ann_io.read_index(path, big.ann.params, mmap=big.ann.factory)
    assert faiss.downcast_index(index).k_factor == int(big.ann.params.split("=")[1])
    assert mf.read(root).segments[0].ann == big.ann  # survives the manifest's round trip


def test_hnsw_is_built_with_the_settings_ef_construction_and_keeps_it(tmp_path):
    assert current().hnsw_ef_construction == 80  # FAISS's own default is 40
    index = af.new_index(16, "HNSW8")
    assert faiss.downcast_index(index).hnsw.efConstruction == 80
    with override(hnsw_ef_construction=12):
        small = af.new_index(16, "HNSW8")
    assert faiss.downcast_index(small).hnsw.efConstruction == 12
    ab.add(small, _clustered(300, 16, 5))
    ann_io.write_index(small, tmp_path / "g.faiss")  # later adds build with the same value
    again = ann_io.read_index(tmp_path / "g.faiss")
    assert faiss.downcast_index(again).hnsw.efConstruction == 12
    assert not isinstance(faiss.downcast_index(af.new_index(16, "Flat")), faiss.IndexHNSW)
