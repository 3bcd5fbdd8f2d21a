"""Suite: writes and storage (add, upsert, delete, compact, refresh)."""
