r"""Checking a search's arguments: the query or queries, k, the mode, min_score.

Example:
    >>> checked_k(3), checked_queries("tides")
    (3, ['tides'])
"""

from __future__ import annotations

import numpy as np

from flowsearch.errors import BadInput
from flowsearch.search.modes import Mode, as_mode
from flowsearch.search.version import Version

__all__ = ["checked_k", "checked_min_score", "checked_mode", "checked_queries"]


def checked_mode(version: Version, mode: str | None) -> Mode:
    checked = as_mode(mode)
    if checked is None:
        return "hybrid" if version.manifest.lexical is not None else "dense"
    if checked != "dense" and version.manifest.lexical is None:
        raise BadInput(
            f"mode {mode!r} needs a lexical index, and this index was built without one",
            "use {mode='dense'} or rebuild it with a lexical side",
            param="mode",
        )
    return checked


def checked_queries(query: object) -> list[str]:
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
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no encoder can read it
            raise BadInput(
                f"the query holds {q[exc.start]!r} at character {exc.start}, a lone surrogate "
                "that is not text",
                "pass valid Unicode (decode bytes with errors='replace')",
                param="query",
            ) from None
    return list(queries)


def checked_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise BadInput(f"k must be a positive integer, got {k!r}", param="k")
    return int(k)


def checked_min_score(min_score: object) -> float | None:
    """``min_score`` as a float in [0, 1] (the range of ``Hit.score``), or None.

    A cut outside the scores' range is a mistake (above 1 drops every hit, below 0 none; a
    percentage such as 20 is the usual slip), so it is refused rather than obeyed.
    """
    if min_score is None:
        return None
    if (
        isinstance(min_score, bool)
        or not isinstance(min_score, (int, float, np.integer, np.floating))
        or not np.isfinite(min_score)
    ):
        raise BadInput(f"min_score must be a number, got {min_score!r}", param="min_score")
    if not 0.0 <= min_score <= 1.0:
        raise BadInput(
            f"min_score {min_score!r} is outside [0, 1], the range of a hit's score",
            "give {min_score} a value from 0 to 1, e.g. 0.2",
            param="min_score",
        )
    return float(min_score)
