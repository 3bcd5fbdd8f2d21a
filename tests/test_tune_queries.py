"""Tuning ``auto``'s vector index on the users' own queries (``compact(tune_queries=...)``):
the tuner's use of them, what compact re-tunes and records, ``info``'s words, the command
line's ``--tune-queries``, and bad input refused in one line with nothing changed."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from corpus_helpers import write_corpus
from typer.testing import CliRunner

from flowsearch.ann import tune
from flowsearch.ann.policy import AnnPolicy
from flowsearch.errors import BadInput
from flowsearch.storage import manifest as mf

SMALL = AnnPolicy(flat_max_rows=100)


def _graph(n: int = 4_000, dim: int = 16) -> tuple[faiss.Index, np.ndarray]:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(20, dim))
    x = centres[rng.integers(20, size=n)] + 0.4 * rng.normal(size=(n, dim))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    index = faiss.index_factory(dim, "HNSW8", faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 16
    index.add(x)
    return index, x


def test_the_tuner_chooses_the_knob_the_user_s_queries_need():
    index, x = _graph()
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(300, x.shape[1])).astype(np.float32)  # far from every cluster
    tuned = tune.tune(index, np.zeros((0, 16), np.float32), lambda: [x], queries=queries)
    assert tuned.probes == tune.USER_QUERIES and tuned.noise == 0.0 and tuned.queries == 100
    # the knob set reaches the target on these very queries, checked here against exact search
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    truth = np.argsort(-(q @ x.T), axis=1)[:, :10]
    found = index.search(q, 10)[1]
    assert tune.recall_at_k(found, truth) >= tuned.target - 0.02
    again = tune.tune(index, np.zeros((0, 16), np.float32), lambda: [x], queries=queries)
    assert again == tuned  # seeded: the same queries give the same tuning
    rows = tune.tune_segment(index, lambda: [x])  # held-out rows, for comparison
    assert rows.probes == tune.NOISE_PROBES and rows.noise > 0


def test_the_user_s_queries_are_tuned_for_with_a_margin_for_their_sampling(monkeypatch):
    """Those queries are a sample of what users ask: the knob is set for the target plus
    ``SAMPLING_Z`` standard errors of the choosing queries' recall, never less deep than for
    the target alone; and a graph that reaches only the target itself is kept, not made exact."""
    index, x = _graph()
    queries = np.random.default_rng(2).normal(size=(300, x.shape[1])).astype(np.float32)

    def knob(z: float) -> int:
        monkeypatch.setattr(tune, "SAMPLING_Z", z)
        tuned = tune.tune(index, x[:0], lambda: [x], queries=queries)
        return int(tuned.params.split("=")[1]) if tuned.params else 10**9  # "": exact

    z = tune.SAMPLING_Z
    plain, margin, wide = knob(0.0), knob(z), knob(3.0)
    assert plain < margin < wide
    huge = knob(1e6)  # an aim of 1.0 no graph search reaches: the target alone is kept
    assert huge == plain


@pytest.mark.parametrize("shape", [(10, 16), (400,)])
def test_the_tuner_refuses_too_few_queries_or_a_flat_array(shape):
    index, x = _graph(1_000)
    with pytest.raises(ValueError, match="at least|2-D"):
        tune.tune(index, x[:0], lambda: [x], queries=np.ones(shape, np.float32))


QUERIES = [f"question {i} about topic {i % 13} and the word {i * 7 % 31}" for i in range(120)]


@pytest.fixture
def index_dir(tmp_path, model_dir):
    from flowsearch import build_index

    root = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=400), root, model=str(model_dir),
                calibration="none", lexical=False, ann=SMALL)  # fmt: skip
    return root


def test_compact_retunes_every_graph_on_the_queries_and_info_says_so(index_dir):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info
    from flowsearch.writes.compact import compact

    before = mf.read(index_dir)
    assert before.segments[0].ann.tuning.probes == "noise"
    result = compact(index_dir, tune_queries=QUERIES + QUERIES[:5] + ["  "])  # repeats, blank
    assert result.n_retuned == 1 and result.version == before.version + 1
    seg = mf.read(index_dir).segments[0]
    assert seg.files == before.segments[0].files  # re-tuned, nothing rebuilt
    tuning = seg.ann.tuning
    assert tuning.probes == "queries" and tuning.queries == 40 and tuning.noise == 0.0
    assert tuning.tuner == tune.TUNER_VERSION
    text = dict(_info_rows(index_info(index_dir)))["vector index recall"]
    assert "of your queries" in text and "noise" not in text
    # a later compact without queries leaves the tuning the user's queries made
    again = compact(index_dir)
    assert again.n_retuned == 0 and again.version == result.version
    assert mf.read(index_dir).segments[0].ann.tuning == tuning


def test_a_merge_in_the_same_compact_is_tuned_on_the_queries(tmp_path, model_dir):
    from flowsearch import build_index, upsert
    from flowsearch.writes.compact import compact

    root = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=150), root, model=str(model_dir),
                calibration="none", lexical=False, ann=SMALL)  # fmt: skip
    rows = [{"id": f"n{i}", "text": f"a new row number {i}"} for i in range(150)]
    upsert(root, rows, ann=SMALL, merge_segments=False)
    assert len(mf.read(root).segments) == 2
    result = compact(root, full=True, ann=SMALL, tune_queries=QUERIES)
    assert result.n_merged == 2 and result.n_retuned == 0  # tuned once, by the merge
    (seg,) = mf.read(root).segments
    assert seg.ann.factory == "HNSW32" and seg.ann.tuning.probes == "queries"


@pytest.mark.parametrize(
    "queries, words",
    [
        ("one query", "must be a list of query texts"),
        ([1, 2, 3], "tune_queries[0] must be a string"),
        (QUERIES[:30], "30 distinct queries, too few"),
        (["same"] * 200, "1 distinct queries, too few"),
    ],
)
def test_bad_queries_are_refused_and_nothing_is_written(index_dir, queries, words):
    from flowsearch.writes.compact import compact

    before = mf.read(index_dir)
    with pytest.raises(BadInput) as err:
        compact(index_dir, tune_queries=queries)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert mf.read(index_dir) == before


def test_an_index_whose_factory_the_user_chose_or_whose_model_is_gone_refuses(tmp_path, model_dir):
    import shutil

    from flowsearch import build_index
    from flowsearch.writes.compact import compact

    flat = tmp_path / "flat"
    build_index(write_corpus(tmp_path / "c.parquet", n=60), flat, model=str(model_dir),
                calibration="none", lexical=False, index_factory="Flat")  # fmt: skip
    with pytest.raises(BadInput, match="never tuned: tune_queries has nothing to tune"):
        compact(flat, tune_queries=QUERIES)
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    moved = tmp_path / "moved"
    build_index(write_corpus(tmp_path / "c.parquet", n=400), moved, model=str(model),
                calibration="none", lexical=False, ann=SMALL)  # fmt: skip
    shutil.rmtree(model)
    before = mf.read(moved)
    with pytest.raises(BadInput, match="needs the index's encoder") as err:
        compact(moved, tune_queries=QUERIES)
    assert "\n" not in str(err.value) and mf.read(moved) == before


def test_a_long_log_is_sampled_to_the_most_a_tuning_embeds(monkeypatch):
    from flowsearch.writes import compact as compact_mod

    monkeypatch.setattr(compact_mod, "MAX_USER_QUERIES", 100)
    kept = compact_mod.checked_queries(QUERIES + [f"more {i}" for i in range(500)])
    assert len(kept) == 100 and len(set(kept)) == 100
    assert kept == compact_mod.checked_queries(QUERIES + [f"more {i}" for i in range(500)])


def test_the_command_line_reads_a_queries_file(index_dir, tmp_path):
    from flowsearch.cli import app

    path = tmp_path / "queries.txt"
    path.write_text("\n".join(QUERIES) + "\n\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["compact", "--index", str(index_dir), "--tune-queries", str(path)])
    assert result.exit_code == 0, result.output
    assert "re-tuned 1 segment on your queries" in result.output
    assert mf.read(index_dir).segments[0].ann.tuning.probes == "queries"
    missing = runner.invoke(
        app, ["compact", "--index", str(index_dir), "--tune-queries", str(tmp_path / "no.txt")]
    )
    assert missing.exit_code == 2 and "cannot read the queries file" in missing.output
    assert "Traceback" not in missing.output
    short = tmp_path / "short.txt"
    short.write_text("one\ntwo\n", encoding="utf-8")
    few = runner.invoke(app, ["compact", "--index", str(index_dir), "--tune-queries", str(short)])
    assert few.exit_code == 2 and "too few" in few.output
