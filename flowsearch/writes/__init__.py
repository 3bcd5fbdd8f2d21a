"""Everything that changes an index: build, add, upsert, delete, compact, recalibrate, Ray.

Each write computes its parts (segments, deletion files, a calibrator) and hands them to the one
version writer (:mod:`flowsearch.storage`), which publishes them. May import every layer below
(``encode`` ... ``search``) and the base modules.
"""
