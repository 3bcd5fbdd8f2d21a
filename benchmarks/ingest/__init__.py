"""Suite: ingest throughput and the figures at 200k rows."""
