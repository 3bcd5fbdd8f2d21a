"""The second release's BM25 index (``LexicalIndex``, commit f95c3dd), kept as the reference
that :class:`flowsearch.lexical.bm25.Bm25` must answer like, bit for bit.

One mutable index over global rows with a live mask, whose per-posting float32 weights are
recomputed from the live rows on every add, delete and compact. Files are left out: indexes it
saved are checked against ``tests/assets/lexical_v1`` (written by that release itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, get_args

import numpy as np
from bm25s import scoring

from flowsearch.errors import FlowsearchError
from flowsearch.lexical.tokens import tokenize_batch

__all__ = ["LexicalIndex"]

BUILD_CHUNK = 8192
Method = Literal["lucene", "robertson", "atire"]


def _check_method(method: str) -> None:
    if method not in get_args(Method):
        raise FlowsearchError(
            f"unknown BM25 method {method!r}; use one of {', '.join(get_args(Method))}"
        )


class LexicalIndex:
    r"""BM25 over a corpus whose rows are global row numbers (FAISS ids).

    Build with :meth:`build`; the constructor takes the raw arrays.

    Args:
        vocab: the terms, term id ``t`` is ``vocab[t]``.
        indptr: int64 (n_terms + 1,): term ``t``'s postings are ``[indptr[t], indptr[t+1])``.
        postings_rows: int32 (nnz,): the row of each posting, ascending within a term.
        postings_tf: int32 (nnz,): how often the term occurs in that row (>= 1).
        doc_lengths: int32 (n_rows,): terms per row, after tokenisation.
        live: bool (n_rows,): False for a deleted row.
        k1, b: BM25's term-frequency saturation and length normalisation.
        method: the BM25 variant, as bm25s names it.

    References:
        Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009.
        Kamphuis et al., "Which BM25 Do You Mean? A Large-Scale Reproducibility Study of
        Scoring Variants", ECIR 2020 (the variants). Lù, "BM25S: Orders of magnitude faster
        lexical search via eager sparse scoring", 2024.
    """

    def __init__(
        self,
        vocab: list[str],
        indptr: np.ndarray,
        postings_rows: np.ndarray,
        postings_tf: np.ndarray,
        doc_lengths: np.ndarray,
        live: np.ndarray,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: Method = "lucene",
    ) -> None:
        _check_method(method)
        self.k1, self.b, self.method = float(k1), float(b), method
        self._vocab = vocab
        self._term_id = {t: i for i, t in enumerate(vocab)}
        self._indptr = np.asarray(indptr, dtype=np.int64)
        self._rows = np.asarray(postings_rows, dtype=np.int32)
        self._tf = np.asarray(postings_tf, dtype=np.int32)
        self._lengths = np.asarray(doc_lengths, dtype=np.int32)
        self._live = np.asarray(live, dtype=bool)
        self._reweigh()

    # -- building and writing -------------------------------------------------------------

    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: Method = "lucene",
    ) -> LexicalIndex:
        """Index ``texts``; text ``i`` (in iteration order) is row ``i``.

        ``texts`` is consumed once, :data:`BUILD_CHUNK` at a time (a generator over Parquet
        shards is fine): only the integer postings of the whole corpus are held at once.
        """
        _check_method(method)
        empty = np.zeros(0, np.int32)
        index = cls(
            [], np.zeros(1, np.int64), empty, empty, empty, np.zeros(0, bool),
            k1=k1, b=b, method=method,
        )  # fmt: skip
        index.add(texts)
        return index

    def add(self, texts: Iterable[str]) -> np.ndarray:
        """Append ``texts`` as new rows; returns their rows, int64 (m,).

        Scores afterwards equal those of an index built at once from all live texts.
        """
        terms = [np.repeat(np.arange(len(self._vocab), dtype=np.int64), np.diff(self._indptr))]
        rows, tfs, lengths = [self._rows], [self._tf], [self._lengths]
        first = n_rows = len(self._lengths)
        vocab, term_id = self._vocab, self._term_id

        def term(t: str) -> int:
            i = term_id.get(t)
            if i is None:
                i = term_id[t] = len(vocab)
                vocab.append(t)
            return i

        try:
            for chunk in _chunks(texts, BUILD_CHUNK):
                docs = tokenize_batch(chunk)
                counts = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
                ids = np.fromiter(
                    (term(t) for d in docs for t in d), dtype=np.int64, count=int(counts.sum())
                )
                local = np.repeat(np.arange(len(docs), dtype=np.int64), counts)
                # one (term, row) key per token; unique gives each pair once, with its count
                pairs, tf = np.unique(ids * len(docs) + local, return_counts=True)
                terms.append(pairs // len(docs))
                rows.append((pairs % len(docs) + n_rows).astype(np.int32))
                tfs.append(tf.astype(np.int32))
                lengths.append(counts.astype(np.int32))
                n_rows += len(docs)
                if n_rows > np.iinfo(np.int32).max:
                    raise FlowsearchError("more than 2**31 - 1 rows; split the corpus")
        except BaseException:  # leave the index as it was: forget the terms this call added
            n_terms = len(self._indptr) - 1
            for t in vocab[n_terms:]:
                del term_id[t]
            del vocab[n_terms:]
            raise
        if n_rows == first:
            return np.zeros(0, np.int64)
        all_terms = np.concatenate(terms)
        # stable: postings arrive in row order, so rows stay ascending within each term
        order = np.argsort(all_terms, kind="stable")
        self._rows = np.concatenate(rows)[order]
        self._tf = np.concatenate(tfs)[order]
        self._indptr = np.concatenate(
            [[0], np.cumsum(np.bincount(all_terms, minlength=len(vocab)))]
        ).astype(np.int64)
        self._lengths = np.concatenate(lengths)
        self._live = np.concatenate([self._live, np.ones(n_rows - first, bool)])
        self._reweigh()
        return np.arange(first, n_rows, dtype=np.int64)

    def delete(self, rows: Sequence[int] | np.ndarray) -> int:
        """Mark ``rows`` deleted (never returned again, out of every statistic); returns how
        many were live. Row numbers do not change until :meth:`compact`.

        Raises:
            FlowsearchError: for a row outside ``[0, n_rows)``.
        """
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        bad = rows[(rows < 0) | (rows >= self.n_rows)]
        if bad.size:
            raise FlowsearchError(
                f"cannot delete row {int(bad[0])}: the lexical index has rows "
                f"0..{self.n_rows - 1}; rebuild it from the shards"
            )
        was_live = int(np.count_nonzero(self._live[np.unique(rows)]))
        if was_live:
            self._live[rows] = False
            self._reweigh()
        return was_live

    def compact(self) -> np.ndarray:
        """Drop deleted rows and terms no live row holds; the rest are renumbered in order.

        Returns:
            int64 (n_live,): the old row of each new row (new row ``i`` was ``kept[i]``), the
            same order-preserving renumbering as compacting the FAISS index.
        """
        kept = np.flatnonzero(self._live).astype(np.int64)
        new_row = np.full(self.n_rows, -1, dtype=np.int64)
        new_row[kept] = np.arange(len(kept))
        terms = np.repeat(np.arange(len(self._vocab), dtype=np.int64), np.diff(self._indptr))
        keep = self._live[self._rows]
        terms, self._rows, self._tf = terms[keep], new_row[self._rows[keep]], self._tf[keep]
        self._rows = self._rows.astype(np.int32)
        used = np.bincount(terms, minlength=len(self._vocab))
        self._vocab = [t for t, n in zip(self._vocab, used) if n]
        self._term_id = {t: i for i, t in enumerate(self._vocab)}
        self._indptr = np.concatenate([[0], np.cumsum(used[used > 0])]).astype(np.int64)
        self._lengths = self._lengths[kept]
        self._live = np.ones(len(kept), dtype=bool)
        self._reweigh()
        return kept

    def _reweigh(self) -> None:
        """BM25 weight of every posting from the live rows' statistics (0 for a dead row)."""
        n_terms = len(self._vocab)
        terms = np.repeat(np.arange(n_terms, dtype=np.int64), np.diff(self._indptr))
        live = self._live[self._rows]
        df = np.bincount(terms[live], minlength=n_terms)
        n_live = int(np.count_nonzero(self._live))
        # 1.0 when no live row has a term: then only dead postings exist, and they weigh 0
        avg_len = float(self._lengths[self._live].mean()) if n_live else 0.0
        avg_len = avg_len or 1.0
        # bm25s's idf functions take one df at a time; a corpus has few distinct dfs
        idf_of = scoring._select_idf_scorer(self.method)
        distinct, inverse = np.unique(df, return_inverse=True)
        idf = np.array([idf_of(int(d), N=n_live) if d else 0.0 for d in distinct])[inverse]
        tfc = scoring._select_tfc_scorer(self.method)(
            tf_array=self._tf.astype(np.float64),
            l_d=self._lengths[self._rows].astype(np.float64),
            l_avg=avg_len,
            k1=self.k1,
            b=self.b,
        )
        self._weights = np.where(live, idf[terms] * tfc, 0.0).astype(np.float32)

    # -- reading ---------------------------------------------------------------------------

    @property
    def n_rows(self) -> int:
        """Rows, deleted ones included (equals the FAISS index's ``ntotal``)."""
        return len(self._lengths)

    @property
    def rows(self) -> int:
        """Alias of :attr:`n_rows`."""
        return self.n_rows

    @property
    def n_live(self) -> int:
        """Rows not deleted."""
        return int(np.count_nonzero(self._live))

    @property
    def live(self) -> np.ndarray:
        """bool (n_rows,), False for a deleted row (a copy)."""
        return self._live.copy()

    @property
    def vocab_size(self) -> int:
        """Distinct terms (including those only deleted rows hold, until :meth:`compact`)."""
        return len(self._vocab)

    @property
    def nnz(self) -> int:
        """Postings: distinct (term, row) pairs."""
        return len(self._rows)

    def search(
        self, queries: Sequence[str], k: int, *, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-``k`` rows by BM25 for each query, best first.

        A row is a hit when it holds at least one query term. Ties go to the lower row.

        Args:
            queries: q texts (one string is one query), tokenised like the documents (a
                repeated term counts each time, as in bm25s and Lucene).
            k: hits per query (>= 1).
            allowed: optional bool (n_rows,), False for a row that must not be returned
                (filtered out or deleted elsewhere); the top-k is taken among allowed rows.

        Returns:
            ``(scores float32 (q, k), rows int64 (q, k))``; missing hits are row -1, score -inf.
        """
        if isinstance(queries, str):
            queries = [queries]
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        mask = self._live
        if allowed is not None:
            allowed = np.asarray(allowed)
            if allowed.dtype != bool or allowed.shape != (self.n_rows,):
                raise ValueError(
                    f"allowed must be bool ({self.n_rows},), got {allowed.dtype} {allowed.shape}"
                )
            mask = mask & allowed
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        for i, terms in enumerate(tokenize_batch(list(queries))):
            found, total = self._score(terms, mask)
            if len(found) > k:  # every row tied with the k-th stays in, so ties are exact
                kth = np.partition(total, len(total) - k)[len(total) - k]
                pick = total >= kth
                found, total = found[pick], total[pick]
            order = np.lexsort((found, -total))[:k]
            scores[i, : len(order)] = total[order]
            rows[i, : len(order)] = found[order]
        return scores, rows

    def _score(self, terms: list[str], mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows holding a query term and allowed by ``mask`` (int64 ascending) and their
        BM25 scores (float32, rounded before ranking so equal shown scores tie by row)."""
        ids = [self._term_id[t] for t in terms if t in self._term_id]
        if not ids:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        spans = [slice(self._indptr[t], self._indptr[t + 1]) for t in ids]
        rows = np.concatenate([self._rows[s] for s in spans])
        weights = np.concatenate([self._weights[s] for s in spans])
        keep = mask[rows]
        found, where = np.unique(rows[keep], return_inverse=True)
        total = np.bincount(where, weights=weights[keep], minlength=len(found))
        return found.astype(np.int64), total.astype(np.float32)


def _chunks(texts: Iterable[str], size: int) -> Iterable[list[str]]:
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
