"""Retrievers for the RAG frameworks, over a :class:`~flowsearch.search.searcher.Searcher`.

``langchain`` (extra ``langchain``): a langchain-core ``BaseRetriever``; ``llamaindex`` (extra
``llamaindex``): a LlamaIndex ``BaseRetriever``. Each imports its framework when imported
itself; ``import flowsearch`` imports neither. ``hits`` holds what they share: the searcher
opened on first use, and a hit's metadata as both frameworks carry it.
"""
