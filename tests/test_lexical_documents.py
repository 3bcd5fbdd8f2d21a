"""BM25 scores a long document whole: its passages' index answers as an index of whole
documents does (the same documents, the same order, the same scores), through every write."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import sentences

from flowsearch.errors import BadInput, IndexDamaged
from flowsearch.lexical.bm25 import Bm25
from flowsearch.lexical.postings import Postings
from flowsearch.search.searcher import Searcher
from flowsearch.storage.manifest import read as read_manifest
from flowsearch.writes.build import build_index
from flowsearch.writes.compact import compact
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import upsert

MAX_LENGTH = 16  # a window of 14 tokens: a few sentences make a long document


def _passages(docs: list[list[str]]) -> tuple[list[str], list[tuple[int, int, int, int]]]:
    """Rows of documents given as their passages (no overlap), with their passage columns."""
    texts, columns = [], []
    for doc in docs:
        start = 0
        for p, text in enumerate(doc):
            texts.append(text)
            columns.append((p, len(doc), start, start + len(text)))
            start += len(text)
    return texts, columns


def test_postings_of_documents_hold_each_document_whole_on_its_first_row():
    docs = [["tides rise ", "twice a day"], ["heat pumps move heat"], ["moon ", "and ", "tides"]]
    texts, columns = _passages(docs)
    p = Postings.of_documents(texts, columns)
    whole = Postings.build(["".join(d) for d in docs])
    assert p.leads.tolist() == [0, 1, 0, 0, 1, 2]
    assert p.lengths.tolist() == [whole.lengths[0], 0, whole.lengths[1], whole.lengths[2], 0, 0]
    assert p.n_documents == 3 and p.vocab == whole.vocab
    assert p.postings_of("tide") == ([0, 3], [1, 1])
    bm25, ref = Bm25([(p, None)]), Bm25([(whole, None)])
    assert bm25.n_live == 3 and bm25.avg_length == ref.avg_length
    scores, rows = bm25.search("tides twice", k=10)
    ref_scores, ref_rows = ref.search("tides twice", k=10)
    lead = np.array([0, 2, 3])
    assert rows.tolist() == [lead[ref_rows[0]].tolist()]
    np.testing.assert_array_equal(scores, ref_scores)
    # every passage of a document scores its document
    all_rows = np.arange(6)
    np.testing.assert_array_equal(
        bm25.score_rows("tides twice", all_rows),
        ref.score_rows("tides twice", [0, 0, 1, 2, 2, 2]),
    )
    (_, _), of_rows = bm25.search_and_score(["tides twice"], 5, all_rows[None, :])
    np.testing.assert_array_equal(of_rows[0], bm25.score_rows("tides twice", all_rows))


def test_deleting_a_document_drops_it_from_n_and_merging_keeps_the_leads():
    docs = [["tides rise ", "daily"], ["heat pumps"], ["moon ", "stars ", "sky"]]
    p = Postings.of_documents(*_passages(docs))
    dead = np.array([True, True, False, False, False, False])
    assert p.live_stats(dead) == (2, 2 + 3)  # "heat pumps" and "moon stars sky"
    merged = Postings.merge([(p, ~dead), (Postings.build(["tides heat"]), None)])
    assert merged.leads.tolist() == [0, 0, 1, 2, 0]
    assert merged.n_documents == 3
    rebuilt = Postings.of_documents(*_passages([["heat pumps"], ["moon ", "stars ", "sky"],
                                                ["tides heat"]]))  # fmt: skip
    for name in ("indptr", "rows", "tf", "lengths", "leads"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(rebuilt, name))


def test_leads_are_saved_as_format_3_and_checked_on_load(tmp_path):
    p = Postings.of_documents(*_passages([["tides rise ", "twice a day"], ["heat"]]))
    p.save(tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    assert config["format_version"] == 3
    q = Postings.load(tmp_path / "p")
    assert q.leads.tolist() == [0, 1, 0]
    Postings.build(["no passages here"]).save(tmp_path / "plain")
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["format_version"] == 2
    assert Postings.load(tmp_path / "plain").leads is None
    np.save(tmp_path / "p" / "leads.npy", np.array([0, 2, 0], np.int32))  # points before row 0
    with pytest.raises(IndexDamaged, match="lead"):
        Postings.load(tmp_path / "p")
    (tmp_path / "p" / "leads.npy").unlink()
    with pytest.raises(IndexDamaged, match="no leads.npy"):
        Postings.load(tmp_path / "p")


def test_passages_must_come_whole_and_in_order():
    with pytest.raises(BadInput, match="not consecutive"):
        Postings.of_documents(["a", "b"], [(0, 2, 0, 1), (0, 1, 0, 1)])
    with pytest.raises(BadInput, match="end inside"):
        Postings.of_documents(["a"], [(0, 2, 0, 1)])
    with pytest.raises(BadInput, match="holds terms"):
        Postings.build(["a b", "c"], leads=[0, 1])


# --- through the index ---------------------------------------------------------------------


def _records(offset: int = 0) -> list[dict]:
    out = []
    for i in range(14):
        n = 6 if i % 3 else 1
        text = " ".join(s + "." for s in sentences(n, seed=300 + offset + i, length=(3, 7)))
        out.append({"id": f"d{offset + i}", "text": text})
    return out


def _queries() -> list[str]:
    """Words of the corpus: a late sentence of a long document, and pieces of others."""
    records = _records()
    words = [r["text"].split() for r in records]
    return [" ".join(words[1][-6:]), " ".join(words[2][:3] + words[4][-3:]), words[5][7],
            " ".join(words[0])]  # fmt: skip


def _lexical(index: Path, k: int = 8) -> list[list[tuple]]:
    queries = _queries()
    s = Searcher.open(index)
    try:
        hits = s.search(queries, k=k, mode="lexical")
    finally:
        s.close()
    return [[(h.id, round(h.lexical_score, 5)) for h in per] for per in hits]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, model_dir: Path) -> tuple[Path, Path]:
    """The same corpus as passages (the default) and as whole documents."""
    root = tmp_path_factory.mktemp("lexdocs")
    pq.write_table(pa.Table.from_pylist(_records()), root / "c.parquet")
    common = {"model": str(model_dir), "max_length": MAX_LENGTH}
    build_index(root / "c.parquet", root / "cut", **common)
    build_index(root / "c.parquet", root / "whole", passage_tokens=0, **common)
    return root / "cut", root / "whole"


def test_lexical_search_over_passages_equals_whole_document_bm25(pair):
    cut, whole = pair
    info = Searcher.open(cut).info()
    assert info.manifest.n_live > info.n_documents  # some documents are several rows
    got = _lexical(cut)
    assert got == _lexical(whole)
    assert all(per for per in got)


def test_writes_keep_documents_whole(tmp_path, pair, model_dir):
    cut, whole = pair
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(cut, a)
    shutil.copytree(whole, b)
    for index in (a, b):
        upsert(index, _records(offset=50)[:6])
        delete(index, ["d1", "d4"])
    assert _lexical(a) == _lexical(b)
    for index in (a, b):
        compact(index, full=True)
    assert _lexical(a) == _lexical(b)
    manifest = read_manifest(a)
    assert len(manifest.segments) == 1


def test_compacting_an_older_index_scores_its_documents_whole(tmp_path):
    """The fourth release's index (passage postings, format 2) answers as it was built, and
    its compaction rebuilds the postings from the texts: documents are then scored whole."""
    import shutil

    from flowsearch.ingest.passages import joined

    assets = Path(__file__).parent / "assets"
    index = Path(shutil.copytree(assets / "index_r4", tmp_path / "r4"))
    assert all(
        Postings.load(index / "segments" / seg.name / seg.postings).leads is None
        for seg in read_manifest(index).segments
    )
    compact(index, full=True)
    (seg,) = read_manifest(index).segments
    folder = index / "segments" / seg.name
    assert Postings.load(folder / seg.postings).leads is not None
    table = pa.concat_tables([pq.read_table(folder / part.path) for part in seg.parts])
    ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
    starts = table.column("__passage_start").to_pylist()
    ends = table.column("__passage_end").to_pylist()
    docs: dict[str, list[int]] = {}
    for row, doc in enumerate(ids):
        docs.setdefault(doc, []).append(row)
    names = list(docs)
    whole = [joined([texts[r] for r in rows], [starts[r] for r in rows], [ends[r] for r in rows])
             for rows in docs.values()]  # fmt: skip
    ref = Bm25([(Postings.build(whole), None)])
    s = Searcher.open(index)
    queries = [" ".join(whole[0].split()[-5:]), " ".join(whole[3].split()[:2]), whole[7].split()[4]]
    for query in queries:
        hits = s.search(query, k=5, mode="lexical")
        scores, rows = ref.search(query, k=5)
        assert hits and [h.id for h in hits] == [names[r] for r in rows[0] if r >= 0]
        np.testing.assert_allclose([h.lexical_score for h in hits], scores[0][: len(hits)],
                                   rtol=1e-6)  # fmt: skip
    s.close()


# --- the dense side: best passage and centroid ----------------------------------------------


def _expected_dense(index: Path, query: str) -> dict[str, float]:
    """Every document's dense score from its stored vectors: a long document's mean of its
    best passage's cosine and its centroid's, a whole document's cosine."""
    s = Searcher.open(index)
    try:
        Z = s.embed([query])[0][0].astype(np.float64)
        V = s.vectors().astype(np.float64)
    finally:
        s.close()
    (seg,) = read_manifest(index).segments
    table = pq.read_table(index / "segments" / seg.name / seg.parts[0].path)
    by_doc: dict[str, list[int]] = {}
    for row, doc in enumerate(table.column("id").to_pylist()):
        by_doc.setdefault(doc, []).append(row)
    out = {}
    for doc, rows in by_doc.items():
        cos = V[rows] @ Z
        if len(rows) == 1:
            out[doc] = float(cos[0])
            continue
        centroid = V[rows].sum(axis=0)
        out[doc] = float((cos.max() + centroid @ Z / np.linalg.norm(centroid)) / 2)
    return out


def test_a_long_document_scores_its_best_passage_and_centroid(pair):
    cut, _ = pair
    s = Searcher.open(cut)
    queries = _queries()
    try:
        hits = s.search(queries, k=14, mode="dense")
        hybrid = s.search(queries, k=14, mode="hybrid")
    finally:
        s.close()
    for query, per in zip(queries, hits, strict=True):
        want = _expected_dense(cut, query)
        got = {h.id: h.dense_score for h in per}
        assert len(got) == 14  # every document, each once
        np.testing.assert_allclose([got[d] for d in want], list(want.values()), atol=1e-5)
        order = sorted(want, key=lambda d: -want[d])
        assert [h.id for h in per][:5] == order[:5]
        long_ones = [h for h in per if h.highlight is not None]
        assert long_ones  # a long document's hit still shows its best passage
    for query, per, dense_hits in zip(queries, hybrid, hits, strict=True):
        want = _expected_dense(cut, query)
        assert {h.id for h in per} == set(want)
        best = {h.id: h.highlight for h in dense_hits}
        for h in per:  # a row's dense part: its document's at most (its best row's)
            assert h.dense_score <= want[h.id] + 1e-5
            if h.highlight is not None and h.lexical_score:  # the best passage, as dense shows
                assert h.highlight == best[h.id]
                assert h.dense_score == pytest.approx(want[h.id], abs=1e-5)


def test_the_query_report_reads_the_best_row_s_own_cosine(pair):
    """The verdict's reference was measured on nearest-row cosines: the report reads the best
    row's own cosine, not the document score a long document's rows are re-scored to."""
    cut, _ = pair
    s = Searcher.open(cut)
    try:
        for query in _queries():
            Z = s.embed([query])[0][0].astype(np.float64)
            best = float((s.vectors().astype(np.float64) @ Z).max())
            report = s.query(query, k=3, mode="dense").report
            assert report is not None and report.top_score == pytest.approx(best, abs=1e-5)
            hybrid = s.query(query, k=3, mode="hybrid").report
            assert hybrid is not None and hybrid.top_score == pytest.approx(best, abs=1e-5)
    finally:
        s.close()
