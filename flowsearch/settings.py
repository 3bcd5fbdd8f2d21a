r"""Where the fourth release's process-wide settings went.

Until the fifth release every tuning constant was a field of one process-wide ``Settings``,
changed for a block with ``override()``. Nothing process-wide changes at run time now: the knobs
a user turns are objects handed to whoever uses them, and the rest are constants beside their one
owner. ``override()`` and ``current()`` remain only to say so in one line.

Example:
    >>> from flowsearch.settings import moved_to
    >>> moved_to("flat_max_rows")
    'flowsearch.AnnPolicy(flat_max_rows=...), given as build_index/upsert/compact(..., ann=...)'
"""

from __future__ import annotations

import warnings
from typing import NoReturn

from flowsearch.errors import BadInput

__all__ = ["current", "moved_to", "override"]

_ANN = "flowsearch.AnnPolicy({}=...), given as build_index/upsert/compact(..., ann=...)"
_MERGE = "flowsearch.MergePolicy({}=...), given as upsert/add_to_index/compact(..., merge=...)"
_SEARCH = "flowsearch.SearchOptions({}=...), given as Searcher.open(..., options=...)"

#: The fields a user turned, and their new owner (every other field is a constant now).
_HOMES: dict[str, str] = {
    **{name: _ANN.format(name) for name in (
        "flat_max_rows", "graph_factory", "graph_max_rows", "target_recall", "max_ef_search")},
    "hnsw_ef_construction": _ANN.format("ef_construction"),
    **{name: _MERGE.format(name) for name in (
        "segments_per_tier", "merge_factor", "floor_segment_rows", "write_merge_max_rows",
        "flat_segments_max")},
    **{name: _SEARCH.format(name) for name in (
        "segment_threads", "hybrid_candidates", "row_cache_bytes", "lexical_cache_bytes",
        "filter_timeout", "filter_memory_bytes", "shard_timeout")},
}  # fmt: skip


def moved_to(name: str) -> str:
    """Where the fourth release's setting ``name`` lives now, in words."""
    return _HOMES.get(name, "a constant beside its one owner (no longer a setting)")


def _refuse(changes: dict[str, object]) -> NoReturn:
    where = "; ".join(f"{name}: {moved_to(name)}" for name in sorted(changes)) or "see the docs"
    raise BadInput(
        "flowsearch.settings was removed in the fifth release: nothing process-wide changes "
        "at run time any more",
        f"pass the option where it is used ({where})",
    )


def override(**changes: object) -> NoReturn:
    """Refuses, naming each setting's new home (the fourth release changed them here)."""
    warnings.warn("flowsearch.settings.override is gone", DeprecationWarning, stacklevel=2)
    _refuse(changes)


def current() -> NoReturn:
    """Refuses: there are no process-wide settings to read."""
    warnings.warn("flowsearch.settings.current is gone", DeprecationWarning, stacklevel=2)
    _refuse({})
