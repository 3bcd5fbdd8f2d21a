"""flowsearch.lexical.tokens and flowsearch.lexical.bm25: tokenisation, BM25 against bm25s,
top-k, filters, bounds on k, score_rows and upper_bound."""

from __future__ import annotations

import tracemalloc

import bm25s
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lexical_helpers import QUERIES, WORDS, all_scores, bits, corpus

from flowsearch.errors import BadInput
from flowsearch.lexical.bm25 import Bm25, idf
from flowsearch.lexical.postings import Postings
from flowsearch.lexical.tokens import tokenize, tokenize_batch


def _bm25(texts: list[str], **kwargs) -> Bm25:
    return Bm25([(Postings.build(texts), None)], **kwargs)


# -- tokenisation ----------------------------------------------------------------------------


def test_tokenize_lowercases_stems_and_drops_stopwords():
    assert tokenize("The Cats were RUNNING, and it RUNS!") == ["cat", "were", "run", "run"]
    assert tokenize("heat-pumps_2024") == ["heat", "pump", "2024"]


@pytest.mark.parametrize(
    "text",
    ["", "   ", "?!... --- ,,,", "\u200b\t\n", "東京タワーに行く", "Ελληνικά κείμενα", "😀🚀"],
)
def test_tokenize_never_crashes(text):
    terms = tokenize(text)
    assert isinstance(terms, list) and all(isinstance(t, str) and t for t in terms)


def test_tokenize_folds_unicode_forms():
    assert tokenize("ＦＵＬＬ width") == tokenize("full width")  # NFKC
    assert tokenize("Straße") == tokenize("strasse")  # case folding
    assert tokenize("Ελληνικά") == ["ελληνικά"]  # other scripts pass through


def test_tokenize_batch_equals_one_at_a_time():
    texts = corpus(50) + ["", "?!", "東京"]
    assert tokenize_batch(texts) == [tokenize(t) for t in texts]


def test_non_string_text_is_a_clear_error():
    with pytest.raises(BadInput, match="text 1 is NoneType, not a string; give every row"):
        tokenize_batch(["ok", None])  # type: ignore[list-item]


# -- scores equal bm25s ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_scores_equal_bm25s(method):
    texts = corpus(300, min_len=1)
    bm25 = _bm25(texts, k1=1.2, b=0.7, method=method)
    ref = bm25s.BM25(k1=1.2, b=0.7, method=method)
    ref.index(tokenize_batch(texts), show_progress=False)
    positive = 0
    for query in QUERIES:
        expected = ref.get_scores(tokenize(query))
        positive += int(np.count_nonzero(expected))
        np.testing.assert_allclose(all_scores(bm25, query), expected, rtol=1e-5, atol=1e-6)
    assert positive > 100


def test_robertson_idf_is_clipped_at_zero_like_bm25s():
    # a term in most rows has a negative Robertson idf; bm25s (and so we) clip it to 0
    assert idf("robertson", 9, 10) == 0.0 and idf("lucene", 9, 10) > 0
    bm25 = _bm25(["tide"] * 9 + ["moon"], method="robertson")
    assert bm25.search("tide", k=3)[1].tolist() == [[0, 1, 2]]
    assert np.all(bm25.search("tide", k=3)[0] == 0)


def test_search_is_exact_top_k_best_first_with_row_ties():
    texts = corpus(400, seed=1)
    bm25 = _bm25(texts)
    ref = bm25s.BM25()
    ref.index(tokenize_batch(texts), show_progress=False)
    scores, rows = bm25.search(QUERIES, k=25)
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and rows.shape == (5, 25)
    for i, query in enumerate(QUERIES):
        full = ref.get_scores(tokenize(query)).astype(np.float32)
        hit = np.flatnonzero(full > 0)
        truth = hit[np.lexsort((hit, -full[hit]))][:25]
        np.testing.assert_array_equal(rows[i][: len(truth)], truth)
        assert np.all(np.diff(scores[i][rows[i] >= 0]) <= 0)


def test_ties_go_to_the_lower_row():
    bm25 = _bm25(["solar roof", "wind farm", "solar roof", "solar roof", "rain"])
    scores, rows = bm25.search(["solar"], k=5)
    assert rows.tolist() == [[0, 2, 3]]  # three hits: the answer is three wide
    assert scores[0][0] == scores[0][1] == scores[0][2] > 0


def test_answer_width_is_the_most_hits_and_shorter_queries_are_padded():
    bm25 = _bm25(["solar roof", "wind farm", "solar roof", "rain"])
    scores, rows = bm25.search(["solar", "wind", "zebra"], k=100)
    assert rows.tolist() == [[0, 2], [1, -1], [-1, -1]]
    assert np.isneginf(scores[1, 1]) and np.all(np.isneginf(scores[2]))


def test_queries_without_known_terms_have_no_hits():
    bm25 = _bm25(corpus(50))
    scores, rows = bm25.search(["", "the and of", "zebra quantum", "?!", "東京"], k=3)
    assert rows.shape == scores.shape == (5, 0)


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "3"])
def test_k_must_be_a_positive_integer(k):
    bm25 = _bm25(corpus(20))
    with pytest.raises(BadInput, match="k must be an integer >= 1") as err:
        bm25.search(["tide"], k=k)
    assert err.value.param == "k"


def test_one_string_is_one_query_and_numpy_k_works():
    bm25 = _bm25(corpus(20))
    assert bm25.search("tide", k=np.int64(2))[1].shape == (1, 2)


def test_empty_postings_and_empty_texts():
    empty = _bm25([])
    assert empty.n_rows == 0 and empty.search(["tide"], k=2)[1].shape == (1, 0)
    bm25 = _bm25(["", "?!", "tide"])
    assert bm25.n_rows == 3 and bm25.search(["tide"], k=3)[1].tolist() == [[2]]


def test_k_of_a_billion_allocates_with_the_hits_not_with_k():
    bm25 = _bm25(corpus(300, seed=12))
    bm25.search(QUERIES, k=10)  # first-use caches (vocabulary dict) out of the measure
    tracemalloc.start()
    try:
        scores, rows = bm25.search(QUERIES, k=10**9)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows.shape[1] == (rows >= 0).sum(axis=1).max() <= 300
    assert peak < 2**20  # (5, 10**9) float32 + int64 would be 60 GB; 300 rows need kilobytes


def test_unknown_method_and_bad_parameters_are_refused():
    p = Postings.build(["a b"])
    with pytest.raises(BadInput, match="unknown BM25 method 'bm25l'") as err:
        Bm25([(p, None)], method="bm25l")  # type: ignore[arg-type]
    assert err.value.param == "method"
    for k1, b in ((-1.0, 0.5), (1.2, 1.5), (float("nan"), 0.5)):
        with pytest.raises(BadInput, match="k1 >= 0 and b in"):
            Bm25([(p, None)], k1=k1, b=b)


def test_deleted_masks_are_checked():
    p = Postings.build(corpus(10))
    with pytest.raises(BadInput, match=r"deleted must be a bool array of shape \(10,\)"):
        Bm25([(p, np.zeros(9, bool))])
    with pytest.raises(BadInput, match="deleted must be a bool array"):
        Bm25([(p, np.zeros(10, np.int8))])  # type: ignore[list-item]


# -- allowed (a where filter) ------------------------------------------------------------------


def test_allowed_restricts_candidates_not_statistics():
    texts = corpus(500, seed=2)
    bm25 = _bm25(texts)
    allowed = np.random.default_rng(3).random(500) < 0.1
    scores, rows = bm25.search(QUERIES, k=10, allowed=allowed)
    for i, query in enumerate(QUERIES):
        full = all_scores(bm25, query)  # unfiltered: the filter changes no score
        hit = np.flatnonzero((full > 0) & allowed)
        truth = hit[np.lexsort((hit, -full[hit]))][:10]
        got = rows[i][rows[i] >= 0]
        np.testing.assert_array_equal(got, truth)
        np.testing.assert_array_equal(bits(scores[i][: len(got)]), bits(full[got]))


def test_allowed_must_be_a_full_bool_mask():
    bm25 = _bm25(corpus(10))
    for bad in (np.ones(9, bool), np.ones(10, int), [True] * 10):
        with pytest.raises(BadInput, match="allowed must be a bool array") as err:
            bm25.search(["tide"], 3, allowed=bad)  # type: ignore[arg-type]
        assert err.value.param == "allowed"


# -- segments, deletions and the statistics ----------------------------------------------------


def test_df_and_statistics_count_live_rows_of_every_segment():
    a = Postings.build(["tide moon", "tide", "sun"])
    b = Postings.build(["tide tide", "rain"])
    bm25 = Bm25([(a, np.array([False, True, False])), (b, None)])
    assert (bm25.n_rows, bm25.n_live) == (5, 4)
    assert bm25.df("tide") == 2 and bm25.df("moon") == 1 and bm25.df("zebra") == 0
    assert bm25.avg_length == (2 + 1 + 2 + 1) / 4
    np.testing.assert_array_equal(bm25.offsets, [0, 3, 5])


def test_deleted_rows_are_never_returned():
    texts = corpus(200, seed=5)
    deleted = np.random.default_rng(5).random(200) < 0.3
    bm25 = Bm25([(Postings.build(texts), deleted)])
    rows = bm25.search(QUERIES, k=200)[1]
    assert not np.isin(rows[rows >= 0], np.flatnonzero(deleted)).any()


def test_everything_deleted_has_no_hits_and_no_division_by_zero():
    p = Postings.build(["tide moon", "", "?!"])
    with np.errstate(all="raise"):
        bm25 = Bm25([(p, np.array([True, False, False]))])
        assert bm25.search(["tide"], k=2)[1].shape == (1, 0)
    assert bm25.n_live == 2 and bm25.avg_length == 1.0


# -- score_rows and upper_bound ----------------------------------------------------------------


def test_score_rows_equals_search_scores_bit_for_bit():
    texts = corpus(300, seed=6)
    cut = [(Postings.build(texts[:120]), None), (Postings.build(texts[120:]), None)]
    deleted = np.zeros(180, bool)
    deleted[::7] = True
    bm25 = Bm25([cut[0], (cut[1][0], deleted)])
    for query in QUERIES:
        scores, rows = bm25.search(query, k=40)
        others = np.array([0, 121, 299, 5, 127])  # 127: the second segment's deleted row 7
        got = bm25.score_rows(query, np.concatenate([rows[0], others]))
        assert got.dtype == np.float32 and rows.shape[1] > 10
        n = rows.shape[1]
        np.testing.assert_array_equal(bits(got[:n]), bits(scores[0]))
        np.testing.assert_array_equal(bits(got[n:]), bits(all_scores(bm25, query)[others]))
    assert bm25.score_rows("leaf", [120])[0] == 0  # deleted (120 is segment 2's row 0)


def test_score_rows_of_rows_without_terms_is_zero_and_refuses_other_rows():
    bm25 = _bm25(["tide", "moon"])
    assert bm25.score_rows("zebra", [0, 1]).tolist() == [0.0, 0.0]
    assert bm25.score_rows("tide", []).shape == (0,)
    with pytest.raises(BadInput, match="row 2 is outside the version's rows 0..1") as err:
        bm25.score_rows("tide", [0, 2])
    assert err.value.param == "rows"


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_upper_bound_bounds_every_score(method):
    texts = corpus(300, seed=7, max_len=30) + ["tide " * 40, "moon"]
    bm25 = _bm25(texts, k1=1.2, b=0.75, method=method)
    for query in [*QUERIES, "tide tide tide", "tide leaf"]:
        assert all_scores(bm25, query).max() <= bm25.upper_bound(query)
    top = 1.0 if method != "atire" else 2.2
    n = bm25.n_live
    expected = top * (idf(method, bm25.df("tide"), n) + idf(method, bm25.df("moon"), n))
    assert bm25.upper_bound("tide moon") == pytest.approx(expected, rel=1e-5)
    # a term no row holds counts at the rarest document frequency (the score's floor is 0)
    rarest = 1 if method == "atire" else 0
    assert bm25.upper_bound("zebra") == pytest.approx(top * idf(method, rarest, n), rel=1e-5)
    assert bm25.upper_bound("the of a") == 0.0  # stopwords only: no term at all


# -- the block cache ---------------------------------------------------------------------------


def test_cached_blocks_answer_as_computed_ones():
    texts = corpus(400, seed=8)
    deleted = np.random.default_rng(8).random(200) < 0.2
    segments = [(Postings.build(texts[:200]), None), (Postings.build(texts[200:]), deleted)]
    cold = Bm25(segments, cache_bytes=0)
    warm = Bm25(segments)
    queries = [*QUERIES, "tide tide moon", "moon tide"]
    first = warm.search(queries, k=50)
    assert cold._cache.n_bytes == 0 and warm._cache.n_bytes > 0
    for answer in (warm.search(queries, k=50), cold.search(queries, k=50)):  # hits; no cache
        for got, want in zip(answer, first):
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_the_cache_stays_within_its_budget():
    texts = corpus(2000, seed=9) + ["zebra crossing", "zebra"]
    bm25 = Bm25([(Postings.build(texts), None)])
    budget = 12 * 300  # room for a few hundred postings: the common terms do not fit
    small = Bm25([(Postings.build(texts), None)], cache_bytes=budget)
    for query in [*QUERIES, " ".join(WORDS), "zebra crossing"]:
        np.testing.assert_array_equal(small.search(query, k=20)[1], bm25.search(query, k=20)[1])
        assert small._cache.n_bytes <= budget
    assert small._cache.n_bytes > 0  # zebra and crossing are kept
    assert bm25._cache.n_bytes > 20 * budget  # the default keeps them all


_WORDS_FOR_MARKS = st.sampled_from(
    ["cut", "cuts", "cutting", "Cutting", "the", "ﬁsh", "fishes", "Ｔｉｄｅｓ", "tide", "naïve"]
    + ["x1"]
)


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(_WORDS_FOR_MARKS, max_size=12),
    glue=st.sampled_from([" ", ", ", "-", "\n", " _ "]),
    query=st.lists(_WORDS_FOR_MARKS, min_size=1, max_size=3),
)
def test_term_spans_are_the_words_whose_term_is_the_querys(words, glue, query):
    """term_spans marks exactly the words whose index term is one of the query's terms (ASCII
    text and not: the same rule), with offsets into the text as written."""
    from flowsearch.lexical.tokens import _WORD, term_spans

    text = glue.join(words)
    terms = set(tokenize(" ".join(query)))
    expected = [m.span() for m in _WORD.finditer(text) if set(tokenize(m.group())) & terms]
    assert term_spans(text, terms) == expected


def test_term_spans_find_stemmed_forms():
    from flowsearch.lexical.tokens import term_spans

    text = "Cuts heal; cutting winds; the cut."
    assert [text[a:b] for a, b in term_spans(text, tokenize("cutting"))] == [
        "Cuts",
        "cutting",
        "cut",
    ]
    assert term_spans(text, []) == [] and term_spans("", {"cut"}) == []


def test_term_spans_batch_marks_each_text_on_its_own():
    """Texts marked together (a search's hits) get each its own words' offsets: ASCII and
    not, stopwords never marked, a word NFKC splits ("ﬁnds") found by its parts."""
    from flowsearch.lexical.tokens import term_spans_batch

    texts = ["Cuts heal.", "the wind finds a cutting", "", "nothing to see", "Ｃｕｔ the ﬁnds"]
    terms = tokenize("cutting finds the")  # "the" is a stopword: no term
    got = term_spans_batch(texts, terms)
    assert [[t[a:b] for a, b in spans] for t, spans in zip(texts, got, strict=True)] == [
        ["Cuts"], ["finds", "cutting"], [], [], ["Ｃｕｔ", "ﬁnds"]
    ]  # fmt: skip
    assert term_spans_batch(texts, []) == [[], [], [], [], []]
