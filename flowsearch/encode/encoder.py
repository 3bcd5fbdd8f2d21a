r"""Sentence vectors from a Hugging Face encoder, pooled the ways the BERT-flow paper studies.

Poolings (all attention-mask aware, padding never counts): ``cls`` (the last layer at the first
token); ``mean`` (mean of the last layer, as sentence-transformers); ``last2avg`` (of the average
of the last two layers); ``first_last_avg`` (of the first transformer layer and the last,
``hidden_states[1]`` and ``[-1]``: the BERT-flow code's "last2avg", docs/ENCODERS.md);
``static`` (position-free mean of word-embedding rows, a table lookup with no transformer pass,
:mod:`flowsearch.encode.static`; a Model2Vec directory is a static model); ``embedding_layer``
(mean of ``hidden_states[0]``, which adds position embeddings).

Texts are tokenised once, sorted by length and batched so that padding is minimal; a pooling runs
only as much of the model as it reads, on torch (:mod:`~flowsearch.encode.torch_runner`, fp16 on
a GPU) or ONNX Runtime (:mod:`~flowsearch.encode.onnx`, optionally int8). The default,
``backend="auto"``, is the fastest exact runtime: ONNX Runtime in fp32 on the CPU (the same
vectors as torch's fp32 to float rounding; the graph exported once and cached), torch on CUDA;
an export that fails falls back to torch with one warning. ``torch`` and ``transformers`` are
imported only when a model runs in torch or is exported: a static or cached ONNX encoder of a
local model never imports them.

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from flowsearch.encode.identity import first_difference, mismatch_error, reopen_options
from flowsearch.encode.loading import load_parts, loading_errors
from flowsearch.encode.model_files import DEFAULT_MODEL, looks_like_path
from flowsearch.encode.onnx import OnnxEncoder, session_threads
from flowsearch.encode.options import (
    BACKENDS,
    POOLINGS,
    QUANTIZATIONS,
    Backend,
    Pooling,
    Quantize,
    check_options,
    check_poolings,
    checked_texts,
)
from flowsearch.encode.pooling import LAYERS_READ, padded, pool_numpy
from flowsearch.encode.protocol import TextEncoder
from flowsearch.encode.static import StaticTable
from flowsearch.encode.torch_runner import TorchRunner, cuda_visible, default_device
from flowsearch.errors import BadInput, NotFound, check_bool, check_int
from flowsearch.progress import Stages

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

Vectors = npt.NDArray[np.float32]
Ids = npt.NDArray[np.int64]

#: Texts the ``static`` pooling tokenises and averages at once: bounds the memory of their token
#: ids while keeping each sparse product large.
STATIC_CHUNK_TEXTS = 8192
#: ``Encoder.encode(progress=None)`` draws a progress bar from this many texts on: a query or a
#: small batch never does.
PROGRESS_MIN_TEXTS = 2000


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
        backend: ``"auto"`` (ONNX Runtime fp32 on the CPU, torch on CUDA; torch when the ONNX
            export fails, with a warning), ``"torch"`` or ``"onnx"`` (ONNX Runtime on the CPU;
            not for ``static``, which runs no model: its encoders record ``"torch"``).
        quantize: ``None`` or ``"int8"`` (dynamic int8 quantisation, on ONNX Runtime).
        static_variant: How ``static`` reads a transformer's table: ``"raw"`` word embeddings
            without [CLS]/[SEP] (default), ``"raw+special"``, ``"layernorm"`` (each word
            embedding through the embedding LayerNorm) or ``"layernorm+special"``.
        trust_remote_code: Let ``transformers`` run code shipped with the model. Off by
            default: only for models you trust.

    Attributes:
        model_id: the model's recorded name: :data:`DEFAULT_MODEL`, a directory's absolute
            path, or a hub id.
        revision: the model's content hash (16 hex digits; local) or commit (hub).
        pooling, max_length, dim, backend, quantize: as :meth:`describe` reports them.

    Raises:
        BadInput: an unknown or inconsistent option, or ``max_length`` above the model's limit.
        NotFound: no such model directory, or a model ``transformers`` cannot load.
        MissingExtra: ``backend="onnx"`` without onnxruntime installed.

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
        backend: str = "auto",
        quantize: str | None = None,
        static_variant: str = "raw",
        trust_remote_code: bool = False,
    ) -> None:
        check_options(pooling, max_length, backend, quantize, static_variant)
        check_bool(trust_remote_code, "trust_remote_code")
        if (backend == "onnx" or quantize is not None) and not (device or "cpu").startswith("cpu"):
            what = f"quantize={quantize!r}" if quantize is not None else "backend='onnx'"
            raise BadInput(
                f"{what} runs on the CPU (on ONNX Runtime)",
                "pass {device='cpu'} or omit it",
                param="device",
            )
        self.pooling = pooling
        self.backend = _runtime(backend, pooling, quantize, device)
        self.quantize = quantize
        self._device = "cpu" if self.backend == "onnx" else device
        self._static_variant = static_variant
        self._static: StaticTable | None = None
        self._onnx: dict[tuple[str, ...], OnnxEncoder] = {}
        self._runner: TorchRunner | None = None
        self._parts = load_parts(model, max_length, trust_remote_code=trust_remote_code)
        parts = self._parts
        if parts.model2vec and pooling != "static":
            raise BadInput(
                f"{parts.source.model_id!r} is a Model2Vec static model", "use {pooling='static'}"
            )
        self._static = parts.table
        self._tokens = parts.tokens
        self.model_id = parts.source.model_id
        self.dim = parts.dim
        self.max_length = parts.max_length
        self.revision = parts.revision
        with loading_errors(self.model_id):  # load what the pooling runs: fail now, not later
            if pooling == "static":
                self._static_table()
            elif self.backend == "onnx" and backend == "auto":
                self._onnx_or_torch(LAYERS_READ[pooling])
            elif self.backend == "onnx":
                self._onnx_encoder(LAYERS_READ[pooling])
            else:
                self._torch().model()

    def _onnx_or_torch(self, outputs: Sequence[str]) -> None:
        """Loads the ONNX graph, or on any failure to export or open it, torch instead (one
        warning line: the vectors are the same, only slower to compute)."""
        try:
            self._onnx_encoder(outputs)
        except Exception as exc:  # noqa: BLE001 - whatever the export hit, torch still runs
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            LOG.warning(
                "the ONNX export of %s failed (%s: %s); encoding with torch instead",
                self.model_id,
                type(exc).__name__,
                first[:200],
            )
            self.backend = "torch"
            self._onnx.clear()
            self._torch().model()

    @property
    def device(self) -> str:
        """Where the torch backend runs the model (resolved on first need: CUDA if present)."""
        if self._device is None:
            self._device = default_device()
        return self._device

    def _torch(self) -> TorchRunner:
        """The torch runner of this model (the model itself loads on first use)."""
        if self._runner is None:
            self._runner = TorchRunner(self._parts.source.path, self._parts.options, self.device)
        return self._runner

    def _static_table(self) -> StaticTable:
        """The table ``static`` averages, read on first need."""
        if self._static is None:
            variant, config, source = self._static_variant, self._parts.config, self._parts.source
            if source.local:
                self._static = StaticTable.from_transformer(Path(source.path), variant, config)
            else:  # a hub model's table comes from the loaded model
                model = self._torch().model()
                self._static = StaticTable.from_transformer(Path("."), variant, config, model)
        return self._static

    def _onnx_encoder(self, outputs: Sequence[str]) -> OnnxEncoder:
        """The cached ONNX graph returning ``outputs`` beside the last hidden state."""
        key = tuple(sorted(outputs))
        if key not in self._onnx:
            local = self._parts.source.local
            self._onnx[key] = OnnxEncoder(
                lambda: self._torch().eager_model(),
                # a local model is its content hash, wherever it lives; a hub id needs its name
                identity=self.revision if local else f"{self.model_id}@{self.revision}",
                outputs=key,
                config=self._parts.config,
                quantize=self.quantize,
                threads=session_threads(),
                model_dir=self._parts.source.root,
            )
        return self._onnx[key]

    @property
    def variant(self) -> str | None:
        """How ``static`` reads its table (``None`` for the other poolings)."""
        return self._static.variant if self.pooling == "static" and self._static else None

    @property
    def window(self) -> int:
        """Tokens of one text the encoder reads (``max_length`` less the special tokens it
        adds); the rest of a longer text never reaches its vector."""
        if self._parts.model2vec:
            return int(self.max_length)
        return max(int(self.max_length) - self._tokens.num_special(), 1)

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as ``(start, end)`` character offsets (no special tokens, no
        truncation): where :mod:`flowsearch.ingest.passages` may cut.

        Raises:
            BadInput: a tokenizer without offsets.
        """
        try:
            return self._tokens.offsets(texts)
        except ValueError as exc:
            raise BadInput(
                f"cannot cut texts into passages with {self.model_id!r} ({exc})",
                "pass {passage_tokens=0} to read only each text's first tokens",
                param="passage_tokens",
            ) from None

    def describe(self) -> dict[str, object]:
        r"""What identifies this encoder's vectors; an index stores it and queries must match.

        Returns:
            ``{"model", "revision", "pooling", "max_length", "dim", "variant", "backend",
            "quantize"}``: ``variant`` is the static table's reading (``"raw"``,
            ``"raw+special"``, ``"layernorm"``, ``"layernorm+special"``, ``"model2vec"``,
            ``"model2vec+normalize"``) for ``static`` and ``None`` otherwise; ``backend`` is
            the runtime that ran, ``"torch"`` or ``"onnx"`` (fp32 on either gives the same
            vectors: :func:`~flowsearch.encode.identity.first_difference` does not tell them
            apart); ``quantize`` is ``None`` or ``"int8"``.
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
        device = self._device or "auto"  # not resolved: no model has run in torch yet
        return (
            f"Encoder(model={self.model_id!r}, pooling={self.pooling!r}, "
            f"max_length={self.max_length}, device={device!r}{extra})"
        )

    def encode(
        self, texts: Sequence[str] | str, batch_size: int = 64, progress: bool | None = None
    ) -> Vectors:
        r"""Encodes texts into sentence vectors.

        Arguments:
            texts: The texts (a single string is taken as a list of one).
            batch_size: Texts per forward pass. Batches are formed from texts of similar
                length, so padding costs little.
            progress: Draw a progress bar on stderr. ``None`` draws one from
                :data:`PROGRESS_MIN_TEXTS` texts on.

        Returns:
            A float32 array of shape ``(len(texts), dim)``, rows in input order; unnormalised
            (except a Model2Vec model whose config asks for unit vectors).

        Raises:
            BadInput: ``texts`` is not a list of strings, or ``batch_size`` < 1.
        """
        return self.encode_poolings(texts, (self.pooling,), batch_size, progress)[self.pooling]

    def encode_poolings(
        self,
        texts: Sequence[str] | str,
        poolings: Sequence[str] = POOLINGS,
        batch_size: int = 64,
        progress: bool | None = None,
    ) -> dict[str, Vectors]:
        r"""Several poolings of the same texts from one forward pass (for comparing them).

        The pass stops at what the poolings read: ``static`` alone runs no model,
        ``embedding_layer`` alone only the embedding layer, ``cls``/``mean`` skip returning the
        intermediate layers. ``static`` uses this encoder's ``static_variant``.

        Arguments:
            texts: as for :meth:`encode`.
            poolings: names from :data:`POOLINGS`; a contextual one loads the model if this
                encoder has not yet (a ``static`` encoder of a transformer can give them all).
            batch_size: texts per forward pass.
            progress: as for :meth:`encode`.

        Returns:
            ``{pooling: float32 (len(texts), dim)}``; each equals what an :class:`Encoder` with
            that pooling (same model, max_length and backend) returns from :meth:`encode`.

        Raises:
            BadInput: an unknown pooling, a contextual pooling of a Model2Vec model, bad
                ``texts`` or ``batch_size`` < 1.
        """
        texts = checked_texts(texts)
        check_poolings(poolings)
        contextual = [p for p in dict.fromkeys(poolings) if p != "static"]
        if contextual and self._parts.model2vec:
            raise BadInput(
                f"{self.model_id!r} is a Model2Vec static model; it has only pooling 'static'",
                param="poolings",
            )
        check_int(batch_size, "batch_size", 1)
        if progress is not None:
            check_bool(progress, "progress")
        out = {p: np.empty((len(texts), self.dim), dtype=np.float32) for p in poolings}
        if not texts:
            return out
        show = progress if progress is not None else len(texts) >= PROGRESS_MIN_TEXTS
        stages = Stages(show=show)
        with stages.live(), stages.task("encoding", total=len(texts)) as advance:
            if "static" in out:
                self._encode_static(texts, out["static"], advance if not contextual else None)
            if contextual:
                self._encode_contextual(texts, contextual, batch_size, out, advance)
        return out

    def _encode_static(
        self, texts: list[str], out: Vectors, advance: Callable[[int], None] | None
    ) -> None:
        """Fills ``out`` with the static vectors of ``texts``, a chunk at a time."""
        table = self._static_table()
        special = table.special_tokens
        # truncated to the words the model itself would read (its limit counts [CLS], [SEP]);
        # a Model2Vec tokenizer adds no special tokens
        dropped = 0 if special or self._parts.model2vec else self._tokens.num_special()
        limit = max(self.max_length - dropped, 1)
        step = STATIC_CHUNK_TEXTS
        for start in range(0, len(texts), step):
            chunk = texts[start : start + step]
            ids = self._tokens.ids(chunk, limit, special=special)
            out[start : start + len(chunk)] = table.vectors(ids)
            if advance is not None:
                advance(len(chunk))

    def _encode_contextual(
        self,
        texts: list[str],
        poolings: list[str],
        batch_size: int,
        out: dict[str, Vectors],
        advance: Callable[[int], None],
    ) -> None:
        """Fills ``out[p]`` for each contextual pooling: length-sorted padded batches."""
        ids = self._tokens.ids(texts, self.max_length)
        order = np.argsort([-len(x) for x in ids], kind="stable")
        needs = tuple(sorted({n for p in poolings for n in LAYERS_READ[p]}))
        if self.backend == "onnx":
            graph = self._onnx_encoder(needs)

            def run(input_ids: Ids, mask: Ids) -> dict[str, Vectors]:
                return pool_numpy(graph.run(input_ids, mask), mask, poolings)
        else:
            runner = self._torch()

            def run(input_ids: Ids, mask: Ids) -> dict[str, Vectors]:
                return runner.pool(input_ids, mask, poolings)

        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            input_ids, mask = padded([ids[i] for i in rows], self._tokens.pad_id)
            for pooling, vectors in run(input_ids, mask).items():
                out[pooling][rows] = vectors
            advance(len(rows))


def _runtime(backend: str, pooling: str, quantize: str | None, device: str | None) -> str:
    """The runtime ``backend`` names: ``auto`` is ONNX Runtime on the CPU (and for ``int8``),
    torch on CUDA and for ``static`` (which runs no model)."""
    if backend != "auto":
        return backend
    if pooling == "static":
        return "torch"
    if quantize is not None:
        return "onnx"
    if device is not None:
        return "onnx" if device.startswith("cpu") else "torch"
    return "torch" if cuda_visible() else "onnx"


def open_encoder(
    described: Mapping[str, Any],
    source: str | None,
    *,
    encoder: TextEncoder | None = None,
    model: str | os.PathLike[str] | None = None,
) -> TextEncoder:
    """The encoder an index's record names, checked against the record.

    Args:
        described: the recorded fields (what :meth:`Encoder.describe` returned when the index
            was built): ``model``, ``revision``, ``pooling``, ``max_length``, ``dim`` and the
            options it recorded (``variant``, ``backend``, ``quantize``; a missing one is
            neither passed nor compared).
        source: how to load the model again: ``None`` for the bundled model, else the hub id
            or the directory (absolute) it was built from.
        encoder: an already loaded encoder to reuse instead; it must describe itself as
            recorded.
        model: where the model is now, when its directory has moved since the index was
            built (its content hash must still match the recorded revision).

    Returns:
        The encoder, loaded or reused.

    Raises:
        NotFound: the recorded model directory is gone (and no ``model`` says where it went).
        BadInput: the encoder (reused, moved or reloaded) differs from the record in any field;
            the message names the field, both values and the fix.
    """
    if encoder is None:
        place = str(model) if model is not None else source
        gone = place is not None and model is None and not Path(place).exists()
        if gone and looks_like_path(str(place)):
            raise NotFound(
                f"the index's model directory {place} is gone",
                "if the model moved, pass {model=DIR} with its new place",
                param="model",
            )
        loaded: TextEncoder = Encoder(place, **reopen_options(described))
    elif not isinstance(encoder, TextEncoder):
        raise BadInput(
            f"encoder must be a loaded Encoder, got {type(encoder).__name__} {encoder!r:.60}",
            "pass {encoder=Encoder(...)}, or leave it out to load the index's model",
            param="encoder",
        )
    else:
        loaded = encoder
    relocated = model is not None or loaded.model_id == source
    difference = first_difference(loaded.describe(), described, relocated=relocated)
    if difference is not None:
        moved_to = str(model) if model is not None else None
        raise mismatch_error(difference, reused=encoder is not None, moved_to=moved_to)
    return loaded


if TYPE_CHECKING:

    def _implements(encoder: Encoder) -> TextEncoder:
        """mypy checks here that :class:`Encoder` is a :class:`TextEncoder`."""
        return encoder
