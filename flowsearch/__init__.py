"""flowsearch: semantic search over a calibrated index (BERT-flow, Li et al. 2020).

The public names are imported lazily, so ``import flowsearch`` stays fast (no torch, no faiss)::

    from flowsearch import Encoder, Searcher, build_index, make_calibrator, load_calibrator
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flowsearch._version import __version__

__all__ = [
    "AnnPolicy",
    "Encoder",
    "FlowsearchError",
    "Hit",
    "MergePolicy",
    "QueryResult",
    "Searcher",
    "SearchOptions",
    "WriteResult",
    "__version__",
    "add_to_index",
    "build_index",
    "compact",
    "delete",
    "export_index",
    "index_history",
    "index_info",
    "load_calibrator",
    "make_calibrator",
    "recalibrate",
    "restore",
    "snapshot",
    "upsert",
]

_LAZY = {
    "AnnPolicy": "flowsearch.ann.policy",
    "Encoder": "flowsearch.encode.encoder",
    "FlowsearchError": "flowsearch.errors",
    "Hit": "flowsearch.search.results",
    "MergePolicy": "flowsearch.writes.merge",
    "QueryResult": "flowsearch.search.results",
    "Searcher": "flowsearch.search.searcher",
    "SearchOptions": "flowsearch.search.options",
    "WriteResult": "flowsearch.writes.results",
    "add_to_index": "flowsearch.writes.upsert",
    "build_index": "flowsearch.writes.build",
    "compact": "flowsearch.writes.compact",
    "delete": "flowsearch.writes.delete",
    "export_index": "flowsearch.writes.export",
    "index_history": "flowsearch.search.version",
    "index_info": "flowsearch.search.version",
    "load_calibrator": "flowsearch.calibration",
    "make_calibrator": "flowsearch.calibration",
    "recalibrate": "flowsearch.writes.compact",
    "restore": "flowsearch.storage.snapshot",
    "snapshot": "flowsearch.storage.snapshot",
    "upsert": "flowsearch.writes.upsert",
}

if TYPE_CHECKING:
    from flowsearch.ann.policy import AnnPolicy
    from flowsearch.calibration import load_calibrator, make_calibrator
    from flowsearch.encode.encoder import Encoder
    from flowsearch.errors import FlowsearchError
    from flowsearch.search.options import SearchOptions
    from flowsearch.search.results import Hit, QueryResult
    from flowsearch.search.searcher import Searcher
    from flowsearch.search.version import index_history, index_info
    from flowsearch.storage.snapshot import restore, snapshot
    from flowsearch.writes.build import build_index
    from flowsearch.writes.compact import compact, recalibrate
    from flowsearch.writes.delete import delete
    from flowsearch.writes.export import export_index
    from flowsearch.writes.merge import MergePolicy
    from flowsearch.writes.results import WriteResult
    from flowsearch.writes.upsert import add_to_index, upsert


def __getattr__(name: str) -> Any:
    if name == "Settings":  # the fourth release's process-wide settings
        raise AttributeError(
            "flowsearch.Settings was removed in the fifth release (nothing process-wide changes "
            "at run time): pass flowsearch.AnnPolicy, MergePolicy or SearchOptions where the "
            "setting is used; flowsearch.settings.moved_to(NAME) says where each went"
        )
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flowsearch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
