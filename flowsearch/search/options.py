r"""A searcher's knobs: :class:`SearchOptions`, given to ``Searcher.open(..., options=...)``.

Each field is a trade a user of a searcher may want to make differently (memory against
speed, a deadline against an answer); everything else the search decides is a constant beside
its owner. A searcher holds its options for its lifetime, so two searchers with different
options live side by side in one process.

Example:
    >>> SearchOptions(segment_threads=1).hybrid_candidates
    100
    >>> SearchOptions(hybrid_candidates=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    flowsearch.errors.BadInput: hybrid_candidates must be an integer >= 1, got 0; ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flowsearch.errors import BadInput

__all__ = ["SearchOptions"]


@dataclass(frozen=True)
class SearchOptions:
    """How a :class:`~flowsearch.search.searcher.Searcher` spends threads, memory and time.

    Raises:
        BadInput: a field outside its range (named with the fix).
    """

    #: Threads searching one query's segments (its own and idle helpers): more answers a query
    #: of many segments sooner, for more CPU per query; 1: in turn; 0: the usable cores, at most 4.
    segment_threads: int = 0
    #: Candidates each side gives hybrid fusion (at least k): more finds rows one side ranks
    #: low, for more scoring per query.
    hybrid_candidates: int = 100
    #: The hybrid's dense weight in [0, 1] (None: the default, which falls with an index's
    #: passages per document: :func:`flowsearch.search.fusion.default_weight`): a corpus of
    #: one's own can be measured at another weight (``flowsearch eval retrieval --weight``).
    hybrid_weight: float | None = None
    #: Bytes of decoded row groups kept to join hits to their rows: more makes repeated joins
    #: cheaper, for memory.
    row_cache_bytes: int = 128 * 2**20
    #: Bytes of weighed postings BM25 keeps for recent query terms (0: none): more skips
    #: re-weighing a term met again, for memory.
    lexical_cache_bytes: int = 64 * 2**20
    #: Seconds a ``where`` filter may run before it is stopped: longer lets costly predicates
    #: finish, for a slower refusal of a runaway one.
    filter_timeout: float = 10.0
    #: Bytes the filter database (DuckDB) may hold: more admits larger metadata and heavier
    #: predicates, for memory.
    filter_memory_bytes: int = 2 * 2**30
    #: Seconds a searcher on Ray shards waits for every shard's answer: longer survives slow
    #: restarts, for a later ``Unavailable`` when a shard is truly gone.
    shard_timeout: float = 60.0

    def __post_init__(self) -> None:
        _at_least("segment_threads", self.segment_threads, 0)
        _at_least("hybrid_candidates", self.hybrid_candidates, 1)
        _weight_or_none(self.hybrid_weight)
        _at_least("row_cache_bytes", self.row_cache_bytes, 0)
        _at_least("lexical_cache_bytes", self.lexical_cache_bytes, 0)
        _at_least("filter_memory_bytes", self.filter_memory_bytes, 2**20)
        _positive_seconds("filter_timeout", self.filter_timeout)
        _positive_seconds("shard_timeout", self.shard_timeout)


def _at_least(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadInput(f"{name} must be an integer >= {low}, got {value!r}",
                       f"give SearchOptions({name}=...) a whole number from {low}",
                       param=name)  # fmt: skip


def _weight_or_none(value: object) -> None:
    if value is None:
        return
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok or not 0.0 <= float(value) <= 1.0:  # type: ignore[arg-type]
        raise BadInput(f"hybrid_weight must be a number in [0, 1] or None, got {value!r}",
                       "give SearchOptions(hybrid_weight=...) e.g. 0.5, or leave it None",
                       param="hybrid_weight")  # fmt: skip


def _positive_seconds(name: str, value: object) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
        raise BadInput(f"{name} must be a number of seconds > 0, got {value!r}",
                       f"give SearchOptions({name}=...) a positive number, e.g. 10",
                       param=name)  # fmt: skip
