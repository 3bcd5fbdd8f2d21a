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

__all__ = ["STOPWORDS_EN", "term_spans", "tokenize", "tokenize_batch"]

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
    wanted = frozenset(terms)
    if not wanted:
        return []
    if text.isascii():  # NFKC changes nothing and case folding is lower(): one pass, same offsets
        found = list(_ASCII_WORD.finditer(text.lower()))
        words = [m.group() for m in found]
        distinct = list(set(words) - _STOPWORDS)
        hits = {w for w, t in zip(distinct, _stemmer().stemWords(distinct)) if t in wanted}
        return [m.span() for m, w in zip(found, words) if w in hits]
    found = list(_WORD.finditer(text))
    # a word may become several terms (NFKC splits some characters) or none (a stopword)
    pieces = [_WORD.findall(unicodedata.normalize("NFKC", m.group()).casefold()) for m in found]
    distinct = list({w: None for words in pieces for w in words if w not in _STOPWORDS})
    stem = dict(zip(distinct, _stemmer().stemWords(distinct)))
    return [
        m.span()
        for m, words in zip(found, pieces)
        if any(w in stem and stem[w] in wanted for w in words)
    ]
