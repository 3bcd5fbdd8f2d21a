r"""A query term's *block*: its live postings over every segment of a version, weighed.

A block is ``(rows int64 (df,), weights float32 (df,))``: the global rows holding the term, not
deleted, ascending, and the term's BM25 weight in each (``idf * tfc`` in float64, rounded to
float32; see :mod:`~flowsearch.lexical.weights`). ``df`` is the block's length: the term's
corpus-wide document frequency over live rows.

:func:`term_blocks` computes the blocks of several terms at once from the segments' postings;
the cost is one vocabulary lookup and two slices per (segment, term) plus vectorised work over
the postings. A version's statistics never change, so its blocks do not either: a
:class:`BlockCache` keeps recent ones under a byte budget.

Example:
    >>> from flowsearch.lexical.postings import Postings
    >>> a, b = Postings.build(["tide moon", "moon"]), Postings.build(["rain", "tide tide"])
    >>> stats = Weighing(n_live=4, avg_length=1.5, k1=1.5, b=0.75, method="lucene")
    >>> rows, weights = term_blocks([(a, None), (b, None)], np.array([0, 2, 4]), ["tide"], stats)[0]
    >>> rows.tolist(), [round(float(w), 3) for w in weights]
    ([0, 3], [0.241, 0.358])
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import cachetools
import numpy as np
import numpy.typing as npt

from flowsearch.errors import IndexDamaged
from flowsearch.lexical.postings import Int32, Int64, Mask, Postings
from flowsearch.lexical.weights import Method, idf, tfc

__all__ = ["Block", "BlockCache", "Segment", "Weighing", "live_dfs", "term_blocks"]

#: A segment as the lexical side reads it in a version: its postings and its deletion mask
#: (bool (n_rows,), True for a deleted row) or None.
Segment = tuple[Postings, Mask | None]
Float32 = npt.NDArray[np.float32]
#: A term's live global rows, int64 ascending, and its weight in each, float32.
Block = tuple[Int64, Float32]


@dataclass(frozen=True)
class Weighing:
    """A version's BM25 statistics and parameters: what a weight depends on besides (tf,
    row length, df)."""

    n_live: int
    avg_length: float
    k1: float
    b: float
    method: Method


def term_blocks(
    segments: Sequence[Segment],
    offsets: Int64,
    terms: Sequence[str],
    weighing: Weighing,
    dfs: Sequence[int] | None = None,
) -> list[Block]:
    """The block of each of ``terms`` (distinct), in that order.

    Args:
        segments: the version's segments, in version order.
        offsets: int64 (segments + 1,): each segment's first global row, then the total.
        terms: distinct index terms.
        weighing: the version's statistics.
        dfs: each term's document frequency for its idf, when the corpus is wider than
            ``segments`` (a shard of a version: the df over every shard); None: counted here.

    Raises:
        IndexDamaged: a posting points outside its segment (a damaged memory-mapped array).
    """
    try:
        gathered = _Gathered.of(segments, terms)
        if gathered is None:
            return [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in terms]
        return gathered.weigh(segments, offsets, len(terms), weighing, dfs)
    except IndexError:  # only a damaged memory-mapped array can point outside its segment
        raise IndexDamaged(
            "the lexical postings point outside their segment", "rebuild the index"
        ) from None


def live_dfs(segments: Sequence[Segment], terms: Sequence[str]) -> list[int]:
    """Each of ``terms``' live rows over ``segments`` (its document frequency), without
    weighing anything: what one shard contributes to a version's statistics."""
    out = [0] * len(terms)
    for p, deleted in segments:
        for j, term in enumerate(terms):
            t = p.term_lookup(term)
            if t is None:
                continue
            a, b = p.indptr.item(t), p.indptr.item(t + 1)
            if deleted is None:
                out[j] += b - a
            else:
                out[j] += b - a - int(np.count_nonzero(deleted.take(p.rows[a:b])))
    return out


@dataclass
class _Gathered:
    """The postings of some terms in every segment, segment after segment.

    A *piece* is one term's postings in one segment; ``pieces`` holds each piece's term,
    start and end in the arrays, and ``spans`` each segment's (segment, start, end).
    """

    local: Int32
    tf: Int32
    pieces: list[tuple[int, int, int]]
    spans: list[tuple[int, int, int]]

    @classmethod
    def of(cls, segments: Sequence[Segment], terms: Sequence[str]) -> _Gathered | None:
        """Gather ``terms``' postings; None when no segment holds any of them."""
        rows: list[Int32] = []
        tfs: list[Int32] = []
        pieces: list[tuple[int, int, int]] = []
        spans: list[tuple[int, int, int]] = []
        n = 0
        # once per (segment, term): plain Python and two slices; numpy calls are per segment
        for s, (p, _) in enumerate(segments):
            get = p.term_lookup
            ids = [get(term) for term in terms]
            if ids.count(None) == len(ids):
                continue
            item, segment_rows, segment_tf, start = p.indptr.item, p.rows, p.tf, n
            for j, t in enumerate(ids):
                if t is not None:
                    a, b = item(t), item(t + 1)
                    rows.append(segment_rows[a:b])
                    tfs.append(segment_tf[a:b])
                    pieces.append((j, n, n + b - a))
                    n += b - a
            spans.append((s, start, n))
        if not n:
            return None
        return cls(np.concatenate(rows), np.concatenate(tfs), pieces, spans)

    def weigh(
        self,
        segments: Sequence[Segment],
        offsets: Int64,
        n_terms: int,
        weighing: Weighing,
        dfs: Sequence[int] | None = None,
    ) -> list[Block]:
        """The terms' blocks: live postings, global rows, weights; regrouped term by term."""
        local = self.local
        lengths = np.empty(len(local), np.int32)
        alive: Mask | None = None
        for s, lo, hi in self.spans:  # one gather per segment (a gather costs microseconds)
            p, deleted = segments[s]
            np.take(p.lengths, local[lo:hi], out=lengths[lo:hi])
            if deleted is not None:
                alive = np.ones(len(local), bool) if alive is None else alive
                np.logical_not(deleted.take(local[lo:hi]), out=alive[lo:hi])
        rows = local.astype(np.int64)
        rows += np.repeat(
            offsets[[s for s, _, _ in self.spans]], [h - lo for _, lo, h in self.spans]
        )
        piece = np.array(self.pieces, dtype=np.int64)
        term, size = piece[:, 0], piece[:, 2] - piece[:, 1]
        if alive is None:
            live = size
        else:
            running = np.zeros(len(local) + 1, np.int64)
            np.cumsum(alive, out=running[1:])
            live = running[piece[:, 2]] - running[piece[:, 1]]
        df = np.bincount(term, weights=live, minlength=n_terms).astype(np.int64)
        w = weighing
        counted = df.tolist() if dfs is None else [int(d) if n else 0 for d, n in zip(dfs, df)]
        idfs = np.array([idf(w.method, d, w.n_live) if d else 0.0 for d in counted])
        c = tfc(w.method, self.tf.astype(np.float64), lengths.astype(np.float64),
                w.avg_length, w.k1, w.b)  # fmt: skip
        weights = (np.repeat(idfs[term], size) * c).astype(np.float32)
        if len(self.spans) > 1 and n_terms > 1:  # regroup term after term (one segment: done)
            order = np.argsort(term, kind="stable")  # each term's pieces in segment order
            starts, sizes = piece[order, 1], size[order]
            moved = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
            permutation = moved + np.arange(len(local))
            rows, weights = rows[permutation], weights[permutation]
            alive = None if alive is None else alive[permutation]
        if alive is not None:
            rows, weights = rows[alive], weights[alive]
        ends = np.cumsum(df).tolist()
        return [_block(rows[a:b], weights[a:b]) for a, b in zip([0, *ends[:-1]], ends)]


def _block(rows: Int64, weights: Float32) -> Block:
    """A block of its own (copies: a kept block holds no other term's postings), read-only:
    blocks are shared by queries on several threads."""
    block = rows.copy(), weights.copy()
    for array in block:
        array.flags.writeable = False
    return block


class BlockCache:
    """Recently used blocks of one version, least recently used dropped past ``max_bytes``.

    Safe to share between threads. A budget of 0 keeps nothing.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(int(max_bytes), 0)
        self._lru: cachetools.LRUCache[str, Block] = cachetools.LRUCache(
            maxsize=max(self.max_bytes, 1), getsizeof=_size
        )
        self._lock = threading.Lock()

    def get(self, terms: Sequence[str]) -> dict[str, Block]:
        """The cached blocks of ``terms`` (those it holds)."""
        if not self.max_bytes:
            return {}
        with self._lock:
            return {t: block for t in terms if (block := self._lru.get(t)) is not None}

    def put(self, term: str, block: Block) -> None:
        """Keep ``block`` unless it alone passes the budget."""
        if _size(block) <= self.max_bytes:
            with self._lock:
                self._lru[term] = block

    @property
    def n_bytes(self) -> int:
        """Bytes the kept blocks hold."""
        with self._lock:
            return int(self._lru.currsize)


def _size(block: Block) -> int:
    return 64 + block[0].nbytes + block[1].nbytes  # 64: an empty block still costs something
