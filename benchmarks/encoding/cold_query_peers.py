"""The peers of bench_cold_query.py: build an index of the sample corpus, or answer one query.

Run by a separate Python that has txtai and chromadb (never the project's virtualenv), with the
bundled model's directory as the embedding model (nothing is downloaded)::

    PEER build INDEX_DIR MODEL_DIR data/sample.jsonl
    PEER query INDEX_DIR MODEL_DIR "the query"       # prints the top 10 ids as a JSON list

PEER is ``txtai`` (``Embeddings(path=MODEL_DIR, content=True)``: sentence-transformers vectors,
FAISS, SQLite content) or ``chroma`` (a ``PersistentClient`` collection, cosine HNSW, with a
``SentenceTransformerEmbeddingFunction`` on MODEL_DIR: Chroma's default embedding function
would download an ONNX model).
"""

from __future__ import annotations

import json
import sys


def _records(path: str) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def txtai(action: str, index: str, model: str, arg: str) -> None:
    from txtai import Embeddings

    if action == "build":
        rows = _records(arg)
        embeddings = Embeddings(path=model, content=True)
        embeddings.index([(r["id"], r["text"], None) for r in rows])
        embeddings.save(index)
        return
    embeddings = Embeddings()
    embeddings.load(index)
    print(json.dumps([hit["id"] for hit in embeddings.search(arg, 10)]))


def chroma(action: str, index: str, model: str, arg: str) -> None:
    import chromadb
    from chromadb.config import Settings
    from chromadb.utils.embedding_functions import SentenceTransformerEmbeddingFunction

    client = chromadb.PersistentClient(path=index, settings=Settings(anonymized_telemetry=False))
    embed = SentenceTransformerEmbeddingFunction(model_name=model, device="cpu")
    if action == "build":
        rows = _records(arg)
        collection = client.get_or_create_collection(
            "sample", embedding_function=embed, metadata={"hnsw:space": "cosine"}
        )
        collection.add(ids=[r["id"] for r in rows], documents=[r["text"] for r in rows])
        return
    collection = client.get_collection("sample", embedding_function=embed)
    print(json.dumps(collection.query(query_texts=[arg], n_results=10)["ids"][0]))


if __name__ == "__main__":
    peer, action, index, model, arg = sys.argv[1:6]
    {"txtai": txtai, "chroma": chroma}[peer](action, index, model, arg)
