"""The ONNX Runtime backend: same vectors as torch, int8 close to fp32, a cache that holds."""

from __future__ import annotations

from pathlib import Path

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
    with pytest.raises(FlowsearchError, match=r"pip install onnxruntime"):
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


# -- the default runtime (issue 44): ONNX Runtime fp32 on the CPU, torch on CUDA ------------


def test_the_default_encoder_on_a_cpu_is_onnx_fp32_and_equals_torch(tiny_model_dir):
    from pathlib import Path

    enc = Encoder(str(tiny_model_dir))
    assert enc.backend == "onnx" and enc.quantize is None and enc._onnx
    with np.load(Path(__file__).parent / "assets" / "encoder_vectors.npz") as recorded:
        texts = [str(t) for t in recorded["texts"]]
        torch_vectors = recorded["tiny__mean__torch"]
    np.testing.assert_allclose(enc.encode(texts, batch_size=3), torch_vectors, atol=1e-5)


def test_auto_resolves_to_the_fastest_exact_runtime(monkeypatch):
    from flowsearch.encode import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "cuda_visible", lambda: False)
    assert encoder_module._runtime("auto", "mean", None, None) == "onnx"
    assert encoder_module._runtime("auto", "mean", None, "cpu") == "onnx"
    assert encoder_module._runtime("auto", "mean", None, "cuda:0") == "torch"
    assert encoder_module._runtime("auto", "static", None, None) == "torch"  # runs no model
    assert encoder_module._runtime("torch", "mean", None, None) == "torch"
    monkeypatch.setattr(encoder_module, "cuda_visible", lambda: True)
    assert encoder_module._runtime("auto", "mean", None, None) == "torch"  # CUDA: torch, fp16
    assert encoder_module._runtime("auto", "mean", "int8", None) == "onnx"  # int8 is ONNX's
    assert encoder_module._runtime("auto", "mean", None, "cpu") == "onnx"


def test_no_gpu_driver_means_no_cuda_without_importing_torch(monkeypatch):
    import sys

    from flowsearch.encode import torch_runner

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not torch_runner.cuda_visible()  # hidden by the user
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(torch_runner, "_GPU_DRIVER_FILES", ())
    monkeypatch.delitem(sys.modules, "torch", raising=False)

    def no_torch() -> str:
        raise AssertionError("asked torch")

    monkeypatch.setattr(torch_runner, "default_device", no_torch)
    assert not torch_runner.cuda_visible()


def test_a_failed_export_falls_back_to_torch_with_one_warning(tiny_model_dir, cache, caplog):
    from flowsearch.encode import onnx_export

    def broken(*args, **kwargs):
        raise RuntimeError("unsupported operator aten::imaginary\nmore detail")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_export, "export_graph", broken)
        with caplog.at_level("WARNING", logger="flowsearch"):
            enc = Encoder(str(tiny_model_dir))
        with pytest.raises(RuntimeError, match="unsupported"):  # asked for by name: no fallback
            Encoder(str(tiny_model_dir), backend="onnx")
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert "encoding with torch" in warnings[0].getMessage()
    assert "unsupported operator" in warnings[0].getMessage()
    assert enc.backend == "torch" and enc.describe()["backend"] == "torch"
    want = Encoder(str(tiny_model_dir), backend="torch").encode(TEXTS)
    np.testing.assert_array_equal(enc.encode(TEXTS), want)
    assert not list(cache.glob("*.onnx"))  # nothing half-written was left


def test_the_graph_lives_beside_the_model_or_in_the_user_cache(tmp_path, monkeypatch):
    import shutil

    from conftest import TINY_BERT

    from flowsearch.encode.model_files import revision

    monkeypatch.delenv("FLOWSEARCH_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model = Path(shutil.copytree(TINY_BERT, tmp_path / "model"))
    before = revision(model)
    graph = Encoder(str(model))._onnx[()].path
    assert graph.parent == model / ".flowsearch" / "onnx"
    assert revision(model) == before  # the model's content hash does not see its graphs
    again = Encoder(str(model))._onnx[()]
    assert not again.exported and again.path == graph

    # a model directory that cannot be written: the user cache
    locked = Path(shutil.copytree(TINY_BERT, tmp_path / "locked"))
    (locked / ".flowsearch").write_text("not a folder")  # mkdir fails even for root
    runner = Encoder(str(locked))._onnx[()]
    assert runner.path.parent == tmp_path / "home" / ".cache" / "flowsearch" / "onnx"
    # $FLOWSEARCH_CACHE comes first, and a graph found in a later place is used from there
    monkeypatch.setenv("FLOWSEARCH_CACHE", str(tmp_path / "mine"))
    found = Encoder(str(model))._onnx[()]
    assert not found.exported and found.path == graph
    other = Path(shutil.copytree(TINY_BERT, tmp_path / "other"))
    (other / "notes.txt").write_text("another revision of the same weights")
    assert Encoder(str(other))._onnx[()].path.parent == tmp_path / "mine" / "onnx"


def test_a_torch_built_index_answers_with_its_vectors_through_onnx(tmp_path):
    """The fourth release's index (built on torch, which it records) reopens on ONNX Runtime
    fp32: a stored document's own text embeds to its stored searched vector within 1e-4."""
    import shutil

    import pyarrow.parquet as pq

    from flowsearch import Searcher

    assets = Path(__file__).parent / "assets"
    index = Path(shutil.copytree(assets / "index_r4", tmp_path / "r4"))
    searcher = Searcher.open(index, model=assets / "tiny_bert")
    recorded = searcher._version.manifest.encoder
    assert recorded.options["backend"] == "torch"
    assert searcher._version.space.encoder.backend == "onnx"
    rows = pq.read_table(next(index.glob("segments/*/rows-*.parquet"))).to_pylist()
    whole = [r for r in rows if r["__passages"] == 1][:40]
    assert len(whole) >= 20
    got, _ = searcher.embed([r["text"] for r in whole])
    stored = np.array([r["vector"] for r in whole], dtype=np.float32)
    np.testing.assert_allclose(got, stored, atol=1e-4)


def test_an_int8_index_keeps_its_runtime_and_refuses_fp32(tiny_model_dir):
    from flowsearch.encode.encoder import open_encoder

    int8 = Encoder(str(tiny_model_dir), quantize="int8")
    recorded = int8.describe()
    assert recorded["backend"] == "onnx" and recorded["quantize"] == "int8"
    reopened = open_encoder(recorded, str(tiny_model_dir))
    assert reopened.describe() == recorded
    with pytest.raises(FlowsearchError, match="quantize"):
        open_encoder(recorded, str(tiny_model_dir), encoder=Encoder(str(tiny_model_dir)))
    # fp32 on torch and on ONNX are the same vectors: either serves the other's record
    fp32 = Encoder(str(tiny_model_dir), backend="torch").describe()
    assert open_encoder(fp32, str(tiny_model_dir)).backend == "onnx"
