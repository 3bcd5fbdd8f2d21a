r"""A LangChain retriever over a flowsearch index (extra ``langchain``: langchain-core).

:class:`FlowsearchRetriever` is a langchain-core ``BaseRetriever``: ``invoke(query)`` returns
a list of ``Document`` (the hit's text as ``page_content``; as ``metadata``, the document's
metadata columns with its ``id``, ``score``, ``rank``, ``highlight`` and the raw scores), and
``batch``, ``ainvoke`` and the rest of the Runnable interface come from LangChain's defaults.
The index is opened at the first query and kept.

Example:
    >>> from flowsearch.integrations.langchain import FlowsearchRetriever
    >>> docs = FlowsearchRetriever(index="idx", k=4).invoke("a query")  # doctest: +SKIP
    >>> docs[0].metadata["score"]  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowsearch.errors import MissingExtra

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise MissingExtra(
        f"the LangChain retriever needs langchain-core ({exc.name} is missing)",
        "install it: pip install 'flowsearch[langchain]'",
    ) from None
from pydantic import ConfigDict, Field, PrivateAttr

from flowsearch.integrations.hits import OpenOnUse, hit_metadata
from flowsearch.search.modes import Mode
from flowsearch.search.searcher import Searcher

__all__ = ["FlowsearchRetriever"]


class FlowsearchRetriever(BaseRetriever):
    """Documents from a flowsearch index, best first.

    Attributes:
        index: the index directory (or an open :class:`Searcher`, shared as it is).
        k: documents per query.
        where: a SQL predicate over the metadata columns (a pre-filter), or None.
        mode: ``dense``, ``lexical`` or ``hybrid``; None: the index's default.
        reranker: a cross-encoder (id or directory) reranking the hits, or None.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    index: str | Path | Searcher
    k: int = Field(default=4, ge=1)
    where: str | None = None
    mode: Mode | None = None
    reranker: str | None = None
    _searcher: OpenOnUse = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._searcher = OpenOnUse(self.index, self.reranker)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        hits = self._searcher.search(query, self.k, self.where, self.mode)
        return [Document(page_content=h.text, metadata=hit_metadata(h)) for h in hits]
