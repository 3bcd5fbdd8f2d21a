"""The Ray engine (``build_index(..., engine="ray")``) against the local one, on a local Ray.

One Ray build serves every test that needs one (a Ray start, actor start-up and two Ray Data
runs cost ~60 s on 2 cores shared with other jobs, so they are marked ``slow``: CI must run
``-m slow`` for them); it runs with an encoder actor that kills its own process on its first
batch, so the same build checks the retry path and the equality with the local path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray")

from corpus_helpers import (  # noqa: E402
    write_corpus,
)

from flowsearch import Searcher, build_index  # noqa: E402
from flowsearch.ann.policy import AnnPolicy  # noqa: E402
from flowsearch.errors import FlowsearchError  # noqa: E402
from flowsearch.storage import manifest as mf  # noqa: E402
from flowsearch.storage.layout import ANN_DATA_FILE  # noqa: E402
from flowsearch.writes import ray_engine as ray_ingest  # noqa: E402

ROWS = 200
QUERIES = ["the cat and the dog", "red car on the road", "music piano song", "old book page"]
# What may differ between two builds of the same corpus: when, and the files' checksums (Parquet
# row groups follow the batches each engine wrote).
VOLATILE = {"created", "files", "flowsearch_version", "last_write"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ray-ingest")
    corpus = write_corpus(tmp / "corpus.parquet", n=ROWS)
    # Two files: the row order across files must match too.
    write_corpus(tmp / "corpus2.parquet", n=30, seed=1, id_prefix="e")
    options = dict(model=str(model_dir), calibration="flow", fit_sample=150)
    local = build_index([corpus, tmp / "corpus2.parquet"], tmp / "local", **options)
    marker = tmp / "crashed"
    original = ray_ingest.builder
    patch = pytest.MonkeyPatch()
    patch.setattr(
        ray_ingest,
        "builder",
        lambda *args, **kw: original(*args, fault_marker=str(marker), **kw),
    )
    try:
        with ray_ingest.ray_session():
            on_ray = build_index(
                [corpus, tmp / "corpus2.parquet"], tmp / "ray", engine="ray", **options
            )
    finally:
        patch.undo()
    return {"tmp": tmp, "local": local, "ray": on_ray, "marker": marker}


def _rows(index_dir: Path) -> tuple[list[Any], np.ndarray, np.ndarray]:
    s = Searcher.open(index_dir)
    try:
        (segment,) = s.version.segments  # a build writes one segment, on either engine
        ids = segment.reader.table(["id"]).column("id").to_pylist()
        return ids, segment.reader.vectors("raw"), s.vectors()
    finally:
        s.close()


@pytest.mark.slow
def test_same_rows_and_vectors(built: dict[str, Any]) -> None:
    ids_l, raw_l, vec_l = _rows(built["tmp"] / "local")
    ids_r, raw_r, vec_r = _rows(built["tmp"] / "ray")
    assert len(ids_l) == ROWS + 30
    assert ids_r == ids_l
    np.testing.assert_allclose(raw_r, raw_l, atol=1e-5)
    np.testing.assert_allclose(vec_r, vec_l, atol=1e-5)


def _close(a: Any, b: Any, path: str = "") -> None:
    """Equal, floats within 1e-6 (fit statistics see the float noise of encoding)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for key in a.keys() - {"seconds"}:  # timings
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        # the reference keeps 6 decimals: float noise may flip the last one
        assert b == pytest.approx(a, rel=1e-6, abs=2e-6), path
    else:
        assert a == b, path


@pytest.mark.slow
def test_same_manifest(built: dict[str, Any]) -> None:
    a = mf.read(built["tmp"] / "local").to_json_dict()
    b = mf.read(built["tmp"] / "ray").to_json_dict()

    def stable(raw: dict) -> dict:
        out = {k: v for k, v in raw.items() if k not in VOLATILE}
        out["segments"] = [
            {k: v for k, v in s.items() if k not in ("files", "vector_sum")}
            for s in raw["segments"]
        ]
        out["calibration"] = {k: v for k, v in raw["calibration"].items() if k != "files"}
        sample = raw["reference"]["sample"]  # its file's bytes hold float16 vectors: below
        files = {name: {"bytes": f["bytes"]} for name, f in sample["files"].items()}
        out["reference"] = {**raw["reference"], "sample": {**sample, "files": files}}
        return out

    _close(stable(a), stable(b))
    # the reference sample: the same rows and probes, its vectors (float16) and probes' best
    # scores within the encodings' float noise (a float16 rounding may flip a last bit)
    name = a["reference"]["sample"]["path"]
    with (np.load(built["tmp"] / "local" / name / "sample.npz") as la,
          np.load(built["tmp"] / "ray" / name / "sample.npz") as ra):  # fmt: skip
        assert sorted(la.files) == sorted(ra.files)
        for key in la.files:
            x, y = la[key], ra[key]
            assert x.dtype == y.dtype and x.shape == y.shape, key
            if np.issubdtype(x.dtype, np.floating):
                np.testing.assert_allclose(y.astype(np.float64), x.astype(np.float64),
                                           atol=1e-3, err_msg=key)  # fmt: skip
            else:
                np.testing.assert_array_equal(y, x, err_msg=key)
    # each segment's vector sum (what the dense background is computed from): the same up to
    # the vectors' own float noise (each within 1e-5, test_same_rows_and_vectors) over 330 rows
    dim = mf.read(built["tmp"] / "local").dim
    for sa, sb in zip(mf.read(built["tmp"] / "local").segments,
                      mf.read(built["tmp"] / "ray").segments, strict=True):  # fmt: skip
        np.testing.assert_allclose(sb.vectors_summed(dim), sa.vectors_summed(dim), atol=1e-4)
    # the same files, checksums aside
    assert [sorted(s["files"]) for s in a["segments"]] == [
        sorted(s["files"]) for s in b["segments"]
    ]
    assert built["ray"]["rows"] == built["local"]["rows"] == ROWS + 30


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_same_search_results(built: dict[str, Any], mode: str) -> None:
    a, b = Searcher.open(built["tmp"] / "local"), Searcher.open(built["tmp"] / "ray")
    for hits_a, hits_b in zip(
        a.search(QUERIES, k=10, mode=mode), b.search(QUERIES, k=10, mode=mode)
    ):
        assert [h.id for h in hits_b] == [h.id for h in hits_a]
        np.testing.assert_allclose([h.score for h in hits_b], [h.score for h in hits_a], atol=1e-5)
        assert [h.metadata for h in hits_b] == [h.metadata for h in hits_a]


@pytest.mark.slow
def test_crashed_encoder_actor_is_retried(built: dict[str, Any]) -> None:
    # The actor died on its first batch (the marker is its last act), Ray restarted it and
    # retried the batch: every row is there, and equal to the local build (tests above).
    assert built["marker"].exists()
    assert len(Searcher.open(built["tmp"] / "ray")) == ROWS + 30
    assert not list((built["tmp"] / "ray").rglob("_work"))  # scratch removed before publish


def test_bad_input_fails_before_ray(tmp_path: Path, model_dir: Path) -> None:
    corpus = write_corpus(tmp_path / "c.parquet", n=20)
    with pytest.raises(FlowsearchError, match="no text column 'body'"):
        build_index(corpus, tmp_path / "idx", text_column="body", engine="ray")
    with pytest.raises(FlowsearchError, match="unknown engine"):
        build_index(corpus, tmp_path / "idx", engine="spark")
    with pytest.raises(FlowsearchError, match="reads corpus files"):
        build_index([{"id": "a", "text": "the cat"}], tmp_path / "idx", engine="ray")
    assert not (tmp_path / "idx" / "manifest.json").exists()


def test_ray_missing_or_unreachable_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowsearch.errors import BadInput, MissingExtra
    from flowsearch.writes import ray_engine

    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
        with pytest.raises(MissingExtra, match="not installed") as caught:
            ray_engine._import_ray()
        assert "flowsearch[ray]" in caught.value.render("cli") and caught.value.http_status == 501
    with (
        pytest.raises(BadInput, match="cannot connect to Ray") as caught,
        ray_engine.ray_session("ray://127.0.0.1:1"),
    ):
        pass
    assert caught.value.param == "address" and "--address" in caught.value.render("cli")


def test_local_build_never_imports_ray(tmp_path: Path, model_dir: Path, repo_root: Path) -> None:
    corpus = write_corpus(tmp_path / "c.parquet", n=20)
    code = (
        "import sys, flowsearch.writes.build as ingest\n"
        f"ingest.build_index({str(corpus)!r}, {str(tmp_path / 'idx')!r}, "
        f"model={str(model_dir)!r})\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]


IVF_FACTORY = "IVF8,Flat"


@pytest.fixture(scope="module")
def built_ivf(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    """An IVF index built by both engines, with shards of 60 rows: on Ray, each shard's rows go
    into their own copy of the trained index and the parts are merged on disk."""
    from flowsearch.storage import rows as storage_rows

    tmp = tmp_path_factory.mktemp("ray-ivf")
    corpus = write_corpus(tmp / "corpus.parquet", n=ROWS + 30)
    options = dict(model=str(model_dir), calibration="none", index_factory=IVF_FACTORY)
    with pytest.MonkeyPatch.context() as patched:  # 4 Parquet parts: 4 IVF parts to merge
        patched.setattr(storage_rows, "PART_ROWS", 60)
        build_index(corpus, tmp / "local", **options)
        with ray_ingest.ray_session():
            build_index(corpus, tmp / "ray", engine="ray", **options)
    return {"tmp": tmp}


@pytest.mark.slow
def test_ivf_lists_are_merged_on_disk_and_answer_like_the_local_build(
    built_ivf: dict[str, Any],
) -> None:
    import shutil

    tmp = built_ivf["tmp"]
    local, ray = mf.read(tmp / "local"), mf.read(tmp / "ray")
    (seg,) = ray.segments
    assert len(seg.parts) == 4 and seg.ann.factory == IVF_FACTORY
    assert seg.ann.data == ANN_DATA_FILE and ANN_DATA_FILE in seg.files
    assert local.segments[0].ann.data is None
    moved = Path(shutil.copytree(tmp / "ray", tmp / "moved"))  # the directory is relocatable
    a = Searcher.open(tmp / "local", gpu=False)
    for where, mmap in ((tmp / "ray", False), (tmp / "ray", True), (moved, True)):
        b = Searcher.open(where, verify=True, gpu=False, mmap=mmap, encoder=a.encoder)
        for hits_a, hits_b in zip(
            a.search(QUERIES, k=10, mode="dense"), b.search(QUERIES, k=10, mode="dense")
        ):
            assert [h.id for h in hits_b] == [h.id for h in hits_a]
            np.testing.assert_allclose(
                [h.score for h in hits_b], [h.score for h in hits_a], atol=1e-5
            )
        b.close()
    # later writes keep working: they add segments and deletion files, never touch the lists
    from flowsearch import add_to_index, delete

    assert delete(moved, ["d3"]).n_deleted == 1
    add_to_index(moved, write_corpus(tmp / "more.parquet", n=20, seed=4, id_prefix="m"))
    s = Searcher.open(moved, verify=True, gpu=False)
    assert len(s) == ROWS + 30 - 1 + 20
    assert "d3" not in {h.id for hits in s.search(QUERIES, k=50, mode="dense") for h in hits}
    # the first merged version is untouched by the writes after it
    Searcher.open(tmp / "ray", verify=True, gpu=False)


# --- long documents: cut into passages on Ray as the local build cuts them ---------------------

LONG_MAX_LENGTH = 16  # a window of 14 tokens: a few sentences make a long document


def _long_corpus(path: Path, n: int, seed: int, prefix: str) -> Path:
    """Documents of one to eight sentences (most longer than the window), with metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from corpus_helpers import sentences

    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 9, size=n)
    texts = [
        " ".join(s + "." for s in sentences(int(c), seed=seed * 1000 + i, length=(3, 7)))
        for i, c in enumerate(counts)
    ]
    table = pa.table({"id": [f"{prefix}{i}" for i in range(n)], "text": texts,
                      "year": pa.array([2000 + i % 9 for i in range(n)], pa.int32())})  # fmt: skip
    pq.write_table(table, path)
    return path


@pytest.fixture(scope="module")
def built_long(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    """A corpus of long documents in two files, built by both engines (the calibration fitted
    on a sample of the passages)."""
    tmp = tmp_path_factory.mktemp("ray-long")
    files = [_long_corpus(tmp / "a.parquet", 40, 1, "a"),
             _long_corpus(tmp / "b.parquet", 25, 2, "b")]  # fmt: skip
    options = dict(model=str(model_dir), calibration="flow", fit_sample=120,
                   max_length=LONG_MAX_LENGTH, passage_overlap=3)  # fmt: skip
    build_index(files, tmp / "local", **options)
    with ray_ingest.ray_session():
        build_index(files, tmp / "ray", engine="ray", **options)
    return {"tmp": tmp}


@pytest.mark.slow
def test_long_documents_are_cut_on_ray_as_locally(built_long: dict[str, Any]) -> None:
    from flowsearch.search.version import index_info
    from flowsearch.storage.passages import PASSAGE_COLUMNS

    tmp = built_long["tmp"]
    columns = ["id", "text", "year", *PASSAGE_COLUMNS]
    found = {}
    for name in ("local", "ray"):
        s = Searcher.open(tmp / name)
        (segment,) = s.version.segments
        found[name] = (segment.reader.table(columns), segment.reader.vectors("raw"), s.vectors())
        s.close()
    (rows_l, raw_l, vec_l), (rows_r, raw_r, vec_r) = found["local"], found["ray"]
    assert rows_r.equals(rows_l)  # the same passage rows: ids, texts, metadata, offsets
    assert rows_l.num_rows > 65 and rows_l.column("__passage").to_numpy().max() > 2
    np.testing.assert_allclose(raw_r, raw_l, atol=1e-5)
    np.testing.assert_allclose(vec_r, vec_l, atol=1e-5)
    info_l, info_r = index_info(tmp / "local"), index_info(tmp / "ray")
    assert info_r.n_documents == info_l.n_documents == 65
    a, b = mf.read(tmp / "local").to_json_dict(), mf.read(tmp / "ray").to_json_dict()
    for key in ("calibration", "reference", "density", "passages", "schema"):  # fit on passages
        _close(_without(a[key]), _without(b[key]), key)
    assert a["segments"][0]["n_rows"] == b["segments"][0]["n_rows"] == rows_l.num_rows
    # the reference sample: the same passage rows, their vectors (float16) within float noise
    from flowsearch.space.sample import ReferenceSample

    dim = mf.read(tmp / "local").dim
    sample_l, sample_r = (ReferenceSample.load(tmp / name / a["reference"]["sample"]["path"], dim)
                          for name in ("local", "ray"))  # fmt: skip
    np.testing.assert_array_equal(sample_r.keys, sample_l.keys)
    np.testing.assert_array_equal(sample_r.probe_keys, sample_l.probe_keys)
    np.testing.assert_allclose(sample_r.vectors, sample_l.vectors, atol=2e-3)
    np.testing.assert_allclose(sample_r.probe_best, sample_l.probe_best, atol=2e-3)


def _without(value: Any) -> Any:
    """A manifest field without its files' checksums (float noise flips float16 roundings)."""
    if isinstance(value, dict):
        return {k: _without(v) for k, v in value.items() if k != "files"}
    return value


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_long_documents_answer_on_ray_as_locally(built_long: dict[str, Any], mode: str) -> None:
    tmp = built_long["tmp"]
    a, b = Searcher.open(tmp / "local"), Searcher.open(tmp / "ray")
    for where in (None, "year >= 2004", "length(text) > 150"):
        got = b.search(QUERIES, k=7, mode=mode, where=where)
        for hits_a, hits_b in zip(a.search(QUERIES, k=7, mode=mode, where=where), got):
            assert [h.id for h in hits_b] == [h.id for h in hits_a]
            np.testing.assert_allclose([h.score for h in hits_b], [h.score for h in hits_a],
                                       atol=1e-5)  # fmt: skip
            shown = [(h.text, h.highlight) for h in hits_a]
            assert [(h.text, h.highlight) for h in hits_b] == shown
    # BM25 scores a long document whole (no passage is its best): highlights on the dense side
    assert any(h.highlight is not None for hits in got for h in hits) == (mode != "lexical")


#: A policy no default matches, so a build that dropped it would show.
POLICY = AnnPolicy(flat_max_rows=50, ef_construction=24, target_recall=0.9)


@pytest.fixture(scope="module")
def built_with_policy(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Any]:
    """The same corpus built under :data:`POLICY` by both engines."""
    tmp = tmp_path_factory.mktemp("ray-policy")
    corpus = write_corpus(tmp / "corpus.parquet", n=ROWS)
    options = dict(model=str(model_dir), calibration="none", lexical=False, ann=POLICY)
    build_index(corpus, tmp / "local", **options)
    with ray_ingest.ray_session():
        build_index(corpus, tmp / "ray", engine="ray", **options)
    return {"tmp": tmp}


@pytest.mark.slow
def test_the_ray_build_carries_the_ann_policy_as_locally(built_with_policy: dict[str, Any]) -> None:
    import faiss

    from flowsearch.ann import io as ann_io

    tmp = built_with_policy["tmp"]
    for engine in ("local", "ray"):
        (seg,) = mf.read(tmp / engine).segments
        assert seg.ann.factory == "HNSW32" and seg.ann.tuning is not None
        assert seg.ann.tuning.target == POLICY.target_recall
        index = ann_io.read_index(tmp / engine / seg.dir / seg.ann.path, seg.ann.params)
        assert faiss.downcast_index(index).hnsw.efConstruction == POLICY.ef_construction
    a = Searcher.open(tmp / "local", gpu=False)
    b = Searcher.open(tmp / "ray", gpu=False, encoder=a.encoder)
    try:
        found = [
            len({h.id for h in x} & {h.id for h in y}) / 10
            for x, y in zip(a.search(QUERIES, k=10, mode="dense"),
                            b.search(QUERIES, k=10, mode="dense"), strict=True)
        ]  # fmt: skip
        assert np.mean(found) >= 0.9  # the same rows and vectors; graphs may differ by threads
    finally:
        a.close()
        b.close()
