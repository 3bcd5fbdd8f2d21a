r"""An ONNX Runtime path for the transformer: export once, cache, optionally quantise to int8.

The same ``transformers`` model the torch path runs is exported with :func:`torch.onnx.export`
from its local weights (dynamic batch and sequence axes; ``input_ids``, ``attention_mask`` and
``token_type_ids`` when the model takes them). Its outputs are the last hidden state plus only the
intermediate hidden states a pooling reads. When ``onnxruntime.transformers`` can, the graph's
attention, LayerNorm and GELU patterns are fused for the CPU; ``int8`` then applies onnxruntime's
dynamic quantisation to the linear layers (MatMul and the fused attention's projections):
weights stored as int8, activations quantised per batch (Jacob et al., 2018).

Exports are cached under ``$FLOWSEARCH_CACHE/onnx`` (else ``~/.cache/flowsearch/onnx``), keyed
by the model's content hash and the export settings, and written atomically (a temporary file,
then a rename) beside a JSON record of their SHA-256; a file that fails the check is exported
again. Sessions use as many intra-op threads as torch does, set per session.

References:
    Jacob et al., "Quantization and Training of Neural Networks for Efficient
    Integer-Arithmetic-Only Inference", CVPR 2018.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.errors import FlowsearchError

__all__ = ["HIDDEN_OUTPUTS", "OnnxEncoder", "onnx_cache_dir"]

LOG = logging.getLogger(__name__)

#: Intermediate outputs an export can carry, by name: their index in ``hidden_states``.
HIDDEN_OUTPUTS: dict[str, int] = {"embedding_output": 0, "first_layer": 1, "penultimate_layer": -2}

_OPSET = 17
# bump when the export recipe changes, so old cache entries are not reused
_RECIPE = 1


def onnx_cache_dir() -> Path:
    """``$FLOWSEARCH_CACHE/onnx`` if set, else ``~/.cache/flowsearch/onnx``."""
    env = os.environ.get("FLOWSEARCH_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "flowsearch"
    return root / "onnx"


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise FlowsearchError(
            "backend='onnx' needs onnxruntime; install it with `pip install 'flowsearch[onnx]'`"
        ) from exc
    return onnxruntime


class OnnxEncoder:
    r"""One exported (and cached) transformer graph and its onnxruntime session.

    Arguments:
        load_model: returns the ``transformers`` model to export (called on a cache miss only).
        identity: names the model's weights (model id and content hash): part of the cache key.
        outputs: names from :data:`HIDDEN_OUTPUTS` the graph returns beside the last hidden state.
        config: the model's ``transformers`` config (heads and hidden size, for fusion).
        quantize: ``None`` (fp32) or ``"int8"``.
        threads: intra-op threads of the session.
        cache_dir: where exports live; ``None`` is :func:`onnx_cache_dir`.

    Attributes:
        path: the ``.onnx`` file the session runs.
        exported: whether building this object had to export (or quantise) the graph.
    """

    def __init__(
        self,
        load_model: Callable[[], Any],
        identity: str,
        outputs: Sequence[str],
        config: Any,
        quantize: str | None = None,
        threads: int = 1,
        cache_dir: Path | None = None,
    ) -> None:
        ort = _import_onnxruntime()
        self.outputs = tuple(sorted(outputs, key=list(HIDDEN_OUTPUTS).index))
        self.quantize = quantize
        self._cache = cache_dir or onnx_cache_dir()
        self.exported = False
        settings = {
            "identity": identity,
            "outputs": list(self.outputs),
            "opset": _OPSET,
            "recipe": _RECIPE,
        }
        fp32 = self._cached(settings, lambda dst: self._export(load_model, config, dst))
        if quantize == "int8":
            self.path = self._cached(
                {**settings, "quantize": "int8"}, lambda dst: _quantize_int8(fp32, dst)
            )
        else:
            self.path = fp32
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, int(threads))
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(
            str(self.path), options, providers=["CPUExecutionProvider"]
        )
        self._output_names = ["last_hidden_state", *self.outputs]
        inputs = {i.name for i in self._session.get_inputs()}
        self.takes_token_types = "token_type_ids" in inputs

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        r"""The graph's outputs for one padded batch.

        Arguments:
            input_ids: int64 ``(batch, seq)``.
            attention_mask: int64 ``(batch, seq)``, 1 on real tokens.

        Returns:
            ``{"last_hidden_state": float32 (batch, seq, dim), <each of outputs>: same shape}``.
        """
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.takes_token_types:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        values = self._session.run(self._output_names, feed)
        return dict(zip(self._output_names, values))

    def _cached(self, settings: dict[str, Any], build: Callable[[Path], None]) -> Path:
        """The cache file for ``settings``, built by ``build(tmp_path)`` when absent or corrupt."""
        key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]
        path = self._cache / f"{key}.onnx"
        record = self._cache / f"{key}.json"
        if path.is_file() and record.is_file():
            try:
                expected = json.loads(record.read_text()).get("sha256")
            except ValueError:
                expected = None
            if expected == _sha256(path):
                return path
            LOG.warning("ONNX cache file %s is corrupt; exporting it again", path)
        self._cache.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self._cache, prefix=f".{key}-", suffix=".onnx")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            build(tmp)
            digest = _sha256(tmp)
            _write_atomically(record, json.dumps({**settings, "sha256": digest}, indent=1))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self.exported = True
        return path

    def _export(self, load_model: Callable[[], Any], config: Any, dst: Path) -> None:
        import inspect

        import torch

        model = load_model()
        takes_types = "token_type_ids" in inspect.signature(model.forward).parameters
        wrapper = _hidden_states_module(model, self.outputs, takes_types).eval()
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if takes_types else [])
        example = tuple(torch.ones((2, 8), dtype=torch.long) for _ in names)
        outputs = ["last_hidden_state", *self.outputs]
        axes = {name: {0: "batch", 1: "sequence"} for name in names + outputs}
        LOG.info("exporting %s to ONNX (once; cached in %s)", type(model).__name__, self._cache)
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                wrapper,
                example,
                str(dst),
                input_names=names,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=_OPSET,
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


def _fuse_for_cpu(path: Path, config: Any) -> None:
    """Fuses BERT-style attention, LayerNorm and GELU in place, when onnxruntime knows how."""
    if getattr(config, "model_type", None) not in ("bert", "roberta", "distilbert", "mpnet"):
        return
    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError:  # pragma: no cover - shipped with onnxruntime
        return
    model_type = "bert" if config.model_type in ("bert", "mpnet") else config.model_type
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = optimize_model(
            str(path),
            model_type=model_type,
            num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
            hidden_size=int(getattr(config, "hidden_size", 0) or 0),
            opt_level=0,
            use_gpu=False,
        )
        optimized.save_model_to_file(str(path))


def _quantize_int8(source: Path, dst: Path) -> None:
    """Dynamic int8 quantisation of the linear layers (MatMul and fused Attention)."""
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
