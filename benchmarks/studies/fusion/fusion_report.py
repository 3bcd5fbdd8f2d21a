"""The markdown report of ``bench_fusion.py``: every figure read from its JSON report."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.common import tables

__all__ = ["render"]

SHORT = {"qnli-dev": "qnli", "stsb-para": "stsb", "sick-para": "sick", "snli-entail": "snli",
         "sts-para": "sts12-16"}  # fmt: skip


def _mean(cells: dict[str, dict[str, float]], metric: str = "ndcg@10") -> float:
    return float(np.mean([c[metric] for c in cells.values()]))


def _rule_cells(enc: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Every fusion rule's leave-one-set-out cells, keyed ``rule/partial|complete``."""
    return enc["cells"]


def best_per_set(enc: dict[str, Any], sets: list[str]) -> dict[str, tuple[str, float]]:
    """Per set: the fusion rule (any scores) with the best leave-one-set-out nDCG@10."""
    out = {}
    for s in sets:
        key = max(enc["cells"], key=lambda k: enc["cells"][k][s]["ndcg@10"])
        out[s] = (key, enc["cells"][key][s]["ndcg@10"])
    return out


def findings(report: dict[str, Any]) -> list[str]:
    labels, shipped = report["labels"], report["shipped"]
    lines = ["What this shows (figures from this run's JSON):", ""]
    for name, enc in report["encoders"].items():
        sets = list(report["sets"])
        cells = _rule_cells(enc)
        ours = cells[f"{shipped}/complete"]
        published = [k for k in cells if k.split("/")[0] in ("minmax", "tm2c2", "tm2c2_0",
                                                              "zscore", "dbsf", "rrf")]  # fmt: skip
        best_pub = max(published, key=lambda k: _mean(cells[k]))
        rrf = cells["rrf/partial"]
        current = cells["minmax/partial"]
        best = best_per_set(enc, sets)
        losses = {s: best[s][1] - ours[s]["ndcg@10"] for s in sets}
        worst = max(losses, key=lambda s: losses[s])
        dense = {s: enc["alone"][s]["dense"]["ndcg@10"] for s in sets}
        lex = {s: enc["alone"][s]["lex"]["ndcg@10"] for s in sets}
        alone_gap = {s: ours[s]["ndcg@10"] - max(dense[s], lex[s]) for s in sets}
        alone_worst = min(alone_gap, key=lambda s: alone_gap[s])
        gap = enc["shipped_minus"]

        def ci(k: str, gap: dict[str, list[float]] = gap) -> str:
            return f"{gap[k][0]:+.4f}, 95% CI {gap[k][1]:+.4f} to {gap[k][2]:+.4f}"

        lines.append(
            f"- `{name}` ({enc['kind']}; shipped dense weight {enc['default_weight']:.2f}): the "
            f"shipped rule averages {_mean(ours):.4f} nDCG@10 over the five sets (weights "
            f"chosen on the other sets), against {_mean(cells[best_pub]):.4f} for the best "
            f"published rule ({labels[best_pub.split('/')[0]]}, {best_pub.split('/')[1]} "
            f"scores; shipped minus it {ci(best_pub)}), {_mean(rrf):.4f} for RRF "
            f"({ci('rrf/partial')}) and {_mean(current):.4f} for the second release's min-max "
            f"({ci('minmax/partial')}). Worst-set loss against the best rule of each set: "
            f"{losses[worst]:+.4f} on {worst} (best there: {labels[best[worst][0].split('/')[0]]}"
            f", {best[worst][0].split('/')[1]}). Against the better single side: "
            f"{alone_gap[alone_worst]:+.4f} on its worst set ({alone_worst}, where "
            f"{'dense' if dense[alone_worst] >= lex[alone_worst] else 'BM25'} alone scores "
            f"{max(dense[alone_worst], lex[alone_worst]):.4f})."
        )
        part = cells[f"{shipped}/partial"]
        lines.append(
            f"  Partial scores (each side's score only for the rows it returned) would give "
            f"{_mean(part):.4f}; percentiles against the held-out rows' neighbours "
            f"{_mean(cells['pct1/complete']):.4f} (best neighbour) and "
            f"{_mean(cells['pct10/complete']):.4f} (top 10)."
        )
        thr = enc["meaning"]["thresholds"]["hybrid"]
        cut = next((r for r in thr if r["nonsense_kept"] <= 0.05), thr[-1])
        top = enc["meaning"]["nonsense"]
        lines.append(
            f"  Scores: a nonsense query's best hybrid score is {top['hybrid'][1]:.3f} (median; "
            f"95th percentile {top['hybrid'][2]:.3f}) where the second release gave "
            f"{top['hybrid (min-max, second release)'][1]:.3f}; `min_score={cut['t']:.1f}` "
            f"drops {1 - cut['nonsense_kept']:.0%} of nonsense queries' top hits and keeps "
            f"{cut['right_kept']:.1%} of the dev queries' right top-1 hits."
        )
    return lines


def against_us(report: dict[str, Any]) -> list[str]:
    """Where the shipped rule loses: to a published rule on mean, or to one side alone."""
    out = []
    labels, shipped = report["labels"], report["shipped"]
    for name, enc in report["encoders"].items():
        cells, sets = enc["cells"], list(report["sets"])
        ours = cells[f"{shipped}/complete"]
        above = []
        for key, per in cells.items():
            if key.split("/")[0] in (shipped, "pct1", "pct10") or _mean(per) <= _mean(ours):
                continue
            rule, scores = key.split("/")
            point, lo, hi = enc["shipped_minus"][key]
            above.append(f"{labels[rule]}, {scores} scores ({point:+.4f}; 95% CI {lo:+.4f} to "
                         f"{hi:+.4f})")  # fmt: skip
        if above:
            out.append(
                f"- Against us: for `{name}` published rules that average above the shipped "
                f"one (shipped minus rule): {'; '.join(above)}. The price of a score that "
                "depends on the hit alone."
            )
        for s in sets:
            alone = max(enc["alone"][s]["dense"]["ndcg@10"], enc["alone"][s]["lex"]["ndcg@10"])
            if ours[s]["ndcg@10"] >= alone:
                continue
            beat = [k for k, per in cells.items() if per[s]["ndcg@10"] >= alone]
            out.append(
                f"- Against us: on {s}, `{name}`'s hybrid ({ours[s]['ndcg@10']:.4f}) stays below "
                f"the better side alone ({alone:.4f}); rules that reach it there at a weight "
                f"chosen on the other sets: {', '.join(beat) or 'none'}."
            )
    out.append("- Not measured: Model2Vec (distilling it needs model2vec's `distill` extra, not "
               "installed in the shared environment), and BEIR's SciFact or ArguAna (not "
               "available offline).")  # fmt: skip
    return out


def top_bin_note(report: dict[str, Any]) -> list[str]:
    """Where a higher hybrid score stops meaning a more often right top-1 hit."""
    out = []
    for name, enc in report["encoders"].items():
        m = enc["meaning"]
        bins, drops = m["reliability_bins"], []
        for s, per in m["reliability"].items():
            filled = [(b, share) for b, (n, share) in enumerate(per) if n >= 50]
            if len(filled) < 2:
                continue
            peak = max(filled, key=lambda x: x[1])
            last = filled[-1]
            if last[1] < peak[1] - 0.05:

                def span(b: int, bins: list[float] = bins) -> str:
                    return f"[{bins[b]:.1f}, {bins[b + 1]:.1f})"

                drops.append(f"{s} {peak[1]:.2f} at {span(peak[0])} -> {last[1]:.2f} at "
                             f"{span(last[0])}")  # fmt: skip
        if drops:
            out.append(
                f"- `{name}`: within a set a higher hybrid score means a more often right top-1 "
                "hit, up to a point; in the paraphrase sets the share falls again at the top "
                f"({'; '.join(drops)}; bins of 50 queries or more): their corpora hold "
                "unlabelled paraphrases of the query, which score high and count as wrong "
                "(sick-para: 'The men are fighting with their fists in a ring' for 'The men are "
                "fist fighting in a ring', whose labelled passages are 'Two people are fist "
                "fighting in a ring' and 'Nobody is fist fighting in a ring')."
            )
    return out


def _cell(c: dict[str, float], weighted: bool) -> str:
    w = f" ({c['weight']:.2f})" if weighted else ""
    return f"{c['ndcg@10']:.3f} / {c['recall@100']:.3f}{w}"


def rule_table(report: dict[str, Any], name: str) -> list[str]:
    enc, sets = report["encoders"][name], list(report["sets"])
    best = best_per_set(enc, sets)
    lines = [
        f"`{name}` ({enc['kind']}), cells nDCG@10 / recall@100 (dense weight chosen on the "
        "other sets):",
        "",
        *tables.head(
            [
                "rule",
                "scores",
                *(SHORT.get(s, s) for s in sets),
                "mean nDCG@10",
                "worst-set loss to the best rule",
            ],
            "ll" + "l" * len(sets) + "rr",
        ),
    ]
    for side, label in (("dense", "dense alone"), ("lex", "BM25 alone")):
        vals = [enc["alone"][s][side] for s in sets]
        cells = [f"{v['ndcg@10']:.3f} / {v['recall@100']:.3f}" for v in vals]
        mean = np.mean([v["ndcg@10"] for v in vals])
        loss = max(best[s][1] - v["ndcg@10"] for s, v in zip(sets, vals, strict=True))
        lines.append(tables.row([label, "-", *cells, f"{mean:.4f}", f"{loss:.4f}"]))
    for key, per in enc["cells"].items():
        rule, scores = key.split("/")
        weighted = rule != "rrf"
        cells = [_cell(per[s], weighted) for s in sets]
        loss = max(best[s][1] - per[s]["ndcg@10"] for s in sets)
        label = report["labels"][rule]
        if rule == report["shipped"] and scores == "complete":
            label = f"**{label}**"
        lines.append(tables.row([label, scores, *cells, f"{_mean(per):.4f}", f"{loss:.4f}"]))
    return lines


def depth_table(report: dict[str, Any]) -> list[str]:
    sets = list(report["sets"])
    lines = ["The shipped rule (complete scores) with deeper candidate lists per side, nDCG@10 / "
             "recall@100:", "",
             *tables.head(["encoder", "candidates a side", *(SHORT.get(s, s) for s in sets),
                           "mean nDCG@10"], "lr" + "l" * len(sets) + "r")]  # fmt: skip
    for name, enc in report["encoders"].items():
        rows = {str(report["candidates"]): enc["cells"][f"{report['shipped']}/complete"]}
        rows.update(enc["depth"])
        for c, per in rows.items():
            cells = [f"{per[s]['ndcg@10']:.4f} / {per[s]['recall@100']:.3f}" for s in sets]
            lines.append(tables.row([f"`{name}`", c, *cells, f"{_mean(per):.4f}"]))
    return lines


def meaning_table(report: dict[str, Any], name: str) -> list[str]:
    m = report["encoders"][name]["meaning"]
    lines = [f"`{name}`: top-1 score (5th / 50th / 95th percentile) of the {m['queries']:,} dev "
             f"queries and of {m['nonsense_queries']:,} nonsense queries (200 per set: "
             "`asdf qwerty zxcv` and seeded strings of 1-4 made-up words):", "",
             *tables.head(["mode", "dev queries", "nonsense queries"], "lll")]  # fmt: skip
    for mode in ("dense", "lexical", "hybrid"):
        r, n = m["real"][mode], m["nonsense"][mode]
        lines.append(tables.row([mode, f"{r[0]:.3f} / {r[1]:.3f} / {r[2]:.3f}",
                                 f"{n[0]:.3f} / {n[1]:.3f} / {n[2]:.3f}"]))  # fmt: skip
    old = m["nonsense"]["hybrid (min-max, second release)"]
    lines.append("| hybrid, second release (min-max) | | "
                 f"{old[0]:.3f} / {old[1]:.3f} / {old[2]:.3f} |")  # fmt: skip
    lines += ["", f"`{name}`, what `min_score=t` keeps (top-1 hits; 'right' = the top-1 hit "
              "is relevant):", "",
              *tables.head(["mode", "t", "nonsense queries kept", "dev queries kept",
                            "right top-1 kept", "precision of kept top-1"], "lrrrrr")]  # fmt: skip
    for mode, rows in m["thresholds"].items():
        for r in rows:
            prec = "-" if r["precision"] is None else f"{r['precision']:.3f}"
            kept = "-" if r["right_kept"] is None else f"{r['right_kept']:.3f}"
            lines.append(tables.row([mode, f"{r['t']:.1f}", f"{r['nonsense_kept']:.3f}",
                                     f"{r['queries_kept']:.3f}", kept, prec]))  # fmt: skip
    bins, rel = m["reliability_bins"], m["reliability"]
    sets = list(rel)
    lines += [
        "",
        f"`{name}`, hybrid: share of each set's queries whose top-1 hit is relevant, "
        "by its score (queries in brackets):",
        "",
        *tables.head(["score", *(SHORT.get(s, s) for s in sets)], "l" + "r" * len(sets)),
    ]
    for b in range(len(bins) - 1):
        cells = []
        for s in sets:
            n, share = rel[s][b]
            cells.append("-" if share is None else f"{share:.2f} ({n:,})")
        lines.append(tables.row([f"[{bins[b]:.1f}, {bins[b + 1]:.1f})", *cells]))
    return lines


def render(report: dict[str, Any]) -> str:
    sets = report["sets"]
    desc = ", ".join(f"{s} {v['corpus']:,} passages / {v['queries']:,} queries"
                     for s, v in sets.items())  # fmt: skip
    checks = []
    diff = max(d["check"][side]["max_score_diff"] for d in report["dump"].values()
               for side in ("dense", "lexical"))  # fmt: skip
    for name, enc in report["encoders"].items():
        lib = min(enc["library_check"].values())
        dumps = [v["check"] for k, v in report["dump"].items() if k.startswith(name + "/")]
        same = min(d["dense"]["same_rows"] for d in dumps)
        c = enc["cost"]
        checks.append(f"`{name}`: one query's `fuse()` over 100 + 100 candidates with complete "
                      f"scores takes {c['fuse_us']:.0f} µs, {c['ratio']:.2f}x the second "
                      f"release's `convex()` ({c['convex_us']:.0f} µs; medians of 200 "
                      "interleaved calls)")  # fmt: skip
        checks.append(f"`{name}`: `fuse()` reproduces the study's top 100 on {lib:.1%} of "
                      f"queries (worst set); the dump's dense rows equal `Searcher.search`'s on "
                      f"{same:.2%} of positions (the others are near-ties: scores agree within "
                      f"{diff:.1e} at every position), lexical on "
                      f"{min(d['lexical']['same_rows'] for d in dumps):.0%}")  # fmt: skip
    loads = [x for v in report["dump"].values() for pair in v["load_average"] for x in pair[:1]]
    lines = [
        "## Hybrid fusion and scores with a meaning (`bench_fusion.py`, issue 24)",
        "",
        *findings(report),
        *against_us(report),
        *top_bin_note(report),
        "",
        f"Dev sets (at most 6,000 passages; `make_dev_sets.py`, and `sts-para` made by "
        f"`fusion_dump.py` from STS12-16 raw pairs with gold >= 4, which shares sentences with "
        f"stsb-para): {desc}. Indexes built with the shipped defaults (`calibration auto`, "
        f"`index auto`, BM25); symmetric sets drop the query's own row before fusing. Each query "
        f"fuses both sides' top {report['candidates']}; 'complete' scores give each side's score "
        "of every candidate, 'partial' only of the rows that side returned. Weighted rules: "
        "weight chosen leave-one-set-out (shown in brackets). nDCG@10 and recall@100 by "
        "pytrec_eval. These are development figures, not BEIR's SciFact or ArguAna (not "
        f"available here). Load average {report['load_average_start'][0]} at the start, "
        f"{report['load_average_end'][0]} at the end (2 shared cores); {report['seconds']:.0f} s "
        f"of evaluation after the dumps (which ran at load {min(loads):.1f}-{max(loads):.1f}).",
        "",
    ]
    for name in report["encoders"]:
        lines += rule_table(report, name) + [""]
    lines += depth_table(report) + [""]
    lines += ["### What a score means", "",
              "`Hit.score`: dense `max(0, (cosine - background) / (1 - background))` (background: "
              "the corpus's mean cosine between rows), lexical `BM25 / upper bound` (the sum of "
              "the query's terms' idf), hybrid the weighted mean of the two.", ""]  # fmt: skip
    for name in report["encoders"]:
        lines += meaning_table(report, name) + [""]
    lines += ["Checks: " + "; ".join(checks) + ".", "",
              "Commands: `python -m benchmarks run fusion_dump --data "
              "../shared/data` (indexes and dumps), then `PYTHONPATH=. python "
              "benchmarks/studies/fusion/bench_fusion.py`."]  # fmt: skip
    return "\n".join(lines) + "\n"
