"""Reading a model before anything runs: config, limits, revision, without transformers."""

from __future__ import annotations

import json
import shutil

import pytest

from flowsearch.encode.loading import load_parts
from flowsearch.encode.model_files import DEFAULT_MODEL, local_config, locate, position_limit
from flowsearch.errors import BadInput, NotFound


def test_parts_of_a_local_transformer(tiny_model_dir):
    parts = load_parts(str(tiny_model_dir), None)
    assert (parts.dim, parts.max_length, parts.model2vec) == (32, 128, False)
    assert parts.source.model_id == str(tiny_model_dir.resolve()) and parts.source.local
    assert parts.options == {"local_files_only": True} and len(parts.revision) == 16
    assert load_parts(str(tiny_model_dir), 40).max_length == 40
    with pytest.raises(BadInput, match="exceeds what"):
        load_parts(str(tiny_model_dir), 129)


def test_a_sentence_transformers_limit_is_the_default(tmp_path, tiny_model_dir):
    root = tmp_path / "st"
    shutil.copytree(tiny_model_dir, root / "0_Transformer")
    modules = [{"idx": 0, "name": "0", "path": "0_Transformer", "type": "x.models.Transformer"}]
    (root / "modules.json").write_text(json.dumps(modules))
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48}))
    parts = load_parts(str(root), None)
    assert parts.max_length == 48 and parts.source.path == str(root / "0_Transformer")


def test_limits_take_the_smaller_of_positions_and_tokenizer():
    assert position_limit({"max_position_embeddings": 512}, 256) == 256
    assert position_limit({"max_position_embeddings": 128}, 10**30) == 128
    assert position_limit({}, None) == 100_000


def test_a_config_with_other_field_names_goes_through_transformers(tmp_path):
    """DistilBERT calls its hidden size ``dim``: transformers' aliases resolve it."""
    config = {"model_type": "distilbert", "dim": 24, "n_heads": 2, "n_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(config | {"hidden_dim": 30}))
    read = local_config(tmp_path, {"local_files_only": True})
    assert read["hidden_size"] == 24 and read["num_attention_heads"] == 2
    plain = {"model_type": "bert", "hidden_size": 8}
    (tmp_path / "config.json").write_text(json.dumps(plain))
    assert local_config(tmp_path, {}) == plain  # read as JSON alone


def test_missing_models_are_not_found(tmp_path):
    with pytest.raises(NotFound, match="does not exist") as err:
        locate(str(tmp_path / "nowhere"))
    assert err.value.param == "model"
    assert locate("org/name").local is False and locate("org/name").model_id == "org/name"
    with pytest.raises(NotFound, match="cannot load model"):
        load_parts(str(tmp_path), None)  # a directory, but no model in it
    assert locate(None).model_id == DEFAULT_MODEL
