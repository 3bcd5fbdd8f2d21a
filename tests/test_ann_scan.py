"""A scan of 1-bit RaBitQ codes re-ranked exactly (``RaBitQfs,RFlat``): no tier of ``auto`` any
more, but a factory a user may pass (``index_factory``, or ``AnnPolicy.graph_factory``), and what
the segments of an older release's scan tier hold: its re-rank depth tuned on held-out rows, kept
through a write and a memory-mapped read, and filtered (FAISS passes no ID selector to it: the
searchable rows are searched exactly over the re-rank vectors)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from flowsearch.ann import build as ab
from flowsearch.ann import factory as af
from flowsearch.ann import io as ann_io
from flowsearch.ann import tune
from flowsearch.ann.policy import AnnPolicy
from flowsearch.ann.prefilter import filtered_search, search_params

SCAN = "RaBitQfs,RFlat"


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
    return tune.held_out_queries(x, n, seed=seed)[0]


def test_the_scan_index_is_tuned_by_its_rerank_depth_and_keeps_it(tmp_path):
    x, held = np.split(_clustered(4_000, 64, 40, seed=1), [3_000])
    index, factory, params = ab.build(x, "auto", AnnPolicy(flat_max_rows=1_000, graph_factory=SCAN))
    assert factory == SCAN
    assert isinstance(faiss.downcast_index(index), faiss.IndexRefine)
    name, depth = params.split("=")
    assert name == "k_factor_rf"
    assert 1 < int(depth) <= tune.MAX_K_FACTOR
    fresh = _near(held, 300, seed=5)  # rows the index never saw
    truth = _exact(fresh, x, 10)
    tuned = tune.recall_at_k(index.search(fresh, 10)[1], truth)
    assert tuned >= 0.95
    # written and read back memory-mapped, the tuned depth is applied again
    path = tmp_path / "scan.faiss"
    ann_io.write_index(index, path)
    again = ann_io.read_index(path, params, mmap=factory)
    assert faiss.downcast_index(again).k_factor == int(depth)
    np.testing.assert_array_equal(again.search(fresh, 10)[1], index.search(fresh, 10)[1])
    # the re-rank is what buys the recall: codes alone (depth 1) lose it
    faiss.downcast_index(index).k_factor = 1
    assert tune.recall_at_k(index.search(fresh, 10)[1], truth) < tuned - 0.1


def test_a_filter_on_the_scan_index_returns_the_exact_top_k_of_matching_rows():
    x = _clustered(3_000, 32, 30, seed=2)
    index = af.new_index(32, SCAN)
    ab.train(index, x, SCAN)
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


def test_a_segment_of_an_older_scan_tier_is_tuned_recorded_and_searchable(tmp_path):
    """An ``auto`` index whose segment resolved to the scan (what the fourth release's scan
    tier wrote): tuned by its re-rank depth, recorded, read back and searched."""
    from segment_helpers import save_none_calibrator, template

    from flowsearch.storage import manifest as mf
    from flowsearch.storage.rows import rows_table
    from flowsearch.storage.writer import open_writer
    from flowsearch.writes.segments import SegmentBuilder

    root = tmp_path / "idx"
    x = _clustered(1_500, 64, 30, seed=4)
    base = template(dim=64, lexical=False).model_copy(update={"ann_requested": "auto"})
    with open_writer(root, new=True) as writer:
        save_none_calibrator(writer, base.calibration, 64)
        builder = SegmentBuilder(writer, dim=64, n_rows=len(x), requested="auto", factory=SCAN,
                                 lexical=False)  # fmt: skip
        ids = [f"r{i}" for i in range(len(x))]
        builder.add(rows_table(ids, ids, None, x, x), x)
        builder.finish()
        m = writer.publish(kind="build", n_rows=len(x), template=base)
    (big,) = m.segments
    assert big.ann.factory == SCAN
    assert big.ann.params.startswith("k_factor_rf=") and big.ann.tuning is not None
    assert 0.9 <= big.ann.tuning.recall <= 1.0
    path = next(p for p in root.rglob(big.ann.path) if big.name in str(p))
    index = ann_io.read_index(path, big.ann.params, mmap=big.ann.factory)
    assert faiss.downcast_index(index).k_factor == int(big.ann.params.split("=")[1])
    assert mf.read(root).segments[0].ann == big.ann  # survives the manifest's round trip
    q = _near(x, 50, seed=6)
    found = index.search(q, 10)[1]
    assert tune.recall_at_k(found, _exact(q, x, 10)) >= 0.9


def test_hnsw_is_built_with_the_policy_ef_construction_and_keeps_it(tmp_path):
    assert AnnPolicy().ef_construction == 80  # FAISS's own default is 40
    index = af.new_index(16, "HNSW8")
    assert faiss.downcast_index(index).hnsw.efConstruction == 80
    small = af.new_index(16, "HNSW8", AnnPolicy(ef_construction=12))
    assert faiss.downcast_index(small).hnsw.efConstruction == 12
    ab.add(small, _clustered(300, 16, 5))
    ann_io.write_index(small, tmp_path / "g.faiss")  # later adds build with the same value
    again = ann_io.read_index(tmp_path / "g.faiss")
    assert faiss.downcast_index(again).hnsw.efConstruction == 12
    assert not isinstance(faiss.downcast_index(af.new_index(16, "Flat")), faiss.IndexHNSW)
