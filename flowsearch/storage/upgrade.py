r"""Bringing segments an older release wrote up to date, without rewriting their rows.

A segment of string ids written before ``key_ids.arrow`` existed (:mod:`flowsearch.storage.keys`)
still answers every lookup, but confirms each key match by reading the id column of the row
group holding the row: an upsert replacing ids spread over a large index then reads a row group
per id. :func:`add_key_ids` gives such segments the file: each becomes a new segment (a new
name, the same place in the version) whose files are the old ones hard-linked (nothing copied
or re-hashed) plus its key files written afresh from its id column (one read of that column).
Segments stay immutable: the old directory is left to readers pinned to older versions and
removed by the writer's cleanup, like any replaced segment. ``compact`` runs it.

Example:
    >>> with open_writer("idx") as writer:  # doctest: +SKIP
    ...     if add_key_ids(writer):
    ...         writer.publish(kind="compact", n_rows=0)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from flowsearch.atomic import link_or_copy
from flowsearch.storage import manifest as mf
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.layout import KEY_IDS_FILE, KEY_ROWS_FILE, KEYS_FILE
from flowsearch.storage.rows import RowReader
from flowsearch.storage.writer import Writer

__all__ = ["add_key_ids", "lacks_key_ids", "linked_stage"]


def linked_stage(writer: Writer, seg: mf.SegmentRecord, skip: Iterable[str] = ()) -> Path:
    """A new stage of ``writer`` holding segment ``seg``'s files hard-linked (copied where the
    filesystem refuses links), but those in ``skip`` (the caller writes them): what
    :meth:`Writer.relink_segment` takes."""
    source, stage, skipped = writer.segment_path(seg), writer.stage(), set(skip)
    for rel in seg.files:
        if rel not in skipped:
            link_or_copy(source / rel, stage / rel)  # a copy keeps the recorded checksum too
    return stage


def lacks_key_ids(writer: Writer) -> list[str]:
    """The new version's segments (as staged so far) that :func:`add_key_ids` would upgrade:
    published, of a string-id index, keyed, without ``key_ids.arrow``."""
    base = writer.base
    if base is None or base.columns.id_type != "string":
        return []
    return [
        seg.name
        for seg in writer.segments
        if seg.keys is not None
        and KEY_IDS_FILE not in seg.files
        and writer.segment_path(seg) == writer.index_dir / seg.dir
    ]


def add_key_ids(writer: Writer) -> list[str]:
    """Give every segment :func:`lacks_key_ids` names its ``key_ids.arrow`` (see the module
    docstring). Returns the new segments' names (the caller publishes)."""
    new: list[str] = []
    for name in lacks_key_ids(writer):
        seg = next(s for s in writer.segments if s.name == name)
        source = writer.segment_path(seg)
        rewritten = (KEYS_FILE, KEY_ROWS_FILE, KEY_IDS_FILE)
        stage = linked_stage(writer, seg, skip=rewritten)
        reader = RowReader(source, seg.parts)
        try:
            ids = pa.chunked_array([pa.array(c, pa.string()) for c in reader.column_chunks("id")])
        finally:
            reader.close()
        KeyIndex.build(ids).save(stage)
        files = {rel: record for rel, record in seg.files.items() if rel not in rewritten}
        for rel in rewritten:  # only the new files are hashed; the linked ones keep theirs
            path = stage / rel
            files[rel] = mf.FileRecord(bytes=path.stat().st_size, sha256=mf.sha256_file(path))
        new.append(writer.relink_segment(name, stage, dict(sorted(files.items()))).name)
    return new
