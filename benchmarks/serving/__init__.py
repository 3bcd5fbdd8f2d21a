"""Suite: serving from Ray shards beside the local Searcher."""
