r"""Writing the ONNX graphs the ONNX backend runs: export from torch, CPU fusion, int8.

Run once per model and pooling layout, on a cache miss of
:class:`~flowsearch.encode.onnx.OnnxEncoder` (which owns the cache); this is the only ONNX code
that imports ``torch``, and only inside its functions.

The same ``transformers`` model the torch backend runs is exported with :func:`torch.onnx.export`
(dynamic batch and sequence axes; ``input_ids``, ``attention_mask`` and ``token_type_ids`` when the
model takes them). Its outputs are the last hidden state plus only the intermediate hidden states
a pooling reads. When ``onnxruntime.transformers`` can, the graph's attention, LayerNorm and GELU
patterns are fused for the CPU; ``int8`` then applies onnxruntime's dynamic quantisation to the
linear layers (MatMul and the fused attention's projections): weights stored as int8, activations
quantised per batch (Jacob et al., 2018).

References:
    Jacob et al., "Quantization and Training of Neural Networks for Efficient
    Integer-Arithmetic-Only Inference", CVPR 2018.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["HIDDEN_OUTPUTS", "OPSET", "export_graph", "quantize_int8"]

LOG = logging.getLogger(__name__)

#: Intermediate outputs an export can carry, by name: their index in ``hidden_states`` (the
#: names :data:`~flowsearch.encode.pooling.LAYERS_READ` uses).
HIDDEN_OUTPUTS: dict[str, int] = {"embedding_output": 0, "first_layer": 1, "penultimate_layer": -2}
#: The ONNX opset exports target.
OPSET = 17
# model types onnxruntime's transformer optimizer fuses, and the name it knows each by
_FUSABLE = {"bert": "bert", "mpnet": "bert", "roberta": "roberta", "distilbert": "distilbert"}


def export_graph(model: Any, outputs: Sequence[str], config: Mapping[str, Any], dst: Path) -> None:
    r"""Exports ``model`` to ``dst`` (ONNX), returning the last hidden state and ``outputs``.

    Arguments:
        model: a ``transformers`` model in eval mode, on the CPU.
        outputs: names from :data:`HIDDEN_OUTPUTS`, in that dictionary's order.
        config: the model's config (``model_type``, ``num_attention_heads``, ``hidden_size``
            decide the CPU fusion).
        dst: the file to write (overwritten).
    """
    import torch

    takes_types = "token_type_ids" in inspect.signature(model.forward).parameters
    wrapper = _hidden_states_module(model, outputs, takes_types).eval()
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if takes_types else [])
    example = tuple(torch.ones((2, 8), dtype=torch.long) for _ in names)
    graph_outputs = ["last_hidden_state", *outputs]
    axes = {name: {0: "batch", 1: "sequence"} for name in names + graph_outputs}
    LOG.info("exporting %s to ONNX (once; cached)", type(model).__name__)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            example,
            str(dst),
            input_names=names,
            output_names=graph_outputs,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    _fuse_for_cpu(dst, config)


def _hidden_states_module(model: Any, outputs: Sequence[str], takes_token_types: bool) -> Any:
    """A torch module returning the last hidden state and the named intermediate ones."""
    import torch

    class HiddenStates(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, *rest: Any) -> tuple[Any, ...]:
            extra = {"token_type_ids": rest[0]} if takes_token_types else {}
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                output_hidden_states=bool(outputs),
                return_dict=True,
                **extra,
            )
            hidden = [out.hidden_states[HIDDEN_OUTPUTS[name]] for name in outputs]
            return (out.last_hidden_state, *hidden)

    return HiddenStates()


def _fuse_for_cpu(path: Path, config: Mapping[str, Any]) -> None:
    """Fuses BERT-style attention, LayerNorm and GELU in place, when onnxruntime knows how."""
    model_type = _FUSABLE.get(str(config.get("model_type")))
    if model_type is None:
        return
    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError:  # pragma: no cover - shipped with onnxruntime
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = optimize_model(
            str(path),
            model_type=model_type,
            num_heads=int(config.get("num_attention_heads") or 0),
            hidden_size=int(config.get("hidden_size") or 0),
            opt_level=0,
            use_gpu=False,
        )
        optimized.save_model_to_file(str(path))


def quantize_int8(source: Path, dst: Path) -> None:
    """Writes ``dst``: ``source`` with its linear layers (MatMul and fused Attention)
    dynamically quantised to int8."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(
            str(source),
            str(dst),
            op_types_to_quantize=["MatMul", "Attention"],
            weight_type=QuantType.QInt8,
            # shape inference cannot see through the fused (com.microsoft) ops: they are fp32
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT},
        )
