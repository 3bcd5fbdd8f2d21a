"""Pooling: the torch and numpy forms agree, padding never counts, each pooling reads its layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel

from flowsearch.encode.pooling import LAYERS_READ, padded, pool_numpy, pool_torch

POOLED = tuple(LAYERS_READ)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModel.from_pretrained(tiny_model_dir, local_files_only=True).eval()


def _batch(ids: np.ndarray, mask: np.ndarray) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}


def test_padded_right_pads_and_masks():
    ids, mask = padded([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ids.dtype == mask.dtype == np.int64


def test_numpy_form_equals_torch_form(model):
    ids, mask = padded([[2, 10, 11, 12, 3], [2, 13, 3]], pad_id=0)
    with torch.inference_mode():
        out = model(**_batch(ids, mask), output_hidden_states=True, return_dict=True)
        want = {p: v.numpy() for p, v in pool_torch(model, _batch(ids, mask), POOLED).items()}
    hidden = out.hidden_states
    graph = {
        "last_hidden_state": hidden[-1].numpy(),
        "penultimate_layer": hidden[-2].numpy(),
        "first_layer": hidden[1].numpy(),
        "embedding_output": hidden[0].numpy(),
    }
    got = pool_numpy(graph, mask, POOLED)
    for pooling in POOLED:
        np.testing.assert_allclose(got[pooling], want[pooling], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling", POOLED)
def test_padding_never_counts(model, pooling):
    alone_ids, alone_mask = padded([[2, 13, 3]], pad_id=0)
    ids, mask = padded([[2, 10, 11, 12, 14, 15, 3], [2, 13, 3]], pad_id=0)
    with torch.inference_mode():
        alone = pool_torch(model, _batch(alone_ids, alone_mask), [pooling])[pooling][0]
        padded_row = pool_torch(model, _batch(ids, mask), [pooling])[pooling][1]
    np.testing.assert_allclose(padded_row.numpy(), alone.numpy(), rtol=1e-4, atol=1e-5)


def test_embedding_layer_alone_runs_no_transformer_layer(model):
    ids, mask = padded([[2, 10, 11, 3]], pad_id=0)
    calls = []
    hook = model.encoder.register_forward_hook(lambda *_: calls.append(1))
    try:
        with torch.inference_mode():
            alone = pool_torch(model, _batch(ids, mask), ["embedding_layer"])
            together = pool_torch(model, _batch(ids, mask), ["embedding_layer", "mean"])
    finally:
        hook.remove()
    assert len(calls) == 1  # only the call that also pooled "mean"
    np.testing.assert_allclose(
        alone["embedding_layer"].numpy(), together["embedding_layer"].numpy(), atol=1e-6
    )
