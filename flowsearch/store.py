r"""The on-disk side of an index: Parquet shards of rows, and the manifest that vouches for them.

A shard holds ``id``, ``text``, the corpus's other columns (metadata) as given, ``vector`` (a
``fixed_size_list<float32>``: the searched space) and ``raw`` (a ``fixed_size_list<float16>``: the
encoder's own output, kept so a calibrator can be refitted without re-encoding). Shards have a
bounded number of rows and small row groups, so one hit is joined to its row by decoding one row
group of one memory-mapped shard, never the whole corpus.

``manifest.json`` names every file with its size and sha256; it is written last (atomically), so a
directory without one is never mistaken for an index.

Example:
    >>> writer = ShardWriter(root)  # doctest: +SKIP
    >>> writer.write(shard_table(ids, texts, None, vectors, raw))  # doctest: +SKIP
    >>> shards = writer.close()  # doctest: +SKIP
    >>> RowReader(root, shards).rows([3, 0])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.errors import FlowsearchError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "RESERVED_COLUMNS",
    "ROW_GROUP_ROWS",
    "SHARD_ROWS",
    "RowReader",
    "ShardWriter",
    "file_record",
    "is_index_dir",
    "read_manifest",
    "sha256_file",
    "shard_table",
    "utc_now",
    "verify_files",
    "write_manifest",
]

LOG = logging.getLogger(__name__)

FORMAT = "flowsearch-index"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
#: Columns every shard has; a corpus's metadata columns may not take these names.
RESERVED_COLUMNS = ("id", "text", "vector", "raw")
#: Rows per shard file (about 150 MB at dim 384 with short passages).
SHARD_ROWS = 50_000
#: Rows per Parquet row group: the unit decoded to join one hit to its row.
ROW_GROUP_ROWS = 1024
#: Files at most this large are checksummed on every open; larger ones only with verify=True.
CHEAP_CHECKSUM_BYTES = 16 * 2**20


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string (seconds), as stored in manifests."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_record(root: Path, relpath: str) -> dict[str, Any]:
    """``{"bytes", "sha256"}`` of ``root/relpath``, the manifest's entry for one file."""
    path = root / relpath
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _fixed_list(values: np.ndarray, dtype: type) -> pa.FixedSizeListArray:
    """A ``fixed_size_list<dtype>`` column from a 2-D array of shape (n, dim)."""
    values = np.ascontiguousarray(values, dtype=dtype)
    flat = pa.array(values.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


def shard_table(
    ids: pa.Array | Sequence[Any],
    texts: pa.Array | Sequence[str],
    metadata: pa.Table | None,
    vectors: np.ndarray,
    raw: np.ndarray,
) -> pa.Table:
    """Assemble the rows of a shard.

    Args:
        ids: row ids, int64 or string, length n.
        texts: the passages, length n.
        metadata: the corpus's other columns (n rows) or None.
        vectors: float32 (n, d) in the searched space (L2-normalised).
        raw: (n, dim) encoder output, stored as float16.

    Returns:
        A table with columns id, text, metadata..., vector, raw.
    """
    columns: dict[str, pa.Array] = {
        "id": ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(ids),
        "text": texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts),
    }
    if metadata is not None:
        for name in metadata.column_names:
            columns[name] = metadata.column(name)
    columns["vector"] = _fixed_list(vectors, np.float32)
    columns["raw"] = _fixed_list(raw, np.float16)
    return pa.table(columns)


class ShardWriter:
    """Writes shard tables to ``root/shards/part-NNNNN.parquet``, at most ``shard_rows`` each.

    Args:
        root: the index directory being built.
        first_part: number of the first part file (``add`` continues after the existing ones).
        shard_rows: row bound per file (default :data:`SHARD_ROWS`).
        row_group_rows: rows per Parquet row group (default :data:`ROW_GROUP_ROWS`).
    """

    def __init__(
        self,
        root: Path,
        *,
        first_part: int = 0,
        shard_rows: int | None = None,
        row_group_rows: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.part = first_part
        self.shard_rows = shard_rows or SHARD_ROWS
        self.row_group_rows = min(row_group_rows or ROW_GROUP_ROWS, self.shard_rows)
        self.shards: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows = 0
        (self.root / "shards").mkdir(parents=True, exist_ok=True)

    def _open(self, schema: pa.Schema) -> None:
        relpath = f"shards/part-{self.part:05d}.parquet"
        self.part += 1
        self._writer = pq.ParquetWriter(self.root / relpath, schema, compression="zstd")
        self.shards.append({"path": relpath, "rows": 0})
        self._rows = 0

    def _close_current(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self.shards[-1]["rows"] = self._rows

    def write(self, table: pa.Table) -> None:
        """Append rows, starting a new part when the current one is full or its schema differs."""
        start = 0
        while start < table.num_rows:
            if self._writer is not None and not self._writer.schema.equals(table.schema):
                self._close_current()
            if self._writer is None:
                self._open(table.schema)
            take = min(table.num_rows - start, self.shard_rows - self._rows)
            assert self._writer is not None
            self._writer.write_table(table.slice(start, take), row_group_size=self.row_group_rows)
            self._rows += take
            start += take
            if self._rows >= self.shard_rows:
                self._close_current()

    def close(self) -> list[dict[str, Any]]:
        """Finish the last part; returns ``[{"path", "rows"}]`` for every part written."""
        self._close_current()
        return [dict(s) for s in self.shards if s["rows"] > 0]


class RowReader:
    """Random access to shard rows by global row number (the FAISS id).

    Every shard is opened memory-mapped when the reader is made (so it keeps reading that index
    even if the directory is republished); a lookup decodes only the row groups holding the
    requested rows (without the vector columns), with a small cache of recently decoded groups.

    Args:
        root: the index directory.
        shards: the manifest's ``shards`` list (``[{"path", "rows"}]``), in row order.
        cache_groups: how many decoded row groups to keep.
    """

    def __init__(self, root: Path, shards: Sequence[dict[str, Any]], cache_groups: int = 64):
        self.root = Path(root)
        self.shards = list(shards)
        # Every shard is opened now, not on first use: a reader keeps reading the files of the
        # index it was opened on even after that directory is replaced (republished by rename
        # and deleted; open files outlive their directory entry).
        self._files: list[pq.ParquetFile] = []
        self._group_starts: list[np.ndarray] = []
        try:
            for shard in self.shards:
                handle = pq.ParquetFile(self.root / shard["path"], memory_map=True)
                meta = handle.metadata
                sizes = [meta.row_group(i).num_rows for i in range(handle.num_row_groups)]
                self._files.append(handle)
                self._group_starts.append(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        except (OSError, pa.ArrowException) as exc:
            self.close()
            raise FlowsearchError(
                f"cannot open index shard under {self.root} ({exc}); rebuild the index"
            ) from None
        counts = [int(s["rows"]) for s in self.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._cache: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()
        self._cache_groups = cache_groups

    def close(self) -> None:
        """Release the shard files (also done when the reader is garbage-collected)."""
        for handle in self._files:
            with contextlib.suppress(Exception):
                handle.close()
        self._files = []

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _file(self, shard: int) -> tuple[pq.ParquetFile, np.ndarray]:
        return self._files[shard], self._group_starts[shard]

    def _group(self, shard: int, group: int) -> pa.Table:
        key = (shard, group)
        table = self._cache.get(key)
        if table is not None:
            self._cache.move_to_end(key)
            return table
        handle, _ = self._file(shard)
        names = [n for n in handle.schema_arrow.names if n not in ("vector", "raw")]
        table = handle.read_row_group(group, columns=names)
        self._cache[key] = table
        if len(self._cache) > self._cache_groups:
            self._cache.popitem(last=False)
        return table

    def rows(self, rows: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """Rows at global positions ``rows`` as ``{"id", "text", "metadata"}``, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row out of range 0..{len(self) - 1}")
        out: list[dict[str, Any] | None] = [None] * len(rows)
        shard_of = np.searchsorted(self.starts, rows, side="right") - 1
        for shard in np.unique(shard_of):
            _, gstarts = self._file(int(shard))
            pos = np.flatnonzero(shard_of == shard)
            local = rows[pos] - self.starts[shard]
            group_of = np.searchsorted(gstarts, local, side="right") - 1
            for group in np.unique(group_of):
                sel = pos[group_of == group]
                table = self._group(int(shard), int(group))
                idx = pa.array(rows[sel] - self.starts[shard] - gstarts[group])
                for i, record in zip(sel, table.take(idx).to_pylist(), strict=True):
                    out[i] = {
                        "id": record.pop("id"),
                        "text": record.pop("text"),
                        "metadata": record,
                    }
        return out  # type: ignore[return-value]

    def column(self, name: str) -> np.ndarray | list[Any]:
        """A whole column over all shards: ``vector``/``raw`` as float32 (n, d), else a list."""
        parts = [handle.read(columns=[name]).column(name) for handle in self._files]
        if name in ("vector", "raw"):
            if not parts:
                return np.zeros((0, 0), dtype=np.float32)
            arrays = [chunk for col in parts for chunk in col.chunks]
            dim = arrays[0].type.list_size
            flat = [a.flatten().to_numpy(zero_copy_only=False) for a in arrays]
            return np.concatenate(flat).astype(np.float32).reshape(-1, dim)
        return [value for col in parts for value in col.to_pylist()]


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """Write ``root/manifest.json`` atomically (temp file, fsync, rename)."""
    root = Path(root)
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", suffix=".json", dir=root)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it private; a manifest is not secret
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=2, sort_keys=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, root / MANIFEST_NAME)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def is_index_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` holds a manifest that says it is a flowsearch index."""
    try:
        with open(Path(path) / MANIFEST_NAME, encoding="utf-8") as handle:
            return json.load(handle).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_manifest(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and sanity-check ``root/manifest.json``.

    Raises:
        FlowsearchError: no index there, a corrupt manifest, or a format this version can't read.
    """
    root = Path(root)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        raise FlowsearchError(
            f"no index at {root}: build one with `flowsearch index CORPUS.parquet --index {root}`"
        )
    if not path.is_file():
        raise FlowsearchError(f"{root} is not a flowsearch index (no {MANIFEST_NAME}); rebuild it")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FlowsearchError(f"{path} is unreadable ({exc}); rebuild the index") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FlowsearchError(f"{path} is not a flowsearch manifest; rebuild the index")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise FlowsearchError(
            f"{root} has index format {version!r}, this flowsearch reads up to {FORMAT_VERSION}; "
            "upgrade flowsearch or rebuild the index"
        )
    return manifest


def verify_files(root: Path, manifest: dict[str, Any], checksums: bool = False) -> None:
    """Check every file the manifest lists: present, right size, right sha256.

    Args:
        root: the index directory.
        manifest: its manifest.
        checksums: hash every file; when False only files up to 16 MiB are hashed.

    Raises:
        FlowsearchError: naming the first file that is missing or differs.
    """
    root = Path(root)
    for relpath, record in manifest.get("files", {}).items():
        path = root / relpath
        if not path.is_file():
            raise FlowsearchError(f"index file missing: {path}; rebuild the index with --overwrite")
        size = path.stat().st_size
        if size != record["bytes"]:
            raise FlowsearchError(
                f"index file changed: {path} has {size} bytes, manifest says {record['bytes']}; "
                "rebuild the index with --overwrite"
            )
        if (checksums or size <= CHEAP_CHECKSUM_BYTES) and sha256_file(path) != record["sha256"]:
            raise FlowsearchError(
                f"checksum mismatch for {path}; the index is corrupt, rebuild it with --overwrite"
            )
