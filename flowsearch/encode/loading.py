r"""What a model provides before anything runs: its config, tokenizer, limits and revision.

:func:`load_parts` reads a model (the bundled default, a local directory, a Model2Vec directory
or a hub id) into :class:`ModelParts`. A local directory is read as files (JSON, a
``tokenizer.json``, a content hash of the weights): no ``torch`` and no ``transformers``. A hub id
goes through ``transformers``' config and tokenizer loaders (its cache, or the hub when online).

Example:
    >>> parts = load_parts("tests/assets/tiny_bert", max_length=None)  # doctest: +SKIP
    >>> parts.dim, parts.max_length, parts.model2vec  # doctest: +SKIP
    (32, 128, False)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowsearch.encode.model_files import (
    MAX_LENGTH_CAP,
    ModelSource,
    declared_max_length,
    hub_config,
    local_config,
    locate,
    position_limit,
    read_json_object,
    revision,
)
from flowsearch.encode.static import StaticTable, is_model2vec_dir
from flowsearch.encode.tokens import FastTokens, Tokens, load_tokens
from flowsearch.errors import BadInput, FlowsearchError, NotFound

__all__ = ["ModelParts", "load_parts", "loading_errors"]

# A Model2Vec config without ``max_length``: the length its tokenizer was distilled at.
_MODEL2VEC_MAX_LENGTH = 512


@dataclass
class ModelParts:
    r"""A model's files, read.

    Attributes:
        source: where the model is and its recorded name.
        config: its config as a dict (empty for Model2Vec).
        tokens: its tokenizer.
        dim: the vector size.
        max_length: tokens per text (checked against the model's limit).
        revision: content hash (local) or commit (hub).
        table: a Model2Vec directory's static table (``None`` for a transformer).
        options: keyword arguments for ``transformers``' ``from_pretrained``.
    """

    source: ModelSource
    config: dict[str, Any]
    tokens: Tokens
    dim: int
    max_length: int
    revision: str
    table: StaticTable | None
    options: dict[str, Any]

    @property
    def model2vec(self) -> bool:
        """Whether this is a Model2Vec static model (no transformer)."""
        return self.table is not None


@contextlib.contextmanager
def loading_errors(model_id: str) -> Iterator[None]:
    """Turns what loaders raise (``OSError``, ``ValueError``, ...) into one ``NotFound``
    naming the model; our own errors pass through."""
    try:
        yield
    except FlowsearchError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NotFound(
            f"cannot load model {model_id!r} ({first})",
            "pass a local directory with its weights or an id already in the Hugging Face cache",
            param="model",
        ) from exc


def load_parts(
    model: str | os.PathLike[str] | None,
    max_length: int | None,
    *,
    trust_remote_code: bool = False,
) -> ModelParts:
    r"""Reads a model's config, tokenizer, limits and revision.

    Arguments:
        model: a hub id, a local directory, or ``None`` for the bundled model.
        max_length: tokens per text; ``None`` takes the model's own limit (a
            sentence-transformers directory's ``max_seq_length``, else the tokenizer's or the
            position embeddings'), capped at :data:`~flowsearch.encode.model_files.MAX_LENGTH_CAP`.
        trust_remote_code: passed to ``transformers`` loaders.

    Raises:
        NotFound: no such directory, or a model that cannot be read.
        BadInput: ``max_length`` above what the model can read.
    """
    source = locate(model)
    options: dict[str, Any] = {}
    if source.local:
        options["local_files_only"] = True
    if trust_remote_code:
        options["trust_remote_code"] = True
    if source.root is not None and is_model2vec_dir(source.root):
        return _model2vec_parts(source, source.root, max_length, options)
    with loading_errors(source.model_id):
        if source.local:
            config = local_config(Path(source.path), options)
        else:
            config = hub_config(source.path, options)
        tokens = load_tokens(source.path, source.local, options)
        limit = position_limit(config, tokens.model_max_length)
        if max_length is not None and max_length > limit:
            raise BadInput(
                f"max_length {max_length} exceeds what {source.model_id!r} can read "
                f"({limit} tokens)",
                f"pass {{max_length={limit}}} or less",
                param="max_length",
            )
        if source.root is not None:
            declared = declared_max_length(source.root, Path(source.path))
            version = revision(Path(source.path))
        else:
            declared, version = None, str(config.get("_commit_hash") or "unknown")
        default = min(declared or limit, MAX_LENGTH_CAP, limit)
        dim = int(config["hidden_size"])
    return ModelParts(source, config, tokens, dim, max_length or default, version, None, options)


def _model2vec_parts(
    source: ModelSource, root: Path, max_length: int | None, options: dict[str, Any]
) -> ModelParts:
    """A Model2Vec ``StaticModel`` directory: its table and tokenizer, no transformer."""
    with loading_errors(source.model_id):
        table = StaticTable.from_model2vec(root)
        tokens = FastTokens.from_dir(root)
        if tokens is None:
            raise NotFound(f"the Model2Vec directory {root} has no tokenizer.json", param="model")
        declared = read_json_object(root / "config.json").get("max_length")
    length = max_length or (declared if isinstance(declared, int) else _MODEL2VEC_MAX_LENGTH)
    return ModelParts(source, {}, tokens, table.dim, length, revision(root), table, options)
