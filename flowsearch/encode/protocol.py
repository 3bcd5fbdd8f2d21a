r"""What the rest of flowsearch calls on an encoder: :class:`TextEncoder`.

:class:`~flowsearch.encode.encoder.Encoder` implements it for every runtime (torch, ONNX, the
``static`` table); an application may hand in its own object of this shape (``upsert(...,
encoder=...)``, ``Searcher.open(..., encoder=...)``), and the index still refuses one whose
:meth:`~TextEncoder.describe` differs from what the index was built with.

Example:
    >>> from flowsearch.encode.protocol import TextEncoder
    >>> [name for name in ("encode", "describe") if hasattr(TextEncoder, name)]
    ['encode', 'describe']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

__all__ = ["TextEncoder"]


class TextEncoder(Protocol):
    """Texts to raw vectors, with what identifies those vectors.

    Attributes:
        model_id: the model's id or directory, as recorded in an index.
        revision: the model's content hash or hub revision.
        pooling: how token states become one vector (``mean``, ``cls``, ``static``, ...).
        max_length: tokens a text is read to, special tokens included.
        dim: the vectors' dimension.
    """

    model_id: str
    revision: str
    pooling: str
    max_length: int
    dim: int

    @property
    def window(self) -> int:
        """Tokens of one text the encoder reads (``max_length`` less its special tokens)."""
        ...

    def encode(
        self, texts: Sequence[str] | str, batch_size: int = 64, progress: bool | None = None
    ) -> np.ndarray:
        """float32 ``(len(texts), dim)`` vectors, rows in input order."""
        ...

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as ``(start, end)`` character offsets (where passages may cut)."""
        ...

    def describe(self) -> dict[str, object]:
        """What identifies this encoder's vectors (an index stores it; queries must match)."""
        ...
