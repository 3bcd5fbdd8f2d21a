r"""The torch backend: a ``transformers`` model, loaded on first need, pooling padded batches.

``torch`` and ``transformers`` are imported here only, when a model is first needed: a static
encoder or an ONNX one whose export is cached never imports them.

Example:
    >>> runner = TorchRunner("tests/assets/tiny_bert", {"local_files_only": True}, "cpu")
    >>> runner.loaded
    False
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from flowsearch.encode.model_files import has_safetensors
from flowsearch.encode.pooling import pool_torch

__all__ = ["TorchRunner", "cuda_visible", "default_device"]

# Files a GPU driver creates (NVIDIA's, AMD's ROCm, WSL's): without one, torch sees no CUDA
# device, and asking it would cost a cold query the import of torch.
_GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version", "/dev/kfd",
                     "/dev/dxg")  # fmt: skip


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"`` (imports torch)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_visible() -> bool:
    """Whether torch would run on CUDA here, asked without importing torch when no GPU driver
    is installed (the CPU machine's cold query never pays for torch) or none is visible."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    if "torch" not in sys.modules and not any(os.path.exists(p) for p in _GPU_DRIVER_FILES):
        return False
    return default_device() == "cuda"


class TorchRunner:
    r"""Runs a ``transformers`` model on padded batches and pools its outputs.

    Arguments:
        source: a local folder holding the transformer, or a hub id.
        options: keyword arguments for ``from_pretrained`` (``local_files_only``,
            ``trust_remote_code``).
        device: where the model runs; a CUDA device runs it in fp16.
    """

    def __init__(self, source: str, options: Mapping[str, Any], device: str) -> None:
        self.source = source
        self.options = dict(options)
        self.device = device
        self._model: Any = None

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory."""
        return self._model is not None

    def model(self) -> Any:
        """The model on :attr:`device`, in eval mode, loaded on the first call.

        Raises:
            OSError, ValueError: ``transformers`` cannot find or read the weights.
        """
        if self._model is None:
            model = self._load()
            model.to(self.device)
            if self.device.startswith("cuda"):
                model.half()
            self._model = model
        return self._model

    def eager_model(self) -> Any:
        """A fresh CPU copy with eager attention: the pattern ONNX Runtime knows how to fuse."""
        return self._load(attn_implementation="eager")

    def _load(self, **extra: Any) -> Any:
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        options = {**self.options, **extra}
        if options.get("local_files_only") and has_safetensors(Path(self.source)):
            options["use_safetensors"] = True
        return AutoModel.from_pretrained(self.source, **options).eval()

    def pool(
        self, input_ids: npt.NDArray[np.int64], mask: npt.NDArray[np.int64], poolings: Sequence[str]
    ) -> dict[str, npt.NDArray[np.float32]]:
        r"""The poolings of one padded batch.

        Arguments:
            input_ids: int64 ``(batch, seq)``, right-padded.
            mask: int64 ``(batch, seq)``, 1 on real tokens.
            poolings: contextual pooling names (see :data:`~flowsearch.encode.pooling.LAYERS_READ`).

        Returns:
            ``{pooling: float32 (batch, dim)}``.
        """
        import torch

        model = self.model()
        with torch.inference_mode():
            batch = {
                "input_ids": torch.from_numpy(input_ids).to(self.device),
                "attention_mask": torch.from_numpy(mask).to(self.device),
            }
            tensors = pool_torch(model, batch, poolings)
            return {p: v.float().cpu().numpy() for p, v in tensors.items()}
