"""flowsearch.search.fusion: the shipped fusion (hand-computed, and its properties under
hypothesis: bounded, monotone, independent of the other candidates), and nonsense queries
through the Searcher on the sample corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowsearch.errors import BadInput
from flowsearch.search import fusion
from flowsearch.search.fusion import FusedHits, fuse
from flowsearch.search.scores import (
    LEXICAL_MATCH,
    ONE_OCCURRENCE,
    FusionReference,
    normalise_lexical,
)

REPO = Path(__file__).resolve().parents[1]
REF = FusionReference(n_measured=0, n_rows=1000, dense_background=0.1)


def _hits(*queries: list[tuple[int, float]], width: int | None = None):
    """(scores float32 (q, width), rows int64 (q, width)) from per-query [(row, score)], -1 pad."""
    width = width or max(len(q) for q in queries)
    scores = np.full((len(queries), width), -np.inf, np.float32)
    rows = np.full((len(queries), width), -1, np.int64)
    for i, q in enumerate(queries):
        for j, (row, score) in enumerate(q):
            rows[i, j], scores[i, j] = row, score
    return scores, rows


def _random_side(rng: np.random.Generator, q: int, width: int, n_rows: int):
    rows = np.stack([rng.choice(n_rows, size=width, replace=False) for _ in range(q)])
    scores = -np.sort(-rng.normal(size=(q, width)), axis=1).astype(np.float32)
    rows[:, width - 2 :] = -1  # some padding
    return scores, rows.astype(np.int64)


def _shipped(dense, lexical, k):
    """fuse() with BM25 upper bounds of 10 (the random BM25 is N(0, 1))."""
    return _shipped_at(dense, lexical, k, weight=0.5)


def _shipped_at(dense, lexical, k, weight):
    return fuse(dense, lexical, REF, k, upper=np.full(len(dense[0]), 10.0), weight=weight)


def test_rows_come_only_from_candidates_once_each():
    rng = np.random.default_rng(1)
    dense, lexical = _random_side(rng, 8, 10, 25), _random_side(rng, 8, 15, 25)
    out: FusedHits = _shipped(dense, lexical, 12)
    assert out.rows.shape == out.scores.shape == (8, 12)
    for i in range(8):
        got = out.rows[i][out.rows[i] >= 0]
        union = set(dense[1][i][dense[1][i] >= 0]) | set(lexical[1][i][lexical[1][i] >= 0])
        assert len(got) == len(set(got)) == min(12, len(union))
        assert set(got) <= union
        assert np.all(np.diff(out.scores[i][: len(got)]) <= 0)  # best first
        # padding past the last hit
        assert np.all(out.rows[i, len(got) :] == -1)
        assert np.all(np.isneginf(out.scores[i, len(got) :]))
        # NaN exactly where a side did not return the row
        in_dense = np.isin(got, dense[1][i])
        assert np.array_equal(~np.isnan(out.dense_scores[i][: len(got)]), in_dense)


def test_duplicate_rows_in_a_side_keep_their_best_place():
    out = _shipped(_hits([(5, 0.9), (6, 0.8), (5, 0.1)]), _hits([]), 3)
    assert out.rows.tolist() == [[5, 6, -1]]
    np.testing.assert_allclose(out.dense_scores[0, :2], [0.9, 0.8])


def test_sides_may_have_different_widths_and_many_queries():
    dense = _hits([(1, 0.5)], [(2, 0.4), (3, 0.3)], width=4)
    lexical = _hits([(9, 1.0), (1, 0.5), (8, 0.1)], [], width=6)
    out = fuse(dense, lexical, REF, 3, upper=np.array([10.0, 10.0]), weight=0.5)
    assert out.rows.tolist() == [[1, 9, 8], [2, 3, -1]]


def test_bad_arguments_are_refused():
    side = _hits([(1, 0.5)])
    with pytest.raises(ValueError, match="weight"):
        _shipped_at(side, side, 2, weight=1.5)
    with pytest.raises(ValueError, match="k must"):
        _shipped(side, side, 0)
    with pytest.raises(ValueError, match="queries"):
        fuse(side, _hits([(1, 0.5)], [(2, 0.1)]), REF, 2, upper=np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match="2-D shape"):
        _shipped((np.zeros(3), np.zeros(3, int)), side, 2)


# -- the shipped rule ---------------------------------------------------------------------------


def test_fuse_hand_computed_with_complete_scores():
    # background 0.1: dense = (cos - 0.1) / 0.9; lexical = BM25 / 10
    dense = _hits([(4, 0.91), (7, 0.55)])
    lexical = _hits([(7, 6.0), (2, 2.0)])
    out = fuse(dense, lexical, REF, k=3, upper=np.array([10.0]), weight=0.5,
               dense_of_lexical=np.array([[0.55, 0.1]]),
               lexical_of_dense=np.array([[0.0, 6.0]]), lexical_match=None)  # fmt: skip
    # 7: 0.5 * 0.5 + 0.5 * 0.6 = 0.55; 4: 0.5 * 0.9 = 0.45; 2: 0.5 * 0 + 0.5 * 0.2 = 0.1
    assert out.rows.tolist() == [[7, 4, 2]]
    np.testing.assert_allclose(out.scores[0], [0.55, 0.45, 0.1], atol=1e-6)
    # the default lexical score stretches the share: 0.4 of the bound reads LEXICAL_MATCH
    out = fuse(dense, lexical, REF, k=3, upper=np.array([10.0]), weight=0.5,
               dense_of_lexical=np.array([[0.55, 0.1]]),
               lexical_of_dense=np.array([[0.0, 6.0]]))  # fmt: skip
    lex = normalise_lexical(np.array([[6.0, 0.0, 2.0]]), np.array([10.0]))[0]
    assert lex[2] == pytest.approx(0.2 * LEXICAL_MATCH / ONE_OCCURRENCE) and lex[0] > LEXICAL_MATCH
    np.testing.assert_allclose(out.scores[0], 0.5 * np.array([0.5, 0.9, 0.0]) + 0.5 * lex)
    np.testing.assert_allclose(out.dense_scores[0], [0.55, 0.91, 0.1], rtol=1e-6)
    np.testing.assert_allclose(out.lexical_scores[0], [6.0, 0.0, 2.0])
    assert out.rows.dtype == np.int64 and out.scores.dtype == np.float64
    assert out.dense_scores.dtype == out.lexical_scores.dtype == np.float32
    # partial scores: a side's unknown score is its floor (0); the raw figure is NaN
    out = fuse(dense, lexical, REF, k=3, upper=np.array([10.0]), weight=0.5, lexical_match=None)
    np.testing.assert_allclose(out.scores[0], [0.55, 0.45, 0.1], atol=1e-6)
    assert np.isnan(out.lexical_scores[0, 1]) and np.isnan(out.dense_scores[0, 2])


@pytest.mark.parametrize("weight", [0.1, 0.2, 0.3, 0.55, 0.9])
def test_a_lone_weak_lexical_candidate_does_not_outrank_a_strong_dense_one(weight):
    """Row 5: cosine 0.85, no query term; row 9: a single weak BM25 match (2% of the bound),
    cosine 0.12. The second release's min-max gave row 9 the whole lexical weight."""
    dense, lexical = _hits([(5, 0.85)]), _hits([(9, 0.2)])
    complete = {"dense_of_lexical": np.array([[0.12]]), "lexical_of_dense": np.array([[0.0]])}
    for extra in (complete, {}):
        out = fuse(dense, lexical, REF, k=2, upper=np.array([10.0]), weight=weight, **extra)
        assert out.rows.tolist() == [[5, 9]]
        assert out.scores[0, 1] < 0.05


def _universe(draw, n: int):
    cos = draw(st.lists(st.floats(-0.3, 1.0).map(lambda v: round(v, 5)), min_size=n, max_size=n))
    bm25 = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0, 7.5]), min_size=n, max_size=n))
    return np.array(cos), np.array(bm25)


def _side_lists(cos, bm25, rows_d, rows_l):
    """Each side's candidates (its own order) and the complete scores of the other side's."""
    rows_d = np.array(sorted(rows_d, key=lambda r: (-cos[r], r)), np.int64)
    rows_l = np.array(sorted(rows_l, key=lambda r: (-bm25[r], r)), np.int64)
    dense = (cos[rows_d][None], rows_d[None])
    lexical = (bm25[rows_l][None], rows_l[None])
    return dense, lexical, {"dense_of_lexical": cos[rows_l][None],
                            "lexical_of_dense": bm25[rows_d][None]}  # fmt: skip


@st.composite
def _candidates_and_newcomers(draw):
    n = draw(st.integers(6, 30))
    cos, bm25 = _universe(draw, n)
    rows = list(range(n))
    rows_d = draw(st.lists(st.sampled_from(rows), min_size=1, max_size=n, unique=True))
    rows_l = draw(st.lists(st.sampled_from(rows), min_size=1, max_size=n, unique=True))
    extra = draw(st.integers(1, 8))
    new_cos, new_bm25 = _universe(draw, extra)
    side = draw(st.sampled_from(["dense", "lexical"]))
    weight = draw(st.floats(0.0, 1.0))
    return cos, bm25, rows_d, rows_l, new_cos, new_bm25, side, weight


@settings(max_examples=300, deadline=None)
@given(_candidates_and_newcomers())
def test_a_hit_keeps_its_score_when_unrelated_rows_join_the_other_side(case):
    cos, bm25, rows_d, rows_l, new_cos, new_bm25, side, weight = case
    n = len(cos)
    upper = np.array([10.0])
    before = fuse(*_side_lists(cos, bm25, rows_d, rows_l)[:2], REF, 2 * n, upper=upper,
                  weight=weight, **_side_lists(cos, bm25, rows_d, rows_l)[2])  # fmt: skip
    all_cos, all_bm25 = np.r_[cos, new_cos], np.r_[bm25, new_bm25]
    newcomers = list(range(n, n + len(new_cos)))
    grown_d = rows_d + newcomers if side == "dense" else rows_d
    grown_l = rows_l + newcomers if side == "lexical" else rows_l
    dense, lexical, complete = _side_lists(all_cos, all_bm25, grown_d, grown_l)
    after = fuse(dense, lexical, REF, 2 * n + len(newcomers), upper=upper, weight=weight,
                 **complete)  # fmt: skip
    old = {int(r): s for r, s in zip(before.rows[0], before.scores[0], strict=True) if r >= 0}
    new = {int(r): s for r, s in zip(after.rows[0], after.scores[0], strict=True) if r >= 0}
    assert {r: new[r] for r in old} == old  # exactly the same score for every earlier hit
    kept = [int(r) for r in after.rows[0] if 0 <= r < n]
    assert kept == [int(r) for r in before.rows[0] if r >= 0]  # and the same order among them


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-1.0, 1.0), st.floats(0.0, 12.0)), min_size=1, max_size=12),
    st.floats(0.0, 1.0),
    st.integers(0, 11),
    st.floats(0.0, 0.5),
    st.sampled_from(["dense", "lexical"]),
)
def test_scores_are_in_0_1_and_monotone_in_each_side(pairs, weight, which, bump, side):
    cos = np.array([p[0] for p in pairs])
    bm25 = np.array([p[1] for p in pairs])
    rows = list(range(len(pairs)))
    upper = np.array([12.0])

    def score_of(c, b, row):
        out = fuse(*_side_lists(c, b, rows, rows)[:2], REF, len(rows), upper=upper,
                   weight=weight, **_side_lists(c, b, rows, rows)[2])  # fmt: skip
        return float(out.scores[0][list(out.rows[0]).index(row)]), out

    row = which % len(pairs)
    s0, out = score_of(cos, bm25, row)
    valid = out.scores[0][out.rows[0] >= 0]
    assert np.all((valid >= 0) & (valid <= 1)) and np.all(np.diff(valid) <= 0)
    c2, b2 = cos.copy(), bm25.copy()
    if side == "dense":
        c2[row] = min(c2[row] + bump, 1.0)
    else:
        b2[row] = min(b2[row] + 10 * bump, 12.0)
    s1, _ = score_of(c2, b2, row)
    assert s1 >= s0


def test_fuse_ties_go_to_the_lower_row_whatever_the_input_order():
    a = fuse(_hits([(8, 0.5), (3, 0.5)]), _hits([], width=1), REF, 2, upper=np.array([1.0]))
    b = fuse(_hits([(3, 0.5), (8, 0.5)]), _hits([], width=1), REF, 2, upper=np.array([1.0]))
    assert a.rows.tolist() == b.rows.tolist() == [[3, 8]]


def test_fuse_default_weight_comes_from_the_constants_per_kind(monkeypatch):
    dense, lexical = _hits([(1, 0.9), (2, 0.2)]), _hits([(2, 9.0), (1, 0.5)])
    kw = {"upper": np.array([10.0]), "dense_of_lexical": np.array([[0.2, 0.9]]),
          "lexical_of_dense": np.array([[0.5, 9.0]])}  # fmt: skip
    monkeypatch.setattr(fusion, "DENSE_WEIGHT", 1.0)
    monkeypatch.setattr(fusion, "DENSE_WEIGHT_STATIC", 0.0)
    assert fuse(dense, lexical, REF, 2, **kw).rows.tolist() == [[1, 2]]
    assert fuse(dense, lexical, REF, 2, kind="static", **kw).rows.tolist() == [[2, 1]]
    with pytest.raises(BadInput, match="kind"):
        fuse(dense, lexical, REF, 2, kind="onnx", **kw)  # type: ignore[arg-type]


def test_default_weight_falls_with_passages_per_document(monkeypatch):
    from flowsearch.search.fusion import default_weight

    for name, value in (("DENSE_WEIGHT", 0.6), ("LENGTH_SLOPE", 0.2),
                        ("DENSE_WEIGHT_STATIC", 0.3), ("LENGTH_SLOPE_STATIC", 0.1)):  # fmt: skip
        monkeypatch.setattr(fusion, name, value)
    assert default_weight("transformer") == 0.6  # an index of short texts
    assert default_weight("transformer", 1.0) == 0.6
    assert default_weight("transformer", np.e) == pytest.approx(0.4)
    assert default_weight("transformer", np.e**2) > default_weight("transformer", np.e**3)
    assert default_weight("transformer", 1e9) == 0.0  # clipped
    assert default_weight("static", np.e) == pytest.approx(0.2)
    for bad in (0.5, float("nan"), float("inf")):
        with pytest.raises(BadInput, match="passages_per_document"):
            default_weight("transformer", bad)
    dense, lexical = _hits([(1, 0.9), (2, 0.2)]), _hits([(2, 9.0), (1, 0.5)])
    kw = {"upper": np.array([10.0]), "dense_of_lexical": np.array([[0.2, 0.9]]),
          "lexical_of_dense": np.array([[0.5, 9.0]])}  # fmt: skip
    monkeypatch.setattr(fusion, "DENSE_WEIGHT", 1.0)
    monkeypatch.setattr(fusion, "LENGTH_SLOPE", 1.0)
    assert fuse(dense, lexical, REF, 2, **kw).rows.tolist() == [[1, 2]]
    assert fuse(dense, lexical, REF, 2, passages_per_document=10.0,
                **kw).rows.tolist() == [[2, 1]]  # fmt: skip


def test_fuse_refuses_bad_arguments():
    side = _hits([(1, 0.5)])
    with pytest.raises(BadInput, match="weight"):
        fuse(side, side, REF, 2, upper=np.array([1.0]), weight=-0.1)
    with pytest.raises(BadInput, match="upper"):
        fuse(side, side, REF, 2, upper=np.array([1.0, 2.0]))
    with pytest.raises(BadInput, match="dense_of_lexical"):
        fuse(side, side, REF, 2, upper=np.array([1.0]), dense_of_lexical=np.zeros((1, 3)))
    with pytest.raises(BadInput, match="k must"):
        fuse(side, side, REF, 0, upper=np.array([1.0]))


# -- through the Searcher, on the sample corpus with the bundled model ------------------------


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from flowsearch import build_index

    where = tmp_path_factory.mktemp("sample") / "idx"
    build_index(REPO / "data" / "sample.parquet", where)
    return where


def test_nonsense_query_does_not_max_out_through_the_searcher(sample_index):
    from flowsearch import Searcher

    s = Searcher.open(sample_index)
    queries = [q["query"] for q in json.loads((REPO / "tests" / "sample_queries.json").read_text())]
    for mode, cut in (("hybrid", 0.2), ("dense", 0.3), ("lexical", 0.05)):
        bad = s.search("asdf qwerty zxcv", k=1, mode=mode)
        assert not bad or bad[0].score < cut, (mode, bad[0].score)
        good = [hits[0].score for hits in s.search(queries, k=1, mode=mode)]
        assert all(0.0 <= g <= 1.0 for g in good)
        if mode != "lexical":  # BM25 misses some paraphrased questions altogether
            assert min(good) > cut
    hit = s.search("asdf qwerty zxcv", k=1, mode="hybrid")[0]
    assert hit.dense_score is not None and -1.0 <= hit.dense_score <= 1.0
