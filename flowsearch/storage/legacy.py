r"""Indexes of formats 1 and 2 (the first two releases): read as one segment, converted on write.

Format 2 kept each version in one directory (``versions/v000003/``: ``calibrator/``,
``shards/part-*.parquet``, ``index.faiss`` whose FAISS ids are global rows, ``lexical/`` and
``tombstones.npy``); format 1 kept the same files in the index directory itself, without
lexical postings or tombstones. A version of either is one segment of format 3 whose local rows
are its global rows, so :func:`from_legacy` describes it as a :class:`Manifest` with one
*legacy* segment pointing at the old files, and it opens and answers as it did.

The first write converts it (:func:`convert`, called by the version writer under the lock):
the files are hard-linked (copied where links fail) into a new segment ``s000001`` and
calibrator directory under format-3 names, the ids are keyed for lookups, the tombstones become
the segment's deletion file, and the old history moves to ``history.jsonl``. The old files are
removed once no version references them (two writes later).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flowsearch.atomic import link_or_copy
from flowsearch.errors import IndexDamaged
from flowsearch.storage import history, schema
from flowsearch.storage import records as mf
from flowsearch.storage.keys import KeyIndex
from flowsearch.storage.layout import (
    ANN_FILE,
    CALIBRATORS_DIR,
    HISTORY_NAME,
    MANIFEST_NAME,
    POSTINGS_DIR,
    deletions_file,
    part_file,
)

__all__ = ["LEGACY_SEGMENT", "convert", "from_legacy"]

LEGACY_SEGMENT = "legacy"
_IVF_DATA = "index.ivfdata"  # FAISS finds an on-disk IVF's lists by this base name


def _v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """Format 1 -> 2: files in the index directory itself, ``index`` -> ``faiss``, additions ->
    history, the first release's ``static`` pooling -> ``embedding_layer``."""
    out = dict(raw, root=".", version=1, faiss=raw["index"])
    enc = dict(raw["encoder"])
    if enc.get("pooling") == "static":
        enc["pooling"] = "embedding_layer"
    out["encoder"] = enc
    cal = dict(raw["calibration"])
    if "auto_decision" in cal:
        cal["auto"] = {
            "statistic": cal.pop("auto_statistic", None),
            "threshold": cal.pop("auto_threshold", None),
            "calibrated": cal.pop("auto_decision"),
        }
    out["calibration"] = cal
    out["history"] = [{"kind": "add", **a} for a in raw.get("additions", [])]
    return out


def _legacy_schema(
    index_dir: Path, root: str, shards: list[dict[str, Any]], names: list[str]
) -> tuple[mf.SchemaColumn, ...]:
    """The metadata columns' types, from the shards' own Parquet schemas."""
    fields: dict[str, pa.DataType] = {}
    for shard in shards:
        found = pq.read_schema(index_dir / root / shard["path"])
        for name in names:
            if name not in found.names:
                continue
            seen, new = fields.get(name), found.field(name).type
            if seen is None or pa.types.is_null(seen):
                fields[name] = new
            elif not seen.equals(new) and not pa.types.is_null(new):
                try:
                    fields[name] = (
                        pa.unify_schemas(
                            [pa.schema([(name, seen)]), pa.schema([(name, new)])],
                            promote_options="permissive",
                        )
                        .field(name)
                        .type
                    )
                except (pa.ArrowException, TypeError, ValueError):
                    fields[name] = pa.string()  # an earlier release let types conflict
    return tuple(schema.column_of(n, fields[n]) for n in names if n in fields)


def from_legacy(raw: dict[str, Any], index_dir: Path) -> mf.Manifest:
    """The :class:`Manifest` of a format-1 or -2 index: its version as one legacy segment.

    Raises:
        IndexDamaged: a missing or malformed field.
    """
    try:
        if raw["format_version"] == 1:
            raw = _v1_to_v2(raw)
        return _describe(raw, index_dir)
    except IndexDamaged:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OSError, pa.ArrowException) as exc:
        raise IndexDamaged(
            f"{index_dir / MANIFEST_NAME} is malformed ({type(exc).__name__}: {exc})",
            "rebuild the index",
        ) from None


def _segment(raw: dict[str, Any], root: str, files: dict[str, mf.FileRecord]
             ) -> mf.SegmentRecord:  # fmt: skip
    """The old version's files as one segment (its FAISS ids, global rows, are its rows)."""
    faiss, lexical = raw["faiss"], raw.get("lexical")
    seg = mf.SegmentRecord(
        name=LEGACY_SEGMENT,
        dir=root,
        n_rows=int(raw["rows"]),
        n_deleted=int(raw.get("deleted", 0)),
        parts=tuple(
            mf.PartRecord(path=s["path"], n_rows=int(s["rows"])) for s in raw.get("shards", [])
        ),  # fmt: skip
        ann=mf.AnnRecord(
            path="index.faiss",
            factory=faiss["factory"],
            params=faiss.get("params", ""),
            data=_IVF_DATA if _IVF_DATA in files else None,
        ),  # fmt: skip
        postings=lexical.get("path", "lexical") if lexical else None,
        deletions=raw.get("tombstones"),
        files=files,
    )
    if sum(p.n_rows for p in seg.parts) != seg.n_rows or seg.n_deleted > seg.n_rows:
        raise IndexDamaged("the manifest's row counts are inconsistent", "rebuild the index")
    return seg


def _describe(raw: dict[str, Any], index_dir: Path) -> mf.Manifest:
    root = raw.get("root", ".")
    if root != ".":
        mf.safe_relpath(root, "root")
    files = {
        mf.safe_relpath(k, "file path"): mf.FileRecord(**v) for k, v in raw.get("files", {}).items()
    }
    inside = "calibrator/"
    cal = dict(raw["calibration"])
    cal["path"] = "calibrator" if root == "." else f"{root}/calibrator"
    cal["files"] = {k[len(inside) :]: v for k, v in files.items() if k.startswith(inside)}
    seg = _segment(raw, root, {k: v for k, v in files.items() if not k.startswith(inside)})
    faiss, lexical, shards = raw["faiss"], raw.get("lexical"), list(raw.get("shards", []))
    cols = raw["columns"]
    enc = dict(raw["encoder"])
    options = dict(enc.pop("options", {}))
    core = {k: enc.pop(k) for k in ("model", "revision", "pooling", "max_length", "dim")}
    return mf.Manifest(
        format_version=int(raw["format_version"]),
        version=int(raw.get("version", 1)),
        encoder=mf.EncoderSpec(**core, source=enc.pop("source", None), options={**options, **enc}),
        dim=int(raw["dim"]),
        calibration=mf.CalibrationSpec.model_validate(cal),
        ann_requested=faiss.get("requested", "auto"),
        lexical=mf.LexicalSpec(params=dict(lexical.get("params", {}))) if lexical else None,
        columns=mf.Columns(
            text=cols["text"], id=cols.get("id"), id_type=cols.get("id_type", "int")
        ),
        schema=_legacy_schema(index_dir, root, shards, list(cols.get("metadata", ()))),
        segments=(seg,),
        density=raw.get("density") or None,
        held_out=raw.get("held_out") or None,
        skipped=int(raw.get("skipped", 0)),
        next_auto_id=int(raw.get("next_auto_id", raw["rows"])),
        next_segment=1,
        created=str(raw.get("created", "")),
        updated=raw.get("updated"),
        flowsearch_version=str(raw.get("flowsearch_version", "")),
        last_write=None,
    )


def _link_tree(src: Path, dst: Path) -> None:
    for item in sorted(p for p in src.rglob("*") if p.is_file()):
        link_or_copy(item, dst / item.relative_to(src))


def convert(writer: Any) -> None:
    """Turn the writer's legacy segment into segment ``s000001`` (see the module docstring)."""
    from flowsearch.storage import deletions
    from flowsearch.storage.rows import RowReader

    base: mf.Manifest = writer.base
    old = base.segments[0]
    src = writer.index_dir / old.dir
    stage = writer.stage()
    parts = []
    for number, part in enumerate(old.parts):
        link_or_copy(src / part.path, stage / part_file(number))
        parts.append(mf.PartRecord(path=part_file(number), n_rows=part.n_rows))
    link_or_copy(src / old.ann.path, stage / ANN_FILE)
    if old.ann.data is not None:
        link_or_copy(src / old.ann.data, stage / old.ann.data)
    if old.postings is not None:
        _link_tree(src / old.postings, stage / POSTINGS_DIR)
    reader = RowReader(src, old.parts)
    try:
        ids = pa.chunked_array([pa.array(c) for c in reader.column_chunks("id")])
        total = np.zeros(base.dim, dtype=np.float64)
        for chunk in reader.column_chunks("vector"):  # one part at a time
            total += chunk.astype(np.float64).sum(axis=0)
    finally:
        reader.close()
    keys = KeyIndex.build(ids)
    keys.save(stage)
    rel = None
    n_deleted = 0
    if old.deletions is not None:
        rows = deletions.read_rows(src / old.deletions, old.n_rows)
        rel = deletions_file(writer.number)
        n_deleted = deletions.write(stage / rel, rows)
    calibrator = writer.stage(CALIBRATORS_DIR)
    _link_tree(writer.index_dir / base.calibration.path, calibrator)
    writer.set_calibrator(calibrator, base.calibration)
    writer.drop_segments([old.name])
    writer.add_segment(
        stage,
        n_rows=old.n_rows,
        n_deleted=n_deleted,
        parts=tuple(parts),
        ann=old.ann.model_copy(update={"path": ANN_FILE}),
        postings=POSTINGS_DIR if old.postings is not None else None,
        keys="keys.npy",
        deletions=rel,
        vector_sum=mf.encode_vector_sum(total),
    )
    _carry_history(writer.index_dir, base)


def _carry_history(index_dir: Path, base: mf.Manifest) -> None:
    """Start ``history.jsonl`` with the build and the writes the old manifest recorded."""
    if (index_dir / HISTORY_NAME).exists():
        return
    import json

    raw = json.loads((index_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    if raw.get("format_version") == 1:
        raw = _v1_to_v2(raw)
    # the old formats appended every added or upserted row (replaced ones were tombstoned), so
    # the build wrote the rows that no later write did
    later = sum(int(old.get("rows", 0)) for old in raw.get("history", [])
                if old.get("kind") in ("add", "upsert"))  # fmt: skip
    built = max(0, int(raw.get("rows", 0)) - later)
    records = [mf.WriteRecord(version=1, kind="build", time=base.created or "", n_rows=built)]
    for number, old in enumerate(raw.get("history", []), start=2):
        detail = dict(old.get("detail", {}))
        if old.get("drift"):
            detail["drift"] = old["drift"]
        records.append(
            mf.WriteRecord(
                version=min(number, base.version),
                kind=old["kind"],
                time=old.get("time", ""),
                n_rows=int(old.get("rows", 0)),
                detail=detail,
            )
        )
    last = 0
    for record in records:
        if record.version > last:
            history.append(index_dir, record)
            last = record.version
