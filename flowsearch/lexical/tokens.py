r"""The lexical side's tokeniser: one function for documents and queries.

Unicode NFKC, case folding, runs of letters and digits in any script, English stopwords
(:data:`STOPWORDS_EN`: Lucene's English list, as bm25s's ``STOPWORDS_EN``; kept here, as importing
bm25s for it cost a cold query scipy.sparse's import), Snowball English stemming (PyStemmer). A word
the English stemmer does not know passes through unchanged; empty or punctuation-only text has no
terms.

Example:
    >>> tokenize("The tides are rising twice a day!")
    ['tide', 'rise', 'twice', 'day']
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Collection, Sequence
from typing import Any

import Stemmer

from flowsearch.errors import BadInput

__all__ = ["STOPWORDS_EN", "term_spans", "term_spans_batch", "tokenize", "tokenize_batch"]

#: Lucene's English stopwords (``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET``; bm25s's list too).
STOPWORDS_EN = (
    *("a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is"),
    *("it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there"),
    *("these", "they", "this", "to", "was", "will", "with"),
)

_WORD = re.compile(r"[^\W_]+")
_ASCII_WORD = re.compile(r"[a-z0-9]+")  # _WORD on lower-cased ASCII text, faster
_STOPWORDS = frozenset(STOPWORDS_EN)
# A Stemmer object is not thread-safe; the server answers queries from several threads.
_LOCAL = threading.local()


def _stemmer() -> Any:
    stemmer = getattr(_LOCAL, "stemmer", None)
    if stemmer is None:
        stemmer = _LOCAL.stemmer = Stemmer.Stemmer("english")
    return stemmer


def tokenize_batch(texts: Sequence[str]) -> list[list[str]]:
    """Index terms of each text: NFKC, case-folded, letter/digit runs, no stopwords, stemmed.

    The one tokeniser of documents and queries. Any script is accepted (a word the English
    stemmer does not know passes through unchanged); empty or punctuation-only text has no terms.

    Raises:
        BadInput: when an item is not a string.
    """
    words: list[list[str]] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadInput(
                f"text {i} is {type(text).__name__}, not a string", "give every row a text"
            )
        folded = unicodedata.normalize("NFKC", text).casefold()
        words.append([w for w in _WORD.findall(folded) if w not in _STOPWORDS])
    # stem each distinct word once, in one call: words repeat a lot, and the stemmer's cost is
    # per word it is handed
    distinct = list({w: None for doc in words for w in doc})
    stem = dict(zip(distinct, _stemmer().stemWords(distinct)))
    return [[stem[w] for w in doc] for doc in words]


def tokenize(text: str) -> list[str]:
    """Index terms of one text (see :func:`tokenize_batch`)."""
    return tokenize_batch([text])[0]


def term_spans(text: str, terms: Collection[str]) -> list[tuple[int, int]]:
    """Where in ``text`` the words are whose index term is one of ``terms`` (a query's
    :func:`tokenize`): (start, end) character offsets, in order, the words as written (so
    ``cuts`` is found for the query ``cutting``, both being the term ``cut``).

    A word is a run of letters and digits in ``text`` itself, made a term as
    :func:`tokenize_batch` makes one (NFKC, case folding, stopwords, stemming).

    Example:
        >>> text = "Cuts heal; a cutting wind."
        >>> [text[a:b] for a, b in term_spans(text, tokenize("cutting"))]
        ['Cuts', 'cutting']
    """
    return term_spans_batch([text], terms)[0]


def term_spans_batch(texts: Sequence[str], terms: Collection[str]) -> list[list[tuple[int, int]]]:
    """:func:`term_spans` of each text against the same ``terms``, the distinct words of all
    the texts stemmed in one call (a search marks its ``k`` hits at once)."""
    wanted = frozenset(terms)
    if not wanted:
        return [[] for _ in texts]
    # per text: its words' matches, and each match's words (a word may fold to several, or
    # none: NFKC splits some characters); ASCII text folds each match to itself, same offsets
    found: list[tuple[list[re.Match[str]], list[str] | None, list[list[str]] | None]] = []
    distinct: set[str] = set()
    for text in texts:
        if text.isascii():
            matches = list(_ASCII_WORD.finditer(text.lower()))
            words = [m.group() for m in matches]
            distinct.update(words)
            found.append((matches, words, None))
        else:
            matches = list(_WORD.finditer(text))
            folded = [_WORD.findall(unicodedata.normalize("NFKC", m.group()).casefold())
                      for m in matches]  # fmt: skip
            distinct.update(w for ws in folded for w in ws)
            found.append((matches, None, folded))
    stems = list(distinct - _STOPWORDS)
    hits = {w for w, t in zip(stems, _stemmer().stemWords(stems), strict=True) if t in wanted}
    out = []
    for spans, plain, several in found:
        if plain is not None:
            out.append([m.span() for m, w in zip(spans, plain, strict=True) if w in hits])
        else:
            assert several is not None
            out.append([m.span() for m, ws in zip(spans, several, strict=True)
                        if any(w in hits for w in ws)])  # fmt: skip
    return out
