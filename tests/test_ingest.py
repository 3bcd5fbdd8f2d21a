"""build_index / add_to_index: what lands on disk, calibration choices, refusals, atomicity."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import (
    model_dir_fixture,  # noqa: F401 - the `model_dir` fixture
    siblings,
    write_corpus,
)

from flowsearch import ingest, store
from flowsearch.errors import FlowsearchError
from flowsearch.ingest import add_to_index, build_index
from flowsearch.searcher import Searcher
from flowsearch.space import DRIFT_WARN_STD, drift_report

MANIFEST_KEYS = {
    "format", "format_version", "flowsearch_version", "created", "updated", "encoder", "dim",
    "calibration", "density", "index", "columns", "rows", "skipped", "next_auto_id", "shards",
    "additions", "files",
}  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "c.parquet", n=120)


@pytest.fixture(scope="module")
def built(tmp_path_factory, model_dir, corpus):
    out = tmp_path_factory.mktemp("built") / "idx"
    summary = build_index(corpus, out, model=str(model_dir))
    return out, summary


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def test_build_writes_a_complete_index(built, model_dir):
    out, summary = built
    m = _manifest(out)
    assert set(m) >= MANIFEST_KEYS
    assert m["rows"] == summary["rows"] == 120 and m["skipped"] == 0
    assert m["encoder"]["model"] == str(model_dir) and m["encoder"]["dim"] == 32
    assert m["encoder"]["pooling"] == "mean" and m["encoder"]["revision"]
    assert m["columns"] == {"text": "text", "id": "id", "id_type": "string",
                            "metadata": ["topic", "year"]}  # fmt: skip
    cal = m["calibration"]
    assert cal["name"] == "auto" and cal["calibrator"] == "whitening-flow"
    # a random BERT's mean-pooled vectors are a narrow cone: auto must search the flow's space
    assert cal["anisotropy"]["mean_cosine"] > 0.5 and cal["auto_decision"] is True
    assert cal["space"] == "calibrated" and "flow" in cal["decision"]
    assert m["density"]["std_log_prob"] > 0 and np.isfinite(m["density"]["mean_log_prob"])
    assert m["index"] == {"factory": "Flat", "requested": "auto", "params": ""}
    files = set(m["files"])
    assert {"index.faiss", "calibrator/config.json", "calibrator/weights.safetensors"} <= files
    assert "shards/part-00000.parquet" in files
    store.verify_files(out, m, checksums=True)
    assert summary["bytes"] > 0 and summary["seconds"]["encode"] > 0
    assert siblings(out) == []


def test_stored_vectors_are_the_normalised_calibrated_raw_vectors(built):
    out, _ = built
    s = Searcher.open(out)
    reader = store.RowReader(out, s.manifest["shards"])
    vec, raw = reader.column("vector"), reader.column("raw")
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, atol=1e-5)
    Z = s.calibrator.transform(raw)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    # raw is stored as float16, so recomputing from it is close, not exact
    assert np.mean(np.sum(Z * vec, axis=1)) > 0.99
    schema = pq.read_schema(out / s.manifest["shards"][0]["path"])
    assert schema.field("vector").type == pa.list_(pa.float32(), 32)
    assert schema.field("raw").type == pa.list_(pa.float16(), 32)


def test_auto_keeps_encoder_space_when_isotropic(tmp_path, model_dir, corpus, monkeypatch):
    from flowsearch.calibration import anisotropy

    monkeypatch.setattr(anisotropy, "should_calibrate", lambda stats: False)
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), fit_sample=50)
    m = _manifest(out)
    assert m["calibration"]["space"] == "encoder" and m["calibration"]["auto_decision"] is False
    assert m["calibration"]["fit_rows"] == 50 and m["density"] is not None  # flow still fitted
    reader = store.RowReader(out, m["shards"])
    raw = reader.column("raw")
    np.testing.assert_allclose(
        reader.column("vector"), raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=2e-3
    )


def test_named_calibration_and_reused_calibrator(tmp_path, model_dir, corpus, built):
    out = tmp_path / "white"
    build_index(corpus, out, model=str(model_dir), calibration="whitening", id_column="id")
    m = _manifest(out)
    assert m["calibration"]["calibrator"] == "whitening" and m["density"] is None
    reuse = tmp_path / "reuse"
    src = built[0] / "calibrator"
    build_index(corpus, reuse, model=str(model_dir), calibrator=src)
    m2 = _manifest(reuse)
    assert m2["calibration"]["fitted_on"] == str(src.resolve())
    assert m2["calibration"]["space"] == "calibrated"
    original = _manifest(built[0])["files"]["calibrator/weights.safetensors"]["sha256"]
    assert m2["files"]["calibrator/weights.safetensors"]["sha256"] == original
    with pytest.raises(FlowsearchError, match="contradicts"):
        build_index(corpus, tmp_path / "x", model=str(model_dir), calibrator=src,
                    calibration="whitening")  # fmt: skip
    assert not (tmp_path / "x").exists()


def test_row_number_ids_directory_input_and_small_shards(tmp_path, model_dir, monkeypatch):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(2):
        table = pq.read_table(write_corpus(tmp_path / f"c{i}.parquet", n=30, seed=i))
        table = table.drop_columns(["id"]).rename_columns(["body", "topic", "year"])
        pq.write_table(table, folder / f"part{i}.parquet")
    monkeypatch.setattr(store, "SHARD_ROWS", 25)
    out = tmp_path / "idx"
    build_index(folder, out, model=str(model_dir), text_column="body")
    m = _manifest(out)
    assert m["columns"]["id"] is None and m["columns"]["id_type"] == "int"
    assert [s["rows"] for s in m["shards"]] == [25, 25, 10]
    s = Searcher.open(out)
    second = pq.read_table(folder / "part1.parquet").column("body").to_pylist()
    hit = s.search(second[4], k=1)[0]
    assert (hit.id, hit.text, hit.metadata["year"]) == (34, second[4], 1994)


def test_glob_input(tmp_path, model_dir):
    write_corpus(tmp_path / "a1.parquet", n=20, seed=1, id_prefix="a")
    write_corpus(tmp_path / "a2.parquet", n=20, seed=2, id_prefix="b")
    summary = build_index(str(tmp_path / "a*.parquet"), tmp_path / "idx", model=str(model_dir))
    assert summary["rows"] == 40


def _bad_corpora(tmp_path):
    good = write_corpus(tmp_path / "good.parquet", n=10)
    not_parquet = tmp_path / "notes.parquet"
    not_parquet.write_text("id,text\n1,hello\n")
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
                   empty)  # fmt: skip
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "a", "c", "c"], "text": ["x y"] * 5}), dup)
    blank = tmp_path / "blank.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["cat", None, "  "]}), blank)
    reserved = tmp_path / "reserved.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["cat"], "vector": [1.0]}), reserved)
    return {
        "missing": (tmp_path / "nope.parquet", {}, "corpus not found"),
        "not parquet": (not_parquet, {}, "not a Parquet file"),
        "text column": (good, {"text_column": "body"}, r"columns: id, text, topic, year"),
        "empty": (empty, {}, "has no rows"),
        "duplicates": (dup, {}, "2 id\\(s\\) occur more than once"),
        "strict blanks": (blank, {"strict": True}, "2 row\\(s\\) have a null or blank"),
        "reserved": (reserved, {}, "clash"),
        "bad factory": (good, {"index_factory": "Bogus77"}, "rejects index factory"),
    }


@pytest.mark.parametrize(
    "case",
    ["missing", "not parquet", "text column", "empty", "duplicates", "strict blanks", "reserved",
     "bad factory"],
)  # fmt: skip
def test_bad_input_writes_nothing(tmp_path, model_dir, case):
    path, kwargs, message = _bad_corpora(tmp_path)[case]
    out = tmp_path / "out" / "idx"
    with pytest.raises(FlowsearchError, match=message) as info:
        build_index(path, out, model=str(model_dir), **kwargs)
    assert "\n" not in str(info.value)
    assert not out.exists() and (not out.parent.exists() or siblings(out) == [])


def test_blank_texts_are_skipped_and_counted(tmp_path, model_dir):
    path = tmp_path / "blank.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "text": ["cat", None, "  ", "dog"]}), path)
    summary = build_index(path, tmp_path / "idx", model=str(model_dir), calibration="none")
    assert (summary["rows"], summary["skipped"]) == (2, 2)
    hits = Searcher.open(tmp_path / "idx").search("dog", k=5)
    assert sorted(h.id for h in hits) == ["a", "d"]


def test_existing_targets_are_refused(tmp_path, model_dir, corpus, built):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(FlowsearchError, match="not a flowsearch index"):
        build_index(corpus, other, model=str(model_dir), overwrite=True)
    assert (other / "precious.txt").read_text() == "keep me"
    before = (built[0] / "manifest.json").read_text()
    with pytest.raises(FlowsearchError, match="--overwrite"):
        build_index(corpus, built[0], model=str(model_dir))
    assert (built[0] / "manifest.json").read_text() == before


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_crash_mid_build_leaves_previous_index(tmp_path, model_dir, corpus, monkeypatch, exc):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def boom(*args, **kwargs):
        raise exc

    monkeypatch.setattr(ingest.fx, "build_index", boom)  # after shards and calibrator are written
    with pytest.raises(type(exc)):
        build_index(corpus, out, model=str(model_dir), overwrite=True)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and siblings(out) == []
    assert len(Searcher.open(out, verify=True).search("the cat", k=3)) == 3


def test_overwrite_replaces(tmp_path, model_dir, corpus):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    small = write_corpus(tmp_path / "small.parquet", n=15, seed=9)
    build_index(small, out, model=str(model_dir), calibration="none", overwrite=True)
    assert _manifest(out)["rows"] == 15 and siblings(out) == []


def test_add_appends_rows_and_reports_drift(tmp_path, model_dir, corpus):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir))
    first = _manifest(out)
    extra = write_corpus(tmp_path / "extra.parquet", n=20, seed=5, id_prefix="new")
    summary = add_to_index(extra, out)
    m = _manifest(out)
    assert m["rows"] == 140 and summary["added"] == 20
    assert [s["path"] for s in m["shards"]] == [
        "shards/part-00000.parquet", "shards/part-00001.parquet"]  # fmt: skip
    assert m["files"]["shards/part-00000.parquet"] == first["files"]["shards/part-00000.parquet"]
    assert m["files"]["index.faiss"] != first["files"]["index.faiss"]
    drift = summary["drift"]
    assert set(drift) == {"mean_log_prob", "corpus_mean_log_prob", "gap_std",
                          "share_below_p01", "reliable", "warn"}  # fmt: skip
    assert m["additions"][0]["rows"] == 20 and m["updated"]
    s = Searcher.open(out, verify=True)
    text = pq.read_table(extra).column("text")[3].as_py()
    assert s.search(text, k=1)[0].id == "new3"
    # ids already in the index are refused and nothing changes
    before = (out / "manifest.json").read_text()
    with pytest.raises(FlowsearchError, match="20 id\\(s\\) are already in the index"):
        add_to_index(extra, out)
    assert (out / "manifest.json").read_text() == before and siblings(out) == []


def test_drift_report_threshold():
    corpus = {"mean_log_prob": 100.0, "std_log_prob": 10.0, "p01": 75.0}
    near = drift_report(np.array([95.0, 99.0, 104.0]), corpus)
    assert not near["warn"] and near["gap_std"] == pytest.approx(0.06666, abs=1e-3)
    far = drift_report(np.array([70.0, 80.0, 88.0]), corpus)
    assert far["warn"] and far["gap_std"] >= DRIFT_WARN_STD
    assert far["share_below_p01"] == pytest.approx(1 / 3)


def test_add_warns_on_drift(tmp_path, model_dir, corpus, monkeypatch, caplog):
    from flowsearch import space as drift

    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir))
    monkeypatch.setattr(drift, "DRIFT_WARN_STD", -1e9)  # any gap counts as drift
    extra = write_corpus(tmp_path / "extra.parquet", n=5, seed=6, id_prefix="z")
    with caplog.at_level("WARNING", logger="flowsearch.ingest"):
        summary = add_to_index(extra, out)
    assert summary["drift"]["warn"] is True
    assert "out of distribution" in caplog.text and "--overwrite" in caplog.text
    assert _manifest(out)["additions"][-1]["drift"]["warn"] is True


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_build_killed_between_renames_gets_the_old_index_back(tmp_path, model_dir, corpus):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    before = _snapshot(out)
    # the state a kill between `target -> .old` and `new -> target` leaves: no target, the old
    # index aside under a dead process's name (and the finished new build in a .tmp)
    pid = _dead_pid()
    out.rename(tmp_path / f".idx.old-{pid}-0badf00d")
    (tmp_path / f".idx.tmp-{pid}-0badf00d").mkdir()
    with pytest.raises(FlowsearchError, match="rejects index factory"):
        build_index(corpus, out, model=str(model_dir), index_factory="Bogus7", overwrite=True)
    assert _snapshot(out) == before and siblings(out) == []
    assert len(Searcher.open(out, verify=True).search("the cat", k=3)) == 3
    # restored before the target is checked: without --overwrite it is not replaced
    out.rename(tmp_path / f".idx.old-{pid}-0badf00d")
    with pytest.raises(FlowsearchError, match="--overwrite"):
        build_index(corpus, out, model=str(model_dir), calibration="none")
    assert _snapshot(out) == before and siblings(out) == []


def test_searcher_open_restores_an_index_left_aside(tmp_path, model_dir, corpus):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    out.rename(tmp_path / f".idx.old-{_dead_pid()}-0badf00d")
    assert len(Searcher.open(out).search("the cat", k=2)) == 2 and siblings(out) == []


def test_bad_factory_fails_before_encoding(tmp_path, model_dir, corpus, monkeypatch):
    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded before the factory was checked")

    monkeypatch.setattr(ingest, "_encode_pass", no_encoding)
    out = tmp_path / "idx"
    for factory, message in [("PQ5", "multiple of"), ("IDMap,Flat", "IDMap"),
                             ("Nope3", "rejects index factory")]:  # fmt: skip
        with pytest.raises(FlowsearchError, match=message) as info:
            build_index(corpus, out, model=str(model_dir), index_factory=factory)
        assert "\n" not in str(info.value)
    assert not out.exists() and siblings(out) == []


def test_faiss_add_failure_is_a_user_error(tmp_path, model_dir, corpus, monkeypatch):
    monkeypatch.setattr(ingest.fx, "check_factory", lambda factory, dim: None)
    out = tmp_path / "idx"
    with pytest.raises(FlowsearchError, match="cannot add vectors"):
        build_index(
            corpus, out, model=str(model_dir), calibration="none", index_factory="IDMap,Flat"
        )
    assert not out.exists() and siblings(out) == []


def test_a_second_writer_fails_fast(tmp_path, model_dir, corpus):
    import fcntl

    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    before = _snapshot(out)
    extra = write_corpus(tmp_path / "extra.parquet", n=5, seed=5, id_prefix="new")
    with open(tmp_path / ".idx.lock", "w") as held:  # what a running writer holds
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(FlowsearchError, match="another flowsearch process is writing"):
            build_index(corpus, out, model=str(model_dir), calibration="none", overwrite=True)
        with pytest.raises(FlowsearchError, match="another flowsearch process is writing"):
            add_to_index(extra, out)
    (tmp_path / ".idx.lock").unlink()
    assert _snapshot(out) == before and siblings(out) == []
    assert add_to_index(extra, out)["added"] == 5 and siblings(out) == []


def test_relative_model_path_is_recorded_absolute(tmp_path, model_dir, corpus, monkeypatch):
    monkeypatch.chdir(model_dir.parent)
    build_index(corpus, tmp_path / "idx", model=model_dir.name, calibration="none")
    monkeypatch.chdir(tmp_path)
    enc = _manifest(tmp_path / "idx")["encoder"]
    assert enc["model"] == enc["source"] == str(model_dir.resolve())
    assert len(Searcher.open("idx").search("the cat", k=2)) == 2


def test_auto_keeps_encoder_space_for_too_few_rows(tmp_path, model_dir):
    """Anisotropic, but fewer than MIN_ROWS_PER_DIM rows per dimension: a calibrator fitted
    on so few rows overfits (measured on STS-B), so auto searches the encoder's space."""
    from flowsearch.space import MIN_ROWS_PER_DIM

    rows = MIN_ROWS_PER_DIM * 32 - 10
    path = write_corpus(tmp_path / "small.parquet", rows)
    build_index(path, tmp_path / "idx", model=str(model_dir))
    cal = _manifest(tmp_path / "idx")["calibration"]
    assert cal["anisotropy"]["mean_cosine"] > 0.5
    assert cal["auto_decision"] is False and cal["space"] == "encoder"
    assert f"{rows} rows < {MIN_ROWS_PER_DIM} x dim 32" in cal["decision"]


def test_drift_is_not_judged_on_a_flow_fitted_on_too_few_rows():
    corpus = {"mean_log_prob": 100.0, "std_log_prob": 1.0, "p01": 98.0}
    far = np.array([50.0, 60.0])
    assert drift_report(far, corpus)["warn"] is True
    small = drift_report(far, corpus, reliable=False)
    assert small["warn"] is False and small["reliable"] is False and small["gap_std"] > 30
