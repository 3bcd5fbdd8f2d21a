r"""Writing one segment: its rows, vector index, postings and keys, into a writer's stage.

Every write that adds rows (build, add, upsert, a merge, recalibrate, the Ray engine) makes its
segment with a :class:`SegmentBuilder`: rows go to Parquet parts as they come and their searched
vectors to the segment's FAISS index (trained first when the factory needs it: the first rows
are buffered until there are enough to train on); :meth:`SegmentBuilder.finish` tunes ``auto``'s
approximate index, builds the BM25 postings and the id keys from the parts just written, and
hands the segment to the version writer.

A segment's factory: ``auto`` resolves by the segment's own size (``Flat`` for the small
segments writes add); an explicit factory that cannot be trained on a small segment's rows
(an IVF with more lists than the rows allow) falls back to exact ``Flat`` for that segment,
unless the write is a build (then the user hears why).

Example:
    >>> builder = SegmentBuilder(writer, dim=384, n_rows=1000)  # doctest: +SKIP
    >>> builder.add(rows_table(ids, texts, meta, Z, U), Z)  # doctest: +SKIP
    >>> record = builder.finish()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from flowsearch.ann import build as ann_build
from flowsearch.ann import io as ann_io
from flowsearch.ann.factory import auto_factory, new_index
from flowsearch.ann.policy import DEFAULT, AnnPolicy
from flowsearch.ann.tune import TUNER_VERSION, exact_index, tune_segment
from flowsearch.errors import BadInput
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.layout import ANN_FILE, KEYS_FILE, POSTINGS_DIR
from flowsearch.storage.manifest import AnnCurve, AnnRecord, AnnTuning, PartRecord, SegmentRecord
from flowsearch.storage.records import encode_vector_sum
from flowsearch.storage.rows import PartWriter, RowReader, matrix
from flowsearch.storage.writer import Writer

if TYPE_CHECKING:
    import faiss

    from flowsearch.lexical.postings import Postings

__all__ = ["SegmentBuilder", "resolve_factory", "segment_tuning"]

LOG = logging.getLogger(__name__)

#: Rows buffered to train an index that needs training, at most.
TRAIN_ROWS = 262_144


def resolve_factory(requested: str, n_rows: int, dim: int, policy: AnnPolicy = DEFAULT) -> str:
    """The factory a segment of ``n_rows`` rows gets when ``requested`` is asked for."""
    return auto_factory(n_rows, policy, dim=dim) if requested == "auto" else requested


class SegmentBuilder:
    """One segment being written into a stage of ``writer`` (see the module docstring).

    Args:
        writer: the version writer.
        dim: the searched dimension.
        n_rows: how many rows will come (decides ``auto``'s factory).
        requested: the index's factory request (``auto`` or a FAISS factory string).
        lexical: build BM25 postings.
        strict_factory: refuse (instead of falling back to ``Flat``) a factory that cannot be
            trained on these rows (a build: the user asked for it).
        index: a trained, empty FAISS index to fill instead (the build trains on its sample).
        factory: ``index``'s factory string.
        ann: what ``auto`` builds and tunes for (None: the defaults).
        tune_queries: float32 (q, dim), the user's queries in the searched space: ``auto``'s
            tuning is made on them instead of held-out rows (``compact(tune_queries=...)``).
    """

    def __init__(
        self,
        writer: Writer,
        *,
        dim: int,
        n_rows: int,
        requested: str = "auto",
        lexical: bool = True,
        strict_factory: bool = False,
        index: faiss.Index | None = None,
        factory: str | None = None,
        ann: AnnPolicy | None = None,
        tune_queries: np.ndarray | None = None,
    ) -> None:
        self.writer = writer
        self.tune_queries = tune_queries
        self.policy = ann or DEFAULT
        self.stage = writer.stage()
        self.dim = dim
        self.requested = requested
        self.lexical = lexical
        self.strict = strict_factory
        self.factory = factory or resolve_factory(requested, n_rows, dim, self.policy)
        if index is None:
            index, _ = ann_build.segment_index(dim, requested, n_rows, self.factory, self.policy)
        self.index = index
        self.parts = PartWriter(self.stage)
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._want = min(max(n_rows, 1), TRAIN_ROWS)
        self._parts: tuple[PartRecord, ...] | None = None
        self._data: str | None = None
        self.n_rows = 0
        #: float64 (dim,): the sum of the searched vectors added (recorded with the segment: the
        #: version's dense background is computed from its segments' sums)
        self.vector_sum = np.zeros(dim, dtype=np.float64)

    def add(self, table: pa.Table, vectors: np.ndarray) -> None:
        """Append rows (``rows_table`` form) and their searched vectors (float32 (n, dim))."""
        self.parts.write(table)
        self.n_rows += table.num_rows
        self.vector_sum += np.asarray(vectors, np.float64).sum(axis=0)
        if self.index.is_trained:
            ann_build.add(self.index, vectors, self.factory)
            return
        self._buffer.append(np.asarray(vectors, dtype=np.float32))
        self._buffered += len(vectors)
        if self._buffered >= self._want:
            self._train_and_flush()

    def write_rows(self, table: pa.Table) -> None:
        """Append rows without adding their vectors (the index is filled elsewhere: see
        :meth:`use_index`)."""
        self.parts.write(table)
        self.n_rows += table.num_rows
        self.vector_sum += matrix(table.column("vector")).astype(np.float64).sum(axis=0)

    def close_parts(self) -> tuple[PartRecord, ...]:
        """Finish the Parquet parts (before :meth:`finish`, to read them); returns them."""
        if self._parts is None:
            self._parts = self.parts.close()
        return self._parts

    def use_index(self, index: faiss.Index, *, data: str | None = None) -> None:
        """Use ``index`` (filled elsewhere, e.g. IVF lists merged on disk into ``data``, a file
        in the stage) as the segment's vector index."""
        self.index = index
        self._buffer, self._buffered = [], 0
        self._data = data

    def _train_and_flush(self) -> None:
        sample = np.concatenate(self._buffer) if self._buffer else np.zeros((0, self.dim))
        try:
            ann_build.train(self.index, sample, self.factory)
        except BadInput:
            if self.strict:
                raise
            LOG.info("segment of %d rows: %s cannot train, using Flat", len(sample), self.factory)
            self.factory = "Flat"
            self.index = new_index(self.dim, "Flat")
        for chunk in self._buffer:
            ann_build.add(self.index, chunk, self.factory)
        self._buffer, self._buffered = [], 0

    def finish(self, postings: Postings | None = None, **fields: object) -> SegmentRecord:
        """Close the parts, tune and save the vector index, build postings (or save the given
        ``postings``, e.g. merged ones) and keys, and hand the segment to the writer
        (``fields``: more :class:`SegmentRecord` fields)."""
        if not self.index.is_trained or self._buffer:
            self._train_and_flush()
        parts = self.close_parts()
        reader = RowReader(self.stage, parts)
        try:
            params, tuning = "", None
            if self.requested == "auto" and self.factory != "Flat" and self.n_rows:
                params, tuning = segment_tuning(self.index, reader, self.policy,
                                                self.tune_queries)  # fmt: skip
                if tuning.exact is not None:  # no graph search worth making reaches the target
                    self.index, self.factory = exact_index(self.index), "Flat"
            ann_io.write_index(self.index, self.stage / ANN_FILE)
            ids = pa.chunked_array([pa.array(c) for c in reader.column_chunks("id")])
            KeyIndex.build(ids).save(self.stage)
            if postings is None and self.lexical:
                postings = _postings(reader)
            if postings is not None:
                postings.save(self.stage / POSTINGS_DIR)
        finally:
            reader.close()
        return self.writer.add_segment(
            self.stage,
            n_rows=self.n_rows,
            parts=parts,
            ann=AnnRecord(
                path=ANN_FILE,
                factory=self.factory,
                params=params,
                data=self._data,
                tuning=tuning,
            ),
            postings=POSTINGS_DIR if postings is not None else None,
            keys=KEYS_FILE,
            vector_sum=encode_vector_sum(self.vector_sum),
            **fields,
        )


def _postings(reader: RowReader) -> Postings:
    """The BM25 postings of a segment's rows: a long document's (several passages) whole, on
    its first passage's row (:meth:`~flowsearch.lexical.postings.Postings.of_documents`)."""
    from flowsearch.lexical.postings import Postings

    texts = (t for chunk in reader.column_chunks("text") for t in chunk)
    if not reader.passage_columns:
        return Postings.build(texts)
    table = reader.table(list(reader.passage_columns))
    columns = [np.asarray(table.column(i).to_numpy()) for i in range(table.num_columns)]
    if not np.any(columns[1] > 1):
        return Postings.build(texts)
    return Postings.of_documents(texts, zip(*(c.tolist() for c in columns), strict=True))


def segment_tuning(
    index: faiss.Index,
    reader: RowReader,
    policy: AnnPolicy = DEFAULT,
    queries: np.ndarray | None = None,
) -> tuple[str, AnnTuning]:
    """Tune ``auto``'s approximate ``index`` of a segment whose rows ``reader`` reads
    (:func:`flowsearch.ann.tune.tune_segment`, for ``policy``; on the user's ``queries`` when
    given): the search parameters to record and what the tuning measured, with the tuner's
    version."""
    chunks = lambda: reader.column_chunks("vector")  # noqa: E731
    tuned = tune_segment(index, chunks, policy, queries=queries)
    curve = tuned.curve
    return tuned.params, AnnTuning(
        recall=tuned.recall,
        target=tuned.target,
        k=tuned.k,
        queries=tuned.queries,
        noise=tuned.noise,
        tuned_recall=tuned.tuned_recall,
        curve=None if curve is None else AnnCurve(
            name=curve.name, values=curve.values, found=curve.found
        ),
        tuner=TUNER_VERSION,
        exact=tuned.exact,
        probes=tuned.probes,
    )  # fmt: skip
