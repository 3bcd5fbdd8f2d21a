r"""Texts to token ids: the model's own tokenizer, read with the ``tokenizers`` library.

A local model directory with a ``tokenizer.json`` is read by :class:`FastTokens` straight from
that file, without importing ``transformers``: a query through the static table or the ONNX
runtime then never loads it. A hub id, or a directory without ``tokenizer.json``, goes through
``transformers.AutoTokenizer`` (:class:`HubTokens`). Both give the ids ``transformers`` gives for
``tokenizer(texts, truncation=True, max_length=n, add_special_tokens=...)``: truncation keeps the
first tokens and makes room for the special ones ([CLS], [SEP]) when they are added.

Example:
    >>> from pathlib import Path
    >>> tokens = FastTokens.from_dir(Path("tests/assets/tiny_bert"))  # doctest: +SKIP
    >>> tokens.ids(["the cat"], max_length=8)  # doctest: +SKIP
    [[2, 17, 56, 3]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from flowsearch.encode.model_files import read_json_object

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = ["FastTokens", "HubTokens", "Tokens", "load_tokens"]


class Tokens(Protocol):
    """What the encoder needs of a tokenizer."""

    #: The id padding positions carry (they are masked; the value never reaches a vector).
    pad_id: int
    #: The tokenizer's declared sequence limit (``model_max_length``), if it declares one.
    model_max_length: int | None

    def ids(self, texts: Sequence[str], max_length: int, special: bool = True) -> list[list[int]]:
        """Token ids per text, at most ``max_length`` each (special tokens included when
        ``special``), unpadded."""
        ...

    def num_special(self) -> int:
        """How many special tokens the tokenizer adds to one text ([CLS] and [SEP]: 2)."""
        ...

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Per text, each token's ``(start, end)`` character offsets into it (no special
        tokens, no truncation): what :mod:`flowsearch.ingest.passages` cuts passages on."""
        ...


class FastTokens:
    r"""A ``tokenizers.Tokenizer`` read from a ``tokenizer.json``.

    Arguments:
        tokenizer: the tokenizer; its own padding and truncation settings are switched off
            (each call sets the truncation it needs).
        pad_id: the padding id.
        model_max_length: the declared sequence limit, if any.
    """

    def __init__(self, tokenizer: Tokenizer, pad_id: int, model_max_length: int | None) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer
        self.pad_id = pad_id
        self.model_max_length = model_max_length

    @classmethod
    def from_dir(cls, model_dir: Path) -> FastTokens | None:
        """The tokenizer of a local model directory, or None when it has no ``tokenizer.json``.

        Its pad token and limit come from ``tokenizer_config.json`` (else
        ``special_tokens_map.json``), as ``transformers`` reads them.

        Raises:
            OSError, ValueError: a tokenizer file exists but cannot be read.
        """
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            return None
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        settings = _tokenizer_settings(model_dir)
        pad = _token_text(settings.get("pad_token"))
        pad_id = tokenizer.token_to_id(pad) if pad is not None else None
        limit = settings.get("model_max_length")
        return cls(
            tokenizer,
            pad_id=pad_id or 0,
            model_max_length=limit if isinstance(limit, int) else None,
        )

    def ids(self, texts: Sequence[str], max_length: int, special: bool = True) -> list[list[int]]:
        """Token ids per text (see :meth:`Tokens.ids`)."""
        # the limit counts the special tokens too; tokenizers makes room for them when adding
        self._tokenizer.enable_truncation(max_length)
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=special)
        return [e.ids for e in encoded]

    def num_special(self) -> int:
        """Special tokens added to one text."""
        self._tokenizer.no_truncation()
        return len(self._tokenizer.encode("", add_special_tokens=True).ids)

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Token character offsets per text (see :meth:`Tokens.offsets`)."""
        self._tokenizer.no_truncation()
        encoded = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [[(int(a), int(b)) for a, b in e.offsets] for e in encoded]


class HubTokens:
    r"""A ``transformers`` tokenizer (a hub id, or a directory without ``tokenizer.json``).

    Arguments:
        tokenizer: what ``transformers.AutoTokenizer.from_pretrained`` returned.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.pad_id = int(tokenizer.pad_token_id or 0)
        limit = getattr(tokenizer, "model_max_length", None)
        self.model_max_length = limit if isinstance(limit, int) else None

    @classmethod
    def load(cls, source: str, options: Mapping[str, Any]) -> HubTokens:
        """``AutoTokenizer.from_pretrained(source, **options)``.

        Raises:
            OSError, ValueError: ``transformers`` cannot find or read it.
        """
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(source, **options))

    def ids(self, texts: Sequence[str], max_length: int, special: bool = True) -> list[list[int]]:
        """Token ids per text (see :meth:`Tokens.ids`)."""
        encoded = self._tokenizer(
            list(texts),
            add_special_tokens=special,
            truncation=True,
            max_length=max_length,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        return cast(list[list[int]], encoded["input_ids"])

    def num_special(self) -> int:
        """Special tokens added to one text."""
        return int(self._tokenizer.num_special_tokens_to_add())

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Token character offsets per text (see :meth:`Tokens.offsets`).

        Raises:
            ValueError: a slow (Python) tokenizer, which has no offsets.
        """
        if not getattr(self._tokenizer, "is_fast", False):
            raise ValueError("this model's tokenizer has no character offsets (not a fast one)")
        encoded = self._tokenizer(
            list(texts),
            add_special_tokens=False,
            truncation=False,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            return_offsets_mapping=True,
        )
        return [[(int(a), int(b)) for a, b in row] for row in encoded["offset_mapping"]]


def load_tokens(source: str, local: bool, options: Mapping[str, Any]) -> Tokens:
    """The tokenizer of a model: :class:`FastTokens` for a local directory with a
    ``tokenizer.json``, else :class:`HubTokens`.

    Raises:
        OSError, ValueError: the tokenizer cannot be found or read.
    """
    if local:
        fast = FastTokens.from_dir(Path(source))
        if fast is not None:
            return fast
    return HubTokens.load(source, options)


def _tokenizer_settings(model_dir: Path) -> dict[str, Any]:
    """``tokenizer_config.json`` over ``special_tokens_map.json`` (either may be absent)."""
    settings: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = model_dir / name
        if path.is_file():
            settings.update(read_json_object(path))
    return settings


def _token_text(token: object) -> str | None:
    """A special token as configured: a string, or an ``{"content": ...}`` record."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return cast(str, token["content"])
    return None
