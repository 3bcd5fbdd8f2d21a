"""Indexes an older release built with the projected graph (a large segment's HNSW graph built
over its rows' first principal components, an option since removed) still open: such a file is an
ordinary HNSW index of the full vectors, and the manifest's record of how it was built still reads
and ``info`` still shows it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from segment_helpers import build_vectors, unit

from flowsearch.ann.policy import AnnPolicy
from flowsearch.storage import manifest as mf

DIM = 16
BUILT = {"dims": 12, "ef_construction": 24, "sample_rows": 800}


def _with_projection(root: Path, at: int) -> mf.Manifest:
    """Rewrite segment ``at``'s ann record as the projected build recorded it (checksum kept)."""
    path = root / mf.MANIFEST_NAME
    raw = json.loads(path.read_text())
    raw["segments"][at]["ann"]["projection"] = BUILT
    raw["checksum"] = mf.checksum(raw)
    path.write_text(json.dumps(raw))
    return mf.read(root)


def test_a_segment_recorded_as_a_projected_graph_opens_searches_and_shows_in_info(tmp_path):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info

    root = tmp_path / "idx"
    x, y = unit(1_200, DIM, seed=1), unit(300, DIM, seed=2)
    m = build_vectors(root, [x, y], "auto", DIM, ann=AnnPolicy(flat_max_rows=600))
    big, small = _with_projection(root, 0).segments
    assert big.ann.factory == "HNSW32" and small.ann.factory == "Flat"
    assert big.ann.projection == mf.AnnProjection(**BUILT) and small.ann.projection is None
    assert big.ann.tuning == m.segments[0].ann.tuning  # the rest of the record as it was
    info = index_info(root)
    assert info.to_dict()["segments"][0]["ann"]["projection"] == BUILT
    text = dict(_info_rows(info))["vector index build"]
    assert big.name in text and "first 12 principal components" in text
    assert small.name not in text


def test_an_index_written_before_the_record_reads_and_shows_no_build_row(tmp_path):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info

    old = mf.AnnRecord.model_validate({"path": "ann.faiss", "factory": "HNSW32"})
    assert old.projection is None
    root = tmp_path / "idx"
    build_vectors(root, [unit(400, DIM)], "auto", DIM, ann=AnnPolicy(flat_max_rows=200))
    assert "vector index build" not in dict(_info_rows(index_info(root)))


def test_a_segment_recorded_as_a_projected_graph_verifies_and_answers_queries(tmp_path):
    import faiss

    from flowsearch.ann import io as ann_io
    from flowsearch.storage.verify import verify

    root = tmp_path / "idx"
    x = unit(1_200, DIM, seed=3)
    build_vectors(root, [x], "auto", DIM, ann=AnnPolicy(flat_max_rows=600))
    m = _with_projection(root, 0)
    verify(root, m, checksums=True)
    seg = m.segments[0]
    index = ann_io.read_index(root / seg.dir / seg.ann.path, seg.ann.params)
    assert isinstance(faiss.downcast_index(index), faiss.IndexHNSWFlat)
    scores, rows = ann_io.search(index, x[:20], 10)
    np.testing.assert_array_equal(rows[:, 0], np.arange(20))  # each row finds itself first
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
