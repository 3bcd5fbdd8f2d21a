r"""Query latency over segments: one segment against 10 and 50, and what the default merge policy
leaves after many small upserts.

The segmented indexes hold exactly the rows of a one-segment base index, in the same order, with
its calibrator (``build_index(calibrator=...)`` on the first slice, then ``add_to_index`` of each
further slice with ``merge_segments=False``), so each row's searched vector is the one the base
index holds and a query meets the same rows. Two families: ``Flat`` (every segment exact: the top-k
must equal the one segment's, ids and cosines) and ``auto`` (as a user's writes would make them:
the 200k base is ``HNSW32``, 20k and 4k slices are ``Flat``). Each index also as a copy with the
same 5% of its rows deleted (searches then skip deleted rows).

Latency: one query at a time (``Searcher.search(q, k=10)``), dense and hybrid; every query runs
on every index of a family before the next query, the order rotated query by query, after a
warm-up pass; p50 and p90 per index, and the ratio to the one segment's (p50 over p50, and the
median of each query's own ratio).

Policy: ``--policy-writes`` upserts of ``--batch`` rows (half replacing live rows at random, half
new) into a copy of the ``auto`` base per merge policy of :data:`POLICIES` (the writes merge as
each says): the segments left, each write's time and the rows its merges rewrote, and the
latency then against the base.

Example:
    >>> family = segmented_family(data, spec, work, (10, 50))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks.common import harness
from benchmarks.writes.storage_indexes import (
    CORPUS_ROWS,
    BaseSpec,
    base_index,
    corpus,
    corpus_prefix,
    fresh_copy,
    new_texts,
    write_batches,
)
from benchmarks.writes.storage_writes import timed_write

__all__ = ["exactness", "latency", "policy", "segmented_family"]

LOG = logging.getLogger(__name__)

MODES = ("dense", "hybrid")
#: Share of rows deleted in the copies that measure what deletions cost a query.
DELETED = 0.05


def segmented(data: Path, base: Path, spec: BaseSpec, n_segments: int, work: Path) -> Path:
    """The base index's rows as ``n_segments`` equal segments (same calibrator, same order,
    same requested factory); made once."""
    from flowsearch import add_to_index, build_index
    from flowsearch.storage import manifest as mf

    target = work / "segmented" / f"{spec.name}_{n_segments}seg"
    done = target.with_name(target.name + ".complete")
    if done.exists():
        return target
    table = pq.read_table(corpus_prefix(data, spec.rows, work))
    bounds = np.linspace(0, table.num_rows, n_segments + 1).astype(int)
    slices = work / "segmented" / f"slices_{spec.rows}_{n_segments}"
    slices.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        paths.append(slices / f"{i:03d}.parquet")
        pq.write_table(table.slice(a, b - a), paths[-1])
    calibrator = base / mf.read(base).calibration.path
    LOG.info("building %s: %d segments", target.name, n_segments)
    build_index(paths[0], target, pooling=spec.pooling, calibrator=calibrator,
                index_factory=spec.factory, overwrite=True)  # fmt: skip
    for path in paths[1:]:
        add_to_index(target, path, merge_segments=False)
    assert len(mf.read(target).segments) == n_segments
    done.write_text("")
    return target


def segmented_family(
    data: Path, spec: BaseSpec, work: Path, counts: tuple[int, ...]
) -> dict[str, Path]:
    """``{"1": base, "10": ..., "50": ...}``: the base and its segmented copies."""
    base, _ = base_index(data, spec, work)
    out = {"1": base}
    for n in counts:
        out[str(n)] = segmented(data, base, spec, n, work)
    return out


def latency(
    searchers: dict[str, Any], queries: list[str], rounds: int, warmup: int = 20
) -> dict[str, Any]:
    """p50 / p90 ms per searcher and mode, interleaved query by query (order rotated), and
    ratios to the first searcher (the reference)."""
    names = list(searchers)
    for q in queries[:warmup]:
        for name in names:
            for mode in MODES:
                searchers[name].search(q, k=10, mode=mode)
    times: dict[tuple[str, str], list[float]] = {(n, m): [] for n in names for m in MODES}
    turn = 0
    for _ in range(rounds):
        for q in queries:
            for mode in MODES:
                order = names[turn % len(names) :] + names[: turn % len(names)]
                turn += 1
                for name in order:
                    s = searchers[name]
                    times[name, mode].append(
                        harness.timed(lambda s=s, q=q, mode=mode: s.search(q, k=10, mode=mode))[1]
                    )
    ref = names[0]
    out: dict[str, Any] = {}
    for mode in MODES:
        base = np.asarray(times[ref, mode]) * 1e3
        for name in names:
            ms = np.asarray(times[name, mode]) * 1e3
            out.setdefault(name, {})[mode] = {
                "p50_ms": float(np.percentile(ms, 50)),
                "p90_ms": float(np.percentile(ms, 90)),
                "p50_ratio": float(np.percentile(ms, 50) / np.percentile(base, 50)),
                "p90_ratio": float(np.percentile(ms, 90) / np.percentile(base, 90)),
                "paired_ratio_median": float(np.median(ms / base)),
            }
    out["queries"], out["rounds"] = len(queries), rounds
    return out


def exactness(reference: Any, other: Any, queries: list[str], k: int = 10) -> dict[str, Any]:
    """Whether ``other`` answers as ``reference``, per mode: the share of queries with the same
    top-k ids in the same order; the share with the same score at every rank (tied rows may
    come in another order, or another of them at the cut: FAISS orders ties within a segment
    its own way, the merge of segments by row); and the largest score difference at any rank
    (dense: the cosine, lexical: BM25, hybrid: the fused score)."""
    out: dict[str, Any] = {}
    for mode in ("dense", "lexical", "hybrid"):
        a = reference.search(queries, k=k, mode=mode)
        b = other.search(queries, k=k, mode=mode)
        same_ids = same_scores = 0
        diff = 0.0
        for ha, hb in zip(a, b, strict=True):
            same_ids += [h.id for h in ha] == [h.id for h in hb]
            sa = np.array([_raw(h, mode) for h in ha])
            sb = np.array([_raw(h, mode) for h in hb])
            if len(sa) != len(sb):
                diff = float("inf")
                continue
            gap = float(np.max(np.abs(sa - sb))) if len(sa) else 0.0
            same_scores += gap <= 1e-6
            diff = max(diff, gap)
        out[mode] = {
            "same_ids_share": same_ids / len(queries),
            "same_scores_share": same_scores / len(queries),
            "max_score_diff": diff,
        }
    out["queries"] = len(queries)
    return out


def _raw(hit: Any, mode: str) -> float:
    if mode == "dense":
        return float(hit.dense_score)
    if mode == "lexical":
        return float(hit.lexical_score)
    return float(hit.score)


def upsert_costs(
    paths: dict[str, Path], data: Path, rows: int, work: Path, batch: int, rounds: int
) -> dict[str, Any]:
    """An upsert of ``batch`` rows (``merge_segments=False``: the segments stay) on a fresh copy
    of each index of a family, ``rounds`` times after an untimed one: median wall seconds and
    bytes read (``rchar``: the writer checks every segment's files first)."""
    from flowsearch import upsert

    records = write_batches(data, rows, size=batch).upsert
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in paths}
    for number in range(rounds + 1):
        for n, path in paths.items():
            copy = fresh_copy(path, work / "run" / "segmented")
            result, cost = timed_write(
                lambda copy=copy: upsert(copy, records, merge_segments=False), copy
            )
            cost["drift_s"] = result.seconds.get("drift", 0.0)
            cost["encode_s"] = result.seconds.get("encode", 0.0) + result.seconds.get(
                "load model", 0.0
            )
            if number:
                runs[n].append(cost)
    return {
        n: {f: float(np.median([c[f] for c in cs]))
            for f in ("wall_s", "encode_s", "drift_s", "rchar", "wchar", "new_bytes")}
        for n, cs in runs.items()
    }  # fmt: skip


def measure_segments(
    data: Path, families: dict[str, BaseSpec], work: Path, counts: tuple[int, ...], *,
    queries: int, rounds: int, batch: int,
) -> dict[str, Any]:  # fmt: skip
    """Every family's latency table, its answers against one segment's, and an upsert's cost
    on each of its indexes."""
    from flowsearch import Searcher

    _, held = corpus(data)
    picked = held[:: max(1, len(held) // queries)][:queries]  # questions and sentences, mixed
    out: dict[str, Any] = {"queries": len(picked), "counts": list(counts)}
    for label, spec in families.items():
        paths = segmented_family(data, spec, work, counts)
        with_deleted = {f"{n} -{DELETED:.0%}": with_deletions(p, spec.rows, work)
                        for n, p in paths.items()}  # fmt: skip
        searchers = {name: Searcher.open(path) for name, path in {**paths, **with_deleted}.items()}
        entry: dict[str, Any] = {
            "rows": spec.rows,
            "factories": {
                n: sorted({seg.record.ann.factory for seg in s.version.segments})
                for n, s in searchers.items()
            },
            "segments": {n: len(s.version.segments) for n, s in searchers.items()},
            "load": [harness.load_average()],
        }
        entry["latency"] = latency(searchers, picked, rounds)
        entry["load"].append(harness.load_average())
        checked = held[: 10 * queries]  # all 2,000 at the default 200 latency queries
        refs = {n: n.replace(n.split()[0], "1", 1) for n in searchers}  # "10 -5%" -> "1 -5%"
        entry["exactness"] = {
            n: exactness(searchers[refs[n]], s, checked)
            for n, s in searchers.items()
            if refs[n] != n
        }
        for s in searchers.values():
            s.close()
        entry["upsert"] = upsert_costs(paths, data, spec.rows, work, batch, rounds)  # no deletions
        entry["load"].append(harness.load_average())
        out[label] = entry
    return out


def with_deletions(path: Path, rows: int, work: Path) -> Path:
    """A copy of ``path`` with :data:`DELETED` of its rows deleted (the same seeded ids for
    every index of the rows): how deletions change a query's cost."""
    from flowsearch import delete

    target = work / "segmented" / f"{path.name}_deleted"
    done = target.with_name(target.name + ".complete")
    if done.exists():
        return target
    fresh_copy(path, target)
    ids = np.random.default_rng(9).choice(rows, size=int(rows * DELETED), replace=False)
    delete(target, ids.tolist())
    done.write_text("")
    return target


# -- the merge policy after many small upserts ---------------------------------------------------


#: The merge policies the policy stage compares: a label and its settings (every one named, so
#: a run does not depend on the defaults of its day). ``before``: the tiers alone (the policy
#: up to issue 30); ``flat budget``: at most 4 segments of up to ``flat_max_rows`` rows;
#: ``flat budget + 4 per tier``: and 4 segments to a tier instead of 10.
POLICIES: dict[str, dict[str, int]] = {
    "before": {"flat_segments_max": 10**9, "segments_per_tier": 10},
    "flat budget": {"flat_segments_max": 4, "segments_per_tier": 10},
    "flat budget + 4 per tier": {"flat_segments_max": 4, "segments_per_tier": 4},
}


def policy(
    data: Path, spec: BaseSpec, work: Path, *, writes: int, batch: int, queries: int, rounds: int,
    policies: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``writes`` upserts of ``batch`` rows into a copy of the base per merge policy (settings
    overridden as ``policies`` say; write ``i`` runs on every copy in turn, so the machine's
    load falls alike on each): each write's seconds, segments and the rows its merges rewrote,
    then the segments left and the latency of every copy against the base, interleaved."""
    from flowsearch import AnnPolicy, MergePolicy, Searcher, upsert
    from flowsearch.storage import manifest as mf

    policies = POLICIES if policies is None else policies
    base, record = base_index(data, spec, work)
    indexes = {
        name: fresh_copy(base, work / "policy" / f"index-{at}")
        for at, name in enumerate(policies)
    }  # fmt: skip
    half = batch // 2
    texts = new_texts(data, writes * batch, seed=11)
    replaced = np.random.default_rng(3).choice(spec.rows, size=writes * half, replace=False)
    logs: dict[str, list[dict[str, Any]]] = {name: [] for name in policies}
    for i in range(writes):
        chunk = texts[i * batch : (i + 1) * batch]
        ids = [*replaced[i * half : (i + 1) * half].tolist()]
        ids += [3 * CORPUS_ROWS + i * batch + j for j in range(batch - half)]
        records = [{"id": int(d), "text": t} for d, t in zip(ids, chunk, strict=True)]
        for name, index in indexes.items():
            before = {s.name for s in mf.read(index).segments}
            merge = MergePolicy(**policies[name])
            result, cost = timed_write(lambda r=records, x=index, m=merge: upsert(x, r, merge=m),
                                       index)  # fmt: skip
            new = [s for s in mf.read(index).segments if s.name not in before]
            last = (index / "history.jsonl").read_text().splitlines()[-1]
            own = json.loads(last)["detail"]["segment"]  # the write's own segment
            outputs = [s for s in new if s.name != own]  # what its merges wrote
            logs[name].append({
                "write": i + 1, **cost, "segments": result.n_segments,
                "merged": result.n_merged, "seconds": dict(result.seconds),
                "rows_merged": sum(s.n_rows for s in outputs),
                "graph_rows": sum(s.n_rows for s in outputs if s.ann.factory != "Flat"),
            })  # fmt: skip
            LOG.info("policy %s write %d: %.1f s, %d segments, %d rows merged", name, i + 1,
                     cost["wall_s"], result.n_segments, logs[name][-1]["rows_merged"])  # fmt: skip
    out: dict[str, Any] = {
        "rows": spec.rows,
        "writes": writes,
        "batch": batch,
        "policies": policies,
        "base": record,
        "defaults": {**{k: getattr(MergePolicy(), k) for k in
                        ("flat_segments_max", "segments_per_tier", "merge_factor",
                         "floor_segment_rows", "write_merge_max_rows")},
                     "flat_max_rows": AnnPolicy().flat_max_rows},
        "runs": {},
    }  # fmt: skip
    for name, index in indexes.items():
        m = mf.read(index)
        out["runs"][name] = {
            "log": logs[name],
            "segments": [
                {"rows": s.n_rows, "live": s.n_live, "factory": s.ann.factory} for s in m.segments
            ],
            "n_live": m.n_live,
        }
    _, held = corpus(data)
    picked = held[:: max(1, len(held) // queries)][:queries]
    searchers = {"base": Searcher.open(base)}
    searchers.update({name: Searcher.open(index) for name, index in indexes.items()})
    out["latency"] = latency(searchers, picked, rounds)
    for s in searchers.values():
        s.close()
    return out
