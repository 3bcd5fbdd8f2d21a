"""flowsearch.search.fusion: convex and reciprocal-rank fusion on hand-computed and random
candidates."""

from __future__ import annotations

import numpy as np
import pytest

from flowsearch.search.fusion import FusedHits, convex, rrf


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


def test_convex_hand_computed():
    # dense: 10 -> (0.9-0.5)/(0.9-0.5)=1, 11 -> 0.5, 12 -> 0; lexical: 12 -> 1, 13 -> 0.25, 10 -> 0
    dense = _hits([(10, 0.9), (11, 0.7), (12, 0.5)])
    lexical = _hits([(12, 8.0), (13, 3.5), (10, 2.0)])
    out = convex(dense, lexical, k=5, weight=0.4)
    # fused: 10 = 0.4, 11 = 0.2, 12 = 0.6, 13 = 0.6 * 0.25 = 0.15
    assert out.rows.tolist() == [[12, 10, 11, 13, -1]]
    np.testing.assert_allclose(out.scores[0, :4], [0.6, 0.4, 0.2, 0.15], rtol=1e-6)
    assert out.scores[0, 4] == -np.inf
    np.testing.assert_allclose(out.dense_scores[0], [0.5, 0.9, 0.7, np.nan, np.nan], rtol=1e-6)
    np.testing.assert_allclose(out.lexical_scores[0], [8.0, 2.0, np.nan, 3.5, np.nan])
    assert out.rows.dtype == np.int64 and out.scores.dtype == np.float32
    assert out.dense_scores.dtype == out.lexical_scores.dtype == np.float32


def test_rrf_hand_computed():
    dense = _hits([(10, 0.9), (11, 0.7), (12, 0.5)])
    lexical = _hits([(12, 8.0), (13, 3.5)])
    out = rrf(dense, lexical, k=4, k_rrf=1)
    # 10: 1/2; 11: 1/3; 12: 1/4 + 1/2 = 3/4; 13: 1/3 (ties 11, best rank 2 each -> lower row)
    assert out.rows.tolist() == [[12, 10, 11, 13]]
    np.testing.assert_allclose(out.scores[0], [0.75, 0.5, 1 / 3, 1 / 3], rtol=1e-6)
    np.testing.assert_allclose(out.lexical_scores[0], [8.0, np.nan, np.nan, 3.5])


def test_rrf_ties_go_to_the_lower_row():
    # 9 and 3 are both first on one side (1/61), 5 and 6 both second (1/62)
    out = rrf(_hits([(9, 0.9), (5, 0.1)]), _hits([(3, 7.0), (6, 2.0)]), k=4)
    assert out.rows.tolist() == [[3, 9, 5, 6]]
    # in both lists beats first in one: 1/61 + 1/63 > 1/61
    out = rrf(_hits([(5, 3.0), (6, 2.0), (8, 1.0)]), _hits([(7, 3.0), (2, 2.0), (5, 1.0)]), k=2)
    assert out.rows.tolist() == [[5, 7]]


def test_weight_one_is_dense_order_and_zero_is_lexical_order():
    rng = np.random.default_rng(0)
    dense, lexical = _random_side(rng, 6, 12, 40), _random_side(rng, 6, 12, 40)
    for weight, side in ((1.0, dense), (0.0, lexical)):
        out = convex(dense, lexical, k=30, weight=weight)
        for i in range(6):
            own = side[1][i][side[1][i] >= 0]
            assert out.rows[i, : len(own)].tolist() == own.tolist()


@pytest.mark.parametrize("fuse", [lambda d, lx, k: convex(d, lx, k, 0.3), rrf])
def test_rows_come_only_from_candidates_once_each(fuse):
    rng = np.random.default_rng(1)
    dense, lexical = _random_side(rng, 8, 10, 25), _random_side(rng, 8, 15, 25)
    out: FusedHits = fuse(dense, lexical, 12)
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


def test_convex_ties_are_deterministic():
    # 1 and 2 tie on everything: the lower row first, whatever the input order
    a = convex(_hits([(2, 1.0), (1, 1.0), (3, 0.0)]), _hits([]), k=3, weight=0.5)
    b = convex(_hits([(1, 1.0), (2, 1.0), (3, 0.0)]), _hits([]), k=3, weight=0.5)
    assert a.rows.tolist() == b.rows.tolist() == [[1, 2, 3]]
    # equal fused score: the heavier side decides (dense at weight 0.5)
    out = convex(_hits([(4, 0.9), (7, 0.5)]), _hits([(7, 12.0), (2, 3.0)]), k=3, weight=0.5)
    assert out.rows.tolist() == [[4, 7, 2]]
    out = convex(_hits([(4, 0.9), (7, 0.5)]), _hits([(7, 12.0), (2, 3.0)]), k=3, weight=0.4)
    assert out.rows.tolist() == [[7, 4, 2]]


def test_convex_sides_with_zero_or_one_candidate():
    # no lexical candidate: fused = weight * normalised dense
    out = convex(_hits([(3, 0.8), (4, 0.2)]), _hits([], width=3), k=3, weight=0.7)
    assert out.rows.tolist() == [[3, 4, -1]]
    np.testing.assert_allclose(out.scores[0, :2], [0.7, 0.0], atol=1e-7)
    assert np.isnan(out.lexical_scores[0]).all()
    # one lexical candidate: it is that side's best (1), not its worst
    out = convex(_hits([(3, 0.8), (4, 0.2)]), _hits([(4, 5.0)]), k=2, weight=0.5)
    assert out.rows.tolist() == [[3, 4]]
    np.testing.assert_allclose(out.scores[0], [0.5, 0.5])
    # no candidate on either side: all padding
    out = convex(_hits([], width=2), _hits([], width=2), k=2, weight=0.5)
    assert out.rows.tolist() == [[-1, -1]] and np.isneginf(out.scores).all()


def test_duplicate_rows_in_a_side_keep_their_best_place():
    out = rrf(_hits([(5, 0.9), (6, 0.8), (5, 0.1)]), _hits([]), k=3)
    assert out.rows.tolist() == [[5, 6, -1]]
    np.testing.assert_allclose(out.dense_scores[0, :2], [0.9, 0.8])


def test_sides_may_have_different_widths_and_many_queries():
    dense = _hits([(1, 0.5)], [(2, 0.4), (3, 0.3)], width=4)
    lexical = _hits([(9, 1.0), (1, 0.5), (8, 0.1)], [], width=6)
    out = convex(dense, lexical, k=3, weight=0.5)
    assert out.rows.tolist() == [[1, 9, 8], [2, 3, -1]]


def test_bad_arguments_are_refused():
    side = _hits([(1, 0.5)])
    with pytest.raises(ValueError, match="weight"):
        convex(side, side, k=2, weight=1.5)
    with pytest.raises(ValueError, match="k must"):
        convex(side, side, k=0, weight=0.5)
    with pytest.raises(ValueError, match="k_rrf"):
        rrf(side, side, k=2, k_rrf=0)
    with pytest.raises(ValueError, match="queries"):
        rrf(side, _hits([(1, 0.5)], [(2, 0.1)]), k=2)
    with pytest.raises(ValueError, match="2-D shape"):
        rrf((np.zeros(3), np.zeros(3, int)), side, k=2)
