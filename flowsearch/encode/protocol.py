r"""What the rest of the package calls on an encoder: :class:`TextEncoder`.

:class:`~flowsearch.encode.encoder.Encoder` (every backend: torch, ONNX, the ``static`` table)
is the one implementation; the protocol is the seam the searched space, the writes, the
passage cut and the evaluators type against, so a test or an integration can hand them another
encoder without importing a model runtime.

Example:
    >>> from flowsearch.encode.encoder import Encoder
    >>> def width(encoder: TextEncoder) -> int:
    ...     return encoder.dim
    >>> width(Encoder(pooling="static"))  # doctest: +SKIP
    384
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["TextEncoder"]


@runtime_checkable
class TextEncoder(Protocol):
    """Texts to raw vectors, with what identifies those vectors.

    Attributes:
        model_id: the model's name as an index records it (hub id, directory, bundled id).
        pooling: the pooling name (``flowsearch.encode.options.POOLINGS``).
        dim: the vectors' dimension.
        max_length: tokens per text, special tokens included.
        revision: the model's content hash (local) or commit (hub).
    """

    @property
    def model_id(self) -> str: ...

    @property
    def pooling(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def revision(self) -> str: ...

    @property
    def window(self) -> int:
        """Tokens of one text the encoder reads; the rest never reaches its vector."""
        ...

    def encode(
        self, texts: Sequence[str] | str, batch_size: int = 64, progress: bool | None = None
    ) -> npt.NDArray[np.float32]:
        """float32 ``(len(texts), dim)`` raw vectors, rows in input order."""
        ...

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as ``(start, end)`` character offsets (no special tokens)."""
        ...

    def describe(self) -> dict[str, object]:
        """What identifies the vectors (an index stores it; queries must match)."""
        ...
