"""open_encoder: the encoder an index recorded, reloaded or reused, checked field by field."""

from __future__ import annotations

import shutil

import pytest

from flowsearch.encode.encoder import Encoder, open_encoder
from flowsearch.encode.identity import first_difference, reopen_options
from flowsearch.errors import BadInput, NotFound


@pytest.fixture()
def moved_model(tmp_path, tiny_model_dir):
    """A private copy of the tiny model that a test may move or change."""
    return shutil.copytree(tiny_model_dir, tmp_path / "models" / "bert")


def test_reloads_what_was_recorded(moved_model):
    built = Encoder(str(moved_model), pooling="static", max_length=12, static_variant="layernorm")
    described = built.describe()
    again = open_encoder(described, built.model_id)
    assert again is not built and again.describe() == described
    assert again.encode(["the cat"]).tolist() == built.encode(["the cat"]).tolist()


def test_reuses_an_encoder_that_matches_and_refuses_one_that_does_not(moved_model):
    built = Encoder(str(moved_model), max_length=16)
    assert open_encoder(built.describe(), built.model_id, encoder=built) is built
    other = Encoder(str(moved_model), max_length=17)
    with pytest.raises(BadInput, match=r"encoder max_length 17 differs from the index's 16") as e:
        open_encoder(built.describe(), built.model_id, encoder=other)
    assert e.value.param == "encoder"


def test_a_moved_model_opens_with_model_and_is_checked_by_its_content(moved_model, tmp_path):
    built = Encoder(str(moved_model))
    described, source = built.describe(), built.model_id
    moved = moved_model.rename(tmp_path / "elsewhere")
    with pytest.raises(NotFound, match="is gone") as gone:
        open_encoder(described, source)
    assert gone.value.param == "model" and "pass --model DIR" in gone.value.render("cli")
    assert open_encoder(described, source, model=moved).revision == built.revision
    changed = shutil.copytree(moved, tmp_path / "changed")
    config = changed / "config.json"
    config.write_text(config.read_text().replace("0.02", "0.03"))
    with pytest.raises(BadInput, match=f"the model at {changed} has revision") as err:
        open_encoder(described, source, model=changed)
    assert err.value.param == "model"


def test_a_model_changed_in_place_is_refused(moved_model):
    built = Encoder(str(moved_model))
    config = moved_model / "config.json"
    config.write_text(config.read_text().replace("0.02", "0.03"))
    with pytest.raises(BadInput, match="its model changed since the index was built"):
        open_encoder(built.describe(), built.model_id)


def test_fields_an_old_record_lacks_are_neither_passed_nor_compared(moved_model):
    built = Encoder(str(moved_model), pooling="cls")
    old = {k: v for k, v in built.describe().items() if k not in ("backend", "quantize")}
    assert reopen_options(old) == {"pooling": "cls", "max_length": 128}
    assert open_encoder(old, built.model_id).pooling == "cls"
    # a relative model name, as older manifests kept it, is not compared: the source is
    assert open_encoder(dict(old, model="bert"), built.model_id).model_id == built.model_id


def test_reopen_options_carry_backend_quantize_and_the_static_variant():
    recorded = {"model": "m", "revision": "r", "pooling": "mean", "max_length": 64, "dim": 8}
    onnx = dict(recorded, variant=None, backend="onnx", quantize="int8")
    assert reopen_options(onnx) == {
        "pooling": "mean",
        "max_length": 64,
        "backend": "onnx",
        "quantize": "int8",
    }
    m2v = dict(recorded, pooling="static", variant="model2vec")  # the directory says it
    assert "static_variant" not in reopen_options(m2v)
    assert first_difference(dict(onnx, quantize=None), onnx, relocated=True) == (
        "quantize",
        None,
        "int8",
    )
    assert first_difference(dict(onnx, model="x"), onnx, relocated=True) is None
