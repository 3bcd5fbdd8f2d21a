"""The searched space: raw vectors through a fitted calibrator to unit rows, and what is
measured in that space.

Owns :class:`~flowsearch.space.search_space.SearchSpace` (encoder -> calibrator -> normalise),
the ``auto`` policy that decides which space an index searches
(:mod:`~flowsearch.space.fitting`), and the reference statistics queries and new rows are judged
against (:mod:`~flowsearch.space.reference`). May import: ``encode``, ``calibration``,
``storage`` (the manifest's records), and the base modules. The reports in plain words built on
the reference are :mod:`~flowsearch.space.reports` (queries, the searched space) and
:mod:`~flowsearch.space.drift` (new rows).
"""
