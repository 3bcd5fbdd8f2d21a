r"""What ``auto`` builds and how hard it tunes: :class:`AnnPolicy`, handed to the writes.

A write that builds segments (``build_index``, ``upsert``, ``add_to_index``, ``compact``,
``recalibrate``) takes ``ann=AnnPolicy(...)``; None means :data:`DEFAULT`. The policy decides,
per segment, which index ``auto`` stands for (:func:`flowsearch.ann.factory.auto_factory`), how
its graph is built (:func:`flowsearch.ann.factory.new_index`) and the recall its search knob is
tuned for (:func:`flowsearch.ann.tune.tune`). An explicit ``index_factory`` is built as given.

Example:
    >>> AnnPolicy(target_recall=0.99).flat_max_rows
    10000
    >>> AnnPolicy(target_recall=1.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    flowsearch.errors.BadInput: AnnPolicy.target_recall must be a number in (0, 1], got 1.5...
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from flowsearch.errors import BadInput

__all__ = ["DEFAULT", "AnnPolicy", "policy_or_default"]


def _whole(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BadInput(
            f"AnnPolicy.{name} must be an integer of at least {least}, got {value!r}",
            f"pass {name}= a whole number >= {least} (default {_default(name)})",
            param=name,
        )


def _default(name: str) -> object:
    return next(f.default for f in fields(AnnPolicy) if f.name == name)


@dataclass(frozen=True)
class AnnPolicy:
    """What ``auto`` builds per segment and the recall it tunes for (each field range-checked).

    Attributes:
        flat_max_rows: Largest segment searched exactly (``Flat``); raising it trades query
            speed on mid-sized segments for exact answers and no tuning.
        graph_factory: The graph ``auto`` builds above ``flat_max_rows``; more links per node
            (``HNSW48``) trade memory and build time for recall at a given search effort.
        graph_max_rows: Largest segment given a graph; above it IVF-PQ with an exact re-rank,
            which trades some query speed for far less memory per row.
        ef_construction: HNSW's build effort; higher builds slower graphs that reach the
            target recall at a smaller (faster) search knob.
        target_recall: Recall@10 against exact search the search knob is tuned for; higher
            trades query speed for answers closer to exact.
        max_ef_search: Largest HNSW ``efSearch`` the tuning tries whatever it costs; past it
            a segment still short of ``target_recall`` is searched deeper only while a query
            computes distances to at most a tenth of its rows
            (:data:`flowsearch.ann.tune.GRAPH_MAX_SCAN_SHARE`), and one that still misses the
            target is searched exactly (``Flat``, its graph's own vectors): ``auto`` keeps its
            recall promise at any size. Its build budget is the one graph per segment: it never
            builds a second structure (an exact index is a copy of the vectors).
    """

    flat_max_rows: int = 10_000
    graph_factory: str = "HNSW32"
    graph_max_rows: int = 2_000_000
    ef_construction: int = 80
    target_recall: float = 0.95
    max_ef_search: int = 1024

    def __post_init__(self) -> None:
        _whole("flat_max_rows", self.flat_max_rows, 0)
        _whole("graph_max_rows", self.graph_max_rows, 1)
        _whole("ef_construction", self.ef_construction, 1)
        _whole("max_ef_search", self.max_ef_search, 1)
        if self.graph_max_rows < self.flat_max_rows:
            raise BadInput(
                f"AnnPolicy.graph_max_rows ({self.graph_max_rows}) is below flat_max_rows "
                f"({self.flat_max_rows})",
                "pass graph_max_rows >= flat_max_rows",
                param="graph_max_rows",
            )
        factory = self.graph_factory
        if not isinstance(factory, str) or not factory.strip() or factory.strip() == "auto":
            raise BadInput(
                f"AnnPolicy.graph_factory must be a FAISS factory string, got {factory!r}",
                "pass e.g. graph_factory='HNSW32'",
                param="graph_factory",
            )
        recall = self.target_recall
        if isinstance(recall, bool) or not isinstance(recall, (int, float)) or not 0 < recall <= 1:
            raise BadInput(
                f"AnnPolicy.target_recall must be a number in (0, 1], got {recall!r}",
                "pass e.g. target_recall=0.95",
                param="target_recall",
            )


#: The policy a write uses when it is given none.
DEFAULT = AnnPolicy()


def policy_or_default(policy: AnnPolicy | None) -> AnnPolicy:
    """``policy``, or :data:`DEFAULT` for None; anything else is refused.

    Raises:
        BadInput: ``policy`` is not an :class:`AnnPolicy`.
    """
    if policy is None:
        return DEFAULT
    if not isinstance(policy, AnnPolicy):
        raise BadInput(
            f"ann must be an AnnPolicy, got {type(policy).__name__}",
            "pass ann=flowsearch.AnnPolicy(...) or leave it out",
            param="ann",
        )
    return policy
