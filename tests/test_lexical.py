"""flowsearch.lexical.bm25: tokenisation, exact BM25 against bm25s, filters, writes and files."""

from __future__ import annotations

import json

import bm25s
import numpy as np
import pytest

from flowsearch.errors import FlowsearchError
from flowsearch.lexical import bm25 as lexical
from flowsearch.lexical.bm25 import FILES, LexicalIndex
from flowsearch.lexical.tokens import tokenize, tokenize_batch

WORDS = [
    "tide",
    "moon",
    "ocean",
    "wave",
    "heat",
    "pump",
    "energy",
    "house",
    "cat",
    "dog",
    "run",
    "running",
    "runs",
    "river",
    "bank",
    "money",
    "loan",
    "water",
    "cloud",
    "rain",
    "storm",
    "wind",
    "solar",
    "panel",
    "roof",
    "garden",
    "tree",
    "leaf",
]


def _corpus(n: int, seed: int = 0, min_len: int = 1) -> list[str]:
    """Synthetic texts over a small vocabulary (so terms repeat and dfs vary), with stopwords."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(n):
        words = rng.choice(WORDS, size=rng.integers(min_len, 12), p=_zipf(len(WORDS)))
        texts.append(" the ".join(words).capitalize() + ".")
    return texts


def _zipf(n: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1)
    return p / p.sum()


QUERIES = ["tide moon", "heat pumps for a house", "running dog dog", "bank loan money", "leaf"]


def _all_scores(lex: LexicalIndex, query: str) -> np.ndarray:
    """float32 (n_rows,) scores of every row (0 for a row without a query term)."""
    scores, rows = lex.search([query], k=max(lex.n_rows, 1))
    out = np.zeros(lex.n_rows, np.float32)
    out[rows[0][rows[0] >= 0]] = scores[0][rows[0] >= 0]
    return out


def _same_search(a: LexicalIndex, b: LexicalIndex, queries: list[str], k: int) -> None:
    sa, ra = a.search(queries, k)
    sb, rb = b.search(queries, k)
    np.testing.assert_array_equal(ra, rb)
    np.testing.assert_allclose(sa, sb, rtol=1e-6)


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
    texts = _corpus(50) + ["", "?!", "東京"]
    assert tokenize_batch(texts) == [tokenize(t) for t in texts]


def test_non_string_text_is_a_clear_error():
    with pytest.raises(FlowsearchError, match="text 1 is NoneType"):
        tokenize_batch(["ok", None])  # type: ignore[list-item]


# -- scores equal bm25s ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_scores_equal_bm25s(method):
    texts = _corpus(300, min_len=1)
    lex = LexicalIndex.build(texts, k1=1.2, b=0.7, method=method)
    ref = bm25s.BM25(k1=1.2, b=0.7, method=method)
    ref.index(tokenize_batch(texts), show_progress=False)
    for query in QUERIES:
        expected = ref.get_scores(tokenize(query))
        np.testing.assert_allclose(_all_scores(lex, query), expected, rtol=1e-5, atol=1e-6)


def test_search_is_exact_top_k_best_first_with_row_ties():
    texts = _corpus(400, seed=1)
    lex = LexicalIndex.build(texts)
    ref = bm25s.BM25()
    ref.index(tokenize_batch(texts), show_progress=False)
    scores, rows = lex.search(QUERIES, k=25)
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and rows.shape == (5, 25)
    for i, query in enumerate(QUERIES):
        full = ref.get_scores(tokenize(query)).astype(np.float32)
        hit = np.flatnonzero(full > 0)
        truth = hit[np.lexsort((hit, -full[hit]))][:25]
        np.testing.assert_array_equal(rows[i][: len(truth)], truth)
        assert np.all(np.diff(scores[i][rows[i] >= 0]) <= 0)


def test_ties_go_to_the_lower_row():
    lex = LexicalIndex.build(["solar roof", "wind farm", "solar roof", "solar roof", "rain"])
    scores, rows = lex.search(["solar"], k=5)
    assert rows[0].tolist() == [0, 2, 3, -1, -1]
    assert scores[0][0] == scores[0][1] == scores[0][2] > 0
    assert np.all(np.isneginf(scores[0][3:]))


def test_queries_without_known_terms_have_no_hits():
    lex = LexicalIndex.build(_corpus(50))
    scores, rows = lex.search(["", "the and of", "zebra quantum", "?!", "東京"], k=3)
    assert np.all(rows == -1) and np.all(np.isneginf(scores))


def test_one_string_is_one_query_and_k_is_checked():
    lex = LexicalIndex.build(_corpus(20))
    assert lex.search("tide", k=2)[1].shape == (1, 2)
    with pytest.raises(ValueError, match="k must be"):
        lex.search(["tide"], k=0)


def test_empty_index_and_empty_texts():
    empty = LexicalIndex.build([])
    assert empty.n_rows == 0 and empty.search(["tide"], k=2)[1].tolist() == [[-1, -1]]
    lex = LexicalIndex.build(["", "?!", "tide"])
    assert lex.n_rows == 3 and lex.search(["tide"], k=3)[1].tolist() == [[2, -1, -1]]


# -- allowed (filters and deletes from elsewhere) -----------------------------------------------


def test_allowed_rows_only_and_top_k_among_them_is_exact():
    texts = _corpus(500, seed=2)
    lex = LexicalIndex.build(texts)
    allowed = np.random.default_rng(3).random(500) < 0.1
    scores, rows = lex.search(QUERIES, k=10, allowed=allowed)
    for i, query in enumerate(QUERIES):
        full = _all_scores(lex, query)
        hit = np.flatnonzero((full > 0) & allowed)
        truth = hit[np.lexsort((hit, -full[hit]))][:10]
        got = rows[i][rows[i] >= 0]
        assert allowed[got].all()
        np.testing.assert_array_equal(got, truth)  # k hits whenever k allowed rows match


def test_allowed_must_be_a_full_bool_mask():
    lex = LexicalIndex.build(_corpus(10))
    with pytest.raises(ValueError, match="allowed must be bool"):
        lex.search(["tide"], 3, allowed=np.ones(9, bool))
    with pytest.raises(ValueError, match="allowed must be bool"):
        lex.search(["tide"], 3, allowed=np.ones(10, int))


# -- writes: add, delete, compact equal a build from the live texts -------------------------------


def test_streaming_build_equals_list_build(monkeypatch):
    texts = _corpus(230, seed=4)
    whole = LexicalIndex.build(texts)
    monkeypatch.setattr(lexical, "BUILD_CHUNK", 17)
    streamed = LexicalIndex.build(t for t in texts)
    _same_search(whole, streamed, QUERIES, k=30)
    assert streamed.n_rows == 230 and streamed.nnz == whole.nnz


def test_add_equals_build_at_once():
    texts = _corpus(300, seed=5)
    whole = LexicalIndex.build(texts)
    grown = LexicalIndex.build(texts[:120])
    np.testing.assert_array_equal(grown.add(texts[120:250]), np.arange(120, 250))
    grown.add(iter(texts[250:]))
    assert grown.add([]).size == 0
    _same_search(whole, grown, QUERIES, k=40)
    assert (grown.n_rows, grown.nnz) == (whole.n_rows, whole.nnz)


def test_failed_add_leaves_the_index_unchanged():
    lex = LexicalIndex.build(_corpus(40))
    before = lex.search(QUERIES, k=10)
    vocab_size = lex.vocab_size
    with pytest.raises(FlowsearchError):
        lex.add(["brand new words", None])  # type: ignore[list-item]
    assert (lex.n_rows, lex.vocab_size) == (40, vocab_size)
    after = lex.search(QUERIES + ["brand new words"], k=10)
    np.testing.assert_array_equal(after[1][:-1], before[1])
    assert np.all(after[1][-1] == -1)


def test_delete_scores_as_a_build_of_the_live_texts():
    texts = _corpus(300, seed=6)
    lex = LexicalIndex.build(texts)
    dead = np.random.default_rng(7).choice(300, size=90, replace=False)
    assert lex.delete(dead) == 90 and lex.delete(dead[:5]) == 0
    assert (lex.n_rows, lex.n_live) == (300, 210) and not lex.live[dead].any()
    kept = np.flatnonzero(lex.live)
    fresh = LexicalIndex.build([texts[i] for i in kept])
    scores, rows = lex.search(QUERIES, k=50)
    fresh_scores, fresh_rows = fresh.search(QUERIES, k=50)
    assert not np.isin(rows, dead).any()
    np.testing.assert_array_equal(rows, np.where(fresh_rows >= 0, kept[fresh_rows], -1))
    np.testing.assert_allclose(scores, fresh_scores, rtol=1e-6)


def test_upsert_is_delete_then_add():
    texts = _corpus(100, seed=8)
    lex = LexicalIndex.build(texts)
    lex.delete([3])
    (new_row,) = lex.add(["zebra crossing"])
    assert new_row == 100
    assert lex.search(["zebra"], k=2)[1].tolist() == [[100, -1]]
    assert 3 not in lex.search([texts[3]], k=100)[1]


def test_compact_equals_a_build_of_the_live_texts():
    texts = _corpus(300, seed=9) + ["unique words only here"]
    lex = LexicalIndex.build(texts)
    dead = np.r_[np.random.default_rng(10).choice(300, size=120, replace=False), 300]
    lex.delete(dead)
    kept = lex.compact()
    np.testing.assert_array_equal(kept, np.setdiff1d(np.arange(301), dead))
    fresh = LexicalIndex.build([texts[i] for i in kept])
    assert (lex.n_rows, lex.n_live, lex.nnz) == (fresh.n_rows, fresh.n_rows, fresh.nnz)
    assert lex.vocab_size == fresh.vocab_size  # terms only deleted rows held are gone
    _same_search(lex, fresh, QUERIES + ["unique words"], k=60)


def test_deleting_every_row_with_terms_leaves_no_hits():
    lex = LexicalIndex.build(["tide moon", "", "?!"])
    with np.errstate(all="raise"):  # no division by a zero average length
        lex.delete([0])
    assert lex.search(["tide"], k=2)[1].tolist() == [[-1, -1]]
    assert lex.compact().tolist() == [1, 2] and lex.vocab_size == 0


def test_delete_refuses_rows_out_of_range():
    lex = LexicalIndex.build(_corpus(10))
    with pytest.raises(FlowsearchError, match="cannot delete row 10"):
        lex.delete([2, 10])
    assert lex.n_live == 10


# -- files -------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    texts = _corpus(200, seed=11) + ["東京タワー", ""]
    lex = LexicalIndex.build(texts, k1=1.1, b=0.6, method="atire")
    lex.delete([5, 6])
    lex.save(tmp_path / "lexical")
    assert sorted(p.name for p in (tmp_path / "lexical").iterdir()) == sorted(FILES)
    back = LexicalIndex.load(tmp_path / "lexical")
    assert (back.k1, back.b, back.method, back.n_live) == (1.1, 0.6, "atire", lex.n_live)
    _same_search(lex, back, QUERIES + ["東京タワー"], k=20)
    lex.save(tmp_path / "lexical")  # overwriting its own files is fine


def test_load_never_unpickles(tmp_path):
    LexicalIndex.build(_corpus(20)).save(tmp_path)
    np.save(tmp_path / "live.npy", np.array([object()] * 20), allow_pickle=True)
    with pytest.raises(FlowsearchError, match="cannot read lexical index"):
        LexicalIndex.load(tmp_path)


def test_load_refuses_unexpected_missing_or_damaged_files(tmp_path):
    LexicalIndex.build(_corpus(20)).save(tmp_path)
    (tmp_path / "extra.pkl").write_bytes(b"\x80\x04")
    with pytest.raises(FlowsearchError, match="unexpected extra.pkl"):
        LexicalIndex.load(tmp_path)
    (tmp_path / "extra.pkl").unlink()
    (tmp_path / "live.npy").unlink()
    with pytest.raises(FlowsearchError, match="lacks live.npy"):
        LexicalIndex.load(tmp_path)
    LexicalIndex.build(_corpus(20)).save(tmp_path)
    np.save(tmp_path / "postings_rows.npy", np.full(3, 99, np.int32))
    with pytest.raises(FlowsearchError, match="damaged"):
        LexicalIndex.load(tmp_path)
    with pytest.raises(FlowsearchError, match="no lexical index"):
        LexicalIndex.load(tmp_path / "nowhere")


def test_load_refuses_another_format(tmp_path):
    LexicalIndex.build(_corpus(20)).save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "format_version": 99}))
    with pytest.raises(FlowsearchError, match="not a flowsearch-lexical v1"):
        LexicalIndex.load(tmp_path)


def test_save_refuses_a_directory_of_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FlowsearchError, match="unexpected notes.txt"):
        LexicalIndex.build(_corpus(5)).save(tmp_path)


def test_unknown_method_is_refused():
    with pytest.raises(FlowsearchError, match="unknown BM25 method 'bm25l'"):
        LexicalIndex.build(["a b"], method="bm25l")  # type: ignore[arg-type]
