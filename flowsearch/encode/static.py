r"""Position-free static sentence vectors: the mean of token vectors read from a table.

``static`` pooling never runs a transformer. Each text is tokenised, every token id picks a row of
a table, and the rows are averaged: a table lookup per token. The table is either a transformer's
input word embeddings (optionally through the model's embedding LayerNorm, applied to each row
alone, without position or token-type embeddings) or a Model2Vec ``StaticModel`` directory's
embedding matrix (with its per-token weights and vocabulary mapping when it has them).

Such vectors are non-contextual and strongly anisotropic, which is where calibration pays most
(Li et al., 2020); without position embeddings they no longer encode a text's length.

Variants of a transformer's table (recorded by :meth:`flowsearch.Encoder.describe`):

- ``raw``: raw word embeddings, special tokens ([CLS], [SEP]) dropped (the default);
- ``raw+special``: raw word embeddings, [CLS] and [SEP] kept;
- ``layernorm`` / ``layernorm+special``: each word embedding through the embedding LayerNorm.

A Model2Vec directory's variant is ``model2vec`` (or ``model2vec+normalize`` when its config asks
for unit-length outputs).

References:
    Li et al., "On the Sentence Embeddings from Pre-trained Language Models", EMNLP 2020.
    Tulkens and van Dongen, "Model2Vec: Fast State-of-the-Art Static Embeddings", 2024.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from flowsearch.errors import BadInput

__all__ = [
    "STATIC_VARIANTS",
    "StaticTable",
    "StaticVariant",
    "is_model2vec_dir",
    "mean_of_rows",
]

StaticVariant = Literal["raw", "raw+special", "layernorm", "layernorm+special"]
STATIC_VARIANTS: tuple[str, ...] = get_args(StaticVariant)

_WEIGHT_FILES = ("model.safetensors",)


def is_model2vec_dir(root: Path) -> bool:
    """Whether ``root`` holds a Model2Vec ``StaticModel`` (config marker plus its three files)."""
    config = root / "config.json"
    if not (config.is_file() and (root / "model.safetensors").is_file()):
        return False
    if not (root / "tokenizer.json").is_file():
        return False
    try:
        cfg = json.loads(config.read_text())
    except ValueError:
        return False
    if not isinstance(cfg, dict):
        return False
    return cfg.get("model_type") == "model2vec" or "StaticModel" in (cfg.get("architectures") or [])


#: Up to this many texts, :func:`mean_of_rows` sums in numpy: bit for bit the sparse product's
#: result (its row-by-row float32 accumulation, checked in tests/test_static.py), without the
#: import of scipy.sparse, which cost a cold static query a third of its time.
_FEW_TEXTS = 8


def mean_of_rows(
    table: npt.NDArray[np.float32], ids: Sequence[Sequence[int]]
) -> npt.NDArray[np.float32]:
    r"""The mean of ``table``'s rows named by each list of ids, by one sparse product.

    Arguments:
        table: float32 ``(vocab, dim)``.
        ids: one list of row ids per text; an empty list gives a zero vector.

    Returns:
        float32 ``(len(ids), dim)``. Each row depends on its own ids only, so how texts are
        grouped into calls never changes a result.
    """
    n = len(ids)
    if n <= _FEW_TEXTS:  # a query: the same sums in the same order, without importing scipy
        out = np.zeros((n, table.shape[1]), dtype=np.float32)
        for row, text_ids in enumerate(ids):
            weight = np.float32(1.0 / max(len(text_ids), 1))
            for token in text_ids:
                out[row] += weight * table[token]
        return out
    import scipy.sparse

    lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=n)
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    weights = np.repeat((1.0 / np.maximum(lengths, 1)).astype(np.float32), lengths)
    # a (texts x vocab) matrix of 1/length weights times the table is the masked mean
    averaging = scipy.sparse.csr_matrix((weights, flat, indptr), shape=(n, table.shape[0]))
    return np.asarray(averaging @ table, dtype=np.float32)


class StaticTable:
    r"""A token-vector table and how texts become its row ids.

    Arguments:
        table: float32 ``(vocab, dim)``, indexed by token id.
        variant: the name :meth:`flowsearch.Encoder.describe` records.
        special_tokens: keep the tokenizer's special tokens ([CLS], [SEP]) in the mean.
        drop_ids: token ids never averaged (Model2Vec drops its unknown token).
        normalize: L2-normalise each output vector (a Model2Vec config's ``normalize``).

    Use :meth:`from_transformer` or :meth:`from_model2vec` rather than this constructor.
    """

    def __init__(
        self,
        table: npt.ArrayLike,
        variant: str,
        special_tokens: bool = False,
        drop_ids: frozenset[int] = frozenset(),
        normalize: bool = False,
    ) -> None:
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.variant = variant
        self.special_tokens = special_tokens
        self.drop_ids = drop_ids
        self.normalize = normalize

    @property
    def dim(self) -> int:
        """Vector size (the table's columns)."""
        return int(self.table.shape[1])

    @classmethod
    def from_transformer(
        cls,
        model_dir: Path,
        variant: str = "raw",
        config: Mapping[str, Any] | None = None,
        model: Any = None,
    ) -> StaticTable:
        r"""The word-embedding table of a transformer directory, read without building the model.

        A single ``model.safetensors`` file is read with numpy (no ``torch``, no
        ``transformers``); other weight layouts load the model through ``transformers``.

        Arguments:
            model_dir: a local ``transformers`` directory.
            variant: one of :data:`STATIC_VARIANTS`.
            config: its ``config.json`` (for ``layer_norm_eps``).
            model: an already loaded model; its ``get_input_embeddings()`` is the table.

        Raises:
            BadInput: an unknown variant, or a LayerNorm variant of a model without one.
        """
        if variant not in STATIC_VARIANTS:
            raise BadInput(
                f"unknown static variant {variant!r}",
                f"choose one of {', '.join(STATIC_VARIANTS)}",
                param="static_variant",
            )
        layernorm = variant.startswith("layernorm")
        tensors = _embedding_tensors(model_dir, layernorm) if model is None else None
        if tensors is None:
            if model is None:
                return cls._from_loaded_model(model_dir, variant, config)
            tensors = _embedding_tensors_of(model, layernorm)
        table = tensors["word"]
        if layernorm:
            eps = float((config or {}).get("layer_norm_eps") or 1e-12)
            table = _layer_norm(table, tensors["ln_weight"], tensors["ln_bias"], eps)
        return cls(table, variant, special_tokens=variant.endswith("+special"))

    @classmethod
    def _from_loaded_model(
        cls, model_dir: Path, variant: str, config: Mapping[str, Any] | None
    ) -> StaticTable:
        from transformers import AutoModel

        model = AutoModel.from_pretrained(model_dir, local_files_only=True)
        return cls.from_transformer(model_dir, variant, config, model=model)

    @classmethod
    def from_model2vec(cls, root: Path) -> StaticTable:
        r"""The table of a Model2Vec ``StaticModel`` directory (``model.safetensors``).

        The effective row of token ``t`` is ``embeddings[mapping[t]] * weights[t]`` when the
        file carries a vocabulary ``mapping`` and per-token ``weights``, as Model2Vec computes;
        its unknown token is dropped and its ``normalize`` setting is kept.
        """
        from safetensors import safe_open

        with safe_open(str(root / "model.safetensors"), framework="numpy") as fh:
            keys = set(fh.keys())
            if "embeddings" not in keys:
                raise BadInput(
                    f"{root / 'model.safetensors'} has no 'embeddings' tensor",
                    f"is {str(root)!r} a Model2Vec directory saved by StaticModel.save_pretrained?",
                    param="model",
                )
            table = fh.get_tensor("embeddings").astype(np.float32)
            mapping = fh.get_tensor("mapping") if "mapping" in keys else None
            weights = fh.get_tensor("weights") if "weights" in keys else None
        if mapping is not None:
            table = table[mapping.astype(np.int64)]
        if weights is not None:
            table = table * weights.astype(np.float32)[: len(table), None]
        cfg = json.loads((root / "config.json").read_text())
        normalize = bool(cfg.get("normalize", False))
        tokenizer = json.loads((root / "tokenizer.json").read_text())
        unk = _unknown_token_id(tokenizer)
        variant = "model2vec+normalize" if normalize else "model2vec"
        drop = frozenset() if unk is None else frozenset({unk})
        return cls(table, variant, special_tokens=False, drop_ids=drop, normalize=normalize)

    def vectors(self, ids: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        """float32 ``(len(ids), dim)``: the (optionally normalised) mean row per text."""
        if self.drop_ids:
            ids = [[t for t in row if t not in self.drop_ids] for row in ids]
        out = mean_of_rows(self.table, ids)
        if self.normalize:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out /= np.maximum(norms, 1e-32)
        return out


def _layer_norm(
    x: npt.NDArray[np.float32],
    weight: npt.NDArray[np.float32],
    bias: npt.NDArray[np.float32],
    eps: float,
) -> npt.NDArray[np.float32]:
    mean = x.mean(axis=1, keepdims=True)
    var = x.var(axis=1, keepdims=True)
    out: npt.NDArray[np.float32] = ((x - mean) / np.sqrt(var + eps) * weight + bias).astype(
        np.float32
    )
    return out


def _embedding_tensors(
    model_dir: Path, layernorm: bool
) -> dict[str, npt.NDArray[np.float32]] | None:
    """The word-embedding (and LayerNorm) tensors from a single safetensors file, if found.

    A float32 word table is memory-mapped, not read: a query touches a few of its rows, and
    reading all of them (tens of MB for a BERT-base vocabulary) was most of a cold static query's
    encoder time. Other dtypes are read and converted to float32.
    """
    path = model_dir / "model.safetensors"
    if not path.is_file():
        return None
    layout = _safetensors_layout(path)
    words = [k for k in layout if k.endswith("word_embeddings.weight")]
    if len(words) != 1:
        return None
    prefix = words[0][: -len("word_embeddings.weight")]
    names = {"word": words[0]}
    if layernorm:
        names |= {"ln_weight": prefix + "LayerNorm.weight", "ln_bias": prefix + "LayerNorm.bias"}
        if any(key not in layout for key in names.values()):
            return None
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, key in names.items():
        dtype, shape, offset = layout[key]
        if dtype == "F32" and sys.byteorder == "little":
            out[name] = np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=shape)
        else:
            out[name] = _read_tensor(path, key)
    return out


def _safetensors_layout(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """Each tensor of a safetensors file: ``(dtype, shape, byte offset in the file)``.

    The format: an 8-byte little-endian header length, a JSON header naming each tensor's
    dtype, shape and ``data_offsets`` relative to the end of the header, then the data.
    """
    with path.open("rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    start = 8 + size
    return {
        name: (str(info["dtype"]), tuple(int(n) for n in info["shape"]), start + int(begin))
        for name, info in header.items()
        if name != "__metadata__"
        for begin in (info["data_offsets"][0],)
    }


def _read_tensor(path: Path, key: str) -> npt.NDArray[np.float32]:
    """One tensor of a safetensors file, read whole and converted to float32."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as fh:
        return np.asarray(fh.get_tensor(key), dtype=np.float32)


def _embedding_tensors_of(model: Any, layernorm: bool) -> dict[str, npt.NDArray[np.float32]]:
    out = {"word": model.get_input_embeddings().weight.detach().float().cpu().numpy()}
    if layernorm:
        norm = getattr(getattr(model, "embeddings", None), "LayerNorm", None)
        if norm is None:
            raise BadInput(
                "this model has no embedding LayerNorm",
                "use static variant 'raw' or 'raw+special'",
                param="static_variant",
            )
        out["ln_weight"] = norm.weight.detach().float().cpu().numpy()
        out["ln_bias"] = norm.bias.detach().float().cpu().numpy()
    return out


def _unknown_token_id(tokenizer: dict[str, Any]) -> int | None:
    """The id of a ``tokenizer.json``'s unknown token, if its model names one."""
    model = tokenizer.get("model") or {}
    unk = model.get("unk_token")
    if unk is None:
        unk_id = model.get("unk_id")
        return int(unk_id) if isinstance(unk_id, int) else None
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        found = vocab.get(unk)
        return int(found) if isinstance(found, int) else None
    for added in tokenizer.get("added_tokens") or []:
        if added.get("content") == unk:
            return int(added["id"])
    return None
