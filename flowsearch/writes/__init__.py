"""Everything that changes an index: build, add, upsert, delete, compact, recalibrate, Ray.

Each write computes its parts (segments, deletion files, a calibrator) and hands them to the one
version writer (:mod:`flowsearch.storage`), which publishes them. May import every layer below
(``encode`` ... ``search``) and the base modules.
"""

__all__ = ["ENGINES"]

#: Where ``build_index`` runs: this process, or a Ray cluster (:mod:`flowsearch.writes.ray_engine`).
#: Here, not in ``build``, so the command line lists them without importing the writes.
ENGINES = ("local", "ray")
