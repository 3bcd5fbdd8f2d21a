r"""Sentence vectors from a Hugging Face encoder, pooled the ways the BERT-flow paper studies.

The encoder is the first step of the data flow and by far its most expensive one, so this module
cares about speed: texts are tokenised once, sorted by length and batched so that padding is
minimal, the model runs under :func:`torch.inference_mode` (fp16 on a GPU), and each pooling runs
only as much of the model as it reads. ``backend="onnx"`` runs the same model with ONNX Runtime
(:mod:`flowsearch.encode.onnx`), optionally quantised to int8.

Pooling strategies (all attention-mask aware, padding never counts):

- ``cls``: the last layer's vector at the first token.
- ``mean``: mean of the last layer's token vectors (what sentence-transformers computes).
- ``last2avg``: mean over tokens of the average of the last two layers.
- ``first_last_avg``: mean over tokens of the average of the first transformer layer and the last
  (Hugging Face ``hidden_states[1]`` and ``hidden_states[-1]``). This is what the BERT-flow
  reference code computes under the name "last2avg": it indexes ``all_encoder_layers[-i]`` for
  ``i in range(2)``, and ``[-0]`` is the first layer, not the second to last (acknowledged on its
  issue tracker). We offer both under honest names.
- ``static``: position-free: the mean of the model's word embeddings, looked up by token id with
  no transformer pass (:mod:`flowsearch.encode.static`; variants in ``static_variant``). A Model2Vec
  directory is a static model too. Non-contextual and strongly anisotropic: where calibration
  matters most.
- ``embedding_layer``: the first release's ``static``: mean of the embedding layer's outputs
  (``hidden_states[0]``), which add position embeddings and so encode a text's length.

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from flowsearch.encode.model_files import (
    bundled_model_dir,
    declared_max_length,
    has_safetensors,
    looks_like_path,
    revision,
    transformer_dir,
)
from flowsearch.encode.pooling import LAYERS_READ, padded, pool_numpy, pool_torch
from flowsearch.encode.static import STATIC_VARIANTS, StaticTable, is_model2vec_dir
from flowsearch.errors import FlowsearchError, NotFound
from flowsearch.progress import Stages

if TYPE_CHECKING:
    from flowsearch.encode.onnx import OnnxEncoder
    from flowsearch.storage.manifest import EncoderSpec

__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "POOLINGS",
    "QUANTIZATIONS",
    "Backend",
    "Encoder",
    "Pooling",
    "Quantize",
    "open_encoder",
]

LOG = logging.getLogger(__name__)

Pooling = Literal["cls", "mean", "last2avg", "first_last_avg", "static", "embedding_layer"]
POOLINGS: tuple[str, ...] = get_args(Pooling)
Backend = Literal["torch", "onnx"]
BACKENDS: tuple[str, ...] = get_args(Backend)
Quantize = Literal["int8"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantize)

#: The name manifests record for ``model=None``: the bundled all-MiniLM-L6-v2 weights.
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

_MAX_LENGTH_CAP = 512
# Below this many texts no progress bar is drawn unless asked for.
_PROGRESS_MIN_TEXTS = 2000
# Texts tokenised and averaged at once by the static path (bounds its memory).
_STATIC_CHUNK = 8192
# Encoder options an index records beyond model/pooling/max_length, passed again on reopening.
_REOPEN_OPTIONS = ("backend", "quantize")


class Encoder:
    r"""Turns texts into sentence vectors with a transformer encoder (or its embedding table).

    Arguments:
        model: A Hugging Face model id or a local directory (plain ``transformers``,
            sentence-transformers, or Model2Vec ``StaticModel`` layout). ``None`` means the
            bundled all-MiniLM-L6-v2, loaded offline.
        pooling: One of :data:`POOLINGS` (see the module docstring).
        max_length: Tokens per text, truncating longer ones. ``None`` takes the model's own
            limit (a sentence-transformers directory's ``max_seq_length``, else the tokenizer's
            or the position embeddings'), capped at 512. The paper uses 64 for STS.
        device: ``"cpu"``, ``"cuda"``, ... ``None`` picks CUDA when present (torch backend).
        backend: ``"torch"`` or ``"onnx"`` (ONNX Runtime on the CPU, extra ``flowsearch[onnx]``;
            not for ``static``, which runs no model).
        quantize: ``None`` or ``"int8"`` (dynamic int8 quantisation; ``backend="onnx"`` only).
        static_variant: How ``static`` reads a transformer's table: ``"raw"`` word embeddings
            without [CLS]/[SEP] (default), ``"raw+special"``, ``"layernorm"`` (each word
            embedding through the embedding LayerNorm) or ``"layernorm+special"``.
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
        *,
        backend: str = "torch",
        quantize: str | None = None,
        static_variant: str = "raw",
        trust_remote_code: bool = False,
    ) -> None:
        _check_options(pooling, max_length, backend, quantize, static_variant)
        import torch

        self.pooling = pooling
        self.backend = backend
        self.quantize = quantize
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if backend == "onnx" and not self.device.startswith("cpu"):
            raise FlowsearchError("backend='onnx' runs on the CPU; pass device='cpu' or omit it")
        self._trust = trust_remote_code
        self._model: Any = None
        self._static: StaticTable | None = None
        self._onnx: dict[tuple[str, ...], OnnxEncoder] = {}
        self._m2v_tokenizer: Any = None
        self._static_variant = static_variant

        root = bundled_model_dir() if model is None else Path(model).expanduser()
        # a local directory is named by its absolute path, so an index built with a relative
        # path can be reopened from anywhere; a hub id stays as given
        self.model_id = (
            DEFAULT_MODEL if model is None else str(root.resolve()) if root.is_dir() else str(model)
        )
        local = root.is_dir()
        if not local and looks_like_path(str(model)):
            raise FlowsearchError(f"model directory {str(model)!r} does not exist; check the path")
        self._source: str | Path = transformer_dir(root) if local else str(model)
        self._local = local

        if local and is_model2vec_dir(root):
            self._init_model2vec(root, max_length)
            return

        from transformers import AutoConfig, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self._source, **self._load_options())
            self._config = AutoConfig.from_pretrained(self._source, **self._load_options())
            if pooling != "static" or not local:
                self._torch_model()
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FlowsearchError(
                f"cannot load model {self.model_id!r} ({first}); pass a local directory with its "
                "weights or an id already in the Hugging Face cache"
            ) from exc
        self.dim = int(self._config.hidden_size)
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
            self.revision = revision(Path(self._source))
        else:
            self.revision = str(getattr(self._config, "_commit_hash", None) or "unknown")
        if pooling == "static":
            self._static_table()
        elif backend == "onnx":
            self._onnx_encoder(LAYERS_READ[pooling])
            self._model = None  # the session holds the weights now; reloaded only to re-export

    def _init_model2vec(self, root: Path, max_length: int | None) -> None:
        """A Model2Vec ``StaticModel`` directory: its table and tokenizer, no transformer."""
        import json

        from tokenizers import Tokenizer

        if self.pooling != "static":
            raise FlowsearchError(
                f"{self.model_id!r} is a Model2Vec static model; use pooling='static'"
            )
        self._static = StaticTable.from_model2vec(root)
        self._m2v_tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        self._m2v_tokenizer.no_truncation()
        self._m2v_tokenizer.no_padding()
        declared = json.loads((root / "config.json").read_text()).get("max_length")
        self.max_length = max_length or (declared if isinstance(declared, int) else 512)
        self.dim = self._static.dim
        self.revision = revision(root)
        self._config = None

    def _load_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self._local:
            options["local_files_only"] = True
        if self._trust:
            options["trust_remote_code"] = True
        return options

    def _torch_model(self, eager: bool = False) -> Any:
        """The ``transformers`` model, loaded on first need (``static`` never needs it)."""
        if self._model is not None and not eager:
            return self._model
        from transformers import AutoModel

        options = self._load_options()
        if self._local and has_safetensors(Path(self._source)):
            options["use_safetensors"] = True
        if eager:  # the attention pattern ONNX Runtime knows how to fuse
            options["attn_implementation"] = "eager"
        model = AutoModel.from_pretrained(self._source, **options).eval()
        if eager:
            return model
        model.to(self.device)
        if self.device.startswith("cuda"):
            model.half()
        self._model = model
        return model

    def _static_table(self) -> StaticTable:
        """The table ``static`` averages, read on first need."""
        if self._static is None:
            variant = self._static_variant
            if self._local:
                self._static = StaticTable.from_transformer(
                    Path(self._source), variant, self._config
                )
            else:
                self._static = StaticTable.from_transformer(
                    Path("."), variant, self._config, model=self._torch_model()
                )
        return self._static

    def _onnx_encoder(self, outputs: tuple[str, ...]) -> OnnxEncoder:
        """The cached ONNX graph returning ``outputs`` beside the last hidden state."""
        from flowsearch.encode.onnx import OnnxEncoder

        key = tuple(sorted(outputs))
        if key not in self._onnx:
            import torch

            self._onnx[key] = OnnxEncoder(
                lambda: self._torch_model(eager=True),
                # a local model is its content hash, wherever it lives; a hub id needs its name
                identity=self.revision if self._local else f"{self.model_id}@{self.revision}",
                outputs=key,
                config=self._config,
                quantize=self.quantize,
                threads=torch.get_num_threads(),
            )
        return self._onnx[key]

    def _position_limit(self) -> int:
        """Tokens the model can take at most (its position embeddings, or the tokenizer's)."""
        limits = [100_000]
        tok_limit = getattr(self._tokenizer, "model_max_length", None)
        if isinstance(tok_limit, int) and 0 < tok_limit < 100_000:
            limits.append(tok_limit)
        pos_limit = getattr(self._config, "max_position_embeddings", None)
        if isinstance(pos_limit, int) and pos_limit > 0:
            limits.append(pos_limit)
        return min(limits)

    def _default_max_length(self, root: Path | None) -> int:
        if root is not None:
            declared = declared_max_length(root, transformer_dir(root))
            if declared:
                return min(declared, _MAX_LENGTH_CAP)
        return min(self._position_limit(), _MAX_LENGTH_CAP)

    @property
    def variant(self) -> str | None:
        """How ``static`` reads its table (``None`` for the other poolings)."""
        return self._static.variant if self.pooling == "static" and self._static else None

    def describe(self) -> dict[str, object]:
        r"""What identifies this encoder's vectors; an index stores it and queries must match.

        Returns:
            ``{"model", "revision", "pooling", "max_length", "dim", "variant", "backend",
            "quantize"}``: ``variant`` is the static table's reading (``"raw"``,
            ``"raw+special"``, ``"layernorm"``, ``"layernorm+special"``, ``"model2vec"``,
            ``"model2vec+normalize"``) for ``static`` and ``None`` otherwise; ``backend`` is
            ``"torch"`` or ``"onnx"``; ``quantize`` is ``None`` or ``"int8"``.
        """
        return {
            "model": self.model_id,
            "revision": self.revision,
            "pooling": self.pooling,
            "max_length": self.max_length,
            "dim": self.dim,
            "variant": self.variant,
            "backend": self.backend,
            "quantize": self.quantize,
        }

    def __repr__(self) -> str:
        extra = f", variant={self.variant!r}" if self.variant else ""
        if self.backend != "torch":
            extra += f", backend={self.backend!r}, quantize={self.quantize!r}"
        return (
            f"Encoder(model={self.model_id!r}, pooling={self.pooling!r}, "
            f"max_length={self.max_length}, device={self.device!r}{extra})"
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
            A float32 array of shape ``(len(texts), dim)``, rows in input order; unnormalised
            (except a Model2Vec model whose config asks for unit vectors).
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

        The pass stops at what the poolings read: ``static`` alone runs no model,
        ``embedding_layer`` alone only the embedding layer, ``cls``/``mean`` skip returning the
        intermediate layers. ``static`` uses this encoder's ``static_variant``.

        Returns:
            ``{pooling: float32 (len(texts), dim)}``; each equals what an :class:`Encoder` with
            that pooling (same model, max_length and backend) returns from :meth:`encode`.
        """
        texts = _checked_texts(texts)
        for pooling in poolings:
            if pooling not in POOLINGS:
                raise FlowsearchError(
                    f"unknown pooling {pooling!r}; choose from {', '.join(POOLINGS)}"
                )
        contextual = [p for p in dict.fromkeys(poolings) if p != "static"]
        if contextual and self._m2v_tokenizer is not None:
            raise FlowsearchError(
                f"{self.model_id!r} is a Model2Vec static model; it has only pooling 'static'"
            )
        if batch_size < 1:
            raise FlowsearchError(f"batch_size must be >= 1, got {batch_size}")
        out = {p: np.empty((len(texts), self.dim), dtype=np.float32) for p in poolings}
        if not texts:
            return out
        show = progress if progress is not None else len(texts) >= _PROGRESS_MIN_TEXTS
        stages = Stages(show=show)
        with stages.live(), stages.task("encoding", total=len(texts)) as advance:
            if "static" in out:
                table = self._static_table()
                for start in range(0, len(texts), _STATIC_CHUNK):
                    chunk = texts[start : start + _STATIC_CHUNK]
                    out["static"][start : start + len(chunk)] = table.vectors(
                        self._static_ids(chunk)
                    )
                    if not contextual:
                        advance(len(chunk))
            if contextual:
                self._encode_contextual(texts, contextual, batch_size, out, advance)
        return out

    def _static_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids for the static table: truncated to the same words the model would read."""
        if self._m2v_tokenizer is not None:
            encoded = self._m2v_tokenizer.encode_batch(texts, add_special_tokens=False)
            return [e.ids[: self.max_length] for e in encoded]
        assert self._static is not None
        keep = self._static.special_tokens
        limit = self.max_length - (0 if keep else self._tokenizer.num_special_tokens_to_add())
        return self._tokenizer(
            texts,
            add_special_tokens=keep,
            truncation=True,
            max_length=max(limit, 1),
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]

    def _encode_contextual(
        self,
        texts: list[str],
        poolings: list[str],
        batch_size: int,
        out: dict[str, np.ndarray],
        advance: Any,
    ) -> None:
        import torch

        ids = self._tokenizer(
            texts,
            truncation=True,
            max_length=self.max_length,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        order = np.argsort([-len(x) for x in ids], kind="stable")
        pad_id = self._tokenizer.pad_token_id or 0
        needs = tuple(sorted({n for p in poolings for n in LAYERS_READ[p]}))
        onnx = self._onnx_encoder(needs) if self.backend == "onnx" else None
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                input_ids, mask = padded([ids[i] for i in rows], pad_id)
                if onnx is not None:
                    pooled = pool_numpy(onnx.run(input_ids, mask), mask, poolings)
                else:
                    batch = {
                        "input_ids": torch.from_numpy(input_ids).to(self.device),
                        "attention_mask": torch.from_numpy(mask).to(self.device),
                    }
                    tensors = pool_torch(self._torch_model(), batch, poolings)
                    pooled = {p: v.float().cpu().numpy() for p, v in tensors.items()}
                for pooling, vectors in pooled.items():
                    out[pooling][rows] = vectors
                advance(len(rows))


def _check_options(
    pooling: str, max_length: int | None, backend: str, quantize: str | None, variant: str
) -> None:
    if pooling not in POOLINGS:
        raise FlowsearchError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    if max_length is not None and (not isinstance(max_length, int) or max_length < 2):
        raise FlowsearchError(f"max_length must be an integer >= 2, got {max_length!r}")
    if backend not in BACKENDS:
        raise FlowsearchError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise FlowsearchError(
            f"unknown quantize {quantize!r}; choose one of {', '.join(QUANTIZATIONS)} or none"
        )
    if quantize is not None and backend != "onnx":
        raise FlowsearchError(f"quantize={quantize!r} needs backend='onnx'")
    if backend == "onnx" and pooling == "static":
        raise FlowsearchError(
            "pooling 'static' is a table lookup that runs no model, so backend 'onnx' has "
            "nothing to run; use backend 'torch' with it"
        )
    if variant not in STATIC_VARIANTS:
        raise FlowsearchError(
            f"unknown static variant {variant!r}; choose one of {', '.join(STATIC_VARIANTS)}"
        )


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
        variant = spec.options.get("variant")
        if spec.pooling == "static" and variant in STATIC_VARIANTS:
            options["static_variant"] = variant
        gone = source is not None and model is None and not Path(source).exists()
        if gone and looks_like_path(str(source)):
            raise NotFound(
                f"the index's model directory {source} is gone",
                "if the model moved, pass {model=DIR} with its new place",
                param="model",
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
