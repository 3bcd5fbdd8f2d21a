r"""BM25 over a version's segments, with corpus-wide statistics computed at query time.

BM25 (Robertson & Zaragoza, 2009) weighs a term in a row by its frequency there, the row's
length against the average, and the term's rarity (idf). A version's lexical side is the
:class:`~flowsearch.lexical.postings.Postings` of each of its segments with the segment's
deletion mask; :class:`Bm25` scores them as *one* corpus: N is the live rows of every segment,
the average length is over those rows, and a query term's df is counted at query time over its
live postings in every segment. Nothing is precomputed per write, and the scores do not depend
on how the corpus is cut into segments: a row scores bit for bit what it scores in one segment
built from the live rows in the same order.

The weighting formulas are the variants of Kamphuis et al. (2020) as bm25s names them (Lù,
2024), so scores equal ``bm25s.BM25(method=...)`` on the same tokens up to bm25s's float32
arithmetic. A row's score is computed as: each posting's weight ``idf * tfc`` in float64,
rounded to float32; the weights of the row's query terms summed in float64 in query order (a
repeated query term counts each time, as in bm25s and Lucene); the sum rounded to float32.

Rows in answers are *global*: a row's segment offset (the rows of the segments before it, in
version order) plus its local row.

Example:
    >>> from flowsearch.lexical.postings import Postings
    >>> a = Postings.build(["tides rise twice a day", "heat pumps move heat"])
    >>> b = Postings.build(["the moon moves the tides", "solar panels"])
    >>> bm25 = Bm25([(a, None), (b, np.array([False, True]))])  # b's row 1 is deleted
    >>> scores, rows = bm25.search(["why do tides rise"], k=10)
    >>> rows.tolist()
    [[0, 2]]

References:
    Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009.
    Kamphuis, de Vries, Boytsov & Lin, "Which BM25 Do You Mean? A Large-Scale Reproducibility
    Study of Scoring Variants", ECIR 2020 (the variants). Lù, "BM25S: Orders of magnitude faster
    lexical search via eager sparse scoring", 2024.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from flowsearch.errors import BadInput, IndexDamaged
from flowsearch.lexical.postings import Int32, Int64, Mask, Postings, check_mask
from flowsearch.lexical.tokens import tokenize_batch

__all__ = ["Bm25", "Method", "Part", "idf", "tfc"]

#: BM25 variants whose weights depend only on (tf, row length, df): the ones that score a row
#: only for the terms it holds (BM25L and BM25+ would score every row for every term).
Method = Literal["lucene", "robertson", "atire"]
#: One segment of a version: its postings and its deletion mask (bool (n_rows,), True for a
#: deleted row) or None.
Part = tuple[Postings, Mask | None]
Float32 = npt.NDArray[np.float32]
Float64 = npt.NDArray[np.float64]


def idf(method: Method, df: int, n: int) -> float:
    """The term's idf for ``df`` live rows holding it among ``n`` live rows (``df >= 1``).

    lucene: ``log(1 + (n - df + 0.5) / (df + 0.5))``; robertson: ``log((n - df + 0.5) /
    (df + 0.5))``, clipped at 0 as bm25s does; atire: ``log(n / df)``.
    """
    if method == "lucene":
        return math.log(1 + (n - df + 0.5) / (df + 0.5))
    if method == "robertson":
        return math.log(max((n - df + 0.5) / (df + 0.5), 1.0))
    return math.log(n / df)


def tfc(
    method: Method, tf: Float64, length: Float64, avg_length: float, k1: float, b: float
) -> Float64:
    """The term-frequency component, float64, elementwise over postings.

    lucene and robertson: ``tf / (k1 * ((1 - b) + b * length / avg_length) + tf)``, below 1;
    atire: ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg_length))``, below k1 + 1.
    """
    if method == "atire":
        out: Float64 = (tf * (k1 + 1)) / (tf + k1 * (1 - b + b * length / avg_length))
        return out
    out = tf / (k1 * ((1 - b) + b * length / avg_length) + tf)
    return out


@dataclass(frozen=True)
class _Matches:
    """One query's live postings over every segment, in query-term order."""

    rows: Int64  # global rows, int64 (m,)
    weights: Float32  # float32 (m,)


class Bm25:
    r"""BM25 over the live rows of a version's segments, as one corpus.

    Args:
        parts: each segment's postings and deletion mask, in version order (see :data:`Part`).
            A mask is read as immutable (per-mask statistics are kept while it lives).
        k1: term-frequency saturation (>= 0).
        b: length normalisation, in [0, 1].
        method: the BM25 variant, as bm25s names it.

    Building one costs O(segments) for segments and masks already seen, and one pass over a
    new mask's segment otherwise (its live count and length sum); queries do the rest.

    Raises:
        BadInput: an unknown method, k1 or b out of range, or a mask that is not bool (n_rows,).
    """

    def __init__(
        self,
        parts: Sequence[Part],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: Method = "lucene",
    ) -> None:
        if method not in get_args(Method):
            raise BadInput(
                f"unknown BM25 method {method!r}",
                f"use one of {', '.join(get_args(Method))}",
                param="method",
            )
        if not (k1 >= 0 and 0 <= b <= 1):
            raise BadInput(f"k1={k1}, b={b}", "give k1 >= 0 and b in [0, 1]", param="k1")
        self.k1, self.b, self.method = float(k1), float(b), method
        self.parts: tuple[Part, ...] = tuple(parts)
        sizes = [p.n_rows for p, _ in self.parts]
        self.offsets: Int64 = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        stats = [p.live_stats(deleted) for p, deleted in self.parts]
        self.n_live = sum(n for n, _ in stats)
        live_length = sum(total for _, total in stats)
        # 1.0 when nothing is live or every live row is empty: no weight is then computed
        # from it (no live posting), and nothing divides by zero
        self.avg_length = (live_length / self.n_live if self.n_live else 0.0) or 1.0

    @property
    def n_rows(self) -> int:
        """Global rows, deleted ones included (the sum of the segments' n_rows)."""
        return int(self.offsets[-1])

    def df(self, term: str) -> int:
        """Live rows holding ``term`` (an index term, as :func:`~.tokens.tokenize` gives)."""
        return sum(self._dfs([term]))

    def search(
        self, queries: Sequence[str] | str, k: int, *, allowed: Mask | None = None
    ) -> tuple[Float32, Int64]:
        """Exact top-``k`` live rows by BM25 for each query, best first, ties to the lower row.

        A row is a hit when it holds at least one query term.

        Args:
            queries: q texts (one string is one query), tokenised like the documents.
            k: hits wanted per query (>= 1); any size: the answer grows with the hits found,
                never with ``k``.
            allowed: optional bool (n_rows,) over global rows, False for a row that must not be
                returned (a filter); it restricts the candidates, not the statistics.

        Returns:
            ``(scores float32 (q, k'), rows int64 (q, k'))``, ``k' = min(k, the most hits any
            query has)`` (so never above the live rows); a query with fewer hits is padded with
            row -1 and score -inf.

        Raises:
            BadInput: k < 1, or ``allowed`` not bool (n_rows,).
        """
        if isinstance(queries, str):
            queries = [queries]
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise BadInput(f"k must be an integer >= 1, got {k!r}", "give {k=10}", param="k")
        if allowed is not None:
            check_mask(allowed, self.n_rows, "allowed")
        answers = []
        for terms in tokenize_batch(list(queries)):
            found, total = self._scores(terms, allowed)
            answers.append(_top(found, total, int(k)))
        width = max((len(rows) for _, rows in answers), default=0)
        scores = np.full((len(answers), width), -np.inf, dtype=np.float32)
        rows = np.full((len(answers), width), -1, dtype=np.int64)
        for i, (s, r) in enumerate(answers):
            scores[i, : len(s)], rows[i, : len(r)] = s, r
        return scores, rows

    def score_rows(self, query: str, rows: npt.ArrayLike) -> Float32:
        """BM25 of ``query`` for each of ``rows`` (global), as :meth:`search` scores them.

        Returns:
            float32 (m,): 0 for a row that holds no query term or is deleted.

        Raises:
            BadInput: a row outside ``[0, n_rows)``.
        """
        wanted = np.asarray(rows, dtype=np.int64).reshape(-1)
        bad = wanted[(wanted < 0) | (wanted >= self.n_rows)]
        if bad.size:
            raise BadInput(
                f"row {int(bad[0])} is outside the version's rows 0..{self.n_rows - 1}",
                "give global rows of this version",
                param="rows",
            )
        found, total = self._scores(tokenize_batch([query])[0], None)
        if not len(found):
            return np.zeros(len(wanted), np.float32)
        at = np.minimum(np.searchsorted(found, wanted), len(found) - 1)
        return np.where(found[at] == wanted, total[at], np.float32(0)).astype(np.float32)

    def upper_bound(self, query: str) -> float:
        """A score no row can exceed for ``query``: the sum over its terms (each time it occurs)
        of idf times the supremum of the method's tfc (1 for lucene and robertson, k1 + 1 for
        atire), rounded up to a float32 value; 0.0 when no live row holds a query term."""
        terms = tokenize_batch([query])[0]
        dfs = dict(zip(dict.fromkeys(terms), self._dfs(list(dict.fromkeys(terms)))))
        top = 1.0 if self.method != "atire" else self.k1 + 1
        bound = sum(idf(self.method, dfs[t], self.n_live) * top for t in terms if dfs[t])
        if not bound:
            return 0.0
        # the float32 sums may round up: a margin far above their error, then an ulp
        padded = np.float32(bound * (1 + 1e-6))
        return float(np.nextafter(padded, np.float32(np.inf)))

    # -- scoring -----------------------------------------------------------------------------

    def _dfs(self, terms: list[str]) -> list[int]:
        """Live rows holding each of ``terms`` (distinct), over every segment."""
        out = [0] * len(terms)
        for p, deleted in self.parts:
            index = p.term_index
            for j, term in enumerate(terms):
                t = index.get(term)
                if t is None:
                    continue
                a, b = int(p.indptr[t]), int(p.indptr[t + 1])
                dead = 0 if deleted is None else int(np.count_nonzero(deleted[p.rows[a:b]]))
                out[j] += b - a - dead
        return out

    def _scores(self, terms: list[str], allowed: Mask | None) -> tuple[Int64, Float32]:
        """Live (and allowed) rows holding a query term, global, ascending, and their scores."""
        matches = self._matches(terms)
        rows, weights = matches.rows, matches.weights
        if allowed is not None:
            keep = allowed[rows]
            rows, weights = rows[keep], weights[keep]
        found, where = np.unique(rows, return_inverse=True)
        total = np.bincount(where.reshape(-1), weights=weights, minlength=len(found))
        return found, total.astype(np.float32)

    def _matches(self, terms: list[str]) -> _Matches:
        """The live postings of ``terms`` with their weights, in query-term order per row.

        Pieces (one term's postings in one segment) go segment by segment, and within a
        segment in query order (a repeated term again each time): a row lives in one segment,
        so its weights come in query order, as one segment's would.
        """
        distinct: dict[str, int] = {}  # term -> its slot (distinct terms in query order)
        slot = [distinct.setdefault(t, len(distinct)) for t in terms]  # per query position
        seen: dict[int, int] = {}
        first = [seen.setdefault(j, pos) == pos for pos, j in enumerate(slot)]  # counts for df
        spans: list[tuple[int, int, int]] = []  # (segment, first posting, end), postings order
        rows, tfs, sizes, piece_term, counted = [], [], [], [], []
        n = 0
        for s, (p, _) in enumerate(self.parts):
            index, indptr, start = p.term_index, p.indptr, n
            for position, term in enumerate(terms):
                t = index.get(term)
                if t is None:
                    continue
                a, b = int(indptr[t]), int(indptr[t + 1])
                rows.append(p.rows[a:b])
                tfs.append(p.tf[a:b])
                sizes.append(b - a)
                piece_term.append(slot[position])
                counted.append(first[position])
                n += b - a
            if n > start:
                spans.append((s, start, n))
        if not n:
            return _Matches(np.zeros(0, np.int64), np.zeros(0, np.float32))
        local = np.concatenate(rows)
        try:
            return self._weigh(local, np.concatenate(tfs), spans, sizes, piece_term, counted)
        except IndexError:  # only a damaged memory-mapped array can point outside its segment
            raise IndexDamaged(
                "the lexical postings point outside their segment", "rebuild the index"
            ) from None

    def _weigh(
        self,
        local: Int32,
        tf: Int32,
        spans: list[tuple[int, int, int]],
        sizes: list[int],
        piece_term: list[int],
        counted: list[bool],
    ) -> _Matches:
        """Global rows and weights of the postings :meth:`_matches` gathered, live ones only.

        Args:
            local, tf: int32 (m,): the pieces' local rows and term frequencies, concatenated.
            spans: (segment, start, stop) of each segment's postings in ``local``.
            sizes, piece_term: each piece's length and distinct query term.
            counted: whether a piece counts for its term's df (its first query occurrence).
        """
        lengths = np.empty(len(local), np.int32)
        alive = np.ones(len(local), bool)
        offsets = np.empty(len(local), np.int64)
        for s, lo, hi in spans:  # one gather per segment holding a query term
            p, deleted = self.parts[s]
            lengths[lo:hi] = p.lengths[local[lo:hi]]
            offsets[lo:hi] = self.offsets[s]
            if deleted is not None:
                np.logical_not(deleted[local[lo:hi]], out=alive[lo:hi])
        size = np.asarray(sizes, dtype=np.int64)
        term = np.asarray(piece_term, dtype=np.int64)
        ends = np.cumsum(size)
        running = np.zeros(len(local) + 1, np.int64)
        np.cumsum(alive, out=running[1:])
        live_in_piece = running[ends] - running[ends - size]
        once = np.asarray(counted, dtype=bool)
        df = np.bincount(term[once], weights=live_in_piece[once], minlength=int(term.max()) + 1)
        idfs = np.array([idf(self.method, int(d), self.n_live) if d else 0.0 for d in df])
        c = tfc(
            self.method, tf.astype(np.float64), lengths.astype(np.float64),
            self.avg_length, self.k1, self.b,
        )  # fmt: skip
        weights = (np.repeat(idfs[term], size) * c).astype(np.float32)
        rows = local.astype(np.int64) + offsets
        return _Matches(rows[alive], weights[alive])


def _top(found: Int64, total: Float32, k: int) -> tuple[Float32, Int64]:
    """The best ``k`` of (rows, scores), best first, ties to the lower row."""
    if len(found) > k:  # every row tied with the k-th stays in, so ties are exact
        kth = np.partition(total, len(total) - k)[len(total) - k]
        pick = total >= kth
        found, total = found[pick], total[pick]
    order = np.lexsort((found, -total))[:k]
    return total[order], found[order]
