r"""Finding the live rows that hold given ids, across a version's segments.

An id is live in at most one segment (an upsert deletes the old row when it writes the new
one). Each segment's key index (:mod:`flowsearch.storage.keys`) gives candidate rows by binary
search; a string candidate is confirmed exactly against the segment's ids in key order
(``key_ids.arrow``), or, in a segment written before that file, against the id column of the
row group holding the row; a deleted row does not count. The cost grows with the ids asked for
and the segments, not with the corpus (the older segments' confirmation: with the row groups
the ids fall in, up to one of 1,024 rows per id).

Ids keep the index's type: an integer index takes integers and canonical decimal strings
(ASCII digits, as the command line and JSON give them: ``"17"``, ``"-3"``; not ``"²"`` or
``"017"``); a string index takes strings, and integers as their decimal text.

Example:
    >>> typed_ids(["17", 3], "int").to_pylist()
    [17, 3]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from flowsearch.errors import BadInput, check_text
from flowsearch.ingest.columns import check_id_length
from flowsearch.storage import deletions, keys
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.layout import KEY_IDS_FILE
from flowsearch.storage.manifest import SegmentRecord
from flowsearch.storage.rows import RowReader

__all__ = ["find_live", "typed_ids"]

_DECIMAL = re.compile(r"[+-]?(0|[1-9][0-9]*)", re.ASCII)
_INT64 = (-(2**63), 2**63 - 1)


def typed_ids(ids: Sequence[object], id_type: str, param: str = "ids") -> pa.Array:
    """The ids as the index stores them (int64 or string).

    Raises:
        BadInput: an id that cannot be one of this index's ids (naming it).
    """
    out: list[int | str] = []
    for given in ids:
        if isinstance(given, np.integer):
            given = int(given)
        if isinstance(given, bool) or not isinstance(given, (int, str)):
            raise BadInput(
                f"id {given!r} is a {type(given).__name__}; ids are integers or strings",
                param=param,
            )
        if isinstance(given, str):
            check_text(given, "id", param)
        if id_type == "string":
            text = str(given)
            check_id_length(text, f"id {text[:20]!r}...", param=param)
            out.append(text)
            continue
        if isinstance(given, str):
            text = given.strip()
            if not _DECIMAL.fullmatch(text):
                raise BadInput(
                    f"id {given!r} is not an integer, and this index's ids are",
                    "give integer ids (ASCII digits)",
                    param=param,
                )
            given = int(text)
        if not _INT64[0] <= given <= _INT64[1]:
            raise BadInput(f"id {given} does not fit in 64 bits", param=param)
        out.append(given)
    return pa.array(out, pa.string() if id_type == "string" else pa.int64())


def find_live(
    segments: Sequence[SegmentRecord],
    folder_of: Callable[[SegmentRecord], Path],
    ids: pa.Array,
) -> list[tuple[int, str, int]]:
    """``(position in ids, segment name, local row)`` of every live row holding one of ``ids``.

    Args:
        segments: the version's segments (each with a key index).
        folder_of: where a segment's files are (the writer's staging-aware path).
        ids: typed ids (:func:`typed_ids`), unique.
    """
    found: list[tuple[int, str, int]] = []
    strings = pa.types.is_string(ids.type)
    hashed = keys.keys_of(ids)  # once for every segment
    for seg in segments:
        folder = folder_of(seg)
        if seg.keys is None:
            raise BadInput(f"segment {seg.name} has no id keys", "rebuild the index")
        index = KeyIndex.load(folder, seg.n_rows, ids=strings and KEY_IDS_FILE in seg.files)
        candidates = index.lookup(ids, hashed)
        if not candidates:
            continue
        if seg.deletions is not None:
            dead = deletions.read_rows(folder / seg.deletions, seg.n_rows)
            rows = np.array([r for _, r in candidates], np.int64)
            alive = ~np.isin(rows, dead)
            candidates = [c for c, live in zip(candidates, alive, strict=True) if live]
        if strings and candidates and not index.exact:  # a segment without key_ids.arrow
            reader = RowReader(folder, seg.parts)
            try:  # the id column only, of the row groups holding the candidates
                stored = reader.values_at(np.array([r for _, r in candidates], np.int64), "id")
            finally:
                reader.close()
            wanted = ids.to_pylist()
            candidates = [
                (p, r)
                for (p, r), value in zip(candidates, stored, strict=True)
                if value == wanted[p]
            ]
        found.extend((p, seg.name, r) for p, r in candidates)
    return found
