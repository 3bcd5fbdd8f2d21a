"""``auto``'s graph over a large segment built over its rows' first principal components
(issue 30's 1M build budget): the path taken from ``Settings.projected_graph_min_rows`` on,
an ordinary HNSW index of the full vectors at the end (exact scores, every row, high recall),
saved and read back, recorded in the manifest and shown by ``info``, used by merges, and its
settings checked. The thresholds are lowered so a few thousand synthetic rows take the path.
"""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest
from segment_helpers import build_vectors

from flowsearch.ann import build as ab
from flowsearch.ann import io as ann_io
from flowsearch.errors import BadInput
from flowsearch.settings import current, override
from flowsearch.storage import manifest as mf
from flowsearch.storage.writer import open_writer

DIM = 48


def _clustered(n: int, dim: int = DIM, clusters: int = 40, seed: int = 0) -> np.ndarray:
    """float32 (n, dim) unit rows around seeded centres, most variance in a few directions (as
    an encoder's rows have: what makes the leading components carry the neighbours)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim)) * np.geomspace(3.0, 0.3, dim)
    x = centres[rng.integers(clusters, size=n)] + 0.3 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


#: Settings that send a segment of 1,000 rows or more down the projected path.
PROJECTED = {
    "flat_max_rows": 200,
    "projected_graph_min_rows": 1_000,
    "projected_graph_dims": 12,
    "projected_graph_sample_rows": 800,
    "projected_graph_ef_construction": 24,
}


def _exact(q: np.ndarray, x: np.ndarray, k: int = 10) -> np.ndarray:
    return faiss.knn(q, x, k, metric=faiss.METRIC_INNER_PRODUCT)[1]


def test_a_large_auto_segment_builds_its_graph_over_principal_components():
    x = _clustered(3_000)
    with override(**PROJECTED):
        building, factory = ab.segment_index(DIM, "auto", len(x))
        assert isinstance(building, ab.ProjectedGraph) and factory == "HNSW32"
        assert ab.projection_of(building) == ab.Projection(12, 24, 800)
        index, factory, params = ab.build(x, "auto")
    graph = faiss.downcast_index(index)
    assert isinstance(graph, faiss.IndexHNSWFlat) and factory == "HNSW32"
    assert (index.d, index.ntotal) == (DIM, len(x))  # the full vectors, every row
    assert graph.hnsw.efConstruction == 24 and params.startswith("efSearch=")
    q = x[:200] + 0.05 * np.random.default_rng(1).normal(size=(200, DIM)).astype(np.float32)
    scores, rows = index.search(q, 10)
    assert (rows >= 0).all() and len(np.unique(rows)) > 200  # answers, not one row
    # scores are exact inner products over the full vectors, not the components'
    np.testing.assert_allclose(scores, np.einsum("qd,qkd->qk", q, x[rows]), rtol=1e-5, atol=1e-5)
    assert ab.recall_at_k(rows, _exact(q, x)) >= 0.95
    # every row is reachable: each row's own vector finds it
    assert (index.search(x, 1)[1][:, 0] == np.arange(len(x))).mean() > 0.99


def test_the_graph_is_built_over_the_components_not_the_full_vectors():
    """The same rows and settings, with and without the projection: the graphs differ (the
    projection is what the build used), the answers agree."""
    x = _clustered(2_000)
    with override(**PROJECTED):
        projected, _, _ = ab.build(x, "auto")
    with override(flat_max_rows=200, projected_graph_min_rows=10**9,
                  hnsw_ef_construction=24):  # fmt: skip
        plain, _, _ = ab.build(x, "auto")
    links = [
        faiss.vector_to_array(faiss.downcast_index(i).hnsw.neighbors) for i in (projected, plain)
    ]
    assert not np.array_equal(*links)
    for index in (projected, plain):
        faiss.downcast_index(index).hnsw.efSearch = 128
    q = x[::10]
    agree = ab.recall_at_k(projected.search(q, 10)[1], plain.search(q, 10)[1])
    assert agree >= 0.95


def test_below_the_threshold_or_not_auto_nothing_changes():
    with override(**PROJECTED):
        small, factory = ab.segment_index(DIM, "auto", 999)
        assert factory == "HNSW32" and not isinstance(small, ab.ProjectedGraph)
        assert faiss.downcast_index(small).hnsw.efConstruction == current().hnsw_ef_construction
        asked, factory = ab.segment_index(DIM, "HNSW32", 5_000)  # a user's factory: as asked
        assert factory == "HNSW32" and not isinstance(asked, ab.ProjectedGraph)
        assert ab.projection_for("HNSW32,SQ8", 5_000, DIM) is None  # codes: not a plain graph
        assert ab.projection_for("HNSW32", 5_000, 12) is None  # no fewer components than dims
        assert ab.projection_for("HNSW16", 5_000, DIM) == ab.Projection(12, 24, 800)
        index, _, _ = ab.build(_clustered(900), "auto")
    assert ab.finished(index) is index
    # off by default (0): a segment of any size builds its graph over the full vectors
    assert current().projected_graph_min_rows == 0
    assert ab.projection_for("HNSW32", 10**7, 384) is None
    with override(**{**PROJECTED, "projected_graph_min_rows": 0}):
        assert ab.projection_for("HNSW16", 5_000, DIM) is None


def test_the_index_saves_and_reads_back_as_an_ordinary_hnsw_index(tmp_path):
    x = _clustered(1_500)
    with override(**PROJECTED):
        index, _, params = ab.build(x, "auto")
    ann_io.write_index(index, tmp_path / "ann.faiss")
    again = ann_io.read_index(tmp_path / "ann.faiss", params)
    assert isinstance(faiss.downcast_index(again), faiss.IndexHNSWFlat)
    q = x[:50]
    np.testing.assert_array_equal(again.search(q, 10)[1], index.search(q, 10)[1])
    np.testing.assert_allclose(again.search(q, 10)[0], index.search(q, 10)[0])


def _write(root: Path, sizes: list[int]) -> mf.Manifest:
    vectors = [_clustered(n, seed=at) for at, n in enumerate(sizes)]
    return build_vectors(root, vectors, "auto", DIM)


def test_the_manifest_records_how_the_graph_was_built_and_info_shows_it(tmp_path):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info

    root = tmp_path / "idx"
    with override(**PROJECTED):
        m = _write(root, [1_200, 600])
    big, small = m.segments
    assert big.ann.factory == small.ann.factory == "HNSW32"
    assert big.ann.projection == mf.AnnProjection(dims=12, ef_construction=24, sample_rows=800)
    assert small.ann.projection is None and small.ann.tuning is not None
    assert mf.read(root).segments[0].ann.projection == big.ann.projection  # round trip
    info = index_info(root)
    shown = info.to_dict()["segments"][0]["ann"]["projection"]
    assert shown == {"dims": 12, "ef_construction": 24, "sample_rows": 800}
    text = dict(_info_rows(info))["vector index build"]
    assert big.name in text and "first 12 principal components" in text
    assert small.name not in text


def test_an_index_written_before_the_record_reads_and_shows_no_build_row(tmp_path):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info

    old = mf.AnnRecord.model_validate({"path": "ann.faiss", "factory": "HNSW32"})
    assert old.projection is None
    root = tmp_path / "idx"
    with override(flat_max_rows=200):
        _write(root, [400])
    assert "vector index build" not in dict(_info_rows(index_info(root)))


def test_a_merge_into_a_large_segment_takes_the_same_path(tmp_path):
    from flowsearch.writes.merge import merge

    root = tmp_path / "idx"
    with override(**PROJECTED):
        base = _write(root, [500, 500, 500])
        assert all(s.ann.projection is None for s in base.segments)
        with open_writer(root) as writer:
            record = merge(writer, [s.name for s in base.segments], dim=DIM, requested="auto",
                           lexical=False, schema=())  # fmt: skip
            writer.publish(kind="compact", n_rows=record.n_rows)
    assert record.n_rows == 1_500 and record.ann.projection is not None
    assert record.ann.tuning is not None and record.ann.tuning.recall >= 0.9
    index = ann_io.read_index(root / mf.read(root).segments[0].dir / record.ann.path)
    assert index.ntotal == 1_500 and index.d == DIM


@pytest.mark.parametrize(
    "setting, value, words",
    [
        ("projected_graph_dims", 0, "projected_graph_dims must be a positive integer"),
        ("projected_graph_ef_construction", -3, "projected_graph_ef_construction must be"),
        ("projected_graph_min_rows", 2.5, "projected_graph_min_rows must be an integer of at"),
        ("projected_graph_min_rows", -1, "projected_graph_min_rows must be an integer of at"),
        ("projected_graph_sample_rows", 8, "is below projected_graph_dims"),
    ],
)
def test_bad_settings_are_refused_in_one_line(setting, value, words):
    with override(**PROJECTED), override(**{setting: value}), pytest.raises(BadInput) as err:
        ab.build(_clustered(300), "auto")
    message = str(err.value)
    assert words in message and "\n" not in message


def test_a_build_refuses_bad_settings_before_encoding(tmp_path, model_dir, monkeypatch):
    from corpus_helpers import write_corpus

    from flowsearch import build_index
    from flowsearch.encode import encoder as enc_mod

    encoded = []
    real = enc_mod.Encoder.encode
    monkeypatch.setattr(
        enc_mod.Encoder, "encode", lambda self, *a, **kw: encoded.append(1) or real(self, *a, **kw)
    )
    corpus = write_corpus(tmp_path / "c.parquet", n=20)
    with override(projected_graph_dims=0), pytest.raises(BadInput, match="projected_graph_dims"):
        build_index(corpus, tmp_path / "idx", model=str(model_dir), lexical=False)
    assert not encoded and not (tmp_path / "idx" / "manifest.json").exists()
