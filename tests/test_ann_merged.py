"""Each segment's search knob for the merged answer's recall (``flowsearch.ann.merged``), the
recall curve ``tune`` records for it, the version choosing knobs from the curves, and one
query's segments searched concurrently (issue 30: segments of a large index)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
from segment_helpers import add_segment, save_none_calibrator, template
from test_ann_tuning import _clustered, _exact

from flowsearch.ann import build as ab
from flowsearch.ann import factory as af
from flowsearch.ann import io as ann_io
from flowsearch.ann import merged
from flowsearch.ann import tune as at
from flowsearch.ann.merged import Curve, choose_knobs, merged_recall, rank_tails
from flowsearch.ann.policy import AnnPolicy
from flowsearch.ann.prefilter import filtered_search
from flowsearch.search.dense import SegmentHelpers
from flowsearch.storage import manifest as mf
from flowsearch.storage.writer import open_writer
from flowsearch.writes.merge import MergePolicy


def test_rank_tails_are_a_binomial_count_of_merged_rows():
    tails = rank_tails(10, 0.1)
    assert sum(tails) == pytest.approx(1.0)  # E[J] = k * share
    assert tails[0] == pytest.approx(1 - 0.9**10)
    assert all(a >= b for a, b in zip(tails, tails[1:], strict=False))
    assert rank_tails(10, 1.0) == pytest.approx([1.0] * 10)
    assert rank_tails(10, 3.0) == pytest.approx([1.0] * 10)  # a share past 1 is all rows


def test_merged_recall_is_the_recall_at_10_of_one_segment_holding_everything():
    found = [0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93, 0.92, 0.91, 0.9]
    assert merged_recall([found], [1.0]) == pytest.approx(np.mean(found))
    # split over 10 segments, each gives mostly its first rows: the merged recall is higher
    assert merged_recall([found] * 10, [0.1] * 10) > np.mean(found) + 0.02
    # assuming neighbours crowd into fewer segments (skew) brings deep ranks back in
    assert merged_recall([found] * 10, [0.1] * 10, skew=10) == pytest.approx(np.mean(found))


def _curve(values, found):
    return Curve("efSearch", tuple(values), tuple(tuple(f) for f in found))


def test_knobs_rise_only_where_they_buy_the_most_recall():
    steep = _curve([10, 20, 40], [[0.6] * 10, [0.9] * 10, [1.0] * 10])
    flat = _curve([10, 20, 40], [[0.97] * 10, [0.98] * 10, [1.0] * 10])
    chosen = choose_knobs([steep, flat], [500, 500], target=0.95)
    assert chosen[0] > chosen[1] == 10  # the steep curve is where recall is bought
    # exact segments (a float 1.0) count as found; None is returned for them
    assert choose_knobs([1.0, flat], [500, 500], target=0.95) == [None, 10]
    # unreachable: every curve at its own tuned (last) value
    assert choose_knobs([steep, flat], [1, 1], target=1.01) == [40, 40]


def test_chosen_knobs_meet_the_target_in_the_model():
    rng = np.random.default_rng(0)
    values = [10, 15, 20, 30, 40, 60]
    curves = []
    for _ in range(6):
        base = np.sort(rng.uniform(0.7, 0.9, size=10))[::-1]
        found = [np.minimum(1.0, base + 0.05 * i) for i in range(len(values))]
        curves.append(_curve(values, found))
    live = [1000, 2000, 3000, 500, 500, 3000]
    chosen = choose_knobs(curves, live, target=0.95, skew=1.5)
    shares = np.asarray(live) / sum(live)
    got = [c.found[c.values.index(v)] for c, v in zip(curves, chosen, strict=True)]
    assert merged_recall(got, shares, skew=1.5) >= 0.95
    # one step lower on any raised segment misses the target (the choice is not wasteful)
    for s, (c, v) in enumerate(zip(curves, chosen, strict=True)):
        i = c.values.index(v)
        if i and i < len(values) - 1:
            lower = list(got)
            lower[s] = c.found[i - 1]
            assert merged_recall(lower, shares, skew=1.5) < merged_recall(got, shares, skew=1.5)


def test_tune_records_a_recall_curve_ending_at_the_tuned_value():
    x = _clustered(3_000, 32, 30)
    index = af.new_index(32, "HNSW8")
    ab.add(index, x)
    t = at.tune(index, x, lambda: iter([x]), sample_rows=np.arange(len(x)), noise=0.5)
    value = int(t.params.split("=")[1])
    assert t.curve is not None and t.curve.name == "efSearch"
    assert t.curve.values[0] == 10 and t.curve.values[-1] == value
    assert list(t.curve.values) == sorted(set(t.curve.values))
    assert all(len(f) == 10 for f in t.curve.found)
    # the knob is left where the tuning put it, and the curve's last row is its recall
    assert faiss.downcast_index(index).hnsw.efSearch == value
    assert np.mean(t.curve.found[-1]) == pytest.approx((t.recall + t.tuned_recall) / 2, abs=0.01)
    # nearer ranks are found at least as often at a low knob as deeper ones, on average
    first = t.curve.found[0]
    assert np.mean(first[:3]) >= np.mean(first[-3:])
    assert at.knob_ladder(10, 64) == [10, 15, 20, 30, 40, 60, 64]
    assert at.knob_ladder(16, 16) == [16]


def test_a_knob_given_per_search_leaves_the_shared_index_alone():
    x = _clustered(2_000, 16, 20)
    q = _clustered(50, 16, 20, seed=0) + 0.01
    index = af.new_index(16, "HNSW8")
    ab.add(index, x)
    faiss.downcast_index(index).hnsw.efSearch = 400
    deep = ann_io.search(index, q, 10)
    shallow = ann_io.search(index, q, 10, knob=1)
    assert faiss.downcast_index(index).hnsw.efSearch == 400
    truth = _exact(q, x, 10)
    assert at.recall_at_k(shallow[1], truth) < at.recall_at_k(deep[1], truth)
    faiss.downcast_index(index).hnsw.efSearch = 1
    np.testing.assert_array_equal(ann_io.search(index, q, 10)[1], shallow[1])
    faiss.downcast_index(index).hnsw.efSearch = 400
    # the filtered paths take it too (deletions: post-filter; a filter: the ID selector)
    dead = np.zeros(len(x), bool)
    dead[::50] = True
    post = filtered_search(index, q, 10, excluded=dead, knob=1)[1]
    assert at.recall_at_k(post, truth) < at.recall_at_k(deep[1], truth)
    keep = np.arange(0, len(x), 2)
    sel_low = filtered_search(index, q, 10, keep, exact_below=0, knob=1)[1]
    sel_high = filtered_search(index, q, 10, keep, exact_below=0)[1]
    assert np.isin(sel_low[sel_low >= 0], keep).all()
    kept_truth = keep[_exact(q, x[keep], 10)]
    assert at.recall_at_k(sel_low, kept_truth) < at.recall_at_k(sel_high, kept_truth)


def _write(root, sizes, dim, seed=5, ann=None):
    """Segments of ``sizes`` rows cut in order from one clustered sample (rows ``r0``...)."""
    x = _clustered(sum(sizes), dim, 12, seed=seed)
    base = template(dim=dim, lexical=False)
    with open_writer(root, new=True) as writer:
        save_none_calibrator(writer, base.calibration, dim)
        start = 0
        for n in sizes:
            ids = [f"r{i}" for i in range(start, start + n)]
            add_segment(writer, ids, vectors=x[start : start + n], factory="auto",
                        lexical=False, dim=dim, ann=ann)  # fmt: skip
            start += n
        return writer.publish(kind="build", n_rows=start, template=base)


def _dense_recall(root, queries, helpers=None):
    """recall@10 of the version's dense side (every segment, knobs chosen by the version)
    against exact search over all rows; the knobs; the rows found."""
    from flowsearch.search import version as vmod
    from flowsearch.search.shards import SegmentSet

    v = vmod.load(root, mf.read(root), vmod.Opened(), with_encoder=False)
    found = SegmentSet(v, helpers=helpers).dense(queries, 10, None)[0][1]  # (cosines, rows), tops
    vectors = np.concatenate([seg.vectors(np.arange(seg.n_rows)) for seg in v.segments])
    return at.recall_at_k(found, _exact(queries, vectors, 10)), v.knobs(), found


def test_a_version_of_many_graph_segments_searches_each_below_its_own_tuning(tmp_path, monkeypatch):
    root = tmp_path / "idx"
    m = _write(root, [1_500] * 6 + [400], dim=32, ann=AnnPolicy(flat_max_rows=600))
    curves = [s.ann.tuning.curve for s in m.segments[:6]]
    assert all(c is not None and c.values[-1] == int(s.ann.params.split("=")[1])
               for c, s in zip(curves, m.segments, strict=False))  # fmt: skip
    assert mf.read(root).segments[0].ann.tuning.curve == curves[0]  # the manifest keeps it
    queries = _clustered(300, 32, 12, seed=5)  # fresh rows, the same centres
    with monkeypatch.context() as patch:  # rows spread as the segments' sizes (so they are here)
        patch.setattr(merged, "MERGED_SKEW", 1.0)
        recall, knobs, found = _dense_recall(root, queries)
    _, safer, _ = _dense_recall(root, queries)  # the default assumes crowding: higher knobs
    assert all(a <= b for a, b in zip(knobs[:6], safer[:6], strict=True))
    tuned = [int(s.ann.params.split("=")[1]) for s in m.segments[:6]]
    assert knobs[6] is None  # the Flat segment
    assert all(k <= t for k, t in zip(knobs[:6], tuned, strict=False))
    assert sum(knobs[:6]) < sum(tuned)  # cheaper than each tuned for its own top 10
    assert recall >= 0.95  # the merged answer still reaches the target
    helpers = SegmentHelpers(2)  # concurrent segments: the same answers
    _, _, again = _dense_recall(root, queries[:1], helpers)
    helpers.close()
    np.testing.assert_array_equal(again, found[:1])


def test_a_write_merged_at_once_builds_and_tunes_one_graph(tmp_path, model_dir, monkeypatch):
    """A write whose own new segment the policy merges in the same write builds that segment
    ``Flat`` (nothing searches it): the merged segment's graph is the one built and tuned."""
    from corpus_helpers import write_corpus

    from flowsearch import build_index, upsert
    from flowsearch.writes import segments as seg_mod

    root = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.parquet", n=20), root, model=str(model_dir),
                calibration="none", lexical=False)  # fmt: skip
    tuned, factories = [], []
    real_tune, real_init = seg_mod.tune_segment, seg_mod.SegmentBuilder.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        factories.append(self.factory)

    monkeypatch.setattr(seg_mod.SegmentBuilder, "__init__", init)
    monkeypatch.setattr(
        seg_mod, "tune_segment", lambda *a, **kw: tuned.append(1) or real_tune(*a, **kw)
    )

    def rows(first):
        return [{"id": f"n{i}", "text": f"a new row {i}"} for i in range(first, first + 8)]

    policies = {
        "ann": AnnPolicy(flat_max_rows=5),
        "merge": MergePolicy(
            floor_segment_rows=100, segments_per_tier=3, write_merge_max_rows=1_000
        ),
    }
    upsert(root, rows(0), **policies)  # two segments in the lowest tier: no merge, graph kept
    assert (factories, len(tuned)) == (["HNSW32"], 1)
    result = upsert(root, rows(8), **policies)  # the third: merged in the same write
    assert result.n_merged == 3 and len(mf.read(root).segments) == 1
    assert factories[1:] == ["Flat", "HNSW32"] and len(tuned) == 2  # one graph, tuned once
    assert mf.read(root).segments[0].ann.factory == "HNSW32"
    assert mf.read(root).n_live == 36
