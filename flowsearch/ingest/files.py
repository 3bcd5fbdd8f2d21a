r"""Where a corpus's rows come from: its files (a file, a directory, a glob, a list) or records.

:func:`resolve_files` finds the files a path argument names (directories searched recursively;
hidden and ``_``-prefixed files ignored, as pyarrow's datasets do), and :func:`sources` turns a
corpus argument into :class:`~flowsearch.ingest.readers.Source` objects, in sorted path order,
so the same corpus always yields the same row order.

Example:
    >>> [s.format for s in sources([{"id": 1, "text": "a"}])]
    ['table']
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import pyarrow as pa

from flowsearch.errors import BadInput
from flowsearch.ingest.readers import Source, format_of, records_table

__all__ = ["Corpus", "resolve_files", "sources"]

_PathLike: TypeAlias = "str | os.PathLike[str]"
#: What a corpus argument may be: path(s), or records in memory.
Corpus: TypeAlias = "_PathLike | Sequence[_PathLike] | pa.Table | Sequence[Mapping[str, object]]"
_SUPPORTED = "Parquet, JSON Lines or CSV"


def _wanted(path: Path, root: Path) -> bool:
    parts = path.relative_to(root).parts if path.is_relative_to(root) else (path.name,)
    hidden = any(part.startswith((".", "_")) for part in parts)
    return not hidden and path.is_file() and format_of(path) is not None


def resolve_files(corpus: _PathLike | Sequence[_PathLike]) -> list[Path]:
    """The corpus files a path argument names (file, directory, glob, or a list of those).

    Directories and globs keep the files of a supported format, sorted; a file named directly
    must have one (or be Parquet by its content). A file named twice is read once.

    Raises:
        FlowsearchError: nothing there, or a file of no supported format.
    """
    items = [corpus] if isinstance(corpus, (str, os.PathLike)) else list(corpus)
    files: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if _wanted(p, path))
            if not found:
                raise BadInput(f"no {_SUPPORTED} files in directory {path}; point at a corpus")
            files.extend(found)
        elif path.is_file():
            if format_of(path) is None and not _looks_parquet(path):
                raise BadInput(
                    f"{path}: unknown corpus format {''.join(path.suffixes) or '(no suffix)'!r}; "
                    "use .parquet, .jsonl, .json, .csv or .tsv (text formats may end in .gz)"
                )
            files.append(path)
        elif glob.has_magic(str(item)):
            matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
            found = [p for p in matches if p.is_file() and format_of(p) is not None]
            if not found:
                raise BadInput(f"no {_SUPPORTED} files match {item!s}; check the pattern")
            files.extend(found)
        elif path.exists():  # a device, a FIFO, a socket: nothing to read a corpus from
            raise BadInput(
                f"{path} is not a regular file (a device, pipe or socket); give a "
                f"{_SUPPORTED} file, a directory or a glob"
            )
        else:
            raise BadInput(
                f"corpus not found: {path}; give a {_SUPPORTED} file, a directory or a glob"
            )
    return list(dict.fromkeys(files))


def _looks_parquet(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"PAR1"
    except OSError:
        return False


def sources(corpus: Corpus) -> list[Source]:
    """The corpus as sources: files of known formats, or one in-memory table."""
    if isinstance(corpus, pa.Table):
        return [Source("records", "table", table=corpus)]
    if isinstance(corpus, (str, os.PathLike)):
        items: list[Any] = [corpus]
    elif isinstance(corpus, Sequence):
        items = list(corpus)
    else:
        raise BadInput(
            f"a corpus is a path, a list of paths, a pyarrow Table or a list of dicts, "
            f"not {type(corpus).__name__}"
        )
    if not items:
        raise BadInput("the corpus is an empty list; give paths or records")
    if any(isinstance(item, Mapping) for item in items):
        return [Source("records", "table", table=records_table(items))]
    bad = [x for x in items if not isinstance(x, (str, os.PathLike))]
    if bad:
        what = "null" if bad[0] is None else type(bad[0]).__name__
        raise BadInput(f"a corpus list holds paths or dicts (records), not {what}")
    sources = []
    for path in resolve_files(items):
        fmt = format_of(path) or "parquet"
        if path.stat().st_size == 0:
            raise BadInput(f"{path} is empty (0 bytes); remove it or write it again")
        sources.append(Source(str(path), fmt, path=path))
    return sources
