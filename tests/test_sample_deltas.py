"""The reference sample on disk as a base plus per-write deltas (issue 30, "write cost"): a write
that changes a few of the sample's entries writes those, not the whole 4.7 MB sample; the chain
folds into a new base past a bound; what a chain reads back is exactly the sample a write made."""

from __future__ import annotations

import numpy as np
import pytest
from corpus_helpers import siblings, write_corpus

from flowsearch.errors import IndexDamaged
from flowsearch.space import sample as space_sample
from flowsearch.space.sample import DELTA_FILE, SAMPLE_FILE, ReferenceSample, SampleDelta
from flowsearch.storage import manifest as mf
from flowsearch.storage.verify import verify
from flowsearch.writes import measure


def _unit(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, np.float32)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _same(a: ReferenceSample, b: ReferenceSample, serials: bool = True) -> None:
    """Two samples hold the same entries, probes and figures, in the same order (and, with
    ``serials``, the same numbering)."""
    for name in ("vectors", "keys", "probe_vectors", "probe_keys", "probe_near"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.probe_best, b.probe_best)  # NaN where NaN
    assert a.method == b.method
    if serials:
        np.testing.assert_array_equal(a.serials, b.serials)
        np.testing.assert_array_equal(a.probe_serials, b.probe_serials)
        assert (a.next_serial, a.next_probe_serial) == (b.next_serial, b.next_probe_serial)


def _loo(s: ReferenceSample) -> np.ndarray:
    S = (s.probe_vectors.astype(np.float64) @ s.vectors.T.astype(np.float64)).astype(np.float32)
    S[s.probe_keys[:, None] == s.keys[None, :]] = -np.inf
    best = S.max(axis=1).astype(np.float64)
    return np.where(np.isfinite(best), best, np.nan)


def test_deltas_replay_every_change_exactly_through_files(tmp_path):
    """Deletes, replacements, growth past the bound and probes leaving, with an id's passages
    sharing a key: each write's delta, saved and read back on the chain, gives exactly the
    sample the write made; an unchanged write's delta is empty."""
    rng = np.random.default_rng(5)
    Z = _unit(rng.normal(size=(3000, 12)))
    keys = (np.arange(3000) // 2).astype(np.uint64)  # two passages per id
    first = ReferenceSample.measured(Z[:80], keys[:80], Z[40:100], keys[40:100])
    (tmp_path / "base").mkdir()
    first.save(tmp_path / "base")
    disk = ReferenceSample.load(tmp_path / "base", 12)
    _same(disk, first)
    n, folders = 100, []
    for step in range(10):
        gone = rng.choice(keys[:n], 6, replace=False) if step % 3 else np.zeros(0, np.uint64)
        live = disk.without(gone)
        after = live.updated(n, Z[n : n + 200], keys[n : n + 200], 200, most=90,
                             most_probes=50, seed=step)  # fmt: skip
        n += 200
        delta = after.delta_from(disk)
        assert delta is not None
        folders.append(tmp_path / f"d{step}")
        folders[-1].mkdir()
        delta.save(folders[-1])
        disk = ReferenceSample.load(tmp_path / "base", 12, deltas=folders)
        _same(disk, after)
        np.testing.assert_array_equal(disk.probe_best, _loo(disk))
        assert not np.isin(disk.keys, gone).any() and disk.n_sample <= 90
    assert np.isin(disk.keys, keys[100:]).sum() > 45  # most of it entered through deltas
    empty = disk.delta_from(disk)
    assert empty is not None and empty.nbytes == 0


def test_a_delta_is_what_changed_and_a_redrawn_sample_is_none():
    rng = np.random.default_rng(6)
    Z = _unit(rng.normal(size=(20_000, 32)))
    keys = np.arange(20_000, dtype=np.uint64)
    s = ReferenceSample.measured(Z[:4096], keys[:4096], Z[4096:6096], keys[4096:6096])
    # 1,000 rows into 1M live rows: about 4 enter the sample, 2 the probes
    after = s.updated(1_000_000, Z[6096:7096], keys[6096:7096], 1000, most=4096,
                      most_probes=2000, seed=1)  # fmt: skip
    delta = after.delta_from(s)
    assert delta is not None and 0 < len(delta.keys) < 20 and len(delta.out) == len(delta.keys)
    base_bytes = s.vectors.size * 2 + s.probe_vectors.size * 2
    assert delta.nbytes < base_bytes / 500
    again = ReferenceSample.measured(after.vectors, after.keys, after.probe_vectors,
                                     after.probe_keys)  # fmt: skip
    assert again.delta_from(s) is None and after.delta_from(again) is None


def test_a_delta_that_does_not_follow_its_sample_or_its_dimension_is_refused(tmp_path):
    rng = np.random.default_rng(7)
    Z = _unit(rng.normal(size=(60, 8)))
    keys = np.arange(60, dtype=np.uint64)
    s = ReferenceSample.measured(Z[:40], keys[:40], Z[:10], keys[:10], "leave-one-out")
    s.save(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    delta = s.without(keys[:3]).delta_from(s)
    assert delta is not None
    delta.out = np.array([41], np.int64)  # an entry the base does not hold
    delta.save(d)
    with pytest.raises(IndexDamaged, match="does not follow the sample before it"):
        ReferenceSample.load(tmp_path, 8, deltas=[d])
    with pytest.raises(IndexDamaged, match="does not match the index"):
        SampleDelta.load(d, 16)
    (d / DELTA_FILE).write_bytes(b"not a delta")
    with pytest.raises(IndexDamaged, match="unreadable"):
        ReferenceSample.load(tmp_path, 8, deltas=[d])


# -- through the product ----------------------------------------------------------------------


def _record(out):
    return mf.read(out).reference.sample.model_dump(mode="json")  # as the manifest stores it


def _load(out):
    m = mf.read(out)
    record = m.reference.sample
    deltas = [out / d.path for d in record.deltas]
    return ReferenceSample.load(out / record.path, m.dim, deltas=deltas)


def _bytes(piece):
    return sum(f["bytes"] for f in piece["files"].values())


def _writes(out, tmp_path, count, start=0):
    from flowsearch import upsert

    for i in range(start, start + count):
        rows = [{"id": f"d{3 * i + 1}", "text": f"an edited passage number {i} about lakes"}]
        rows += [{"id": f"w{i}-{j}", "text": f"new passage {j} of write {i} on hills"}
                 for j in range(4)]  # fmt: skip
        upsert(out, rows, merge_segments=False)


def test_upserts_write_small_deltas_that_fold_into_a_new_base(tmp_path, model_dir, monkeypatch):
    """Each upsert that changes the sample writes a delta beside the build's base (only its
    own file, a fraction of the base's bytes); the chain reads back as the sample a write of
    the whole sample each time gives (the same entries and figures); past
    ``REFERENCE_DELTA_MAX`` deltas the next write folds the chain into a new base; the old
    chain stays while the previous version names it, then cleanup removes it."""
    from flowsearch import build_index

    corpus = write_corpus(tmp_path / "c.parquet", n=360, seed=4)
    chained, whole = tmp_path / "chained", tmp_path / "whole"
    monkeypatch.setattr(space_sample, "REFERENCE_SAMPLE_ROWS", 200)
    for out in (chained, whole):
        build_index(corpus, out, model=str(model_dir))
    base = _record(chained)
    assert base["path"] == "references/r000001" and "deltas" not in base
    with monkeypatch.context() as patched:  # every write saves the whole sample
        patched.setattr(measure, "REFERENCE_DELTA_MAX", 0)
        _writes(whole, tmp_path, 3)
    _writes(chained, tmp_path, 3)
    record = _record(chained)
    assert record["path"] == base["path"] and record["files"] == base["files"]
    assert [d["path"] for d in record["deltas"]] == [f"references/r00000{v}" for v in (2, 3, 4)]
    for piece in record["deltas"]:
        assert list(piece["files"]) == [DELTA_FILE]
        assert _bytes(piece) < _bytes(base) / 4
    assert "deltas" not in _record(whole) and _record(whole)["path"] == "references/r000004"
    _same(_load(chained), _load(whole), serials=False)
    assert record["rows"] == _load(chained).n_sample == _record(whole)["rows"]
    verify(chained, mf.read(chained), checksums=True)
    # the bound: a fifth delta would pass REFERENCE_DELTA_MAX = 4, so the chain folds
    with monkeypatch.context() as patched:
        patched.setattr(measure, "REFERENCE_DELTA_MAX", 4)
        _writes(chained, tmp_path, 1, start=3)
        previous = mf.read(chained)
        assert len(previous.reference.sample.deltas) == 4
        _writes(chained, tmp_path, 1, start=4)
    folded = _record(chained)
    assert folded["path"] == "references/r000006" and "deltas" not in folded
    assert list(folded["files"]) == [SAMPLE_FILE]
    # the previous version's chain is kept (a reader pinned to it, the writer's cleanup
    # rule), and still verifies; one write later it is gone
    verify(chained, previous)  # (checksums=True would check the history: newer)
    _writes(chained, tmp_path, 1, start=5)
    assert not (chained / "references/r000001").exists()
    assert sorted(p.name for p in (chained / "references").iterdir()) == [
        "r000006", "r000007"
    ]  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(measure, "REFERENCE_DELTA_MAX", 0)
        _writes(whole, tmp_path, 3, start=3)
    _same(_load(chained), _load(whole), serials=False)
    verify(chained, mf.read(chained), checksums=True)
    assert siblings(chained) == []


def test_a_missing_extra_or_corrupt_delta_is_named(tmp_path, model_dir):
    from flowsearch import build_index, upsert

    out = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=120, seed=4), out, model=str(model_dir))
    _writes(out, tmp_path, 2)
    piece = out / _record(out)["deltas"][0]["path"]
    path = piece / DELTA_FILE
    good = path.read_bytes()
    # corrupt, same size: only a checksum sees it (info --verify)
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))
    with pytest.raises(IndexDamaged, match=f"checksum mismatch for .*{DELTA_FILE}"):
        verify(out, mf.read(out), checksums=True)
    path.write_bytes(good)
    (piece / "stray.npz").write_bytes(b"x")  # a stray: listed, not damage
    assert verify(out, mf.read(out)).strays == (str(piece / "stray.npz"),)
    (piece / "stray.npz").unlink()
    path.unlink()
    with pytest.raises(IndexDamaged, match=f"missing.*{DELTA_FILE}"):
        verify(out, mf.read(out))
    before = mf.read(out).version
    with pytest.raises(IndexDamaged, match=DELTA_FILE):
        upsert(out, [{"id": "n1", "text": "a new passage"}])
    assert mf.read(out).version == before  # nothing written over the damage
