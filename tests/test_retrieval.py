"""BEIR reader, retrieval metrics against pytrec_eval, and run_retrieval on a tiny index."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import sentences

from flowsearch.errors import FlowsearchError
from flowsearch.evaluation.beir import load_beir, passage_text, write_beir
from flowsearch.evaluation.retrieval import (
    drop_identical_ids,
    mrr_at_k,
    ndcg_at_k,
    ranked_ids,
    recall_at_k,
    retrieval_scores,
    run_retrieval,
    search_run,
)

pytrec_eval = pytest.importorskip("pytrec_eval")

MEASURES = {"ndcg_cut_10", "ndcg_cut_3", "recall_100", "recall_5", "recip_rank"}


# ---------------------------------------------------------------------------- BEIR reader


def _tiny_beir(root: Path, qrels_at: str = "qrels/test.tsv") -> Path:
    corpus = [
        {"_id": "d1", "title": "Tides", "text": "The moon pulls the sea.", "year": 2001},
        {"_id": "d2", "title": "", "text": "Bread needs flour.", "tags": ["food"]},
        {"_id": 3, "text": "Untitled passage."},
    ]
    write_beir(root, corpus, {"q1": "why tides", "q2": "bread", "q3": "no qrels"}, {})
    (root / "qrels" / "test.tsv").unlink()
    path = root / qrels_at
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\t3\t0\nq2\td2\t1\n")
    return root


@pytest.mark.parametrize("qrels_at", ["qrels/test.tsv", "qrels.tsv"])
def test_load_beir_reads_corpus_queries_qrels(tmp_path, qrels_at):
    ds = load_beir(_tiny_beir(tmp_path / "set", qrels_at))
    assert ds.name == "set"
    assert ds.doc_ids == ["d1", "d2", "3"]  # ids are strings, file order
    assert ds.texts == ["Tides The moon pulls the sea.", "Bread needs flour.", "Untitled passage."]
    assert ds.titles == ["Tides", "", ""]
    assert ds.metadata == [{"year": 2001}, {"tags": ["food"]}, {}]
    assert ds.queries == {"q1": "why tides", "q2": "bread"}  # q3 has no qrels: dropped
    assert ds.qrels == {"q1": {"d1": 2, "3": 0}, "q2": {"d2": 1}}
    assert ds.mean_relevant() == 1.0


def test_passage_text_joins_title_like_beir():
    assert passage_text("A title", "body") == "A title body"
    assert passage_text("", "body") == passage_text(None, "body") == "body"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: (r / "corpus.jsonl").unlink(), "corpus.jsonl is missing"),
        (lambda r: (r / "queries.jsonl").unlink(), "queries.jsonl is missing"),
        (lambda r: (r / "qrels" / "test.tsv").unlink(), "no qrels in"),
        (
            lambda r: (r / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": \n'),
            "corpus.jsonl:2 is not valid JSON",
        ),
        (
            lambda r: (r / "corpus.jsonl").write_text('{"text": "a"}\n'),
            'corpus.jsonl:1 has no "_id"',
        ),
        (
            lambda r: (r / "corpus.jsonl").write_text(
                '{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n'
            ),
            "corpus.jsonl:2 repeats _id 'd1'",
        ),
        (
            lambda r: (r / "qrels" / "test.tsv").write_text("h\th\th\nq9\td1\t1\n"),
            "1 query id(s) absent from queries.jsonl",
        ),
        (
            lambda r: (r / "qrels" / "test.tsv").write_text("h\th\th\nq1\tnope\t1\n"),
            "1 corpus id(s) absent from corpus.jsonl",
        ),
        (
            lambda r: (r / "qrels" / "test.tsv").write_text("h\th\th\nq1\td1\n"),
            "test.tsv:2 has 2 tab-separated columns",
        ),
        (
            lambda r: (r / "qrels" / "test.tsv").write_text("h\th\th\nq1\td1\thigh\n"),
            "test.tsv:2 has score 'high'",
        ),
    ],
)
def test_load_beir_bad_input_is_one_clear_line(tmp_path, damage, message):
    root = _tiny_beir(tmp_path / "set")
    damage(root)
    with pytest.raises(FlowsearchError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        load_beir(root)
    assert "\n" not in str(e.value)


def test_load_beir_missing_directory(tmp_path):
    with pytest.raises(FlowsearchError, match="does not exist"):
        load_beir(tmp_path / "nowhere")


# ---------------------------------------------------------------------------- metrics


def _reference(qrels, run, measures=MEASURES):
    return pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)


def _ours(qrels, run):
    return {
        "ndcg_cut_10": ndcg_at_k(qrels, run, 10),
        "ndcg_cut_3": ndcg_at_k(qrels, run, 3),
        "recall_100": recall_at_k(qrels, run, 100),
        "recall_5": recall_at_k(qrels, run, 5),
    }


def _assert_matches(qrels, run):
    ref = _reference(qrels, run)
    ours = _ours(qrels, run)
    for measure, per_query in ours.items():
        assert set(per_query) == set(ref), measure
        for qid, value in per_query.items():
            assert value == pytest.approx(ref[qid][measure], abs=1e-9), (measure, qid)
    # MRR@10 is trec_eval's recip_rank of the run cut at its top 10 (in trec_eval's order).
    cut = {q: {d: docs[d] for d in ranked_ids(docs, 10)} for q, docs in run.items()}
    ref_cut = _reference(qrels, cut, {"recip_rank"})
    mrr = mrr_at_k(qrels, run, 10)
    assert set(mrr) == set(ref_cut)
    for qid, value in mrr.items():
        assert value == pytest.approx(ref_cut[qid]["recip_rank"], abs=1e-9), qid


HAND_QRELS = {
    "graded": {"a": 3, "b": 2, "c": 1, "z": 2, "zero": 0},
    "ties": {"t1": 1, "t3": 2},
    "only-zero": {"x": 0},
    "no-hits": {"a": 1},
    "negative": {"n": -1, "m": 1},
    "deep": {f"d{i:03d}": 1 for i in range(0, 200, 7)},
    "not-in-run": {"a": 1},
}
HAND_RUN = {
    "graded": {"zero": 5.0, "c": 4.0, "a": 3.0, "q": 2.5, "b": 1.0, "z": 1.0},
    # Equal scores: trec_eval ranks by doc id descending, so t3 before t2 before t10 before t1.
    "ties": {"t1": 0.5, "t10": 0.5, "t2": 0.5, "t3": 0.5, "u": 0.1},
    "only-zero": {"x": 1.0, "y": 0.5},
    "no-hits": {},
    "negative": {"n": 2.0, "m": 1.0},
    "deep": {f"d{i:03d}": float(-i) for i in range(150)},
    "unjudged-query": {"a": 1.0},
}


def test_ranked_ids_is_trec_eval_order():
    assert ranked_ids(HAND_RUN["ties"]) == ["t3", "t2", "t10", "t1", "u"]
    assert ranked_ids(HAND_RUN["graded"], 3) == ["zero", "c", "a"]
    assert ranked_ids({}) == []


def test_metrics_match_pytrec_eval_on_hand_made_runs():
    _assert_matches(HAND_QRELS, HAND_RUN)
    # and a few values worked out by hand
    assert recall_at_k(HAND_QRELS, HAND_RUN)["no-hits"] == 0.0
    assert "unjudged-query" not in ndcg_at_k(HAND_QRELS, HAND_RUN)
    assert "not-in-run" not in ndcg_at_k(HAND_QRELS, HAND_RUN)
    assert mrr_at_k(HAND_QRELS, HAND_RUN)["ties"] == 1.0  # t3 comes first
    assert ndcg_at_k(HAND_QRELS, HAND_RUN)["negative"] == pytest.approx(1 / np.log2(3))


@pytest.mark.parametrize("seed", range(8))
def test_metrics_match_pytrec_eval_on_random_runs(seed):
    rng = np.random.default_rng(seed)
    docs = [f"doc{i}" for i in range(300)] + [str(i) for i in range(50)]
    qrels, run = {}, {}
    for q in range(40):
        qid = f"q{q}"
        judged = rng.choice(docs, size=int(rng.integers(1, 30)), replace=False)
        qrels[qid] = {str(d): int(rng.integers(-1, 4)) for d in judged}
        if q % 13 == 5:
            continue  # judged but absent from the run
        n = int(rng.integers(0, 160))
        retrieved = rng.choice(docs, size=n, replace=False)
        # scores on a coarse grid so that many ties occur
        run[qid] = {str(d): float(rng.integers(0, 20)) / 4 for d in retrieved}
    run["unjudged"] = {"doc1": 1.0}
    _assert_matches(qrels, run)


def test_retrieval_scores_means_and_identical_ids():
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    run = {"q1": {"q1": 9.0, "d1": 1.0}, "q2": {"d2": 1.0}}
    plain = retrieval_scores(qrels, run)
    assert plain["mrr@10"] == pytest.approx((0.5 + 1.0) / 2)
    assert plain["queries"] == 2
    ignoring = retrieval_scores(qrels, run, ignore_identical_ids=True)
    assert ignoring["mrr@10"] == 1.0 and ignoring["ndcg@10"] == 1.0
    ref = _reference(qrels, drop_identical_ids(run), {"ndcg_cut_10"})
    assert ignoring["ndcg@10"] == np.mean([v["ndcg_cut_10"] for v in ref.values()])
    with pytest.raises(FlowsearchError, match="no query of the run has qrels"):
        retrieval_scores(qrels, {"other": {"d1": 1.0}})


# ---------------------------------------------------------------------------- search_run


class _Hit:
    def __init__(self, id, score):
        self.id, self.score = id, score


class _FakeSearcher:
    """Returns the same ranked ids for every query; records how it was called."""

    def __init__(self, ids):
        self.ids = ids
        self.calls = []

    def search(self, queries, k=10, **kwargs):
        self.calls.append((len(queries), k, kwargs))
        return [[_Hit(d, 1.0 - i / 10) for i, d in enumerate(self.ids[:k])] for _ in queries]


def test_search_run_batches_and_always_passes_the_mode():
    fake = _FakeSearcher([1, "q2", "d3", "d4"])
    queries = {f"q{i}": f"text {i}" for i in range(5)}
    run = search_run(fake, queries, k=3, batch_size=2)
    assert [c[0] for c in fake.calls] == [2, 2, 1]
    assert all(c[2] == {"mode": "dense"} for c in fake.calls)  # never the Searcher's default
    assert run["q0"] == {"1": 1.0, "q2": 0.9, "d3": 0.8}  # ids as strings
    fake.calls.clear()
    run = search_run(fake, {"q2": "x"}, k=3, mode="hybrid", ignore_identical_ids=True)
    assert fake.calls == [(1, 4, {"mode": "hybrid"})]  # one more hit fetched
    assert list(run["q2"]) == ["1", "d3", "d4"]  # its own id dropped, k kept


# ---------------------------------------------------------------------------- end to end


def _synthetic_beir(root: Path, n_docs: int = 30) -> Path:
    texts = sentences(n_docs, seed=3, length=(6, 10))
    corpus = [
        {"_id": f"p{i}", "title": "" if i % 3 else "the title", "text": t, "topic": i % 4}
        for i, t in enumerate(texts)
    ]
    queries, qrels = {}, {}
    for q in range(12):
        queries[f"q{q}"] = " ".join(texts[q].split()[1:5])  # words of its own passage
        qrels[f"q{q}"] = {f"p{q}": 2, f"p{(q + 1) % n_docs}": 1}
    queries["lonely"] = "no judgements"
    return write_beir(root, corpus, queries, qrels)


def test_run_retrieval_dense_end_to_end(tmp_path, model_dir, monkeypatch):
    from flowsearch.search.searcher import Searcher

    beir_dir = _synthetic_beir(tmp_path / "synthetic")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = run_retrieval(beir_dir, model=str(model_dir), calibration="none", keep=True, k=20)
    json.dumps(out)  # JSON-able
    assert out["dataset"] == "synthetic"
    assert (out["corpus_rows"], out["indexed_rows"], out["queries"]) == (30, 30, 12)
    assert out["pooling"] == "mean" and out["calibration"] == "none" and out["space"]
    assert set(out["results"]) == {"dense"}
    assert set(out["seconds"]) == {"load", "index", "search", "total"}
    # The figures are exactly pytrec_eval's on the run the kept index answers.
    ds = load_beir(beir_dir)
    searcher = Searcher.open(out["index_dir"])
    try:
        run = search_run(searcher, ds.queries, k=20)
        hit = searcher.search("anything", k=1)[0]
    finally:
        searcher.close()
    assert hit.metadata["topic"] in range(4) and "title" in hit.metadata
    assert all(len(docs) == 20 for docs in run.values())
    ref = _reference(ds.qrels, run, {"ndcg_cut_10", "recall_100"})
    cut = {q: {d: docs[d] for d in ranked_ids(docs, 10)} for q, docs in run.items()}
    ref_rr = _reference(ds.qrels, cut, {"recip_rank"})
    got = out["results"]["dense"]
    assert got["ndcg@10"] == pytest.approx(np.mean([r["ndcg_cut_10"] for r in ref.values()]))
    assert got["recall@100"] == pytest.approx(np.mean([r["recall_100"] for r in ref.values()]))
    assert got["mrr@10"] == pytest.approx(np.mean([r["recip_rank"] for r in ref_rr.values()]))
    assert got["ndcg@10"] > 0
    # Only the kept index remains of the scratch space (the Parquet copy is gone).
    assert [p.name for p in Path(out["index_dir"]).parent.iterdir()] == ["index"]


def test_run_retrieval_cleans_up_and_refuses_bad_options(tmp_path, model_dir, monkeypatch):
    beir_dir = _synthetic_beir(tmp_path / "synthetic")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = run_retrieval(
        beir_dir, model=str(model_dir), calibration="none", ignore_identical_ids=True, k=10
    )
    assert out["index_dir"] is None and out["ignore_identical_ids"] is True
    assert list(scratch.iterdir()) == []
    with pytest.raises(FlowsearchError, match="unknown retrieval mode"):
        run_retrieval(beir_dir, modes="sparse", model=str(model_dir))
    with pytest.raises(FlowsearchError, match="k must be at least 10"):
        run_retrieval(beir_dir, model=str(model_dir), k=5)


@pytest.mark.slow
def test_run_retrieval_bundled_model_on_stsb_paraphrases(tmp_path, monkeypatch):
    """The bundled model finds STS-B paraphrases (a dev set built from FLOWSEARCH_DATA)."""
    data = os.environ.get("FLOWSEARCH_DATA")
    if not data:
        pytest.skip("set FLOWSEARCH_DATA to the evaluation data folder")
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "make_dev_sets.py"
    spec = importlib.util.spec_from_file_location("make_dev_sets", script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    module.make_dev_sets(data, tmp_path, names=["stsb-para"], max_corpus=1500)
    out = run_retrieval(
        tmp_path / "stsb-para", calibration="none", ignore_identical_ids=True, k=100
    )
    assert out["results"]["dense"]["ndcg@10"] > 0.6
