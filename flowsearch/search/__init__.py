"""Answering queries against a pinned version: the Searcher, fusion, filters and reports.

Owns opening a version's segments for reading, dense and lexical search over them, hybrid fusion,
``where`` filters (DuckDB), hits and query results. May import: ``encode``, ``calibration``,
``storage``, ``space``, ``ann``, ``lexical`` and the base modules.
"""
