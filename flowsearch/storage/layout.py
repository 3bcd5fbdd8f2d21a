r"""The names of an index directory's parts: one place for every file and folder name.

Format 3 (this release)::

    index_dir/
      manifest.json              the current version (replacing it publishes a version)
      history.jsonl              one JSON line per write, append-only
      .lock                      held by the one writer
      calibrators/c000001/       config.json + weights.safetensors, shared by all segments
      references/r000003/        sample.npz: the reference sample new rows are judged against
      references/r000005/        delta.npz: what version 5 changed in it (space/sample.py)
      segments/s000004/          one immutable segment:
        rows-00000.parquet ...     its rows (id, text, metadata, vector, raw), in parts
        ann.faiss [ann.ivfdata]    its vector index (FAISS ids = local rows)
        postings/                  its BM25 postings
        keys.npy, key_rows.npy     its ids, hashed and sorted, for lookups by id
        deleted-v000009.npy        its deleted local rows as of version 9 (one file per change)
      segments/.stage-*/         a segment or calibrator being written (removed if abandoned)

Formats 1 and 2 (earlier releases) kept a whole version in one directory (``versions/vN/`` or
the index directory itself); they are read as one segment and converted on the first write.
"""

from __future__ import annotations

__all__ = [
    "ANN_DATA_FILE",
    "ANN_FILE",
    "CALIBRATORS_DIR",
    "HISTORY_NAME",
    "KEYS_FILE",
    "KEY_IDS_FILE",
    "KEY_ROWS_FILE",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "POSTINGS_DIR",
    "REFERENCES_DIR",
    "SEGMENTS_DIR",
    "STAGE_PREFIX",
    "calibrator_dir",
    "deletions_file",
    "part_file",
    "reference_dir",
    "segment_dir",
    "segment_name",
]

MANIFEST_NAME = "manifest.json"
HISTORY_NAME = "history.jsonl"
LOCK_NAME = ".lock"
SEGMENTS_DIR = "segments"
CALIBRATORS_DIR = "calibrators"
#: Reference samples (``flowsearch.space.sample``), one directory per version that drew one.
REFERENCES_DIR = "references"
#: Prefix of a directory being written (inside ``segments/`` or ``calibrators/``).
STAGE_PREFIX = ".stage-"

ANN_FILE = "ann.faiss"
#: An IVF index's inverted lists merged on disk, beside its ``ann.faiss`` (FAISS finds it by
#: this base name in the same directory, so a segment's directory can move).
ANN_DATA_FILE = "ann.ivfdata"
POSTINGS_DIR = "postings"
KEYS_FILE = "keys.npy"
KEY_ROWS_FILE = "key_rows.npy"
#: A string-id segment's ids in key order (Arrow IPC, memory-mapped): confirms a key match
#: exactly without reading the rows (absent in segments written before it).
KEY_IDS_FILE = "key_ids.arrow"


def segment_name(number: int) -> str:
    """``s000004`` for segment number 4."""
    return f"s{number:06d}"


def segment_dir(name: str) -> str:
    """A segment's directory, relative to the index directory."""
    return f"{SEGMENTS_DIR}/{name}"


def calibrator_dir(number: int) -> str:
    """The directory of the calibrator a version numbered ``number`` fitted."""
    return f"{CALIBRATORS_DIR}/c{number:06d}"


def reference_dir(number: int) -> str:
    """The directory of the reference sample a version numbered ``number`` wrote."""
    return f"{REFERENCES_DIR}/r{number:06d}"


def part_file(number: int) -> str:
    """A segment's ``number``-th Parquet part, relative to the segment's directory."""
    return f"rows-{number:05d}.parquet"


def deletions_file(version: int) -> str:
    """A segment's deletion file written by version ``version`` (relative to the segment)."""
    return f"deleted-v{version:06d}.npy"
