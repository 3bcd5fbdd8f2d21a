r"""The corpora, base indexes and write batches of ``bench_storage.py``, and what a write
costs in bytes.

Corpus: the real-text corpus of ``speed_corpus.py`` at 1,000,000 rows (every distinct sentence
of the evaluation data, about 65k, topped up with seeded splices of two real sentences); the
20k and 200k indexes hold its first rows. Base indexes are built once under
``_work/storage/base/`` and never written to: every measured write runs on a fresh copy
(:func:`fresh_copy`: hard links for the immutable files, real copies of the files a write
changes in place), so every size starts from one segment and no earlier write.

A write batch (:func:`write_batches`) replaces 500 rows spread over the index and inserts 500
new ids, with texts that are in no index (seeded splices of another seed); the delete batch
names 1,000 other ids, spread over the index.

Example:
    >>> before = io_counters()  # doctest: +SKIP
    >>> files = snapshot(index)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import corpora, harness

__all__ = [
    "BaseSpec",
    "WriteBatch",
    "base_index",
    "corpus_prefix",
    "fresh_copy",
    "io_counters",
    "keyed",
    "new_bytes",
    "new_texts",
    "records_table",
    "reindexed",
    "serving_base",
    "serving_batches",
    "snapshot",
    "write_batches",
]

LOG = logging.getLogger(__name__)

#: Rows of the corpus every size is a prefix of, and its held-out queries.
CORPUS_ROWS = 1_000_000
QUERIES = 2_000
#: Files a write changes in place (everything else in an index is written once, then renamed).
IN_PLACE = ("history.jsonl", "manifest.json", ".lock")


@dataclass(frozen=True)
class BaseSpec:
    """A base index: its rows, pooling and vector index factory (``auto`` or a FAISS string)."""

    rows: int
    pooling: str = "static"
    factory: str = "auto"

    @property
    def name(self) -> str:
        if self.rows < 1000:
            size = str(self.rows)
        elif self.rows < 1_000_000:
            size = f"{self.rows // 1000}k"
        else:
            size = f"{self.rows // 10**6}m"
        fac = "" if self.factory == "auto" else "_" + self.factory.lower().replace(",", "_")
        return f"{self.pooling}_{size}{fac}"


@dataclass(frozen=True)
class WriteBatch:
    """One size's writes: the upsert records (500 replacing, 500 new), the ``add`` records
    (1,000 new ids) and the ids to delete (1,000, none of the upserted)."""

    upsert: list[dict[str, Any]]
    add: list[dict[str, Any]]
    delete: list[Any]


def corpus(data: Path) -> tuple[Path, list[str]]:
    """The 1M-row corpus and its held-out queries (built once, under ``_work``)."""
    path, queries, _ = corpora.real_corpus(data, CORPUS_ROWS, QUERIES)
    return path, queries


def corpus_prefix(data: Path, rows: int, work: Path) -> Path:
    """A Parquet file of the corpus's first ``rows`` rows (``id`` int64, ``text``)."""
    path, _ = corpus(data)
    if rows >= CORPUS_ROWS:
        return path
    out = work / f"corpus_{rows}.parquet"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        table = pq.read_table(path).slice(0, rows)
        pq.write_table(table, out, row_group_size=16_384)
    return out


def base_index(data: Path, spec: BaseSpec, work: Path) -> tuple[Path, dict[str, Any]]:
    """The base index of ``spec`` (built once under ``work/base``) and its build record:
    seconds per stage, factory, space, load average at the start and end."""
    from flowsearch import build_index

    target = work / "base" / spec.name
    record_path = target.with_name(spec.name + ".build.json")
    if (target / "manifest.json").exists() and record_path.exists():
        return target, json.loads(record_path.read_text())
    source = corpus_prefix(data, spec.rows, work)
    load_before = harness.load_average()
    LOG.info("building %s (%d rows, %s, %s)", spec.name, spec.rows, spec.pooling, spec.factory)
    start = time.perf_counter()
    result = build_index(
        source, target, pooling=spec.pooling, index_factory=spec.factory, overwrite=True
    )
    record = {
        "rows": spec.rows,
        "pooling": spec.pooling,
        "factory_requested": spec.factory,
        "factory": result.factory,
        "space": result.space,
        "calibration": result.calibration,
        "wall_s": round(time.perf_counter() - start, 1),
        "seconds": result.seconds,
        "bytes": result.bytes,
        "load": [load_before, harness.load_average()],
    }
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return target, record


def serving_base(
    serving: Path, spec: BaseSpec, largest: int, work: Path
) -> tuple[Path, dict[str, Any]]:
    """A base index from ``bench_serving.py``'s work folder (``serving``: its ``index``, the
    1M rows of its ``corpus.parquet`` in ``Flat`` segments, ``static``, string ids): the
    ``largest`` size is that index itself, hard-linked (:func:`fresh_copy`: never written in
    place; another run may read it), the smaller ones built here from the first rows of its
    corpus (``static``, one segment, its calibration), all with ``spec.factory``: a largest
    size of another factory than ``Flat`` is that index hard-linked, then its segments merged
    into one with that factory's vector index (:func:`reindexed`; built once, as every base).
    Returns the path and the build record."""
    from flowsearch import build_index
    from flowsearch.storage import manifest as mf
    from flowsearch.storage.cleanup import clean
    from flowsearch.storage.layout import KEY_IDS_FILE
    from flowsearch.storage.verify import size_on_disk
    from flowsearch.storage.writer import referenced

    target = work / "base" / f"serving_{spec.name}"
    record_path = target.with_name(target.name + ".build.json")
    if (target / "manifest.json").exists() and record_path.exists():
        return target, json.loads(record_path.read_text())
    load_before = harness.load_average()
    calibration = mf.read(serving / "index").calibration.name  # the same for every size
    if spec.rows == largest:
        fresh_copy(serving / "index", target)
        m = mf.read(target)
        times = [json.loads(line)["time"] for line in (target / "history.jsonl").open()]
        note = (
            f"bench_serving.py's index ({len(m.segments)} segments, written {times[0]} to "
            f"{times[-1]}), hard-linked"
        )
        record = {
            "rows": m.n_live, "pooling": m.encoder.pooling, "factory_requested": "Flat",
            "factory": "Flat", "space": m.calibration.space,
            "calibration": m.calibration.name, "wall_s": None, "seconds": {},
            "bytes": size_on_disk(target), "load": None, "note": note,
        }  # fmt: skip
        if spec.factory == "Flat":  # written before key_ids.arrow: upgraded as compact does
            record.update(keyed(target))
            record["note"] = (
                f"{note}, then its segments given key_ids.arrow as `compact` does (files "
                f"hard-linked, keys rewritten: {record['seconds']['key ids']} s)"
            )
        if spec.factory != "Flat":  # its rows in one segment with the vector index asked for
            LOG.info("re-indexing serving_%s (%d rows, %s)", spec.name, m.n_live, spec.factory)
            record.update(reindexed(target, spec.factory))
            record["load"] = [load_before, harness.load_average()]
            record["note"] = (
                f"{note}, then its {len(m.segments)} segments merged into one by the engine's "
                f"merge (as `compact --full` does; rows copied, never re-encoded) with the index "
                f"`{spec.factory}` builds: {record['factory']}"
            )
        # only the current version's files (hard links): the first write's start would remove
        # the rest (a compaction's 9 old segments) inside every measured write
        clean(target, referenced(mf.read(target)))
        record["bytes"] = size_on_disk(target)
    else:
        source = work / f"serving_corpus_{spec.rows}.parquet"
        source.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pq.read_table(serving / "corpus.parquet").slice(0, spec.rows), source,
                       row_group_size=16_384)  # fmt: skip
        LOG.info("building serving_%s (%d rows, static, %s)", spec.name, spec.rows, spec.factory)
        start = time.perf_counter()
        result = build_index(source, target, pooling="static", index_factory=spec.factory,
                             calibration=calibration, overwrite=True)  # fmt: skip
        record = {
            "rows": spec.rows, "pooling": "static", "factory_requested": spec.factory,
            "factory": result.factory, "space": result.space,
            "calibration": result.calibration, "wall_s": round(time.perf_counter() - start, 1),
            "seconds": result.seconds, "bytes": result.bytes,
            "load": [load_before, harness.load_average()],
        }  # fmt: skip
    # whether its id lookups confirm through key_ids.arrow (else the older row-group path)
    record["key_ids"] = all(KEY_IDS_FILE in seg.files for seg in mf.read(target).segments)
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    return target, record


def reindexed(index: Path, factory: str) -> dict[str, Any]:
    """Every segment of ``index`` merged into one whose vector index ``factory`` gives (the
    engine's :func:`~flowsearch.writes.merge.merge`, as ``compact --full`` runs it: live rows
    copied, never re-encoded; ``auto`` builds and tunes its graph), published with ``factory``
    as the index's request, so later writes ask for it too. Returns the build record's fields:
    the resolved factory, its search parameters and tuning, seconds, bytes."""
    from flowsearch.storage import manifest as mf
    from flowsearch.storage.verify import size_on_disk
    from flowsearch.storage.writer import open_writer
    from flowsearch.writes.merge import merge

    start = time.perf_counter()
    with open_writer(index) as writer:
        base = writer.base
        assert base is not None
        names = [s.name for s in base.segments]
        merge(writer, names, dim=base.dim, requested=factory, lexical=base.lexical is not None,
              schema=base.schema_)  # fmt: skip
        merged = time.perf_counter() - start
        writer.publish(kind="compact", n_rows=base.n_live, ann_requested=factory,
                       detail={"merged": len(names), "dropped": base.n_deleted})  # fmt: skip
    m = mf.read(index)
    (segment,) = m.segments
    return {
        "rows": m.n_live,
        "factory_requested": factory,
        "factory": segment.ann.factory,
        "params": segment.ann.params,
        "tuning": segment.ann.tuning.model_dump(mode="json") if segment.ann.tuning else None,
        "wall_s": round(time.perf_counter() - start, 1),
        "seconds": {"merge (rows, index, tuning)": round(merged, 1)},
        "bytes": size_on_disk(index),
    }


def keyed(index: Path) -> dict[str, Any]:
    """Give every segment of ``index`` written without ``key_ids.arrow`` the file (the upgrade
    ``compact`` runs: :func:`~flowsearch.storage.upgrade.add_key_ids`, files hard-linked, no
    merge), published as a compaction. Returns the build record's fields it changes."""
    from flowsearch.storage.upgrade import add_key_ids
    from flowsearch.storage.writer import open_writer

    start = time.perf_counter()
    with open_writer(index) as writer:
        assert writer.base is not None
        upgraded = add_key_ids(writer)
        if upgraded:
            writer.publish(kind="compact", n_rows=0, detail={"merged": 0, "dropped": 0,
                                                            "key_ids": len(upgraded)})  # fmt: skip
    return {"seconds": {"key ids": round(time.perf_counter() - start, 1)}}


def serving_batches(data: Path, rows: int, size: int = 1000, seed: int = 7) -> WriteBatch:
    """:func:`write_batches` for an index of ``bench_serving.py``'s corpus (string ids
    ``s000000`` ...): the same shapes (half the upsert replacing ids spread over the index, half
    new ids; an add of new ids; a delete of other ids spread over it), the same new texts."""
    half = size // 2
    texts = new_texts(data, 2 * size, seed)
    replaced = [f"s{i:06d}" for i in np.arange(half) * (rows // half)]
    upsert = [{"id": i, "text": t} for i, t in zip(replaced, texts[:half], strict=True)]
    upsert += [{"id": f"n{i:06d}", "text": t} for i, t in enumerate(texts[half:size])]
    add = [{"id": f"a{i:06d}", "text": t} for i, t in enumerate(texts[size:])]
    deleted = [f"s{i:06d}" for i in np.arange(size) * (rows // size) + 1]
    return WriteBatch(upsert=upsert, add=add, delete=deleted)


def fresh_copy(base: Path, target: Path) -> Path:
    """A copy of the index ``base`` at ``target`` that writes cannot reach back into: the
    immutable files hard-linked, the files a write changes in place (:data:`IN_PLACE`) copied."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(base, target, copy_function=os.link)
    for name in IN_PLACE:
        path = target / name
        if path.exists():
            path.unlink()
            shutil.copy2(base / name, path)
    return target


def write_batches(data: Path, rows: int, size: int = 1000, seed: int = 7) -> WriteBatch:
    """The writes measured on an index of the corpus's first ``rows`` rows (ids 0..rows-1):
    an upsert of ``size`` records (half replacing ids spread over the index, half new), an add
    of ``size`` new ids, a delete of ``size`` other ids spread over the index."""
    half = size // 2
    texts = new_texts(data, 2 * size, seed)
    replaced = (np.arange(half) * (rows // half)).tolist()
    upsert = [{"id": i, "text": t} for i, t in zip(replaced, texts[:half], strict=True)]
    upsert += [{"id": CORPUS_ROWS + i, "text": t} for i, t in enumerate(texts[half:size])]
    add = [{"id": 2 * CORPUS_ROWS + i, "text": t} for i, t in enumerate(texts[size:])]
    deleted = (np.arange(size) * (rows // size) + 1).tolist()
    return WriteBatch(upsert=upsert, add=add, delete=deleted)


def new_texts(data: Path, n: int, seed: int = 7) -> list[str]:
    """``n`` distinct texts in no index of this corpus: seeded splices of two real sentences
    (a seed of their own) that the 1M-row corpus does not hold."""
    sentences, known = _pool(data)
    return _new_texts(sentences, known, n, seed)


@functools.lru_cache(maxsize=2)
def _pool(data: Path) -> tuple[list[str], frozenset[str]]:
    """The real sentences splices are made of, and every text of the 1M-row corpus."""
    from benchmarks.common.corpora import real_sentences

    path, _ = corpus(data)
    sentences, _ = real_sentences(data)
    return sentences, frozenset(pq.read_table(path, columns=["text"]).column("text").to_pylist())


def _new_texts(sentences: list[str], known: frozenset[str], n: int, seed: int) -> list[str]:
    """``n`` distinct splices of two real sentences that are not in ``known``."""
    rng = np.random.default_rng(seed)
    words = [s.split() for s in sentences]
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        a, b = rng.integers(len(words), size=2)
        first, second = words[a], words[b]
        text = " ".join(first[: len(first) // 2] + second[len(second) // 2 :])
        if text and text not in seen and text not in known:
            seen.add(text)
            out.append(text)
    return out


def records_table(records: list[dict[str, Any]]) -> pa.Table:
    """Records as an Arrow table (``id`` int64, ``text``)."""
    return pa.table(
        {
            "id": pa.array([r["id"] for r in records], pa.int64()),
            "text": [r["text"] for r in records],
        }
    )


# -- what a write costs in bytes ---------------------------------------------------------------


def io_counters() -> dict[str, int]:
    """This process's I/O counters (``/proc/self/io``): ``wchar`` (bytes handed to write
    calls), ``write_bytes`` (bytes it sent to the storage layer), ``rchar``, ``read_bytes``."""
    out = {}
    with open("/proc/self/io") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            out[name.strip()] = int(value)
    return {k: out[k] for k in ("wchar", "write_bytes", "rchar", "read_bytes")}


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: ``{relative path: (inode, bytes)}``."""
    out = {}
    for path in root.rglob("*"):
        if path.is_file():
            st = path.stat()
            out[path.relative_to(root).as_posix()] = (st.st_ino, st.st_size)
    return out


def new_bytes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> int:
    """Bytes of files that are new in ``after`` (a new path or a new inode), plus what files
    kept in place grew by (an appended log)."""
    total = 0
    for rel, (inode, size) in after.items():
        old = before.get(rel)
        if old is None or old[0] != inode:
            total += size
        elif size > old[1]:
            total += size - old[1]
    return total
