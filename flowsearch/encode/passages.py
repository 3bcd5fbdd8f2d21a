r"""Long texts cut into passages the encoder reads whole: by its own tokens, with overlap, at
sentence ends where possible.

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

Example:
    >>> offsets = [(0, 3), (4, 7), (7, 8), (9, 12), (13, 16), (16, 17)]  # "the cat. the dog."
    >>> spans("the cat. the dog.", offsets, PassageSizes(tokens=3, overlap=0, window=4))
    [(0, 9), (9, 17)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowsearch.errors import BadInput

__all__ = [
    "DEFAULT_OVERLAP",
    "DEFAULT_TOKENS",
    "PassageSizes",
    "checked_sizes",
    "joined",
    "spans",
    "split_texts",
]

#: Tokens per passage unless asked otherwise (at most the window): on both long-document dev
#: sets (``benchmarks/bench_passages.py``, RESULTS.md "Passages") 128-token passages beat
#: window-sized ones (dense nDCG@10 0.711 against 0.651 on one-topic documents, 0.506 against
#: 0.392 on mixed ones) for twice the rows; 64 did better still there, but both sets look for
#: one sentence, which favours short passages, at four times the rows.
DEFAULT_TOKENS = 128
#: Tokens a passage shares with the previous one, at most, unless asked otherwise (at most a
#: quarter of the passage): overlap 32 beat 0 at 254-token passages on mixed documents (0.392
#: against 0.374); at 128 tokens 16 and 0 are level (0.711, 0.715) for 10% more rows.
DEFAULT_OVERLAP = 16

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


def split_texts(
    encoder: Any, texts: Sequence[str], sizes: PassageSizes | None
) -> list[list[tuple[int, int]]]:
    """Each text's passages (character spans) under ``encoder``'s tokenizer; with ``sizes``
    None every text is one passage (an index that does not cut: truncation, as before)."""
    if sizes is None:
        return [[(0, len(t))] for t in texts]
    out: list[list[tuple[int, int]]] = [[(0, len(t))] for t in texts]
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
