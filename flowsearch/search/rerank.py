r"""A second stage over a search's hits: :class:`Reranker`, a cross-encoder.

The first stage (dense, lexical or hybrid, with its filter) finds the top
:data:`DEFAULT_RERANK_DEPTH` documents (at least ``k``); a cross-encoder reads each (query,
document) pair together and scores it, and the hits come back in the cross-encoder's order, each
with that score as ``rerank_score`` beside its first-stage ``score``. A document cut into
passages is read as its best passage (the hit's ``highlight``: what the first stage matched and
what fits the cross-encoder's window), a document read whole as its text. A long document's hit
without a best passage (``lexical`` mode, or a ``hybrid`` hit only BM25 found: BM25 scores a
document whole) is read as its text, as far as the cross-encoder's window goes.

The cross-encoder is any sentence-transformers ``CrossEncoder`` (a Hugging Face id or a local
directory); its score is what the model's ``predict`` gives (a sigmoid for a one-label model),
comparable between the hits of one query, not a calibrated [0, 1] like ``score``.

Example:
    >>> r = Reranker.load("cross-encoder/ms-marco-MiniLM-L6-v2")  # doctest: +SKIP
    >>> s = Searcher.open("idx", reranker=r)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flowsearch.errors import BadInput, MissingExtra, NotFound
from flowsearch.search.results import Hit

__all__ = ["DEFAULT_RERANK_DEPTH", "Reranker", "checked_depth", "passage_of"]

LOG = logging.getLogger(__name__)

#: First-stage documents a query's cross-encoder reads (at least ``k``): deeper finds relevant
#: documents the first stage ranked low, for one cross-encoder pass per extra document.
DEFAULT_RERANK_DEPTH = 50

#: Pairs the cross-encoder reads per forward pass.
BATCH_SIZE = 32


def passage_of(hit: Hit) -> str:
    """What the cross-encoder reads of a hit: its best passage, else its whole text."""
    return hit.highlight.text if hit.highlight is not None else hit.text


def checked_depth(depth: object) -> int:
    """``depth`` as the number of documents to rerank (an integer >= 1).

    Raises:
        BadInput: anything else.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise BadInput(f"rerank_depth must be an integer >= 1, got {depth!r}",
                       "pass {rerank_depth=50}", param="rerank_depth")  # fmt: skip
    return depth


class Reranker:
    """A cross-encoder that reorders hits. Use :meth:`load`; safe to share between threads.

    Args:
        model: a loaded ``sentence_transformers.CrossEncoder`` (or anything with its
            ``predict(pairs, batch_size=...)``).
        name: what to call it in messages and ``info``.
    """

    def __init__(self, model: Any, name: str) -> None:
        self.model = model
        self.name = name
        # a fast tokenizer refuses to be borrowed by two threads at once
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model: str | os.PathLike[str], device: str | None = None) -> Reranker:
        """Load a sentence-transformers ``CrossEncoder`` by Hugging Face id or local directory.

        Raises:
            NotFound: no model there (a directory that does not exist, an id that cannot be
                fetched, e.g. offline).
            BadInput: a directory that holds no cross-encoder.
            MissingExtra: sentence-transformers is not installed.
        """
        name = os.fspath(model)
        if not isinstance(name, str) or not name.strip():
            raise BadInput("the reranker model is empty", "name a CrossEncoder id or directory",
                           param="reranker")  # fmt: skip
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise MissingExtra(
                f"reranking needs sentence-transformers ({exc.name} is missing)",
                "install it: pip install 'flowsearch[rerank]'",
            ) from None
        path = Path(name).expanduser()
        # a Hugging Face id is "name" or "owner/name"; anything else is meant as a directory
        local = path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
        if local and not path.is_dir():
            raise NotFound(f"no cross-encoder directory at {name}",
                           "name a directory saved by CrossEncoder.save, or a Hugging Face id",
                           param="reranker")  # fmt: skip
        try:
            loaded = CrossEncoder(str(path) if local else name, device=device)
        except OSError as exc:
            raise NotFound(f"could not load the cross-encoder {name!r} ({_first_line(exc)})",
                           "name a local CrossEncoder directory, or a Hugging Face id this "
                           "machine can fetch", param="reranker") from None  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"{name!r} is not a cross-encoder ({_first_line(exc)})",
                           "name a sentence-transformers CrossEncoder id or directory",
                           param="reranker") from None  # fmt: skip
        heads = _architectures(loaded)
        if heads and not any("ForSequenceClassification" in head for head in heads):
            # an encoder without a classification head (the index's own embedding model, a
            # masked-LM checkpoint): CrossEncoder would add a random one and rank at random
            raise BadInput(f"{name!r} is not a cross-encoder (a {heads[0]} without a "
                           "classification head: its scores would be random)",
                           "name a sentence-transformers CrossEncoder id or directory, e.g. "
                           "an MS MARCO one, not an embedding model", param="reranker")  # fmt: skip
        labels = getattr(loaded, "num_labels", 1)
        if labels != 1:
            raise BadInput(f"{name!r} scores {labels} labels, not one relevance score",
                           "name a relevance cross-encoder (one label), e.g. an MS MARCO one",
                           param="reranker")  # fmt: skip
        LOG.info("reranking with %s", name)
        return cls(loaded, name)

    def scores(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """The cross-encoder's score of each (query, passage) pair: float32 (len(pairs),)."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        with self._lock:
            out = self.model.predict(
                list(pairs), batch_size=BATCH_SIZE, show_progress_bar=False, convert_to_numpy=True
            )
        return np.asarray(out, dtype=np.float32).reshape(len(pairs))

    def rerank(self, queries: Sequence[str], hits: Sequence[list[Hit]], k: int) -> list[list[Hit]]:
        """Each query's hits in the cross-encoder's order (best first, ties in first-stage
        order), cut to ``k``, ranked again from 1, with ``rerank_score`` set. One
        cross-encoder call for every pair of the batch."""
        pairs = [(q, passage_of(h)) for q, per_query in zip(queries, hits, strict=True)
                 for h in per_query]  # fmt: skip
        scores = self.scores(pairs)
        out: list[list[Hit]] = []
        start = 0
        for per_query in hits:
            mine = scores[start : start + len(per_query)]
            start += len(per_query)
            order = np.argsort(-mine, kind="stable")[:k]
            out.append([
                per_query[int(i)].model_copy(update={"rank": rank, "rerank_score": float(mine[i])})
                for rank, i in enumerate(order, start=1)
            ])  # fmt: skip
        return out

    def __repr__(self) -> str:
        return f"Reranker({self.name!r})"


def _architectures(loaded: Any) -> list[str]:
    """The model classes a loaded CrossEncoder's saved config names (empty: it names none)."""
    names = getattr(getattr(loaded, "config", None), "architectures", None)
    return [str(n) for n in names] if isinstance(names, (list, tuple)) else []


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."
