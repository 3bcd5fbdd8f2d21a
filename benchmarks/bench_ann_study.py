r"""Which vector index pays on a calibrated space, and what ``auto``'s tuning promises (issue 30).

200,000 rows of the speed corpus (``speed_corpus``: real sentences topped up with splices of two
real sentences) encoded with ``static`` pooling and projected into the space ``auto`` fits for it
(``gaussian``, partial whitening). Queries the corpus never saw: QNLI test questions, and
*partial* held-out sentences (a seeded contiguous 40-70% of the words of a real sentence held out
of the corpus): the hard case issue 30 measured. Truth: exact top-10 in the same space.

Stages (cached under ``benchmarks/_work/ann_study``):

- ``prepare``: corpus, encoding, calibrator fit, projections, truth.
- ``study``: each index structure on the searched (calibrated) space, the same structures on the
  raw (normalised) space, and the *identity* index for a linear calibrator: inner product over
  ``v = (x - mu) / |W(x - mu)|`` with queries ``u = W^T W (x_q - mu)`` (the raw space's
  geometry, cosine ranking of the calibrated space); per knob value: recall@10 on the real
  queries, single-query p50 (one FAISS thread, one query at a time) and its speed-up on
  ``Flat``'s.
- ``tune``: ``auto``'s tuner (:func:`flowsearch.ann.build.tune_search`) on the index ``auto``
  builds: the knob it picks, the recall it records (on its held-out check queries), and the
  recall real queries get at that knob.

Run: ``python benchmarks/bench_ann_study.py --stage all`` (``--smoke``: 20k rows).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np

WORK = harness.WORK / "ann_study"
LATENCY_QUERIES = 300


def _partial(sentence: str, rng: np.random.Generator) -> str:
    words = sentence.split()
    if len(words) < 4:
        return sentence
    keep = max(3, int(round(len(words) * rng.uniform(0.4, 0.7))))
    start = int(rng.integers(0, len(words) - keep + 1))
    return " ".join(words[start : start + keep])


def prepare(data: Path, rows: int, n_queries: int) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from speed_corpus import corpus_and_queries

    from flowsearch.encode.encoder import Encoder
    from flowsearch.space.fitting import fit_for_index
    from flowsearch.space.search_space import SearchSpace

    work = WORK / str(rows)
    if (work / "prepare.json").exists():
        return dict(json.loads((work / "prepare.json").read_text()))
    work.mkdir(parents=True, exist_ok=True)
    corpus, queries, counts = corpus_and_queries(data, work, rows, n_queries)
    half = n_queries // 2
    rng = np.random.default_rng(7)
    questions, held = queries[: n_queries - half], queries[n_queries - half :]
    partial = [_partial(s, rng) for s in held]
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
    enc = Encoder(None, pooling="static")
    t = time.perf_counter()
    U = enc.encode(texts, batch_size=256, progress=False).astype(np.float32)
    encode_s = time.perf_counter() - t
    Uq = enc.encode(questions + partial, batch_size=256, progress=False).astype(np.float32)
    cal, spec = fit_for_index(U, "auto", pooling="static")
    space = SearchSpace(cal, spec)
    Z = space.project(U, want_density=False)[0]
    Zq = space.project(Uq, want_density=False)[0]
    np.save(work / "raw.npy", U)
    np.save(work / "raw_q.npy", Uq)
    np.save(work / "z.npy", Z)
    np.save(work / "z_q.npy", Zq)
    state = {k: np.asarray(v) for k, v in cal.state().items()} if hasattr(cal, "state") else {}
    np.savez(work / "calibrator.npz", **state)
    out = {
        "rows": len(U),
        "dim": int(U.shape[1]),
        "counts": counts,
        "queries": {"questions": len(questions), "partial_sentences": len(partial)},
        "examples": partial[:3],
        "encode_s": encode_s,
        "calibrator": spec.calibrator,
        "space": spec.space,
    }
    (work / "prepare.json").write_text(json.dumps(out, indent=1))
    return out


def _knob(index: Any, name: str, value: int) -> None:
    import faiss

    if name == "efSearch":
        faiss.downcast_index(index).hnsw.efSearch = value
    elif name == "nprobe":
        faiss.extract_index_ivf(index).nprobe = value
    elif name == "k_factor":
        faiss.downcast_index(index).k_factor = value


def _single_ms(index: Any, q: np.ndarray) -> float:
    times = []
    for i in range(len(q)):
        t = time.perf_counter()
        index.search(q[i : i + 1], 10)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000)


def _truth(q: np.ndarray, x: np.ndarray) -> np.ndarray:
    return harness.exact_top(q, x, 10)[1]


def _identity(work: Path) -> tuple[np.ndarray, np.ndarray]:
    """(v, u): corpus and queries of the exact inner-product twin of a linear calibrator."""
    from flowsearch.ann.identity import linear_twin

    st = np.load(work / "calibrator.npz")
    U, Uq = np.load(work / "raw.npy"), np.load(work / "raw_q.npy")
    return linear_twin(U, Uq, st["mu"], st["rotation"], st["scales"])


STRUCTURES: list[tuple[str, str, str, tuple[int, ...], tuple[str, ...]]] = [
    # (label, factory, knob, values, spaces)
    ("HNSW32", "HNSW32", "efSearch", (64, 128, 256, 512), ("searched", "identity")),
    ("IVF1024,Flat", "IVF1024,Flat", "nprobe", (16, 32, 64, 128, 256), ("searched", "identity")),
    ("IVF1024,RaBitQfs,RFlat k16", "IVF1024,RaBitQfs,RFlat", "nprobe", (16, 32, 64, 128),
     ("searched",)),
    ("HNSW32", "HNSW32", "efSearch", (64, 128, 256, 512), ("raw",)),
]  # fmt: skip


def _build(factory: str, x: np.ndarray, label: str) -> tuple[Any, float]:
    import faiss

    index = faiss.index_factory(x.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    t = time.perf_counter()
    if not index.is_trained:
        ivf = faiss.extract_index_ivf(index)
        ivf.cp.niter = 10
        ivf.cp.max_points_per_centroid = 64
        index.train(x)
    index.add(x)
    if "RFlat" in factory:
        faiss.downcast_index(index).k_factor = 16
    return index, time.perf_counter() - t


def _cached(work: Path, factory: str, space: str, x: np.ndarray, label: str) -> tuple[Any, float]:
    """The index of ``factory`` over ``x``, built once and kept in ``work`` (builds take minutes
    on the shared machine): ``(index, build seconds of the build that made it)``."""
    import faiss

    path = work / f"index_{factory.replace(',', '_')}_{space}.faiss"
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists():
        index = faiss.read_index(str(path))
        if "RFlat" in factory:
            faiss.downcast_index(index).k_factor = 16
        return index, float(json.loads(meta.read_text())["build_s"])
    index, build_s = _build(factory, x, label)
    faiss.write_index(index, str(path))
    meta.write_text(json.dumps({"build_s": build_s}))
    return index, build_s


def study(rows: int, only: str | None) -> dict[str, Any]:
    import faiss

    work = WORK / str(rows)
    Z, Zq = np.load(work / "z.npy"), np.load(work / "z_q.npy")
    U, Uq = np.load(work / "raw.npy"), np.load(work / "raw_q.npy")
    R = U / np.linalg.norm(U, axis=1, keepdims=True)
    Rq = Uq / np.linalg.norm(Uq, axis=1, keepdims=True)
    V, Vq = _identity(work)
    spaces = {
        "searched": (Z, Zq, _truth(Zq, Z)),
        "raw": (R, Rq, _truth(Rq, R)),
        "identity": (V, Vq, None),
    }
    truth_searched = spaces["searched"][2]
    assert truth_searched is not None
    id_truth = _truth(Vq, V)
    agree = harness.recall(id_truth, truth_searched)
    faiss.omp_set_num_threads(1)
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    flat = faiss.IndexFlatIP(Z.shape[1])
    flat.add(Z)
    flat_ms = _single_ms(flat, Zq[lat])
    results: list[dict[str, Any]] = []
    for label, factory, knob, values, names in STRUCTURES:
        if only and only not in label:
            continue
        for space_name in names:
            x, q, truth = spaces[space_name]
            truth = truth_searched if space_name == "identity" else truth
            assert truth is not None
            faiss.omp_set_num_threads(2)
            index, build_s = _cached(work, factory, space_name, x, label)
            faiss.omp_set_num_threads(1)
            for value in values:
                _knob(index, knob, value)
                found = index.search(q, 10)[1]
                r = harness.recall(found, truth)
                half = len(q) // 2
                ms = _single_ms(index, q[lat])
                results.append(
                    {
                        "structure": label,
                        "space": space_name,
                        "knob": f"{knob}={value}",
                        "recall": r,
                        "recall_questions": harness.recall(found[:half], truth[:half]),
                        "recall_partial": harness.recall(found[half:], truth[half:]),
                        "p50_ms": ms,
                        "speedup": flat_ms / ms,
                        "build_s": build_s,
                        "load": harness.load_average()[0],
                    }
                )
                print(json.dumps(results[-1]), flush=True)
            del index
    return {"flat_p50_ms": flat_ms, "identity_top10_agreement": agree, "curves": results}


NOISES = (0.0, 0.5, 0.8, 1.0, 1.2)
EFS = (16, 32, 64, 128, 256, 512)


def tune(rows: int, factory: str | None = None, curves: bool = True) -> dict[str, Any]:
    """``auto``'s index over the searched vectors and its tuner; then real queries at the knob
    it chose, and, knob by knob, recall of real queries beside the tuner's held-out queries at
    several noise norms (which noise makes the tuner's queries as hard as real ones)."""
    import faiss

    from flowsearch.ann import build as ann_build
    from flowsearch.ann.factory import auto_factory, new_index
    from flowsearch.settings import current

    work = WORK / str(rows)
    Z, Zq = np.load(work / "z.npy"), np.load(work / "z_q.npy")
    truth = _truth(Zq, Z)
    faiss.omp_set_num_threads(2)
    factory = factory or auto_factory(len(Z), dim=Z.shape[1])
    if factory == "HNSW32":
        index, build_s = _cached(work, factory, "searched", Z, factory)
    else:
        t = time.perf_counter()
        index = new_index(Z.shape[1], factory)
        ann_build.train(index, Z, factory)
        ann_build.add(index, Z, factory)
        build_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    pos = np.sort(rng.choice(len(Z), size=min(4096, len(Z)), replace=False))
    chunks = lambda: (Z[i : i + 65_536] for i in range(0, len(Z), 65_536))  # noqa: E731
    t = time.perf_counter()
    tuned = ann_build.tune(index, Z[pos], chunks, sample_rows=pos)
    tune_s = time.perf_counter() - t
    found = index.search(Zq, 10)[1]
    half = len(Zq) // 2
    faiss.omp_set_num_threads(1)
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    flat = faiss.IndexFlatIP(Z.shape[1])
    flat.add(Z)
    flat_ms = _single_ms(flat, Zq[lat])
    ms = _single_ms(index, Zq[lat])
    faiss.omp_set_num_threads(2)
    knob = ann_build.search_knob(index)
    curves: list[dict[str, Any]] = []
    if curves and knob is not None and knob[0] == "efSearch":
        probes = {}
        for noise in NOISES:
            q, pick = ann_build.held_out_queries(Z[pos], 1024, noise=noise, seed=1)
            src = pos[pick]
            tr = ann_build._drop_source(harness.exact_top(q, Z, 11)[1], src, 10)
            probes[noise] = (q, src, tr)
        for ef in EFS:
            faiss.downcast_index(index).hnsw.efSearch = ef
            row: dict[str, Any] = {
                "efSearch": ef,
                "real": harness.recall(index.search(Zq, 10)[1], truth),
            }
            for noise, (q, src, tr) in probes.items():
                f = ann_build._drop_source(index.search(q, 11)[1], src, 10)
                row[f"noise {noise:g}"] = harness.recall(f, tr)
            curves.append(row)
            print(json.dumps(row), flush=True)
    return {
        "factory": factory,
        "params": tuned.params,
        "build_s": build_s,
        "tune_s": tune_s,
        "noise": current().query_noise,
        "tuning": {
            "recall": tuned.recall,
            "tuned_recall": tuned.tuned_recall,
            "queries": tuned.queries,
        },
        "real_recall": harness.recall(found, truth),
        "real_recall_questions": harness.recall(found[:half], truth[:half]),
        "real_recall_partial": harness.recall(found[half:], truth[half:]),
        "p50_ms": ms,
        "flat_p50_ms": flat_ms,
        "speedup": flat_ms / ms,
        "noise_curves": curves,
    }


def segments(rows: int, n_segments: int = 10) -> dict[str, Any]:
    """The FAISS part of a dense query over ``n_segments`` equal segments (contiguous slices of
    the rows) against one segment: each segment indexed as ``auto`` indexes it (by its size)
    and, beside it, exactly (``Flat``); a query searches every segment for its top 10 and
    keeps the best 10 (as the searcher merges segments). p50 of one query at a time on one
    FAISS thread; recall@10 against exact search over all rows, real queries."""
    import faiss

    from flowsearch.ann import build as ann_build

    work = WORK / str(rows)
    Z, Zq = np.load(work / "z.npy"), np.load(work / "z_q.npy")
    truth = _truth(Zq, Z)
    lat = np.arange(len(Zq))[:: max(1, len(Zq) // LATENCY_QUERIES)]
    bounds = np.linspace(0, len(Z), n_segments + 1).astype(int)
    one, one_build_s = _cached(work, "HNSW32", "searched", Z, "HNSW32")
    one_params = ann_build.tune(
        one, Z[:: max(1, len(Z) // 4096)], lambda: iter([Z]),
        sample_rows=np.arange(0, len(Z), max(1, len(Z) // 4096)),
    ).params  # fmt: skip
    families: dict[str, list[tuple[Any, int]]] = {}
    built: dict[str, Any] = {}
    for family in ("auto", "Flat"):
        faiss.omp_set_num_threads(2)
        t = time.perf_counter()
        idx, chosen, factory = [], set(), ""
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            index, factory, params = ann_build.build(Z[lo:hi], family)
            idx.append((index, int(lo)))
            chosen.add(params)
        built[family] = {
            "build_s": time.perf_counter() - t, "factory": factory, "params": sorted(chosen)
        }  # fmt: skip
        families[family] = idx

    def search_all(idx: list[tuple[Any, int]], q: np.ndarray) -> np.ndarray:
        heap = faiss.ResultHeap(len(q), 10, keep_max=True)
        for index, lo in idx:
            d, i = index.search(q, 10)
            heap.add_result(d, np.where(i >= 0, i + lo, -1))
        heap.finalize()
        return np.asarray(heap.I)

    faiss.omp_set_num_threads(1)
    out: dict[str, Any] = {"segments": n_segments, "rows_per_segment": int(bounds[1])}
    one_ms = _single_ms(one, Zq[lat])
    out["one"] = {
        "factory": "HNSW32", "params": one_params, "build_s": one_build_s, "p50_ms": one_ms,
        "recall": harness.recall(one.search(Zq, 10)[1], truth),
    }  # fmt: skip
    for family, idx in families.items():
        times = []
        for i in lat:
            t = time.perf_counter()
            search_all(idx, Zq[i : i + 1])
            times.append(time.perf_counter() - t)
        ms = float(np.median(times) * 1000)
        out[family] = {
            **built[family], "p50_ms": ms, "ratio": ms / one_ms,
            "recall": harness.recall(search_all(idx, Zq), truth),
        }  # fmt: skip
        print(json.dumps(out[family]), flush=True)
    out["load"] = harness.load_average()
    return out


def render(out: dict[str, Any]) -> str:
    p = out["prepare"]
    body = [
        f"{p['rows']:,} rows of dim {p['dim']} (the speed corpus: {p['counts']}) encoded with "
        f"`static`, projected into the space `auto` fits (`{p['calibrator']}`, "
        f"{p['space']}); queries never in the corpus: {p['queries']['questions']} QNLI test "
        f"questions and {p['queries']['partial_sentences']} partial held-out sentences (a seeded "
        f"contiguous 40-70% of the words, e.g. {p['examples'][0]!r}). Truth: exact top-10 in "
        "the space searched. Latency: p50 of one query at a time on one FAISS thread, "
        f"{LATENCY_QUERIES} queries; speed-up = `Flat`'s p50 in the searched space / the "
        f"index's. x86_64, 2 cores shared with other jobs (1-minute load per row). "
        f"{out['machine']}",
        "",
    ]
    s = out.get("study")
    if s:
        body += [
            f"`Flat` (exact, searched space): p50 **{s['flat_p50_ms']:.2f} ms**. Identity twin "
            f"(`v = (x - mu)/|W(x - mu)|`, `u = W^T W (x_q - mu)`, exact inner product): top-10 "
            "agreement with the searched space's exact top-10 = "
            f"**{s['identity_top10_agreement']:.4f}**.",
            "",
            "| structure | space | knob | recall@10 (questions / partial) | p50 ms | x Flat "
            "| build s | load |",
            "|---|---|---|---|---:|---:|---:|---:|",
        ]
        for r in s["curves"]:
            body.append(
                f"| {r['structure']} | {r['space']} | {r['knob']} | {r['recall']:.3f} "
                f"({r['recall_questions']:.3f} / {r['recall_partial']:.3f}) | {r['p50_ms']:.3f} "
                f"| {r['speedup']:.1f} | {r['build_s']:.0f} | {r['load']:.1f} |"
            )
        body.append("")
    t = out.get("tune")
    if t:
        tu = t["tuning"]
        real = f"{t['real_recall']:.3f}"
        split = f"{t['real_recall_questions']:.3f} / {t['real_recall_partial']:.3f}"
        speed = f"{t['p50_ms']:.3f} / {t['flat_p50_ms']:.2f} ms = **{t['speedup']:.1f}x**"
        body += [
            "### `auto`'s tuning against real queries",
            "",
            "`auto`'s factory over the searched vectors, tuned by `flowsearch.ann.build.tune` "
            f"(held-out rows + noise {t['noise']:g}, each left out of its own answer; half to "
            "choose the knob, half to check it), then the real queries at the knob it chose.",
            "",
            "| figure | measured |",
            "|---|---|",
            f"| factory / params chosen | `{t['factory']}` / `{t['params']}` |",
            f"| tuning (exact answers + knob search) | {t['tune_s']:.1f} s |",
            f"| recall@10 on the tuning half / recorded (check half, {tu['queries']} queries) "
            f"| {tu['tuned_recall']:.3f} / **{tu['recall']:.3f}** |",
            f"| recall@10, real queries (questions / partial sentences) | **{real}** ({split}) |",
            f"| single-query p50, index / Flat | {speed} |",
            "",
        ]
        if t.get("noise_curves"):
            keys = [k for k in t["noise_curves"][0] if k.startswith("noise")]
            body += [
                "recall@10 by `efSearch`: real queries beside the tuner's held-out rows moved by "
                "noise of each norm (1,024 each; the noise that makes them no easier than real "
                "queries is the one to tune with):",
                "",
                "| efSearch | real queries | " + " | ".join(f"held-out, {k}" for k in keys) + " |",
                "|---:|---:|" + "---:|" * len(keys),
            ]
            for r in t["noise_curves"]:
                cells = " | ".join(f"{r[k]:.3f}" for k in keys)
                body.append(f"| {r['efSearch']} | {r['real']:.3f} | {cells} |")
            body.append("")
    g = out.get("segments")
    if g:
        body += [
            f"### {g['segments']} segments of {g['rows_per_segment']:,} rows against one segment",
            "",
            "The FAISS part of a dense query: every segment searched for its top 10, the best 10 "
            "kept (as the searcher merges segments); p50 of one query at a time on one FAISS "
            "thread; recall@10 against exact search over all rows, real queries. The encoder, "
            "the join and the lexical side are the same work for both layouts and are not in "
            f"these figures. Load at the end: {g['load']}.",
            "",
            "| layout | index per segment | params | build s | p50 ms | / one | recall@10 |",
            "|---|---|---|---:|---:|---:|---:|",
            f"| one segment | {g['one']['factory']} | `{g['one']['params']}` | "
            f"{g['one']['build_s']:.0f} | {g['one']['p50_ms']:.3f} | 1.00 | "
            f"{g['one']['recall']:.3f} |",
        ]
        for family in ("auto", "Flat"):
            r = g[family]
            body.append(
                f"| {g['segments']} segments, `{family}` | {r['factory']} | "
                f"`{', '.join(p for p in r['params'] if p) or '-'}` | {r['build_s']:.0f} | "
                f"{r['p50_ms']:.3f} | {r['ratio']:.2f} | {r['recall']:.3f} |"
            )
        body.append("")
    for line in out.get("notes", []):
        body.append(line)
    return harness.markdown(
        "ANN study: calibrated vs raw space, and tuning on real-like queries "
        "(`benchmarks/bench_ann_study.py`, issue 30)",
        body,
        out,
        "python benchmarks/bench_ann_study.py --stage all",
    )


def main() -> int:
    parser = harness.arguments(__doc__, "20,000 rows, 400 queries", "bench_ann_study")
    parser.add_argument(
        "--stage", default="all", choices=("prepare", "study", "tune", "segments", "all")
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--only", default=None, help="only structures whose label has this")
    parser.add_argument(
        "--no-curves", dest="curves", action="store_false",
        help="keep the saved noise curves of the tune stage (they do not depend on the tuner)",
    )  # fmt: skip
    args = harness.parse(parser, rows=20_000, queries=400)
    if harness.rendered(args, render):
        return 0
    data = harness.data_dir(args.data)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out_path = Path(args.out + ".json")
    out: dict[str, Any] = {}
    if out_path.exists() and not args.smoke:
        out = json.loads(out_path.read_text())
    out["machine"] = harness.machine()
    out["command"] = harness.command_line()
    out["prepare"] = prepare(data, args.rows, args.queries)
    if args.stage in ("tune", "all"):
        before = out.get("tune", {}).get("noise_curves", [])
        out["tune"] = tune(args.rows, curves=args.curves or not before)
        out["tune"]["noise_curves"] = out["tune"]["noise_curves"] or before
        harness.finish(args, render, out)
    if args.stage in ("segments", "all"):
        out["segments"] = segments(args.rows)
        harness.finish(args, render, out)
    if args.stage in ("study", "all"):
        out["study"] = study(args.rows, args.only)
    harness.finish(args, render, out)
    return 0


if __name__ == "__main__":
    harness.script(main)
