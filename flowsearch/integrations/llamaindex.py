r"""A LlamaIndex retriever over a flowsearch index (extra ``llamaindex``: llama-index-core).

:class:`FlowsearchRetriever` is a LlamaIndex ``BaseRetriever``: ``retrieve(query)`` returns a
list of ``NodeWithScore``, each a ``TextNode`` (id: the document's id as a string; text: the
document's; ``start_char_idx``/``end_char_idx``: its best passage when it was cut into
passages; metadata: its metadata columns, which an LLM and an embedder see, and the hit's id,
score, rank, highlight and raw scores, which they do not) with the hit's ``score``. The index is
opened at the first query and kept; ``aretrieve`` runs the same search (LlamaIndex's default).

Example:
    >>> from flowsearch.integrations.llamaindex import FlowsearchRetriever
    >>> nodes = FlowsearchRetriever("idx", k=4).retrieve("a query")  # doctest: +SKIP
"""

from __future__ import annotations

import os

from flowsearch.errors import BadInput, MissingExtra

try:
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingExtra(
        f"the LlamaIndex retriever needs llama-index-core ({exc.name} is missing)",
        "install it: pip install 'flowsearch[llamaindex]'",
    ) from None

from flowsearch.integrations.hits import HIT_KEYS, OpenOnUse, hit_metadata
from flowsearch.search.modes import Mode
from flowsearch.search.results import Hit
from flowsearch.search.searcher import Searcher

__all__ = ["FlowsearchRetriever"]


class FlowsearchRetriever(BaseRetriever):
    """Nodes from a flowsearch index, best first.

    Args:
        index: the index directory (or an open :class:`Searcher`, shared as it is).
        k: documents per query.
        where: a SQL predicate over the metadata columns (a pre-filter), or None.
        mode: ``dense``, ``lexical`` or ``hybrid``; None: the index's default.
        reranker: a cross-encoder (id or directory) reranking the hits, or None.
    """

    def __init__(
        self,
        index: str | os.PathLike[str] | Searcher,
        k: int = 4,
        where: str | None = None,
        mode: Mode | None = None,
        reranker: str | None = None,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise BadInput(f"k must be an integer >= 1, got {k!r}", param="k")
        super().__init__()
        self.k, self.where, self.mode = k, where, mode
        self._searcher = OpenOnUse(index, reranker)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = self._searcher.search(query_bundle.query_str, self.k, self.where, self.mode)
        return [NodeWithScore(node=_node(h), score=h.score) for h in hits]


def _node(hit: Hit) -> TextNode:
    passage = hit.highlight
    return TextNode(
        id_=str(hit.id),
        text=hit.text,
        metadata=hit_metadata(hit),
        excluded_embed_metadata_keys=list(HIT_KEYS),
        excluded_llm_metadata_keys=list(HIT_KEYS),
        start_char_idx=None if passage is None else passage.start,
        end_char_idx=None if passage is None else passage.end,
    )
