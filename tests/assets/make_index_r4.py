"""Writes ``index_r4`` and ``index_r4_hits.json``: an index as the fourth release (0.3.0, commit
c9d1930) built it, kept so that later releases prove they open it and answer the same.

It has what that release wrote and a later one must keep reading: a flow calibrator, long
documents cut into passages, a tuned HNSW segment beside a Flat one, deletions, BM25 postings,
the reference sample with a delta, and metadata columns. Run from the repository root with the
fourth release installed: ``python tests/assets/make_index_r4.py`` (it replaces both files).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from corpus_helpers import WORDS, sentences  # noqa: E402

MODEL = HERE / "tiny_bert"
INDEX = HERE / "index_r4"
QUERIES = ["the cat and the dog", "music song piano", "red house by the river", "old book page"]


def records(n: int, seed: int, prefix: str) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    texts = sentences(n, seed)
    out: list[dict[str, object]] = []
    for i, text in enumerate(texts):
        if i % 10 == 0:  # a long document: past the window, cut into passages
            text = " ".join([text, *sentences(24, seed + 1000 + i)])
        out.append(
            {"id": f"{prefix}{i}", "text": text, "topic": WORDS[i % 7],
             "year": int(1990 + rng.integers(0, 30))}
        )  # fmt: skip
    return out


def answers(searcher: Any) -> dict[str, list[list[object]]]:
    out: dict[str, list[list[object]]] = {}
    for query in QUERIES:
        for mode in ("dense", "lexical", "hybrid", "where"):
            where = "year >= 2000" if mode == "where" else None
            search_mode = "dense" if mode == "where" else mode
            hits = searcher.search(query, k=8, mode=search_mode, where=where)
            out[f"{mode}|{query}"] = [
                [h.id, h.score, h.dense_score, h.lexical_score,
                 None if h.highlight is None else [h.highlight.start, h.highlight.end]]
                for h in hits
            ]  # fmt: skip
    return out


def main() -> None:
    # imported here: the fourth release's names (``override`` is gone since), and so that
    # collecting this file for doctests imports nothing of the package
    from flowsearch import Searcher, build_index, delete, upsert
    from flowsearch.settings import override

    if INDEX.exists():
        shutil.rmtree(INDEX)
    with override(flat_max_rows=100):  # the build's segment gets a tuned graph
        build_index(records(200, 0, "d"), INDEX, model=MODEL, calibration="flow",
                    passage_tokens=16, passage_overlap=4)  # fmt: skip
        upsert(INDEX, records(30, 7, "d")[:10] + records(20, 9, "n")[:10], model=MODEL)
        delete(INDEX, ["d3", "d4", "d5"])
    searcher = Searcher.open(INDEX, verify=True)
    (HERE / "index_r4_hits.json").write_text(json.dumps(answers(searcher), indent=1) + "\n")
    print(searcher.info())


if __name__ == "__main__":
    main()
