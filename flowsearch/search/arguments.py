r"""Checking a search's arguments: the query or queries, k, the mode.

Example:
    >>> checked_k(3), checked_queries("tides")
    (3, ['tides'])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flowsearch.errors import BadInput
from flowsearch.search.version import Version

__all__ = ["MODES", "checked_k", "checked_mode", "checked_queries"]

#: Search modes: the encoder's side, BM25's side, or both fused.
MODES = ("dense", "lexical", "hybrid")


def checked_mode(version: Version, mode: str | None) -> str:
    if mode is None:
        return "hybrid" if version.lexical is not None else "dense"
    if mode not in MODES:
        raise BadInput(f"unknown mode {mode!r}", f"choose one of {', '.join(MODES)}", param="mode")
    if mode != "dense" and version.lexical is None:
        raise BadInput(
            f"mode {mode!r} needs a lexical index, and this index was built without one",
            "use {mode='dense'} or rebuild it with a lexical side",
            param="mode",
        )
    return mode


def checked_queries(query: Any) -> list[str]:
    queries = [query] if isinstance(query, str) else query
    if not isinstance(queries, (list, tuple)):
        raise BadInput(
            f"query must be a string or a list of strings, got {type(query).__name__}",
            param="query",
        )
    for q in queries:
        if not isinstance(q, str):
            raise BadInput(f"queries must be strings, got {type(q).__name__}", param="query")
        if not q.strip():
            raise BadInput("the query is empty", "pass some text to search for", param="query")
    return list(queries)


def checked_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise BadInput(f"k must be a positive integer, got {k!r}", param="k")
    return int(k)
