"""Reading a corpus: its sources, the column choice and checks, the passage cut.

One pass from a corpus argument (files, a directory, a glob, Parquet / JSON Lines / CSV, records
or an Arrow table) to a checked :class:`~flowsearch.ingest.corpus.CorpusPlan` that streams its
rows (:func:`~flowsearch.ingest.corpus.read_corpus`), and the cut of long documents into the
passages the encoder reads whole (:mod:`flowsearch.ingest.passages`). Imports only the base
modules: what the index asks of a corpus is handed in by the write
(:class:`~flowsearch.ingest.corpus.IndexRules`), and the encoder only through its tokens
(:class:`~flowsearch.ingest.passages.Tokenizer`).
"""

__all__: list[str] = []
