r"""Passages: long documents cut into spans the encoder reads whole, and into the rows a write
makes of them.

An encoder reads a bounded number of tokens (its *window*: all-MiniLM-L6-v2 reads 256, two of
them its [CLS] and [SEP]); what a text holds past it never reaches its vector. A text of at
most ``window`` tokens is one passage, the whole text. A longer one is cut into passages of at
most ``sizes.tokens`` tokens, each starting ``sizes.overlap`` tokens (at most) before the
previous one ended, so a sentence cut at a passage's end is read whole by the next one:

* a passage ends before the latest sentence start that leaves it at least half full (else the
  latest word start, else it is cut mid-word at the limit);
* the next one starts at the earliest sentence start within the overlap (else word start; a
  passage never starts mid-word unless a word is longer than the overlap allows).

Passages are character spans ``(start, end)`` into the text that cover it with no gap: the
first starts at 0, the last ends at ``len(text)``, each starts at or before the previous one's
end (a passage keeps the whitespace after its last token). So the text is rebuilt from its
passages alone (:func:`joined`), and a passage's own text is ``text[start:end]``.

A write cuts every document the same way (the index's manifest records the sizes):
:class:`Cuts` tokenizes the corpus once, before anything is encoded, so the write knows how many
rows it makes and whether its segment needs the passage columns (stored by
:mod:`flowsearch.storage.passages`, only when a document is longer than the window). Each
passage row repeats its document's id and metadata; its ``text`` is the passage's.

Example:
    >>> offsets = [(0, 3), (4, 7), (7, 8), (9, 12), (13, 16), (16, 17)]  # "the cat. the dog."
    >>> spans("the cat. the dog.", offsets, PassageSizes(tokens=3, overlap=0, window=4))
    [(0, 9), (9, 17)]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import pyarrow as pa

from flowsearch.errors import BadInput
from flowsearch.ingest.corpus import CorpusPlan

__all__ = [
    "BATCH_DOCUMENTS",
    "DEFAULT_OVERLAP",
    "DEFAULT_TOKENS",
    "Cuts",
    "PassageBatch",
    "PassageSizes",
    "Spans",
    "Tokenizer",
    "checked_sizes",
    "joined",
    "passage_rows",
    "requested_sizes",
    "spans",
    "split_texts",
]

#: Tokens per passage unless asked otherwise (at most the window): shorter passages than the
#: window find a document by one of its sentences better, for more rows (RESULTS.md, "Passages").
DEFAULT_TOKENS = 128
#: Tokens a passage shares with the previous one, at most, unless asked otherwise (at most a
#: quarter of the passage), so a sentence cut at a passage's end is read whole by the next.
DEFAULT_OVERLAP = 16
#: Documents per batch (as the writes encode them).
BATCH_DOCUMENTS = 2048

#: Per document, its passages' character spans, in order.
Spans = list[list[tuple[int, int]]]


class Tokenizer(Protocol):
    """What cutting needs of an encoder: its window and its tokens' character offsets."""

    @property
    def window(self) -> int:
        """Tokens the encoder reads of one text (its special tokens not counted)."""
        ...

    def token_offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as character spans (no special tokens, no truncation)."""
        ...


#: Characters that end a sentence when a token ends with one (closing quotes and brackets may
#: follow).
_SENTENCE_END = frozenset(".!?…。！？")
_CLOSERS = frozenset("\"')]}”’»")


@dataclass(frozen=True)
class PassageSizes:
    """How texts are cut (recorded in the manifest, so every write cuts the same way).

    Attributes:
        tokens: tokens per passage, at most (the encoder's tokens, its special ones not
            counted).
        overlap: tokens a passage shares with the previous one, at most.
        window: tokens the encoder reads of one text: a text of at most this many is one
            passage.
    """

    tokens: int
    overlap: int
    window: int

    def to_dict(self) -> dict[str, int]:
        """``{"tokens", "overlap", "window"}``."""
        return {"tokens": self.tokens, "overlap": self.overlap, "window": self.window}


def checked_sizes(
    window: int, tokens: int | None = None, overlap: int | None = None
) -> PassageSizes:
    """Passage sizes for an encoder reading ``window`` tokens of a text.

    Args:
        window: the encoder's window (its ``max_length`` less its special tokens).
        tokens: tokens per passage; None: :data:`DEFAULT_TOKENS` (at most the window).
        overlap: tokens shared with the previous passage; None: :data:`DEFAULT_OVERLAP`
            (at most a quarter of ``tokens``).

    Raises:
        BadInput: sizes that cannot cut a text (naming the option and its bounds).
    """
    for name, value in (("passage_tokens", tokens), ("passage_overlap", overlap)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise BadInput(f"{name} must be an integer, got {value!r}", param=name)
    if tokens is None:
        tokens = min(DEFAULT_TOKENS, window)
    if not 2 <= tokens <= window:
        raise BadInput(
            f"passage_tokens must be between 2 and the encoder's window ({window}), got {tokens}",
            param="passage_tokens",
        )
    if overlap is None:
        overlap = min(DEFAULT_OVERLAP, tokens // 4)
    if not 0 <= overlap <= tokens // 2:
        raise BadInput(
            f"passage_overlap must be between 0 and half of passage_tokens ({tokens // 2}), "
            f"got {overlap}",
            param="passage_overlap",
        )
    return PassageSizes(tokens=tokens, overlap=overlap, window=window)


def _word_starts(text: str, offsets: Sequence[tuple[int, int]]) -> tuple[list[bool], list[bool]]:
    """Per token: does a word start there (whitespace before it), does a sentence start there
    (a word start after a sentence's end, or after a line break)."""
    n = len(offsets)
    word = [False] * n
    sentence = [False] * n
    for i in range(1, n):
        prev_end, start = offsets[i - 1][1], offsets[i][0]
        if start <= prev_end:
            continue
        word[i] = True
        if "\n" in text[prev_end:start]:
            sentence[i] = True
            continue
        at = prev_end - 1
        while at > offsets[i - 1][0] and text[at] in _CLOSERS:
            at -= 1
        sentence[i] = at >= 0 and text[at] in _SENTENCE_END
    return word, sentence


def _last(flags: list[bool], lo: int, hi: int) -> int | None:
    """The last ``i`` in ``[lo, hi]`` with ``flags[i]``."""
    for i in range(min(hi, len(flags) - 1), lo - 1, -1):
        if flags[i]:
            return i
    return None


def _first(flags: list[bool], lo: int, hi: int) -> int | None:
    """The first ``i`` in ``[lo, hi]`` with ``flags[i]``."""
    for i in range(max(lo, 0), min(hi, len(flags) - 1) + 1):
        if flags[i]:
            return i
    return None


def token_spans(
    text: str, offsets: Sequence[tuple[int, int]], sizes: PassageSizes
) -> list[tuple[int, int]]:
    """The passages of one text as token ranges ``[first, end)`` (see the module docstring)."""
    n = len(offsets)
    if n <= sizes.window:
        return [(0, n)]
    word, sentence = _word_starts(text, offsets)
    size, overlap = sizes.tokens, sizes.overlap
    out: list[tuple[int, int]] = []
    first = 0
    while n - first > size:
        lo, hi = first + max(size // 2, 1), first + size
        end = _last(sentence, lo, hi)
        if end is None:
            end = _last(word, lo, hi)
        if end is None:
            end = hi
        out.append((first, end))
        nxt = end
        if overlap:
            want = end - overlap
            found = _first(sentence, want, end - 1)
            if found is None:  # a word start, else no overlap, else an earlier word start
                found = _first(word, want, end)
            if found is None:
                found = _last(word, first + 1, want)
            nxt = found if found is not None else want
        first = max(nxt, first + 1)
    out.append((first, n))
    return out


def spans(
    text: str, offsets: Sequence[tuple[int, int]], sizes: PassageSizes
) -> list[tuple[int, int]]:
    """The passages of one text as character spans ``(start, end)`` into it, covering it (see
    the module docstring).

    Args:
        text: the text.
        offsets: its tokens' character offsets (no special tokens, no truncation).
        sizes: how to cut.
    """
    ranges = token_spans(text, offsets, sizes)
    n = len(offsets)
    out = []
    for first, end in ranges:
        start = 0 if first == 0 else offsets[first][0]
        stop = len(text) if end >= n else offsets[end][0]
        out.append((start, stop))
    return out


def split_texts(encoder: Tokenizer, texts: Sequence[str], sizes: PassageSizes | None) -> Spans:
    """Each text's passages (character spans) under ``encoder``'s tokenizer; with ``sizes``
    None every text is one passage (an index that does not cut: truncation, as before)."""
    if sizes is None:
        return [[(0, len(t))] for t in texts]
    out: Spans = [[(0, len(t))] for t in texts]
    # a character is at most 4 UTF-8 bytes, so at most 4 tokens (byte-level BPE; word pieces
    # take at least one character each): texts too short to pass the window are not tokenized
    longer = [i for i, t in enumerate(texts) if 4 * len(t) > sizes.window]
    if longer:
        offsets = encoder.token_offsets([texts[i] for i in longer])
        for i, found in zip(longer, offsets, strict=True):
            out[i] = spans(texts[i], found, sizes)
    return out


def joined(texts: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> str:
    """The text rebuilt from its passages (their texts and spans, in order)."""
    out: list[str] = []
    reached = 0
    for text, start, end in zip(texts, starts, ends, strict=True):
        if end > reached:
            out.append(text[max(reached - start, 0) :])
            reached = end
    return "".join(out)


def requested_sizes(enc: Tokenizer, tokens: int | None, overlap: int | None) -> PassageSizes | None:
    """A build's passage sizes: ``tokens=0`` turns passages off (each text truncated to the
    window); None takes the defaults.

    Raises:
        BadInput: sizes the encoder cannot use.
    """
    if tokens == 0:
        if overlap:
            raise BadInput(
                "passage_overlap needs passages", "omit it, or give passage_tokens > 0",
                param="passage_overlap",
            )  # fmt: skip
        return None
    return checked_sizes(enc.window, tokens, overlap)


class PassageBatch(NamedTuple):
    """A batch of passage rows: one row per passage, each with its document's id and metadata."""

    ids: pa.Array
    texts: list[str]
    metadata: pa.Table | None
    #: per document of the batch, its passages' spans; None when no document of the corpus is
    #: cut (every row is a whole document, and the segment has no passage columns)
    spans: Spans | None


class Cuts:
    """Every document of ``plan`` cut into passages (character spans), batch by batch; only
    the documents of several passages are remembered (the others are whole).

    Args:
        encoder: the index's encoder (its tokenizer cuts).
        plan: the corpus being written.
        sizes: how to cut (None: every document is one passage).
        batch_rows: documents per batch.

    Attributes:
        n_rows: passage rows the write makes.
        n_cut: documents of several passages.
        cut: whether any document has several passages (the segment gets the passage columns).
    """

    def __init__(
        self,
        encoder: Tokenizer,
        plan: CorpusPlan,
        sizes: PassageSizes | None,
        batch_rows: int = BATCH_DOCUMENTS,
    ) -> None:
        self.plan = plan
        self.batch_rows = batch_rows
        #: per batch: {document's position in the batch: its spans} for the documents cut
        self.spans: list[dict[int, list[tuple[int, int]]]] = []
        self.batch_sizes: list[int] = []
        self.n_rows = 0
        for _ids, texts, _meta in plan.batches(batch_rows):
            cut = split_texts(encoder, texts, sizes) if sizes is not None else []
            self.spans.append({i: doc for i, doc in enumerate(cut) if len(doc) > 1})
            self.batch_sizes.append(len(texts))
            self.n_rows += len(texts) + sum(len(doc) - 1 for doc in self.spans[-1].values())
        self.n_cut = sum(len(batch) for batch in self.spans)
        self.cut = self.n_cut > 0

    def _counts(self, at: int) -> np.ndarray:
        counts = np.ones(self.batch_sizes[at], dtype=np.int64)
        for i, doc in self.spans[at].items():
            counts[i] = len(doc)
        return counts

    def documents(self) -> np.ndarray | None:
        """int64 (n_rows,): each passage row's document (numbered in corpus order), or None
        when no document is cut."""
        if not self.cut:
            return None
        counts = np.concatenate([self._counts(at) for at in range(len(self.spans))])
        return np.repeat(np.arange(len(counts), dtype=np.int64), counts)

    def batches(self) -> Iterator[PassageBatch]:
        """The plan's rows as passage rows, batch by batch (see :class:`PassageBatch`)."""
        for at, (ids, texts, meta) in enumerate(self.plan.batches(self.batch_rows)):
            if not self.cut:
                yield PassageBatch(ids, texts, meta, None)
                continue
            cut = self.spans[at]
            spans = [cut.get(i, [(0, len(t))]) for i, t in enumerate(texts)]
            yield passage_rows(ids, texts, meta, spans)


def passage_rows(
    ids: pa.Array, texts: list[str], meta: pa.Table | None, spans: Spans
) -> PassageBatch:
    """Documents as passage rows (every build engine's one way): one row per span of ``spans``
    (per document, its passages' character spans), each repeating its document's id and
    metadata (any columns ``meta`` holds).

    Example:
        >>> rows = passage_rows(pa.array(["a", "b"]), ["x y", "z"], None,
        ...                     [[(0, 2), (2, 3)], [(0, 1)]])
        >>> rows.ids.to_pylist(), rows.texts
        (['a', 'a', 'b'], ['x ', 'y', 'z'])
    """
    take = pa.array(np.repeat(np.arange(len(texts)), [len(doc) for doc in spans]))
    passages = [texts[i][a:b] for i, doc in enumerate(spans) for a, b in doc]
    return PassageBatch(ids.take(take), passages, None if meta is None else meta.take(take), spans)
