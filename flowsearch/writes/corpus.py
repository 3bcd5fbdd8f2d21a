r"""The corpus a write reads, under its index's rules; the manifest's record of passage sizes.

Reading a corpus is :mod:`flowsearch.ingest`'s (below storage); what the index asks of it is
storage's: its own column names and, for a write into an existing index, the metadata schema and
id type the manifest records (:mod:`flowsearch.storage.schema`). :class:`IndexColumns` hands
those rules to :func:`~flowsearch.ingest.corpus.read_corpus`.

Example:
    >>> plan = read_for_build("data/sample.parquet", CorpusOptions())  # doctest: +SKIP
    >>> plan = read_for_write(corpus, CorpusOptions("body", "key"), manifest)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from flowsearch.errors import BadInput
from flowsearch.ingest.corpus import Corpus, CorpusOptions, CorpusPlan, IdType, read_corpus
from flowsearch.ingest.passages import PassageSizes
from flowsearch.storage import manifest as mf
from flowsearch.storage import schema

__all__ = ["IndexColumns", "read_for_build", "read_for_write", "sizes_of", "spec_of"]


@dataclass(frozen=True)
class IndexColumns:
    """The index's rules for a corpus's columns (:class:`~flowsearch.ingest.corpus.IndexRules`).

    Attributes:
        columns: an existing index's metadata schema (None: a new index).
        id_type: an existing index's id type (None: a new index).
        auto_id_start: the first row-number id.
    """

    columns: tuple[mf.SchemaColumn, ...] | None = None
    id_type: IdType | None = None
    auto_id_start: int = 0

    @property
    def known(self) -> pa.Schema | None:
        """The metadata columns the index has, with their types."""
        return None if self.columns is None else schema.arrow_schema(self.columns)

    def check_names(self, names: Sequence[str]) -> None:
        """See :func:`flowsearch.storage.schema.check_names`."""
        schema.check_names(names, [c.name for c in self.columns or ()])

    def conform(self, metadata: pa.Table, ids: pa.Array) -> object:
        """See :func:`flowsearch.storage.schema.conform`."""
        return schema.conform(metadata, self.columns or (), ids)


def read_for_build(corpus: Corpus, options: CorpusOptions) -> CorpusPlan:
    """A corpus read and checked for a new index."""
    return read_corpus(corpus, options, IndexColumns())


def read_for_write(corpus: Corpus, options: CorpusOptions, base: mf.Manifest) -> CorpusPlan:
    """A corpus read and checked for a write into the index ``base`` describes: its values
    must fit the index's schema and id type; row-number ids go on from the index's next one.

    Raises:
        BadInput: besides what :func:`~flowsearch.ingest.corpus.read_corpus` refuses, a corpus
            without the id column the index has its ids from.
    """
    cols = base.columns
    rules = IndexColumns(base.schema_, cols.id_type, base.next_auto_id)
    plan = read_corpus(corpus, options, rules)
    if plan.id_column is None and cols.id is not None:
        raise BadInput(
            f"the index has ids from column {cols.id!r}, the corpus has no such column",
            "add the column, or pass {id_column=...}",
            param="id_column",
        )
    return plan


def spec_of(sizes: PassageSizes | None) -> mf.PassageSpec | None:
    """The manifest's record of ``sizes``."""
    return None if sizes is None else mf.PassageSpec(**sizes.to_dict())


def sizes_of(spec: mf.PassageSpec | None) -> PassageSizes | None:
    """The sizes a manifest records (None: the index does not cut)."""
    if spec is None:
        return None
    return PassageSizes(tokens=spec.tokens, overlap=spec.overlap, window=spec.window)
