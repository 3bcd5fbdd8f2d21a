"""What an index holds on disk and how a version of it is published.

Owns the manifest (the typed record of a version), segments (Parquet rows, deletion files),
the metadata schema, the one version writer (lock, staging, atomic publish, cleanup), the
history log, verification, and reading corpora (Parquet, JSON Lines, CSV, records). May import
only the base modules (``errors``, ``settings``, ``atomic``, ``progress``).
"""
