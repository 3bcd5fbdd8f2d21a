r"""BM25 over a version's segments, with corpus-wide statistics computed at query time.

BM25 (Robertson & Zaragoza, 2009) weighs a term in a row by its frequency there, the row's
length against the average, and the term's rarity (idf). A version's lexical side is the
:class:`~flowsearch.lexical.postings.Postings` of each of its segments with the segment's
deletion mask; :class:`Bm25` scores them as *one* corpus: N is the live rows of every segment,
the average length is over those rows, and a query term's df is counted at query time over its
live postings in every segment. Nothing is precomputed per write, and scores do not depend on
how the corpus is cut into segments: a row scores bit for bit what it scores in one segment
built from the live rows in the same order.

The weights are the variants of Kamphuis et al. (2020) as bm25s names them (Lù, 2024; see
:mod:`~flowsearch.lexical.weights`), so scores equal ``bm25s.BM25(method=...)`` on the same
tokens up to bm25s's float32 arithmetic. A row's score: each of its query terms' weight
(``idf * tfc`` in float64, rounded to float32), summed in float64 in query order (a repeated
query term counts each time, as in bm25s and Lucene), rounded to float32.

Rows in answers are *global*: the segment's offset (the rows of the segments before it, in
version order) plus the local row.

A long document (several passage rows) is scored whole: its terms and length are on its first
passage's row, N counts documents, and any of its rows scores what that row scores
(:class:`~flowsearch.lexical.postings.Postings`' ``leads``). So BM25 over a corpus cut into
passages equals BM25 over the same corpus of whole documents, hit for hit.

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
    Study of Scoring Variants", ECIR 2020. Lù, "BM25S: Orders of magnitude faster lexical search
    via eager sparse scoring", 2024.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from flowsearch.errors import BadInput
from flowsearch.lexical.blocks import (
    Block,
    BlockCache,
    Float32,
    Segment,
    Weighing,
    live_dfs,
    term_blocks,
)
from flowsearch.lexical.postings import Int64, Mask, check_mask
from flowsearch.lexical.tokens import tokenize_batch
from flowsearch.lexical.weights import Method, check_method, idf, tfc_supremum

__all__ = ["CACHE_BYTES", "Bm25", "Method", "Segment", "Statistics", "query_terms", "upper_bound"]

#: Bytes of weighed postings (12 per posting) a BM25 keeps for recent query terms by default
#: (a searcher's is its ``SearchOptions.lexical_cache_bytes``).
CACHE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Statistics:
    """What a BM25 score depends on besides the row itself: the corpus's live rows (N), their
    total length, and the document frequency of each term asked about. Given from outside
    (:meth:`Bm25.search`'s ``statistics``), they make a part of a corpus (a shard holding some
    of a version's segments) score its rows exactly as the whole corpus does; parts add up
    (:meth:`summed`), as Lucene's ``CollectionStatistics`` and Elasticsearch's DFS phase do.

    Attributes:
        n_live: live rows.
        total_length: the live rows' summed lengths in terms.
        df: live rows holding each term (index terms, as :func:`~.tokens.tokenize` gives).
    """

    n_live: int
    total_length: int
    df: Mapping[str, int] = field(default_factory=dict)

    @property
    def avg_length(self) -> float:
        """The live rows' mean length (1.0 when there is none, as :class:`Bm25` takes it)."""
        return (self.total_length / self.n_live if self.n_live else 0.0) or 1.0

    @classmethod
    def summed(cls, parts: Sequence[Statistics]) -> Statistics:
        """The statistics of the union of disjoint parts (each asked about the same terms)."""
        df: dict[str, int] = {}
        for part in parts:
            for term, n in part.df.items():
                df[term] = df.get(term, 0) + int(n)
        return cls(
            n_live=sum(int(p.n_live) for p in parts),
            total_length=sum(int(p.total_length) for p in parts),
            df=df,
        )

    def df_of(self, term: str) -> int:
        """``term``'s document frequency.

        Raises:
            BadInput: these statistics were not gathered for ``term``.
        """
        try:
            return int(self.df[term])
        except KeyError:
            raise BadInput(
                f"the BM25 statistics hold no document frequency for {term!r}",
                "gather statistics for every query's terms before scoring",
                param="statistics",
            ) from None


def query_terms(queries: Sequence[str]) -> list[str]:
    """The distinct index terms of ``queries``, in first-seen order."""
    return list(dict.fromkeys(t for terms in tokenize_batch(list(queries)) for t in terms))


def upper_bound(query: str, statistics: Statistics, method: Method, k1: float) -> float:
    """A score no row can exceed for ``query`` under ``statistics`` (see
    :meth:`Bm25.upper_bound`, which is this with the corpus's own statistics)."""
    terms = tokenize_batch([query])[0]
    if not statistics.n_live:
        return 0.0
    top = tfc_supremum(method, k1)
    rarest = 1 if method == "atire" else 0
    dfs = [statistics.df_of(t) or rarest for t in terms]
    bound = sum(max(idf(method, df, statistics.n_live), 0.0) * top for df in dfs)
    if not bound:
        return 0.0
    # the float32 sums may round up: a margin far above their error, then an ulp
    padded = np.float32(bound * (1 + 1e-6))
    return float(np.nextafter(padded, np.float32(np.inf)))


class Bm25:
    r"""BM25 over the live rows of a version's segments, as one corpus.

    Args:
        segments: each segment's postings and deletion mask (bool (n_rows,), True for a deleted
            row, or None), in version order. A mask is read as immutable: per-mask statistics
            are kept while it lives (give a new array for new deletions).
        k1: term-frequency saturation (>= 0).
        b: length normalisation, in [0, 1].
        method: the BM25 variant, as bm25s names it.
        cache_bytes: bytes of weighed postings kept for recent query terms (>= 0).

    Building one costs O(segments) for the segments and masks already seen, and one pass over
    a new mask's segment otherwise (its live count and length sum); queries do the rest. The
    weighed postings of recent query terms are kept under ``cache_bytes`` (they hold for
    this version only; 0 keeps none).

    Raises:
        BadInput: an unknown method, k1 or b out of range, or a mask that is not bool (n_rows,).
    """

    def __init__(
        self,
        segments: Sequence[Segment],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: Method = "lucene",
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        check_method(method)
        if not (k1 >= 0 and 0 <= b <= 1):
            raise BadInput(f"k1={k1}, b={b}", "give k1 >= 0 and b in [0, 1]", param="k1")
        self.k1, self.b, self.method = float(k1), float(b), method
        self.segments: tuple[Segment, ...] = tuple(segments)
        sizes = [p.n_rows for p, _ in self.segments]
        #: int64 (segments + 1,): each segment's first global row, then n_rows.
        self.offsets: Int64 = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        stats = [p.live_stats(deleted) for p, deleted in self.segments]
        #: int64 (n_rows,) or None: rows back from each global row to its document's lead
        #: (None when every row is its own document).
        self.leads: Int64 | None = None
        if any(p.leads is not None for p, _ in self.segments):
            self.leads = np.concatenate([
                np.zeros(p.n_rows, np.int64) if p.leads is None else p.leads.astype(np.int64)
                for p, _ in self.segments
            ])  # fmt: skip
        #: Live documents of every segment: BM25's N.
        self.n_live = sum(n for n, _ in stats)
        live_length = sum(total for _, total in stats)
        #: The live rows' summed lengths.
        self.live_length = int(live_length)
        # 1.0 when nothing is live or every live row is empty: no weight is then computed
        # from it (no live posting), and nothing divides by zero
        #: The live rows' mean length in terms.
        self.avg_length = (live_length / self.n_live if self.n_live else 0.0) or 1.0
        self._weighing = Weighing(self.n_live, self.avg_length, self.k1, self.b, method)
        self.cache_bytes = int(cache_bytes)
        self._cache = BlockCache(self.cache_bytes)

    @property
    def n_rows(self) -> int:
        """Global rows, deleted ones included (the sum of the segments' n_rows)."""
        return int(self.offsets[-1])

    def df(self, term: str) -> int:
        """Live rows holding ``term`` (an index term, as :func:`~.tokens.tokenize` gives)."""
        return len(self._blocks([term])[term][0])

    def statistics(self, terms: Sequence[str]) -> Statistics:
        """These segments' :class:`Statistics` for ``terms`` (index terms: see
        :func:`query_terms`): N, the total length and each term's df over their live rows
        (what a shard reports for a version's global statistics to be summed)."""
        terms = list(dict.fromkeys(terms))
        cached = self._cache.get(terms)
        missing = [t for t in terms if t not in cached]
        counted = dict(zip(missing, live_dfs(self.segments, missing)))
        df = {t: len(cached[t][0]) if t in cached else counted[t] for t in terms}
        return Statistics(self.n_live, self.live_length, df)

    def search(
        self,
        queries: Sequence[str] | str,
        k: int,
        *,
        allowed: Mask | None = None,
        statistics: Statistics | None = None,
    ) -> tuple[Float32, Int64]:
        """Exact top-``k`` live rows by BM25 for each query, best first, ties to the lower row.

        A row is a hit when it holds at least one query term.

        Args:
            queries: q texts (one string is one query), tokenised like the documents.
            k: hits wanted per query (>= 1), any size: the answer grows with the hits found,
                never with ``k``.
            allowed: optional bool (n_rows,) over global rows, False for a row that must not be
                returned (a filter); it restricts the candidates, not the statistics.
            statistics: the whole corpus's :class:`Statistics` (for every query term) when
                these segments are part of it; None: their own.

        Returns:
            ``(scores float32 (q, k'), rows int64 (q, k'))``, ``k' = min(k, the most hits any
            query has)``, so never above the live rows; a query with fewer hits is padded with
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
        answers = [
            _top(*self._scores(t, allowed, statistics), int(k))
            for t in tokenize_batch(list(queries))
        ]
        return _padded(answers)

    def search_and_score(
        self,
        queries: Sequence[str],
        k: int,
        rows: Int64,
        *,
        allowed: Mask | None = None,
        statistics: Statistics | None = None,
    ) -> tuple[tuple[Float32, Int64], np.ndarray]:
        """:meth:`search` and, for each query, :meth:`score_rows` of its ``rows`` (int64
        (q, c) global rows, -1 for none: NaN), from one scoring of each query (hybrid search
        asks both, and each alone scores every row holding a query term).

        Returns:
            ``(search's answer, float64 (q, c))``.
        """
        if k < 1:
            raise BadInput(f"k must be an integer >= 1, got {k!r}", "give {k=10}", param="k")
        if allowed is not None:
            check_mask(allowed, self.n_rows, "allowed")
        scored = np.full(rows.shape, np.nan)
        answers = []
        for qi, terms in enumerate(tokenize_batch(list(queries))):
            found, total = self._scores(terms, None, statistics)
            valid = rows[qi] >= 0
            if valid.any():
                scored[qi, valid] = self._score_of(found, total, self._leads_of(rows[qi, valid]))
            if allowed is not None:
                keep = allowed[found]
                found, total = found[keep], total[keep]
            answers.append(_top(found, total, int(k)))
        return _padded(answers), scored

    def score_rows(
        self, query: str, rows: npt.ArrayLike, statistics: Statistics | None = None
    ) -> Float32:
        """BM25 of ``query`` for each of ``rows`` (global), as :meth:`search` scores them
        (with ``statistics`` as there): a passage of a long document scores its document.

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
        found, total = self._scores(tokenize_batch([query])[0], None, statistics)
        return self._score_of(found, total, self._leads_of(wanted))

    def _leads_of(self, rows: Int64) -> Int64:
        """The global row holding each of ``rows``' document terms (valid rows only)."""
        return rows if self.leads is None else rows - self.leads[rows]

    @staticmethod
    def _score_of(found: Int64, total: Float32, wanted: Int64) -> Float32:
        """The score of each of ``wanted`` among ``_scores``' rows (0 for a row not there)."""
        if not len(found):
            return np.zeros(len(wanted), np.float32)
        at = np.minimum(np.searchsorted(found, wanted), len(found) - 1)
        return np.where(found[at] == wanted, total[at], np.float32(0)).astype(np.float32)

    def upper_bound(self, query: str, statistics: Statistics | None = None) -> float:
        """A score no row can exceed for ``query``: the sum over its terms (each time it occurs)
        of idf times the supremum of the method's tfc (1 for lucene and robertson, k1 + 1 for
        atire), rounded up to a float32 value. A term no live row holds counts at the rarest
        document frequency (0; 1 for atire, whose idf is infinite at 0), so a query of made-up
        words cannot reach a high share of its bound through the one real word it holds (the
        hit's score, :func:`flowsearch.search.scores.normalise_lexical`). 0.0 for a query
        without terms. ``statistics``: the whole corpus's, as in :meth:`search`."""
        if statistics is None:
            statistics = self.statistics(tokenize_batch([query])[0])
        return upper_bound(query, statistics, self.method, self.k1)

    # -- scoring -----------------------------------------------------------------------------

    def _blocks(self, terms: list[str], statistics: Statistics | None = None) -> dict[str, Block]:
        """The block of each of ``terms`` (distinct), from the cache or computed; weighed
        with ``statistics`` when given (a term whose df there is its own df here, with the
        same N and total length, reuses its own block: one shard holding every segment)."""
        if statistics is None:
            return self._own_blocks(terms)
        same = (statistics.n_live, statistics.total_length) == (self.n_live, self.live_length)
        own = self._own_blocks(terms) if same else {}
        keys = {
            t: f"{t}\x1f{statistics.n_live}\x1f{statistics.total_length}\x1f{statistics.df_of(t)}"
            for t in terms
            if not (same and statistics.df_of(t) == len(own[t][0]))
        }
        if not keys:
            return own
        blocks = {t: own[t] for t in terms if t not in keys}
        cached = self._cache.get(list(keys.values()))
        missing = []
        for t, key in keys.items():
            if key in cached:
                blocks[t] = cached[key]
            else:
                missing.append(t)
        if missing:
            weighing = Weighing(statistics.n_live, statistics.avg_length, self.k1, self.b,
                                self.method)  # fmt: skip
            dfs = [statistics.df_of(t) for t in missing]
            computed = term_blocks(self.segments, self.offsets, missing, weighing, dfs)
            for term, block in zip(missing, computed):
                blocks[term] = block
                self._cache.put(keys[term], block)
        return blocks

    def _own_blocks(self, terms: list[str]) -> dict[str, Block]:
        """The block of each of ``terms`` (distinct) with these segments' own statistics."""
        blocks = self._cache.get(terms)
        missing = [t for t in terms if t not in blocks]
        if missing:
            computed = term_blocks(self.segments, self.offsets, missing, self._weighing)
            for term, block in zip(missing, computed):
                blocks[term] = block
                self._cache.put(term, block)
        return blocks

    def _scores(
        self, terms: list[str], allowed: Mask | None, statistics: Statistics | None = None
    ) -> tuple[Int64, Float32]:
        """Live (and allowed) rows holding a query term, global, ascending, and their scores."""
        blocks = self._blocks(list(dict.fromkeys(terms)), statistics)
        picked = [blocks[t] for t in terms if len(blocks[t][0])]  # query order, repeats too
        if len(picked) == 1:  # one term once: its rows are distinct and ascending already
            rows, total = picked[0]
        else:
            rows, total = _sum_by_row(picked)
        if allowed is not None:
            keep = allowed[rows]
            rows, total = rows[keep], total[keep]
        return rows, total


def _sum_by_row(blocks: list[Block]) -> tuple[Int64, Float32]:
    """Distinct rows of ``blocks`` (ascending) and their weights summed in float64 in block
    order, rounded to float32."""
    if not blocks:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    rows = np.concatenate([r for r, _ in blocks])
    weights = np.concatenate([w for _, w in blocks])
    # blocks are ascending runs: a stable sort merges them fast and keeps each row's weights in
    # block (query) order, which bincount then sums in that order
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    starts = np.empty(len(ordered), bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    group = np.cumsum(starts) - 1
    total = np.bincount(group, weights=weights[order], minlength=int(group[-1]) + 1)
    return ordered[starts], total.astype(np.float32)


def _padded(answers: list[tuple[Float32, Int64]]) -> tuple[Float32, Int64]:
    """Per-query answers as ``(scores (q, k'), rows (q, k'))``, -inf / -1 padding."""
    width = max((len(rows) for _, rows in answers), default=0)
    scores = np.full((len(answers), width), -np.inf, dtype=np.float32)
    rows = np.full((len(answers), width), -1, dtype=np.int64)
    for i, (s, r) in enumerate(answers):
        scores[i, : len(s)], rows[i, : len(r)] = s, r
    return scores, rows


def _top(found: Int64, total: Float32, k: int) -> tuple[Float32, Int64]:
    """The best ``k`` of (rows, scores), best first, ties to the lower row."""
    if len(found) > k:  # every row tied with the k-th stays in, so ties are exact
        kth = np.partition(total, len(total) - k)[len(total) - k]
        pick = total >= kth
        found, total = found[pick], total[pick]
    order = np.lexsort((found, -total))[:k]
    return total[order], found[order]
