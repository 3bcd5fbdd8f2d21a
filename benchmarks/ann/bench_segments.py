r"""Segments of a large index (issue 30): 10 segments of 20k rows against one of 200k, through
the full :class:`~flowsearch.Searcher`, dense and hybrid.

Corpus: the 200k-row speed corpus (``speed_corpus.py``: real sentences topped up with splices
of two), ``static`` pooling, ``auto`` calibration and index. The one-segment index is built by
``build_index``; the segmented one holds the same rows in the same order with the same
calibrator (``build_index(calibrator=...)`` on the first slice, ``add_to_index`` of each other
slice, ``merge_segments=False``), so each row's searched vector is the same in both. Queries the
corpus never saw: QNLI test questions and partial held-out sentences (a seeded contiguous
40-70% of a real sentence's words), half each. Truth: exact top-10 over every row in the
searched space (the searcher's own query vectors and stored vectors).

Measured per index (and per setting, ``--segment-threads``): p50 / p90 ms of one query at a
time, dense and hybrid (``Searcher.search(q, k=10, mode=...)``), interleaved query by query;
dense recall@10 against exact search over all rows; hybrid: the share of the top-10 ids equal
to an exact twin's (every segment searched exactly); batch QPS (all queries at once) and the
QPS of concurrent single queries from 4 threads.

Equal recall (``knob_curves``): whatever each set-up's tuner chose, the dense vector search
alone (``search_segments``: no embedding, no row join) swept over one efSearch for every
segment, recall@10 against p50 (the CPU time of the searching thread, so the other jobs of a
shared core do not enter it; wall time beside), interpolated at recall 0.95, 0.96 and 0.97.
``--variants HNSW32@160,...``: the segmented index's segments rebuilt from their searched
vectors as other graphs (factory @ efConstruction), compared on the same curves.

Usage::

    python -m benchmarks run segments [--rows 200000] [--segments 10] [--queries 1000]
        [--variants HNSW32@160,HNSW16@160]
    python -m benchmarks run segments --smoke
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness
from benchmarks.common.corpora import partial_sentence

LOG = logging.getLogger("bench_segments")

MODES = ("dense", "hybrid")


_THREADED: dict[tuple[int, int], Any] = {}


def _threaded(s: Any, n: int) -> Any:
    """A searcher of ``s``'s index whose single queries use ``n`` segment threads (a searcher's
    own option), opened once per setting with ``s``'s encoder."""
    from flowsearch.search.options import SearchOptions
    from flowsearch.search.searcher import Searcher

    key = (id(s), n)
    if key not in _THREADED:
        options = SearchOptions(segment_threads=n)
        _THREADED[key] = Searcher.open(s.root, encoder=s.encoder, options=options)
    return _THREADED[key]


def corpus(data: Path, work: Path, rows: int, n_queries: int) -> tuple[Path, list[str]]:
    """The corpus and its queries: QNLI questions, then partial held-out sentences."""
    from benchmarks.common.corpora import corpus_and_queries

    path, queries, _ = corpus_and_queries(data, work, rows, n_queries)
    half = n_queries // 2
    rng = np.random.default_rng(7)
    questions, held = queries[: n_queries - half], queries[n_queries - half :]
    return path, questions + [partial_sentence(s, rng) for s in held]


def one_segment(path: Path, work: Path) -> Path:
    """The corpus as one segment (``auto``), built once."""
    from flowsearch import build_index

    target = work / "one"
    if (target / "manifest.json").exists():
        return target
    t = time.perf_counter()
    build_index(path, target, pooling="static", overwrite=True)
    (work / "one.build.json").write_text(json.dumps({"seconds": time.perf_counter() - t}))
    return target


def segmented(path: Path, base: Path, work: Path, n_segments: int, name: str) -> Path:
    """The base's rows as ``n_segments`` equal segments, same calibrator and order; built once
    (``name`` keeps builds of different code apart)."""
    import pyarrow.parquet as pq

    from flowsearch import add_to_index, build_index
    from flowsearch.storage import manifest as mf

    target = work / name
    done = target.with_name(target.name + ".complete")
    if done.exists():
        return target
    table = pq.read_table(path)
    bounds = np.linspace(0, table.num_rows, n_segments + 1).astype(int)
    slices = work / f"slices_{n_segments}"
    slices.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        paths.append(slices / f"{i:03d}.parquet")
        if not paths[-1].exists():
            pq.write_table(table.slice(a, b - a), paths[-1])
    calibrator = base / mf.read(base).calibration.path
    t = time.perf_counter()
    build_index(paths[0], target, pooling="static", calibrator=calibrator, overwrite=True)
    for p in paths[1:]:
        add_to_index(target, p, merge_segments=False)
    assert len(mf.read(target).segments) == n_segments
    done.write_text(json.dumps({"seconds": time.perf_counter() - t}))
    return target


def truth_of(searcher: Any, queries: list[str], k: int = 10) -> np.ndarray:
    """Exact top-k ids over every row of the searched space."""
    Z, _ = searcher.embed(queries)
    X = searcher.vectors()
    rows = harness.exact_top(Z, X, k)[1]
    ids = np.asarray(
        [r["id"] for r in searcher._shards(searcher.version).shards[0].records(
            searcher.version.manifest.version, np.unique(rows))]
    )  # fmt: skip
    lookup = dict(zip(np.unique(rows).tolist(), ids.tolist(), strict=True))
    return np.vectorize(lookup.__getitem__)(rows)


def ids_of(hits: list[list[Any]], k: int = 10) -> np.ndarray:
    out = np.full((len(hits), k), -1, np.int64)
    for i, hs in enumerate(hits):
        for j, h in enumerate(hs[:k]):
            out[i, j] = int(h.id)
    return out


def latency(
    searchers: dict[str, Callable[[str, str], Any]], queries: list[str], warmup: int = 20
) -> dict[str, dict[str, list[float]]]:
    """ms per query per searcher and mode, interleaved query by query (order rotated)."""
    names = list(searchers)
    for q in queries[:warmup]:
        for name in names:
            for mode in ("dense", "hybrid"):
                searchers[name](q, mode)
    times: dict[str, dict[str, list[float]]] = {n: {"dense": [], "hybrid": []} for n in names}
    turn = 0
    for q in queries:
        for mode in ("dense", "hybrid"):
            order = names[turn % len(names) :] + names[: turn % len(names)]
            turn += 1
            for name in order:
                t = time.perf_counter()
                searchers[name](q, mode)
                times[name][mode].append((time.perf_counter() - t) * 1e3)
    return times


def batch_qps(fn: Callable[[], Any], n: int, repeats: int = 2) -> float:
    """Queries per second of ``fn`` (answering ``n`` queries), best of ``repeats``."""
    best = min(harness.timed(fn)[1] for _ in range(repeats))
    return n / best


def concurrent_qps(search: Callable[[str], Any], queries: list[str], threads: int = 4) -> float:
    """Queries per second of single queries sent by ``threads`` threads at once."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(search, queries[: threads * 2]))  # warm
        t = time.perf_counter()
        list(pool.map(search, queries))
        return len(queries) / (time.perf_counter() - t)


def curve_summary(searcher: Any) -> dict[str, Any]:
    """The segments' tuned and chosen knobs."""
    v = searcher.version
    return {
        "params": [s.ann.params for s in v.manifest.segments],
        "tuned_recall": [
            None if s.ann.tuning is None else round(s.ann.tuning.recall, 4)
            for s in v.manifest.segments
        ],  # fmt: skip
        "chosen": v.knobs(),
    }


class Graph:
    """A bare FAISS index standing in for a segment reader in ``search_segments``."""

    def __init__(self, index: Any) -> None:
        self.index = index

    def search(self, queries: np.ndarray, k: int, rows: Any, deleted: Any, knob: Any) -> Any:
        from flowsearch.ann import io as ann_io

        return ann_io.search(self.index, queries, k, knob)


def rebuilt(searcher: Any, specs: list[str], work: Path) -> dict[str, Any]:
    """Per spec (``HNSW32@160``: factory @ efConstruction), the segmented index's segments
    rebuilt as that graph from their searched vectors (same rows and bounds; built once, on
    FAISS's threads as ingest builds, cached under ``work``): ``{spec: (graphs, offsets,
    {"seconds": build seconds, "note": how, when a cached build says})}``."""
    import faiss

    v = searcher.version
    X = searcher.vectors()
    out: dict[str, Any] = {}
    for spec in specs:
        factory, _, efc = spec.partition("@")
        folder = work / "variants" / spec.replace("@", "_")
        folder.mkdir(parents=True, exist_ok=True)
        done = folder / "build.json"
        graphs = []
        if done.exists():
            graphs = [faiss.read_index(str(folder / f"{i}.faiss")) for i in range(len(v.segments))]
        else:
            t = time.perf_counter()
            for i in range(len(v.segments)):
                g = faiss.index_factory(X.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
                faiss.downcast_index(g).hnsw.efConstruction = int(efc)
                g.add(np.ascontiguousarray(X[v.offsets[i] : v.offsets[i + 1]]))
                faiss.write_index(g, str(folder / f"{i}.faiss"))
                graphs.append(g)
            done.write_text(json.dumps({"seconds": time.perf_counter() - t}))
        out[spec] = ([Graph(g) for g in graphs], v.offsets, json.loads(done.read_text()))
    return out


def interpolate(points: list[tuple[int, float, float]], target: float) -> float | None:
    """The p50 at ``target`` recall, linear between the two measured points around it (None
    outside the measured range); ``points``: (knob, recall, p50)."""
    ordered = sorted(points, key=lambda p: p[1])
    for (_, r0, p0), (_, r1, p1) in zip(ordered, ordered[1:], strict=False):
        if r0 <= target <= r1 and r1 > r0:
            return p0 + (p1 - p0) * (target - r0) / (r1 - r0)
    return None


def knob_curves(opened: dict[str, Any], queries: list[str], n_latency: int, rounds: int = 3,
                sweeps: dict[str, tuple[int, ...]] | None = None,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Recall against p50 of the dense vector search alone (``search_segments``, what a
    searcher runs after embedding and before joining rows), each index swept over one efSearch
    for all its segments: the set-ups compared at equal recall, whatever their tuners chose.
    p50 per point: one query at a time on one FAISS thread, CPU time of the thread (the
    machine's other jobs do not enter it) and wall time; points interleaved (a round times
    every point's queries, the order shuffled per round) after a warm-up round."""
    from flowsearch.ann import io as ann_io
    from flowsearch.search.dense import search_segments

    sweeps = sweeps or {"one": (64, 96, 128, 192, 256, 384, 512),
                        "many": (15, 20, 25, 30, 40, 50, 60, 80)}  # fmt: skip
    Z, _ = opened["one"].embed(queries)
    Z = np.ascontiguousarray(Z, dtype=np.float32)
    truth = harness.exact_top(Z, opened["one"].vectors(), 10)[1]
    points: list[tuple[str, int]] = []
    recall: dict[tuple[str, int], float] = {}
    indexes = {name: (s.version.segments, s.version.offsets) for name, s in opened.items()}
    indexes.update({name: (g[0], g[1]) for name, g in (extra or {}).items()})
    runs = {
        name: (lambda Q, ef, segs=segs, offsets=offsets: search_segments(
            segs, [None] * len(segs), offsets, Q, 10, [None] * len(segs), [ef] * len(segs)))
        for name, (segs, offsets) in indexes.items()
    }  # fmt: skip
    for name, (segs, _) in indexes.items():
        for ef in sweeps["one" if len(segs) == 1 else "many"]:
            found = ann_io.single_threaded(lambda: runs[name](Z, ef)[1])  # noqa: B023
            recall[(name, ef)] = r = harness.recall(found, truth)
            if 0.92 <= r <= 0.985:
                points.append((name, ef))
    picked = Z[:: max(1, len(Z) // n_latency)][:n_latency]
    cpu: dict[tuple[str, int], list[float]] = {p: [] for p in points}
    wall: dict[tuple[str, int], list[float]] = {p: [] for p in points}
    rng = np.random.default_rng(0)

    def one_round(record: bool) -> None:
        for i in rng.permutation(len(points)):
            name, ef = points[i]
            fn = runs[name]
            for q in picked:
                q1 = q[None]
                c, t = time.thread_time(), time.perf_counter()
                fn(q1, ef)
                if record:
                    wall[(name, ef)].append((time.perf_counter() - t) * 1e3)
                    cpu[(name, ef)].append((time.thread_time() - c) * 1e3)

    load = [harness.load_average()]
    ann_io.single_threaded(lambda: [one_round(r > 0) for r in range(rounds + 1)])
    load.append(harness.load_average())
    table: dict[str, list[tuple[int, float, float, float]]] = {}
    for name, ef in points:
        table.setdefault(name, []).append((ef, recall[(name, ef)],
                                           float(np.median(cpu[(name, ef)])),
                                           float(np.median(wall[(name, ef)]))))  # fmt: skip
    at: dict[str, dict[str, Any]] = {}
    for target in (0.95, 0.96, 0.97):
        row = {}
        for name, pts in table.items():
            c = interpolate([(e, r, p) for e, r, p, _ in pts], target)
            w = interpolate([(e, r, p) for e, r, _, p in pts], target)
            row[name] = {"cpu_ms": c, "wall_ms": w}
        base = row.get("one", {})
        for r in row.values():
            for key in ("cpu_ms", "wall_ms"):
                b = base.get(key)
                r[key.replace("_ms", "_ratio")] = None if r[key] is None or not b else r[key] / b
        at[f"{target:.2f}"] = row
    return {"points": table, "at": at, "load": load,
            "all_recall": {f"{n} ef {e}": r for (n, e), r in recall.items()},
            "latency_queries": len(picked), "rounds": rounds}  # fmt: skip


def measure(one: Path, many: dict[str, Path], queries: list[str], n_latency: int,
            threads: tuple[int, ...], skews: tuple[float, ...],
            specs: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """Every index's recall, latency and throughput (see the module docstring)."""
    from unittest.mock import patch

    from flowsearch import Searcher
    from flowsearch.ann import merged

    opened = {"one": Searcher.open(one), **{n: Searcher.open(p) for n, p in many.items()}}
    main = next(iter(many))
    for name, path in list(many.items())[:1]:
        for skew in skews:  # a searcher each: a version chooses its knobs once
            with patch.object(merged, "MERGED_SKEW", skew):
                opened[f"{name} skew {skew:g}"] = Searcher.open(path)
                opened[f"{name} skew {skew:g}"].version.knobs()
    truth = truth_of(opened["one"], queries)
    out: dict[str, Any] = {"queries": len(queries), "load": [harness.load_average()]}
    extra = rebuilt(opened[main], list(specs), one.parent) if specs else {}
    out["variant_build_s"] = {name: g[2] for name, g in extra.items()}
    out["curves"] = knob_curves({n: opened[n] for n in ("one", *many)}, queries, n_latency,
                                extra=extra)  # fmt: skip
    LOG.info("curves %s", json.dumps(out["curves"]["at"], indent=1))
    answers: dict[str, dict[str, np.ndarray]] = {}
    for name, s in opened.items():
        answers[name] = {m: ids_of(s.search(queries, k=10, mode=m)) for m in ("dense", "hybrid")}
        out.setdefault("indexes", {})[name] = {
            "segments": len(s.version.segments),
            "recall_dense": harness.recall(answers[name]["dense"], truth),
            "recall_dense_questions": harness.recall(
                answers[name]["dense"][: len(queries) // 2], truth[: len(queries) // 2]
            ),
            "recall_dense_partial": harness.recall(
                answers[name]["dense"][len(queries) // 2 :], truth[len(queries) // 2 :]
            ),
            "hybrid_same_as_one": harness.recall(answers[name]["hybrid"], answers["one"]["hybrid"]),
            **curve_summary(s),
        }
        LOG.info("%s: %s", name, out["indexes"][name])

    def caller(s: Any, n: int) -> Callable[[str, str], Any]:
        def call(q: str, mode: str) -> Any:
            # 1: in turn (the default is every core)
            return _threaded(s, n).search(q, k=10, mode=mode)

        return call

    variants: dict[str, Callable[[str, str], Any]] = {}
    for name, s in opened.items():
        for n in threads:
            if n == 1 or name == main:
                variants[name if n == 1 else f"{name} x{n} threads"] = caller(s, n)
    lat = latency(variants, queries[:: max(1, len(queries) // n_latency)][:n_latency])
    base = {m: float(np.percentile(lat["one"][m], 50)) for m in ("dense", "hybrid")}
    out["latency"] = {
        name: {
            m: {
                "p50_ms": float(np.percentile(t[m], 50)),
                "p90_ms": float(np.percentile(t[m], 90)),
                "ratio": float(np.percentile(t[m], 50)) / base[m],
            }
            for m in ("dense", "hybrid")
        }
        for name, t in lat.items()
    }
    out["load"].append(harness.load_average())
    LOG.info("latency %s", json.dumps(out["latency"], indent=1))
    throughput: dict[str, Any] = {}
    for name, s in opened.items():
        for n in threads:
            if n > 1 and name != main:
                continue
            label = name if n == 1 else f"{name} x{n} threads"
            t = _threaded(s, n)
            throughput[label] = {
                "batch_qps_dense": batch_qps(
                    lambda s=t: s.search(queries, k=10, mode="dense"), len(queries)
                ),
                "concurrent_qps_dense": concurrent_qps(
                    lambda q, s=t: s.search(q, k=10, mode="dense"), queries[:400]
                ),
                "concurrent_qps_hybrid": concurrent_qps(
                    lambda q, s=t: s.search(q, k=10, mode="hybrid"), queries[:400]
                ),
            }
            LOG.info("%s throughput %s", label, throughput[label])
    out["throughput"] = throughput
    out["load"].append(harness.load_average())
    for s in opened.values():
        s.close()
    return out


def scores_of(hits: list[list[Any]], k: int = 10) -> np.ndarray:
    out = np.full((len(hits), k), np.nan)
    for i, hs in enumerate(hits):
        for j, h in enumerate(hs[:k]):
            out[i, j] = h.score
    return out


def latency_stage(one: Path, many: Path, queries: list[str], n_latency: int, rounds: int,
                  label: str, work: Path, also: dict[str, Path] | None = None,
                  threads: tuple[int, ...] = (),
                  skews: tuple[float, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """``--stage latency``: the one and the segmented index through ``Searcher.search``, dense
    and hybrid, interleaved (``rounds`` passes over ``n_latency`` queries), with the code on
    the path (``label`` names it: run it once per code, e.g. main's and a branch's); every
    query's top-10 ids and scores saved under ``work`` and compared with the other labels'.
    ``also``: more indexes measured beside them (name: directory), e.g. what bench_storage's
    policy stage left. ``threads``: the segmented index also searched with
    ``SearchOptions.segment_threads`` at each of these (as ``ten xN``; ``ten``: the default); CPU
    time is then the whole process's (every thread's), and the QPS of 4 concurrent clients is
    measured per index. ``skews``: the segmented index also opened with its knobs chosen at
    each ``ann.merged.MERGED_SKEW`` (as ``ten skew S``: higher knobs, higher recall), so the one
    and the segmented index are compared at equal recall too; each index's dense recall@10
    (against exact search over every row) is recorded."""
    from unittest.mock import patch

    from flowsearch import Searcher
    from flowsearch.ann import merged

    opened = {"one": Searcher.open(one), "ten": Searcher.open(many)}
    opened.update({name: Searcher.open(path) for name, path in (also or {}).items()})
    for skew in skews:  # a version's knobs are chosen at its first search
        opened[f"ten skew {skew:g}"] = Searcher.open(many)
        with patch.object(merged, "MERGED_SKEW", skew):
            opened[f"ten skew {skew:g}"].search(queries[0], k=10)
    picked = queries[:: max(1, len(queries) // n_latency)][:n_latency]
    calls = {
        name: (lambda q, mode, s=s: s.search(q, k=10, mode=mode)) for name, s in opened.items()
    }  # fmt: skip

    def threaded(n: int) -> Callable[[str, str], Any]:
        def call(q: str, mode: str) -> Any:
            return _threaded(opened["ten"], n).search(q, k=10, mode=mode)

        return call

    calls.update({f"ten x{n}": threaded(n) for n in threads if n > 0})
    clock = time.process_time if threads else time.thread_time
    load = [harness.load_average()]
    for q in picked[:20]:  # warm
        for call in calls.values():
            call(q, "dense"), call(q, "hybrid")
    wall: dict[tuple[str, str], list[float]] = {(n, m): [] for n in calls for m in MODES}
    cpu: dict[tuple[str, str], list[float]] = {(n, m): [] for n in calls for m in MODES}
    turn = 0
    for q in picked * rounds:
        for mode in MODES:
            names = list(calls)
            turn += 1
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                c, t = clock(), time.perf_counter()
                calls[name](q, mode)
                wall[name, mode].append((time.perf_counter() - t) * 1e3)
                cpu[name, mode].append((clock() - c) * 1e3)
    load.append(harness.load_average())
    out: dict[str, Any] = {"queries": len(picked), "rounds": rounds, "load": load,
                           "cpu_clock": clock.__name__}  # fmt: skip
    if threads:
        out["concurrent_qps"] = {}
        for name in calls:  # each setting: a searcher of its own
            n = name.partition(" x")[2]
            target = opened[name.partition(" x")[0]]
            target = _threaded(target, int(n)) if n else target
            out["concurrent_qps"][name] = {
                m: concurrent_qps(lambda q, m=m, t=target: t.search(q, k=10, mode=m), picked)
                for m in MODES
            }  # fmt: skip
    for name in calls:  # the one and the others: ratios of p50s to the one's
        out[name] = {
            m: {
                "p50_ms": float(np.median(wall[name, m])),
                "p90_ms": float(np.percentile(wall[name, m], 90)),
                "ratio": float(np.median(wall[name, m]) / np.median(wall["one", m])),
                "cpu_p50_ms": float(np.median(cpu[name, m])),
                "cpu_ratio": float(np.median(cpu[name, m]) / np.median(cpu["one", m])),
            }
            for m in MODES
        }
    answers: dict[str, np.ndarray] = {}
    truth = truth_of(opened["one"], queries)
    for name, s in opened.items():
        for mode in ("dense", "hybrid"):
            hits = s.search(queries, k=10, mode=mode)
            answers[f"{name} {mode} ids"], answers[f"{name} {mode} scores"] = (
                ids_of(hits),
                scores_of(hits),
            )
        out[name]["dense"]["recall"] = harness.recall(answers[f"{name} dense ids"], truth)
    for s in opened.values():
        s.close()
    np.savez(work / f"answers_{label}.npz", **answers)
    same: dict[str, Any] = {}
    for other in sorted(work.glob("answers_*.npz")):
        theirs = other.stem.removeprefix("answers_")
        if theirs == label:
            continue
        saved = np.load(other)
        same[theirs] = {
            key.removesuffix(" ids"): {
                "same_ids": float(np.mean(np.all(answers[key] == saved[key], axis=1))),
                "same_scores": float(np.mean(np.all(
                    answers[key.replace("ids", "scores")]
                    == saved[key.replace("ids", "scores")], axis=1))),
            }
            for key in answers if key.endswith(" ids") and key in saved
        }  # fmt: skip
    out["same_answers_as"] = same
    out["answers_queries"] = len(queries)
    out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out["command"] = harness.command_line()
    return out


def retune_stage(
    indexes: dict[str, Path], queries: list[str], work: Path, n_latency: int
) -> dict[str, Any]:
    """``--stage retune``: what ``compact`` does to indexes an older tuning rule tuned. Each of
    ``indexes`` is copied (:func:`_linked_copy`), its knobs, dense recall@10 of the real queries
    against exact search and dense p50 measured, then ``compact`` re-tunes it (timed) and the
    same is measured again."""
    import shutil

    from flowsearch import Searcher
    from flowsearch.writes.compact import compact

    truth = truth_of(Searcher.open(indexes["one"]), queries)
    out: dict[str, Any] = {"queries": len(queries), "load": [harness.load_average()]}

    def measured(path: Path) -> dict[str, Any]:
        s = Searcher.open(path)
        found = ids_of(s.search(queries, k=10, mode="dense"))
        times = latency({"x": lambda q, m: s.search(q, k=10, mode=m)}, queries[:n_latency])
        half = len(queries) // 2
        return {
            "recall": harness.recall(found, truth),
            "recall_questions": harness.recall(found[:half], truth[:half]),
            "recall_partial": harness.recall(found[half:], truth[half:]),
            "dense_p50_ms": float(np.median(times["x"]["dense"])),
            "tuned": [None if g.ann.tuning is None else
                      [g.ann.params, round(g.ann.tuning.recall, 4), g.ann.tuning.queries]
                      for g in s.version.manifest.segments],
            "chosen": s.version.knobs(),  # what a search over several segments uses
        }  # fmt: skip

    for name, path in indexes.items():
        copy = work / f"retune_{name}"
        shutil.rmtree(copy, ignore_errors=True)
        _linked_copy(path, copy)
        before = measured(copy)
        t = time.perf_counter()
        result = compact(copy)
        seconds = time.perf_counter() - t
        out[name] = {"before": before, "after": measured(copy), "compact_s": seconds,
                     "retuned": result.n_retuned, "segments": len(before["tuned"]),
                     "segments_after": result.n_segments}  # fmt: skip
        LOG.info("%s: %s", name, json.dumps(out[name]))
        shutil.rmtree(copy)
    out["load"].append(harness.load_average())
    out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out["command"] = harness.command_line()
    return out


def _linked_copy(src: Path, dst: Path) -> None:
    """``dst``: a copy of index ``src`` whose segments', calibrators' and references' files
    (never written once published) are hard links, and the rest copied: the history a write
    appends to and the lock must not be the source's."""
    import shutil

    immutable = ("segments", "calibrators", "references")
    for item in sorted(src.rglob("*")):
        rel = item.relative_to(src)
        target = dst / rel
        if item.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif rel.parts[0] in immutable:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(item, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, target)


def retune_part(report: dict[str, Any]) -> list[str]:
    """``--stage retune``'s table (none before its first run)."""
    r = report.get("retune")
    if not r:
        return []
    body = [
        "### `compact` re-tunes indexes an older tuning rule tuned",
        "",
        "The indexes above as an earlier release's tuner left them (fewer probes, one pick), "
        "copied, then `flowsearch compact` (which now re-tunes each segment whose tuning "
        "predates `flowsearch.ann.build.TUNER_VERSION`, its files kept). Dense recall@10 of "
        f"the {r['queries']} real queries against exact search; p50 of one dense query, one at "
        f"a time. Load (1-minute) {[x[0] for x in r['load']]}.",
        "",
        "| index | segments re-tuned | compact s | efSearch before | after | recall@10 "
        "before (questions / partial) | after | dense p50 ms before | after |",
        "|---|---:|---:|---|---|---|---|---:|---:|",
    ]

    def knobs(m: dict[str, Any]) -> str:
        tuned = ", ".join(t[0].removeprefix("efSearch=") for t in m["tuned"] if t) or "-"
        chosen = m.get("chosen")
        return tuned + (f" (searched at {', '.join(map(str, chosen))})" if chosen else "")

    def recall(m: dict[str, Any]) -> str:
        return f"{m['recall']:.3f} ({m['recall_questions']:.3f} / {m['recall_partial']:.3f})"

    for name, x in r.items():
        if not isinstance(x, dict) or "before" not in x:
            continue
        b, a = x["before"], x["after"]
        after = x.get("segments_after", x["segments"])
        merged = f" (merged into {after})" if after != x["segments"] else ""
        body.append(
            f"| {name} | {x['retuned']} of {x['segments']}{merged} | {x['compact_s']:.0f} | "
            f"{knobs(b)} | {knobs(a)} | {recall(b)} | **{recall(a)}** | "
            f"{b['dense_p50_ms']:.2f} | {a['dense_p50_ms']:.2f} |"
        )
    return [*body, "", f"(`{r['command']}`, {r['date']})", ""]


def main() -> int:
    parser = harness.arguments(__doc__, "20k rows as 4 segments, 100 queries", "bench_segments")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--segments", type=int, default=10)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--latency-queries", type=int, default=300)
    parser.add_argument("--name", default="ten", help="the segmented index's directory name")
    parser.add_argument("--stage", default="all", choices=("build", "all", "latency", "retune"))
    parser.add_argument(
        "--label",
        default="branch",
        help="--stage latency: the code's name "
        "(its run is kept beside the other labels' in the JSON)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="--stage latency: passes")
    parser.add_argument("--also", default="", help="--stage latency: more indexes beside, "
                        "name=directory,... (e.g. bench_storage's policy indexes)")  # fmt: skip
    parser.add_argument("--baseline", default=None, help="a segmented index built by main's code")
    parser.add_argument("--threads", default="1", help="segment_threads settings to measure")
    parser.add_argument("--latency-skews", default="", help="--stage latency: the segmented "
                        "index also with knobs at these merged_skew settings")  # fmt: skip
    parser.add_argument("--latency-threads", default="", help="--stage latency: the segmented "
                        "index also at these segment_threads settings (e.g. 1,2)")  # fmt: skip
    parser.add_argument("--skews", default="", help="more merged_skew settings to measure")
    parser.add_argument("--variants", default="", help="segment graphs to compare at equal "
                        "recall, e.g. HNSW32@160,HNSW16@160 (factory@efConstruction)")  # fmt: skip
    args = harness.parse(parser, rows=20_000, segments=4, queries=100, latency_queries=50)
    if harness.rendered(args, render):
        return 0
    data = harness.data_dir(args.data)
    work = harness.WORK / ("smoke/segments" if args.smoke else "segments") / str(args.rows)
    work.mkdir(parents=True, exist_ok=True)
    path, queries = corpus(data, work, args.rows, args.queries)
    one = one_segment(path, work)
    many = segmented(path, one, work, args.segments, args.name)
    LOG.info("built %s and %s", one, many)
    if args.stage == "build":
        return 0
    if args.stage == "latency":
        saved = Path(args.out + ".json")
        report = json.loads(saved.read_text()) if saved.exists() and not args.smoke else {}
        report.setdefault("latency_runs", {})[args.label] = latency_stage(
            one,
            many,
            queries,
            args.latency_queries,
            args.rounds,
            args.label,
            work,
            {n: Path(d) for n, _, d in (x.partition("=") for x in args.also.split(",") if x)},
            tuple(int(x) for x in args.latency_threads.split(",") if x),
            tuple(float(x) for x in args.latency_skews.split(",") if x),
        )
        report["latency_runs"][args.label]["cores"] = sorted(os.sched_getaffinity(0))
        if "measured" not in report:  # a first run: this section holds only the stage
            report.update({"rows": args.rows, "segments": args.segments})
        harness.finish(args, render, report)
        return 0
    if args.stage == "retune":
        saved = Path(args.out + ".json")
        report = json.loads(saved.read_text()) if saved.exists() and not args.smoke else {}
        report["retune"] = retune_stage({"one": one, args.name: many}, queries, work,
                                        args.latency_queries)  # fmt: skip
        if "measured" not in report:
            report.update({"rows": args.rows, "segments": args.segments})
        harness.finish(args, render, report)
        return 0
    many_paths = {args.name: many}
    if args.baseline:
        many_paths[args.baseline] = work / args.baseline
    threads = tuple(int(x) for x in args.threads.split(","))
    skews = tuple(float(x) for x in args.skews.split(",") if x)
    from flowsearch.ann import merged

    report = {
        "rows": args.rows,
        "segments": args.segments,
        "names": {
            "one": "one segment",
            args.name: f"{args.segments} segments, knobs for the merged top 10 "
            f"(skew {merged.MERGED_SKEW:g}, the default)",
            **(
                {args.baseline: f"{args.segments} segments, each tuned alone (main)"}
                if args.baseline
                else {}
            ),
        },  # fmt: skip
        "cores": sorted(os.sched_getaffinity(0)),
        "build_s": {
            n: json.loads(p.read_text())["seconds"]
            for n, p in {
                "one": work / "one.build.json",
                **{k: work / f"{k}.complete" for k in many_paths},
            }.items()
            if p.exists() and p.read_text().strip()
        },  # fmt: skip
        "measured": measure(
            one,
            many_paths,
            queries,
            args.latency_queries,
            threads,
            skews,
            tuple(x for x in args.variants.split(",") if x),
        ),  # fmt: skip
        "machine": harness.machine(),
        "command": harness.command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    harness.finish(args, render, report)
    return 0


def latency_runs_part(report: dict[str, Any]) -> list[str]:
    """The ``--stage latency`` runs: one row per code label and index."""
    runs = report.get("latency_runs") or {}
    if not runs:
        return []
    body = [
        f"Per-segment overhead, by code (`--stage latency`): the one segment and the "
        f"{report.get('segments', 10)} segments through `Searcher.search(q, k=10)`, dense and "
        "hybrid, every query on both indexes in turn (wall time, and the CPU time of the "
        "searching thread: the shared core's other jobs do not enter it); each label is a run "
        "of this script with "
        "that code first on the path (`main`: the code before the per-segment cuts), so "
        "compare ratios (each run's own one-segment p50 is its base); `policy-*`: the indexes "
        "bench_storage.py's policy stage left (100 upserts of 1,000 rows into a copy of the one "
        "segment; `before`: the tiers alone, ten to a tier; `now`: the default policy); "
        "`ten` is searched with the default `SearchOptions.segment_threads`, which was 1 (in turn) "
        "before the segment-threads run and is every core since (2 here, both cores allowed), "
        "`ten x1` in turn; `ten skew S`: knobs chosen at `merged_skew` S (equal recall). Same "
        "answers: share of "
        "all queries whose top-10 ids (and scores, bit for bit) equal the other label's run.",
        "",
        "| code | index | dense p50 / p90 ms | / one | CPU p50 ms | / one | hybrid p50 / p90 ms "
        "| / one | CPU p50 ms | / one | load | same answers as |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---|",
    ]

    def cpu(r: dict[str, Any], key: str, unit: str = "") -> str:
        return f"{r[key]:.2f}{unit}" if key in r else "-"

    for label, run in runs.items():
        for name in [n for n in run if isinstance(run[n], dict) and "dense" in run[n]]:
            d, h = run[name]["dense"], run[name]["hybrid"]
            same = "; ".join(
                f"{other}: " + ", ".join(
                    f"{k.split(' ')[1]} {v['same_ids']:.3f} / {v['same_scores']:.3f}"
                    for k, v in found.items() if k.startswith(name + " "))
                for other, found in run.get("same_answers_as", {}).items()
                if any(k.startswith(name + " ") for k in found)
            ) or "-"  # fmt: skip
            shown = f"{name} (recall {d['recall']:.3f})" if "recall" in d else name
            body.append(
                f"| {label} ({run['date']}) | {shown} | {d['p50_ms']:.2f} / {d['p90_ms']:.2f} | "
                f"{d['ratio']:.2f}x | {cpu(d, 'cpu_p50_ms')} | {cpu(d, 'cpu_ratio', 'x')} | "
                f"{h['p50_ms']:.2f} / {h['p90_ms']:.2f} | {h['ratio']:.2f}x | "
                f"{cpu(h, 'cpu_p50_ms')} | {cpu(h, 'cpu_ratio', 'x')} | "
                f"{run['load'][0][0]}-{run['load'][1][0]} | {same} |"
            )
    for label, run in runs.items():
        if run.get("concurrent_qps"):
            body += ["", f"{label}: QPS of 4 concurrent clients (single queries), dense / hybrid: "
                     + ", ".join(f"{n} {q['dense']:.0f} / {q['hybrid']:.0f}"
                                 for n, q in run["concurrent_qps"].items())
                     + f"; CPU time: `{run.get('cpu_clock', 'thread_time')}`."]  # fmt: skip
    first = next(iter(runs.values()))
    body += ["", f"(Answers over all {first['answers_queries']} queries. Runs: "
             + "; ".join(f"{k} ({r['queries']} queries x {r['rounds']} rounds, cores "
                         f"{r.get('cores', '?')}): `{r['command']}`" for k, r in runs.items())
             + ")", ""]  # fmt: skip
    return body


def render(report: dict[str, Any]) -> str:
    """The markdown report."""
    if "measured" not in report:
        return "\n".join([*latency_runs_part(report), *retune_part(report)]) + "\n"
    m = report["measured"]
    n = report["segments"]
    names = report.get("names", {})

    def label(name: str) -> str:
        if "@" in name:
            factory, _, efc = name.partition("@")
            return f"{n} segments rebuilt as {factory}, efConstruction {efc}"
        first, _, rest = name.partition(" ")
        if first in names and rest.startswith("skew"):
            return f"{n} segments, knobs for the merged top 10 ({rest})"
        return names.get(first, first) + (f", {rest}" if rest else "")

    body = [
        f"{report['rows']:,} rows of the speed corpus (`static`, `auto`), as one segment and as "
        f"{n} equal segments (same rows, order and calibrator), through `Searcher.search(q, "
        f"k=10)`; {m['queries']} queries never in the corpus (QNLI questions, partial held-out "
        "sentences). recall@10: dense answer against exact search over all rows; hybrid: share "
        "of the one segment's hybrid top 10. p50: one query at a time, interleaved. Load "
        f"(1-minute) during the run: {[x[0] for x in m['load']]}; run on cores "
        f"{report.get('cores', '?')} of 2 (`x2 threads`: `SearchOptions.segment_threads=2`). "
        f"{report['machine']}",
        "",
        "| index | dense recall@10 (questions / partial) | hybrid = one | knobs (chosen; tuned) |",
        "|---|---|---:|---|",
    ]
    for name, r in m["indexes"].items():
        chosen = r["chosen"]
        knobs = "-" if not chosen else ", ".join(str(c) for c in chosen)
        body.append(
            f"| {label(name)} | {r['recall_dense']:.3f} "
            f"({r['recall_dense_questions']:.3f} / {r['recall_dense_partial']:.3f}) | "
            f"{r['hybrid_same_as_one']:.3f} | {knobs}; {', '.join(r['params'])} |"
        )
    c = m.get("curves")
    if c:

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        def ratio(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}x"

        body += [
            "",
            "Equal recall: the dense vector search alone (`search_segments`: every segment at one "
            "efSearch, swept; no embedding, no row join), one query at a time on one FAISS "
            f"thread, {c['latency_queries']} queries x {c['rounds']} interleaved rounds; p50 of "
            "the thread's CPU time (wall time beside it), interpolated at each recall@10. "
            f"Load (1-minute) before / after: {[x[0] for x in c['load']]}: wall time on a "
            "shared core counts other jobs' time slices, which a longer search catches more "
            "often; compare CPU time.",
            "",
            "| recall@10 | index | CPU p50 ms | / one | wall p50 ms | / one |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for target, row in c["at"].items():
            for name, r in row.items():
                body.append(
                    f"| {target} | {label(name)} | {ms(r['cpu_ms'])} | {ratio(r['cpu_ratio'])} | "
                    f"{ms(r['wall_ms'])} | {ratio(r['wall_ratio'])} |"
                )
        body += ["", "Measured points (efSearch: recall@10, CPU p50 ms): " + "; ".join(
            f"{label(name)}: " + ", ".join(f"{e}: {r:.3f}, {p:.2f}" for e, r, p, _ in pts)
            for name, pts in c["points"].items())]  # fmt: skip
    body += [
        "",
        "| index | dense p50 ms | / one | dense p90 | hybrid p50 ms | / one | hybrid p90 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in m["latency"].items():
        d, h = r["dense"], r["hybrid"]
        body.append(
            f"| {label(name)} | {d['p50_ms']:.2f} | {d['ratio']:.2f} | {d['p90_ms']:.2f} | "
            f"{h['p50_ms']:.2f} | {h['ratio']:.2f} | {h['p90_ms']:.2f} |"
        )
    body += [
        "",
        "| index | batch QPS dense | 4 concurrent clients QPS dense | hybrid |",
        "|---|---:|---:|---:|",
    ]
    for name, r in m["throughput"].items():
        body.append(
            f"| {label(name)} | {r['batch_qps_dense']:.0f} | {r['concurrent_qps_dense']:.0f} | "
            f"{r['concurrent_qps_hybrid']:.0f} |"
        )
    body += ["", *latency_runs_part(report), *retune_part(report)]
    body += [f"Build seconds: {report['build_s']}"
             + (("; the rebuilt segments' graphs alone: " + ", ".join(
                 f"{k} {b['seconds']:.0f} s" + (f" ({b['note']})" if b.get("note") else "")
                 for k, b in m["variant_build_s"].items()))
                if m.get("variant_build_s") else "") + ".", "",
             f"Produced by `{report['command']}`, {report['date']}."]  # fmt: skip
    return "\n".join(body) + "\n"


if __name__ == "__main__":
    harness.script(main)
