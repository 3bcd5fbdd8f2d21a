"""Shared fixtures: a tiny randomly initialised BERT saved to disk (same code path as real ones)."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_WORDS_TEXT = """
the a an of to in and is was for on with as by at from it that this be are or not cat
dog bird fish tree river sea moon sun star city town road car train ship plane bread
cheese milk water tea coffee music song piano guitar game ball team goal red green blue
big small fast slow old new good bad hot cold run runs ran eat eats man woman child
people house room door window book page word letter number year
"""


def build_tiny_bert(path: Path, seed: int = 0, layers: int = 3) -> Path:
    """Saves a tiny random BERT (hidden 32) and a word-piece tokenizer to ``path``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS_TEXT.split()]
    vocab += list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab += ["##" + c for c in string.ascii_lowercase + string.digits]
    (path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tokenizer = BertTokenizerFast(str(path / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    BertModel(config).eval().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT (3 layers: every pooling differs); ``Encoder(str(path))`` loads it."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]
