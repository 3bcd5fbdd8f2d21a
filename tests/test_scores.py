"""flowsearch.search.scores: the reference (against brute force), each side's normalisation, the
BM25 upper bound against the product's own BM25, and nonsense queries on the sample corpus."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowsearch.errors import BadInput, IndexDamaged
from flowsearch.search.scores import (
    LEXICAL_MATCH,
    ONE_OCCURRENCE,
    FusionReference,
    build_reference,
    normalise_dense,
    normalise_lexical,
)

REPO = Path(__file__).resolve().parents[1]


def _unit_rows(rng: np.random.Generator, n: int, dim: int, offset: float) -> np.ndarray:
    """Unit rows around a shared direction (``offset`` makes them anisotropic)."""
    x = rng.normal(size=(n, dim)) + offset
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("offset", [0.0, 1.0, 3.0])
def test_background_is_the_mean_cosine_between_distinct_rows(offset):
    rng = np.random.default_rng(0)
    Z = _unit_rows(rng, 60, 8, offset)
    cos = Z @ Z.T
    brute = (cos.sum() - np.trace(cos)) / (60 * 59)
    ref = build_reference(Z.sum(0), 60)
    assert ref.dense_background == pytest.approx(brute, abs=1e-9)
    assert ref.n_measured == 0 and ref.n_rows == 60
    # from reference rows: each one's mean cosine to the other rows, averaged
    some = np.array([3, 10, 41])
    per_row = [(cos[r].sum() - cos[r, r]) / 59 for r in some]
    by_rows = build_reference(Z.sum(0), 60, Z[some])
    assert by_rows.dense_background == pytest.approx(np.mean(per_row), abs=1e-9)
    assert by_rows.n_measured == 3
    if offset:  # an anisotropic corpus has a clearly positive background
        assert ref.dense_background > 0.3


def test_reference_round_trips_through_json_and_refuses_damage():
    ref = build_reference(np.array([3.0, 1.0]), 10)
    text = json.dumps(ref.to_dict())
    assert len(text) < 200
    assert FusionReference.from_dict(json.loads(text)) == ref
    with pytest.raises(IndexDamaged, match="malformed"):
        FusionReference.from_dict({"n_measured": 0, "n_rows": 10})
    with pytest.raises(IndexDamaged, match="malformed"):
        FusionReference.from_dict({"n_measured": 0, "n_rows": 10, "dense_background": "x"})
    with pytest.raises(IndexDamaged, match="below 1"):
        FusionReference.from_dict({"n_measured": 0, "n_rows": 10, "dense_background": 1.0})
    with pytest.raises(IndexDamaged, match="below 1"):
        FusionReference(0, 10, math.nan)


def test_build_reference_refuses_bad_input():
    with pytest.raises(BadInput, match="at least 2"):
        build_reference(np.ones(3), 1)
    with pytest.raises(BadInput, match="reference rows"):
        build_reference(np.ones(3), 5, np.ones((2, 4)))


def test_normalise_dense_maps_background_to_0_and_identity_to_1():
    ref = FusionReference(0, 100, 0.2)
    got = normalise_dense(np.array([[-0.5, 0.1, 0.2, 0.6, 1.0, np.nan]]), ref)
    np.testing.assert_allclose(got[0, :5], [0.0, 0.0, 0.0, 0.5, 1.0])
    assert np.isnan(got[0, 5])
    # no reference (an index built before it): a background of 0
    np.testing.assert_allclose(normalise_dense(np.array([-0.3, 0.4]), None), [0.0, 0.4])


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-0.99, 0.95),
    # cosines as stored (float32-like precision); 1e-81 apart would round to one value
    st.lists(st.floats(-1.0, 1.0).map(lambda v: round(v, 6)), min_size=2, max_size=20),
)
def test_normalise_dense_is_in_0_1_and_increasing(background, cosines):
    x = np.unique(cosines)  # sorted, distinct
    got = normalise_dense(x, FusionReference(0, 10, background))
    assert np.all((got >= 0) & (got <= 1))
    assert np.all(np.diff(got) >= 0)
    assert np.all(np.diff(got[x > background]) > 0)  # strictly above the background


def test_normalise_lexical_is_the_share_of_the_upper_bound():
    scores = np.array([[6.0, 1.5, -np.inf], [3.0, np.nan, 0.0], [2.0, 1.0, 0.0]])
    got = normalise_lexical(scores, np.array([10.0, 3.0, 0.0]), match=None)
    np.testing.assert_allclose(got[0], [0.6, 0.15, 0.0])
    assert got[1, 0] == 1.0 and np.isnan(got[1, 1]) and got[1, 2] == 0.0
    np.testing.assert_allclose(got[2], [0.0, 0.0, 0.0])  # a query without terms
    with pytest.raises(BadInput, match="upper"):
        normalise_lexical(scores, np.array([1.0, 2.0]))


def test_normalise_lexical_stretches_the_share_so_a_full_match_scores_high():
    """Every query term once at average length (share 1 / (1 + k1)) scores LEXICAL_MATCH; the
    map is linear below it, reaches 1 only at the bound, and keeps the order and [0, 1]."""
    upper = np.array([10.0])
    at = normalise_lexical(np.array([[10 * ONE_OCCURRENCE, 5 * ONE_OCCURRENCE, 0.0, 10.0]]), upper)
    np.testing.assert_allclose(at[0], [LEXICAL_MATCH, LEXICAL_MATCH / 2, 0.0, 1.0])
    assert pytest.approx(1 / (1 + 1.5)) == ONE_OCCURRENCE and 0.5 < LEXICAL_MATCH < 1
    share = np.linspace(0, 1, 1001)[None, :]
    got = normalise_lexical(10 * share, upper)
    assert np.all(np.diff(got) > 0) and got.min() == 0.0 and got.max() == pytest.approx(1.0)
    assert np.all(got >= share)  # a stretch: never below the share
    got = normalise_lexical(10 * share, upper, match=0.6)
    assert got[0, 400] == pytest.approx(0.6)
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(BadInput, match="match"):
            normalise_lexical(share, upper, match=bad)


def _upper_bound(texts: list[str], query: str) -> float:
    """The upper bound as documented (lucene: sum of the query tokens' idf, df 0 if unknown)."""
    from flowsearch.lexical.tokens import tokenize, tokenize_batch

    df: dict[str, int] = {}
    for doc in tokenize_batch(texts):
        for term in set(doc):
            df[term] = df.get(term, 0) + 1
    n = len(texts)
    return sum(
        math.log(1 + (n - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5)) for t in tokenize(query)
    )


def _bm25(texts: list[str]):
    from flowsearch.lexical.bm25 import Bm25
    from flowsearch.lexical.postings import Postings

    return Bm25([(Postings.build(texts), None)])


def test_no_row_reaches_the_documented_bm25_upper_bound():
    """The bound holds for the product's BM25, even for a row repeating the query's terms, and
    the product's ``Bm25.upper_bound`` is the documented bound."""

    rng = np.random.default_rng(3)
    words = [
        "tide",
        "moon",
        "sea",
        "salt",
        "wave",
        "shore",
        "boat",
        "net",
        "fish",
        "rope",
        "storm",
        "gull",
    ]
    texts = [" ".join(rng.choice(words, rng.integers(1, 12))) for _ in range(80)]
    texts.append("tide tide tide tide tide tide tide tide moon moon moon moon")  # saturating
    lex = _bm25(texts)
    for query in ("tide moon", "storm gull gull", "tide zebra", "fish"):
        scores, rows = lex.search([query], len(texts))
        upper = _upper_bound(texts, query)
        assert lex.upper_bound(query) == pytest.approx(upper, rel=1e-5)
        found = scores[0][rows[0] >= 0]
        assert len(found) and np.all(found < upper)
        share = normalise_lexical(scores, np.array([upper]))[0]
        assert np.all((share >= 0) & (share < 1))
    # a term the corpus lacks weighs as the rarest term: a half-nonsense query stays low
    scores, _ = lex.search(["tide zebra"], 1)
    half = normalise_lexical(scores, np.array([_upper_bound(texts, "tide zebra")]))[0, 0]
    whole = normalise_lexical(lex.search(["tide"], 1)[0], np.array([_upper_bound(texts, "tide")]))[
        0, 0
    ]
    assert half < 0.5 * whole


# -- the bundled model on the sample corpus ---------------------------------------------------

NONSENSE = ["asdf qwerty zxcv", "zzzz xxxx", "qwpoeiru aslkdjf", "the of and"]


@pytest.mark.slow
def test_nonsense_queries_score_low_on_the_sample_corpus():
    """Measured on the bundled model: nonsense tops out near 0.18 dense (the sample queries
    start at 0.40) and 0 lexical; the hybrid at the shipped weight stays below 0.2 (the sample
    queries start at 0.28; benchmarks/RESULTS.md has the dev-set figures)."""
    import pyarrow.parquet as pq

    from flowsearch import Encoder
    from flowsearch.search.fusion import DENSE_WEIGHT

    texts = pq.read_table(REPO / "data" / "sample.parquet").column("text").to_pylist()
    queries = [q["query"] for q in json.loads((REPO / "tests" / "sample_queries.json").read_text())]
    enc = Encoder()
    V = enc.encode(texts)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    ref = build_reference(V.sum(0), len(V))
    lex = _bm25(texts)
    w = DENSE_WEIGHT

    def top(group: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        Q = enc.encode(group)
        Q /= np.linalg.norm(Q, axis=1, keepdims=True)
        dense = normalise_dense(Q @ V.T, ref)
        bm25 = np.zeros_like(dense)
        for i, q in enumerate(group):
            s, r = lex.search([q], len(texts))
            bm25[i, r[0][r[0] >= 0]] = s[0][r[0] >= 0]
        upper = np.array([_upper_bound(texts, q) for q in group])
        lexical = normalise_lexical(bm25, upper)
        return dense.max(1), lexical.max(1), (w * dense + (1 - w) * lexical).max(1)

    d_bad, l_bad, h_bad = top(NONSENSE)
    d_good, _, h_good = top(queries)
    assert np.all(d_bad < 0.3) and np.all(h_bad < 0.2)
    assert l_bad[0] == 0.0 and l_bad[-1] == 0.0  # no corpus term; stopwords only
    assert d_good.min() > d_bad.max() and h_good.min() > h_bad.max()


def _background(vectors: np.ndarray) -> float:
    """The mean cosine over distinct pairs of unit rows, by brute force."""
    cos = vectors.astype(np.float64) @ vectors.astype(np.float64).T
    n = len(vectors)
    return float((cos.sum() - np.trace(cos)) / (n * (n - 1)))


def test_every_write_keeps_the_dense_background_current(tmp_path, model_dir):
    """The background a dense score is measured from is the mean cosine between the live rows
    of the version searched, after a build, an add of other material, a delete and a full
    compaction (which changes no score)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from corpus_helpers import sentences, write_corpus

    from flowsearch.search.searcher import Searcher
    from flowsearch.writes.build import build_index
    from flowsearch.writes.compact import compact
    from flowsearch.writes.delete import delete
    from flowsearch.writes.upsert import add_to_index

    idx = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "a.parquet", n=80, seed=1), idx, model=str(model_dir))

    def measured() -> tuple[float, np.ndarray, int]:
        searcher = Searcher.open(idx)
        try:
            version = searcher.version
            return version.fusion().dense_background, searcher.vectors(), len(version.segments)
        finally:
            searcher.close()

    first, stored, _ = measured()
    assert first == pytest.approx(_background(stored), abs=1e-9)
    short = sentences(60, seed=7, length=(2, 3))  # other material: two- and three-word texts
    other = pa.table({"id": [f"b{i}" for i in range(60)], "text": short,
                      "topic": ["x"] * 60, "year": pa.array([2000] * 60, pa.int32())})  # fmt: skip
    pq.write_table(other, tmp_path / "b.parquet")
    add_to_index(idx, tmp_path / "b.parquet")
    grown, stored, n_segments = measured()
    assert n_segments == 2 and len(stored) == 140
    assert grown == pytest.approx(_background(stored), abs=1e-9)
    delete(idx, [f"d{i}" for i in range(0, 80, 2)])
    after_delete, stored, _ = measured()
    live = np.r_[np.arange(1, 80, 2), np.arange(80, 140)]  # d1, d3, ..., then b0..b59
    assert len(stored) == 140 and after_delete == pytest.approx(_background(stored[live]), 1e-9)
    compact(idx, full=True)
    compacted, kept, n_segments = measured()
    assert n_segments == 1 and len(kept) == 100
    assert compacted == pytest.approx(after_delete, abs=1e-9)  # compaction changes no score
    # each write that changed the live rows moved it: none was left stale
    assert len({round(first, 6), round(grown, 6), round(after_delete, 6)}) == 3
