"""add_to_index: appended rows, linked parts, drift reports, refusals."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from corpus_helpers import segment_dirs, siblings, write_corpus

from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.space.drift import DriftReport
from flowsearch.space.reference import reference_of
from flowsearch.storage import history
from flowsearch.storage import manifest as mf
from flowsearch.storage.verify import verify
from flowsearch.writes.build import build_index
from flowsearch.writes.upsert import add_to_index


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "c.parquet", n=120)


def _snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def _current(path):
    """The snapshot without the previous version's reference sample pieces (the next writer's
    start removes what the current version does not reference, as it does segments a merge
    left)."""
    sample = mf.read(path).reference.sample
    kept = [piece.path for piece in sample.pieces]  # base and deltas
    return {
        p: b
        for p, b in _snapshot(path).items()
        if p.parts[0] != "references" or any(p.as_posix().startswith(k + "/") for k in kept)
    }


def test_add_appends_rows_and_reports_drift(tmp_path, model_dir, corpus):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir))
    first = mf.read(out)
    extra = write_corpus(tmp_path / "extra.parquet", n=20, seed=5, id_prefix="new")
    summary = add_to_index(out, extra)
    m = mf.read(out)
    assert m.n_rows == 140 and summary["added"] == 20 and summary["rows"] == 140
    assert m.version == 2 and summary["version"] == 2
    assert [(s.name, s.n_rows) for s in m.segments] == [("s000001", 120), ("s000002", 20)]
    # the build's segment and the calibrator are the same files, not copied or rewritten
    assert m.segments[0] == first.segments[0] and m.calibration == first.calibration
    assert (m.encoder, m.density, m.columns, m.schema_) == (
        first.encoder, first.density, first.columns, first.schema_)  # fmt: skip
    drift = summary["drift"]  # each new row's best score against the 120 rows held before
    assert set(drift) == set(DriftReport.model_fields) and drift["n_judged"] == 20
    Z = Searcher.open(out).vectors()
    best = (Z[120:] @ Z[:120].T).max(axis=1)
    assert drift["median_score"] == pytest.approx(float(np.median(best)), abs=1e-5)
    ref = reference_of(first)  # 120 rows hold none out: leave-one-out over all of them
    assert ref.method == "leave-one-out" and ref.n_measured == 120
    assert drift["median_percentile"] == pytest.approx(np.median(ref.percentiles(best)), abs=0.1)
    assert drift["reference_log_density"] == ref.log_density_median  # 120 >= 3 x dim 32
    records = history.read(out)
    assert [(r.version, r.kind, r.n_rows) for r in records] == [(1, "build", 120), (2, "add", 20)]
    assert records[-1].detail["drift"] == drift and m.updated == records[-1].time
    verify(out, m, checksums=True)
    s = Searcher.open(out, verify=True)
    text = pq.read_table(extra).column("text")[3].as_py()
    assert s.search(text, k=1)[0].id == "new3"
    # ids already in the index are refused and nothing changes
    before = _current(out)
    with pytest.raises(FlowsearchError, match="20 id\\(s\\) are already in the index"):
        add_to_index(out, extra)
    assert _snapshot(out) == before and siblings(out) == []
    more = write_corpus(tmp_path / "more.parquet", n=5, seed=7, id_prefix="more")
    add_to_index(out, more)
    assert segment_dirs(out) == ["s000001", "s000002", "s000003"] and siblings(out) == []
    m3 = mf.read(out)
    assert m3.n_rows == 145 and [r.n_rows for r in history.read(out)] == [120, 20, 5]
    assert [h.id for h in s.search(text, k=1)] == ["new3"]  # the open searcher still answers
    assert Searcher.open(out, verify=True).search(text, k=1)[0].id == "new3"


def test_add_to_a_missing_index_creates_nothing(tmp_path, corpus):
    with pytest.raises(FlowsearchError, match="no index"):
        add_to_index(corpus, tmp_path / "idx")
    assert not (tmp_path / "idx").exists()


def test_add_warns_on_drift(tmp_path, model_dir, corpus, caplog, monkeypatch):
    from flowsearch.space import drift

    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir))
    extra = write_corpus(tmp_path / "extra.parquet", n=5, seed=6, id_prefix="z")
    monkeypatch.setattr(drift, "DRIFT_APART_PERCENTILE", 101.0)  # any batch is apart
    with caplog.at_level("WARNING", logger="flowsearch.writes.upsert"):
        summary = add_to_index(out, extra)
    assert summary["drift"]["warn"] is True and summary.drift.warn
    assert "sit apart from the corpus" in caplog.text and "recalibrate" in caplog.text
    assert "--" not in caplog.text  # the library names no CLI flags
    assert history.read(out)[-1].detail["drift"]["warn"] is True


def test_write_result_counts_are_named_n_(tmp_path, model_dir, corpus):
    """A write's JSON (library ``to_dict``, ``--json``, HTTP) names every count ``n_*`` (the
    vocabulary of docs/ARCHITECTURE.md); the older names still read through ``result[key]``."""
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir))
    extra = write_corpus(tmp_path / "extra.parquet", n=5, seed=5, id_prefix="new")
    result = add_to_index(out, extra)
    doc = result.to_dict()
    not_counts = {"version", "dim", "bytes", "bytes_freed"}  # a number, sizes in bytes
    counts = {k for k, v in doc.items() if isinstance(v, int) and k not in not_counts}
    assert counts and all(k.startswith("n_") for k in counts), sorted(counts)
    assert (doc["n_segments"], doc["n_merged"], doc["n_written"]) == (2, 0, 5)
    assert (result["segments"], result["merged"]) == (2, 0)  # the third release's first names


def test_a_string_index_takes_integer_ids_from_one_file_or_several(tmp_path, model_dir, corpus):
    """The documented rule (a string index takes integers as their decimal text) holds for a
    write of several files too: a directory whose files hold integer ids in one and string ids
    in the next was refused, though each file alone was taken. 7 and "7" are one id."""
    from flowsearch.writes.upsert import upsert

    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir))
    files = tmp_path / "new"
    files.mkdir()
    (files / "a.jsonl").write_text('{"id": 7001, "text": "the cat sat on the mat"}\n')
    (files / "b.jsonl").write_text('{"id": "s7002", "text": "the dog ran in the park"}\n')
    result = upsert(out, files)
    assert (result.n_inserted, result.n_live) == (2, 122)
    hits = Searcher.open(out).search("the cat", k=200, where="id IN ('7001', 's7002')")
    assert sorted(h.id for h in hits) == ["7001", "s7002"]
    (files / "c.jsonl").write_text('{"id": "7001", "text": "the same id again"}\n')
    before = (out / mf.MANIFEST_NAME).read_text()
    with pytest.raises(FlowsearchError, match=r"1 id\(s\) occur more than once .*'7001'"):
        upsert(out, files)
    assert (out / mf.MANIFEST_NAME).read_text() == before
    with pytest.raises(FlowsearchError, match="integers in .*a.jsonl but strings in"):
        build_index(files, tmp_path / "fresh", model=str(model_dir))  # a build picks no type
