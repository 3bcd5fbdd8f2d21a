r"""The STS / QNLI benchmark sweep: writes its report beside it, ``sts_results.json`` and
``sts_results.md`` in ``benchmarks/quality/`` (tables in the layouts of Li et al. 2020,
Tables 2, 4, 5, 6 and Figure 2, spectra, and the "when does calibration help?" study that sets
``calibration="auto"``); its figures go to ``benchmarks/figures/``.

Usage (the default sweep takes under 30 minutes on 2 CPU cores)::

    FLOWSEARCH_DATA=../shared/data .venv/bin/python -m benchmarks run sts
    # the tiny test model, mean pooling only, into benchmarks/_work/smoke/sts (minutes):
    .venv/bin/python -m benchmarks run sts --smoke
    # the paper's own setting, for a user who has bert-base-uncased:
    .venv/bin/python -m benchmarks run sts --model bert-base-uncased --max-length 64 \
        --text senteval --poolings mean,first_last_avg,cls --no-study

Each dataset is encoded once for every pooling at a time (one forward pass, see
``sts_encoding.py``) and cached on disk, so re-running costs only the calibrator fits.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.harness import HERE, ROOT, WORK, data_dir
from benchmarks.quality.sts_analysis import (
    choose_rule,
    edit_distance,
    lexical_table,
    plot_lexical_scatter,
    plot_spectra,
    plot_study,
    random_model_dir,
    spectrum,
)
from benchmarks.quality.sts_encoding import MultiPoolEncoder
from benchmarks.quality.sts_report import render
from flowsearch.calibration import make_calibrator
from flowsearch.calibration.anisotropy import STATISTICS, anisotropy_stats
from flowsearch.evaluation import (
    EvalSession,
    PairSet,
    VectorCache,
    load_sick,
    load_stsb,
)
from flowsearch.evaluation.datasets import unique_texts
from flowsearch.evaluation.metrics import cosine_pairs, spearman100
from flowsearch.evaluation.session import STS_TASKS

#: This script's folder: its report is written here.
FOLDER = Path(__file__).resolve().parent
#: The figures' folder (``benchmarks/figures``); the report links them relative to ``FOLDER``.
FIGURES = HERE / "figures"

LOG = logging.getLogger("run_sts")

TABLE2_CALS = ("none", "whitening", "whitening-k", "flow", "whitening-flow", "flow-nli")
TABLE5_CALS = ("none", "sn", "natsv", "sn-natsv", "whitening", "flow", "whitening-flow")
QNLI_CALS = ("none", "whitening", "flow", "whitening-flow", "flow-nli")
#: Calibrators of the "when does calibration help" study (fitted on STS-B dev+test).
STUDY_CALS = ("flow", "whitening", "whitening-flow")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF id or local dir (default: bundled MiniLM)")
    p.add_argument("--data", default=None, help="evaluation data (default $FLOWSEARCH_DATA)")
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--text", choices=("raw", "senteval"), default="raw")
    p.add_argument(
        "--poolings",
        default="mean,first_last_avg,last2avg,embedding_layer",
        help="poolings with the full Table 2 (all 7 STS tasks)",
    )
    p.add_argument("--qnli-poolings", default="mean")
    p.add_argument(
        "--study",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the 'when does calibration help' study (adds cls + random models)",
    )
    p.add_argument(
        "--variants",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="STS-B none/mean under other text variants and max_length values",
    )
    p.add_argument(
        "--nli-sentences",
        type=int,
        default=10000,
        help="SNLI sentences the flow-nli setting fits on (0: all)",
    )
    p.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite sts_results.md from sts_results.json without running anything",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", default=str(FOLDER), help="folder of the JSON and markdown report")
    p.add_argument("--cache", default=None, help="vector cache folder")
    p.add_argument("--smoke", action="store_true", help="tiny test model, mean only, no figures")
    args = p.parse_args(argv)
    if args.smoke:
        args.model = str(ROOT / "tests" / "assets" / "tiny_bert")
        args.poolings, args.qnli_poolings, args.study, args.variants = "mean", "mean", False, False
        args.nli_sentences, args.out = 500, str(WORK / "smoke" / "sts")
        args.cache = args.cache or str(WORK / "smoke" / "cache")
    if not args.render_only:
        args.data = str(data_dir(args.data))
    return args


def _views(model: str | None, max_length: int | None, poolings: list[str]):
    """Per-pooling encoders sharing one forward pass (``Encoder.encode_poolings``)."""
    multi = MultiPoolEncoder(model, max_length, poolings)
    return {p: multi.view(p) for p in poolings}, multi


def _flow_ll_gain(U: np.ndarray, seed: int) -> float:
    """Flow log-likelihood minus a diagonal Gaussian's, nats/dim, on the non-constant dims."""
    X = np.asarray(U, dtype=np.float64)
    std = X.std(axis=0)
    X = X[:, std > 1e-6 * std.max()]
    var = X.var(axis=0)
    diag = float(np.mean(-0.5 * (np.log(2 * np.pi * var) + 1.0)))
    cal = make_calibrator("flow", seed=seed).fit(X)
    return float(cal.log_prob(X).mean() / X.shape[1] - diag)


def _stsb_variants(args: argparse.Namespace, cache: VectorCache) -> dict[str, float]:
    """STS-B test, ``none``/``mean``, under other text variants and max_length values."""
    from flowsearch.encode.encoder import Encoder

    out = {}
    for text, max_length in (("raw", 128), ("raw", 64), ("senteval", None), ("senteval", 64)):
        enc = Encoder(args.model, pooling="mean", max_length=max_length)
        pairs = load_stsb(args.data, "test", text)
        texts = pairs.sentences()
        vecs = cache.encode(enc, texts, f"stsb-test-{text}", batch_size=args.batch_size)
        row = {t: i for i, t in enumerate(texts)}
        sims = cosine_pairs(vecs[[row[t] for t in pairs.s1]], vecs[[row[t] for t in pairs.s2]])
        out[f"{text} text, max_length {enc.max_length}"] = spearman100(sims, pairs.scores)
    return out


def _sick_all_splits(session: EvalSession, data: str) -> float:
    """SICK-R Spearman over all 9,927 pairs (train + trial + test), ``none``."""
    sims, gold = [], []
    for split in ("train", "trial", "test"):
        pairs = load_sick(data, split, session.text)
        a, b = session.pair_vectors("SICKR", pairs)
        sims.append(cosine_pairs(a, b))
        gold.append(pairs.scores)
    return spearman100(np.concatenate(sims), np.concatenate(gold))


def _flow_diagnosis(U: np.ndarray, rows: dict[str, int], test: PairSet, seed: int) -> dict:
    """Why the flow trails whitening: STS-B test Spearman against training length."""
    a = U[[rows[t] for t in test.s1]]
    b = U[[rows[t] for t in test.s2]]

    def score(cal: Any) -> float:
        return spearman100(cosine_pairs(cal.transform(a), cal.transform(b)), test.scores)

    out: dict[str, Any] = {"rows": len(U), "none": spearman100(cosine_pairs(a, b), test.scores)}
    out["whitening"] = score(make_calibrator("whitening").fit(U))
    for epochs in (1, 5, 20):
        cal = make_calibrator("flow", seed=seed, epochs=epochs).fit(U)
        out[f"flow, {epochs} epoch(s) ({cal.fit_stats.get('steps')} steps)"] = score(cal)
    white = make_calibrator("whitening").fit(U)
    flow = make_calibrator("flow", seed=seed, epochs=5).fit(white.transform(U))
    sims = cosine_pairs(flow.transform(white.transform(a)), flow.transform(white.transform(b)))
    out["whitening, then flow (5 epochs)"] = spearman100(sims, test.scores)
    cal = make_calibrator("whitening-flow", seed=seed).fit(U)
    out[f"whitening-flow, 1 epoch ({cal.fit_stats.get('steps')} steps)"] = score(cal)
    LOG.info("flow diagnosis: %s", out)
    return out


def _study_row(
    name: str, U: np.ndarray, rows: dict[str, int], test: PairSet, seed: int
) -> dict[str, Any]:
    """Anisotropy statistics of ``U`` beside the STS-B test gain of every ``STUDY_CALS``.

    ``U`` holds the STS-B dev+test sentences (the study's fit set, the same for every setting),
    ``rows`` maps each sentence to its row.
    """
    a = U[[rows[t] for t in test.s1]]
    b = U[[rows[t] for t in test.s2]]
    none = spearman100(cosine_pairs(a, b), test.scores)
    row: dict[str, Any] = {"setting": name, "none": none, **anisotropy_stats(U, seed=seed)}
    for cal in STUDY_CALS:
        c = make_calibrator(cal) if cal == "whitening" else make_calibrator(cal, seed=seed)
        c.fit(U)
        row[cal] = spearman100(cosine_pairs(c.transform(a), c.transform(b)), test.scores)
        row[f"{cal}_gain"] = row[cal] - none
    row["flow_ll"] = _flow_ll_gain(U, seed)
    LOG.info("study %s: %s", name, {k: round(v, 3) for k, v in row.items() if k != "setting"})
    return row


def _render_only(out: Path) -> int:
    """Re-derives the study's rule and figure from the saved JSON and rewrites the report."""
    res = json.loads((out / "sts_results.json").read_text())
    if res.get("study"):
        rows = res["study"]["rows"]
        rule = choose_rule(rows, STATISTICS)
        plot_study(rows, rule["statistic"], rule["threshold"], out / res["study"]["figure"])
        res["study"].update(rule=rule, statistics=list(STATISTICS))
    (out / "sts_results.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    (out / "sts_results.md").write_text(render(res).rstrip() + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = _args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figs = out / "figures" if args.smoke else FIGURES
    if args.render_only:
        return _render_only(out)
    cache = VectorCache(args.cache) if args.cache else VectorCache()
    poolings = [p for p in args.poolings.split(",") if p]
    all_poolings = list(dict.fromkeys(poolings + (["cls"] if args.study else [])))
    views, multi = _views(args.model, args.max_length, all_poolings)
    sess = {
        p: EvalSession(
            views[p],
            args.data,
            cache,
            args.text,
            args.batch_size,
            args.seed,
            nli_sentences=args.nli_sentences,
        )
        for p in all_poolings
    }
    first = sess[all_poolings[0]]
    desc = first.encoder.describe()
    res: dict[str, Any] = {
        "meta": {**desc, "text": args.text, "seed": args.seed, "whitening_k": first.whitening_k()}
    }

    # Encode everything up front, dataset by dataset: the first pooling's request runs the shared
    # forward pass, the others are served from memory, and every pooling's file is on disk
    # before the next dataset starts (an interrupted sweep resumes from the cache).
    qnli_poolings = [p for p in args.qnli_poolings.split(",") if p in sess]
    for task in (*STS_TASKS, "SNLI", "QNLI"):
        for p in all_poolings:
            if task == "QNLI" and p not in qnli_poolings:
                continue
            if task != "STSB" and p not in poolings and task != "QNLI":
                continue
            sess[p].fit_vectors(task)
    encode_done = time.perf_counter()

    res["table2"] = []
    for p in poolings:
        for cal in TABLE2_CALS:
            results = {t: sess[p].sts(t, cal) for t in STS_TASKS}
            res["table2"].append({"pooling": p, "calibration": cal, "results": results})
            LOG.info(
                "table2 %s/%s: %s", p, cal, {t: round(r["spearman"], 2) for t, r in results.items()}
            )

    if "mean" in poolings:
        row = next(
            r for r in res["table2"] if r["pooling"] == "mean" and r["calibration"] == "none"
        )
        stsb, sick = row["results"]["STSB"]["spearman"], row["results"]["SICKR"]["spearman"]
        ok = abs(stsb - 82.03) <= 0.5
        res["mteb_check"] = {
            "STSB": stsb,
            "SICKR": sick,
            "verdict": (
                "Within 0.5 of MTEB: loaders, pooling and metric reproduce the published setting."
                if ok
                else "NOT within 0.5 of MTEB: see the variants below."
            ),
        }

    if "mean" in poolings and args.variants:
        res["mteb_check"]["variants"] = _stsb_variants(args, cache)
        res["mteb_check"]["SICKR_all_splits"] = _sick_all_splits(sess["mean"], args.data)

    res["table5"] = {}
    for p in poolings:
        scores = {c: sess[p].sts("STSB", c)["spearman"] for c in TABLE5_CALS}
        ks = {c: sess[p].natsv_k(c) for c in ("natsv", "sn-natsv")}
        res["table5"][p] = {"scores": scores, "k": ks}

    res["table4"] = []
    for p in (q for q in args.qnli_poolings.split(",") if q in sess):
        for cal in QNLI_CALS:
            res["table4"].append(
                {"pooling": p, "calibration": cal, "auc": sess[p].qnli(cal)["auc"]}
            )

    res["table6"] = {}
    dev = load_stsb(args.data, "dev", args.text)
    edit = np.array([edit_distance(a, b) for a, b in zip(dev.s1, dev.s2, strict=True)], float)
    for p in (q for q in ("mean", "first_last_avg", "embedding_layer") if q in poolings):
        a, b = sess[p].pair_vectors("STSB", dev)
        sims = {"raw": cosine_pairs(a, b)}
        for cal in ("flow", "whitening", "whitening-flow"):
            c = sess[p].calibrator(cal, "STSB")
            sims[cal] = cosine_pairs(c.transform(a), c.transform(b))
        fig = figs / f"sts_lexical_{p}.png"
        plot_lexical_scatter(edit, dev.scores, sims, fig, f"STS-B dev, {desc['model']} {p}")
        res["table6"][p] = {
            "rows": lexical_table(edit, dev.scores, sims),
            "figure": f"../figures/{fig.name}",
        }

    curves = {}
    for p in (q for q in ("mean", "first_last_avg", "embedding_layer") if q in poolings):
        U = sess[p].fit_vectors("STSB")
        curves[p] = {"raw": spectrum(U)}
        for cal in ("sn", "whitening", "flow", "whitening-flow"):
            curves[p][cal] = spectrum(sess[p].calibrator(cal, "STSB").transform(U))
    plot_spectra(curves, figs / "sts_spectra.png")
    res["spectra_figure"] = "../figures/sts_spectra.png"
    res["spectra"] = {p: {c: v[:20].tolist() for c, v in d.items()} for p, d in curves.items()}

    if args.study:
        test = load_stsb(args.data, "test", args.text)
        texts = unique_texts(dev.sentences() + test.sentences())
        index = {t: i for i, t in enumerate(texts)}
        label = "MiniLM" if args.model is None else args.model
        rows = [
            _study_row(f"{label} {p}", sess[p].text_vectors("STSB", texts), index, test, args.seed)
            for p in all_poolings
        ]
        if args.model is None:
            for kind in ("random", "top-half-random"):
                path = random_model_dir(cache.root / "models", kind, args.seed)
                rviews, _ = _views(str(path), args.max_length, all_poolings)
                if kind == "random":
                    U = cache.encode(rviews["mean"], texts, f"stsb-devtest-{args.text}")
                    res["flow_diagnosis"] = _flow_diagnosis(U, index, test, args.seed)
                for p in all_poolings:
                    if kind == "top-half-random" and p == "embedding_layer":
                        continue  # the embedding layer is the trained one: same row as MiniLM's
                    U = cache.encode(rviews[p], texts, f"stsb-devtest-{args.text}")
                    rows.append(_study_row(f"MiniLM-{kind} {p}", U, index, test, args.seed))
        rule = choose_rule(rows, STATISTICS)
        plot_study(rows, rule["statistic"], rule["threshold"], figs / "sts_study.png")
        res["study"] = {
            "rows": rows,
            "statistics": list(STATISTICS),
            "rule": rule,
            "figure": "../figures/sts_study.png",
        }

    res["meta"]["seconds"] = time.perf_counter() - started
    res["meta"]["encode_seconds"] = encode_done - started
    res["meta"]["texts_encoded"] = multi.texts_encoded if multi else None
    # Keep the record of the last cold run (empty cache): a warm re-run only refits calibrators.
    previous = out / "sts_results.json"
    cold = None
    if res["meta"]["texts_encoded"] and res["meta"]["texts_encoded"] > 50_000:
        cold = {k: res["meta"][k] for k in ("seconds", "encode_seconds", "texts_encoded")}
        cold["load_average"] = os.getloadavg()[0]
    elif previous.is_file():
        cold = json.loads(previous.read_text()).get("meta", {}).get("cold_run")
    res["meta"]["cold_run"] = cold
    (out / "sts_results.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    (out / "sts_results.md").write_text(render(res).rstrip() + "\n")
    LOG.info("done in %.1f min", res["meta"]["seconds"] / 60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
