"""Suite: query latency (filters, the segment filter, lexical over segments)."""
