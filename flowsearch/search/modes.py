r"""The search modes, named once: the encoder's side, BM25's side, or both fused.

Example:
    >>> MODES
    ('dense', 'lexical', 'hybrid')
    >>> as_mode("hybrid"), as_mode(None)
    ('hybrid', None)
"""

from __future__ import annotations

from typing import Literal

from flowsearch.errors import BadInput

__all__ = ["MODES", "Mode", "as_mode"]

#: A search mode: ``dense`` (the encoder), ``lexical`` (BM25) or ``hybrid`` (both, fused).
Mode = Literal["dense", "lexical", "hybrid"]
#: Every :data:`Mode`, in the order the help lists them.
MODES: tuple[Mode, ...] = ("dense", "lexical", "hybrid")


def as_mode(name: str | None) -> Mode | None:
    """``name`` as a :data:`Mode` (None stays None: the index's default).

    Raises:
        BadInput: a name that is not a mode.
    """
    if name is None:
        return None
    for mode in MODES:
        if name == mode:
            return mode
    raise BadInput(f"unknown mode {name!r}", f"choose one of {', '.join(MODES)}", param="mode")
