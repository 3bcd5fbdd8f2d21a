"""The RAG frameworks' retrievers (flowsearch/integrations): the real LangChain and LlamaIndex
classes, their documents and nodes carrying the hits, and ``import flowsearch`` without them."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from corpus_helpers import sentences, write_corpus

# imported, not skipped when missing: the `dev` extra installs the `langchain` and `llamaindex`
# extras, so CI tests the retrievers against the real classes or fails saying what is missing
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever as LangChainRetriever
from llama_index.core.retrievers import BaseRetriever as LlamaRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode

from flowsearch.integrations import langchain, llamaindex
from flowsearch.search.searcher import Searcher
from flowsearch.writes.build import build_index

QUERY = "the red cat runs"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("integrations")
    corpus = write_corpus(root / "c.parquet", n=40, seed=8)
    build_index(corpus, root / "idx", model=str(model_dir))
    return root / "idx"


@pytest.fixture(scope="module")
def searcher(index_dir):
    s = Searcher.open(index_dir)
    yield s
    s.close()


def test_langchain_invoke_gives_documents_with_the_hits(index_dir, searcher):
    retriever = langchain.FlowsearchRetriever(index=str(index_dir), k=4)
    assert isinstance(retriever, LangChainRetriever)
    docs = retriever.invoke(QUERY)
    hits = searcher.search(QUERY, k=4)
    assert len(docs) == 4 and all(isinstance(d, Document) for d in docs)
    assert [d.metadata["id"] for d in docs] == [h.id for h in hits]
    assert [d.page_content for d in docs] == [h.text for h in hits]
    first = docs[0].metadata
    assert first["score"] == pytest.approx(hits[0].score) and first["rank"] == 1
    assert first["topic"] == hits[0].metadata["topic"] and first["year"] == hits[0].metadata["year"]
    assert "highlight" in first and first["highlight"] is None  # short texts: read whole


def test_langchain_fields_batch_and_async(index_dir, searcher):
    retriever = langchain.FlowsearchRetriever(
        index=index_dir, k=3, where="topic = 'cat'", mode="dense"
    )
    batch = retriever.batch([QUERY, "the blue sea"])
    assert [len(docs) for docs in batch] == [3, 3]
    assert all(d.metadata["topic"] == "cat" for docs in batch for d in docs)
    assert all(d.metadata["lexical_score"] is None for docs in batch for d in docs)  # dense
    expected = searcher.search(QUERY, k=3, where="topic = 'cat'", mode="dense")
    assert [d.metadata["id"] for d in batch[0]] == [h.id for h in expected]
    again = asyncio.run(retriever.ainvoke(QUERY))
    assert [d.metadata["id"] for d in again] == [h.id for h in expected]
    shared = langchain.FlowsearchRetriever(index=searcher, k=2)  # an open searcher, as it is
    assert [d.metadata["id"] for d in shared.invoke(QUERY)] == [
        h.id for h in searcher.search(QUERY, k=2)
    ]


def test_langchain_refusals(index_dir, tmp_path):
    from pydantic import ValidationError

    from flowsearch.errors import BadInput, NotFound

    with pytest.raises(ValidationError):
        langchain.FlowsearchRetriever(index=index_dir, k=0)
    with pytest.raises(BadInput, match="where"):
        langchain.FlowsearchRetriever(index=index_dir, where="nope = 1").invoke(QUERY)
    with pytest.raises(NotFound):
        langchain.FlowsearchRetriever(index=tmp_path / "none").invoke(QUERY)


def test_llamaindex_retrieve_gives_nodes_with_scores(index_dir, searcher):
    retriever = llamaindex.FlowsearchRetriever(index_dir, k=4)
    assert isinstance(retriever, LlamaRetriever)
    nodes = retriever.retrieve(QUERY)
    hits = searcher.search(QUERY, k=4)
    assert len(nodes) == 4 and all(isinstance(n, NodeWithScore) for n in nodes)
    assert all(isinstance(n.node, TextNode) for n in nodes)
    assert [n.node.node_id for n in nodes] == [str(h.id) for h in hits]
    assert [n.score for n in nodes] == pytest.approx([h.score for h in hits])
    node = nodes[0].node
    assert node.get_content() == hits[0].text and node.metadata["id"] == hits[0].id
    assert node.metadata["topic"] == hits[0].metadata["topic"]
    # the LLM sees the document's metadata columns, not the search's figures
    shown = node.get_content(metadata_mode=MetadataMode.LLM)
    assert "topic: " in shown and "score: " not in shown
    again = asyncio.run(retriever.aretrieve(QUERY))
    assert [n.node.node_id for n in again] == [n.node.node_id for n in nodes]
    filtered = llamaindex.FlowsearchRetriever(searcher, k=2, where="year >= 2010").retrieve(QUERY)
    assert len(filtered) == 2 and all(n.node.metadata["year"] >= 2010 for n in filtered)


def test_llamaindex_refuses_a_bad_k(index_dir):
    from flowsearch.errors import BadInput

    with pytest.raises(BadInput, match="k must be"):
        llamaindex.FlowsearchRetriever(index_dir, k=0)


def test_importing_flowsearch_imports_no_framework():
    code = (
        "import sys, flowsearch, flowsearch.search.searcher, flowsearch.integrations.hits; "
        "print([m for m in ('langchain_core', 'llama_index') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_retriever_with_a_reranker(index_dir, tiny_cross_encoder_dir):
    retriever = langchain.FlowsearchRetriever(index=index_dir, k=3,
                                              reranker=str(tiny_cross_encoder_dir))  # fmt: skip
    docs = retriever.invoke(QUERY)
    assert len(docs) == 3 and all(d.metadata["rerank_score"] is not None for d in docs)
    scores = [d.metadata["rerank_score"] for d in docs]
    assert scores == sorted(scores, reverse=True)


def test_a_long_documents_best_passage_is_carried(tmp_path, model_dir):
    """A document cut into passages: LangChain's metadata holds its best passage (the
    highlight), LlamaIndex's node marks it with ``start_char_idx``/``end_char_idx``."""
    texts = [" ".join(s + "." for s in sentences(6, seed=90 + i, length=(3, 7))) for i in range(4)]
    records = [{"id": f"L{i}", "text": t, "part": i} for i, t in enumerate(texts)]
    build_index(records, tmp_path / "idx", model=str(model_dir), max_length=16,
                calibration="none")  # fmt: skip
    query = texts[1].split(".")[3].strip()
    with_passages = Searcher.open(tmp_path / "idx")
    try:
        hits = with_passages.search(query, k=2, mode="dense")
        docs = langchain.FlowsearchRetriever(index=with_passages, k=2, mode="dense").invoke(query)
        nodes = llamaindex.FlowsearchRetriever(with_passages, k=2, mode="dense").retrieve(query)
    finally:
        with_passages.close()
    assert all(h.highlight is not None and h.highlight.text != h.text for h in hits)
    for hit, doc, node in zip(hits, docs, nodes, strict=True):
        passage = hit.highlight
        assert doc.page_content == hit.text and doc.metadata["part"] == hit.metadata["part"]
        assert doc.metadata["highlight"] == {"start": passage.start, "end": passage.end,
                                             "text": passage.text}  # fmt: skip
        assert (node.node.start_char_idx, node.node.end_char_idx) == (passage.start, passage.end)
        assert node.node.get_content()[passage.start : passage.end] == passage.text
