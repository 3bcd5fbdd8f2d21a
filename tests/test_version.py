"""A version described (index_info, sizes) and opened (load): parts checked against the manifest."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from corpus_helpers import write_corpus
from flowsearch.writes.rewrite import delete

from flowsearch.errors import FlowsearchError
from flowsearch.search.version import index_info, load, sizes
from flowsearch.storage import manifest as mf
from flowsearch.writes.build import build_index


@pytest.fixture(scope="module")
def index(tmp_path_factory, model_dir):
    tmp = tmp_path_factory.mktemp("version")
    out = tmp / "idx"
    build_index(write_corpus(tmp / "c.parquet", n=60), out, model=str(model_dir))
    delete(out, ["d1", "d2"])
    return out


def test_load_pins_every_part_of_the_current_version(index):
    m = mf.read(index)
    v = load(index, m, verify=True, encoder=None, model=None, on_gpu=False)
    try:
        assert v.manifest == m and v.faiss_index.ntotal == m.rows == 60
        assert v.lexical is not None and v.lexical.n_rows == 60
        assert v.deleted is not None and np.flatnonzero(v.deleted).tolist() == [1, 2]
        assert v.matching(None) is None
        rows = v.matching("id IN ('d3', 'd4')")
        assert rows is not None and rows.tolist() == [3, 4]
        mask = v.row_mask(rows)
        assert mask is not None and np.flatnonzero(mask).tolist() == [3, 4]
    finally:
        v.reader.close()
        if v._filter is not None:
            v._filter.close()


def test_a_faiss_index_that_disagrees_with_the_manifest_is_refused(index):
    m = mf.read(index)
    with pytest.raises(FlowsearchError, match="holds 60 rows of dim .* the manifest says 61"):
        load(index, replace(m, rows=61), verify=False, encoder=None, model=None, on_gpu=False)


def test_sizes_and_info_describe_the_version_without_loading_a_model(index):
    m = mf.read(index)
    got = sizes(index, m)
    parts = {mf.SHARDS_DIR, mf.CALIBRATOR_DIR, mf.FAISS_FILE, mf.LEXICAL_DIR}
    assert parts <= set(got) and got["total"] >= sum(got[p] for p in parts)
    info = index_info(index)
    assert info.manifest == m and info.bytes == got
    doc = info.to_dict()
    assert doc["live_rows"] == 58 and doc["rows"] == 60 and doc["verified"]["not_hashed"] == []
