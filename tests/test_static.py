"""Static pooling: position-free table lookups, its variants, and Model2Vec directories."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from flowsearch.encode.encoder import Encoder
from flowsearch.encode.static import STATIC_VARIANTS, is_model2vec_dir, mean_of_rows
from flowsearch.errors import FlowsearchError

TEXTS = ["the cat sat on the mat", "a big dog runs to the river", "tea", ""]


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tok, AutoModel.from_pretrained(tiny_model_dir).eval()


def _reference(hf_model, text: str, variant: str) -> np.ndarray:
    """Word embeddings of the text's tokens (no positions), as the variant names them."""
    tok, model = hf_model
    ids = tok(text)["input_ids"]
    if not variant.endswith("+special"):
        ids = ids[1:-1]
    with torch.no_grad():
        rows = model.embeddings.word_embeddings.weight[ids]
        if variant.startswith("layernorm"):
            rows = model.embeddings.LayerNorm(rows)
    return rows.mean(dim=0).numpy() if ids else np.zeros(rows.shape[-1], np.float32)


@pytest.mark.parametrize("variant", STATIC_VARIANTS)
def test_static_is_the_mean_of_word_embeddings(tiny_model_dir, hf_model, variant):
    enc = Encoder(str(tiny_model_dir), pooling="static", static_variant=variant)
    assert enc.describe()["variant"] == variant
    U = enc.encode(TEXTS)
    for row, text in zip(U, TEXTS):
        np.testing.assert_allclose(row, _reference(hf_model, text, variant), atol=1e-5)


def test_static_is_position_free(tiny_model_dir):
    """Word order and repetition do not move a static vector; they move embedding_layer's."""
    enc = Encoder(str(tiny_model_dir), pooling="static")
    a, b, c = enc.encode(["cat dog tea", "tea dog cat", "cat dog tea cat dog tea"])
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(a, c, atol=1e-6)
    old = Encoder(str(tiny_model_dir), pooling="embedding_layer")
    a, _, c = old.encode(["cat dog tea", "tea dog cat", "cat dog tea cat dog tea"])
    assert not np.allclose(a, c, atol=1e-3)


def test_static_truncates_to_the_words_the_model_reads(tiny_model_dir):
    enc = Encoder(str(tiny_model_dir), pooling="static", max_length=5)  # [CLS] + 3 + [SEP]
    np.testing.assert_allclose(
        enc.encode(["cat dog tea moon sun"]), enc.encode(["cat dog tea"]), atol=1e-6
    )


def test_mean_of_rows_handles_empty_rows_and_grouping():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = mean_of_rows(table, [[0, 2], [], [3, 3, 1]])
    np.testing.assert_allclose(out[0], (table[0] + table[2]) / 2)
    np.testing.assert_array_equal(out[1], np.zeros(3))
    np.testing.assert_allclose(out[2], (2 * table[3] + table[1]) / 3, rtol=1e-6)
    np.testing.assert_array_equal(mean_of_rows(table, [[3, 3, 1]])[0], out[2])


def test_a_query_is_averaged_bit_for_bit_as_in_a_batch_without_scipy():
    """A few texts (a query) are summed in numpy, many by scipy's sparse product: the same
    float32 sums in the same order, so a query's vector equals its vector in any batch."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((500, 16)).astype(np.float32)
    ids = [rng.integers(0, 500, int(rng.integers(0, 40))).tolist() for _ in range(200)]
    batch = mean_of_rows(table, ids)  # > 8 texts: the sparse product
    for i in range(0, 200, 4):
        np.testing.assert_array_equal(mean_of_rows(table, ids[i : i + 4]), batch[i : i + 4])
    code = (
        "import sys, numpy as np; from flowsearch.encode.static import mean_of_rows; "
        "mean_of_rows(np.ones((3, 2), np.float32), [[0, 2]]); print('scipy' in sys.modules)"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


def _write_model2vec(path, tiny_model_dir, normalize: bool, weights: bool = False):
    """A tiny directory in Model2Vec's StaticModel layout, written by hand."""
    from safetensors.numpy import save_file
    from transformers import AutoTokenizer

    path.mkdir()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.backend_tokenizer.save(str(path / "tokenizer.json"))
    rng = np.random.default_rng(0)
    tensors = {"embeddings": rng.normal(size=(tok.vocab_size, 8)).astype(np.float32)}
    if weights:
        tensors["weights"] = rng.uniform(0.5, 2.0, size=tok.vocab_size).astype(np.float32)
    save_file(tensors, str(path / "model.safetensors"))
    config = {
        "model_type": "model2vec",
        "architectures": ["StaticModel"],
        "hidden_dim": 8,
        "normalize": normalize,
        "embedding_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(config))
    return tok, tensors


@pytest.mark.parametrize("normalize, weights", [(False, False), (True, False), (False, True)])
def test_model2vec_directory_is_a_static_encoder(
    tmp_path, tiny_model_dir, monkeypatch, normalize, weights
):
    import sys

    root = tmp_path / "m2v"
    tok, tensors = _write_model2vec(root, tiny_model_dir, normalize, weights)
    assert is_model2vec_dir(root) and not is_model2vec_dir(tiny_model_dir)
    monkeypatch.setitem(sys.modules, "model2vec", None)  # it must not be needed at run time
    enc = Encoder(str(root), pooling="static")
    desc = enc.describe()
    assert desc["dim"] == 8 and desc["pooling"] == "static"
    assert desc["variant"] == ("model2vec+normalize" if normalize else "model2vec")
    texts = ["the cat sat", "zzzq tea", ""]
    U = enc.encode(texts)
    table = tensors["embeddings"] * (tensors["weights"][:, None] if weights else 1.0)
    for row, text in zip(U, texts):
        ids = [i for i in tok(text, add_special_tokens=False)["input_ids"] if i != tok.unk_token_id]
        want = table[ids].mean(axis=0) if ids else np.zeros(8, np.float32)
        if normalize and ids:
            want = want / np.linalg.norm(want)
        np.testing.assert_allclose(row, want, atol=1e-5)
    with pytest.raises(FlowsearchError, match="Model2Vec static model"):
        Encoder(str(root), pooling="mean")


@pytest.mark.slow
def test_model2vec_matches_the_library(tmp_path, tiny_model_dir):
    """Our reading of a Model2Vec directory equals model2vec's own encode."""
    model2vec = pytest.importorskip("model2vec")
    root = tmp_path / "m2v"
    _write_model2vec(root, tiny_model_dir, normalize=True, weights=True)
    theirs = model2vec.StaticModel.from_pretrained(str(root)).encode(TEXTS[:3])
    np.testing.assert_allclose(
        Encoder(str(root), pooling="static").encode(TEXTS[:3]), theirs, atol=1e-5
    )


def test_chunking_never_changes_a_static_vector(tiny_model_dir, monkeypatch):
    from flowsearch.encode import encoder

    texts = [f"the cat sat on the mat {i}" * (i % 4 + 1) for i in range(9)]
    enc = Encoder(str(tiny_model_dir), pooling="static")
    whole = enc.encode(texts)
    with monkeypatch.context() as patched:
        patched.setattr(encoder, "STATIC_CHUNK_TEXTS", 2)
        np.testing.assert_array_equal(enc.encode(texts), whole)
