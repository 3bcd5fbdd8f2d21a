"""Synthetic Parquet corpora for the index tests (words the tiny test BERT knows), and what an
index directory should and should not hold after a write."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.ingest.corpus import CorpusOptions, CorpusPlan, read_corpus
from flowsearch.storage import manifest as mf
from flowsearch.writes.corpus import IndexColumns

_WORD_LINES = (
    "cat dog bird fish tree river sea moon sun star city town road car train ship plane",
    "bread cheese milk water tea coffee music song piano guitar game ball team goal",
    "red green blue big small fast slow old new good bad hot cold run runs ran eat eats",
    "man woman child people house room door window book page word letter number year",
)
WORDS = [word for line in _WORD_LINES for word in line.split()]


def scan_corpus(
    corpus: Any,
    text_column: str = "text",
    id_column: str | None = "id",
    *,
    strict: bool = False,
    auto_id_start: int = 0,
    schema: Sequence[mf.SchemaColumn] | None = None,
    id_type: Any = None,
) -> CorpusPlan:
    """A corpus read as a write reads it: for a new index, or (``schema``, ``id_type``) into
    an existing one."""
    rules = IndexColumns(None if schema is None else tuple(schema), id_type, auto_id_start)
    return read_corpus(corpus, CorpusOptions(text_column, id_column, strict), rules)


def sentences(n: int, seed: int = 0, length: tuple[int, int] = (4, 12)) -> list[str]:
    """``n`` distinct random sentences over :data:`WORDS`."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        text = "the " + " ".join(rng.choice(WORDS, size=int(rng.integers(*length))))
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def write_corpus(
    path: Path, n: int = 120, seed: int = 0, id_prefix: str = "d", **extra: list
) -> Path:
    """A corpus with ``id`` (``{prefix}{i}``), ``text``, ``topic`` and ``year`` columns."""
    texts = sentences(n, seed)
    table = pa.table(
        {
            "id": [f"{id_prefix}{i}" for i in range(n)],
            "text": texts,
            "topic": [WORDS[i % 7] for i in range(n)],
            "year": pa.array([1990 + i % 30 for i in range(n)], pa.int32()),
            **extra,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


#: What an index directory holds (format 3), besides nothing.
INDEX_ENTRIES = {"manifest.json", ".lock", "segments", "calibrators", "references", "history.jsonl"}


def siblings(index_dir: Path) -> list[str]:
    """Scratch a write left behind (must be none after any write, failed or not): staging
    directories under ``segments/``, ``calibrators/`` or ``references/`` (any hidden entry
    there), anything in the index directory that is not :data:`INDEX_ENTRIES`, and hidden
    ``.NAME*`` entries next to it."""
    index_dir = Path(index_dir)
    found: list[str] = []
    for kind in ("segments", "calibrators", "references"):
        folder = index_dir / kind
        if folder.is_dir():
            found += [f"{kind}/{p.name}" for p in folder.iterdir() if p.name.startswith(".")]
    if index_dir.is_dir():
        found += [p.name for p in index_dir.iterdir() if p.name not in INDEX_ENTRIES]
    if index_dir.parent.is_dir():
        found += [p.name for p in index_dir.parent.glob(f".{index_dir.name}*")]
    return sorted(found)


def segment_dirs(index_dir: Path) -> list[str]:
    """The segment directories present, oldest first (``["s000001", ...]``)."""
    segments = Path(index_dir) / "segments"
    return sorted(p.name for p in segments.iterdir() if p.name.startswith("s0"))
