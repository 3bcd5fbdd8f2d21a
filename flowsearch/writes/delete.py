r"""Deleting rows by id: :func:`delete` writes deletion files, nothing else.

The ids are found through each segment's id keys (:mod:`flowsearch.storage.lookup`); each
segment that holds one gets a new deletion file, and the new version is published. The rows
stay in their segments (never returned again, by any mode, filter or k) until a merge or
``compact`` drops them.

Example:
    >>> delete("my_index", ["doc-17"]).missing  # doctest: +SKIP
    []
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from flowsearch.errors import BadInput, check_path
from flowsearch.progress import Stages
from flowsearch.storage.lookup import find_live, typed_ids
from flowsearch.storage.writer import open_writer
from flowsearch.writes.results import WriteResult, result_of

__all__ = ["delete"]


def delete(
    index_dir: str | os.PathLike[str], ids: Sequence[object], *, wait: float | None = None
) -> WriteResult:
    """Delete documents by id (every row of one: all its passages): they are never returned
    again, by any search mode, filter or k.

    Args:
        index_dir: the index directory.
        ids: the ids to delete (an index with integer ids also takes their decimal text).
        wait: seconds to wait for another writer (None: refuse at once).

    Returns:
        A :class:`WriteResult`: ``n_deleted``, and ``missing``, the ids not in the index (or
        deleted before). When none is found, no version is written.

    Raises:
        BadInput: no ids, not a list, or an id that cannot be one of this index's.
        NotFound: no index.
        IndexLocked: another writer, past ``wait``.
    """
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise BadInput(
            "ids must be a list of ids",
            "e.g. delete(index_dir, ['a', 'b'])",
            cli="give ids as arguments or --ids-file",
            param="ids",
        )
    if not ids:
        raise BadInput("no ids to delete", "pass at least one", param="ids")
    target = check_path(index_dir, "index_dir", "an index directory")
    st = Stages()
    with open_writer(target, wait=wait) as writer:
        base = writer.base
        assert base is not None
        wanted = typed_ids(list(ids), base.columns.id_type)
        unique = wanted.unique()
        found = find_live(writer.segments, writer.segment_path, unique)
        hit = {unique[p].as_py() for p, _, _ in found}
        missing = []  # an id named twice counts once: the second time it is gone
        for given, value in zip(ids, wanted.to_pylist(), strict=True):
            if value in hit:
                hit.discard(value)
            else:
                missing.append(given)
        if not found:
            return result_of("delete", target, base, st, missing=missing)
        per_segment: dict[str, list[int]] = {}
        for _, name, row in found:
            per_segment.setdefault(name, []).append(row)
        for name, rows in per_segment.items():
            writer.delete_rows(name, np.array(rows, dtype=np.int64))
        manifest = writer.publish(
            kind="delete", n_rows=len(found), detail={"missing": len(missing)}
        )
    # a document of several passages is several rows: n_deleted counts documents (ids)
    n_documents = len({p for p, _, _ in found})
    return result_of("delete", target, manifest, st, n_deleted=n_documents, missing=missing)
