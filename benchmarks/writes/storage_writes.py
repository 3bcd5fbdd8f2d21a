r"""What a write costs at 20k, 200k and 1M rows, beside LanceDB on the same rows and vectors.

Every write runs on a fresh copy of a one-segment base index (:func:`storage_indexes.fresh_copy`),
so every size starts alike: ``add_to_index`` of 1,000 new rows, ``upsert`` of 1,000 rows (500
replacing rows spread over the index, 500 new ids) and ``delete`` of 1,000 other ids, as a user
calls them (the call opens the index, loads its encoder, encodes the texts, writes and
publishes). LanceDB (``lancedb`` 0.x, its default table, no index) holds the same rows (id, text,
the searched vector, the raw vector as float16: copied from the base index's Parquet parts) and
gets the same records with the vectors flowsearch computes for them (it does not encode): its
``add``, ``merge_insert("id")`` (update matched, insert the rest) and ``delete(where)``, the
table opened inside the timed call as ours opens its index.

One round calls every (size, engine, write) once, in turn; one untimed round first (imports,
the encoder, the page cache). Upserts run twice: as shipped, and as ``flowsearch-whole``, every
write saving the whole reference sample (how it was saved before the sample's deltas), so the
two are compared in one run; :func:`sequences` then runs consecutive upserts per index, where
the deltas' folds into a new base fall. Per write: wall seconds, flowsearch's own stages
(``WriteResult.seconds``: encode, drift, deletions, merge, publish, ...), the bytes of new files
on disk (new paths or inodes, plus what an appended log grew by; the reference sample's share
apart) and this process's ``/proc/self/io`` counters over
the call (``wchar``: bytes handed to ``write``; ``write_bytes``: bytes sent to the storage
layer; and the read side, ``rchar`` / ``read_bytes``; memory-mapped reads count in neither).

Example:
    >>> out = measure_writes(data, specs, work, rounds=3, batch=1000)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import harness
from benchmarks.writes.storage_indexes import (
    BaseSpec,
    WriteBatch,
    base_index,
    fresh_copy,
    io_counters,
    new_bytes,
    records_table,
    snapshot,
    write_batches,
)

__all__ = ["KINDS", "measure_writes", "summarise"]

LOG = logging.getLogger(__name__)

#: The writes measured, in the order a round runs them.
KINDS = ("add", "upsert", "delete")
#: flowsearch as shipped, and with every write saving the whole reference sample
#: (``flowsearch.writes.measure.REFERENCE_DELTA_MAX = 0``: how writes saved it before the
#: sample's deltas), for upserts: constants of ``flowsearch.writes.measure`` to set.
VARIANTS: dict[str, dict[str, Any]] = {
    "flowsearch": {},
    "flowsearch-whole": {"REFERENCE_DELTA_MAX": 0},
}
#: ``WriteResult.seconds`` stages of an upsert, in the order it runs them ("load model" and
#: "encode" are the encoder's; the rest of the wall time is opening the writer, checking the
#: carried files and cleaning up after publishing).
STAGES = ("scan", "load model", "cut", "encode", "write", "index", "drift", "deletions",
          "merge", "publish")  # fmt: skip
#: The columns both engines store (flowsearch's rows; metadata: none in this corpus).
COLUMNS = ["id", "text", "vector", "raw"]


def timed_write(fn: Callable[[], Any], root: Path) -> tuple[Any, dict[str, Any]]:
    """``fn()`` and what it cost: wall seconds, new bytes under ``root``, the I/O counters'
    change, the 1-minute load average before it."""
    files = snapshot(root)
    load = harness.load_average()[0]
    io_before = io_counters()
    start = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - start
    io_after = io_counters()
    after = snapshot(root)
    cost = {"wall_s": wall, "new_bytes": new_bytes(files, after), "load": load}
    cost["sample_bytes"] = new_bytes(
        {k: v for k, v in files.items() if k.startswith("references/")},
        {k: v for k, v in after.items() if k.startswith("references/")},
    )  # the reference sample's share
    cost.update({k: io_after[k] - io_before[k] for k in io_before})
    return result, cost


# -- flowsearch --------------------------------------------------------------------------------


def ours(
    kind: str, index: Path, batch: WriteBatch, variant: str = "flowsearch"
) -> tuple[Any, dict[str, Any]]:
    """One write on ``index`` (a fresh copy), timed, with ``variant``'s settings."""
    from contextlib import ExitStack
    from unittest import mock

    from flowsearch import add_to_index, delete, upsert
    from flowsearch.writes import measure

    calls = {
        "add": lambda: add_to_index(index, batch.add),
        "upsert": lambda: upsert(index, batch.upsert),
        "delete": lambda: delete(index, batch.delete),
    }
    with ExitStack() as patched:
        for name, value in VARIANTS[variant].items():
            patched.enter_context(mock.patch.object(measure, name, value))
        result, cost = timed_write(calls[kind], index)
    stages = dict(result.seconds)
    cost["stages"] = stages
    cost["model_s"] = stages.get("load model", 0.0)
    cost["encode_s"] = stages.get("encode", 0.0) + cost["model_s"]  # both: the encoder's
    cost["drift_s"] = stages.get("drift", 0.0)
    cost["segments_after"] = result.n_segments
    cost["changed"] = {"add": result.n_written, "upsert": result.n_written,
                       "delete": result.n_deleted}[kind]  # fmt: skip
    if kind == "upsert":
        cost["replaced"] = result.n_replaced
    if kind != "delete":  # the drift report: the same whatever the sample's files
        report = result.drift.to_dict() if result.drift is not None else {}
        cost["drift"] = {k: report.get(k) for k in ("verdict", "median_percentile", "interval",
                                                    "n_sample")}  # fmt: skip
    return result, cost


# -- LanceDB -----------------------------------------------------------------------------------


def lance_base(base: Path, target: Path) -> Path:
    """A LanceDB database at ``target`` holding table ``rows``: the base index's rows (one
    segment), streamed from its Parquet parts; made once."""
    import lancedb

    from flowsearch.storage import manifest as mf

    done = target / ".complete"
    if done.exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    m = mf.read(base)
    (segment,) = m.segments
    parts = [pq.ParquetFile(base / segment.dir / part.path) for part in segment.parts]
    schema = parts[0].schema_arrow
    schema = pa.schema([schema.field(name) for name in COLUMNS])

    def batches() -> Any:
        for part in parts:
            yield from part.iter_batches(batch_size=65_536, columns=COLUMNS)

    db = lancedb.connect(str(target))
    db.create_table("rows", pa.RecordBatchReader.from_batches(schema, batches()))
    done.write_text("")
    return target


def lance_batches(base: Path, batch: WriteBatch) -> dict[str, Any]:
    """LanceDB's inputs: the add and upsert records with the vectors flowsearch computes for
    them (its encoder, its calibrator; the raw vectors as float16, as flowsearch stores them),
    and the delete's ``where``."""
    from flowsearch.space.search_space import SearchSpace
    from flowsearch.storage import manifest as mf
    from flowsearch.storage.rows import rows_table

    space = SearchSpace.open(base, mf.read(base))

    def table(records: list[dict[str, Any]]) -> pa.Table:
        plain = records_table(records)
        texts = plain.column("text").to_pylist()
        U = space.encoder.encode(texts, progress=False)
        Z, _ = space.project(U, want_density=False)
        return rows_table(plain.column("id"), plain.column("text"), None, Z, U)

    ids = ", ".join(str(int(i)) for i in batch.delete)
    return {"add": table(batch.add), "upsert": table(batch.upsert), "delete": f"id IN ({ids})"}


def lance(kind: str, database: Path, inputs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """One LanceDB write on ``database`` (a fresh copy), timed (opening the table included)."""
    import lancedb

    def call() -> Any:
        table = lancedb.connect(str(database)).open_table("rows")
        if kind == "add":
            return table.add(inputs["add"])
        if kind == "upsert":
            return (
                table.merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(inputs["upsert"])
            )
        return table.delete(inputs["delete"])

    return timed_write(call, database)


# -- the run -----------------------------------------------------------------------------------


def measure_writes(
    data: Path,
    specs: list[BaseSpec],
    work: Path,
    *,
    rounds: int,
    batch: int,
    lance_too: bool,
    kinds: tuple[str, ...] = KINDS,
    whole_too: bool = True,
    sequence: int = 0,
    base_of: Callable[[BaseSpec], tuple[Path, dict[str, Any]]] | None = None,
    batches_of: Callable[[int], WriteBatch] | None = None,
) -> dict[str, Any]:
    """Every write of ``kinds`` on every base index (and its LanceDB copy; upserts also as
    ``flowsearch-whole`` with ``whole_too``), ``rounds`` interleaved rounds after an untimed
    one, then ``sequence`` consecutive upserts per index and variant (:func:`sequences`):
    ``{"bases", "runs", "encode_only", "sequence"}``. ``base_of`` and ``batches_of`` (a size's
    rows to its writes) replace :func:`storage_indexes.base_index` and ``write_batches``."""
    bases, batches, lance_dbs, lance_inputs = {}, {}, {}, {}
    for spec in specs:
        path, record = base_of(spec) if base_of else base_index(data, spec, work)
        bases[spec.name] = {"path": path, "build": record, "rows": spec.rows}
        made = batches_of(spec.rows) if batches_of else write_batches(data, spec.rows, size=batch)
        batches[spec.name] = made
        if lance_too:
            lance_dbs[spec.name] = lance_base(path, work / "lance" / spec.name)
            lance_inputs[spec.name] = lance_batches(path, batches[spec.name])
    runs: list[dict[str, Any]] = []
    scratch = work / "run"
    for number in range(rounds + 1):
        for spec in specs:
            name = spec.name
            for kind in kinds:
                variants = list(VARIANTS) if whole_too and kind == "upsert" else ["flowsearch"]
                for variant in variants:
                    copy = fresh_copy(bases[name]["path"], scratch / "flowsearch")
                    _, cost = ours(kind, copy, batches[name], variant)
                    runs.append({"round": number, "index": name, "engine": variant,
                                 "kind": kind, **cost})  # fmt: skip
                    LOG.info("round %d %s %s %s: %.2f s, %d new bytes", number, name, variant,
                             kind, cost["wall_s"], cost["new_bytes"])  # fmt: skip
                if lance_too:
                    copy = fresh_copy(lance_dbs[name], scratch / "lance")
                    _, cost = lance(kind, copy, lance_inputs[name])
                    runs.append({"round": number, "index": name, "engine": "lancedb",
                                 "kind": kind, **cost})  # fmt: skip
                    LOG.info("round %d %s lancedb %s: %.3f s", number, name, kind, cost["wall_s"])
    chains = {}
    if sequence:
        variants = list(VARIANTS) if whole_too else ["flowsearch"]
        chains = sequences(specs, bases, batches, scratch, sequence, variants)
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "bases": {k: {"rows": v["rows"], "build": v["build"]} for k, v in bases.items()},
        "batch": batch,
        "rounds": rounds,
        "kinds": list(kinds),
        "runs": runs,
        "sequence": chains,
        "encode_only": encode_only(data, [bases[s.name]["path"] for s in specs], batches, specs),
    }


def sequences(
    specs: list[BaseSpec],
    bases: dict[str, Any],
    batches: dict[str, WriteBatch],
    scratch: Path,
    writes: int,
    variants: list[str],
) -> dict[str, dict[str, Any]]:
    """``writes`` consecutive upserts of the batch (the first replaces half its rows, the next
    ones all: every one a write of ``batch`` rows) on one fresh copy per index and variant, as
    a user calls them (the default merge policy): per write, the bytes of new files and those
    of the reference sample (``references/``), so folds into a new base are counted where they
    fall; and whether each write's drift report equals the other variant's."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        if spec.pooling != "static":
            continue
        for variant in variants:
            copy = fresh_copy(bases[spec.name]["path"], scratch / f"sequence-{variant}")
            costs = [ours("upsert", copy, batches[spec.name], variant)[1] for _ in range(writes)]
            out.setdefault(spec.name, {})[variant] = {
                "writes": writes,
                "new_bytes": [c["new_bytes"] for c in costs],
                "sample_bytes": [c["sample_bytes"] for c in costs],
                "wall_s": [c["wall_s"] for c in costs],
                "drift": [c["drift"] for c in costs],
            }
            LOG.info("sequence %s %s: %.0f sample bytes per write", spec.name, variant,
                     np.mean([c["sample_bytes"] for c in costs]))  # fmt: skip
    return out


def encode_only(
    data: Path, paths: list[Path], batches: dict[str, WriteBatch], specs: list[BaseSpec]
) -> dict[str, Any]:
    """Seconds to encode and project the upsert's texts alone, once per pooling (the encoder
    loaded before, warmed up): the part of a write no storage design can save."""
    from flowsearch.space.search_space import SearchSpace
    from flowsearch.storage import manifest as mf

    out: dict[str, Any] = {}
    for spec, path in zip(specs, paths, strict=True):
        if spec.pooling in out:
            continue
        space = SearchSpace.open(path, mf.read(path))
        texts = [r["text"] for r in batches[spec.name].upsert]
        space.encoder.encode(texts[:32], progress=False)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            space.project(space.encoder.encode(texts, progress=False))
            times.append(time.perf_counter() - start)
        out[spec.pooling] = {"texts": len(texts), "seconds": float(np.median(times))}
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per index, engine and write: medians over the timed rounds (round 0 is the warm-up)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    timed = [r for r in runs if r["round"] > 0]
    keys = sorted({(r["index"], r["engine"], r["kind"]) for r in timed})
    for index, engine, kind in keys:
        rows = [r for r in timed if (r["index"], r["engine"], r["kind"]) == (index, engine, kind)]
        cell: dict[str, Any] = {"n": len(rows)}
        for field in ("wall_s", "new_bytes", "wchar", "write_bytes", "rchar", "read_bytes",
                      "sample_bytes"):  # fmt: skip
            if all(field in r for r in rows):
                cell[field] = float(np.median([r[field] for r in rows]))
        if engine.startswith("flowsearch"):
            cell["stages"] = {
                stage: float(np.median([r["stages"].get(stage, 0.0) for r in rows]))
                for stage in STAGES
            }
            cell["stages"]["other"] = float(
                np.median([r["wall_s"] - sum(r["stages"].get(x, 0.0) for x in STAGES)
                           for r in rows])
            )  # fmt: skip
            for field in ("model_s", "encode_s", "drift_s"):
                cell[field] = float(np.median([r[field] for r in rows]))
            rest = [r["wall_s"] - r["encode_s"] for r in rows]
            cell["no_encode_s"] = float(np.median(rest))
            cell["no_encode_no_drift_s"] = float(
                np.median([r["wall_s"] - r["encode_s"] - r["drift_s"] for r in rows])
            )
        cell["load"] = [min(r["load"] for r in rows), max(r["load"] for r in rows)]
        out.setdefault(index, {}).setdefault(engine, {})[kind] = cell
    return out
