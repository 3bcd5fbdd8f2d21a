"""The lexical side: tokenising text and BM25 over segment postings.

Owns the tokeniser (shared by documents and queries, ``tokens``), the postings a segment stores
(``postings``, their files in ``postings_files``), and BM25 over a version's segments with
corpus-wide statistics (``bm25``; its formulas in ``weights``, each query term's weighed
postings in ``blocks``). May import only the base modules.
"""
