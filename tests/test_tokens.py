"""Token ids: tokenizer.json read with `tokenizers` gives exactly transformers' ids."""

from __future__ import annotations

import json
import shutil

import pytest

from flowsearch.encode.tokens import FastTokens, HubTokens, load_tokens

TEXTS = [
    "the cat sat on the mat",
    "",
    " ",
    "[CLS] a literal special token [SEP]",
    "Ünïcödé wörds — émojis 🎉, ﬁ ligatures, 中文 and TAB\tand NUL\x00",
    "music and song with piano and guitar for the people of the city " * 40,
]


@pytest.fixture(scope="module")
def hub(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)


@pytest.mark.parametrize("max_length, special", [(128, True), (6, True), (2, True), (4, False)])
def test_fast_ids_equal_transformers(tiny_model_dir, hub, max_length, special):
    fast = FastTokens.from_dir(tiny_model_dir)
    assert fast is not None
    want = hub(TEXTS, add_special_tokens=special, truncation=True, max_length=max_length)
    got = fast.ids(TEXTS, max_length, special=special)
    assert got == want["input_ids"]
    assert max(len(ids) for ids in got) == max_length  # the long text was truncated
    # the truncation set for one call does not leak into the next
    assert (
        fast.ids(TEXTS[-1:], 128) == hub(TEXTS[-1:], truncation=True, max_length=128)["input_ids"]
    )


def test_fast_and_hub_tokens_agree_on_their_facts(tiny_model_dir, hub):
    fast = FastTokens.from_dir(tiny_model_dir)
    slow = HubTokens(hub)
    assert fast is not None
    assert fast.pad_id == slow.pad_id == hub.pad_token_id
    assert fast.num_special() == slow.num_special() == 2
    assert fast.model_max_length == slow.model_max_length
    assert fast.ids(TEXTS, 9) == slow.ids(TEXTS, 9)


def test_a_directory_without_tokenizer_json_goes_through_transformers(tmp_path, tiny_model_dir):
    assert FastTokens.from_dir(tmp_path) is None
    assert isinstance(load_tokens(str(tiny_model_dir), True, {}), FastTokens)
    # the tiny model's vocabulary as a plain vocab.txt (BertTokenizer), without tokenizer.json
    copy = shutil.copytree(tiny_model_dir, tmp_path / "m")
    vocab = json.loads((copy / "tokenizer.json").read_text())["model"]["vocab"]
    (copy / "vocab.txt").write_text("".join(f"{w}\n" for w in sorted(vocab, key=vocab.get)))
    (copy / "tokenizer.json").unlink()
    tokens = load_tokens(str(copy), True, {"local_files_only": True})
    assert isinstance(tokens, HubTokens)
    fast = FastTokens.from_dir(tiny_model_dir)
    assert fast is not None and tokens.ids(TEXTS, 12) == fast.ids(TEXTS, 12)
