"""The limits the fuzz suite runs its filters under (small, so a hole shows without exhausting
the machine); a module of its own, as ``conftest`` names clash between test folders."""

#: Bytes a fuzzed filter's DuckDB database may hold.
FILTER_MEMORY = 64 * 2**20
#: Seconds a fuzzed filter may run.
FILTER_TIMEOUT = 1.0
