"""Shared fixtures: the committed tiny random BERT (tests/assets/tiny_bert), copied per session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: A tiny random BERT (hidden 32, 3 layers: every pooling differs) whose word-piece vocabulary
#: holds corpus_helpers.WORDS; committed so every test loads the same weights.
TINY_BERT = Path(__file__).resolve().parent / "assets" / "tiny_bert"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A per-session copy of the tiny BERT asset; ``Encoder(str(path))`` loads it.

    A copy, so a test that writes next to the model (or an index that records its path) never
    touches the committed asset. Tests that move or change the model copy it again themselves.
    """
    return Path(shutil.copytree(TINY_BERT, tmp_path_factory.mktemp("tiny-bert") / "tiny_bert"))


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One ``$FLOWSEARCH_CACHE`` for the session: the default encoder's ONNX graphs are
    exported once per layout for every test (and never into the user's ``~/.cache`` or beside
    the committed model); a test that wants its own sets the variable again."""
    before = os.environ.get("FLOWSEARCH_CACHE")
    folder = tmp_path_factory.mktemp("flowsearch-cache")
    os.environ["FLOWSEARCH_CACHE"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("FLOWSEARCH_CACHE", None)
    else:
        os.environ["FLOWSEARCH_CACHE"] = before


@pytest.fixture(scope="session")
def model_dir(tiny_model_dir: Path) -> Path:
    """The index tests' name for :func:`tiny_model_dir` (the same copy)."""
    return tiny_model_dir


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny randomly initialised cross-encoder (a one-label BERT classifier over the tiny
    BERT's vocabulary), saved as ``CrossEncoder`` loads any model: the same code path as a real
    one, without weights from the hub."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    out = tmp_path_factory.mktemp("tiny-cross-encoder") / "ce"
    tokenizer = AutoTokenizer.from_pretrained(TINY_BERT)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=37, max_position_embeddings=128,
                        num_labels=1)  # fmt: skip
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
