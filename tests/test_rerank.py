"""Reranking (search/rerank.py): a tiny random cross-encoder, loaded as any CrossEncoder is,
orders the first stage's top documents; k, filters and depth hold; the CLI and server pass it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import transformers
from corpus_helpers import sentences, write_corpus
from typer.testing import CliRunner

from flowsearch.cli import app
from flowsearch.errors import BadInput, NotFound
from flowsearch.search.rerank import Reranker, passage_of
from flowsearch.search.results import Highlight, Hit
from flowsearch.search.searcher import Searcher
from flowsearch.writes.build import build_index

DEPTH = 12


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("rerank")
    corpus = write_corpus(root / "c.parquet", n=60, seed=5)
    build_index(corpus, root / "idx", model=str(model_dir))
    return root / "idx"


@pytest.fixture(scope="module")
def reranker(tiny_cross_encoder_dir):
    return Reranker.load(tiny_cross_encoder_dir)


@pytest.fixture(scope="module")
def searcher(index_dir, reranker):
    s = Searcher.open(index_dir, reranker=reranker, rerank_depth=DEPTH)
    yield s
    s.close()


class Counting:
    """A cross-encoder's predict that counts the pairs it was given."""

    def __init__(self, model):
        self.model, self.pairs = model, []

    def predict(self, pairs, **kwargs):
        self.pairs.extend(pairs)
        return self.model.predict(pairs, **kwargs)


def test_hits_come_in_the_cross_encoders_order(searcher, reranker):
    query = sentences(1, seed=9)[0]
    first = searcher.search(query, k=DEPTH, rerank=False)
    assert all(h.rerank_score is None for h in first)
    hits = searcher.search(query, k=5)
    expected = reranker.model.predict([(query, h.text) for h in first])
    order = np.argsort(-np.asarray(expected), kind="stable")[:5]
    assert [h.id for h in hits] == [first[i].id for i in order]
    np.testing.assert_allclose([h.rerank_score for h in hits], expected[order], rtol=1e-5)
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    by_id = {h.id: h for h in first}  # the first stage's score stays beside the rerank score
    assert all(h.score == pytest.approx(by_id[h.id].score) for h in hits)
    assert [h.id for h in hits] != [h.id for h in first[:5]]  # it did reorder something


def test_depth_and_k_are_respected(index_dir, tiny_cross_encoder_dir):
    counting = Counting(Reranker.load(tiny_cross_encoder_dir).model)
    s = Searcher.open(index_dir, reranker=Reranker(counting, "counting"), rerank_depth=5)
    try:
        query = sentences(1, seed=4)[0]
        top5 = {h.id for h in s.search(query, k=5, rerank=False)}
        hits = s.search(query, k=3)
        assert len(hits) == 3 and {h.id for h in hits} <= top5
        assert len(counting.pairs) == 5  # the cross-encoder read exactly the depth
        counting.pairs.clear()
        assert len(s.search(query, k=8)) == 8 and len(counting.pairs) == 8  # at least k
        counting.pairs.clear()
        batch = s.search([query, "the cat"], k=2)  # one call for the batch, each its own depth
        assert [len(b) for b in batch] == [2, 2] and len(counting.pairs) == 10
        assert [h.id for h in batch[0]] == [h.id for h in hits[:2]]
    finally:
        s.close()


def test_filters_and_min_score_hold(searcher):
    hits = searcher.search("the red cat", k=4, where="topic = 'dog'")
    assert len(hits) == 4 and all(h.metadata["topic"] == "dog" for h in hits)
    assert all(h.rerank_score is not None for h in hits)
    floor = searcher.search("the red cat", k=DEPTH, rerank=False)[3].score
    kept = searcher.search("the red cat", k=DEPTH, min_score=floor)
    assert kept and all(h.score >= floor for h in kept)  # on the first stage's score


def test_query_report_and_modes(searcher):
    result = searcher.query("the blue sea", k=3, mode="lexical")
    assert len(result.hits) == 3 and all(h.rerank_score is not None for h in result.hits)
    assert result.report is not None
    assert json.loads(json.dumps(result.to_dict()))["hits"][0]["rerank_score"] is not None


def test_refusals_are_one_line(index_dir, tmp_path, model_dir):
    plain = Searcher.open(index_dir)
    try:
        with pytest.raises(BadInput, match="no reranker"):
            plain.search("the cat", rerank=True)
        assert plain.search("the cat", k=2)[0].rerank_score is None
    finally:
        plain.close()
    with pytest.raises(NotFound, match="no cross-encoder directory") as err:
        Searcher.open(index_dir, reranker=tmp_path / "missing")
    assert "\n" not in str(err.value)
    with pytest.raises(BadInput, match="not a cross-encoder"):
        Reranker.load(tmp_path)  # a directory without a model
    # an embedding model (the index's own): CrossEncoder would add a random head
    with pytest.raises(BadInput, match="not a cross-encoder .a BertModel without a") as err:
        Reranker.load(model_dir)
    assert "\n" not in str(err.value)
    masked = tmp_path / "masked_lm"  # a pretraining checkpoint: a head, but not a classifier
    transformers.BertForMaskedLM.from_pretrained(model_dir).save_pretrained(masked)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, masked / name)
    with pytest.raises(BadInput, match="a BertForMaskedLM without a classification head"):
        Reranker.load(masked)
    with pytest.raises(BadInput, match="rerank_depth"):
        Searcher.open(index_dir, rerank_depth=0)


def test_a_long_document_is_read_as_its_best_passage():
    hit = Hit(id="a", score=0.5, rank=1, text="one two three four",
              highlight=Highlight(start=4, end=13, text="two three"))  # fmt: skip
    assert passage_of(hit) == "two three"
    assert passage_of(hit.model_copy(update={"highlight": None})) == "one two three four"


def test_a_long_document_is_reranked_on_its_best_passage(tmp_path, model_dir, reranker):
    """The cross-encoder reads each first-stage hit's best passage (its highlight), not the
    whole document; the reranked hits keep their highlight and first-stage score."""
    texts = [" ".join(s + "." for s in sentences(6, seed=70 + i, length=(3, 7))) for i in range(6)]
    records = [{"id": f"L{i}", "text": t} for i, t in enumerate(texts)]
    build_index(records, tmp_path / "idx", model=str(model_dir), max_length=16,
                calibration="none")  # fmt: skip
    counting = Counting(reranker.model)
    s = Searcher.open(tmp_path / "idx", reranker=Reranker(counting, "counting"), rerank_depth=4)
    try:
        query = texts[2].split(".")[2].strip()
        first = s.search(query, k=4, mode="dense", rerank=False)
        assert all(h.highlight is not None and h.highlight.text != h.text for h in first)
        hits = s.search(query, k=4, mode="dense")
        assert counting.pairs == [(query, h.highlight.text) for h in first]
        by_id = {h.id: h for h in first}
        assert {h.id for h in hits} == set(by_id)
        assert all(h.highlight == by_id[h.id].highlight for h in hits)
        assert all(h.score == by_id[h.id].score for h in hits)
    finally:
        s.close()


def test_cli_query_rerank(index_dir, tiny_cross_encoder_dir, tmp_path):
    runner = CliRunner()
    args = ["query", "the cat", "--index", str(index_dir), "-k", "3"]
    result = runner.invoke(app, [*args, "--rerank", str(tiny_cross_encoder_dir), "--json"])
    assert result.exit_code == 0, result.output
    hits = json.loads(result.stdout)["hits"]
    assert len(hits) == 3 and all(h["rerank_score"] is not None for h in hits)
    table = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, [*args, "--rerank", str(tiny_cross_encoder_dir)]
    )
    assert table.exit_code == 0 and "rerank" in table.stdout
    bad = runner.invoke(app, [*args, "--rerank", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert bad.stderr.strip().count("\n") == 0 and "no cross-encoder directory" in bad.stderr


def test_server_rerank_field(index_dir, tiny_cross_encoder_dir):
    from fastapi.testclient import TestClient

    from flowsearch.server import create_app

    with TestClient(create_app(index_dir, reranker=tiny_cross_encoder_dir)) as c:
        hits = c.post("/search", json={"query": "the cat", "k": 3}).json()["hits"]
        assert len(hits) == 3 and all(h["rerank_score"] is not None for h in hits)
        off = c.post("/search", json={"query": "the cat", "k": 3, "rerank": False}).json()
        assert all(h["rerank_score"] is None for h in off["hits"])
        on = c.post("/search", json={"query": "the cat", "k": 3, "rerank": True}).json()
        assert [h["rerank_score"] for h in on["hits"]] == [h["rerank_score"] for h in hits]
        assert all(h["score"] is not None for h in on["hits"])  # the first stage's, beside it
        # the server's stage histogram has a rerank series for the two reranked searches only
        scraped = c.get("/metrics").text
        assert 'flowsearch_stage_seconds_count{index="idx",stage="rerank"} 2.0' in scraped
        assert 'flowsearch_stage_seconds_count{index="idx",stage="encode"} 3.0' in scraped
        schema = c.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]
        assert "rerank" in schema["properties"]
    with TestClient(create_app(index_dir), raise_server_exceptions=False) as c:
        refused = c.post("/search", json={"query": "the cat", "rerank": True})
        assert refused.status_code == 400
        assert "--rerank MODEL" in refused.json()["detail"]
        assert c.post("/search", json={"query": "the cat", "rerank": "yes"}).status_code == 422


def test_serve_with_a_bad_reranker_is_one_line(index_dir, tmp_path):
    out = CliRunner().invoke(app, ["serve", "--index", str(index_dir), "--port", "8765",
                                   "--rerank", str(tmp_path / "nope")])  # fmt: skip
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert "no cross-encoder directory" in out.stderr and out.stderr.strip().count("\n") == 0


def test_the_rerank_stage_is_timed_for_whoever_collects(searcher):
    """The server's ``flowsearch_stage_seconds{stage="rerank"}`` is fed by the library's stage."""
    from flowsearch.search.timings import collect

    with collect() as seconds:
        searcher.search("the cat", k=3)
    assert seconds.get("rerank", 0.0) > 0.0 and "encode" in seconds
    with collect() as seconds:
        searcher.search("the cat", k=3, rerank=False)
    assert "rerank" not in seconds
