"""Searcher: hit lists, agreement with brute force, verification, refusals, threads, end to end."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from corpus_helpers import sentences, write_corpus

from flowsearch.encode.encoder import Encoder
from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Hit, Searcher
from flowsearch.search.version import index_info
from flowsearch.space.reference import reference_of
from flowsearch.storage import manifest as mf
from flowsearch.storage import rows as storage_rows
from flowsearch.storage.writer import open_writer
from flowsearch.writes.build import build_index

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("searcher")
    corpus = write_corpus(root / "c.parquet", n=150, seed=3)
    build_index(corpus, root / "idx", model=str(model_dir))
    return root / "idx"


@pytest.fixture(scope="module")
def searcher(index_dir):
    return Searcher.open(index_dir)


def test_hits_are_ranked_joined_and_typed(searcher, index_dir):
    corpus = pq.read_table(index_dir.parent / "c.parquet").to_pylist()
    hits = searcher.search(corpus[7]["text"], k=5)
    assert [h.rank for h in hits] == [1, 2, 3, 4, 5]
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))
    top = hits[0]
    assert isinstance(top, Hit) and top.id == "d7" and top.text == corpus[7]["text"]
    assert top.metadata == {"topic": corpus[7]["topic"], "year": corpus[7]["year"]}
    dense = searcher.search(corpus[7]["text"], k=5, mode="dense")[0]
    assert dense.id == "d7" and dense.score == pytest.approx(1.0, abs=1e-5)
    assert top.dense_score is not None and top.lexical_score is not None  # hybrid: both sides
    assert dense.lexical_score is None and dense.dense_score == pytest.approx(dense.score)
    # the query's log-density is in its report, once (not on every hit)
    report = searcher.query(corpus[7]["text"], k=5).report
    _, lp = searcher.embed([corpus[7]["text"]])
    assert report.log_density == pytest.approx(float(lp[0])) and np.isfinite(report.log_density)
    assert json.loads(json.dumps(top.to_dict()))["id"] == "d7"


def test_every_hit_is_marked_where_its_own_text_holds_the_querys_words(searcher):
    from flowsearch.lexical.tokens import term_spans, tokenize

    queries = sentences(2, seed=5)
    for query, hits in zip(queries, searcher.search(queries, k=6), strict=True):
        terms = tokenize(query)
        assert [h.marks for h in hits] == [term_spans(h.text, terms) for h in hits]
        assert len({tuple(h.marks) for h in hits}) > 1  # hits differ: each its own marks
        for h in hits:  # each mark a word whose term is the query's
            assert all(tokenize(h.text[a:b]) and set(tokenize(h.text[a:b])) <= set(terms)
                       for a, b in h.marks)  # fmt: skip


def test_batch_equals_singles_and_k_is_clamped(searcher):
    queries = sentences(4, seed=11)
    batch = searcher.search(queries, k=3)
    assert len(batch) == 4
    for q, hits in zip(queries, batch, strict=True):
        single = searcher.search(q, k=3)
        assert [h.id for h in single] == [h.id for h in hits] and len(hits) == 3
        np.testing.assert_allclose([h.score for h in single], [h.score for h in hits], rtol=1e-5)
    assert len(searcher.search("the cat", k=1000)) == 150
    assert searcher.search([], k=3) == []
    with pytest.raises(FlowsearchError, match="k must be"):
        searcher.search("the cat", k=0)
    with pytest.raises(FlowsearchError, match="strings"):
        searcher.search([1, 2], k=3)
    for empty in ("", "   ", ["the cat", "\t\n"]):
        with pytest.raises(FlowsearchError, match="query is empty"):
            searcher.search(empty, k=3)
    with pytest.raises(FlowsearchError, match="query is empty"):
        searcher.query(" ", k=3)


def test_search_vectors_and_brute_force_agree(searcher):
    queries = sentences(6, seed=12)
    Z, lp = searcher.embed(queries)
    assert lp is not None and lp.shape == (6,)
    # dense: the encoder's side alone (the default, hybrid, fuses it with BM25)
    by_text = searcher.search(queries, k=10, mode="dense")
    by_vec = searcher.search_vectors(Z, k=10)
    stored = searcher.vectors()
    brute = Z @ stored.T
    for i in range(len(queries)):
        order = np.argsort(-brute[i], kind="stable")[:10]
        ids = [f"d{j}" for j in order]
        assert [h.id for h in by_text[i]] == [h.id for h in by_vec[i]] == ids
        assert [h.score for h in by_text[i]] == [h.score for h in by_vec[i]]
        # the raw cosine is the dense score; the score is its place above the background
        np.testing.assert_allclose([h.dense_score for h in by_vec[i]], brute[i, order], rtol=1e-5)
        bg = searcher.version.fusion().dense_background
        want = np.clip((brute[i, order] - bg) / (1 - bg), 0, 1)
        np.testing.assert_allclose([h.score for h in by_vec[i]], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(FlowsearchError, match="dim"):
        searcher.search_vectors(np.ones((1, 5), np.float32))


def test_threads_get_the_same_answers(searcher):
    queries = sentences(24, seed=13)
    serial = [[h.id for h in searcher.search(q, k=5)] for q in queries]
    with ThreadPoolExecutor(max_workers=6) as pool:
        threaded = list(pool.map(lambda q: [h.id for h in searcher.search(q, k=5)], queries))
    assert threaded == serial


def test_verify_catches_corruption(tmp_path, index_dir):
    import shutil

    copy = tmp_path / "idx"
    shutil.copytree(index_dir, copy)
    m = mf.read(copy)
    Searcher.open(copy, verify=True)
    seg = copy / m.segments[0].dir
    shard = seg / m.segments[0].parts[0].path
    original = shard.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(FlowsearchError, match="checksum mismatch"):
        Searcher.open(copy, verify=True)
    with pytest.raises(FlowsearchError, match="checksum mismatch"):
        Searcher.open(copy)  # a small file: hashed on every open
    shard.write_bytes(bytes(data[:-1]))
    with pytest.raises(FlowsearchError, match="bytes"):
        Searcher.open(copy)
    shard.write_bytes(original)
    Searcher.open(copy, verify=True)
    (seg / "stray.txt").write_text("x")  # a stray: ignored by search, listed by verify
    assert len(Searcher.open(copy)) == len(Searcher.open(copy, verify=True))
    (seg / "stray.txt").unlink()
    (seg / m.segments[0].ann.path).unlink()
    with pytest.raises(FlowsearchError, match="missing"):
        Searcher.open(copy)


def test_mismatched_encoder_or_calibrator_is_refused(tmp_path, index_dir, model_dir):
    with pytest.raises(FlowsearchError, match="pooling"):
        Searcher.open(index_dir, encoder=Encoder(str(model_dir), pooling="cls"))
    copy = tmp_path / "idx"
    shutil.copytree(index_dir, copy)
    m = mf.read(copy)
    config = {**m.calibration.config, "depth": 99}
    with open_writer(copy) as writer:  # a version whose manifest names another calibrator
        writer.publish(kind="test", n_rows=0,
                       calibration=m.calibration.model_copy(update={"config": config}))  # fmt: skip
    with pytest.raises(FlowsearchError, match="calibrator"):
        Searcher.open(copy)
    with pytest.raises(FlowsearchError, match="no index"):
        Searcher.open(tmp_path / "nothing")


@pytest.mark.slow
def test_bundled_model_finds_the_right_passage(tmp_path):
    """End to end on the bundled all-MiniLM-L6-v2 and the shipped sample corpus (no timing:
    build and query times are measured in benchmarks/)."""
    corpus = REPO / "data" / "sample.parquet"
    queries = json.loads((REPO / "tests" / "sample_queries.json").read_text())
    build_index(corpus, tmp_path / "idx")
    searcher = Searcher.open(tmp_path / "idx", verify=True)
    for mode in ("dense", "lexical", "hybrid"):
        results = searcher.search([q["query"] for q in queries], k=3, mode=mode)
        misses = [
            (q["query"], q["expected_id"], [h.id for h in hits])
            for q, hits in zip(queries, results, strict=True)
            if not hits or hits[0].id != q["expected_id"]
        ]
        if mode == "lexical":  # BM25 alone may miss paraphrased questions; it must mostly hit
            assert len(misses) <= len(queries) // 3, misses
        else:
            assert misses == [], (mode, misses)
    assert len(queries) >= 5


@pytest.mark.parametrize("factory", ["IVF2,Flat", "HNSW8"])
def test_other_factories_are_built_and_searched(tmp_path, model_dir, factory):
    corpus = write_corpus(tmp_path / "c.parquet", n=90, seed=5)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), index_factory=factory)
    searcher = Searcher.open(tmp_path / "idx")
    assert [s.ann.factory for s in searcher.manifest.segments] == [factory]
    texts = pq.read_table(corpus).column("text").to_pylist()
    hits = searcher.search(texts[:5], k=3)
    assert [h[0].id for h in hits] == [f"d{i}" for i in range(5)]


def test_open_searcher_keeps_its_index_through_a_rebuild(tmp_path, model_dir, monkeypatch):
    corpus = write_corpus(tmp_path / "a.parquet", n=60, seed=11)
    table = pq.read_table(corpus)
    out = tmp_path / "idx"
    with monkeypatch.context() as patched:  # several parts
        patched.setattr(storage_rows, "PART_ROWS", 10)
        build_index(corpus, out, model=str(model_dir), calibration="none")
    s = Searcher.open(out)
    assert len(s.manifest.segments[0].parts) == 6 and s.manifest.version == 1
    assert s.refresh() is False  # nothing newer yet
    # rebuild the same directory twice from the same rows in reverse order: the second
    # rebuild deletes version 1's segment, whose files the open searcher still reads
    pq.write_table(table.take(list(range(59, -1, -1))), tmp_path / "b.parquet")
    for _ in range(2):
        build_index(tmp_path / "b.parquet", out, model=str(model_dir), calibration="none",
                    overwrite=True)  # fmt: skip
    assert sorted(p.name for p in (out / "segments").iterdir()) == ["s000002", "s000003"]
    ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
    for i in (0, 7, 25, 59):
        hit = s.search(texts[i], k=1, mode="dense")[0]
        assert (hit.id, hit.text) == (ids[i], texts[i]) and hit.score > 0.999
        assert s.vectors().shape == (60, 32)
    fresh = Searcher.open(out)
    assert fresh.manifest.version == 3
    assert [h.id for h in fresh.search(texts[7], k=5)] == [h.id for h in s.search(texts[7], k=5)]
    # the same rows, in another order: row numbers differ, ids and texts do not
    assert np.allclose(fresh.vectors()[::-1], s.vectors(), atol=1e-6)
    # refresh moves the old searcher to version 3 and reuses its encoder
    encoder = s.encoder
    assert s.refresh() is True and s.manifest.version == 3 and s.encoder is encoder
    assert np.array_equal(s.vectors(), fresh.vectors()) and s.refresh() is False


def test_numpy_integer_k(searcher):
    hits = searcher.search("the cat", k=np.int64(4))
    assert [h.rank for h in hits] == [1, 2, 3, 4]
    assert len(searcher.search_vectors(searcher.embed(["the dog"])[0], k=np.int32(2))[0]) == 2
    for bad in (True, 2.0, 0, np.int64(-1)):
        with pytest.raises(FlowsearchError, match="k must be a positive integer"):
            searcher.search("the cat", k=bad)


def test_embed_takes_one_flow_pass_when_it_can(searcher, monkeypatch):
    cal = searcher.space.calibrator
    assert searcher.manifest.calibration.calibrated and searcher.space.has_density
    U = searcher.encoder.encode(["the red car"], progress=False)
    Z_want = cal.transform(U)
    Z_want /= np.linalg.norm(Z_want, axis=1, keepdims=True)
    lp_want = cal.log_prob(U)

    def twice(*args, **kwargs):
        raise AssertionError("a second flow pass")

    monkeypatch.setattr(cal, "log_prob", twice)
    monkeypatch.setattr(cal, "transform", twice)
    Z, lp = searcher.embed(["the red car"])
    assert Z.dtype == np.float32 and lp.dtype == np.float64
    np.testing.assert_allclose(Z, Z_want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lp, lp_want, rtol=1e-6)


def test_index_on_gpu_is_searched_under_the_lock(index_dir, monkeypatch):
    from flowsearch.ann import io as ann_io

    held: list[bool] = []
    box: dict[str, Searcher] = {}

    class Moved:  # what faiss.index_cpu_to_all_gpus returns is not always named Gpu*
        def __init__(self, inner):
            self.inner, self.ntotal, self.d = inner, inner.ntotal, inner.d

        def search(self, q, k):
            held.append(box["s"]._backend.gpu_lock.locked())
            return self.inner.search(q, k)

    monkeypatch.setattr(ann_io, "num_gpus", lambda: 1)
    monkeypatch.setattr(ann_io, "to_gpu", Moved)
    box["s"] = Searcher.open(index_dir)
    assert len(box["s"].search("the cat", k=3)) == 3 and held == [True]
    cpu = Searcher.open(index_dir, gpu=False)
    assert len(cpu.search("the cat", k=3)) == 3 and held == [True]  # not moved, not searched


def test_open_encoder_takes_the_manifest_source_for_a_relative_model_name(index_dir):
    from flowsearch.encode.encoder import open_encoder

    spec = mf.read(index_dir).encoder
    assert spec.model == spec.source and Path(spec.source).is_absolute()
    old_style = spec.model_copy(update={"model": "tiny-bert"})  # a relative name, as older
    assert open_encoder(old_style.identity(), old_style.source).model_id == spec.source
    with pytest.raises(FlowsearchError, match="revision"):
        wrong = spec.model_copy(update={"revision": "0" * 40})
        open_encoder(wrong.identity(), spec.source)


def test_query_result_and_info(searcher, index_dir):
    result = searcher.query("the red car", k=4)
    assert result.query == "the red car" and [h.rank for h in result.hits] == [1, 2, 3, 4]
    assert [h.id for h in result.hits] == [h.id for h in searcher.search("the red car", k=4)]
    report = result.report
    m = searcher.manifest
    ref = reference_of(m)  # 150 rows hold none out: every row against the others
    assert ref is not None and ref.method == "leave-one-out" and ref.n_measured == 150
    assert report.log_density == pytest.approx(float(searcher.embed(["the red car"])[1][0]))
    assert report.verdict != "not judged" and report.reason is None
    assert report.percentile == pytest.approx(ref.percentile(report.top_score), abs=0.05)
    doc = json.loads(json.dumps(result.to_dict()))
    assert set(doc) == {"query", "hits", "report"} and doc["report"]["verdict"] == report.verdict
    info = searcher.info()
    assert info.manifest == m and info.path == str(index_dir.resolve())
    files = [*m.calibration.files.values(), *(r for s in m.segments for r in s.files.values())]
    assert info.bytes["total"] == sum(r.bytes for r in files)
    # verified: those files and the reference sample that drift judges new rows against
    assert len(m.reference.sample.files) == 1
    files += list(m.reference.sample.files.values())
    assert info.verified.n_files == len(files)
    cold = index_info(index_dir, verify=True)  # no model load
    assert cold.manifest == m and cold.verified.n_hashed == len(files)
    assert cold.to_dict() == info.to_dict() | {"verified": cold.verified.to_dict()}


def test_a_moved_model_is_found_with_model(tmp_path, model_dir):
    """An index records a local model's absolute path; moved, it opens with model=."""
    first = tmp_path / "models" / "bert"
    shutil.copytree(model_dir, first)
    corpus = write_corpus(tmp_path / "c.parquet", n=20, seed=8)
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(first), calibration="none")
    want = [h.id for h in Searcher.open(out).search("the cat", k=3)]
    moved = first.rename(tmp_path / "elsewhere")
    with pytest.raises(FlowsearchError, match="pass model="):
        Searcher.open(out)
    s = Searcher.open(out, model=moved)
    assert [h.id for h in s.search("the cat", k=3)] == want
    other = tmp_path / "other"
    shutil.copytree(moved, other)
    (other / "config.json").write_text((other / "config.json").read_text().replace("0.02", "0.03"))
    with pytest.raises(FlowsearchError, match="revision"):
        Searcher.open(out, model=other)  # not the same model: refused


def test_several_segments_answer_as_one_compacted_segment(tmp_path, model_dir):
    """Search fans out over segments: dense (exact Flat), lexical (BM25 with corpus-wide
    statistics over live rows) and hybrid give what one segment holding the same live rows
    gives, so scores do not depend on how the corpus is cut."""
    from flowsearch.writes.compact import compact
    from flowsearch.writes.delete import delete
    from flowsearch.writes.upsert import add_to_index, upsert

    out = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=50, seed=21), out, model=str(model_dir),
                calibration="none")  # fmt: skip
    add_to_index(out, write_corpus(tmp_path / "a.parquet", n=10, seed=22, id_prefix="a"))
    texts = sentences(5, seed=23)
    upsert(out, [{"id": i, "text": t} for i, t in zip(["d1", "d2", "a3", "n1", "n2"], texts)])
    delete(out, ["d4", "a5", "n1", "d40"])
    split = Searcher.open(out)
    assert len(split.manifest.segments) == 3 and split.manifest.n_deleted == 7
    compact(out, full=True)
    whole = Searcher.open(out, encoder=split.encoder)
    assert len(whole.manifest.segments) == 1 and len(whole) == len(split) == 58
    queries = [*sentences(6, seed=24), texts[0], "cat dog"]
    for mode in ("dense", "lexical", "hybrid"):
        for k in (1, 10, 58):
            a = split.search(queries, k=k, mode=mode)
            b = whole.search(queries, k=k, mode=mode)
            for q, x, y in zip(queries, a, b, strict=True):
                assert [h.id for h in x] == [h.id for h in y], (mode, k, q)
                np.testing.assert_allclose([h.score for h in x], [h.score for h in y], rtol=1e-5)
                assert [h.text for h in x] == [h.text for h in y]
    every = {h.id for h in split.search("the", k=1000, mode="dense")}
    assert len(every) == 58 and not {"d4", "a5", "n1", "d40"} & every
    assert split.search(texts[0], k=1, mode="dense")[0].id == "d1"  # its new text


def test_a_hit_made_unchecked_is_the_validated_hit():
    """``Hit.of`` (what a search builds its hits with) makes the model validation makes: equal,
    the same JSON, the same fields set, still frozen."""
    import pydantic

    from flowsearch.search.results import Highlight, Hit

    values = dict(id="a", score=0.5, rank=1, text="t", metadata={"y": 1}, dense_score=0.25,
                  lexical_score=None, highlight=Highlight(start=0, end=1, text="t"))  # fmt: skip
    fast, checked = Hit.of(**values), Hit(**values)
    assert fast == checked and fast.to_dict() == checked.to_dict() and repr(fast) == repr(checked)
    assert fast.model_fields_set == checked.model_fields_set
    # every field is there, the ones not given at their defaults (a new field must not be missed)
    assert set(vars(fast)) == set(Hit.model_fields) and list(vars(fast)) == list(Hit.model_fields)
    assert (
        fast.rerank_score is None and fast.marks == [] and fast.marks is not Hit.of(**values).marks
    )
    assert fast.model_copy(update={"rank": 2}).rank == 2
    with pytest.raises(pydantic.ValidationError):
        fast.rank = 3  # type: ignore[misc]
