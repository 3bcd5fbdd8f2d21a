"""Suite: the vector index (structures, segments, the 1M IVF-PQ path)."""
