"""Markdown for the STS report (``benchmarks/quality/sts_results.md``), from the results JSON.

The section lives between ``<!-- sts:start -->`` and ``<!-- sts:end -->``; other scripts own
other sections of the same file, so only this span is ever rewritten.
"""

from __future__ import annotations

from typing import Any

from benchmarks.quality.sts_published import (
    LI2020_TABLE2,
    LI2020_TABLE4,
    LI2020_TABLE5,
    LI2020_TABLE6,
    SOURCES,
    SU2021,
)

__all__ = ["render"]

COLS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSB", "SICKR")


def _timing(meta: dict[str, Any]) -> str:
    this = f"This run took {meta['seconds'] / 60:.1f} min"
    if meta.get("texts_encoded"):
        this += f" ({meta['texts_encoded']:,} sentences encoded, all poolings in one pass)"
    else:
        this += " (every vector from the cache: calibrator fits only)"
    cold = meta.get("cold_run")
    if cold:
        this += (
            f"; the last cold run (empty cache) took {cold['seconds'] / 60:.1f} min, "
            f"{cold['encode_seconds'] / 60:.1f} min of it encoding {cold['texts_encoded']:,} "
            f"sentences, on this 2-core machine shared with other jobs (load average "
            f"{cold['load_average']:.1f} at the end)"
        )
    return this + "."


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _table2(rows: list[dict[str, Any]], agg: str) -> list[str]:
    out = [
        "| pooling | calibration | " + " | ".join(COLS) + " | avg |",
        "|---|---|" + "---:|" * (len(COLS) + 1),
    ]
    for r in rows:
        vals = [r["results"][c].get(agg, r["results"][c]["spearman"]) for c in COLS]
        out.append(
            f"| {r['pooling']} | {r['calibration']} | "
            + " | ".join(_f(v) for v in vals)
            + f" | {_f(sum(vals) / len(vals))} |"
        )
    return out


def _published(table: dict[str, dict[str, float]], source: str) -> list[str]:
    out = [
        "| published (" + source + ") | " + " | ".join(COLS) + " | avg |",
        "|---|" + "---:|" * (len(COLS) + 1),
    ]
    for name, row in table.items():
        vals = [row[c] for c in COLS]
        out.append(
            f"| {name} | " + " | ".join(_f(v) for v in vals) + f" | {_f(sum(vals) / len(vals))} |"
        )
    return out


def render(res: dict[str, Any]) -> str:
    """The whole STS section as Markdown."""
    meta = res["meta"]
    L: list[str] = ["## STS, QNLI and the calibration study (`benchmarks/quality/run_sts.py`)", ""]
    L += [
        f"Encoder `{meta['model']}` (revision `{meta['revision']}`), max_length "
        f"{meta['max_length']}, text variant `{meta['text']}`, flow seed {meta['seed']}. "
        f"{_timing(meta)} Regenerate with "
        "`FLOWSEARCH_DATA=../shared/data .venv/bin/python -m benchmarks run sts`; every number "
        "below is in `benchmarks/quality/sts_results.json`.",
        "",
        "`embedding_layer` below is the first release's `static` pooling (the embedding layer's "
        "output, position embeddings included), renamed when `static` became position-free; "
        "the figures are the ones measured then.",
        "",
        "Calibrators are fitted without labels on the evaluated set's own sentences, all splits "
        '("target"), except `flow-nli` (fitted on SNLI dev+test sentences; the train split is '
        "not shipped). `natsv`/`sn-natsv` choose k in 1..20 on STS-B dev. `whitening-k` keeps "
        f"k = {meta['whitening_k']} dims (dim/2).",
        "",
    ]
    L += _summary(res)
    check = res.get("mteb_check")
    if check:
        L += ["### Check against MTEB (is our evaluation code right?)", ""]
        L += [
            f"`none` / `mean`, raw text, max_length {meta['max_length']}: STS-B "
            f"**{check['STSB']:.2f}** (MTEB 82.03, diff {check['STSB'] - 82.03:+.2f}); "
            f"SICK-R **{check['SICKR']:.2f}** (MTEB 77.58: another pair set, see below). "
            f"{check['verdict']}"
        ]
        if check.get("SICKR_all_splits") is not None:
            L += [
                "",
                "SICK-R: MTEB scores all 9,927 pairs (train + trial + test); on those we get "
                f"**{check['SICKR_all_splits']:.2f}**. Our SICK-R column is the SentEval/paper "
                "setting (test split, 4,927 pairs), hence its lower figure.",
            ]
        if check.get("variants"):
            v = check["variants"]
            L += ["", "Setting sensitivity of the STS-B figure (`none`/`mean`): "]
            L[-1] += "; ".join(f"{k}: {x:.2f}" for k, x in v.items()) + "."
            if max(v.values()) - min(v.values()) < 1e-6:
                L[-1] += (
                    " All identical: STS-B sentences are shorter than 64 tokens, and this "
                    "model's uncased WordPiece tokenizer lowercases and splits punctuation "
                    "itself, so neither max_length nor SentEval's tokenised text changes a vector."
                )
        L += [""]
    for agg, label in (
        ("spearman", '"all" (pairs pooled, as SBERT/SimCSE/MTEB)'),
        ("wmean", '"wmean" (subset rho weighted by size, as BERT-flow and BERT-whitening report)'),
    ):
        L += [f"### Table 2 layout: Spearman x 100, STS12-16 aggregated as {label}", ""]
        L += _table2(res["table2"], agg) + [""]
    L += [
        "Published figures for BERT-base (SentEval text, STS12-16 = wmean) to compare the "
        "*gains* with (the absolute numbers are another encoder):",
        "",
    ]
    L += _published(LI2020_TABLE2, "Li et al. 2020, Table 2") + [""]
    L += _published(SU2021, "Su et al. 2021") + [""]
    L += ["### Table 5 layout: calibration baselines on STS-B test", ""]
    pools = list(res["table5"])
    L += [
        "| calibration | " + " | ".join(pools) + " | Li et al. BERT-base |",
        "|---|" + "---:|" * (len(pools) + 1),
    ]
    names = list(next(iter(res["table5"].values()))["scores"])
    for cal in names:
        pub = {
            "none": "none",
            "sn": "sn",
            "natsv": "natsv (k=10)",
            "sn-natsv": "sn-natsv (k=6)",
            "flow": "flow (target)",
        }.get(cal)
        cells = []
        for p in pools:
            v = res["table5"][p]["scores"][cal]
            k = res["table5"][p]["k"].get(cal)
            cells.append(_f(v) + (f" (k={k})" if k else ""))
        L.append(f"| {cal} | " + " | ".join(cells) + f" | {_f(LI2020_TABLE5.get(pub))} |")
    L += [""]
    if res.get("table4"):
        L += ["### Table 4 layout: QNLI dev AUC x 100 of cosine(question, sentence)", ""]
        L += ["| pooling | calibration | AUC |", "|---|---|---:|"]
        for r in res["table4"]:
            L.append(f"| {r['pooling']} | {r['calibration']} | {_f(r['auc'])} |")
        L += [
            "",
            "Published (Li et al. 2020, Table 4; BERT-base fine-tuned on NLI): "
            + ", ".join(f"{k} {v:.2f}" for k, v in LI2020_TABLE4.items())
            + ".",
            "",
        ]
    L += _lexical(res) + _study(res)
    L += ["### Sources", ""] + [f"- {v}" for v in SOURCES.values()] + [""]
    return "\n".join(L)


def _avg(res: dict[str, Any], pooling: str, cal: str, agg: str = "spearman") -> float | None:
    for r in res["table2"]:
        if r["pooling"] == pooling and r["calibration"] == cal:
            vals = [r["results"][c].get(agg, r["results"][c]["spearman"]) for c in COLS]
            return sum(vals) / len(vals)
    return None


def _row(res: dict[str, Any], pooling: str, cal: str) -> dict[str, Any] | None:
    return next(
        (r for r in res["table2"] if r["pooling"] == pooling and r["calibration"] == cal), None
    )


def _helped(res: dict[str, Any]) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    """The study's margin, the settings where calibration (the flow) helps, and the others."""
    st = res["study"]
    m = st["rule"].get("margin", 0.0)
    helped = [r for r in st["rows"] if r["flow_gain"] > m]
    return m, helped, [r for r in st["rows"] if r["flow_gain"] <= m]


def _compare(rows: list[dict[str, Any]], a: str, b: str, digits: int = 2) -> str:
    """How often ``a >= b`` over study rows: "i of n (difference +x on average, y to z)"."""
    d = [r[a] - r[b] for r in rows]
    wins = sum(x >= 0 for x in d)
    return (
        f"{wins} of {len(d)} (difference {sum(d) / len(d):+.{digits}f} on average, "
        f"{min(d):+.{digits}f} to {max(d):+.{digits}f})"
    )


def _static_trio(res: dict[str, Any]) -> str:
    """Table 2 ``embedding_layer``: flow, whitening, whitening-flow avg, where the flow differs."""
    rows = {c: _row(res, "embedding_layer", c) for c in ("flow", "whitening", "whitening-flow")}
    if any(r is None for r in rows.values()):
        return ""
    out = (
        'With every split of each set as fit set (Table 2, `embedding_layer`, avg "all"): '
        + ", ".join(f"{c} {_avg(res, 'embedding_layer', c):.2f}" for c in rows)
        + "."
    )
    flow, wflow = rows["flow"]["results"], rows["whitening-flow"]["results"]
    d = {t: flow[t]["spearman"] - wflow[t]["spearman"] for t in COLS}
    ahead = [f"{t} {v:+.2f}" for t, v in d.items() if v >= 1.0]
    behind = [f"{t} {v:+.2f}" for t, v in d.items() if v <= -1.0]
    if ahead:
        out += (
            " There the paper's flow is ahead of whitening-flow on "
            + ", ".join(ahead)
            + (" and behind on " + ", ".join(behind) if behind else "")
            + " (flow minus whitening-flow)"
        )
        if _row(res, "embedding_layer", "whitening-k") is not None:
            out += (
                f"; whitening-k (avg {_avg(res, 'embedding_layer', 'whitening-k'):.2f}) has the "
                "same profile, so we read it as the flow's incomplete decorrelation acting like a "
                f"partial whitening, which {' and '.join(a.split()[0] for a in ahead)} prefer, "
                "not as a better density model"
            )
        out += "."
    return out


def _max_wf_shift(res: dict[str, Any]) -> float | None:
    """Largest |whitening-flow - whitening| over every Table 2 cell and study row."""
    diffs = []
    for r in res["table2"]:
        w = _row(res, r["pooling"], "whitening")
        if r["calibration"] == "whitening-flow" and w is not None:
            for t in COLS:
                diffs += [abs(v - w["results"][t][k]) for k, v in r["results"][t].items()]
    for r in (res.get("study") or {}).get("rows", []):
        if "whitening-flow" in r:
            diffs.append(abs(r["whitening-flow"] - r["whitening"]))
    return max(diffs) if diffs else None


def _summary(res: dict[str, Any]) -> list[str]:
    """What the numbers say, in words a user can act on (generated from the numbers)."""
    L = ["### What this shows", ""]
    for r in res["table2"]:
        if r["calibration"] != "none":
            continue
        p = r["pooling"]
        raw = _avg(res, p, "none")
        parts = []
        for cal in ("flow", "whitening", "whitening-flow", "flow-nli"):
            v = _avg(res, p, cal)
            if v is not None and raw is not None:
                parts.append(f"{cal} {v:.2f} ({v - raw:+.2f})")
        L.append(f'- `{p}`: raw avg {raw:.2f} ("all" aggregation); ' + ", ".join(parts) + ".")
    st = res.get("study")
    if st:
        m, helped, hurt = _helped(res)
        names = [r["setting"] for r in helped]
        L += [
            "",
            f"- In the study below, the flow raises STS-B by more than {m} points on "
            f"{len(helped)} of {len(st['rows'])} settings ({', '.join(names) or 'none'}), and "
            f"not on {', '.join(r['setting'] for r in hurt) or 'none'}. These are the "
            "anisotropic settings (all above the `auto` threshold below).",
        ]
        if helped and "whitening-flow" in helped[0]:
            L += [
                "- Flow vs whitening vs whitening-flow on those anisotropic settings (STS-B test, "
                "same 5,385 fit vectors): whitening >= flow on "
                f"{_compare(helped, 'whitening', 'flow')}; whitening-flow >= flow on "
                f"{_compare(helped, 'whitening-flow', 'flow')}; whitening-flow >= whitening on "
                f"{_compare(helped, 'whitening-flow', 'whitening', 3)}: a tie, not a win. "
                + _static_trio(res)
            ]
    mean_none = _row(res, "mean", "none")
    if mean_none:
        costs = []
        for cal in ("flow", "whitening", "whitening-flow"):
            r = _row(res, "mean", cal)
            if r is None:
                continue
            d_avg = _avg(res, "mean", cal) - _avg(res, "mean", "none")
            d = {t: r["results"][t]["spearman"] - mean_none["results"][t]["spearman"]
                 for t in ("STSB", "SICKR")}  # fmt: skip
            costs.append(
                f"{cal} {d_avg:+.2f} avg (STS-B {d['STSB']:+.2f}, SICK-R {d['SICKR']:+.2f})"
            )
        L += [
            "- What calibration costs MiniLM `mean` (trained contrastively, already isotropic: "
            "mean cosine 0.02): " + "; ".join(costs) + "."
        ]
        qnli = {r["calibration"]: r["auc"] for r in res.get("table4", []) if r["pooling"] == "mean"}
        if "none" in qnli and len(qnli) > 1:
            L[-1] += (
                " QNLI (question vs candidate answer sentence) goes the other way: AUC "
                + ", ".join(f"{c} {v - qnli['none']:+.2f}" for c, v in qnli.items() if c != "none")
                + " over raw. The `auto` rule, set on STS, leaves `mean` raw; for "
                "question-to-passage search, measure on your own data before trusting it."
            )
    if st:
        top = _max_wf_shift(res)
        shift = "within noise" if top is None else f"within {top:.2f} points on every figure"
        f, w = _avg(res, "embedding_layer", "flow"), _avg(res, "embedding_layer", "whitening-flow")
        static_gap = "-" if f is None or w is None else f"flow {f - w:+.2f} over whitening-flow"
        L += [
            "- What to do: for an encoder trained contrastively for similarity (MiniLM `mean`, "
            "its default), search in the encoder's own space: every calibration costs STS "
            "points (SICK-R most). Calibrate when the space is anisotropic: non-contextual "
            "`embedding_layer` vectors, `cls` of a model not trained for it, untrained or partly "
            "trained encoders, raw MLM encoders like the paper's BERT. There, whitening-flow "
            "(what `auto` picks) and plain whitening give the same STS figures "
            f"({shift}), and both beat the paper's flow on a small fit set (5,385 sentences); "
            "on the larger all-splits fit sets the paper's flow can be ahead on average "
            f"(`embedding_layer`: {static_gap}). Whitening fits in a fraction of a second; "
            "whitening-flow adds about the flow's fit (seconds) and keeps the "
            "flow's exact density (drift and out-of-distribution signals), not extra STS "
            "points. "
            f'`calibration="auto"` decides by {st["rule"]["statistic"]} > '
            f"{st['rule']['threshold']:.2f} (the study below).",
        ]
    L.append("")
    return L


def _lexical(res: dict[str, Any]) -> list[str]:
    L = [
        "### Table 6 layout: lexical vs semantic similarity on STS-B dev",
        "",
        "Spearman x 100 of each similarity with word-level edit distance and with gold; "
        "`edit<=4` restricts to lexically close pairs (green in the figure).",
        "",
    ]
    for pooling, t in res["table6"].items():
        L += [
            f"**{pooling}**",
            "",
            "| similarity | edit distance | gold | edit (edit<=4) |",
            "|---|---:|---:|---:|",
        ]
        for name, row in t["rows"].items():
            L.append(f"| {name} | {_f(row['edit'])} | {_f(row['gold'])} | {_f(row['edit_le4'])} |")
        L += ["", f"![Figure 2 layout, {pooling}]({t['figure']})", ""]
    pub = ", ".join(
        f"{k}: edit {v['edit']:.2f} / gold {v['gold']:.2f}" for k, v in LI2020_TABLE6.items()
    )
    L += [f"Published (Li et al. 2020, Table 6, BERT-base): {pub}.", ""]
    L += [
        "Singular-value spectra (share of variance per direction) before and after calibration:",
        "",
        f"![spectra]({res['spectra_figure']})",
        "",
    ]
    return L


def _study(res: dict[str, Any]) -> list[str]:
    st = res.get("study")
    if not st:
        return []
    stats = st["statistics"]
    L = [
        "### When does calibration help?",
        "",
        "Each row is one (encoder, pooling) setting, all under one protocol: the STS-B dev+test "
        "sentences (5,385, no labels) are the fit set; the statistics are computed on them, "
        "flow, whitening and whitening-flow are fitted on them, and the gain is the STS-B test "
        "Spearman after calibration minus raw (so the bundled rows differ a little from Table 2, "
        "whose calibrators saw all splits). `MiniLM-random`: the MiniLM architecture with fresh "
        "random weights (an untrained encoder). `MiniLM-top-half-random`: trained embeddings "
        "and lower 3 layers, top 3 layers re-drawn (its `embedding_layer` row would repeat "
        "MiniLM's and is left out). `flow_ll`: the flow's fitted log-likelihood gain over a "
        "diagonal Gaussian (nats/dim, constant dims dropped).",
        "",
    ]
    cals = [c for c in ("flow", "whitening", "whitening-flow") if f"{c}_gain" in st["rows"][0]]
    L += [
        "| setting | raw | "
        + " | ".join(f"{c} gain" for c in cals)
        + " | "
        + " | ".join(stats)
        + " | flow_ll |",
        "|---|" + "---:|" * (len(stats) + len(cals) + 2),
    ]
    for r in st["rows"]:
        L.append(
            f"| {r['setting']} | {_f(r['none'])} | "
            + " | ".join(f"{r[f'{c}_gain']:+.2f}" for c in cals)
            + " | "
            + " | ".join(f"{r[s]:.3f}" for s in stats)
            + f" | {r['flow_ll']:.3f} |"
        )
    rule = st["rule"]
    L += [
        "",
        f'Rule chosen for `calibration="auto"`: calibrate when **{rule["statistic"]} > '
        f"{rule['threshold']:.3g}**. On these {rule['n']} settings ({rule['positives']} where the "
        f"flow helps) it is right on {rule['accuracy'] * 100:.0f}%, and "
        f"{rule['loo_accuracy'] * 100:.0f}% leave-one-out (threshold refitted without the "
        "held-out setting).",
    ]
    if "whitening-flow_gain" in st["rows"][0]:
        m = rule.get("margin", 0.0)
        x = [r[rule["statistic"]] > rule["threshold"] for r in st["rows"]]
        y = [r["whitening-flow_gain"] > m for r in st["rows"]]
        right = sum(a == b for a, b in zip(x, y, strict=True))
        L[-1] += (
            " The label is the flow's gain (the paper's calibrator); with whitening-flow's gain "
            f"as the label instead (what `auto` applies), the same rule is right on {right} of "
            f"{len(x)} settings ({sum(y)} where whitening-flow helps)."
        )
    L += ["", "All candidates:", ""]
    L += ["| statistic | best threshold | accuracy | leave-one-out |", "|---|---:|---:|---:|"]
    for name, v in rule["all"].items():
        L.append(
            f"| {name} | {v['threshold']:.3g} | {v['accuracy']:.2f} | {v['loo_accuracy']:.2f} |"
        )
    L += ["", f"![study]({st['figure']})", ""]
    L += _flow_vs_whitening(res)
    return L


def _flow_vs_whitening(res: dict[str, Any]) -> list[str]:
    """Flow, whitening and whitening-flow on anisotropic settings, with the flow's diagnosis."""
    diag = res.get("flow_diagnosis")
    if not diag or not res.get("study"):
        return []
    _, helped, _ = _helped(res)
    if not helped:
        return []
    gap = max(r["whitening"] - r["flow"] for r in helped)
    white_ahead = sum(r["whitening"] > r["flow"] for r in helped)
    L = ["### Flow vs whitening vs whitening-flow", ""]
    text = "Same vectors, same fit sets, same run. " + _static_trio(res) + " "
    text += (
        "In the study (5,385 fit vectors, so a third of the flow's training steps) whitening is "
        f"ahead of the paper's flow on {white_ahead} of the {len(helped)} settings where "
        f"calibration helps, by up to {gap:.1f} points. This sides with Su et al. "
        "(whitening >= flow) rather than with the flow > baselines claim of Li et al. "
    )
    if "whitening-flow" in helped[0]:
        text += (
            "`whitening-flow` (the same flow behind a fixed full-rank whitening layer) is >= the "
            f"paper's flow on {_compare(helped, 'whitening-flow', 'flow')}, and ties whitening: "
            f">= on {_compare(helped, 'whitening-flow', 'whitening', 3)}. So our flow is at "
            "least as good as whitening on the anisotropic settings only in its whitening-flow "
            "form, and only as a tie; the paper's flow is not, at this fit-set size. "
        )
    text += (
        "Why the paper's flow trails, measured on the most anisotropic setting "
        f"(MiniLM-random `mean`, {diag['rows']:,} fit vectors, STS-B test Spearman):"
    )
    L += [text, "", "| calibration | STS-B |", "|---|---:|"]
    L += [f"| {k} | {v:.2f} |" for k, v in diag.items() if k != "rows"]
    top = _max_wf_shift(res)
    shift = (
        "STS little"
        if top is None
        else f"any STS figure in this report by at most {top:.2f} points"
    )
    L += [
        "",
        "The flow's gain is a decorrelation, which whitening computes exactly in closed form. "
        "The flow's couplings are additive (volume-preserving) and its permutations fixed, so it "
        "can only learn the decorrelation step by step through its coupling nets: with the "
        "reference schedule (1 epoch, lr 1e-3, batch 64: a few hundred steps) it stops short, "
        "and more epochs close most of the gap. With the whitening map as a fixed first layer "
        "(whitening-flow) the decorrelation is exact from the first step, and the flow's "
        f"non-linear layers on top move {shift}, either way: the flow's "
        "non-linearity brings no measurable STS gain here. Its value over plain whitening is "
        "the exact density it keeps, not ranking quality.",
        "",
    ]
    return L
