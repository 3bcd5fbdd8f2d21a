"""Long documents: cut into passages by the encoder's tokens; a hit is a document (best passage,
highlight); k counts documents; writes act on all of a document's passages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import sentences, write_corpus
from shard_helpers import assert_same, split_searcher
from typer.testing import CliRunner

from flowsearch.encode.encoder import Encoder
from flowsearch.errors import BadInput
from flowsearch.ingest.passages import PassageSizes, checked_sizes, joined, spans, split_texts
from flowsearch.search.searcher import Searcher
from flowsearch.search.version import index_info
from flowsearch.storage.passages import PASSAGE_COLUMNS
from flowsearch.writes.build import build_index
from flowsearch.writes.compact import compact
from flowsearch.writes.delete import delete
from flowsearch.writes.upsert import upsert

MAX_LENGTH = 16  # a window of 14 tokens: a few sentences make a long document


def _document(seed: int, n: int = 6) -> str:
    return " ".join(s + "." for s in sentences(n, seed=seed, length=(3, 7)))


@pytest.fixture(scope="module")
def encoder(model_dir: Path) -> Encoder:
    return Encoder(str(model_dir), max_length=MAX_LENGTH)


def _records() -> list[dict]:
    out = []
    for i in range(12):
        text = _document(100 + i) if i % 3 else sentences(1, seed=200 + i)[0]
        out.append({"id": f"d{i}", "text": text, "topic": "x" if i % 2 else "y", "year": 2000 + i})
    return out


@pytest.fixture(scope="module")
def long_index(tmp_path_factory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("passages")
    pq.write_table(pa.Table.from_pylist(_records()), root / "c.parquet")
    build_index(root / "c.parquet", root / "idx", model=str(model_dir), max_length=MAX_LENGTH)
    return root / "idx"


# --- cutting ------------------------------------------------------------------------------


def test_passages_map_back_to_the_text_with_overlap_at_sentence_ends(encoder):
    text = _document(1, n=10)
    sizes = checked_sizes(encoder.window, overlap=3)
    assert sizes == PassageSizes(tokens=14, overlap=3, window=14)
    cut = split_texts(encoder, [text], sizes)[0]
    assert len(cut) > 2
    starts, ends = [a for a, _ in cut], [b for _, b in cut]
    assert starts[0] == 0 and ends[-1] == len(text)
    assert all(b0 >= a1 for b0, a1 in zip(ends, starts[1:], strict=False))  # no gap
    assert joined([text[a:b] for a, b in cut], starts, ends) == text
    offsets = encoder.token_offsets([text])[0]
    for i, (a, b) in enumerate(cut):
        inside = [t for t in offsets if a <= t[0] and t[1] <= b]
        assert 0 < len(inside) <= 14  # at most the passage size, in the encoder's own tokens
        if i + 1 < len(cut):  # each passage but the last ends at a sentence's end
            assert text[a:b].rstrip().endswith(".")
        if i:  # shares at most `overlap` tokens with the one before
            shared = [t for t in inside if t[0] < ends[i - 1]]
            assert len(shared) <= 3
    assert any(a < ends[i] for i, a in enumerate(starts[1:]))  # some passages do overlap
    no_overlap = split_texts(encoder, [text], checked_sizes(encoder.window, 8, 0))[0]
    assert all(b == a for (_, b), (a, _) in zip(no_overlap, no_overlap[1:], strict=False))
    assert len(no_overlap) > len(cut) - 1


def test_a_text_within_the_window_is_one_passage_and_sizes_are_checked(encoder):
    short = "the cat runs. the dog eats."
    assert split_texts(encoder, [short, ""], checked_sizes(encoder.window))[0] == [(0, len(short))]
    assert split_texts(encoder, [_document(2)], None) == [[(0, len(_document(2)))]]
    # a word longer than a passage is cut inside it rather than never ending
    offsets = [(i, i + 1) for i in range(30)]
    cut = spans("x" * 30, offsets, PassageSizes(tokens=8, overlap=2, window=8))
    assert cut[0] == (0, 8) and cut[-1][1] == 30
    bad = [(1, None, "between 2"), (99, None, "between 2"), (8, 5, "half"), (8, -1, "half")]
    for tokens, overlap, match in [*bad, ("8", None, "integer")]:
        with pytest.raises(BadInput, match=match):
            checked_sizes(14, tokens, overlap)  # type: ignore[arg-type]


# --- documents as hits --------------------------------------------------------------------


def test_k_counts_documents_exactly(long_index):
    s = Searcher.open(long_index)
    n_docs = len(_records())
    assert s.manifest.n_live > n_docs  # passages
    for mode in ("dense", "lexical", "hybrid"):
        everything = s.search("the cat runs", k=1000, mode=mode)
        ids = [h.id for h in everything]
        assert len(ids) == len(set(ids))  # each document once
        assert len(ids) == n_docs or mode == "lexical"  # all (BM25: those with a query term)
        for k in (1, 3, min(7, len(ids))):
            hits = s.search("the cat runs", k=k, mode=mode)
            assert [h.rank for h in hits] == list(range(1, k + 1))
            assert [h.id for h in hits] == ids[:k]  # deeper searches agree: exact
            assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))


def test_shards_group_passages_as_one_searcher(tmp_path, long_index):
    """Documents cut into passages, spread over segments held by several shards (the seam Ray
    serving uses), give one searcher's documents, scores, highlights and whole texts."""
    import shutil

    index = tmp_path / "idx"
    shutil.copytree(long_index, index)
    more = [dict(r, id=f"m{i}") for i, r in enumerate(_records())]
    for i in range(2):
        pq.write_table(pa.Table.from_pylist(more[i * 6 : i * 6 + 6]), tmp_path / f"m{i}.parquet")
        upsert(index, tmp_path / f"m{i}.parquet", merge_segments=False)
    delete(index, ["d4", "m2"])
    one, split = Searcher.open(index), split_searcher(index, [[0, 2], [1]])
    assert len(one.version.segments) == 3
    for mode in ("dense", "lexical", "hybrid"):
        for k, where in ((1, None), (5, None), (30, "year >= 2004")):
            want = one.search(["the cat runs", "old river"], k=k, where=where, mode=mode)
            got = split.search(["the cat runs", "old river"], k=k, where=where, mode=mode)
            assert_same(got, want, 1e-9)
            for g, w in zip(sum(got, []), sum(want, []), strict=True):
                assert (g.text, g.highlight) == (w.text, w.highlight)
    assert any(h.highlight is not None for h in one.search("the cat runs", k=30))


def test_a_hit_is_its_best_passage_with_highlight_and_whole_text(long_index):
    s = Searcher.open(long_index)
    records = {r["id"]: r for r in _records()}
    doc = records["d4"]["text"]
    cut = split_texts(s.encoder, [doc], checked_sizes(s.encoder.window))[0]
    a, b = cut[1]
    passage = doc[a:b].strip()
    top = s.search(passage, k=3, mode="dense")[0]
    assert top.id == "d4" and top.text == doc
    # the mean of its own passage's cosine (1.0) and its document's centroid's
    assert 0.5 < top.dense_score < 1.0 - 1e-4
    assert top.highlight is not None and top.highlight.text == passage
    assert top.text[top.highlight.start : top.highlight.end] == passage
    assert top.metadata == {"topic": "y", "year": 2004}
    short = s.search(records["d0"]["text"], k=1, mode="dense")[0]
    assert short.id == "d0" and short.highlight is None  # read whole: no highlight
    assert json.loads(json.dumps(top.to_dict()))["highlight"]["text"] == passage


def test_where_filters_documents_on_their_metadata(long_index):
    s = Searcher.open(long_index)
    hits = s.search("the cat runs", k=4, where="topic = 'x'")
    assert len(hits) == 4 and len({h.id for h in hits}) == 4
    assert all(h.metadata["topic"] == "x" for h in hits)
    everything = s.search("the cat runs", k=100, where="year >= 2006")
    assert sorted(h.id for h in everything) == sorted(f"d{i}" for i in range(6, 12))


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _text_wheres(records: list[dict]) -> dict[str, set]:
    """Predicates on ``text`` that only a document's whole text answers (two of its ends, its
    length), each with the documents it matches."""
    out: dict[str, set] = {}
    for r in [r for r in records if len(r["text"]) >= 120][:2]:
        text = r["text"]
        head, tail = text[:15], text[-15:]
        both = f"text LIKE {_quoted('%' + head + '%')} AND text LIKE {_quoted('%' + tail + '%')}"
        out[both] = {x["id"] for x in records if head in x["text"] and tail in x["text"]}
        same = {x["id"] for x in records if len(x["text"]) == len(text)}
        out[f"length(text) = {len(text)}"] = same
        out[f"text = {_quoted(text)}"] = {r["id"]}
    out["length(text) > 100"] = {x["id"] for x in records if len(x["text"]) > 100}
    out["text NOT LIKE '%.%'"] = {x["id"] for x in records if "." not in x["text"]}
    return out


def _check_text_wheres(searchers: list, records: list[dict]) -> None:
    wheres = _text_wheres(records)
    assert len(wheres) > 4 and all(wheres.values())
    for s in searchers:
        everything = {h.id: h for h in s.search("the cat runs", k=100, mode="dense")}
        for where, want in wheres.items():
            for mode in ("dense", "lexical", "hybrid"):
                hits = s.search("the cat runs", k=100, where=where, mode=mode)
                got = {h.id for h in hits}
                assert got == want or (mode == "lexical" and got <= want), (where, mode)
                assert all(h.text == everything[h.id].text for h in hits)  # whole texts
                if mode == "dense":  # a document matches whole: its best passage as unfiltered
                    for h in hits:
                        assert h.highlight == everything[h.id].highlight
                        assert h.score == pytest.approx(everything[h.id].score)
            k = min(2, len(want))  # k counts documents under a text filter too
            assert len(s.search("the cat runs", k=k, where=where)) == k


def test_where_on_text_sees_each_document_s_whole_text(tmp_path, long_index):
    """A filter's record is the document: ``text`` is its whole text on every path (one
    searcher, shards, each mode), across writes (upsert, delete, compact)."""
    import shutil

    records = _records()
    _check_text_wheres([Searcher.open(long_index)], records)
    index = tmp_path / "idx"
    shutil.copytree(long_index, index)
    more = [{"id": "m0", "text": _document(300), "topic": "x", "year": 1},
            {"id": "d1", "text": _document(301), "topic": "y", "year": 2}]  # fmt: skip
    upsert(index, more, merge_segments=False)
    delete(index, ["d4"])
    records = [r for r in records if r["id"] not in ("d1", "d4")] + more
    one = Searcher.open(index)
    assert len(one.version.segments) == 2
    _check_text_wheres([one, split_searcher(index, [[1], [0]])], records)
    compact(index)
    _check_text_wheres([Searcher.open(index)], records)


def test_info_counts_documents_and_passages(long_index):
    info = index_info(long_index)
    assert info.n_documents == len(_records()) and info.manifest.n_live > info.n_documents
    doc = info.to_dict()
    assert doc["n_documents"] == 12 and doc["passages"] == {"tokens": 14, "overlap": 3,
                                                            "window": 14}  # fmt: skip


# --- writes -------------------------------------------------------------------------------


def test_upsert_and_delete_act_on_every_passage(tmp_path, model_dir):
    pq.write_table(pa.Table.from_pylist(_records()), tmp_path / "c.parquet")
    idx = tmp_path / "idx"
    build_index(tmp_path / "c.parquet", idx, model=str(model_dir), max_length=MAX_LENGTH)
    before = Searcher.open(idx).manifest.n_live
    old = _records()[5]["text"]
    result = upsert(idx, [{"id": "d5", "text": "the moon", "topic": "x", "year": 1}])
    assert result.n_replaced == 1 and result.n_inserted == 0
    s = Searcher.open(idx)
    n_old = len(split_texts(s.encoder, [old], checked_sizes(s.encoder.window))[0])
    assert s.manifest.n_live == before - n_old + 1
    hits = s.search(old, k=100)
    assert [h.text for h in hits if h.id == "d5"] == ["the moon"]
    # a short document made long again: all its new passages, none of the old
    longer = _document(999)
    upsert(idx, [{"id": "d5", "text": longer, "topic": "x", "year": 2}])
    s = Searcher.open(idx)
    found = [h for h in s.search(longer, k=100) if h.id == "d5"]
    assert len(found) == 1 and found[0].text == longer and found[0].metadata["year"] == 2
    n_docs = index_info(idx).n_documents
    assert n_docs == 12
    gone = delete(idx, ["d4", "nope"])
    assert gone.n_deleted == 1 and gone.missing == ["nope"]
    s = Searcher.open(idx)
    for mode in ("dense", "lexical", "hybrid"):
        assert "d4" not in {h.id for h in s.search(_records()[4]["text"], k=100, mode=mode)}
    assert index_info(idx).n_documents == 11
    compact(idx)  # merged rows keep their passages: texts and highlights as before
    s = Searcher.open(idx)
    after = s.search(longer, k=100)
    assert len(after) == 11 and [h.text for h in after if h.id == "d5"] == [longer]
    assert any(h.highlight is not None for h in after)


def test_a_refresh_counts_documents_only_in_the_segments_a_write_changed(
    tmp_path, model_dir, monkeypatch
):
    from flowsearch.storage import passages as sp

    pq.write_table(pa.Table.from_pylist(_records()), tmp_path / "c.parquet")
    idx = tmp_path / "idx"
    build_index(tmp_path / "c.parquet", idx, model=str(model_dir), max_length=MAX_LENGTH)
    s = Searcher.open(idx)
    assert s.info().n_documents == 12 and s._version.passages_per_document > 1.5
    upsert(idx, [{"id": "new", "text": _document(7), "topic": "x", "year": 1}],
           merge_segments=False)  # fmt: skip
    counted: list[str] = []
    real = sp.count_documents
    monkeypatch.setattr(
        sp, "count_documents", lambda f, seg: counted.append(seg.name) or real(f, seg)
    )
    assert s.refresh()
    first = s.manifest.segments[0].name  # unchanged by the write: its count is reused
    assert counted == [seg.name for seg in s.manifest.segments if seg.name != first]
    assert s.info().n_documents == 13 == index_info(idx).n_documents
    assert s._version.passages_per_document == s.manifest.n_live / 13


def test_without_long_documents_an_index_answers_as_before(tmp_path, model_dir):
    corpus = write_corpus(tmp_path / "c.parquet", n=60, seed=4)
    build_index(corpus, tmp_path / "new", model=str(model_dir))
    build_index(corpus, tmp_path / "off", model=str(model_dir), passage_tokens=0)
    new, off = Searcher.open(tmp_path / "new"), Searcher.open(tmp_path / "off")
    assert new.manifest.passages is not None and off.manifest.passages is None
    for seg in new.version.segments:
        assert not set(PASSAGE_COLUMNS) & set(seg.reader.schema.names)  # rows as before
    for mode in ("dense", "lexical", "hybrid"):
        for query in sentences(3, seed=8):
            a, b = new.search(query, k=5, mode=mode), off.search(query, k=5, mode=mode)
            assert [h.model_dump() for h in a] == [h.model_dump() for h in b]
            assert all(h.highlight is None for h in a)


def test_truncation_when_asked_and_sizes_checked(tmp_path, model_dir):
    pq.write_table(pa.Table.from_pylist(_records()), tmp_path / "c.parquet")
    build_index(tmp_path / "c.parquet", tmp_path / "t", model=str(model_dir),
                max_length=MAX_LENGTH, passage_tokens=0)  # fmt: skip
    s = Searcher.open(tmp_path / "t")
    assert s.manifest.n_live == 12 and s.manifest.passages is None
    upsert(tmp_path / "t", [{"id": "n", "text": _document(5), "topic": "x", "year": 1}])
    assert Searcher.open(tmp_path / "t").manifest.n_live == 13  # writes cut as the build did
    with pytest.raises(BadInput, match="passage_overlap"):
        build_index(tmp_path / "c.parquet", tmp_path / "o", model=str(model_dir),
                    max_length=MAX_LENGTH, passage_overlap=13)  # fmt: skip


def test_the_ray_encoder_cuts_rows_as_the_local_build(tmp_path, encoder):
    """The Ray build's encoder actors cut with the local build's code: the same passage rows
    (ids, texts, metadata, passage columns), each keeping its document's sort key; and the row
    order check sees passages (the Ray build itself: tests/test_ray_ingest.py, slow)."""
    from corpus_helpers import scan_corpus

    from flowsearch.ingest.passages import Cuts
    from flowsearch.writes.ray_encode import ROW, cut_rows, key_range

    pq.write_table(pa.Table.from_pylist(_records()), tmp_path / "c.parquet")
    plan = scan_corpus(tmp_path / "c.parquet", "text", "id")
    sizes = checked_sizes(encoder.window)
    cuts = Cuts(encoder, plan, sizes, batch_rows=5)
    local = [rows_of(*batch) for batch in cuts.batches()]
    want = pa.concat_tables(local)
    ((ids, texts, meta),) = plan.batches(100)
    batch = pa.table({ROW: np.arange(len(texts)) + (3 << 32), "id": ids, "text": texts,
                      **{n: meta.column(n) for n in meta.column_names}})  # fmt: skip
    got = cut_rows(encoder, batch, sizes)
    assert got.drop_columns([ROW]).equals(want.select(got.drop_columns([ROW]).column_names))
    assert got.num_rows == cuts.n_rows > len(texts)
    keys = got.column(ROW).to_numpy() - (3 << 32)
    np.testing.assert_array_equal(keys, cuts.documents())  # each passage keeps its document's
    last = got.column("__passage")[-1].as_py()
    assert last > 0 and key_range(got) == ((3 << 32, 0), ((3 << 32) + 11, last))
    assert key_range(got.take([0, 2, 1])) is None  # passages out of order
    assert key_range(got.take([0, 0])) is None  # a row twice


def rows_of(ids, texts, meta, spans) -> pa.Table:
    from flowsearch.storage.passages import passage_columns

    return pa.table({"id": ids, "text": pa.array(texts, pa.string()),
                     **{n: meta.column(n) for n in meta.column_names},
                     **passage_columns(spans)})  # fmt: skip


# --- surfaces -----------------------------------------------------------------------------


def test_cli_and_http_show_the_highlight(long_index):
    from fastapi.testclient import TestClient

    from flowsearch.cli import app
    from flowsearch.server import create_app

    doc = _records()[4]["text"]
    s = Searcher.open(long_index)
    a, b = split_texts(s.encoder, [doc], checked_sizes(s.encoder.window))[0][1]
    passage = doc[a:b].strip()
    runner = CliRunner(env={"COLUMNS": "400"})
    shown = runner.invoke(app, ["query", passage, "--index", str(long_index), "-k", "2",
                                "--mode", "dense"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    top = s.search(passage, k=1, mode="dense")[0].highlight
    assert f"[{top.start}:{top.end}] {passage}" in " ".join(shown.stdout.split())
    as_json = runner.invoke(app, ["query", passage, "--index", str(long_index), "--json"])
    assert json.loads(as_json.stdout)["hits"][0]["highlight"]["text"] == passage
    info = runner.invoke(app, ["info", "--index", str(long_index)])
    assert "12 live in" in info.stdout and "passages" in info.stdout
    with TestClient(create_app(long_index)) as client:
        answer = client.post("/search", json={"query": passage, "k": 2, "mode": "dense"})
        assert answer.status_code == 200
        hit = answer.json()["hits"][0]
        assert hit["id"] == "d4" and hit["highlight"]["text"] == passage
        assert hit["text"][hit["highlight"]["start"] : hit["highlight"]["end"]] == passage
        assert client.get("/info").json()["n_documents"] == 12
    np.testing.assert_equal(len(s.search(passage, k=12)), 12)


def test_write_summaries_count_documents(capsys):
    """A write's summary counts the documents it wrote, beside the live passages."""
    from flowsearch.cli.output import print_summary
    from flowsearch.writes.results import WriteResult

    result = WriteResult(kind="build", index="idx", version=1, n_written=12, n_live=40,
                         n_segments=1, dim=32)  # fmt: skip
    print_summary(result, "indexed")
    said = " ".join(capsys.readouterr().err.split())
    assert said.startswith("indexed 12 documents -> idx (version 1, 40 live passages in 1 segment")


def test_the_reference_skips_a_passage_s_own_document():
    from flowsearch.space.reference import best_other_score

    scores = np.array([[1.0, 0.9, 0.5], [1.0, 0.8, 0.7]])
    rows = np.array([[0, 1, 2], [2, 0, -1]])
    own = np.array([0, 2])
    np.testing.assert_allclose(best_other_score(scores, rows, own), [0.9, 0.8])
    documents = np.array([0, 0, 1])  # rows 0 and 1: passages of one document
    np.testing.assert_allclose(best_other_score(scores, rows, own, documents), [0.5, 0.8])
    alone = best_other_score(scores[:1, :2], rows[:1, :2], own[:1], documents)
    assert np.isnan(alone).all()


# --- the hybrid's weight on long documents ------------------------------------------------


def _ranked(s: Searcher, queries: list[str]) -> list[list[tuple[str, float]]]:
    return [[(str(h.id), round(h.score, 9)) for h in hits]
            for hits in s.search(queries, k=6, mode="hybrid")]  # fmt: skip


def test_the_hybrid_weight_falls_with_passages_per_document(long_index, monkeypatch):
    from flowsearch.search import fusion
    from flowsearch.search.fusion import default_weight

    s = Searcher.open(long_index)
    info = s.info()
    ratio = info.manifest.n_live / info.n_documents
    assert ratio > 1.5  # most documents of this index are cut
    queries = [r["text"].split(".")[1] for r in _records() if "." in r["text"][:-1]][:4]
    shipped = fusion.DENSE_WEIGHT
    monkeypatch.setattr(fusion, "LENGTH_SLOPE", 0.0)
    flat = _ranked(s, queries)
    # the default: the weight at this index's passages per document, as a flat weight gives it
    monkeypatch.setattr(fusion, "LENGTH_SLOPE", 0.2)
    w = default_weight("transformer", ratio)
    got = _ranked(s, queries)
    assert w < shipped
    monkeypatch.setattr(fusion, "DENSE_WEIGHT", w)
    monkeypatch.setattr(fusion, "LENGTH_SLOPE", 0.0)
    assert got == _ranked(s, queries)
    # a slope steep enough clips the weight to 0: the lexical side alone decides
    monkeypatch.setattr(fusion, "DENSE_WEIGHT", shipped)
    monkeypatch.setattr(fusion, "LENGTH_SLOPE", 100.0)
    steep = _ranked(s, queries)
    monkeypatch.setattr(fusion, "DENSE_WEIGHT", 0.0)
    monkeypatch.setattr(fusion, "LENGTH_SLOPE", 0.0)
    assert steep == _ranked(s, queries)
    assert steep != flat


def test_an_index_of_short_texts_keeps_the_hybrid_weight(tmp_path, model_dir, monkeypatch):
    from flowsearch.search import fusion

    corpus = write_corpus(tmp_path / "c.parquet", n=40, seed=5)
    build_index(corpus, tmp_path / "idx", model=str(model_dir))
    s = Searcher.open(tmp_path / "idx")
    assert s.info().n_documents == len(s)
    queries = sentences(3, seed=9)
    monkeypatch.setattr(fusion, "LENGTH_SLOPE", 0.0)
    flat = _ranked(s, queries)
    monkeypatch.setattr(fusion, "LENGTH_SLOPE", 100.0)
    assert _ranked(s, queries) == flat
