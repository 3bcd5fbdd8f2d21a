r"""Retrieval study on the dev sets (issue 16): static variants, calibration strength, ``auto``,
the hybrid weight, and the calibrated static tier.

Usage::

    python -m benchmarks run retrieval [--data DIR] [--quick] [--max-corpus N] [--m2v DIR]
        [--no-mean]
    python -m benchmarks run retrieval --smoke    # 300 passages, static only, no figures

Writes ``bench_retrieval.json`` (every measured row) and ``bench_retrieval.md`` (the tables)
beside it. The dev sets are made from ``--data``
(``$FLOWSEARCH_DATA``, else ``../shared/data``) by ``benchmarks/common/dev_sets.py`` with
``--max-corpus`` (default 6000; ``--quick``: 2000) into ``benchmarks/_work/dev_sets_N``
(git-ignored). Vectors are cached in ``benchmarks/_work/cache``
(:class:`~flowsearch.evaluation.cache.VectorCache`), so each (set, pooling) is encoded once.

Method. Every (set, encoder) is encoded once; each calibrator is fitted on the corpus's raw vectors
(the "target" setting) and queries are projected by the library's
:class:`~flowsearch.space.search_space.SearchSpace` (L2-normalised). Dense search is exact
(``faiss.contrib.exhaustive_search.knn``, inner product over every passage, top 100); lexical
search is the product's :class:`~flowsearch.lexical.bm25.Bm25` over one segment's postings (stemmed
BM25); hybrid is ``minmax_fusion`` (benchmarks/common/published_fusion.py; or ``rrf_fusion``)
over 100 candidates a side,
as ``Searcher.search`` did until the third release (which fuses with
:func:`~flowsearch.search.fusion.fuse`: ``bench_fusion.py`` measures both). Symmetric sets fetch
one hit more and drop the query's own id (``ignore_identical_ids``). Metrics are
:func:`flowsearch.evaluation.ranking_metrics.retrieval_scores` (nDCG@10, recall@100, MRR@10). One
configuration is re-run through the full product path
(:func:`~flowsearch.evaluation.retrieval.run_retrieval`: build_index + Searcher) as a check.

A Model2Vec model distilled from the bundled model (``--m2v DIR``; made by
``model2vec.distill.distill`` with its defaults when ``DIR`` does not exist, which needs the
``distill`` extra of model2vec) is measured as a static encoder too.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import dev_sets, harness
from benchmarks.common.encoders import distil_model2vec
from benchmarks.common.published_fusion import minmax_fusion, rrf_fusion
from flowsearch.calibration import make_calibrator
from flowsearch.evaluation.beir import load_beir
from flowsearch.evaluation.cache import VectorCache
from flowsearch.evaluation.ranking_metrics import retrieval_scores
from flowsearch.space.fitting import fit_for_index
from flowsearch.space.search_space import SearchSpace
from flowsearch.storage.manifest import CalibrationSpec

LOG = logging.getLogger("bench_retrieval")

SETS = harness.DEV_SETS
K = 100
METRICS = ("ndcg@10", "recall@100", "mrr@10")
STATIC_ENCODERS = ("static:raw", "static:raw+special", "static:layernorm",
                   "static:layernorm+special", "embedding_layer")  # fmt: skip
#: calibrations measured on every encoder: label -> (calibrator name, config)
BASE_CALS: dict[str, tuple[str, dict[str, Any]]] = {
    "none": ("none", {}),
    "whitening": ("whitening", {}),
    "partial (p=0.25)": ("whitening", {"power": 0.25}),
}
#: the strength sweep (on the chosen static variant, Model2Vec and mean)
STRENGTHS: dict[str, tuple[str, dict[str, Any]]] = {
    "p=0.375": ("whitening", {"power": 0.375}),
    "p=0.125": ("whitening", {"power": 0.125}),
    "shrink 0.02": ("whitening", {"shrinkage": 0.02}),
    "shrink 0.1": ("whitening", {"shrinkage": 0.1}),
    "shrink 0.5": ("whitening", {"shrinkage": 0.5}),
    "whitening-flow": ("whitening-flow", {"seed": 0}),
    "flow": ("flow", {"seed": 0}),
}
WEIGHTS = tuple(round(w, 1) for w in np.linspace(0.0, 1.0, 11))


@dataclass
class DevSet:
    """One dev set in memory, with the rows of the vectors ``encode`` returns."""

    name: str
    doc_ids: list[str]
    texts: list[str]  # corpus texts, then the queries not found in the corpus
    n_corpus: int
    query_ids: list[str]
    query_rows: np.ndarray  # int64 row of each query's text in ``texts``
    qrels: dict[str, dict[str, int]]
    ignore_identical: bool


def load_sets(root: Path, names: Sequence[str]) -> list[DevSet]:
    out = []
    for name in names:
        ds = load_beir(root / name)
        info = json.loads((root / name / "dataset.json").read_text())
        texts = list(ds.texts)
        row_of = {t: i for i, t in enumerate(texts)}
        rows = []
        for text in ds.queries.values():
            if text not in row_of:
                row_of[text] = len(texts)
                texts.append(text)
            rows.append(row_of[text])
        out.append(DevSet(name, list(ds.doc_ids), texts, len(ds.doc_ids), list(ds.queries),
                          np.array(rows, np.int64), ds.qrels,
                          bool(info["ignore_identical_ids"])))  # fmt: skip
    return out


# -- searching --------------------------------------------------------------------------------


def dense_top(Zq: np.ndarray, Zc: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k: (scores float32 (q, k), rows int64 (q, k)), best first."""
    return harness.exact_top(Zq, Zc, k)


def run_of(ds: DevSet, scores: np.ndarray, rows: np.ndarray) -> dict[str, dict[str, float]]:
    """A (q, >= K [+1]) ranking as a run: each query's top K ids, its own id dropped in the
    symmetric sets (BEIR's ``ignore_identical_ids``)."""
    run: dict[str, dict[str, float]] = {}
    for qid, srow, rrow in zip(ds.query_ids, scores, rows, strict=True):
        docs = [(ds.doc_ids[r], float(s)) for s, r in zip(srow, rrow, strict=True) if r >= 0]
        if ds.ignore_identical:
            docs = [(d, s) for d, s in docs if d != qid]
        run[qid] = dict(docs[:K])
    return run


def score_run(ds: DevSet, scores: np.ndarray, rows: np.ndarray) -> dict[str, float]:
    """nDCG@10 / recall@100 / MRR@10 of a (q, >= K [+1]) ranking."""
    out = retrieval_scores(ds.qrels, run_of(ds, scores, rows))
    return {m: round(out[m], 4) for m in METRICS}


def project(cal: Any, spec: CalibrationSpec, U: np.ndarray) -> np.ndarray:
    return SearchSpace(cal, spec).project(U, want_density=False)[0]


def fit_named(name: str, config: dict[str, Any], Uc: np.ndarray) -> tuple[Any, CalibrationSpec]:
    cal = make_calibrator(name, **config).fit(Uc)
    space = "encoder" if name == "none" else "calibrated"
    return cal, CalibrationSpec(name=name, calibrator=name, space=space)


class Study:
    """Holds the encoded vectors and the lexical runs, and collects result rows."""

    def __init__(self, sets: list[DevSet], cache: VectorCache) -> None:
        self.sets = sets
        self.cache = cache
        self.vectors: dict[tuple[str, str], np.ndarray] = {}
        self.lexical: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.rows: list[dict[str, Any]] = []
        self.encode_seconds: dict[str, float] = {}

    def encode(self, label: str, encoder: Any) -> None:
        for ds in self.sets:
            started = time.process_time()
            self.vectors[ds.name, label] = self.cache.encode(encoder, ds.texts, ds.name)
            self.encode_seconds[f"{ds.name}/{label}"] = round(time.process_time() - started, 2)

    def split(self, ds: DevSet, label: str) -> tuple[np.ndarray, np.ndarray]:
        U = self.vectors[ds.name, label]
        return U[: ds.n_corpus], U[ds.query_rows]

    def dense(self, ds: DevSet, label: str, cal_label: str, cal: Any, spec: CalibrationSpec,
              **extra: Any) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        Uc, Uq = self.split(ds, label)
        hits = dense_top(project(cal, spec, Uq), project(cal, spec, Uc), K + 1)
        self.add(ds, label, cal_label, "dense", score_run(ds, *hits), **extra)
        return hits

    def lexical_hits(self, ds: DevSet) -> tuple[np.ndarray, np.ndarray]:
        if ds.name not in self.lexical:
            from flowsearch.lexical.bm25 import Bm25
            from flowsearch.lexical.postings import Postings

            lex = Bm25([(Postings.build(ds.texts[: ds.n_corpus]), None)])  # one segment
            queries = [ds.texts[r] for r in ds.query_rows]
            self.lexical[ds.name] = lex.search(queries, K + 1)
            self.add(ds, "bm25", "-", "lexical", score_run(ds, *self.lexical[ds.name]))
        return self.lexical[ds.name]

    def hybrid(self, ds: DevSet, label: str, cal_label: str, dense: Any,
               weights: Sequence[float]) -> None:  # fmt: skip
        lexical = self.lexical_hits(ds)
        for w in weights:
            fused = minmax_fusion(dense, lexical, K + 1, weight=float(w))
            self.add(ds, label, cal_label, "hybrid", score_run(ds, fused.scores, fused.rows),
                     weight=float(w))  # fmt: skip
        fused = rrf_fusion(dense, lexical, K + 1)
        self.add(ds, label, cal_label, "hybrid-rrf", score_run(ds, fused.scores, fused.rows))

    def add(self, ds: DevSet, encoder: str, calibration: str, mode: str,
            metrics: dict[str, float], **extra: Any) -> None:  # fmt: skip
        row = {"set": ds.name, "encoder": encoder, "calibration": calibration, "mode": mode,
               **extra, **metrics}  # fmt: skip
        LOG.info("%s", row)
        self.rows.append(row)

    def find(self, **match: Any) -> list[dict[str, Any]]:
        return [r for r in self.rows if all(r.get(k) == v for k, v in match.items())]

    def value(self, metric: str = "ndcg@10", **match: Any) -> float | None:
        found = self.find(**match)
        return found[-1][metric] if found else None


# -- the parts of the study -------------------------------------------------------------------


def make_encoder(label: str, m2v: Path | None) -> Any:
    from flowsearch.encode.encoder import Encoder

    if label.startswith("static:"):
        return Encoder(pooling="static", static_variant=label.split(":", 1)[1])
    if label == "model2vec":
        return Encoder(model=str(m2v), pooling="static")
    return Encoder(pooling=label)


def pooling_of(label: str) -> str:
    """The encoder pooling behind a label (Model2Vec and the static variants are ``static``)."""
    return "static" if label.startswith("static:") or label == "model2vec" else label


def auto_dense(study: Study, ds: DevSet, label: str) -> tuple[Any, dict[str, Any]]:
    """Dense search with ``calibration="auto"`` as an index would build it."""
    Uc, _ = study.split(ds, label)
    cal, spec = fit_for_index(Uc, "auto", pooling=pooling_of(label))
    chosen = spec.calibrator if spec.calibrated else "none"
    cfg = {k: v for k, v in spec.config.items() if k in ("power", "shrinkage")}
    hits = study.dense(ds, label, "auto", cal, spec, chosen=chosen, chosen_config=cfg,
                       mean_cosine=round(spec.anisotropy["mean_cosine"], 4))  # fmt: skip
    return hits, {"chosen": chosen, "config": cfg, "decision": spec.decision}


def speed(texts: list[str], m2v: Path | None) -> dict[str, Any]:
    """Encoding rows per CPU second and per wall second, static vs mean, same texts, uncached."""
    chars = round(float(np.mean([len(t) for t in texts])), 1)
    out: dict[str, Any] = {"texts": len(texts), "mean_chars": chars,
                           "load_average": round(os.getloadavg()[0], 2),
                           "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}  # fmt: skip
    labels = ["static:raw", "mean"] + (["model2vec"] if m2v else [])
    for label in labels:
        enc = make_encoder(label, m2v)
        enc.encode(texts[:64], progress=False)  # load the model / table first
        cpu, wall = time.process_time(), time.perf_counter()
        enc.encode(texts, progress=False)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        out[label] = {"rows_per_cpu_s": round(len(texts) / cpu, 1),
                      "rows_per_wall_s": round(len(texts) / wall, 1)}  # fmt: skip
    out["static_over_mean_cpu"] = round(
        out["static:raw"]["rows_per_cpu_s"] / out["mean"]["rows_per_cpu_s"], 1
    )
    return out


def product_weights() -> tuple[float, float]:
    """The Searcher's hybrid dense weights (transformer, static): ``settings`` since the third
    release, which fuses with :func:`flowsearch.search.fusion.fuse`."""
    from flowsearch.search.fusion import DENSE_WEIGHT, DENSE_WEIGHT_STATIC

    return DENSE_WEIGHT, DENSE_WEIGHT_STATIC


def product_check(ds_dir: Path, label: str, study: Study, ds: DevSet) -> dict[str, Any]:
    """One configuration through build_index + Searcher, beside this script's own figures.

    Dense (calibration ``none``, an exact index at these sizes) and lexical must agree with this
    script's; the product's hybrid is :func:`~flowsearch.search.fusion.fuse` (scores with a
    meaning) at the Searcher's weight, shown beside this script's ``convex`` at that weight:
    since the third release they are different rules (``bench_fusion.py`` compares them)."""
    from flowsearch.evaluation.retrieval import run_retrieval

    pooling, _, variant = label.partition(":")
    if variant not in ("", "raw"):
        return {}
    modes = ["dense", "lexical", "hybrid"]
    result = run_retrieval(ds_dir, pooling=pooling, calibration="none", modes=modes,
                           ignore_identical_ids=ds.ignore_identical)  # fmt: skip
    transformer, static = product_weights()
    weight = static if pooling == "static" else transformer  # as the Searcher
    mine = {
        "dense": study.find(set=ds.name, encoder=label, calibration="none", mode="dense")[-1],
        "lexical": study.find(set=ds.name, mode="lexical")[-1],
        "hybrid": study.find(
            set=ds.name, encoder=label, calibration="none", mode="hybrid", weight=weight
        )[-1],  # fmt: skip
    }
    return {"set": ds.name, "encoder": label, "calibration": "none", "weight": weight,
            "hybrid_rules": {"product": "fuse", "this_script": "convex"},
            "product": {m: {k: round(v, 4) for k, v in result["results"][m].items()}
                        for m in modes},
            "this_script": {m: {k: r[k] for k in METRICS} for m, r in mine.items()}}  # fmt: skip


def sts_check(
    data: str, labels: Sequence[str], m2v: Path | None, cache: VectorCache
) -> dict[str, Any]:
    """STS-B test Spearman x 100 of raw, the old auto (whitening-flow), full and partial
    whitening, and of what ``auto`` searches now, per encoder (fitted on STS-B's sentences)."""
    from flowsearch.evaluation.metrics import cosine_pairs, spearman100
    from flowsearch.evaluation.session import EvalSession

    out: dict[str, Any] = {}
    for label in labels:
        session = EvalSession(make_encoder(label, m2v), data, cache=cache)
        fit = session.fit_vectors("STSB")
        a, b = session.pair_vectors("STSB")
        gold = session.task("STSB").pairs.scores
        row: dict[str, Any] = {}
        for cal_label, (name, cfg) in {
            **BASE_CALS,
            "whitening-flow": STRENGTHS["whitening-flow"],
        }.items():
            cal = make_calibrator(name, **cfg).fit(fit)
            row[cal_label] = round(
                spearman100(cosine_pairs(cal.transform(a), cal.transform(b)), gold), 2
            )
        cal, spec = fit_for_index(fit, "auto", pooling=pooling_of(label))
        pa, pb = project(cal, spec, a), project(cal, spec, b)
        row["auto"] = round(spearman100(cosine_pairs(pa, pb), gold), 2)
        row["auto_searches"] = spec.calibrator if spec.calibrated else "none"
        row["mean_cosine"] = round(spec.anisotropy["mean_cosine"], 3)
        out[label] = row
    return out


def static_variants(study: Study, m2v: Path | None) -> None:
    """Part 1: every static variant x {none, whitening, partial}, and ``embedding_layer``."""
    for label in STATIC_ENCODERS:
        study.encode(label, make_encoder(label, m2v))
        for ds in study.sets:
            for cal_label, (name, cfg) in BASE_CALS.items():
                study.dense(ds, label, cal_label, *fit_named(name, cfg, study.split(ds, label)[0]))


def strength_sweep(study: Study, labels: list[str], default_variant: str, quick: bool) -> None:
    """Part 2: whitening power and shrinkage, and the flows, on the chosen encoders."""
    strengths = dict(STRENGTHS)
    if quick:
        strengths = {k: v for k, v in strengths.items() if k in ("shrink 0.1", "whitening-flow")}
    for label in labels:
        for ds in study.sets:
            cals = strengths if label == default_variant else {**BASE_CALS, **strengths}
            for cal_label, (name, cfg) in cals.items():
                if name == "flow" and label == "mean":
                    continue  # the paper's flow on a contrastive encoder: RESULTS.md has it
                study.dense(ds, label, cal_label, *fit_named(name, cfg, study.split(ds, label)[0]))


def autos_and_hybrid(
    study: Study, labels: list[str], default_variant: str, weights: Sequence[float]
) -> dict[str, Any]:
    """Parts 3-5: ``auto`` per (set, encoder), and hybrid on top of what it searches."""
    autos: dict[str, Any] = {}
    for label in labels:
        for ds in study.sets:
            hits, autos[f"{ds.name}/{label}"] = auto_dense(study, ds, label)
            if label in (default_variant, "mean", "model2vec"):
                study.hybrid(ds, label, "auto", hits, weights)
                if label != "mean":
                    raw = study.dense(
                        ds, label, "none", *fit_named("none", {}, study.split(ds, label)[0])
                    )
                    study.hybrid(ds, label, "none", raw, weights)
    for ds in study.sets:
        study.lexical_hits(ds)
    return autos


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.arguments(__doc__, "300 passages, static encoders only", "bench_retrieval")
    parser.add_argument("--quick", action="store_true", help="2000-passage sets, fewer configs")
    parser.add_argument("--max-corpus", type=int, default=None)
    parser.add_argument(
        "--m2v", default=str(harness.WORK / "m2v_minilm"), help="'none': skip Model2Vec"
    )
    parser.add_argument("--no-mean", action="store_true", help="skip mean pooling (slow)")
    args = harness.parse(parser, argv, max_corpus=300, quick=True, m2v="none", no_mean=True)
    from benchmarks.studies.quality.bench_retrieval_report import render

    if harness.rendered(args, render):
        return 0
    data = harness.data_dir(args.data)
    max_corpus = args.max_corpus or (2000 if args.quick else 6000)
    root, records = dev_sets.dev_sets(data, max_corpus)
    sets = load_sets(root, SETS)
    study = Study(sets, VectorCache(harness.WORK / "cache"))
    m2v = None if args.m2v == "none" else distil_model2vec(Path(args.m2v))
    from flowsearch.encode.encoder import Encoder

    static_variants(study, m2v)
    variant = inspect.signature(Encoder).parameters["static_variant"].default
    default_variant = f"static:{variant}"
    others = (["model2vec"] if m2v else []) + ([] if args.no_mean else ["mean"])
    for label in others:
        study.encode(label, make_encoder(label, m2v))
    strength_sweep(study, [default_variant, *others], default_variant, args.quick)
    weights = (0.0, 0.3, 0.5, 0.7, 1.0) if args.quick else WEIGHTS
    weights = tuple(sorted({*weights, *product_weights()}))  # the product check's too
    autos = autos_and_hybrid(study, [*STATIC_ENCODERS, *others], default_variant, weights)
    n_speed = 64 if args.smoke else 500 if args.quick else 1500
    timing = speed(sets[0].texts[:n_speed], m2v)
    check = product_check(root / "sick-para", default_variant, study, sets[2])
    # mean is left out: auto keeps it raw (mean cosine 0.02), 82.03 in RESULTS.md
    sts_labels = [default_variant, "embedding_layer"] + (["model2vec"] if m2v else [])
    sts = {} if args.smoke else sts_check(str(data), sts_labels, m2v, study.cache)
    report = {
        "sts": sts,
        "max_corpus": max_corpus,
        "sets": records,
        "default_static_variant": default_variant,
        "model2vec": str(m2v) if m2v else None,
        "auto": autos,
        "speed": timing,
        "product_check": check,
        "hybrid_weights": dict(zip(("transformer", "static"), product_weights(), strict=True)),
        "encode_cpu_seconds": study.encode_seconds,
        "load_average_end": harness.load_average(),
        "command": harness.command_line(),
        "rows": study.rows,
    }
    harness.finish(args, render, report)
    return 0


if __name__ == "__main__":
    harness.script(main)
