"""The reference sample (issue 30, "drift without the corpus"): new rows are judged against a
fixed-size sample of the index kept with its reference, never a search over the whole index."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from corpus_helpers import siblings, write_corpus

from flowsearch.errors import IndexDamaged
from flowsearch.space import sample as space_sample
from flowsearch.space.drift import drift_report
from flowsearch.space.reference import Reference, reference_of
from flowsearch.space.sample import ReferenceSample, best_against
from flowsearch.storage import manifest as mf
from flowsearch.storage.keys import keys_of
from flowsearch.storage.verify import verify


def _unit(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, np.float32)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _clusters(rng: np.random.Generator, n: int, centres: np.ndarray, spread: float = 0.35):
    pick = rng.integers(0, len(centres), n)
    return _unit(centres[pick] + spread * rng.normal(size=(n, centres.shape[1])))


def _loo(Z: np.ndarray, keys: np.ndarray, probes: np.ndarray, probe_keys: np.ndarray):
    """Brute force: each probe's best score to a sample row with another key."""
    S = (probes.astype(np.float64) @ Z.T.astype(np.float64)).astype(np.float32)
    S[probe_keys[:, None] == keys[None, :]] = -np.inf
    return S.max(axis=1).astype(np.float64)


def test_best_against_skips_the_row_itself_and_says_none_when_nothing_is_left():
    Z = _unit(np.eye(3) + 0.1)
    keys = np.array([7, 8, 9], np.uint64)
    best, at = best_against(Z, Z, keys, keys)
    assert (at != np.arange(3)).all() and (best < 0.999).all()
    lone, where = best_against(Z[:1], Z[:1], keys[:1], keys[:1])
    assert np.isnan(lone[0]) and where[0] == -1
    assert np.isnan(best_against(Z, Z[:0])[0]).all()


def test_probes_are_measured_leave_one_out_and_stay_exact_through_deletes_and_growth():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(6, 16))
    Z = _clusters(rng, 600, centres)
    keys = np.arange(600, dtype=np.uint64) * 3 + 1
    s = ReferenceSample.measured(Z[:300], keys[:300], Z[250:400], keys[250:400])
    assert s.n_sample == 300 and s.n_probes == 150
    np.testing.assert_allclose(s.probe_best, _loo(s.vectors, s.keys, s.probe_vectors, s.probe_keys))
    raw = _loo(Z[:300], keys[:300], Z[250:400], keys[250:400])  # held as float16: ~1e-3 apart
    np.testing.assert_allclose(s.probe_best, raw, atol=2e-3)
    # rows deleted or replaced leave the sample and the probes; the probes whose nearest row
    # left are measured again (against what is left)
    gone = keys[rng.choice(400, 120, replace=False)]
    d = s.without(gone)
    assert not np.isin(d.keys, gone).any() and not np.isin(d.probe_keys, gone).any()
    np.testing.assert_allclose(d.probe_best, _loo(d.vectors, d.keys, d.probe_vectors, d.probe_keys))
    assert s.without(np.array([10**9], np.uint64)) is s  # nothing of it gone: the same sample
    # a write of 200 rows into 600: the sample stays at its bound, the probes within theirs,
    # and every probe's figure equals a fresh measurement
    u = d.updated(n_live=600, Z=Z[400:], keys=keys[400:], n_new=200, most=300,
                  most_probes=140, seed=3)  # fmt: skip
    assert d.n_sample < u.n_sample <= 300 and u.n_probes <= 140
    assert len(np.unique(u.keys)) == u.n_sample
    np.testing.assert_allclose(u.probe_best, _loo(u.vectors, u.keys, u.probe_vectors, u.probe_keys))
    assert 0 < np.isin(u.keys, keys[400:]).sum() < 200  # some new rows entered, not all
    # a corpus that fits takes every new row
    small = ReferenceSample.measured(Z[:50], keys[:50], Z[:50], keys[:50], "leave-one-out")
    grown = small.updated(50, Z[50:80], keys[50:80], 30, most=300, most_probes=2000, seed=0)
    assert grown.n_sample == 80 and grown.n_probes == 80 and grown.method == "leave-one-out"


def test_the_sample_stays_uniform_as_the_corpus_grows():
    """Each new row enters with the sample's share of the corpus: after growing 1,000 rows to
    4,000 in writes of 500, about three quarters of the sample are rows added later."""
    rng = np.random.default_rng(1)
    Z = _unit(rng.normal(size=(4000, 8)))
    keys = np.arange(4000, dtype=np.uint64)
    shares = []
    for seed in range(5):
        s = ReferenceSample.measured(Z[:200], keys[:200], Z[:40], keys[:40])
        n = 1000
        while n < 4000:
            s = s.updated(n, Z[n : n + 500], keys[n : n + 500], 500, most=200, most_probes=40,
                          seed=seed * 100 + n)  # fmt: skip
            n += 500
        shares.append(np.mean(s.keys >= 1000))
        assert s.n_sample == 200
    assert 0.68 < np.mean(shares) < 0.82


@pytest.mark.parametrize("spread", [0.35, 0.6])
def test_verdicts_on_a_sample_keep_telling_like_from_apart(spread):
    """Synthetic corpus of 6,000 rows in 12 topics, sample 500, probes 300 held-out rows: a
    batch from the same topics sits like the corpus, a batch from other topics apart (the same
    verdicts the whole corpus gives)."""
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(24, 32))
    corpus = _clusters(rng, 6000, centres[:12], spread)
    keys = np.arange(6000, dtype=np.uint64)
    at = rng.permutation(6000)
    sample = ReferenceSample.measured(corpus[at[:500]], keys[at[:500]], corpus[at[-300:]],
                                      keys[at[-300:]])  # fmt: skip
    ref = Reference.from_scores(sample.probe_best, method="held-out", n_corpus=6000)
    inside = _clusters(rng, 100, centres[:12], spread)
    outside = _clusters(rng, 100, centres[12:], spread)
    for batch, verdict in ((inside, "like the corpus"), (outside, "apart from the corpus")):
        on_sample = drift_report(sample.best_scores(batch), ref, sample=500)
        whole = Reference.from_scores(_loo(corpus, keys, corpus[at[-300:]], keys[at[-300:]]),
                                      method="held-out", n_corpus=6000)  # fmt: skip
        on_corpus = drift_report((batch @ corpus.T).max(axis=1), whole)
        assert on_sample.verdict == on_corpus.verdict == verdict
        assert on_sample.n_sample == 500


def test_sample_file_round_trips_and_refuses_another_dimension(tmp_path):
    rng = np.random.default_rng(3)
    Z = _unit(rng.normal(size=(40, 8)))
    keys = np.arange(40, dtype=np.uint64)
    s = ReferenceSample.measured(Z, keys, Z[:10], keys[:10], "leave-one-out")
    s.save(tmp_path)
    back = ReferenceSample.load(tmp_path, 8)
    assert back.method == "leave-one-out" and np.array_equal(back.keys, keys)
    np.testing.assert_array_equal(back.probe_best, s.probe_best)
    with pytest.raises(IndexDamaged, match="does not match the index"):
        ReferenceSample.load(tmp_path, 16)
    (tmp_path / "sample.npz").write_bytes(b"not a sample")
    with pytest.raises(IndexDamaged, match="unreadable"):
        ReferenceSample.load(tmp_path, 8)


# -- through the product ----------------------------------------------------------------------


def _sample_of(out):
    """The version's sample record and its sample (the base with its deltas applied)."""
    m = mf.read(out)
    record = m.reference.sample.model_dump(mode="json")  # as the manifest stores it
    deltas = [out / d["path"] for d in record.get("deltas", [])]
    return record, ReferenceSample.load(out / record["path"], m.dim, deltas=deltas)


def _newest(record):
    """The directory the version that last changed the sample wrote (its delta or base)."""
    return (record.get("deltas") or [record])[-1]["path"]


def _key(ids):
    return keys_of(pa.array(ids))


def test_build_keeps_a_sample_and_an_upsert_never_searches_the_segments(
    tmp_path, model_dir, monkeypatch
):
    """The drift check reads the sample, not the index: no segment's vector index is opened or
    searched during an upsert, and the rows scored against are the sample's, bounded by the
    setting whatever the corpus holds."""
    from flowsearch import build_index, upsert
    from flowsearch.ann import io as ann_io
    from flowsearch.ann import prefilter

    counts = {}
    with monkeypatch.context() as patched:
        patched.setattr(space_sample, "REFERENCE_SAMPLE_ROWS", 60)
        for n in (120, 360):
            out = tmp_path / f"idx{n}"
            build_index(write_corpus(tmp_path / f"c{n}.parquet", n=n, seed=4), out,
                        model=str(model_dir))  # fmt: skip
            record, sample = _sample_of(out)
            assert sample.n_sample == record["rows"] == 60 and record["probes"] == sample.n_probes
            assert record["path"] == "references/r000001" and siblings(out) == []
            words = reference_of(mf.read(out)).to_words()
            assert words.endswith("new rows are judged against a sample of 60 of its rows")
            verify(out, mf.read(out), checksums=True)

            def refuse(*args, **kwargs):
                raise AssertionError("the drift check searched a segment")

            with monkeypatch.context() as patch:
                patch.setattr(ann_io, "read_index", refuse)
                patch.setattr(prefilter, "filtered_search", refuse)
                patch.setattr("flowsearch.writes.measure.filtered_search", refuse)
                new = write_corpus(tmp_path / f"new{n}.parquet", n=30, seed=9, id_prefix="x")
                drift = upsert(out, new, merge_segments=False)["drift"]
            counts[n] = (drift["n_sample"], drift["n_scored"], drift["n_rows"])
            assert drift["verdict"] != "not judged"
    assert counts == {120: (60, 30, 30), 360: (60, 30, 30)}


def test_the_sample_follows_deletes_upserts_compaction_and_recalibration(tmp_path, model_dir):
    from flowsearch import Searcher, build_index, compact, delete, recalibrate, upsert

    out = tmp_path / "idx"
    corpus = write_corpus(tmp_path / "c.parquet", n=120, seed=4)
    build_index(corpus, out, model=str(model_dir))
    record, sample = _sample_of(out)
    assert sample.n_sample == 120  # a corpus that fits is all sample
    # deleted rows leave the sample at the next write (they are no longer live)
    delete(out, ["d3", "d4", "d5"])
    assert _sample_of(out)[0] == record  # a delete alone leaves the file as it was
    rows = [{"id": "d7", "text": "an edited passage about sailing boats"},
            {"id": "n1", "text": "a brand new passage about mountains"}]  # fmt: skip
    drift = upsert(out, rows)["drift"]
    assert drift["n_sample"] == 120 - 3 - 1  # deleted and replaced rows are not judged against
    record2, sample2 = _sample_of(out)
    assert _newest(record2) == "references/r000003"  # a delta on the build's base
    assert record2["path"] == record["path"] == "references/r000001"
    assert not np.isin(_key(["d3", "d4", "d5"]), sample2.keys).any()
    assert sample2.n_sample == 118 and np.isin(_key(["d7", "n1"]), sample2.keys).all()
    # the replaced row's entry holds its new vector, as the index does
    s = Searcher.open(out)
    Z = s.vectors()
    new_row = int(np.flatnonzero(_key(["d7"])[0] == sample2.keys)[0])
    assert float(sample2.vectors[new_row] @ Z[-2]) == pytest.approx(1.0, abs=2e-3)  # float16
    # compaction rewrites segments, keeps ids: the sample stays, and still serves
    compact(out, full=True)
    assert _sample_of(out)[0] == record2
    verify(out, mf.read(out), checksums=True)
    assert upsert(out, [{"id": "n2", "text": "a passage about rivers"}])["drift"]["n_sample"] == 118
    # recalibrate changes the space: a new sample, drawn from the rewritten rows
    before = _sample_of(out)[1]
    recalibrate(out, calibration="whitening")
    record4, after = _sample_of(out)
    m = mf.read(out)
    assert record4["path"] == f"references/r{m.version:06d}" and after.n_sample == 119
    assert "deltas" not in record4  # drawn again: a new base
    Z = Searcher.open(out).vectors()
    assert after.dim == Z.shape[1] and not np.allclose(after.vectors[:5], before.vectors[:5])
    assert np.abs(after.vectors @ Z.T).max(axis=1).min() == pytest.approx(1.0, abs=2e-3)
    verify(out, m, checksums=True)
    assert siblings(out) == []


def test_an_index_without_a_sample_gets_one_at_its_next_write(tmp_path, model_dir):
    """An index written before samples existed (its reference records none) is judged the
    same way: the first write draws the sample from its rows, once."""
    from flowsearch import build_index, upsert

    out = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=120, seed=4), out, model=str(model_dir))
    path = out / "manifest.json"
    raw = json.loads(path.read_text())
    old_sample = raw["reference"].pop("sample")
    raw.pop("checksum")
    raw["checksum"] = mf.checksum(raw)
    path.write_text(json.dumps(raw))
    assert mf.read(out).reference.sample is None
    assert "sample" not in mf.read(out).to_json_dict()["reference"]  # and is written so
    new = write_corpus(tmp_path / "n.parquet", n=20, seed=9, id_prefix="x")
    drift = upsert(out, new)["drift"]
    assert drift["verdict"] != "not judged" and drift["n_sample"] == 120
    record, sample = _sample_of(out)
    assert record["path"] != old_sample["path"] and sample.n_sample == 140
    assert not (out / old_sample["path"]).exists()  # unreferenced, cleaned
    assert mf.read(out).reference.n_measured == raw["reference"]["n_measured"]  # queries'


def test_a_crafted_sample_path_is_refused_and_a_damaged_file_named(tmp_path, model_dir):
    from flowsearch import build_index, upsert

    out = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=120, seed=4), out, model=str(model_dir))
    record, _ = _sample_of(out)
    (out / record["path"] / "sample.npz").write_bytes(b"x" * 10)
    with pytest.raises(IndexDamaged, match="sample.npz"):
        verify(out, mf.read(out))
    with pytest.raises(IndexDamaged, match="sample.npz"):
        upsert(out, [{"id": "n1", "text": "a new passage"}])
    path = out / "manifest.json"
    raw = json.loads(path.read_text())
    raw["reference"]["sample"]["path"] = "../elsewhere"
    raw.pop("checksum")
    raw["checksum"] = mf.checksum(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(IndexDamaged, match="leaves the index directory"):
        upsert(out, [{"id": "n1", "text": "a new passage"}])
