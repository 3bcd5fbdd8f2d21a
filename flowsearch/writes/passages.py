r"""A write's documents cut into passage rows, the same way for every write of an index.

The index's :class:`~flowsearch.storage.manifest.PassageSpec` (recorded by the build) says how
(:mod:`flowsearch.encode.passages`); :class:`Cuts` tokenizes the corpus once, before anything
is encoded, so the write knows how many rows it makes and whether its segment needs the
passage columns (:mod:`flowsearch.storage.passages`: only when a document is longer than the
window, so a corpus of short texts writes exactly the rows it did before passages). Each
passage row repeats its document's id and metadata; its ``text`` is the passage's.

Example:
    >>> cuts = Cuts(encoder, plan, sizes_of(manifest.passages))  # doctest: +SKIP
    >>> for ids, texts, meta, passages in cuts.batches(plan): ...  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from flowsearch.encode.passages import PassageSizes, checked_sizes, split_texts
from flowsearch.errors import BadInput
from flowsearch.storage import manifest as mf
from flowsearch.storage.corpus import CorpusPlan
from flowsearch.storage.passages import passage_columns

__all__ = ["Cuts", "passage_rows", "requested_sizes", "sizes_of", "spec_of"]

#: Documents per batch (as the writes encode them).
BATCH_DOCUMENTS = 2048


def requested_sizes(enc: Any, tokens: int | None, overlap: int | None) -> PassageSizes | None:
    """A build's passage sizes: ``tokens=0`` turns passages off (each text truncated to the
    window, as before passages); None takes the defaults.

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


def spec_of(sizes: PassageSizes | None) -> mf.PassageSpec | None:
    """The manifest's record of ``sizes``."""
    return None if sizes is None else mf.PassageSpec(**sizes.to_dict())


def sizes_of(spec: mf.PassageSpec | None) -> PassageSizes | None:
    """The sizes a manifest records (None: the index does not cut)."""
    if spec is None:
        return None
    return PassageSizes(tokens=spec.tokens, overlap=spec.overlap, window=spec.window)


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
        encoder: Any,
        plan: CorpusPlan,
        sizes: PassageSizes | None,
        batch_rows: int = BATCH_DOCUMENTS,
    ) -> None:
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

    def batches(
        self, plan: CorpusPlan
    ) -> Iterator[tuple[pa.Array, list[str], pa.Table | None, dict[str, pa.Array] | None]]:
        """``(ids, texts, metadata, passage columns)`` per batch, one row per passage (the
        passage columns None when no document is cut)."""
        for at, (ids, texts, meta) in enumerate(plan.batches(self.batch_rows)):
            if not self.cut:
                yield ids, texts, meta, None
                continue
            cut = self.spans[at]
            yield passage_rows(ids, texts, meta, [cut.get(i, [(0, len(t))]) for i, t in
                                                  enumerate(texts)])  # fmt: skip


def passage_rows(
    ids: pa.Array, texts: list[str], meta: pa.Table | None, spans: list[list[tuple[int, int]]]
) -> tuple[pa.Array, list[str], pa.Table | None, dict[str, pa.Array]]:
    """Documents as passage rows (every build engine's one way): ``(ids, texts, metadata,
    passage columns)``, one row per span of ``spans`` (per document, its passages' character
    spans), each repeating its document's id and metadata (any columns ``meta`` holds).

    Example:
        >>> ids, texts, _, columns = passage_rows(pa.array(["a", "b"]), ["x y", "z"], None,
        ...                                       [[(0, 2), (2, 3)], [(0, 1)]])
        >>> ids.to_pylist(), texts, columns["__passages"].to_pylist()
        (['a', 'a', 'b'], ['x ', 'y', 'z'], [2, 2, 1])
    """
    take = pa.array(np.repeat(np.arange(len(texts)), [len(doc) for doc in spans]))
    passages = [texts[i][a:b] for i, doc in enumerate(spans) for a, b in doc]
    return (
        ids.take(take),
        passages,
        None if meta is None else meta.take(take),
        passage_columns(spans),
    )
