r"""One segment's lexical index, immutable: its postings.

For each term of the segment's vocabulary, the segment's rows that hold the term and how often
(term-major CSR), and each row's length in terms. Postings hold counts only, never BM25 weights:
idf and the average length depend on every live row of a version, so
:class:`flowsearch.lexical.bm25.Bm25` computes weights at query time from these counts and the
version's statistics, and a write never touches an existing segment's postings.

Rows are *local*: 0 .. n_rows-1 within the segment, in the order the texts came. Deletions are
not part of the postings: wherever postings are read (:class:`~flowsearch.lexical.bm25.Bm25`,
:meth:`Postings.merge`), the segment's deletion mask is given beside them.

A long document is several rows, one per passage (:mod:`flowsearch.storage.passages`), but
BM25 scores it whole: its first passage's row (its *lead*) holds the terms of the document's
whole text with its whole length, and its other passages' rows hold nothing. ``leads`` says
where each row's document is held (0 for a lead, ``p`` for passage ``p``), so a row's BM25 is
its lead's, and BM25's N counts leads: a document counts once, with its own length, as in a
corpus of whole documents. Postings without ``leads`` (every row its own document) hold one
row per document already.

Terms are the vocabulary of :func:`flowsearch.lexical.tokens.tokenize_batch`; postings this
module writes keep the vocabulary sorted (so equal texts give equal arrays, whether built at
once or merged), postings of format 1 keep theirs in first-seen order, and nothing depends on
the order.

On disk (:meth:`Postings.save`, :mod:`~flowsearch.lexical.postings_files`): JSON and plain
``.npy`` arrays, never a pickle; format 3 (with ``leads``) or 2 (without) is written, and
format 1 (the second release's ``LexicalIndex.save``) is read too.

Example:
    >>> p = Postings.build(["tides rise twice a day", "heat pumps move heat"])
    >>> p.vocab
    ['day', 'heat', 'move', 'pump', 'rise', 'tide', 'twice']
    >>> p.postings_of("heat")  # (local rows, term frequencies)
    ([1], [2])
    >>> p.lengths.tolist(), p.nnz
    ([4, 4], 7)
"""

from __future__ import annotations

import bisect
import operator
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from flowsearch.errors import BadInput, IndexDamaged
from flowsearch.ingest.passages import joined
from flowsearch.lexical import postings_files as files
from flowsearch.lexical.tokens import tokenize_batch

__all__ = ["Postings", "check_mask"]

#: Texts tokenised at a time while building postings: bounds the memory of the Python token
#: lists while numpy does the rest in bulk.
BUILD_CHUNK = 8192
#: Segments with at least this many terms find a query term by bisection in their sorted
#: vocabulary instead of a dictionary: a slower lookup, but nothing to build when a large
#: segment is opened.
BISECT_MIN_TERMS = 100_000

_INT32_MAX = int(np.iinfo(np.int32).max)

Int32 = npt.NDArray[np.int32]
Int64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


class Postings:
    r"""One segment's postings (immutable; build with :meth:`build`, :meth:`merge`, :meth:`load`).

    Args:
        vocab: the terms; term id ``t`` is ``vocab[t]``, each term once.
        indptr: int64 (n_terms + 1,): term ``t``'s postings are ``[indptr[t], indptr[t + 1])``.
        rows: int32 (nnz,): the local row of each posting, ascending within a term.
        tf: int32 (nnz,): how often the term occurs in that row (>= 1).
        lengths: int32 (n_rows,): each row's length in terms (after tokenisation).
        leads: int32 (n_rows,) or None: rows back from each row to the row holding its
            document's terms (0: the row holds its own; see the module docstring). None: every
            row holds its own.

    The constructor checks shapes and dtypes only (O(n_terms)); :meth:`load` also checks ranges.
    The arrays become read-only: the postings own them.
    """

    def __init__(
        self,
        vocab: Sequence[str],
        indptr: npt.ArrayLike,
        rows: npt.ArrayLike,
        tf: npt.ArrayLike,
        lengths: npt.ArrayLike,
        leads: npt.ArrayLike | None = None,
    ) -> None:
        self.vocab: list[str] = list(vocab)
        self.indptr: Int64 = _frozen(indptr, np.int64)
        self.rows: Int32 = _frozen(rows, np.int32)
        self.tf: Int32 = _frozen(tf, np.int32)
        self.lengths: Int32 = _frozen(lengths, np.int32)
        self.leads: Int32 | None = None if leads is None else _frozen(leads, np.int32)
        problem = _shape_problem(self)
        if problem:
            raise BadInput(f"inconsistent postings: {problem}", "build them with Postings.build")
        self._index: dict[str, int] | None = None
        self._lookup: Callable[[str], int | None] | None = None
        self._total_length: int | None = None
        # per deletion mask (by identity): (n_live, live length sum); see live_stats
        self._live_stats: dict[int, tuple[Any, tuple[int, int]]] = {}

    # -- reading ---------------------------------------------------------------------------

    @property
    def n_rows(self) -> int:
        """Rows of the segment (deleted ones included)."""
        return len(self.lengths)

    @property
    def n_terms(self) -> int:
        """Distinct terms."""
        return len(self.vocab)

    @property
    def n_documents(self) -> int:
        """Documents: rows that hold their document's terms (deleted ones included)."""
        return self.n_rows if self.leads is None else int(np.count_nonzero(self.leads == 0))

    @property
    def nnz(self) -> int:
        """Postings: distinct (term, row) pairs."""
        return len(self.rows)

    @property
    def term_index(self) -> dict[str, int]:
        """term -> term id; built on first use and kept (read-only by contract: do not change)."""
        index = self._index
        if index is None:  # two threads may both build it; either result is the same
            index = dict(zip(self.vocab, range(len(self.vocab))))
            if len(index) != len(self.vocab):  # only memory-mapped loads leave this unchecked
                raise IndexDamaged("the postings' vocabulary repeats a term", "rebuild the index")
            self._index = index
        return index

    @property
    def term_lookup(self) -> Callable[[str], int | None]:
        """A function: term -> term id, or None for a term not held; chosen on first use.

        A vocabulary of at least :data:`BISECT_MIN_TERMS` terms that ascends (as every
        vocabulary :meth:`build` and :meth:`merge` make) is searched by bisection in the list
        itself (slower a lookup, but nothing to build on open); others through
        :attr:`term_index`.
        """
        lookup = self._lookup
        if lookup is None:
            vocab = self.vocab
            big = len(vocab) >= BISECT_MIN_TERMS
            if big and all(map(operator.lt, vocab, islice(vocab, 1, None))):
                lookup = partial(_bisect, vocab)
            else:
                lookup = self.term_index.get
            self._lookup = lookup
        return lookup

    def postings_of(self, term: str) -> tuple[list[int], list[int]]:
        """(local rows, term frequencies) of ``term``; empty lists for a term not held."""
        t = self.term_lookup(term)
        if t is None:
            return [], []
        span = slice(int(self.indptr[t]), int(self.indptr[t + 1]))
        return self.rows[span].tolist(), self.tf[span].tolist()

    @property
    def total_length(self) -> int:
        """Sum of every row's length (kept after the first call)."""
        if self._total_length is None:
            self._total_length = int(self.lengths.sum(dtype=np.int64))
        return self._total_length

    def live_stats(self, deleted: Mask | None) -> tuple[int, int]:
        """(live documents, sum of their lengths) given the segment's deletion mask: live rows
        that hold their document's terms (every live row, without ``leads``).

        ``deleted`` is bool (n_rows,), True for a deleted row, or None. The answer is kept per
        mask object for as long as the mask lives, so a version that reuses a segment and its
        mask does not count again: a mask is read as immutable (give a new array for new
        deletions, never change one in place).
        """
        if deleted is None:
            return self.n_documents, self.total_length
        key = id(deleted)
        cached = self._live_stats.get(key)
        if cached is not None and cached[0]() is deleted:
            return cached[1]
        check_mask(deleted, self.n_rows, "deleted")
        live = ~deleted
        counted = live if self.leads is None else live & (self.leads == 0)
        stats = int(np.count_nonzero(counted)), int(self.lengths.sum(where=live, dtype=np.int64))
        drop = self._live_stats.pop
        self._live_stats[key] = (weakref.ref(deleted, lambda _: drop(key, None)), stats)
        return stats

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def build(cls, texts: Iterable[str], leads: npt.ArrayLike | None = None) -> Postings:
        """Postings of ``texts``; text ``i`` (in iteration order) is local row ``i``.

        ``leads`` (see the class): when given, the text of a row with a lead above 0 must be
        empty (its document's terms are on its lead's row); use :meth:`of_documents` to build
        them from passages.

        ``texts`` is consumed once, :data:`BUILD_CHUNK` texts at a time
        (a generator over Parquet row groups is fine): beyond one chunk's tokens, only integer
        postings are held.

        Raises:
            BadInput: when a text is not a string, or for more than 2**31 - 1 rows.
        """
        vocab: dict[str, int] = {}
        terms: list[Int64] = []
        rows: list[Int32] = []
        tfs: list[Int32] = []
        lengths: list[Int32] = [np.zeros(0, np.int32)]
        n_rows = 0
        for chunk in _chunks(texts, BUILD_CHUNK):
            docs = tokenize_batch(chunk)
            counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
            ids = np.fromiter(
                (vocab.setdefault(t, len(vocab)) for d in docs for t in d),
                dtype=np.int64,
                count=int(counts.sum()),
            )
            local = np.repeat(np.arange(len(docs), dtype=np.int64), counts)
            # one (term, row) key per token: unique gives each pair once, with its count
            pairs, tf = np.unique(ids * len(docs) + local, return_counts=True)
            terms.append(pairs // len(docs))
            rows.append((pairs % len(docs) + n_rows).astype(np.int32))
            tfs.append(tf.astype(np.int32))
            lengths.append(counts.astype(np.int32))
            n_rows += len(docs)
            if n_rows > _INT32_MAX:
                raise BadInput("more than 2**31 - 1 rows in one segment", "split the corpus")
        words = sorted(vocab)
        rank = np.empty(len(words), np.int64)
        rank[[vocab[w] for w in words]] = np.arange(len(words))
        all_terms = rank[np.concatenate(terms)] if terms else np.zeros(0, np.int64)
        # stable: postings arrive in row order, so rows stay ascending within each term
        order = np.argsort(all_terms, kind="stable")
        built = cls(
            words,
            _offsets(np.bincount(all_terms, minlength=len(words))),
            np.concatenate(rows)[order] if rows else np.zeros(0, np.int32),
            np.concatenate(tfs)[order] if tfs else np.zeros(0, np.int32),
            np.concatenate(lengths),
            leads,
        )
        if built.leads is not None and np.any(built.lengths[built.leads != 0]):
            raise BadInput(
                "a row that is not its document's lead holds terms",
                "give the document's whole text on its lead row, '' on the others",
            )
        return built

    @classmethod
    def of_documents(
        cls, texts: Iterable[str], passages: Iterable[tuple[int, int, int, int]]
    ) -> Postings:
        """Postings of passage rows whose documents BM25 scores whole: ``texts`` are the rows'
        passage texts and ``passages`` their ``(passage, passages, start, end)`` (the
        :mod:`~flowsearch.storage.passages` columns), in row order; a document's passages are
        consecutive rows. A document of one passage is its row, as :meth:`build` makes it."""
        leads: list[int] = []  # filled as build reads the texts, read by it at the end

        def whole() -> Iterator[str]:
            pending: list[tuple[str, int, int]] = []
            for text, (number, count, start, end) in zip(texts, passages, strict=True):
                if number == 0 and pending:
                    raise BadInput("a document's passages are not consecutive rows",
                                   "write a document's passages together, in order")  # fmt: skip
                pending.append((text, int(start), int(end)))
                leads.append(int(number))
                if number == count - 1:
                    yield joined([t for t, _, _ in pending], [a for _, a, _ in pending],
                                 [b for _, _, b in pending])  # fmt: skip
                    yield from ("" for _ in pending[1:])
                    pending = []
            if pending:
                raise BadInput("the rows end inside a document", "give every passage of a document")

        return cls.build(whole(), leads)

    @classmethod
    def merge(cls, segments: Sequence[tuple[Postings, Mask | None]]) -> Postings:
        """One segment's postings from the kept rows of ``segments``, without re-tokenising.

        Args:
            segments: (postings, keep) in order; keep is bool (n_rows,), True for a row to keep,
                or None to keep every row.

        Returns:
            Postings whose rows are the kept rows renumbered in order (segment by segment) and whose
            vocabulary (sorted) is the terms a kept row holds: equal, array for array, to
            :meth:`build` of the kept rows' texts.
        """
        keeps = [_keep_of(p, keep) for p, keep in segments]
        n_rows = sum(int(np.count_nonzero(k)) for k in keeps)
        if n_rows > _INT32_MAX:
            raise BadInput("more than 2**31 - 1 rows in one segment", "merge fewer segments")
        words = sorted(set().union(*(p.vocab for p, _ in segments)))
        where = {w: i for i, w in enumerate(words)}
        to_merged = [np.array([where[t] for t in p.vocab], dtype=np.int64) for p, _ in segments]
        kept_per_term = [_kept_per_term(p, k) for (p, _), k in zip(segments, keeps)]
        counts = np.zeros(len(words), np.int64)
        for ids, kept in zip(to_merged, kept_per_term):
            counts[ids] += kept  # a segment holds each term once: no repeated index
        used = counts > 0
        new_id = np.cumsum(used) - 1
        indptr = _offsets(counts[used])
        out_rows, out_tf = np.empty(int(indptr[-1]), np.int32), np.empty(int(indptr[-1]), np.int32)
        filled = np.zeros(len(words), np.int64)  # postings of each term written so far
        offset = 0
        for (p, _), keep, ids, kept in zip(segments, keeps, to_merged, kept_per_term):
            live = keep[p.rows]
            term = np.repeat(np.arange(p.n_terms, dtype=np.int64), kept)
            # a term's kept postings stay contiguous and ascending: rank within the term
            rank = np.arange(len(term)) - np.repeat(np.cumsum(kept) - kept, kept)
            at = indptr[new_id[ids[term]]] + filled[ids[term]] + rank
            out_rows[at] = (np.cumsum(keep) - 1 + offset)[p.rows[live]]
            out_tf[at] = p.tf[live]
            filled[ids] += kept
            offset += int(np.count_nonzero(keep))
        lengths = [p.lengths[k] for (p, _), k in zip(segments, keeps)]
        leads = None
        if any(p.leads is not None for p, _ in segments):  # a document is kept or dropped whole
            leads = np.concatenate([np.zeros(0, np.int32)] + [
                (np.zeros(p.n_rows, np.int32) if p.leads is None else p.leads)[k]
                for (p, _), k in zip(segments, keeps)
            ])  # fmt: skip
        return cls(
            [w for w, u in zip(words, used) if u],
            indptr,
            out_rows,
            out_tf,
            np.concatenate(lengths) if lengths else np.zeros(0, np.int32),
            leads,
        )

    # -- files -------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> None:
        """Write the postings' files (format 2, see :mod:`~.postings_files`) into ``directory``,
        created if needed.

        Raises:
            BadInput: when ``directory`` holds any other file.
        """
        arrays = {name: getattr(self, name) for name in files.ARRAYS}
        if self.leads is not None:
            arrays["leads"] = self.leads
        counts = {"n_rows": self.n_rows, "n_terms": self.n_terms, "nnz": self.nnz}
        files.write(
            Path(directory), self.vocab, arrays, {**counts, "total_length": self.total_length}
        )

    @classmethod
    def load(cls, directory: str | Path, *, mmap: bool = False) -> Postings:
        """Open postings saved by :meth:`save` (format 2) or by the second release (format 1).

        Args:
            directory: the postings directory.
            mmap: memory-map the arrays (read-only) instead of reading them: opening costs
                reading the vocabulary, and pages are read as queries touch them. The checks
                that would read every page (ranges) or hash every term (repeats) are then
                skipped; damage surfaces as :class:`~flowsearch.errors.IndexDamaged` when a
                query reaches it.

        Raises:
            NotFound: no directory there.
            IndexDamaged: a missing, unexpected or unreadable file, another format, or arrays
                that do not fit together. Nothing is ever unpickled.
        """
        vocab, arrays = files.read(Path(directory), mmap)
        return cls(vocab, **arrays)


def _bisect(vocab: list[str], term: str) -> int | None:
    i = bisect.bisect_left(vocab, term)
    return i if i < len(vocab) and vocab[i] == term else None


def check_mask(mask: object, n_rows: int, name: str) -> None:
    """Refuse anything but a bool (n_rows,) array (``name`` is the parameter at fault)."""
    if not isinstance(mask, np.ndarray) or mask.dtype != bool or mask.shape != (n_rows,):
        shown = f"{mask.dtype} {mask.shape}" if isinstance(mask, np.ndarray) else type(mask)
        raise BadInput(
            f"{name} must be a bool array of shape ({n_rows},), got {shown}",
            f"give {{{name}}} one bool per row",
            param=name,
        )


def _frozen(values: npt.ArrayLike, dtype: type[np.generic]) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype != dtype:
        array = array.astype(dtype)
    if array.flags.writeable:
        array.flags.writeable = False
    return array


def _offsets(counts: npt.NDArray[np.integer[Any]]) -> Int64:
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _keep_of(p: Postings, keep: Mask | None) -> Mask:
    if keep is None:
        return np.ones(p.n_rows, dtype=bool)
    check_mask(keep, p.n_rows, "keep")
    return keep


def _kept_per_term(p: Postings, keep: Mask) -> Int64:
    """int64 (n_terms,): how many of each term's postings fall on kept rows."""
    running = np.zeros(p.nnz + 1, np.int64)
    np.cumsum(keep[p.rows], out=running[1:])
    return running[p.indptr[1:]] - running[p.indptr[:-1]]


def _chunks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _shape_problem(p: Postings) -> str | None:
    """What is wrong with the arrays' shapes (O(1) beyond the vocabulary's length)."""
    if any(a.ndim != 1 for a in (p.indptr, p.rows, p.tf, p.lengths)):
        return "an array is not 1-D"
    if p.indptr.shape != (len(p.vocab) + 1,):
        return "indptr does not match the vocabulary"
    if p.indptr[0] != 0 or p.indptr[-1] != len(p.rows):
        return "indptr does not span the postings"
    if p.rows.shape != p.tf.shape:
        return "rows and tf differ in length"
    if p.leads is not None and p.leads.shape != p.lengths.shape:
        return "leads and lengths differ in length"
    return None
