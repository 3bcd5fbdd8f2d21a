"""flowsearch's benchmarks: the suite (one folder per area) and the studies (``studies/``).

Run from the repository root: ``python -m benchmarks list``, ``python -m benchmarks run NAME
[--smoke] [ARGS]``, ``python -m benchmarks run --suite --smoke``, ``python -m benchmarks plots``.
Shared code is in ``benchmarks/common``; the table of benchmarks in :mod:`benchmarks.catalog`.
"""
