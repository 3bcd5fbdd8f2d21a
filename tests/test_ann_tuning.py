"""``auto``'s vector index: tuning on held-out queries (:mod:`flowsearch.ann.tune`), the recall it
records in the manifest and ``info`` shows, the index each segment gets by its size and policy, a
merge building its index once, compact's re-tune, and the exact inner-product twin of a linear
calibrator (what lets an index over raw vectors answer the calibrated space)."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pytest
from segment_helpers import build_vectors

from flowsearch.ann import build as ab
from flowsearch.ann import factory as af
from flowsearch.ann import tune
from flowsearch.ann.policy import AnnPolicy
from flowsearch.calibration.linear import Gaussian, Whitening
from flowsearch.errors import BadInput
from flowsearch.storage import manifest as mf
from flowsearch.storage.writer import open_writer


def _clustered(n: int, dim: int, clusters: int, seed: int = 0, spread: float = 0.35) -> np.ndarray:
    """float32 (n, dim) unit rows around ``clusters`` seeded centres (the same centres for any
    ``n`` with this ``seed``; rows drawn with ``seed + n``)."""
    centres = np.random.default_rng(seed).normal(size=(clusters, dim))
    rng = np.random.default_rng(seed + n)
    x = centres[rng.integers(clusters, size=n)] + spread * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _anisotropic(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.geomspace(10.0, 0.05, dim)
    basis = np.linalg.qr(np.random.default_rng(99).normal(size=(dim, dim)))[0]
    return (rng.normal(size=(n, dim)) * scales) @ basis.T + 3.0


def _exact(q: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :k]


def linear_twin(
    x: np.ndarray, q: np.ndarray, mu: np.ndarray, rotation: np.ndarray, scales: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``v = (x - mu) / |z_x|`` and queries ``u = (q - mu) R S^-2 R^T / |z_q|`` of a linear
    calibrator ``z = ((x - mu) @ R) / s``: ``u . v`` is the calibrated cosine, since
    ``z_q . z_x = (q - mu) R S^-2 R^T (x - mu)^T``."""
    centred = np.asarray(x, np.float64) - mu
    v = centred / np.linalg.norm((centred @ rotation) / scales, axis=1, keepdims=True)
    zq = ((np.asarray(q, np.float64) - mu) @ rotation) / scales
    u = ((zq / scales) @ rotation.T) / np.linalg.norm(zq, axis=1, keepdims=True)
    return v.astype(np.float32), u.astype(np.float32)


@pytest.mark.parametrize(
    "calibrator, k", [(Gaussian(power=0.25), None), (Whitening(), None), (Whitening(k=12), 12)]
)
def test_the_linear_twin_ranks_rows_as_the_calibrated_cosine(calibrator, k):
    U, Uq = _anisotropic(600, 24, seed=1), _anisotropic(40, 24, seed=2)
    cal = calibrator.fit(U)
    Z, Zq = cal.transform(U), cal.transform(Uq)
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    Zq /= np.linalg.norm(Zq, axis=1, keepdims=True)
    rot, scales = cal.rotation[:, : k or 24], cal.scales[: k or 24]
    v, u = linear_twin(U, Uq, cal.mu, rot, scales)
    assert v.shape == (600, 24) and u.shape == (40, 24)  # the raw dimension, not k
    np.testing.assert_allclose(u @ v.T, Zq @ Z.T, atol=2e-5)  # the cosines themselves
    np.testing.assert_array_equal(_exact(u, v, 10), _exact(Zq, Z, 10))
    # and a FAISS inner-product index over v answers the calibrated space's exact top 10
    flat = faiss.IndexFlatIP(24)
    flat.add(v)
    assert (flat.search(u, 10)[1] == _exact(Zq, Z, 10)).mean() > 0.99  # float32 ties only
    # the twin keeps the raw geometry: v is the centred raw row, rescaled
    centred = U - cal.mu
    cos = np.sum(v * centred, axis=1) / (
        np.linalg.norm(v, axis=1) * np.linalg.norm(centred, axis=1)
    )
    np.testing.assert_allclose(cos, 1.0, atol=1e-5)


def test_held_out_queries_are_seeded_unit_rows_near_their_source():
    x = _clustered(500, 16, 10)
    q, pick = tune.held_out_queries(x, 64, noise=0.5, seed=3)
    assert q.shape == (64, 16) and q.dtype == np.float32 and pick.shape == (64,)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-5)
    q2, pick2 = tune.held_out_queries(x, 64, noise=0.5, seed=3)
    np.testing.assert_array_equal(q, q2)
    np.testing.assert_array_equal(pick, pick2)
    assert np.all(np.sum(q * x[pick], axis=1) > 0.7)  # near the row it came from


def test_the_source_row_is_left_out_of_answer_and_truth():
    rows = np.array([[4, 7, 1, 9], [2, 3, 5, 6]])
    got = tune._drop_source(rows, np.array([7, 8]), 3)
    assert got.tolist() == [[4, 1, 9], [2, 3, 5]]


def test_tuning_reaches_the_target_on_queries_it_never_saw():
    """A tiny synthetic case: HNSW tuned on held-out rows; its recall on fresh queries from the
    same distribution (not rows of the index) is the recall it recorded, give or take."""
    x = _clustered(4_000, 32, 40)
    index = af.new_index(32, "HNSW8")
    ab.add(index, x)
    pos = np.arange(0, len(x), 3)
    chunks = lambda: iter([x[:2_000], x[2_000:]])  # noqa: E731
    t = tune.tune(index, x[pos], chunks, sample_rows=pos, target=0.95, noise=0.5)
    name, _, value = t.params.partition("=")
    assert name == "efSearch" and faiss.downcast_index(index).hnsw.efSearch == int(value)
    assert t.tuned_recall >= 0.95 and t.queries == 256 and t.target == 0.95
    fresh = _clustered(600, 32, 40)  # different rows (seed + n), same centres
    found = index.search(fresh, 10)[1]
    real = tune.recall_at_k(found, _exact(fresh, x, 10))
    assert real >= 0.92 and abs(real - t.recall) < 0.05
    # lowering the knob below the tuned value loses recall on those fresh queries
    faiss.downcast_index(index).hnsw.efSearch = 1
    assert tune.recall_at_k(index.search(fresh, 10)[1], _exact(fresh, x, 10)) < real


def test_the_knob_is_the_larger_of_two_independent_picks_and_checked_on_a_third():
    """The probes are cut in thirds: the first two each choose the smallest knob that reaches
    the target on them alone, the larger is set, and the recall recorded is the last third's
    (queries the knob was not chosen on)."""
    x = _clustered(4_000, 32, 40, spread=0.6)
    index = af.new_index(32, "HNSW8")
    ab.add(index, x)
    pos = np.arange(0, len(x), 3)
    chunks = lambda: iter([x])  # noqa: E731
    picks, checks = [], []
    for seed in range(4):
        t = tune.tune(index, x[pos], chunks, sample_rows=pos, target=0.95, noise=1.0, seed=seed)
        q, truth, source = tune._probes(x[pos], pos, chunks, 768, 1.0, seed, 10)
        thirds = [tune._Queries(q[a:b], truth[a:b], source[a:b], 10)
                  for a, b in ((0, 256), (256, 512), (512, 768))]  # fmt: skip
        each = [tune._smallest(index, "efSearch", 16, 1024, part, 0.95)[0] for part in thirds[:2]]
        value = int(t.params.partition("=")[2])
        assert value == max(each)
        tune._set_knob(index, "efSearch", value)
        assert t.recall == thirds[2].recall(index) and t.queries == 256
        picks.append(each)
        checks.append(t.recall)
    assert any(a != b for a, b in picks)  # the thirds disagree, and the larger one wins


def test_a_graph_no_search_worth_making_brings_to_the_target_is_searched_exactly(
    caplog, monkeypatch
):
    """The cap reached and every deeper search too costly (as a graph of a hard large segment):
    the tuning says the segment is to be searched exactly, why (the recall its graph got), and
    warns with what would keep a graph; :func:`tune.exact_index` is its exact twin."""
    x = _clustered(4_000, 32, 40)
    index = af.new_index(32, "HNSW8")
    ab.add(index, x)
    pos = np.arange(0, len(x), 3)
    chunks = lambda: iter([x])  # noqa: E731
    monkeypatch.setattr(tune, "GRAPH_MAX_SCAN_SHARE", 0.01)  # no deeper search pays
    with caplog.at_level("WARNING", logger="flowsearch"):
        t = tune.tune(index, x[pos], chunks, sample_rows=pos, target=0.999, noise=0.5,
                      policy=AnnPolicy(max_ef_search=16))  # fmt: skip
    assert t.params == "" and t.recall == 1.0 and t.exact is not None
    assert "at efSearch 16 (target 0.999)" in t.exact and "recall@10 0." in t.exact
    assert "searched exactly" in caplog.text and "ef_construction" in caplog.text
    flat = tune.exact_index(index)
    assert isinstance(flat, faiss.IndexFlatIP) and flat.ntotal == len(x)
    _, found = flat.search(x[:50], 10)
    np.testing.assert_array_equal(found, _exact(x[:50], x, 10))
    caplog.clear()
    with caplog.at_level("WARNING", logger="flowsearch"):  # reachable: no warning
        kept = tune.tune(index, x[pos], chunks, sample_rows=pos, target=0.5, noise=0.5)
    assert "exactly" not in caplog.text and kept.exact is None


def test_a_graph_short_at_its_cap_is_searched_deeper_while_that_pays():
    """Hard queries and a low ``max_ef_search``: the tuning goes past the cap (doubling, then
    bisecting) and reaches the target, at an ``efSearch`` whose search computes distances to at
    most ``GRAPH_MAX_SCAN_SHARE`` of the rows."""
    x = _clustered(6_000, 32, 40)
    index = af.new_index(32, "HNSW8")
    ab.add(index, x)
    pos = np.arange(0, len(x), 3)
    chunks = lambda: iter([x])  # noqa: E731
    policy = AnnPolicy(max_ef_search=16)
    t = tune.tune(index, x[pos], chunks, sample_rows=pos, target=0.95, noise=0.8, policy=policy)
    assert t.exact is None and t.tuned_recall >= 0.95
    ef = int(t.params.removeprefix("efSearch="))
    assert ef > 16 and faiss.downcast_index(index).hnsw.efSearch == ef
    q, _ = tune.held_out_queries(x, 200, noise=0.8, seed=3)
    faiss.cvar.hnsw_stats.reset()
    index.search(q, 10)
    assert faiss.cvar.hnsw_stats.ndis / len(q) <= tune.GRAPH_MAX_SCAN_SHARE * len(x) * 1.2


def test_auto_writes_a_segment_its_graph_cannot_serve_as_flat_and_info_says_why(
    tmp_path, monkeypatch
):
    """Through a write: the segment is stored as ``Flat`` (searched exactly, so every answer
    is the exact one), its tuning records why, and ``info`` shows it."""
    from flowsearch.ann import io as ann_io
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info

    monkeypatch.setattr(tune, "GRAPH_MAX_SCAN_SHARE", 0.001)
    root = tmp_path / "idx"
    m = _write(root, [1_500], "auto", dim=16,
               ann=AnnPolicy(flat_max_rows=600, max_ef_search=4, target_recall=0.999))  # fmt: skip
    seg = m.segments[0]
    assert seg.ann.factory == "Flat" and seg.ann.params == ""
    assert seg.ann.tuning is not None and seg.ann.tuning.exact is not None
    assert seg.ann.tuning.recall == 1.0
    text = dict(_info_rows(index_info(root)))["vector index recall"]
    assert "exact (Flat): its graph reached recall@10" in text and "target 0.999" in text
    index = ann_io.read_index(root / seg.dir / seg.ann.path)
    assert isinstance(faiss.downcast_index(index), faiss.IndexFlatIP) and index.ntotal == 1_500
    x = index.reconstruct_n(0, index.ntotal)
    np.testing.assert_array_equal(index.search(x[:20], 10)[1], _exact(x[:20], x, 10))


def test_a_small_index_tunes_its_knob_on_harder_queries(monkeypatch):
    """Below ``QUERY_NOISE_ROWS`` the knob is chosen at a noise raised per decade fewer rows
    (recorded), which needs a larger knob; the recall curve (what a search over segments
    allocates from) stays at ``QUERY_NOISE``, so it is the curve an unraised tuning draws."""
    assert tune.noise_for_rows(50_000) == tune.noise_for_rows(10**7) == tune.QUERY_NOISE
    assert tune.noise_for_rows(5_000) == pytest.approx(tune.QUERY_NOISE + 1.5)
    with monkeypatch.context() as patch:
        patch.setattr(tune, "QUERY_NOISE_PER_DECADE", 0.5)
        assert tune.noise_for_rows(5_000) == pytest.approx(tune.QUERY_NOISE + 0.5)
    x = _clustered(4_000, 32, 40, spread=0.6)
    index = af.new_index(32, "HNSW8")
    ab.add(index, x)
    pos = np.arange(0, len(x), 3)
    chunks = lambda: iter([x])  # noqa: E731
    with monkeypatch.context() as patch:  # 4,000 rows: the standard noise
        patch.setattr(tune, "QUERY_NOISE_ROWS", 4_000)
        plain = tune.tune(index, x[pos], chunks, sample_rows=pos, target=0.95)
    raised = tune.tune(index, x[pos], chunks, sample_rows=pos, target=0.95)
    assert plain.noise == tune.QUERY_NOISE
    assert raised.noise == pytest.approx(tune.noise_for_rows(4_000)) and raised.noise > plain.noise
    value = lambda t: int(t.params.partition("=")[2])  # noqa: E731
    assert value(raised) > value(plain)
    assert plain.curve is not None and raised.curve is not None
    # each ladder ends at its own chosen knob: the knobs both measured give the same curve
    both = set(plain.curve.values) & set(raised.curve.values)
    assert len(both) >= 2
    for curve_a, curve_b in ((plain.curve, raised.curve), (raised.curve, plain.curve)):
        at = dict(zip(curve_a.values, curve_a.found, strict=True))
        for v, found in zip(curve_b.values, curve_b.found, strict=True):
            if v in both:
                assert at[v] == found


def test_an_exact_index_needs_no_tuning():
    x = _clustered(300, 8, 5)
    flat = af.new_index(8, "Flat")
    ab.add(flat, x)
    t = tune.tune(flat, x, lambda: iter([x]))
    assert (t.params, t.recall, t.queries) == ("", 1.0, 0)


def test_auto_indexes_each_segment_by_its_size():
    policy = AnnPolicy(flat_max_rows=5_000, graph_max_rows=50_000)
    assert af.auto_factory(5_000, policy) == "Flat"
    assert af.auto_factory(5_001, policy) == "HNSW32"
    assert af.auto_factory(50_000, policy) == "HNSW32"
    assert af.auto_factory(60_000, policy, dim=64).endswith(",RFlat")
    assert af.auto_factory(5_001, AnnPolicy(graph_factory="HNSW16")) == "Flat"
    assert af.auto_factory(10_001, AnnPolicy(graph_factory="HNSW16")) == "HNSW16"
    from flowsearch.writes.segments import resolve_factory

    small = AnnPolicy(flat_max_rows=100)
    assert resolve_factory("auto", 100, 8, small) == "Flat"
    assert resolve_factory("auto", 101, 8, small) == "HNSW32"
    assert resolve_factory("IVF4,Flat", 101, 8, small) == "IVF4,Flat"
    assert resolve_factory("auto", 101, 8) == "Flat"  # the defaults: Flat up to 10,000 rows


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("flat_max_rows", -1, "flat_max_rows must be an integer of at least 0"),
        ("flat_max_rows", 2.5, "flat_max_rows must be an integer"),
        ("graph_max_rows", 10, "graph_max_rows (10) is below flat_max_rows"),
        ("ef_construction", 0, "ef_construction must be an integer of at least 1"),
        ("max_ef_search", True, "max_ef_search must be an integer"),
        ("target_recall", 0.0, "target_recall must be a number in (0, 1]"),
        ("target_recall", 1.01, "target_recall must be a number in (0, 1]"),
        ("graph_factory", "", "graph_factory must be a FAISS factory string"),
        ("graph_factory", "auto", "graph_factory must be a FAISS factory string"),
    ],
)
def test_a_bad_policy_is_refused_in_one_line(field, value, words):
    with pytest.raises(BadInput) as err:
        AnnPolicy(**{field: value})
    assert words in str(err.value) and "\n" not in str(err.value) and err.value.param == field


def test_a_policy_is_passed_not_global(tmp_path):
    """Two writes with different policies in one process: each segment as its own write
    asked, and the defaults untouched."""
    strict = AnnPolicy(flat_max_rows=600, target_recall=0.99, ef_construction=40)
    a = _write(tmp_path / "a", [1_200], "auto", ann=strict)
    b = _write(tmp_path / "b", [1_200], "auto")
    assert a.segments[0].ann.factory == "HNSW32" and a.segments[0].ann.tuning.target == 0.99
    assert b.segments[0].ann.factory == "Flat" and b.segments[0].ann.tuning is None
    assert AnnPolicy() == AnnPolicy(flat_max_rows=10_000, target_recall=0.95)
    with pytest.raises(BadInput, match="ann must be an AnnPolicy"):
        from flowsearch.ann.policy import policy_or_default

        policy_or_default({"flat_max_rows": 5})  # type: ignore[arg-type]


#: What the tests' small segments are built under: a graph from 600 rows on.
SMALL = AnnPolicy(flat_max_rows=600)


def _write(
    root: Path, sizes: list[int], factory: str, dim: int = 16, ann: AnnPolicy | None = None
) -> mf.Manifest:
    vectors = [_clustered(n, dim, 12, seed=5 + at) for at, n in enumerate(sizes)]
    return build_vectors(root, vectors, factory, dim, ann=ann)


def test_the_tuned_recall_is_recorded_per_segment_and_shown_by_info(tmp_path):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info

    root = tmp_path / "idx"
    m = _write(root, [1_200, 400], "auto", ann=SMALL)
    big, small = m.segments
    assert big.ann.factory == "HNSW32" and small.ann.factory == "Flat"
    assert small.ann.tuning is None and big.ann.tuning is not None
    tuning = big.ann.tuning
    assert 0.9 <= tuning.recall <= 1.0 and tuning.target == 0.95 and tuning.queries > 0
    assert big.ann.params == f"efSearch={int(big.ann.params.split('=')[1])}"
    again = mf.read(root).segments[0].ann.tuning  # survives the manifest's round trip
    assert again == tuning
    info = index_info(root)
    shown = info.to_dict()["segments"][0]["ann"]["tuning"]
    assert shown["recall"] == pytest.approx(tuning.recall) and shown["noise"] == tuning.noise
    text = dict(_info_rows(info))["vector index recall"]
    assert f"recall@10 {tuning.recall:.3f}" in text and big.name in text and "held-out" in text


def test_a_merge_builds_and_tunes_the_merged_index_once(tmp_path, monkeypatch):
    from flowsearch.writes import segments as seg_mod
    from flowsearch.writes.merge import merge

    root = tmp_path / "idx"
    policy = AnnPolicy(flat_max_rows=500)
    base = _write(root, [300, 300, 300], "auto", ann=policy)
    assert [s.ann.factory for s in base.segments] == ["Flat"] * 3
    made, tuned = [], []
    real_new, real_tune = seg_mod.ann_build.segment_index, seg_mod.tune_segment
    monkeypatch.setattr(
        seg_mod.ann_build, "segment_index", lambda *a: made.append(a) or real_new(*a)
    )
    monkeypatch.setattr(
        seg_mod, "tune_segment", lambda *a, **kw: tuned.append(a) or real_tune(*a, **kw)
    )
    with open_writer(root) as writer:
        record = merge(writer, [s.name for s in base.segments], dim=16, requested="auto",
                       lexical=False, schema=(), ann=policy)  # fmt: skip
        writer.publish(kind="compact", n_rows=record.n_rows)
    assert len(made) == 1 and len(tuned) == 1
    assert record.ann.factory == "HNSW32" and record.ann.tuning is not None
    assert record.n_rows == 900


def _make_stale(root: Path, name: str, params: str, tuner: int | None = None, **kw) -> None:
    """Rewrite segment ``name``'s record as another release left it: ``params`` as its knob and
    a tuning by rule ``tuner`` (None: before versions were recorded; ``tuning=None`` in ``kw``:
    before tunings were), its files hard-linked as an upgrade does."""
    from flowsearch.storage.upgrade import linked_stage

    with open_writer(root) as writer:
        seg = next(s for s in writer.segments if s.name == name)
        old = kw.get("tuning", seg.ann.tuning)
        if old is not None:
            old = old.model_copy(update={"tuner": tuner, "queries": 256})
        ann = seg.ann.model_copy(update={"params": params, "tuning": old})
        writer.relink_segment(name, linked_stage(writer, seg), dict(seg.files), ann=ann)
        writer.publish(kind="compact", n_rows=0)


def test_compact_retunes_a_segment_an_older_rule_tuned_without_rebuilding_it(tmp_path):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info
    from flowsearch.writes.compact import compact

    root = tmp_path / "idx"
    fresh = _write(root, [1_200, 400], "auto", ann=SMALL)
    big = fresh.segments[0]
    assert big.ann.tuning.tuner == tune.TUNER_VERSION
    _make_stale(root, big.name, "efSearch=16")
    stale = mf.read(root).segments[0]
    assert stale.ann.params == "efSearch=16" and stale.ann.tuning.tuner is None
    text = dict(_info_rows(index_info(root)))["vector index recall"]
    assert "older rule" in text and "flowsearch compact" in text
    index_file = root / stale.dir / stale.ann.path
    result = compact(root)
    assert result.n_retuned == 1 and result.n_merged == 0 and result.n_written == 0
    m = mf.read(root)
    done = m.segments[0]
    assert done.name != stale.name and done.n_rows == 1_200  # a new record, at the same place
    assert done.ann.params == big.ann.params  # the same rule, the same seed: the same knob
    assert done.ann.tuning == big.ann.tuning
    assert done.files == stale.files  # nothing rebuilt: the files are the same bytes
    assert (root / done.dir / done.ann.path).stat().st_ino == index_file.stat().st_ino
    assert m.segments[1] == fresh.segments[1]  # the Flat segment is left alone
    assert m.last_write.detail["retuned"] == 1
    assert "older rule" not in dict(_info_rows(index_info(root)))["vector index recall"]
    again = compact(root)  # nothing left to do: no version written
    assert again.version == m.version and again.n_retuned == 0


def test_compact_leaves_a_user_factory_s_knob_alone(tmp_path, monkeypatch):
    from flowsearch.storage import keys
    from flowsearch.writes.compact import compact

    root = tmp_path / "idx"
    with monkeypatch.context() as patch:  # no key_ids.arrow: compact has work to do
        patch.setattr(keys, "save_ids", lambda directory, ids: None)
        m = _write(root, [1_200], "HNSW32")
    assert m.ann_requested == "HNSW32" and m.segments[0].ann.tuning is None
    _make_stale(root, m.segments[0].name, "efSearch=77", tuning=None)  # the user's knob
    result = compact(root)
    assert result.n_retuned == 0 and result.version == m.version + 2  # the key ids only
    seg = mf.read(root).segments[0]
    assert seg.ann.params == "efSearch=77" and seg.ann.tuning is None


def test_compact_tunes_a_segment_written_before_tunings_were_recorded(tmp_path):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info
    from flowsearch.writes.compact import compact

    root = tmp_path / "idx"
    m = _write(root, [1_200], "auto", ann=SMALL)
    _make_stale(root, m.segments[0].name, "efSearch=40", tuning=None)
    text = dict(_info_rows(index_info(root)))["vector index recall"]
    assert "not measured" in text and "flowsearch compact" in text
    assert compact(root).n_retuned == 1
    seg = mf.read(root).segments[0]
    assert seg.ann.tuning == m.segments[0].ann.tuning and seg.ann.params == m.segments[0].ann.params


def test_a_newer_release_s_tuning_is_left_alone(tmp_path):
    from flowsearch.cli.search import _info_rows
    from flowsearch.search.version import index_info
    from flowsearch.writes.compact import compact

    root = tmp_path / "idx"
    m = _write(root, [1_200], "auto", ann=SMALL)
    _make_stale(root, m.segments[0].name, "efSearch=40", tuner=tune.TUNER_VERSION + 1)
    version = mf.read(root).version
    assert "older rule" not in dict(_info_rows(index_info(root)))["vector index recall"]
    result = compact(root)
    assert result.n_retuned == 0 and result.version == version
    assert mf.read(root).segments[0].ann.params == "efSearch=40"


def test_a_segment_that_cannot_be_retuned_keeps_its_knob_and_compact_goes_on(
    tmp_path, monkeypatch, caplog
):
    from flowsearch.writes import compact as compact_mod

    root = tmp_path / "idx"
    m = _write(root, [1_200, 100, 100, 100, 100], "auto", ann=SMALL)  # four small ones merge
    _make_stale(root, m.segments[0].name, "efSearch=16")

    def broken(index, reader, policy, queries=None):
        raise RuntimeError("Error in faiss::read_index: bad magic")

    monkeypatch.setattr(compact_mod, "segment_tuning", broken)
    result = compact_mod.compact(root)
    assert result.n_retuned == 0 and result.n_merged == 4  # the merge still happened
    assert mf.read(root).segments[0].ann.params == "efSearch=16"
    assert "keeps its knob" in caplog.text and "bad magic" in caplog.text


def test_compact_says_what_it_retuned(tmp_path):
    from typer.testing import CliRunner

    from flowsearch.cli import app

    root = tmp_path / "idx"
    m = _write(root, [1_200], "auto", ann=SMALL)
    _make_stale(root, m.segments[0].name, "efSearch=16")
    out = CliRunner().invoke(app, ["compact", "--index", str(root)])
    assert out.exit_code == 0, out.output
    assert "re-tuned 1 segment an older rule had tuned" in " ".join(out.output.split())


def test_one_compact_gives_an_old_segment_its_key_ids_and_retunes_it(tmp_path, monkeypatch):
    from flowsearch.storage import keys
    from flowsearch.storage.layout import KEY_IDS_FILE
    from flowsearch.storage.verify import verify
    from flowsearch.writes.compact import compact

    root = tmp_path / "idx"
    with monkeypatch.context() as patch:
        patch.setattr(keys, "save_ids", lambda directory, ids: None)  # as before key_ids.arrow
        m = _write(root, [1_200], "auto", ann=SMALL)
    assert KEY_IDS_FILE not in m.segments[0].files
    _make_stale(root, m.segments[0].name, "efSearch=16")
    result = compact(root)
    assert result.n_retuned == 1
    done = mf.read(root)
    seg = done.segments[0]
    assert KEY_IDS_FILE in seg.files and seg.ann.tuning.tuner == tune.TUNER_VERSION
    assert seg.ann.params == m.segments[0].ann.params
    assert done.last_write.detail == {"merged": 0, "dropped": 0, "key_ids": 1, "retuned": 1}
    verify(root, done, checksums=True)  # every file as its record says, key files included
    assert not list(root.rglob(".stage*"))  # the key ids' stage, replaced, is gone too


def test_a_re_tune_that_would_search_exactly_keeps_the_graph_s_knob(tmp_path, monkeypatch, caplog):
    """``compact`` re-tunes in place (no rebuild): a tuning that finds the graph short of its
    target leaves the segment as it was, with a warning naming why and what to do."""
    from flowsearch.writes import compact as compact_mod

    root = tmp_path / "idx"
    m = _write(root, [1_200], "auto", ann=SMALL)
    _make_stale(root, m.segments[0].name, "efSearch=16")
    real = compact_mod.segment_tuning

    def short(index, reader, policy, queries=None):
        params, tuning = real(index, reader, policy, queries)
        return "", tuning.model_copy(update={"exact": "graph reached recall@10 0.5", "recall": 1.0})

    monkeypatch.setattr(compact_mod, "segment_tuning", short)
    with caplog.at_level("WARNING", logger="flowsearch"):
        result = compact_mod.compact(root)
    assert result.n_retuned == 0
    seg = mf.read(root).segments[0]
    assert seg.ann.params == "efSearch=16" and seg.ann.factory == "HNSW32"
    assert "graph reached recall@10 0.5" in caplog.text and "rebuild the index" in caplog.text


def test_a_compact_whose_only_re_tune_fails_writes_no_version(tmp_path, monkeypatch):
    from flowsearch.writes import compact as compact_mod

    root = tmp_path / "idx"
    m = _write(root, [1_200], "auto", ann=SMALL)
    _make_stale(root, m.segments[0].name, "efSearch=16")
    version = mf.read(root).version

    def broken(index, reader, policy, queries=None):
        raise RuntimeError("Error in faiss::read_index: bad magic")

    monkeypatch.setattr(compact_mod, "segment_tuning", broken)
    result = compact_mod.compact(root)
    assert result.n_retuned == 0 and result.version == version == mf.read(root).version


def test_a_cap_below_the_first_knob_is_where_the_tuning_starts_going_deeper():
    """``AnnPolicy.max_ef_search`` below the tuner's first efSearch (16) is where the tuning
    starts; short there, it goes on only as deep as a graph search pays."""
    import faiss

    from flowsearch.ann import tune as ann_tune
    from flowsearch.ann.policy import AnnPolicy

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.index_factory(16, "HNSW16", faiss.METRIC_INNER_PRODUCT)
    index.add(x)
    tuned = ann_tune.tune_segment(index, lambda: iter([x]), AnnPolicy(max_ef_search=4))
    assert tuned.params == "efSearch=4" or tuned.exact is not None or tuned.tuned_recall >= 0.95


def test_recall_of_a_segment_smaller_than_k_counts_the_rows_it_has():
    """Truth padded with -1 (fewer than k other rows): finding them all is recall 1 (it read
    0.6 for a 6-row segment, which then looked short of any target), a miss still counts."""
    from flowsearch.ann.tune import recall_at_k

    truth = np.array([[3, 1, 4, 2, 5, -1, -1, -1, -1, -1]])
    assert recall_at_k(np.array([[1, 2, 3, 4, 5, -1, -1, -1, -1, -1]]), truth) == 1.0
    assert recall_at_k(np.array([[1, 2, 3, 4, 0, -1, -1, -1, -1, -1]]), truth) == 0.8
    full = np.arange(10)[None, :]
    assert recall_at_k(full[:, ::-1], full) == 1.0 and recall_at_k(full + 5, full) == 0.5
