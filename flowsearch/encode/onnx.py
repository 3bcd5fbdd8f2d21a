r"""The ONNX Runtime backend: a cached graph of the transformer and its session.

A graph is exported once per model and layout (:mod:`flowsearch.encode.onnx_export`), keyed by
the model's content hash (:func:`~flowsearch.encode.model_files.revision`), the outputs the
poolings read, the opset and the export recipe, and looked for in these places, in order
(:func:`cache_places`): ``$FLOWSEARCH_CACHE/onnx`` when that is set; beside a local model, in
its ``.flowsearch/onnx`` folder (the graph travels with the model); the user cache
``~/.cache/flowsearch/onnx``. A missing graph is written to the first of them that can be
written: a read-only model directory falls back to the user cache. An ``int8`` graph is cached
under its own key and built from the fp32 one only when it is missing. Each cache file is
written atomically beside a JSON record of its SHA-256, size and modification time: a file whose
size and time match its record is used as is (re-hashing the whole graph at every open would be
a large share of a cold query); any other is hashed, and one that fails the check is exported
again.

On a cache hit nothing here imports ``torch`` or ``transformers``: a cold query through the ONNX
backend loads the tokenizer, the session and nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from flowsearch.atomic import atomic_write, atomic_write_text
from flowsearch.encode.model_files import read_json_object
from flowsearch.encode.onnx_export import HIDDEN_OUTPUTS, OPSET
from flowsearch.errors import MissingExtra

__all__ = ["HIDDEN_OUTPUTS", "OnnxEncoder", "cache_places", "onnx_cache_dir", "session_threads"]

LOG = logging.getLogger(__name__)

# bump when the export recipe changes, so old cache entries are not reused
_RECIPE = 1


#: The folder of a local model that holds its graphs.
BESIDE_MODEL = Path(".flowsearch") / "onnx"


def onnx_cache_dir() -> Path:
    """``$FLOWSEARCH_CACHE/onnx`` if set, else the user cache ``~/.cache/flowsearch/onnx``."""
    env = os.environ.get("FLOWSEARCH_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "flowsearch"
    return root / "onnx"


def cache_places(model_dir: Path | None) -> list[Path]:
    """Where a model's graphs are looked for and written, in order: ``$FLOWSEARCH_CACHE/onnx``
    when set, beside a local model (``model_dir/.flowsearch/onnx``), the user cache."""
    places = [onnx_cache_dir()] if os.environ.get("FLOWSEARCH_CACHE") else []
    if model_dir is not None:
        places.append(model_dir / BESIDE_MODEL)
    places.append(Path.home() / ".cache" / "flowsearch" / "onnx")
    return list(dict.fromkeys(places))


def _writable(folder: Path) -> bool:
    """Whether a graph can be written in ``folder`` (created if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def session_threads() -> int:
    """Intra-op threads for a session: torch's count when torch is loaded in this process (a
    caller who limited torch limited us too), else 0, onnxruntime's default of one per physical
    core, which is torch's default as well. Asked without importing torch."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else 0


def _import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingExtra(
            "backend='onnx' needs onnxruntime",
            "install it with `pip install onnxruntime` (a dependency of flowsearch)",
            param="backend",
        ) from exc
    return onnxruntime


class OnnxEncoder:
    r"""One exported (and cached) transformer graph and its onnxruntime session.

    Arguments:
        load_model: returns the ``transformers`` model to export (called on a cache miss only).
        identity: names the model's weights (its content hash, or hub id and commit): part of
            the cache key.
        outputs: names from :data:`HIDDEN_OUTPUTS` the graph returns beside the last hidden state.
        config: the model's config (``model_type``, heads and hidden size, for the CPU fusion).
        quantize: ``None`` (fp32) or ``"int8"``.
        threads: intra-op threads of the session (0: onnxruntime's default).
        model_dir: the local model's directory (a graph may live beside it), or ``None``.
        cache_dir: the one place graphs live; ``None`` is :func:`cache_places`.

    Attributes:
        path: the ``.onnx`` file the session runs.
        exported: whether building this object had to export (or quantise) a graph.

    Raises:
        MissingExtra: onnxruntime is not installed.
    """

    def __init__(
        self,
        load_model: Callable[[], Any],
        identity: str,
        outputs: Sequence[str],
        config: Mapping[str, Any],
        quantize: str | None = None,
        threads: int = 0,
        model_dir: Path | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        ort = _import_onnxruntime()
        self.outputs = tuple(sorted(outputs, key=list(HIDDEN_OUTPUTS).index))
        self.quantize = quantize
        self._places = [cache_dir] if cache_dir is not None else cache_places(model_dir)
        self.exported = False
        key = {"identity": identity, "outputs": list(self.outputs), "opset": OPSET}
        key["recipe"] = _RECIPE

        def fp32() -> Path:
            return self._cached(key, lambda dst: self._export(load_model, config, dst))

        if quantize == "int8":
            self.path = self._cached({**key, "quantize": "int8"}, lambda dst: _int8(fp32(), dst))
        else:
            self.path = fp32()
        options = ort.SessionOptions()
        options.intra_op_num_threads = max(0, int(threads))
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(
            str(self.path), options, providers=["CPUExecutionProvider"]
        )
        self._output_names = ["last_hidden_state", *self.outputs]
        inputs = {i.name for i in self._session.get_inputs()}
        self.takes_token_types = "token_type_ids" in inputs

    def run(
        self, input_ids: npt.NDArray[np.int64], attention_mask: npt.NDArray[np.int64]
    ) -> dict[str, npt.NDArray[np.float32]]:
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
        return {
            name: np.asarray(v, dtype=np.float32) for name, v in zip(self._output_names, values)
        }

    def _cached(self, settings: dict[str, Any], build: Callable[[Path], None]) -> Path:
        """The cache file for ``settings`` in the first place that holds it intact, else built
        by ``build(tmp_path)`` in the first place that can be written."""
        name = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]
        for place in self._places:
            path, record = place / f"{name}.onnx", place / f"{name}.json"
            if path.is_file() and record.is_file() and _intact(path, record):
                return path
        target = next((p for p in self._places if _writable(p)), None)
        if target is None:
            raise OSError(f"no writable place for the ONNX graph among {self._places}")
        path, record = target / f"{name}.onnx", target / f"{name}.json"
        LOG.info("writing the ONNX graph once, in %s", target)
        atomic_write(path, lambda tmp: build(Path(tmp)))
        atomic_write_text(record, json.dumps({**settings, **_stamp(path)}, indent=1))
        self.exported = True
        return path

    def _export(self, load_model: Callable[[], Any], config: Mapping[str, Any], dst: Path) -> None:
        from flowsearch.encode.onnx_export import export_graph

        export_graph(load_model(), self.outputs, config, dst)


def _int8(fp32: Path, dst: Path) -> None:
    from flowsearch.encode.onnx_export import quantize_int8

    quantize_int8(fp32, dst)


def _stamp(path: Path) -> dict[str, Any]:
    """What a cache record says of its file: content hash, size, modification time."""
    stat = path.stat()
    return {"sha256": _sha256(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _intact(path: Path, record: Path) -> bool:
    """Whether ``path`` is the file ``record`` describes: its size and time match (cheap), or
    else its content hash does (then the record is brought up to date)."""
    try:
        recorded = read_json_object(record)
    except (OSError, ValueError):
        return False
    stat = path.stat()
    if recorded.get("size") == stat.st_size and recorded.get("mtime_ns") == stat.st_mtime_ns:
        return True
    if recorded.get("sha256") != _sha256(path):
        LOG.warning("ONNX cache file %s is corrupt; exporting it again", path)
        return False
    with contextlib.suppress(OSError):  # a read-only place keeps its old record
        atomic_write_text(record, json.dumps({**recorded, **_stamp(path)}, indent=1))
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
