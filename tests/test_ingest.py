"""build_index: what lands on disk, calibration choices, refusals, atomicity."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import segment_dirs, siblings, write_corpus

from flowsearch.errors import FlowsearchError
from flowsearch.search.searcher import Searcher
from flowsearch.space.reference import MIN_ROWS_PER_DIM
from flowsearch.storage import manifest as mf
from flowsearch.storage import rows as storage_rows
from flowsearch.storage.rows import RowReader
from flowsearch.storage.verify import verify
from flowsearch.writes import build as build_module
from flowsearch.writes import segments as segment_writes
from flowsearch.writes.build import build_index
from flowsearch.writes.upsert import add_to_index


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "c.parquet", n=120)


@pytest.fixture(scope="module")
def built(tmp_path_factory, model_dir, corpus):
    out = tmp_path_factory.mktemp("built") / "idx"
    summary = build_index(corpus, out, model=str(model_dir))
    return out, summary


def test_build_writes_a_complete_index(built, model_dir):
    out, summary = built
    m = mf.read(out)
    assert (m.version, m.format_version) == (1, mf.FORMAT_VERSION)
    assert sorted(p.name for p in out.iterdir()) == [
        ".lock", "calibrators", "history.jsonl", "manifest.json", "references",
        "segments"]  # fmt: skip
    assert segment_dirs(out) == ["s000001"] and siblings(out) == []
    assert m.n_rows == m.n_live == summary["rows"] == 120 and m.skipped == m.n_deleted == 0
    assert m.next_auto_id == 120 and m.last_write.kind == "build" and m.created
    assert m.updated is None
    assert m.encoder.model == m.encoder.source == str(model_dir) and m.encoder.dim == m.dim == 32
    assert m.encoder.pooling == "mean" and m.encoder.revision
    assert m.columns == mf.Columns(text="text", id="id", id_type="string")
    assert [(c.name, c.type) for c in m.schema_] == [("topic", "string"), ("year", "int32")]
    cal = m.calibration
    assert cal.name == "auto" and cal.calibrator == "gaussian" and cal.fit_rows == 120
    # a random BERT's mean-pooled vectors are a narrow cone, and 120 rows >= 3 x dim 32:
    # auto must search the partially whitened space of its Gaussian (issue 16)
    assert cal.anisotropy["mean_cosine"] > 0.5 and cal.auto is not None
    assert cal.auto.calibrated is True and cal.calibrated and cal.config["power"] == 0.25
    assert cal.space == "calibrated" and "gaussian space" in cal.decision
    assert m.density is not None and m.density.n_rows == 120
    assert m.density.std_log_prob > 0 and np.isfinite(m.density.mean_log_prob)
    (seg,) = m.segments
    assert m.ann_requested == "auto" and seg.ann == mf.AnnRecord(path="ann.faiss", factory="Flat")
    assert seg.parts == (mf.PartRecord(path="rows-00000.parquet", n_rows=120),)
    folder = out / seg.dir
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(seg.files) == on_disk  # every file recorded, nothing else (no scratch left)
    assert {"ann.faiss", "rows-00000.parquet", "keys.npy", "key_rows.npy",
            "postings/vocab.json"} <= on_disk  # fmt: skip
    cal_files = {p.name for p in (out / m.calibration.path).iterdir()}
    assert cal_files == set(m.calibration.files) == {"config.json", "weights.safetensors"}
    checked = verify(out, m, checksums=True)
    assert set(m.reference.sample.files) == {"sample.npz"}  # the reference sample
    assert checked.n_hashed == checked.n_files == len(on_disk) + 2 + 1
    assert checked.history_records == 1
    assert summary["version"] == 1 and summary["space"] == "calibrated"
    total = sum(r.bytes for r in seg.files.values()) + sum(
        r.bytes for r in m.calibration.files.values())  # fmt: skip
    assert summary["bytes"] == total


def test_stored_vectors_are_the_normalised_calibrated_raw_vectors(built):
    out, _ = built
    s = Searcher.open(out)
    m = s.manifest
    (seg,) = m.segments
    reader = RowReader(out / seg.dir, seg.parts)
    vec, raw = reader.vectors("vector"), reader.vectors("raw")
    np.testing.assert_allclose(np.linalg.norm(vec, axis=1), 1.0, atol=1e-5)
    Z = s.space.calibrator.transform(raw)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    # raw is stored as float16, so recomputing from it is close, not exact
    assert np.mean(np.sum(Z * vec, axis=1)) > 0.99
    # ... and the raw vectors themselves would not do (the calibrated space differs)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    assert np.mean(np.sum(unit * vec, axis=1)) < 0.9
    schema = pq.read_schema(out / seg.dir / seg.parts[0].path)
    assert schema.field("vector").type == pa.list_(pa.float32(), 32)
    assert schema.field("raw").type == pa.list_(pa.float16(), 32)


def test_auto_keeps_encoder_space_when_isotropic(tmp_path, model_dir, corpus, monkeypatch):
    from flowsearch.space import fitting

    monkeypatch.setattr(fitting, "should_calibrate", lambda stats: False)
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), fit_sample=50)
    m = mf.read(out)
    assert m.calibration.space == "encoder" and not m.calibration.calibrated
    assert m.calibration.auto is not None and m.calibration.auto.calibrated is False
    assert m.calibration.fit_rows == 50 and m.density is not None  # flow still fitted
    (seg,) = m.segments
    reader = RowReader(out / seg.dir, seg.parts)
    raw = reader.vectors("raw")
    np.testing.assert_allclose(
        reader.vectors("vector"), raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=2e-3
    )


def test_named_calibration_and_reused_calibrator(tmp_path, model_dir, corpus, built):
    out = tmp_path / "white"
    build_index(corpus, out, model=str(model_dir), calibration="whitening", id_column="id")
    m = mf.read(out)
    assert m.calibration.calibrator == "whitening" and m.calibration.name == "whitening"
    assert m.calibration.calibrated and m.calibration.auto is None and m.density is None
    reuse = tmp_path / "reuse"
    built_m = mf.read(built[0])
    src = built[0] / built_m.calibration.path
    build_index(corpus, reuse, model=str(model_dir), calibrator=src)
    m2 = mf.read(reuse)
    assert m2.calibration.fitted_on == str(src.resolve())
    assert m2.calibration.space == "calibrated"
    weights = "weights.safetensors"
    assert m2.calibration.files[weights].sha256 == built_m.calibration.files[weights].sha256
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
    out = tmp_path / "idx"
    with monkeypatch.context() as patched:
        patched.setattr(storage_rows, "PART_ROWS", 25)
        build_index(folder, out, model=str(model_dir), text_column="body")
    m = mf.read(out)
    assert m.columns.id is None and m.columns.id_type == "int" and m.columns.text == "body"
    assert [p.n_rows for p in m.segments[0].parts] == [25, 25, 10] and m.next_auto_id == 60
    s = Searcher.open(out)
    second = pq.read_table(folder / "part1.parquet").column("body").to_pylist()
    hit = s.search(second[4], k=1)[0]
    assert (hit.id, hit.text, hit.metadata["year"]) == (34, second[4], 1994)


def test_glob_input(tmp_path, model_dir):
    write_corpus(tmp_path / "a1.parquet", n=20, seed=1, id_prefix="a")
    write_corpus(tmp_path / "a2.parquet", n=20, seed=2, id_prefix="b")
    summary = build_index(str(tmp_path / "a*.parquet"), tmp_path / "idx", model=str(model_dir))
    assert summary["rows"] == 40
    (seg,) = mf.read(tmp_path / "idx").segments
    ids = RowReader(tmp_path / "idx" / seg.dir, seg.parts).table(["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted([f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)])


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
        "bad calibration": (good, {"calibration": "magic"}, "unknown calib"),
    }


@pytest.mark.parametrize(
    "case",
    ["missing", "not parquet", "text column", "empty", "duplicates", "strict blanks", "reserved",
     "bad factory", "bad calibration"],
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
    m = mf.read(tmp_path / "idx")
    assert (m.n_rows, m.skipped, m.next_auto_id, m.calibration.calibrator) == (2, 2, 4, "none")
    hits = Searcher.open(tmp_path / "idx").search("dog", k=5)
    assert [h.id for h in hits] == ["d", "a"]
    assert hits[0].dense_score == pytest.approx(1.0, abs=1e-5)


def test_existing_targets_are_refused(tmp_path, model_dir, corpus, built):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(FlowsearchError, match="not a flowsearch index"):
        build_index(corpus, other, model=str(model_dir), overwrite=True)
    assert [p.name for p in other.iterdir()] == ["precious.txt"]
    assert (other / "precious.txt").read_text() == "keep me"
    before = _snapshot(built[0])
    # the library speaks in its own terms (the CLI turns this into --overwrite)
    with pytest.raises(FlowsearchError, match="pass overwrite=True"):
        build_index(corpus, built[0], model=str(model_dir))
    assert _snapshot(built[0]) == before
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(FlowsearchError, match="is a file"):
        build_index(corpus, a_file, model=str(model_dir), overwrite=True)
    assert a_file.read_text() == "x"


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_crash_mid_build_leaves_previous_index(tmp_path, model_dir, corpus, monkeypatch, exc):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    before = _snapshot(out)
    reached: list[bool] = []

    def boom(*args, **kwargs):
        reached.append(True)
        raise exc

    # the vector index is written after the rows: a late failure
    monkeypatch.setattr(segment_writes.ann_io, "write_index", boom)
    with pytest.raises(type(exc)):
        build_index(corpus, out, model=str(model_dir), overwrite=True)
    assert reached == [True]
    assert _snapshot(out) == before and siblings(out) == [] and segment_dirs(out) == ["s000001"]
    monkeypatch.undo()
    assert len(Searcher.open(out, verify=True).search("the cat", k=3)) == 3


def test_overwrite_replaces(tmp_path, model_dir, corpus):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    small = write_corpus(tmp_path / "small.parquet", n=15, seed=9)
    build_index(small, out, model=str(model_dir), calibration="none", overwrite=True)
    m = mf.read(out)
    assert (m.n_rows, m.version) == (15, 2) and siblings(out) == []
    # numbering goes on: version 1's segment stays for readers still on it
    assert [s.name for s in m.segments] == ["s000002"]
    assert segment_dirs(out) == ["s000001", "s000002"]
    assert (out / "calibrators" / "c000001").is_dir()  # version 1's, kept for its readers
    assert (out / "calibrators" / "c000002").is_dir()
    texts = pq.read_table(small).column("text").to_pylist()
    assert Searcher.open(out, verify=True).search(texts[3], k=1)[0].id == "d3"


def _snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_a_killed_build_is_removed_by_the_next_writer(tmp_path, model_dir, corpus):
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    before = mf.read(out)
    # what a kill -9 mid-write leaves: a half-written staging directory under segments/
    dead = out / "segments" / ".stage-0badf00d"
    dead.mkdir(parents=True)
    (dead / "rows-00000.parquet").write_bytes(b"half a part")
    assert siblings(out) == ["segments/.stage-0badf00d"]
    # readers do not see it
    assert len(Searcher.open(out, verify=True).search("the cat", k=3)) == 3
    assert mf.read(out) == before
    # a refused write (the target exists) does not touch it ...
    with pytest.raises(FlowsearchError, match="overwrite"):
        build_index(corpus, out, model=str(model_dir), calibration="none")
    # ... the next writer removes it
    extra = write_corpus(tmp_path / "extra.parquet", n=5, seed=5, id_prefix="new")
    add_to_index(out, extra)
    assert siblings(out) == [] and segment_dirs(out) == ["s000001", "s000002"]


def test_bad_factory_fails_before_encoding(tmp_path, model_dir, corpus, monkeypatch):
    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded before the factory was checked")

    monkeypatch.setattr(build_module, "_encode_pass", no_encoding)
    out = tmp_path / "idx"
    for factory, message in [("PQ5", "multiple of"), ("IDMap,Flat", "IDMap"),
                             ("Nope3", "rejects index factory")]:  # fmt: skip
        with pytest.raises(FlowsearchError, match=message) as info:
            build_index(corpus, out, model=str(model_dir), index_factory=factory)
        assert "\n" not in str(info.value)
    assert not out.exists() and siblings(out) == []


def test_faiss_add_failure_is_a_user_error(tmp_path, model_dir, corpus, monkeypatch):
    monkeypatch.setattr(build_module, "check_factory", lambda factory, dim: None)
    out = tmp_path / "idx"
    with pytest.raises(FlowsearchError, match="cannot add vectors"):
        build_index(
            corpus, out, model=str(model_dir), calibration="none", index_factory="IDMap,Flat"
        )
    assert not out.exists()  # a failed first build leaves nothing, not even its directory
    with pytest.raises(FlowsearchError, match="no index at"):
        Searcher.open(out)
    build_index(corpus, out, model=str(model_dir), calibration="none")
    assert mf.read(out).n_rows == 120


def test_a_second_writer_fails_fast(tmp_path, model_dir, corpus):
    import fcntl

    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), calibration="none")
    before = _snapshot(out)
    extra = write_corpus(tmp_path / "extra.parquet", n=5, seed=5, id_prefix="new")
    with open(out / ".lock", "a") as held:  # what a running writer holds
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(FlowsearchError, match="another flowsearch process is writing"):
            build_index(corpus, out, model=str(model_dir), calibration="none", overwrite=True)
        with pytest.raises(FlowsearchError, match="another flowsearch process is writing"):
            add_to_index(out, extra)
        assert _snapshot(out) == before and siblings(out) == []
    assert add_to_index(out, extra)["added"] == 5 and siblings(out) == []


def test_relative_model_path_is_recorded_absolute(tmp_path, model_dir, corpus, monkeypatch):
    monkeypatch.chdir(model_dir.parent)
    build_index(corpus, tmp_path / "idx", model=model_dir.name, calibration="none")
    monkeypatch.chdir(tmp_path)
    enc = mf.read(tmp_path / "idx").encoder
    assert enc.model == enc.source == str(model_dir.resolve())
    assert len(Searcher.open("idx").search("the cat", k=2)) == 2


def test_auto_keeps_encoder_space_for_too_few_rows(tmp_path, model_dir):
    """Anisotropic, but fewer than MIN_ROWS_PER_DIM rows per dimension: a calibrator fitted
    on so few rows overfits (measured on STS-B), so auto searches the encoder's space."""
    rows = MIN_ROWS_PER_DIM * 32 - 10
    path = write_corpus(tmp_path / "small.parquet", rows)
    build_index(path, tmp_path / "idx", model=str(model_dir))
    cal = mf.read(tmp_path / "idx").calibration
    assert cal.anisotropy["mean_cosine"] > 0.5
    assert cal.auto is not None and cal.auto.calibrated is False and cal.space == "encoder"
    assert f"{rows} rows < {MIN_ROWS_PER_DIM} x dim 32" in cal.decision


def test_auto_calibrates_a_static_pooling_below_the_threshold(tmp_path, model_dir, corpus,
                                                              monkeypatch):  # fmt: skip
    """build_index passes the encoder's pooling to auto: a static table lookup is calibrated
    even when the statistic says isotropic (the Model2Vec case, issue 16)."""
    from flowsearch.space import fitting

    monkeypatch.setattr(fitting, "should_calibrate", lambda stats: False)
    out = tmp_path / "idx"
    build_index(corpus, out, model=str(model_dir), pooling="static")
    cal = mf.read(out).calibration
    assert cal.space == "calibrated" and cal.calibrator == "gaussian"
    assert "non-contextual" in cal.decision and cal.auto is not None and cal.auto.calibrated
    from flowsearch.writes.compact import recalibrate

    recalibrate(out)  # refitting decides the same way
    again = mf.read(out).calibration
    assert again.space == "calibrated" and "non-contextual" in again.decision
