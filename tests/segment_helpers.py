"""Synthetic segments and indexes for the storage tests: rows with seeded random unit vectors,
written through the real :class:`~flowsearch.writes.segments.SegmentBuilder` and version writer,
without an encoder (so no model is loaded and nothing is encoded)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from flowsearch.storage import manifest as mf
from flowsearch.storage import schema
from flowsearch.storage.layout import CALIBRATORS_DIR
from flowsearch.storage.rows import rows_table
from flowsearch.storage.writer import Writer, open_writer

DIM = 8
WORDS = [
    "tide",
    "sea",
    "moon",
    "river",
    "harbour",
    "ship",
    "storm",
    "wind",
    "sail",
    "rope",
    "anchor",
    "island",
]


def unit(n: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    """float32 (n, dim): seeded random unit rows."""
    x = np.random.default_rng(seed).normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def texts_for(ids: Sequence[Any], version: int = 0) -> list[str]:
    """A distinct text per id (and per ``version`` of a row), over :data:`WORDS`."""
    out = []
    for i in ids:
        h = zlib.crc32(f"{i}/{version}".encode())  # stable across runs (hash() is salted)
        out.append(
            f"{WORDS[h % 12]} {WORDS[(h // 12) % 12]} {WORDS[(h // 144) % 12]} {i} v{version}"
        )
    return out


def add_segment(
    writer: Writer,
    ids: Sequence[Any],
    *,
    texts: Sequence[str] | None = None,
    meta: pa.Table | None = None,
    vectors: np.ndarray | None = None,
    seed: int = 0,
    factory: str = "Flat",
    lexical: bool = True,
    dim: int = DIM,
    ann: Any = None,
) -> mf.SegmentRecord:
    """Write one segment of ``ids`` into ``writer`` (vectors seeded by ``seed`` unless given;
    raw vectors = searched vectors; ``ann``: an ``AnnPolicy`` for ``auto``). Returns its
    record."""
    from flowsearch.writes.segments import SegmentBuilder

    Z = unit(len(ids), dim, seed) if vectors is None else np.asarray(vectors, np.float32)
    texts = list(texts) if texts is not None else texts_for(ids)
    builder = SegmentBuilder(
        writer, dim=dim, n_rows=len(ids), requested=factory, lexical=lexical, ann=ann
    )
    builder.add(rows_table(list(ids), texts, meta, Z, Z), Z)
    return builder.finish()


def template(
    *,
    dim: int = DIM,
    id_type: str = "string",
    metadata: pa.Schema | None = None,
    lexical: bool = True,
    encoder: mf.EncoderSpec | None = None,
) -> mf.Manifest:
    """A first version's manifest fields (the writer adds segments, version and times)."""
    return mf.Manifest(
        encoder=encoder
        or mf.EncoderSpec(model="synthetic", revision="0", pooling="mean", max_length=8, dim=dim),
        dim=dim,
        calibration=mf.CalibrationSpec(name="none", calibrator="none", space="encoder"),
        ann_requested="Flat",
        lexical=mf.LexicalSpec() if lexical else None,
        columns=mf.Columns(text="text", id="id", id_type=id_type),
        schema=schema.columns_of(metadata) if metadata is not None else (),
    )


def save_none_calibrator(writer: Writer, spec: mf.CalibrationSpec, dim: int) -> None:
    """Stage the identity calibrator ``none`` for the new version."""
    from flowsearch.calibration import make_calibrator

    stage = writer.stage(CALIBRATORS_DIR)
    make_calibrator("none").fit(unit(4, dim)).save(stage)
    writer.set_calibrator(stage, spec)


def build(
    root: Path,
    segments: Sequence[Sequence[Any]],
    *,
    seeds: Sequence[int] | None = None,
    metas: Sequence[pa.Table | None] | None = None,
    **fields: Any,
) -> mf.Manifest:
    """Publish a first version of ``root`` with one segment per list of ids (vectors seeded by
    ``seeds``, default the segment's position). ``fields``: :func:`template`'s arguments."""
    base = template(**fields)
    with open_writer(root, new=True) as writer:
        save_none_calibrator(writer, base.calibration, base.dim)
        n = 0
        for at, ids in enumerate(segments):
            meta = metas[at] if metas is not None else None
            seed = seeds[at] if seeds is not None else at
            add_segment(
                writer, ids, meta=meta, seed=seed, lexical=base.lexical is not None, dim=base.dim
            )
            n += len(ids)
        return writer.publish(kind="build", n_rows=n, template=base)


def build_vectors(
    root: Path, vectors: Sequence[np.ndarray], factory: str, dim: int, ann: Any = None
) -> mf.Manifest:
    """Publish a first version of ``root`` with one segment per array of ``vectors`` (ids
    ``r0``, ``r1``, ... across segments), each indexed as ``factory`` (what the manifest says
    was asked for; ``ann``: an ``AnnPolicy`` for ``auto``), no lexical index."""
    base = template(dim=dim, lexical=False).model_copy(update={"ann_requested": factory})
    with open_writer(root, new=True) as writer:
        save_none_calibrator(writer, base.calibration, dim)
        start = 0
        for rows in vectors:
            ids = [f"r{i}" for i in range(start, start + len(rows))]
            add_segment(writer, ids, vectors=rows, factory=factory, lexical=False, dim=dim, ann=ann)
            start += len(rows)
        return writer.publish(kind="build", n_rows=start, template=base)
