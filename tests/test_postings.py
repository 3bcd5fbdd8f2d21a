"""flowsearch.lexical.postings: building, merging, statistics and files of a segment's postings."""

from __future__ import annotations

import json
import mmap

import numpy as np
import pytest
from lexical_helpers import assert_same_postings, corpus

from flowsearch.errors import BadInput, IndexDamaged, NotFound
from flowsearch.lexical import postings
from flowsearch.lexical.postings import Postings
from flowsearch.lexical.postings_files import FILES
from flowsearch.lexical.tokens import tokenize_batch

# -- build ---------------------------------------------------------------------------------------


def test_build_holds_each_term_rows_and_counts():
    p = Postings.build(["Tides rise; tides fall.", "", "the moon and the tides", "moon"])
    assert p.vocab == ["fall", "moon", "rise", "tide"]  # sorted
    assert (p.n_rows, p.n_terms, p.nnz) == (4, 4, 6)
    assert p.postings_of("tide") == ([0, 2], [2, 1])
    assert p.postings_of("moon") == ([2, 3], [1, 1])
    assert p.postings_of("zebra") == ([], [])
    assert p.lengths.tolist() == [4, 0, 2, 1]
    assert p.total_length == 7
    dtypes = (p.indptr.dtype, p.rows.dtype, p.tf.dtype, p.lengths.dtype)
    assert dtypes == (np.int64, np.int32, np.int32, np.int32)


def test_build_matches_the_tokeniser_row_by_row():
    texts = corpus(150, seed=1) + ["東京タワー", "?!", "Ελληνικά κείμενα"]
    p = Postings.build(texts)
    for row, terms in enumerate(tokenize_batch(texts)):
        assert p.lengths[row] == len(terms)
        for term in set(terms):
            rows, tf = p.postings_of(term)
            assert tf[rows.index(row)] == terms.count(term)
    for t in range(p.n_terms):  # rows ascend within each term
        assert np.all(np.diff(p.rows[p.indptr[t] : p.indptr[t + 1]]) > 0)


def test_streaming_build_in_small_chunks_equals_one_chunk(monkeypatch):
    texts = corpus(230, seed=4)
    whole = Postings.build(texts)
    with monkeypatch.context() as patched:
        patched.setattr(postings, "BUILD_CHUNK", 17)
        streamed = Postings.build(t for t in texts)
    assert_same_postings(whole, streamed)


def test_build_of_nothing_and_bad_texts():
    empty = Postings.build([])
    assert (empty.n_rows, empty.n_terms, empty.nnz, empty.indptr.tolist()) == (0, 0, 0, [0])
    with pytest.raises(BadInput, match="text 1 is int"):
        Postings.build(["ok", 5])  # type: ignore[list-item]


def test_postings_are_read_only():
    p = Postings.build(corpus(20))
    for name in ("indptr", "rows", "tf", "lengths"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(p, name)[0] = 1


def test_inconsistent_arrays_are_refused():
    with pytest.raises(BadInput, match="indptr does not match the vocabulary"):
        Postings(["a"], [0, 1, 2], [0, 0], [1, 1], [1])
    with pytest.raises(BadInput, match="rows and tf differ"):
        Postings(["a"], [0, 1], [0], [1, 1], [1])


@pytest.mark.parametrize("min_terms", [1, 10**9])  # bisection in the sorted vocabulary, or a dict
def test_term_lookup_finds_every_term_and_nothing_else(min_terms, monkeypatch):
    p = Postings.build(corpus(100, seed=3) + ["Ελληνικά κείμενα", "東京タワー", "2024"])
    with monkeypatch.context() as patched:
        patched.setattr(postings, "BISECT_MIN_TERMS", min_terms)
        lookup = p.term_lookup
    assert [lookup(t) for t in p.vocab] == list(range(p.n_terms))
    for absent in ("", "0", "aaa", "zzzz", "tide2", "ｔｉｄｅ", "\uffff"):
        assert lookup(absent) is None
    assert (lookup is p.term_lookup) and (lookup == p.term_index.get) == (min_terms > 1)


def test_an_unsorted_vocabulary_is_looked_up_by_dictionary(monkeypatch):
    p = Postings(["moon", "cat"], [0, 1, 2], [0, 0], [1, 1], [2])  # format 1 kept first-seen order
    with monkeypatch.context() as patched:
        patched.setattr(postings, "BISECT_MIN_TERMS", 1)
        assert p.term_lookup == p.term_index.get and p.term_lookup("cat") == 1


# -- live statistics ------------------------------------------------------------------------------


def test_live_stats_count_live_rows_and_their_lengths():
    p = Postings.build(["tide moon rain", "sun", "wind roof", ""])
    assert p.live_stats(None) == (4, 6)
    assert p.live_stats(np.array([True, False, False, True])) == (2, 3)
    with pytest.raises(BadInput, match=r"deleted must be a bool array of shape \(4,\)"):
        p.live_stats(np.array([True, False]))


def test_live_stats_are_kept_per_mask_object():
    p = Postings.build(["tide moon rain", "sun", "wind roof"])
    mask = np.array([False, True, False])
    assert p.live_stats(mask) == (2, 5)
    mask[0] = True  # against the contract: the kept answer shows it was not recounted
    assert p.live_stats(mask) == (2, 5)
    assert p.live_stats(mask.copy()) == (1, 2)  # another object is counted


# -- merge ----------------------------------------------------------------------------------------


def test_merge_equals_a_build_of_the_kept_texts():
    texts = corpus(300, seed=9) + ["unique words only here"]
    rng = np.random.default_rng(10)
    cuts = [0, 90, 91, 200, 301]
    segments, kept_texts = [], []
    for a, b in zip(cuts, cuts[1:]):
        keep = rng.random(b - a) < 0.6
        keep[-1] = False if b == 301 else keep[-1]  # the unique words' row goes
        segments.append((Postings.build(texts[a:b]), keep))
        kept_texts += [t for t, k in zip(texts[a:b], keep) if k]
    merged = Postings.merge(segments)
    assert_same_postings(merged, Postings.build(kept_texts))
    assert "uniqu" not in merged.vocab and merged.postings_of("uniqu") == ([], [])


def test_merge_keeps_every_row_without_a_mask_and_accepts_empty_segments():
    texts = corpus(100, seed=11)
    segments = [(Postings.build(texts[:40]), None), (Postings.build([]), None)]
    segments.append((Postings.build(texts[40:]), np.ones(60, bool)))
    assert_same_postings(Postings.merge(segments), Postings.build(texts))
    assert Postings.merge([]).n_rows == 0


def test_merge_of_nothing_kept_is_empty():
    p = Postings.build(corpus(30))
    merged = Postings.merge([(p, np.zeros(30, bool))])
    assert (merged.n_rows, merged.n_terms, merged.nnz) == (0, 0, 0)


def test_merge_checks_the_keep_masks():
    p = Postings.build(corpus(30))
    with pytest.raises(BadInput, match=r"keep must be a bool array of shape \(30,\)") as err:
        Postings.merge([(p, np.ones(29, bool))])
    assert err.value.param == "keep"


def _mapped(array: np.ndarray) -> bool:
    """Whether ``array`` views a memory-mapped file."""
    while array is not None:
        if isinstance(array, mmap.mmap):
            return True
        array = getattr(array, "base", None)
    return False


# -- files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_round_trip(tmp_path, mmap):
    p = Postings.build(corpus(200, seed=11) + ["東京タワー", ""])
    p.save(tmp_path / "postings")
    assert sorted(f.name for f in (tmp_path / "postings").iterdir()) == sorted(FILES)
    back = Postings.load(tmp_path / "postings", mmap=mmap)
    assert_same_postings(back, p)
    assert _mapped(back.rows) == _mapped(back.tf) == mmap and not back.rows.flags.writeable
    config = json.loads((tmp_path / "postings" / "config.json").read_text())
    assert config["format_version"] == 2 and config["total_length"] == p.total_length
    p.save(tmp_path / "postings")  # overwriting its own files is fine


def test_load_never_unpickles(tmp_path):
    Postings.build(corpus(20)).save(tmp_path)
    np.save(tmp_path / "postings_tf.npy", np.array([object()] * 3), allow_pickle=True)
    with pytest.raises(IndexDamaged, match="cannot read .*postings_tf.npy"):
        Postings.load(tmp_path)


def test_load_ignores_strays_and_refuses_missing_or_damaged_files(tmp_path):
    Postings.build(corpus(20)).save(tmp_path)
    (tmp_path / "extra.pkl").write_bytes(b"\x80\x04")  # a stray: never read, never refused
    assert Postings.load(tmp_path).n_rows == 20
    (tmp_path / "extra.pkl").unlink()
    (tmp_path / "doc_lengths.npy").unlink()
    with pytest.raises(IndexDamaged, match="no doc_lengths.npy"):
        Postings.load(tmp_path)
    Postings.build(corpus(20)).save(tmp_path)
    np.save(tmp_path / "postings_rows.npy", np.full(len(np.load(tmp_path / "postings_tf.npy")), 99))
    with pytest.raises(IndexDamaged, match="a posting is out of range"):
        Postings.load(tmp_path)
    (tmp_path / "vocab.json").write_text("[]")
    with pytest.raises(IndexDamaged, match="indptr does not match"):
        Postings.load(tmp_path)
    (tmp_path / "vocab.json").write_text("{not json")
    with pytest.raises(IndexDamaged, match="cannot read .*vocab.json"):
        Postings.load(tmp_path)
    with pytest.raises(NotFound, match="no postings at"):
        Postings.load(tmp_path / "nowhere")


def test_a_damaged_memory_mapped_array_fails_as_damage_at_query_time(tmp_path):
    from flowsearch.lexical.bm25 import Bm25

    Postings.build(["tide moon", "moon"]).save(tmp_path)
    np.save(tmp_path / "postings_rows.npy", np.array([0, 7, 1], np.int32))  # 7: no such row
    with pytest.raises(IndexDamaged, match="out of range"):
        Postings.load(tmp_path)
    p = Postings.load(tmp_path, mmap=True)  # the O(nnz) checks are skipped
    with pytest.raises(IndexDamaged, match="point outside their segment"):
        Bm25([(p, None)]).search("moon", k=2)


def test_a_repeated_term_is_damage_at_load_or_at_the_first_query(tmp_path):
    from flowsearch.lexical.bm25 import Bm25

    Postings.build(["tide moon", "moon"]).save(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps(["moon", "moon"]))
    with pytest.raises(IndexDamaged, match="vocab.json repeats a term"):
        Postings.load(tmp_path)
    p = Postings.load(tmp_path, mmap=True)  # hashing every term is left to the first query
    with pytest.raises(IndexDamaged, match="vocabulary repeats a term"):
        Bm25([(p, None)]).search("moon", k=2)


def test_load_refuses_another_format(tmp_path):
    Postings.build(corpus(20)).save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "format_version": 99}))
    with pytest.raises(IndexDamaged, match="is not a flowsearch-lexical directory"):
        Postings.load(tmp_path)


def test_save_refuses_a_directory_of_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(BadInput, match="notes.txt, which are not postings files"):
        Postings.build(corpus(5)).save(tmp_path)
