"""Synthetic Parquet corpora for the index tests (words the tiny test BERT knows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

_WORD_LINES = (
    "cat dog bird fish tree river sea moon sun star city town road car train ship plane",
    "bread cheese milk water tea coffee music song piano guitar game ball team goal",
    "red green blue big small fast slow old new good bad hot cold run runs ran eat eats",
    "man woman child people house room door window book page word letter number year",
)
WORDS = [word for line in _WORD_LINES for word in line.split()]


def sentences(n: int, seed: int = 0, length: tuple[int, int] = (4, 12)) -> list[str]:
    """``n`` distinct random sentences over :data:`WORDS`."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        text = "the " + " ".join(rng.choice(WORDS, size=int(rng.integers(*length))))
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def write_corpus(
    path: Path, n: int = 120, seed: int = 0, id_prefix: str = "d", **extra: list
) -> Path:
    """A corpus with ``id`` (``{prefix}{i}``), ``text``, ``topic`` and ``year`` columns."""
    texts = sentences(n, seed)
    table = pa.table(
        {
            "id": [f"{id_prefix}{i}" for i in range(n)],
            "text": texts,
            "topic": [WORDS[i % 7] for i in range(n)],
            "year": pa.array([1990 + i % 30 for i in range(n)], pa.int32()),
            **extra,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def siblings(path: Path) -> list[str]:
    """Hidden scratch directories next to an index (must be none after any build)."""
    return sorted(p.name for p in path.parent.glob(f".{path.name}.*"))


def _tokenizer_works(model_dir: Path) -> bool:
    from transformers import AutoTokenizer

    return "[UNK]" not in AutoTokenizer.from_pretrained(model_dir).tokenize("the cat")


def _build_tiny_bert(path: Path) -> Path:
    """A tiny random BERT whose tokenizer knows :data:`WORDS` (hidden 32, 3 layers)."""
    import string

    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "of", *WORDS]
    tokens += list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens += ["##" + c for c in string.ascii_lowercase + string.digits]
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}
    BertTokenizerFast(vocab=vocab, do_lower_case=True).save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    BertModel(config).eval().save_pretrained(path)
    return path


@pytest.fixture(scope="session", name="model_dir")
def model_dir_fixture(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conftest's tiny BERT when its tokenizer knows our words, else one built here.

    (With transformers 5, ``BertTokenizerFast(vocab_file=...)`` ignores the file and maps every
    word to [UNK], so all texts embed alike; ``vocab=dict`` works.)
    """
    if _tokenizer_works(tiny_model_dir):
        return tiny_model_dir
    return _build_tiny_bert(tmp_path_factory.mktemp("tiny-bert-words"))
