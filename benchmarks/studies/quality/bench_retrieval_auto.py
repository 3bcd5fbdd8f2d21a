r"""Issue 16, second round: which encoders ``auto`` should calibrate, and whether fitting the
calibrator on sample queries too helps.

Usage::

    python -m benchmarks run retrieval_auto [--data DIR] [--max-corpus N] [--m2v DIR] [--no-mean]
    python -m benchmarks run retrieval_auto --smoke    # 300 passages, static; no figures

Writes ``bench_retrieval_auto.json`` and ``.md`` beside it. Uses the dev sets and the vector
cache of ``bench_retrieval.py`` (same ``--max-corpus``, default 6000) and its
Model2Vec model (``--m2v``, distilled from the bundled model when missing).

Part A (the ``auto`` rule). For each (dev set, encoder): the corpus's anisotropy statistics
(:func:`~flowsearch.calibration.anisotropy.anisotropy_stats`) and exact dense nDCG@10 of the raw
vectors, partial whitening (``power=0.25``, what ``auto`` searches), full whitening, and of what
``auto`` decides (:func:`~flowsearch.space.fitting.fit_for_index` with the encoder's
pooling, as ``build_index`` calls it). Calibrators are fitted on the corpus's raw vectors.

Part B (fitting on queries). Queries are split by position (even: "fit half", odd: "test
half"). On the test half: raw; the calibrator fitted on passages only (today); fitted on
passages plus the fit half's queries. Measured for partial and full whitening on the static
encoders. In the symmetric sets every query is itself a passage, so there the queries add no new
texts, only weight: the asymmetric set (qnli-dev) is the one that tests the lever.

Part C (sentence splitting): the passages' sentence counts (a split at ``. ``/``? ``/``! ``
followed by a capital), to say whether fitting on passages' sentences can be measured here.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness, tables
from benchmarks.common.dev_sets import dev_sets
from benchmarks.common.harness import WORK, command_line, data_dir, load_average, markdown
from benchmarks.common.published_fusion import minmax_fusion
from benchmarks.studies.quality.bench_retrieval import (
    SETS,
    DevSet,
    dense_top,
    distil_model2vec,
    fit_named,
    load_sets,
    make_encoder,
    pooling_of,
    project,
    run_of,
    score_run,
)
from flowsearch.calibration.anisotropy import STATISTICS, anisotropy_stats
from flowsearch.evaluation.cache import VectorCache
from flowsearch.evaluation.ranking_metrics import ndcg_at_k
from flowsearch.space.fitting import fit_for_index

LOG = logging.getLogger("bench_retrieval_auto")

#: Encoders measured (labels as bench_retrieval's make_encoder reads them).
ENCODERS = ("static:raw", "static:layernorm", "model2vec", "embedding_layer", "mean")
#: The calibrations of part A and B: label -> (calibrator, config).
CALS: dict[str, tuple[str, dict[str, Any]]] = {
    "none": ("none", {}),
    "partial (p=0.25)": ("whitening", {"power": 0.25}),
    "whitening": ("whitening", {}),
}
FIT_LEVER_ENCODERS = ("static:raw", "model2vec")
_SENTENCE_END = re.compile(r"[.?!][\"')\]]?\s+(?=[A-Z])")


def subset(ds: DevSet, keep: np.ndarray) -> DevSet:
    """The same set with only the queries at positions ``keep``."""
    return replace(ds, query_ids=[ds.query_ids[i] for i in keep], query_rows=ds.query_rows[keep])


def ndcg(ds: DevSet, cal: Any, spec: Any, Uc: np.ndarray, Uq: np.ndarray) -> float:
    hits = dense_top(project(cal, spec, Uq), project(cal, spec, Uc), 101)
    return score_run(ds, *hits)["ndcg@10"]


def part_a(ds: DevSet, label: str, U: np.ndarray) -> dict[str, Any]:
    Uc, Uq = U[: ds.n_corpus], U[ds.query_rows]
    pooling = pooling_of(label)
    row: dict[str, Any] = {"set": ds.name, "encoder": label, "pooling": pooling}
    row["stats"] = {k: round(float(v), 4) for k, v in anisotropy_stats(Uc).items()}
    for cal_label, (name, cfg) in CALS.items():
        row[cal_label] = ndcg(ds, *fit_named(name, cfg, Uc), Uc, Uq)
    cal, spec = fit_for_index(Uc, "auto", pooling=pooling)
    row["auto"] = ndcg(ds, cal, spec, Uc, Uq)
    row["auto_searches"] = (
        f"{spec.calibrator} {dict(spec.config).get('power', '')}".strip()
        if spec.calibrated
        else "none"
    )
    row["decision"] = spec.decision
    LOG.info("A %s", row)
    return row


def per_query(ds: DevSet, hits: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """nDCG@10 of each of ``ds``'s queries (float64, in ``ds.query_ids`` order)."""
    got = ndcg_at_k(ds.qrels, run_of(ds, *hits), 10)
    return np.array([got.get(q, 0.0) for q in ds.query_ids])


def paired_ci(delta: np.ndarray, seed: int = 0, draws: int = 2000) -> list[float]:
    """95% bootstrap interval of the mean of per-query differences."""
    rng = np.random.default_rng(seed)
    means = delta[rng.integers(len(delta), size=(draws, len(delta)))].mean(axis=1)
    return [round(float(x), 4) for x in np.percentile(means, [2.5, 97.5])]


def part_b(ds: DevSet, label: str, U: np.ndarray, lexical: Any) -> dict[str, Any]:
    """Fitting on passages vs passages + half the queries, scored on the other half; dense and
    hybrid (``convex``, the second release's rule, at the Searcher's static dense weight)."""
    from flowsearch.search.fusion import DENSE_WEIGHT_STATIC

    weight = DENSE_WEIGHT_STATIC

    Uc = U[: ds.n_corpus]
    positions = np.arange(len(ds.query_ids))
    fit_half, test_half = positions[0::2], positions[1::2]
    test = subset(ds, test_half)
    Uq_fit, Uq_test = U[ds.query_rows[fit_half]], U[ds.query_rows[test_half]]
    lex = (lexical[0][test_half], lexical[1][test_half])
    new_texts = int(np.sum(ds.query_rows[fit_half] >= ds.n_corpus))
    row: dict[str, Any] = {"set": ds.name, "encoder": label, "fit_queries": len(fit_half),
                           "fit_queries_not_in_corpus": new_texts,
                           "test_queries": len(test_half),
                           "hybrid_weight": weight}  # fmt: skip
    per: dict[str, np.ndarray] = {}
    fits = {"passages": Uc, "passages+queries": np.concatenate([Uc, Uq_fit])}
    for cal_label, (name, cfg) in CALS.items():
        for fit_label, fit in fits.items():
            if name == "none" and fit_label != "passages":
                continue
            cal, spec = fit_named(name, cfg, fit)
            dense = dense_top(project(cal, spec, Uq_test), project(cal, spec, Uc), 101)
            fused = minmax_fusion(dense, lex, 101, weight=weight)
            for mode, hits in (("dense", dense), ("hybrid", (fused.scores, fused.rows))):
                key = f"{mode}: {cal_label} / {fit_label}" if name != "none" else f"{mode}: none"
                per[key] = per_query(test, hits)
                row[key] = round(float(per[key].mean()), 4)
    for mode in ("dense", "hybrid"):
        for cal_label in ("partial (p=0.25)", "whitening"):
            d = (
                per[f"{mode}: {cal_label} / passages+queries"]
                - per[f"{mode}: {cal_label} / passages"]
            )
            row[f"{mode}: {cal_label} / gain 95% CI"] = paired_ci(d)
    LOG.info("B %s", row)
    return row


_LEXICAL: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def lexical_hits(ds: DevSet) -> tuple[np.ndarray, np.ndarray]:
    """BM25's top 101 for every query of ``ds`` (the product's BM25 over one segment's
    postings), computed once."""
    if ds.name not in _LEXICAL:
        from flowsearch.lexical.bm25 import Bm25
        from flowsearch.lexical.postings import Postings

        lex = Bm25([(Postings.build(ds.texts[: ds.n_corpus]), None)])
        _LEXICAL[ds.name] = lex.search([ds.texts[r] for r in ds.query_rows], 101)
    return _LEXICAL[ds.name]


def part_c(ds: DevSet) -> dict[str, Any]:
    counts = np.array([len(_SENTENCE_END.split(t.strip())) for t in ds.texts[: ds.n_corpus]])
    return {"set": ds.name, "passages": int(len(counts)),
            "single_sentence_share": round(float(np.mean(counts == 1)), 4),
            "mean_sentences": round(float(counts.mean()), 3)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.arguments(__doc__, "300 passages, static encoders", "bench_retrieval_auto")
    parser.add_argument("--max-corpus", type=int, default=6000)
    parser.add_argument("--m2v", default=str(WORK / "m2v_minilm"), help="'none': skip Model2Vec")
    parser.add_argument("--no-mean", action="store_true", help="skip mean pooling (slow)")
    args = harness.parse(parser, argv, max_corpus=300, m2v="none", no_mean=True)
    if harness.rendered(args, render):
        return 0
    started = time.perf_counter()
    root, records = dev_sets(data_dir(args.data), args.max_corpus)
    sets = load_sets(root, SETS)
    cache = VectorCache(WORK / "cache")
    m2v = None if args.m2v == "none" else distil_model2vec(Path(args.m2v))
    labels = [
        x for x in ENCODERS if (x != "model2vec" or m2v) and (x != "mean" or not args.no_mean)
    ]
    report: dict[str, Any] = {"max_corpus": args.max_corpus, "sets": records,
                              "load_average_start": load_average(), "auto": [], "fit": [],
                              "sentences": [part_c(ds) for ds in sets]}  # fmt: skip
    for label in labels:
        encoder = make_encoder(label, m2v)
        for ds in sets:
            U = cache.encode(encoder, ds.texts, ds.name)
            report["auto"].append(part_a(ds, label, U))
            if label in FIT_LEVER_ENCODERS:
                report["fit"].append(part_b(ds, label, U, lexical_hits(ds)))
    report["load_average_end"] = load_average()
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["command"] = command_line()
    harness.finish(args, render, report)
    return 0


# -- report -----------------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def _delta(x: float) -> str:
    return f"{x:+.3f}"


def _change(rows: list[dict[str, Any]], key: str) -> tuple[float, float]:
    d = np.array([r[key] - r["none"] for r in rows])
    return float(d.min()), float(d.mean())


def findings(report: dict[str, Any]) -> list[str]:
    """The section's summary, every figure read from the report."""
    rows = report["auto"]
    by_enc = {e: [r for r in rows if r["encoder"] == e] for e in {r["encoder"] for r in rows}}
    out = ["What this shows (figures from this run's JSON):", ""]
    m2v = by_enc.get("model2vec")
    if m2v:
        cos = [r["stats"]["mean_cosine"] for r in m2v]
        pw, pm = _change(m2v, "partial (p=0.25)")
        fw, _ = _change(m2v, "whitening")
        out.append(
            f"- Model2Vec's mean cosine is {min(cos):.2f}-{max(cos):.2f}, under the 0.33 "
            f"threshold, yet partial whitening changes nDCG@10 by {pw:+.3f} at worst and "
            f"{pm:+.3f} on average over the sets (full whitening: {fw:+.3f} at worst). `auto` "
            "now calibrates non-contextual poolings (`static`, Model2Vec, `embedding_layer`) by "
            "their kind."
        )
    for enc in ("static:raw", "embedding_layer", "model2vec"):
        if enc in by_enc:
            w, m = _change(by_enc[enc], "auto")
            out.append(f"- `{enc}`: `auto` vs raw {w:+.3f} at worst, {m:+.3f} on average.")
    if "mean" in by_enc:
        w, _ = _change(by_enc["mean"], "partial (p=0.25)")
        cos = [r["stats"]["mean_cosine"] for r in by_enc["mean"]]
        searched = {r["auto_searches"] for r in by_enc["mean"]}
        out.append(
            f"- `mean` (contrastive; mean cosine {min(cos):.2f}-{max(cos):.2f}) stays raw "
            f"(`auto` searches: {', '.join(sorted(searched))}); even partial whitening would "
            f"cost it {w:+.3f} on one set."
        )
    for r in report["fit"]:
        if r["fit_queries_not_in_corpus"] == 0:
            continue
        key = "partial (p=0.25)"
        for mode in ("dense", "hybrid"):
            gain = r[f"{mode}: {key} / passages+queries"] - r[f"{mode}: {key} / passages"]
            lo, hi = r[f"{mode}: {key} / gain 95% CI"]
            out.append(
                f"- Fitting on passages + half of {r['set']}'s questions, `{r['encoder']}` "
                f"{mode}: {gain:+.3f} nDCG@10 on the other half ({lo:+.3f} to {hi:+.3f})."
            )
    single = [r["single_sentence_share"] for r in report["sentences"]]
    out.append(
        f"- {min(single):.0%}-{max(single):.0%} of the passages are a single sentence: fitting "
        "on passages' sentences cannot be measured on these sets."
    )
    return out


def render(report: dict[str, Any]) -> str:
    rows = report["auto"]
    lines = [
        *findings(report),
        "",
        f"Dev sets at most {report['max_corpus']:,} passages; exact dense search; nDCG@10. "
        f"Calibrators fitted on the corpus's raw vectors. Load average "
        f"{report['load_average_start'][0]} at the start, {report['load_average_end'][0]} at "
        f"the end (2 shared cores); {report['seconds']:.0f} s.",
        "",
        "### A. Raw vs partial vs full whitening, and what `auto` now searches",
        "",
        *tables.head(["encoder", "set", "mean cosine", "top1 var", "raw", "partial (0.25)",
                      "whitening", "auto", "auto - raw", "auto searches"], "llrrrrrrrl"),
    ]  # fmt: skip
    for r in rows:
        lines.append(tables.row([
            f"`{r['encoder']}`", r["set"], f"{r['stats']['mean_cosine']:.3f}",
            f"{r['stats']['top1_var']:.3f}", _fmt(r["none"]), _fmt(r["partial (p=0.25)"]),
            _fmt(r["whitening"]), _fmt(r["auto"]), _delta(r["auto"] - r["none"]),
            r["auto_searches"],
        ]))  # fmt: skip
    lines += ["", "Per encoder, worst and mean change against raw over the sets:", "",
              *tables.head(["encoder", "partial: worst / mean", "whitening: worst / mean",
                            "auto: worst / mean"], "lrrr")]  # fmt: skip
    for enc in dict.fromkeys(r["encoder"] for r in rows):
        mine = [r for r in rows if r["encoder"] == enc]
        cells = []
        for key in ("partial (p=0.25)", "whitening", "auto"):
            d = np.array([r[key] - r["none"] for r in mine])
            cells.append(f"{_delta(d.min())} / {_delta(d.mean())}")
        lines.append(tables.row([f"`{enc}`", *cells]))
    lines += [
        "",
        "Anisotropy statistics of the corpora (the candidates for a rule):",
        "",
        *tables.head(["encoder", "set", *STATISTICS], "ll" + "r" * len(STATISTICS)),
    ]
    for r in rows:
        lines.append(tables.row([f"`{r['encoder']}`", r["set"],
                                 *(f"{r['stats'][s]:.3f}" for s in STATISTICS)]))  # fmt: skip
    lines += ["", "### B. Fitting on passages vs passages + the set's queries", "",
              "Queries split by position: the even ones join the fit, the odd ones are scored "
              "(nDCG@10 on the odd half only). In the symmetric sets the queries are passages "
              "already (column 'new texts'), so only qnli-dev adds unseen text. Hybrid is the "
              "Searcher's convex fusion with BM25 at the static dense weight. Gains in brackets "
              "with a 95% paired bootstrap interval over the scored queries.", "",
              *tables.head(["encoder", "set", "fit queries (new texts)", "mode", "raw",
                            "partial: passages", "partial: + queries", "whitening: passages",
                            "whitening: + queries"], "llrlrrrrr")]  # fmt: skip
    for r in report["fit"]:
        for mode in ("dense", "hybrid"):
            cells = [_fmt(r[f"{mode}: none"])]
            for cal in ("partial (p=0.25)", "whitening"):
                p0, p1 = r[f"{mode}: {cal} / passages"], r[f"{mode}: {cal} / passages+queries"]
                lo, hi = r[f"{mode}: {cal} / gain 95% CI"]
                cells += [_fmt(p0), f"{_fmt(p1)} ({_delta(p1 - p0)}; {lo:+.3f} to {hi:+.3f})"]
            lines.append(
                tables.row(
                    [
                        f"`{r['encoder']}`",
                        r["set"],
                        f"{r['fit_queries']} ({r['fit_queries_not_in_corpus']})",
                        mode,
                        *cells,
                    ]
                )
            )
    lines += [
        "",
        "### C. Can fitting on passages' sentences be measured here?",
        "",
        *tables.head(["set", "passages", "single-sentence share", "mean sentences"], "lrrr"),
    ]
    for r in report["sentences"]:
        lines.append(tables.row([r["set"], f"{r['passages']:,}",
                                 f"{r['single_sentence_share']:.3f}",
                                 f"{r['mean_sentences']:.2f}"]))  # fmt: skip
    title = "`auto` per encoder kind, and fitting on queries (`bench_retrieval_auto.py`)"
    default = f"python -m benchmarks run retrieval_auto --max-corpus {report['max_corpus']}"
    return markdown(title, lines, report, default) + "\n"


if __name__ == "__main__":
    harness.script(main)
