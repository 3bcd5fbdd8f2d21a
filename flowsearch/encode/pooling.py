r"""Pooling: token vectors to one sentence vector, the ways the BERT-flow paper studies.

One definition per pooling, in two forms that must agree: :func:`pool_torch` on a
``transformers`` model's outputs and :func:`pool_numpy` on an ONNX graph's outputs (the ONNX
backend's graph returns the intermediate layers named in :data:`LAYERS_READ`). Every pooling is
attention-mask aware: padding never counts. ``static`` is not here: it runs no model
(:mod:`flowsearch.encode.static`).

Example:
    >>> import numpy as np
    >>> ids, mask = padded([[101, 7, 102], [101, 102]], pad_id=0)
    >>> mask.tolist()
    [[1, 1, 1], [1, 1, 0]]
    >>> last = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    >>> pool_numpy({"last_hidden_state": last}, mask, ["mean"])["mean"].tolist()
    [[2.0, 3.0], [7.0, 8.0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

__all__ = ["LAYERS_READ", "padded", "pool_numpy", "pool_torch"]

#: Intermediate hidden states each contextual pooling reads beside the last layer (the names
#: the ONNX backend gives its extra outputs).
LAYERS_READ: dict[str, tuple[str, ...]] = {
    "cls": (),
    "mean": (),
    "last2avg": ("penultimate_layer",),
    "first_last_avg": ("first_layer",),
    "embedding_layer": ("embedding_output",),
}


def padded(
    rows: Sequence[Sequence[int]], pad_id: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Right-pads token ids to the batch's longest row: int64 ``(ids, mask)``, both (n, width)."""
    width = max(len(r) for r in rows)
    input_ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return input_ids, mask


def pool_torch(
    model: Any, batch: dict[str, torch.Tensor], poolings: Sequence[str]
) -> dict[str, torch.Tensor]:
    """The poolings of one batch, running only as much of ``model`` as they read.

    ``embedding_layer`` alone runs only the embedding layer; ``cls``/``mean`` alone do not ask
    the model for its intermediate layers.

    Args:
        model: a ``transformers`` encoder model.
        batch: ``input_ids`` and ``attention_mask``, int64 ``(batch, seq)`` tensors.
        poolings: contextual pooling names (keys of :data:`LAYERS_READ`).

    Returns:
        ``{pooling: (batch, dim) tensor}`` in the model's dtype.
    """
    mask = batch["attention_mask"].unsqueeze(-1)
    if all(p == "embedding_layer" for p in poolings) and hasattr(model, "embeddings"):
        # the embedding layer's output is hidden_states[0]: no transformer layer runs
        tokens = model.embeddings(input_ids=batch["input_ids"])
        mask = mask.to(tokens.dtype)
        return {"embedding_layer": (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)}
    need_layers = any(LAYERS_READ[p] for p in poolings)
    outputs = model(**batch, output_hidden_states=need_layers, return_dict=True)
    last = outputs.last_hidden_state
    mask = mask.to(last.dtype)
    count = mask.sum(dim=1).clamp(min=1)
    pooled = {}
    for pooling in poolings:
        if pooling == "cls":
            pooled[pooling] = last[:, 0]
            continue
        if pooling == "mean":
            tokens = last
        elif pooling == "last2avg":
            tokens = (outputs.hidden_states[-1] + outputs.hidden_states[-2]) / 2
        elif pooling == "first_last_avg":
            tokens = (outputs.hidden_states[1] + outputs.hidden_states[-1]) / 2
        else:  # embedding_layer
            tokens = outputs.hidden_states[0]
        pooled[pooling] = (tokens * mask).sum(dim=1) / count
    return pooled


def pool_numpy(
    outputs: Mapping[str, npt.NDArray[np.float32]],
    mask: npt.NDArray[np.int64],
    poolings: Sequence[str],
) -> dict[str, npt.NDArray[np.float32]]:
    """The poolings of an ONNX graph's outputs (same definitions as :func:`pool_torch`).

    Args:
        outputs: ``last_hidden_state`` and the layers :data:`LAYERS_READ` names, each float32
            ``(batch, seq, dim)``.
        mask: int64 ``(batch, seq)``, 1 on real tokens.
        poolings: contextual pooling names.

    Returns:
        ``{pooling: float32 (batch, dim)}``.
    """
    last = outputs["last_hidden_state"]
    weights = mask[:, :, None].astype(np.float32)
    count = np.maximum(weights.sum(axis=1), 1.0)
    pooled = {}
    for pooling in poolings:
        if pooling == "cls":
            pooled[pooling] = np.ascontiguousarray(last[:, 0], dtype=np.float32)
        else:
            tokens = _token_vectors(outputs, pooling)
            pooled[pooling] = ((tokens * weights).sum(axis=1) / count).astype(np.float32)
    return pooled


def _token_vectors(
    outputs: Mapping[str, npt.NDArray[np.float32]], pooling: str
) -> npt.NDArray[np.float32]:
    """The per-token vectors ``pooling`` averages, from an ONNX graph's outputs."""
    last = outputs["last_hidden_state"]
    if pooling == "mean":
        return last
    # float32 halved by a Python int stays float32 (numpy's stubs say float64)
    if pooling == "last2avg":
        return cast("npt.NDArray[np.float32]", (last + outputs["penultimate_layer"]) / 2)
    if pooling == "first_last_avg":
        return cast("npt.NDArray[np.float32]", (outputs["first_layer"] + last) / 2)
    return outputs["embedding_output"]  # embedding_layer
