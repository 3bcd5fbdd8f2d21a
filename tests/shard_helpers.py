"""An index of several segments, with deletions and upserts, and a check that two searchers
answer alike (ids in order, scores within a tolerance): for the shard tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from corpus_helpers import sentences, write_corpus

from flowsearch.search import shards as sh
from flowsearch.search.searcher import Searcher
from flowsearch.writes.build import build_index
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import add_to_index, upsert

QUERIES = [
    "the cat and the dog",
    "red car on the road",
    "music piano song",
    "old book page",
    "river water",
    "zzzq qwerty",
]
WHERES = [None, "year >= 2005", "topic = 'dog' OR year < 1995", "id = 'nothing'"]


def segmented(tmp: Path, model_dir: Path) -> Path:
    """Five segments (each small: Flat), two with deletions."""
    out = tmp / "idx"
    build_index(write_corpus(tmp / "c.parquet", n=90), out, model=str(model_dir),
                calibration="whitening")  # fmt: skip
    for i in range(4):
        corpus = write_corpus(tmp / f"a{i}.parquet", n=25, id_prefix=f"a{i}-", seed=i + 1)
        add_to_index(out, corpus, merge_segments=False)
    delete(out, ["d1", "d7", "a1-3", "a2-0"])
    return out


def write_again(index: Path, tmp: Path) -> None:
    """An upsert (rows changed in place: deletions in old segments, one new segment) and a
    delete."""
    ids = ["d3", "d40", "a0-5", "n1", "n2"]
    table = pa.table(
        {
            "id": ids,
            "text": sentences(len(ids), seed=9),
            "topic": ["dog"] * len(ids),
            "year": pa.array([2020] * len(ids), pa.int32()),
        }
    )
    pq.write_table(table, tmp / "u.parquet")
    upsert(index, tmp / "u.parquet", merge_segments=False)
    delete(index, ["d50", "a3-1"])


def assert_same(got: Any, want: Any, tol: float = 1e-5) -> None:
    """Two lists of hits (or of lists of hits): same ids in order, scores within ``tol``."""
    if want and isinstance(want[0], list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w, tol)
        return
    assert [h.id for h in got] == [h.id for h in want]
    for g, w in zip(got, want, strict=True):
        assert abs(g.score - w.score) <= tol, (g.id, g.score, w.score)
        for a, b in ((g.dense_score, w.dense_score), (g.lexical_score, w.lexical_score)):
            assert (a is None) == (b is None)
            if a is not None:
                assert abs(a - b) <= tol


def split_searcher(index_dir: Any, groups: list[list[int]]) -> Searcher:
    """A searcher whose version is answered by in-process shards holding ``groups``."""
    s = Searcher.open(index_dir)

    def shards(version: Any) -> sh.Shards:
        n = len(version.segments)
        kept = [[i for i in g if i < n] for g in groups]
        kept = [g for g in kept if g]
        rest = [i for i in range(n) if all(i not in g for g in kept)]
        return sh.split(version, kept + ([rest] if rest else []),
                        filters=s._backend.filter_database)  # type: ignore[attr-defined]  # fmt: skip

    s._shards = shards  # type: ignore[method-assign]
    return s
