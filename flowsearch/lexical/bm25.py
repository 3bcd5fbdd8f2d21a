r"""The lexical side of hybrid search: a BM25 index kept exact under add, delete and compact.

BM25 (Robertson & Zaragoza, 2009) weighs a term in a document by its frequency there, the
document's length against the average, and the term's rarity (idf). The weighting formulas are
bm25s's own (``bm25s.scoring``; Lù, 2024), so scores equal ``bm25s.BM25(method=...)`` on the same
tokens. What this module keeps is the corpus as *term frequencies* (term-major postings: for each
term the rows holding it and how often), not bm25s's precomputed weights: idf and the average
length depend on the whole corpus, so precomputed weights go stale with every write, while term
frequencies do not. Weights are recomputed from them (vectorised, a few numpy passes over the
postings) after :meth:`LexicalIndex.add`, :meth:`~LexicalIndex.delete`,
:meth:`~LexicalIndex.compact` and :meth:`~LexicalIndex.load`, so an index that has been written
to scores exactly as one built at once from its live texts.

Rows are the index's global row numbers (FAISS ids), in insertion order. A deleted row stays a
row (so row numbers keep matching FAISS ids) but is out of every statistic and never returned,
until :meth:`~LexicalIndex.compact` drops it and renumbers the rest in order.

Tokenisation is :func:`flowsearch.lexical.tokens.tokenize_batch`, the same for documents and
queries.

On disk (:meth:`~LexicalIndex.save`): ``config.json``, ``vocab.json`` and ``.npy`` arrays, loaded
with ``allow_pickle=False``; nothing is ever unpickled.

Example:
    >>> lex = LexicalIndex.build(["tides rise twice a day", "heat pumps move heat"])
    >>> scores, rows = lex.search(["why do tides rise"], k=2)
    >>> rows.tolist()
    [[0, -1]]
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import bm25s
import numpy as np
from bm25s import scoring

from flowsearch.errors import FlowsearchError
from flowsearch.lexical.tokens import tokenize_batch
from flowsearch.storage.manifest import LEXICAL_DIR, LexicalSpec

__all__ = [
    "BUILD_CHUNK",
    "FILES",
    "FORMAT",
    "FORMAT_VERSION",
    "LexicalIndex",
    "Method",
]

LOG = logging.getLogger(__name__)

FORMAT = "flowsearch-lexical"
FORMAT_VERSION = 1
#: Every file :meth:`LexicalIndex.save` writes; a directory holding anything else is refused.
FILES = (
    "config.json",
    "vocab.json",
    "indptr.npy",
    "postings_rows.npy",
    "postings_tf.npy",
    "doc_lengths.npy",
    "live.npy",
)
#: Texts tokenised at a time while building (bounds the memory of the Python token lists).
BUILD_CHUNK = 8192

#: BM25 variants whose weights depend only on (tf, document length, df): the ones bm25s scores
#: without a non-occurrence term (BM25L and BM25+ would score every document for every term).
Method = Literal["lucene", "robertson", "atire"]


def _check_method(method: str) -> None:
    if method not in get_args(Method):
        raise FlowsearchError(
            f"unknown BM25 method {method!r}; use one of {', '.join(get_args(Method))}"
        )


class LexicalIndex:
    r"""BM25 over a corpus whose rows are global row numbers (FAISS ids).

    Build with :meth:`build`, open with :meth:`load`; the constructor takes the raw arrays.

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
        LOG.info("lexical index: %d rows, %d terms, %d postings", n_rows, len(vocab), self.nnz)
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

    # -- files -----------------------------------------------------------------------------

    def save_version(self, version_dir: Path) -> LexicalSpec:
        """Save into a version directory's lexical part; returns the manifest's record of it."""
        self.save(version_dir / LEXICAL_DIR)
        params = {"k1": self.k1, "b": self.b, "method": self.method}
        return LexicalSpec(path=LEXICAL_DIR, rows=self.n_rows, params=params)

    def save(self, directory: str | Path) -> None:
        """Write :data:`FILES` into ``directory`` (created if needed): JSON and plain ``.npy``.

        Raises:
            FlowsearchError: when ``directory`` holds files of anything else.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        _refuse_strangers(directory)
        config = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "k1": self.k1,
            "b": self.b,
            "method": self.method,
            "tokenizer": {"stemmer": "english", "stopwords": "bm25s.STOPWORDS_EN"},
            "bm25s_version": bm25s.__version__,
            "n_rows": self.n_rows,
            "n_live": self.n_live,
            "n_terms": self.vocab_size,
            "nnz": self.nnz,
        }
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (directory / "vocab.json").write_text(
            json.dumps(self._vocab, ensure_ascii=False), encoding="utf-8"
        )
        arrays: dict[str, np.ndarray] = {
            "indptr": self._indptr,
            "postings_rows": self._rows,
            "postings_tf": self._tf,
            "doc_lengths": self._lengths,
            "live": self._live,
        }
        for name, array in arrays.items():
            np.save(directory / f"{name}.npy", array, allow_pickle=False)

    @classmethod
    def load(cls, directory: str | Path) -> LexicalIndex:
        """Open a directory written by :meth:`save`; never unpickles anything.

        Raises:
            FlowsearchError: for a missing or unexpected file, another format or inconsistent
                arrays.
        """
        directory = Path(directory)
        if not directory.is_dir():
            raise FlowsearchError(f"no lexical index at {directory}; rebuild the index")
        _refuse_strangers(directory)
        missing = [f for f in FILES if not (directory / f).is_file()]
        if missing:
            raise FlowsearchError(
                f"lexical index {directory} lacks {', '.join(missing)}; rebuild the index"
            )
        try:
            config = json.loads((directory / "config.json").read_text())
            vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
            arrays = {
                f[: -len(".npy")]: np.load(directory / f, allow_pickle=False)
                for f in FILES
                if f.endswith(".npy")
            }
        except (OSError, ValueError) as exc:
            raise FlowsearchError(
                f"cannot read lexical index {directory} ({exc}); rebuild the index"
            ) from None
        if config.get("format") != FORMAT or config.get("format_version") != FORMAT_VERSION:
            raise FlowsearchError(
                f"{directory} is not a {FORMAT} v{FORMAT_VERSION} directory; rebuild the index"
            )
        _check_arrays(directory, vocab, arrays)
        return cls(
            vocab,
            arrays["indptr"],
            arrays["postings_rows"],
            arrays["postings_tf"],
            arrays["doc_lengths"],
            arrays["live"],
            k1=config["k1"],
            b=config["b"],
            method=config["method"],
        )


def _chunks(texts: Iterable[str], size: int) -> Iterable[list[str]]:
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _refuse_strangers(directory: Path) -> None:
    strangers = sorted(p.name for p in directory.iterdir() if p.name not in FILES)
    if strangers:
        raise FlowsearchError(
            f"lexical index directory {directory} holds unexpected {', '.join(strangers[:5])}; "
            "use an empty directory or rebuild the index"
        )


def _check_arrays(directory: Path, vocab: Any, arrays: dict[str, np.ndarray]) -> None:
    """Shapes, kinds and ranges, so a damaged directory fails here and not inside a search."""
    indptr, rows, tf = arrays["indptr"], arrays["postings_rows"], arrays["postings_tf"]
    lengths, live = arrays["doc_lengths"], arrays["live"]
    problems = []
    if not (isinstance(vocab, list) and all(isinstance(t, str) for t in vocab)):
        problems.append("vocab.json is not a list of strings")
    elif len(set(vocab)) != len(vocab):
        problems.append("vocab.json repeats a term")
    elif indptr.shape != (len(vocab) + 1,):
        problems.append("indptr does not match the vocabulary")
    if any(a.ndim != 1 for a in arrays.values()):
        problems.append("an array is not 1-D")
    elif not all(a.dtype.kind in "iu" for a in (indptr, rows, tf, lengths)) or live.dtype != bool:
        problems.append("an array has the wrong dtype")
    elif len(indptr) and (indptr[0] != 0 or indptr[-1] != len(rows) or np.any(np.diff(indptr) < 0)):
        problems.append("indptr is not a valid offset array")
    elif rows.shape != tf.shape or lengths.shape != live.shape:
        problems.append("array lengths disagree")
    elif len(rows) and (rows.min() < 0 or rows.max() >= len(lengths) or tf.min() < 1):
        problems.append("a posting is out of range")
    if problems:
        raise FlowsearchError(f"lexical index {directory} is damaged ({problems[0]}); rebuild it")
