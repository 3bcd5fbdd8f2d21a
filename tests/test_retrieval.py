"""BEIR reader, retrieval metrics against pytrec_eval, and run_retrieval on a tiny index."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import sentences

from flowsearch.errors import BadInput, FlowsearchError
from flowsearch.evaluation import beir
from flowsearch.evaluation.beir import load_beir, passage_text, write_beir
from flowsearch.evaluation.ranking_metrics import (
    drop_identical_ids,
    mrr_at_k,
    ndcg_at_k,
    ranked_ids,
    recall_at_k,
    retrieval_scores,
)
from flowsearch.evaluation.retrieval import run_retrieval, search_run

pytrec_eval = pytest.importorskip("pytrec_eval")


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


def _qrels_lines(root: Path, lines: list[str]) -> None:
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(lines))


def test_qrels_naming_a_few_absent_passages_warn_and_are_kept(tmp_path, caplog):
    """Some official BEIR releases judge passages their corpus lacks; BEIR and MTEB score
    them as unreachable, so the loader keeps them and says how many."""
    root = _tiny_beir(tmp_path / "set")
    _qrels_lines(root, ["q1\td1\t2", "q1\tgone\t1", "q2\td2\t1", "q2\t3\t0"])
    with caplog.at_level(logging.WARNING, logger="flowsearch.evaluation.beir"):
        ds = load_beir(root)
    assert ds.qrels == {"q1": {"d1": 2, "gone": 1}, "q2": {"d2": 1, "3": 0}}
    assert ds.missing_ids == ("gone",) and ds.unreachable_judgements() == 1
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "1 of 4 judgements name 1 corpus id(s) absent from corpus.jsonl" in record.getMessage()
    assert "'gone'" in record.getMessage()


def test_qrels_mostly_naming_absent_passages_are_refused(tmp_path, monkeypatch):
    root = _tiny_beir(tmp_path / "set")
    # 2 of 4 missing is half, not most: kept
    _qrels_lines(root, ["q1\td1\t2", "q1\tx\t1", "q2\td2\t1", "q2\ty\t1"])
    assert load_beir(root).missing_ids == ("x", "y")
    # 3 of 4: another corpus's qrels
    _qrels_lines(root, ["q1\td1\t2", "q1\tx\t1", "q2\tz\t1", "q2\ty\t1"])
    with pytest.raises(BadInput, match=r"3 of 4 judgements name 3 corpus id\(s\) absent") as e:
        load_beir(root)
    assert "do not belong to this corpus" in str(e.value) and "\n" not in str(e.value)
    # the share is the module's constant
    _qrels_lines(root, ["q1\td1\t2", "q1\tx\t1", "q2\td2\t1", "q2\t3\t1"])
    assert load_beir(root).missing_ids == ("x",)
    monkeypatch.setattr(beir, "QRELS_MISSING_MAX_SHARE", 0.2)
    with pytest.raises(BadInput):
        load_beir(root)


# ---------------------------------------------------------------------------- metrics


def _reference(qrels, run, measures):
    return pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)


def _dcg(gains):
    """sum of gain / log2(rank + 1), rank from 1: the discount trec_eval's ndcg uses."""
    return sum(g / math.log2(rank + 1) for rank, g in enumerate(gains, start=1))


HAND_QRELS = {
    "graded": {"a": 3, "b": 2, "c": 1, "z": 2, "zero": 0},
    "ties": {"t1": 1, "t3": 2},
    "only-zero": {"x": 0},
    "no-hits": {"a": 1},
    "unreachable": {"d1": 1, "gone": 1},  # "gone" is not in any run: a passage the corpus lacks
    "not-in-run": {"a": 1},
}
HAND_RUN = {
    # ranked: zero, c, a, q, then b and z tie: id descending puts z before b
    "graded": {"zero": 5.0, "c": 4.0, "a": 3.0, "q": 2.5, "b": 1.0, "z": 1.0},
    # Equal scores: trec_eval ranks by doc id descending, so t3 before t2 before t10 before t1.
    "ties": {"t1": 0.5, "t10": 0.5, "t2": 0.5, "t3": 0.5, "u": 0.1},
    "only-zero": {"x": 1.0, "y": 0.5},
    "no-hits": {},
    "unreachable": {"d1": 1.0, "d2": 0.5},
    "unjudged-query": {"a": 1.0},
}


def test_ranked_ids_is_trec_eval_order():
    assert ranked_ids(HAND_RUN["ties"]) == ["t3", "t2", "t10", "t1", "u"]
    assert ranked_ids(HAND_RUN["graded"], 3) == ["zero", "c", "a"]
    assert ranked_ids(HAND_RUN["graded"])[-2:] == ["z", "b"]
    assert ranked_ids({}) == []


def test_ndcg_by_hand():
    ndcg = ndcg_at_k(HAND_QRELS, HAND_RUN, 10)
    # graded: gains in rank order 0 (zero), 1 (c), 3 (a), 0 (q), 2 (z), 2 (b); ideal 3, 2, 2, 1
    assert ndcg["graded"] == pytest.approx(_dcg([0, 1, 3, 0, 2, 2]) / _dcg([3, 2, 2, 1]))
    assert ndcg_at_k(HAND_QRELS, HAND_RUN, 3)["graded"] == pytest.approx(
        _dcg([0, 1, 3]) / _dcg([3, 2, 2])
    )
    # ties: t3 (2) first, t1 (1) fourth
    assert ndcg["ties"] == pytest.approx(_dcg([2, 0, 0, 1]) / _dcg([2, 1]))
    assert ndcg_at_k(HAND_QRELS, HAND_RUN, 3)["ties"] == pytest.approx(2 / _dcg([2, 1]))
    # the unreachable passage stays in the ideal ranking: the best run scores 1 / (1 + 1/log2 3)
    assert ndcg["unreachable"] == pytest.approx(1 / (1 + 1 / math.log2(3)))
    assert ndcg["only-zero"] == 0.0 and ndcg["no-hits"] == 0.0
    # scored: judged and in the run (an empty entry too); nothing else
    assert set(ndcg) == {"graded", "ties", "only-zero", "no-hits", "unreachable"}


def test_recall_by_hand():
    assert recall_at_k(HAND_QRELS, HAND_RUN, 5)["graded"] == 3 / 4  # c, a, z of a, b, c, z
    assert recall_at_k(HAND_QRELS, HAND_RUN, 100)["graded"] == 1.0
    assert recall_at_k(HAND_QRELS, HAND_RUN, 1)["ties"] == 1 / 2
    assert recall_at_k(HAND_QRELS, HAND_RUN)["unreachable"] == 1 / 2
    assert recall_at_k(HAND_QRELS, HAND_RUN)["no-hits"] == 0.0


def test_mrr_cuts_the_run_in_trec_eval_order():
    assert mrr_at_k(HAND_QRELS, HAND_RUN, 10)["graded"] == 1 / 2  # c at rank 2
    assert mrr_at_k(HAND_QRELS, HAND_RUN, 1)["graded"] == 0.0  # "zero" is judged, not relevant
    assert mrr_at_k(HAND_QRELS, HAND_RUN, 1)["ties"] == 1.0  # t3 wins the tie, t1 would not
    deep = {"q": {f"d{i:02d}": float(-i) for i in range(20)}}
    assert mrr_at_k({"q": {"d12": 1}}, deep, 10)["q"] == 0.0  # rank 13: beyond the cut
    assert mrr_at_k({"q": {"d12": 1}}, deep, 20)["q"] == pytest.approx(1 / 13)


def test_metrics_still_import_from_retrieval():
    """They lived in retrieval.py before ranking_metrics.py; old imports keep working."""
    from flowsearch.evaluation import retrieval

    assert retrieval.ndcg_at_k is ndcg_at_k and retrieval.retrieval_scores is retrieval_scores
    with pytest.raises(AttributeError):
        retrieval.no_such_metric  # noqa: B018


def test_metrics_are_pytrec_evals_on_its_own_measures():
    """Our per-query figures are pytrec_eval's (ndcg_cut, recall) and its recip_rank of the run
    cut at 10; the means of retrieval_scores are their means over the scored queries."""
    ref = _reference(HAND_QRELS, HAND_RUN, {"ndcg_cut.10", "recall.100"})
    cut = {q: {d: docs[d] for d in ranked_ids(docs, 10)} for q, docs in HAND_RUN.items()}
    rr = _reference(HAND_QRELS, cut, {"recip_rank"})
    got = retrieval_scores(HAND_QRELS, HAND_RUN)
    assert got["queries"] == len(ref) == 5
    assert got["ndcg@10"] == pytest.approx(np.mean([r["ndcg_cut_10"] for r in ref.values()]))
    assert got["recall@100"] == pytest.approx(np.mean([r["recall_100"] for r in ref.values()]))
    assert got["mrr@10"] == pytest.approx(np.mean([r["recip_rank"] for r in rr.values()]))
    # recall by hand: graded 1, ties 1, only-zero 0 (no relevant), no-hits 0, unreachable 1/2
    assert got["recall@100"] == pytest.approx((1 + 1 + 0 + 0 + 0.5) / 5)


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
    assert (out["n_corpus"], out["n_indexed"], out["queries"]) == (30, 30, 12)
    assert out["pooling"] == "mean" and out["calibration"] == "none" and out["space"] == "encoder"
    assert (out["missing_corpus_ids"], out["unreachable_judgements"]) == (0, 0)
    assert set(out["results"]) == {"dense"} and set(out["seconds"]["search"]) == {"dense"}
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
    # Only the kept index remains of the scratch space (the Parquet copy is gone).
    assert [p.name for p in Path(out["index_dir"]).parent.iterdir()] == ["index"]


def _with_unreachable(beir_dir: Path) -> Path:
    """The synthetic set with two more relevant passages, absent from its corpus (q0, q1)."""
    qrels = beir_dir / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text() + "q0\tgone-a\t1\nq1\tgone-b\t1\n")
    return beir_dir


def test_run_retrieval_scores_unreachable_passages_as_pytrec_eval(tmp_path, model_dir):
    """Qrels naming passages the corpus lacks: every query is scored, those passages count
    against it, and the figures are pytrec_eval's on the same run with the full qrels."""
    from flowsearch.search.searcher import Searcher

    beir_dir = _with_unreachable(_synthetic_beir(tmp_path / "synthetic"))
    index = tmp_path / "index"
    out = run_retrieval(
        beir_dir, ["dense", "lexical"], model=str(model_dir), calibration="none",
        index_dir=index, k=30,
    )  # fmt: skip
    assert (out["queries"], out["missing_corpus_ids"], out["unreachable_judgements"]) == (12, 2, 2)
    # dense, k = 30 = the corpus: every present passage is retrieved, so recall@100 is what is
    # reachable: q0 and q1 find 2 of their 3 relevant passages, the 10 others all of theirs
    assert out["results"]["dense"]["recall@100"] == pytest.approx((10 + 2 * 2 / 3) / 12)
    ds = load_beir(beir_dir)
    assert ds.qrels["q0"] == {"p0": 2, "p1": 1, "gone-a": 1}
    searcher = Searcher.open(index)
    try:  # BM25 returns only passages sharing a term: a shorter run, scored all the same
        run = search_run(searcher, ds.queries, k=30, mode="lexical")
    finally:
        searcher.close()
    ref = _reference(ds.qrels, run, {"ndcg_cut_10", "recall_100"})
    assert set(ref) == set(ds.queries)  # every query scored
    got = out["results"]["lexical"]
    assert got["ndcg@10"] == pytest.approx(np.mean([r["ndcg_cut_10"] for r in ref.values()]))
    assert got["recall@100"] == pytest.approx(np.mean([r["recall_100"] for r in ref.values()]))


def test_cli_eval_retrieval_notes_unreachable_passages(tmp_path, model_dir):
    from typer.testing import CliRunner

    from flowsearch.cli import app

    beir_dir = _with_unreachable(_synthetic_beir(tmp_path / "synthetic"))
    args = ["eval", "retrieval", str(beir_dir), "--model", str(model_dir), "--calibration",
            "none", "--mode", "lexical"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["missing_corpus_ids"], doc["unreachable_judgements"]) == (2, 2)
    assert doc["results"]["lexical"]["recall@100"] < 1.0
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "note: 2 judgement(s) of the qrels name passages the corpus lacks" in result.stdout


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
    """The bundled model on the stsb-para dev set (6,000 passages, built from FLOWSEARCH_DATA)
    gives the figures benchmarks/RESULTS.md publishes for it (section bench_retrieval_cli,
    `mean` tier: dense nDCG@10 0.938 / MRR@10 0.921, BM25 0.915 / 0.895), within 0.005: the
    table prints three decimals, and a Flat index over the same vectors ranks the same."""
    data = os.environ.get("FLOWSEARCH_DATA")
    if not data:
        pytest.skip("set FLOWSEARCH_DATA to the evaluation data folder")
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "common" / "dev_sets.py"
    monkeypatch.syspath_prepend(str(script.parents[2]))  # the benchmarks package
    spec = importlib.util.spec_from_file_location("benchmarks.common.dev_sets", script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    module.make_dev_sets(data, tmp_path, names=["stsb-para"], max_corpus=6000)
    out = run_retrieval(
        tmp_path / "stsb-para", ["dense", "lexical"], ignore_identical_ids=True, k=100
    )
    assert (out["n_corpus"], out["queries"]) == (6000, 1510)
    published = {"dense": (0.938, 0.921), "lexical": (0.915, 0.895)}
    for mode, (ndcg, mrr) in published.items():
        assert out["results"][mode]["ndcg@10"] == pytest.approx(ndcg, abs=0.005), mode
        assert out["results"][mode]["mrr@10"] == pytest.approx(mrr, abs=0.005), mode


# ---------------------------------------------------------------------- several collections


def test_beir_dirs_reads_folders_of_collections_and_refuses_bad_paths(tmp_path):
    from flowsearch.errors import NotFound
    from flowsearch.evaluation.retrieval import beir_dirs

    a = _tiny_beir(tmp_path / "suite" / "b-set")
    b = _tiny_beir(tmp_path / "suite" / "a-set")
    (tmp_path / "suite" / "notes").mkdir()  # a folder that is no collection is passed over
    assert beir_dirs(tmp_path / "suite") == [b, a]  # by name
    assert beir_dirs([a, str(b)]) == [a, b]  # as given
    with pytest.raises(BadInput, match="named twice"):
        beir_dirs([tmp_path / "suite", a])
    with pytest.raises(BadInput, match="holds none"):
        beir_dirs(tmp_path / "suite" / "notes")
    with pytest.raises(NotFound, match="does not exist"):
        beir_dirs(tmp_path / "nowhere")
    with pytest.raises(BadInput, match="no BEIR directory"):
        beir_dirs([])


def test_run_retrieval_suite_means_every_collection_at_a_weight(tmp_path, model_dir, monkeypatch):
    from flowsearch.evaluation.retrieval import MEASURES, run_retrieval_suite
    from flowsearch.search import fusion

    weights = []
    real_fuse = fusion.fuse

    def spy(*args, **kwargs):
        weights.append(kwargs["weight"])
        return real_fuse(*args, **kwargs)

    monkeypatch.setattr(fusion, "fuse", spy)

    root = tmp_path / "suite"
    _synthetic_beir(root / "one")
    _synthetic_beir(root / "two", n_docs=24)
    (root / "two" / "dataset.json").write_text(json.dumps({"ignore_identical_ids": True}))
    out = run_retrieval_suite(root, ["lexical", "hybrid"], model=str(model_dir),
                              calibration="none", k=10, weight=1.0)  # fmt: skip
    json.dumps(out)
    runs = out["collections"]
    assert [r["dataset"] for r in runs] == ["one", "two"] and out["modes"] == ["lexical", "hybrid"]
    assert [r["ignore_identical_ids"] for r in runs] == [False, True]  # as dataset.json says
    assert all(r["weight"] == 1.0 for r in runs) and out["weight"] == 1.0
    for mode in ("lexical", "hybrid"):
        for m in MEASURES:
            assert out["mean"][mode][m] == pytest.approx(
                (runs[0]["results"][mode][m] + runs[1]["results"][mode][m]) / 2
            )
    assert weights and set(weights) == {1.0}  # the weight reaches the fusion of every search
    with pytest.raises(BadInput, match="hybrid_weight"):
        run_retrieval(root / "one", model=str(model_dir), weight=1.5)
    with pytest.raises(BadInput, match="index_dir"):
        run_retrieval_suite(root, model=str(model_dir), index_dir=tmp_path / "x")


def test_cli_eval_retrieval_over_a_folder_prints_one_table(tmp_path, model_dir):
    from typer.testing import CliRunner

    from flowsearch.cli import app

    root = tmp_path / "suite"
    _synthetic_beir(root / "one")
    _synthetic_beir(root / "two", n_docs=24)
    args = ["eval", "retrieval", str(root), "--model", str(model_dir), "--calibration", "none",
            "--mode", "lexical", "--passage-tokens", "0"]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["dataset"] for r in doc["collections"]] == ["one", "two"]
    assert set(doc["mean"]) == {"lexical"}
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for word in ("one", "two", "mean", "ndcg@10", "recall@100", "mrr@10"):
        assert word in result.stdout
    # two paths are the same suite; a bad weight is one line, exit 2
    both = CliRunner().invoke(app, [*args[:2], str(root / "one"), str(root / "two"), *args[3:],
                                    "--json"])  # fmt: skip
    assert both.exit_code == 0 and json.loads(both.stdout)["mean"] == doc["mean"]
    bad = CliRunner().invoke(app, [*args, "--weight", "2"])
    assert bad.exit_code == 2 and "hybrid_weight" in bad.output
