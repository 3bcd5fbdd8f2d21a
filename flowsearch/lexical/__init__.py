"""The lexical side: tokenising text and BM25 over segment postings.

Owns the tokeniser (shared by documents and queries), the postings a segment stores, and BM25
scoring with corpus-wide statistics. May import only the base modules.
"""
