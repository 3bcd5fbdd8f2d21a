"""The manifest: typed round trip, format-1 migration, refusals (paths leaving the index)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowsearch.errors import FlowsearchError
from flowsearch.storage import manifest as mf

ASSETS = Path(__file__).parent / "assets"


def _minimal(**over):
    raw = {
        "format": mf.FORMAT,
        "format_version": mf.FORMAT_VERSION,
        "version": 2,
        "root": "versions/v000002",
        "encoder": {"model": "m", "revision": "r", "pooling": "mean", "max_length": 8, "dim": 4},
        "dim": 4,
        "calibration": {"name": "none", "calibrator": "none", "space": "encoder"},
        "faiss": {"factory": "Flat"},
        "columns": {"text": "text", "id": "id"},
        "rows": 3,
        "shards": [{"path": "shards/part-00000.parquet", "rows": 3}],
        "files": {"index.faiss": {"bytes": 1, "sha256": "0" * 64}},
    }
    raw.update(over)
    return raw


def test_round_trip_is_identity(tmp_path):
    m = mf.from_dict(_minimal())
    m = replace(m, encoder=replace(m.encoder, options={"backend": "onnx", "quantize": "int8"}))
    mf.write(tmp_path, m)
    assert mf.is_index_dir(tmp_path)
    back = mf.read(tmp_path)
    assert back == m
    assert back.encoder.identity()["backend"] == "onnx"
    assert mf.from_dict(json.loads((tmp_path / mf.MANIFEST_NAME).read_text())) == m


def test_first_release_manifest_is_migrated():
    raw = json.loads((ASSETS / "index_v1" / "manifest.json").read_text())
    assert raw["format_version"] == 1 and raw["encoder"]["pooling"] == "static"
    m = mf.from_dict(raw)
    assert m.format_version == mf.FORMAT_VERSION and m.root == "." and m.version == 1
    # the first release's static pooling read the embedding layer's output (positions included)
    assert m.encoder.pooling == "embedding_layer"
    assert m.faiss.factory == raw["index"]["factory"] and m.rows == raw["rows"]
    assert m.calibration.calibrator == "flow" and m.calibration.calibrated
    assert m.density is not None and m.density.rows == raw["density"]["rows"]
    assert [s.path for s in m.shards] == [s["path"] for s in raw["shards"]]
    assert set(m.files) == set(raw["files"])


@pytest.mark.parametrize(
    "field, value",
    [
        ("root", "../elsewhere"),
        ("root", "/etc"),
        ("shards", [{"path": "../../etc/passwd", "rows": 3}]),
        ("shards", [{"path": "/abs/part.parquet", "rows": 3}]),
        ("files", {"../x": {"bytes": 1, "sha256": "0" * 64}}),
        ("tombstones", "shards/../../t.npy"),
    ],
)
def test_paths_leaving_the_index_are_refused(field, value):
    with pytest.raises(FlowsearchError, match="leaves the index|not a relative path"):
        mf.from_dict(_minimal(**{field: value}))


@pytest.mark.parametrize(
    "raw, message",
    [
        ([], "not a flowsearch manifest"),
        ({"format": "other"}, "not a flowsearch manifest"),
        (_minimal(format_version=99), "newer than this flowsearch"),
        (_minimal(format_version="2"), "bad format_version"),
        (_minimal(rows=5), "do not add up"),
        (_minimal(deleted=9), "inconsistent"),
        ({k: v for k, v in _minimal().items() if k != "encoder"}, "malformed"),
        (_minimal(encoder={"model": "m"}), "malformed"),
    ],
)
def test_bad_manifests_are_refused(raw, message):
    with pytest.raises(FlowsearchError, match=message):
        mf.from_dict(raw)


def test_read_errors_are_one_line(tmp_path):
    with pytest.raises(FlowsearchError, match="no index at"):
        mf.read(tmp_path / "missing")
    with pytest.raises(FlowsearchError, match="not a flowsearch index"):
        mf.read(tmp_path)
    (tmp_path / mf.MANIFEST_NAME).write_text("{not json")
    with pytest.raises(FlowsearchError, match="not valid JSON"):
        mf.read(tmp_path)
    (tmp_path / mf.MANIFEST_NAME).write_bytes(b"\xff\xfe")
    with pytest.raises(FlowsearchError, match="unreadable"):
        mf.read(tmp_path)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from(sorted(_minimal())),
    value=_json,
)
def test_any_corrupted_field_is_a_flowsearch_error_or_accepted(key, value):
    """Whatever a hand-edited manifest holds, reading it never raises anything else."""
    raw = _minimal(**{key: value})
    try:
        m = mf.from_dict(raw)
    except FlowsearchError:
        return
    assert isinstance(m, mf.Manifest)


@settings(max_examples=200, deadline=None)
@given(raw=_json)
def test_arbitrary_json_is_a_flowsearch_error(raw):
    with pytest.raises(FlowsearchError):
        mf.from_dict(raw)


def test_old_index_opens_and_answers_as_before(tmp_path):
    """The first release's index (a committed asset, model moved since) answers the same hits."""
    from flowsearch import Searcher, add_to_index

    index = shutil.copytree(ASSETS / "index_v1", tmp_path / "old")
    model = shutil.copytree(ASSETS / "tiny_bert", tmp_path / "moved_model")
    expected = json.loads((ASSETS / "index_v1_hits.json").read_text())
    searcher = Searcher.open(index, model=model, verify=True)
    assert searcher.manifest.encoder.pooling == "embedding_layer"
    for query, hits in expected.items():
        got = searcher.search(query, k=5)
        assert [h.id for h in got] == [h[0] for h in hits]
        assert [h.score for h in got] == pytest.approx([h[1] for h in hits], abs=1e-5)
    # a write moves it to the versioned layout; the hits stay, the moved model is remembered
    extra = tmp_path / "extra.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table(
            {
                "id": ["n1"],
                "text": ["the ship sails"],
                "topic": ["x"],
                "year": pa.array([2000], pa.int32()),
            }
        ),
        extra,
    )
    add_to_index(extra, index, model=model)
    m = mf.read(index)
    assert m.version == 2 and m.root == "versions/v000002" and m.rows == 121
    assert m.encoder.source == str(model.resolve())
    again = Searcher.open(index, verify=True)
    for query, hits in expected.items():
        assert [h.id for h in again.search(query, k=5, mode="dense")] == [h[0] for h in hits]
