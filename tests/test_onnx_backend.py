"""The ONNX Runtime backend: same vectors as torch, int8 close to fp32, a cache that holds."""

from __future__ import annotations

import numpy as np
import pytest

from flowsearch.encode.encoder import POOLINGS, Encoder
from flowsearch.errors import FlowsearchError

pytest.importorskip("onnxruntime")

TEXTS = [
    "the cat sat on the mat",
    "a big dog runs to the river and the sea in the old town",
    "tea",
    "",
    "music and song with piano and guitar for the people of the city " * 3,
]
CONTEXTUAL = [p for p in POOLINGS if p != "static"]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWSEARCH_CACHE", str(tmp_path))
    return tmp_path / "onnx"


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.mark.parametrize("pooling", CONTEXTUAL)
def test_onnx_fp32_equals_torch(tiny_model_dir, shared_cache, monkeypatch, pooling):
    monkeypatch.setenv("FLOWSEARCH_CACHE", str(shared_cache))
    torch_vectors = Encoder(str(tiny_model_dir), pooling=pooling).encode(TEXTS, batch_size=2)
    enc = Encoder(str(tiny_model_dir), pooling=pooling, backend="onnx")
    assert enc.describe()["backend"] == "onnx" and enc.describe()["quantize"] is None
    np.testing.assert_allclose(enc.encode(TEXTS, batch_size=2), torch_vectors, atol=1e-4)


def test_onnx_encode_poolings_shares_one_graph(tiny_model_dir, shared_cache, monkeypatch):
    monkeypatch.setenv("FLOWSEARCH_CACHE", str(shared_cache))
    enc = Encoder(str(tiny_model_dir), backend="onnx")
    together = enc.encode_poolings(TEXTS, POOLINGS, batch_size=2)
    reference = Encoder(str(tiny_model_dir)).encode_poolings(TEXTS, POOLINGS, batch_size=2)
    for pooling in POOLINGS:
        np.testing.assert_allclose(together[pooling], reference[pooling], atol=1e-4)


def test_int8_stays_close_to_fp32(tiny_model_dir, shared_cache, monkeypatch):
    monkeypatch.setenv("FLOWSEARCH_CACHE", str(shared_cache))
    fp32 = Encoder(str(tiny_model_dir), backend="onnx").encode(TEXTS)
    enc = Encoder(str(tiny_model_dir), backend="onnx", quantize="int8")
    assert enc.describe()["quantize"] == "int8"
    int8 = enc.encode(TEXTS)
    assert not np.array_equal(int8, fp32)
    cos = (int8 * fp32).sum(1) / np.linalg.norm(int8, axis=1) / np.linalg.norm(fp32, axis=1)
    assert cos.min() > 0.95, cos


def test_export_is_cached_and_a_corrupt_file_is_exported_again(tiny_model_dir, cache):
    first = Encoder(str(tiny_model_dir), backend="onnx")
    runner = first._onnx[()]
    assert runner.exported and runner.path.parent == cache
    stamp = runner.path.stat().st_mtime_ns
    second = Encoder(str(tiny_model_dir), backend="onnx")
    assert not second._onnx[()].exported
    assert second._onnx[()].path == runner.path and runner.path.stat().st_mtime_ns == stamp
    assert not list(cache.glob(".*"))  # no temporary file left behind

    runner.path.write_bytes(runner.path.read_bytes()[:1000])  # truncated by a crash
    third = Encoder(str(tiny_model_dir), backend="onnx")
    assert third._onnx[()].exported
    np.testing.assert_array_equal(third.encode(TEXTS), first.encode(TEXTS))


def test_threads_follow_torch(tiny_model_dir, shared_cache, monkeypatch):
    import torch

    monkeypatch.setenv("FLOWSEARCH_CACHE", str(shared_cache))
    enc = Encoder(str(tiny_model_dir), backend="onnx")
    options = enc._onnx[()]._session.get_session_options()
    assert options.intra_op_num_threads == torch.get_num_threads()


def test_missing_onnxruntime_says_how_to_install(tiny_model_dir, cache, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(FlowsearchError, match=r"pip install 'flowsearch\[onnx\]'"):
        Encoder(str(tiny_model_dir), backend="onnx")


def test_a_cached_int8_graph_needs_no_fp32_graph(tiny_model_dir, cache):
    first = Encoder(str(tiny_model_dir), backend="onnx", quantize="int8")
    int8 = first._onnx[()].path
    fp32 = [p for p in cache.glob("*.onnx") if p != int8]
    assert len(fp32) == 1  # built once, to quantise from
    fp32[0].unlink()
    again = Encoder(str(tiny_model_dir), backend="onnx", quantize="int8")
    assert not again._onnx[()].exported and again._onnx[()].path == int8
    assert sorted(cache.glob("*.onnx")) == [int8]  # the fp32 graph was not exported again
    np.testing.assert_array_equal(again.encode(TEXTS), first.encode(TEXTS))


def test_the_cache_check_hashes_only_a_file_its_record_does_not_describe(tiny_model_dir, cache):
    import json
    import os

    path = Encoder(str(tiny_model_dir), backend="onnx")._onnx[()].path
    record = path.with_suffix(".json")
    stamped = json.loads(record.read_text())
    assert stamped["size"] == path.stat().st_size and len(stamped["sha256"]) == 64
    # a record of the first release (a hash only) is checked by hash, then completed
    record.write_text(
        json.dumps({k: v for k, v in stamped.items() if k not in ("size", "mtime_ns")})
    )
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # a copy's time
    reopened = Encoder(str(tiny_model_dir), backend="onnx")._onnx[()]
    assert not reopened.exported
    assert json.loads(record.read_text())["mtime_ns"] == path.stat().st_mtime_ns
    # a file changed since (same size, another time) is hashed, found corrupt, exported again
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert Encoder(str(tiny_model_dir), backend="onnx")._onnx[()].exported
