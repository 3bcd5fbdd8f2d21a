"""The section of ``bench_drift.py``: its tables and findings, every
figure read from the run's JSON (``bench_drift.json``)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["markdown"]

SETS = ("qnli-dev", "stsb-para", "sick-para", "snli-entail")
BATCH_SIZES = (5, 20, 100)
VARIANTS = ("2,500 rows, held-out", "2,500 rows, leave-one-out", "300 rows, leave-one-out")

ALARM, LIKE, FEW = "apart from the corpus", "like the corpus", "too few to tell"


def _summary(res: dict[str, Any], pooling: str, variant: str) -> dict[str, Any]:
    """Mean and worst figures over the sets for one pooling and index variant."""
    per = {name: res["poolings"][pooling]["sets"][name][variant] for name in SETS}
    fa = {n: p["verdict"]["flagged"][n] for n, p in per.items()}
    caught = {(n, o): p["verdict"]["flagged"][o] for n, p in per.items() for o in SETS if o != n}
    out: dict[str, Any] = {
        "judged": all(p["verdict"]["judged"] for p in per.values()),
        "false_alarm_mean": float(np.mean(list(fa.values()))),
        "false_alarm_worst": max(fa.items(), key=lambda kv: kv[1]),
        "caught_mean": float(np.mean(list(caught.values()))),
        "caught_worst": min(caught.items(), key=lambda kv: kv[1]),
        "drift": {},
    }
    for n in BATCH_SIZES:
        same = [p["drift"][str(n)]["same"] for p in per.values()]
        other = [p["drift"][str(n)]["other"] for p in per.values()]
        old_same = [p["drift"][str(n)]["same_old_rule"] for p in per.values()]
        old_other = [p["drift"][str(n)]["other_old_rule"] for p in per.values()]
        out["drift"][n] = {
            "false_alarm": float(np.mean([s.get(ALARM, 0.0) for s in same])),
            "false_alarm_worst": float(max(s.get(ALARM, 0.0) for s in same)),
            "same_like": float(np.mean([s.get(LIKE, 0.0) for s in same])),
            "same_few": float(np.mean([s.get(FEW, 0.0) for s in same])),
            "caught": float(np.mean([s.get(ALARM, 0.0) for s in other])),
            "caught_worst": float(min(s.get(ALARM, 0.0) for s in other)),
            "other_like": float(np.mean([s.get(LIKE, 0.0) for s in other])),
            "old_false_alarm": None if None in old_same else float(np.mean(old_same)),
            "old_caught": None if None in old_other else float(np.mean(old_other)),
        }
    edits = [p["edited"] for p in per.values()]
    out["edited"] = {
        "alarm": float(np.mean([e["verdicts"].get(ALARM, 0.0) for e in edits])),
        "like": float(np.mean([e["verdicts"].get(LIKE, 0.0) for e in edits])),
        "old_rule": None
        if None in [e["old_rule"] for e in edits]
        else float(np.mean([e["old_rule"] for e in edits])),
        "median_percentile": [e["median_percentile"] for e in edits],
    }
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}" if x >= 0.01 or x == 0 else f"{x:.1%}"


def findings(res: dict[str, Any]) -> list[str]:
    """The section's summary, every figure read from the results."""
    out = ["What this shows (every figure from this run's JSON):", ""]
    for pooling in res["poolings"]:
        big, loo, small = (_summary(res, pooling, v) for v in VARIANTS)
        (fa_set, fa), ((c_set, c_other), c) = big["false_alarm_worst"], big["caught_worst"]
        out.append(
            f"- `{pooling}`, query verdict, 2,500-row indexes (held-out reference): "
            f"{_pct(big['false_alarm_mean'])} of a set's own queries flagged (worst "
            f"{fa_set} {_pct(fa)}), {_pct(big['caught_mean'])} of other sets' queries caught "
            f"(least: {c_other} queries against {c_set}, {_pct(c)}). Leave-one-out over 2,000 "
            f"rows of the same indexes: {_pct(loo['false_alarm_mean'])} / "
            f"{_pct(loo['caught_mean'])}. 300-row indexes (leave-one-out, as the demo): "
            f"{_pct(small['false_alarm_mean'])} / {_pct(small['caught_mean'])}"
            + ("" if small["judged"] else
               " if it judged; the product declines there (an anisotropic encoder space)")
            + "."
        )  # fmt: skip
        d = big["drift"]
        out.append(
            f"- `{pooling}`, drift, 2,500-row indexes: alarms on same-set batches "
            + ", ".join(f"{_pct(d[n]['false_alarm'])} ({n} rows)" for n in BATCH_SIZES)
            + "; other-set batches caught "
            + ", ".join(f"{_pct(d[n]['caught'])} ({n})" for n in BATCH_SIZES)
            + ". The previous release's log-density rule: "
            + ", ".join(f"{_pct(d[n]['old_false_alarm'])} / {_pct(d[n]['old_caught'])} ({n})"
                        for n in BATCH_SIZES)
            + " (false alarms / caught). Edited passages (one word prepended, batches of 20): "
            f"{_pct(big['edited']['alarm'])} alarms now, {_pct(big['edited']['old_rule'])} "
            "under the previous rule."
        )  # fmt: skip
    for pooling, r in res["poolings"].items():
        d = r["demo"]
        flagged = ", ".join(f"{g} {_pct(v)}" for g, v in d["flagged"].items())
        out.append(
            f"- Demo corpus (300 passages), `{pooling}`: "
            + (f"not judged ({d['reason']})" if d["flagged"]["demo questions"] is None
               else f"flagged: {flagged}")
            + "."
        )  # fmt: skip
    out += ["", "Against us:", "", *against(res)]
    return out


def against(res: dict[str, Any]) -> list[str]:
    """What the run shows the reports do badly (figures from the results)."""
    out = []
    for pooling in res["poolings"]:
        big, small = _summary(res, pooling, VARIANTS[0]), _summary(res, pooling, VARIANTS[2])
        (c_set, c_other), c = big["caught_worst"]
        s_set, s_fa = small["false_alarm_worst"]
        out.append(
            f"- `{pooling}`: the verdict measures closeness to the corpus, not a domain: "
            f"{c_other} queries against the {c_set} index are caught {_pct(c)} of the time "
            "(STS-B holds image captions, SICK and SNLI are captions), and drift batches from "
            "the nearest other set are the least caught (worst cells in the drift table). On "
            f"a 300-row index the false alarms reach {_pct(s_fa)} ({s_set})"
            + ("" if small["judged"] else ", where the product does not judge at all")
            + "."
        )
        edits = big["edited"]
        if edits["alarm"] > edits["old_rule"]:
            out.append(
                f'- `{pooling}`: batches of 20 passages with one word prepended ("Indeed,") '
                f"alarm {_pct(edits['alarm'])} of the time, against {_pct(edits['old_rule'])} "
                "under the previous log-density rule on these indexes: on short captions one "
                "foreign word moves a static vector far (median percentiles "
                + ", ".join(f"{m:.0f}" for m in edits["median_percentile"])
                + " per set). A single edited row is never an alarm."
            )
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = ["## Reports: the query verdict and drift against the corpus's reference "
             "(`bench_drift.py`)", "", *findings(res), "", res["setup"], ""]  # fmt: skip
    for pooling, r in res["poolings"].items():
        lines += [f"### `{pooling}`", "",
                  "Query verdict: share of each set's queries flagged out-of-distribution "
                  "(the diagonal, **bold**, is false alarms; the rest are catches):", "",
                  "| index | reference | space | " + " | ".join(f"{s} queries" for s in SETS)
                  + " |", "|---|---|---|" + "---:|" * len(SETS)]  # fmt: skip
        for name in SETS:
            for variant in VARIANTS:
                v = r["sets"][name][variant]
                cells = [f"**{_pct(v['verdict']['flagged'][s])}**" if s == name
                         else _pct(v["verdict"]["flagged"][s]) for s in SETS]  # fmt: skip
                judged = "" if v["verdict"]["judged"] else " (not judged by the product)"
                lines.append(f"| {name} | {variant}{judged} | {v['space']} | "
                             + " | ".join(cells) + " |")  # fmt: skip
        lines += ["", f"Drift: share of {res['batches']} batches per cell judged *apart from the "
                  "corpus* (the only alarm), mean over the four sets (worst set in brackets); "
                  "*like* = judged like the corpus; previous rule = mean log-density 1 held-out "
                  "std below:", "",
                  "| index | rows per batch | same set: alarm | same set: like | same set: too "
                  "few to tell | other set: caught | other set: like | previous rule: false "
                  "alarm / caught |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for variant in VARIANTS:
            s = _summary(res, pooling, variant)
            for n in BATCH_SIZES:
                d = s["drift"][n]
                lines.append(
                    f"| {variant} | {n} | {_pct(d['false_alarm'])} "
                    f"({_pct(d['false_alarm_worst'])}) | {_pct(d['same_like'])} | "
                    f"{_pct(d['same_few'])} | {_pct(d['caught'])} ({_pct(d['caught_worst'])}) "
                    f"| {_pct(d['other_like'])} | {_pct(d['old_false_alarm'])} / "
                    f"{_pct(d['old_caught'])} |"
                )
        lines += ["", "Edited passages (20 index rows, one word prepended, each against the "
                  "index without its original):", "",
                  "| index | alarm | like the corpus | previous rule's alarm | median percentile "
                  "per set |", "|---|---:|---:|---:|---|"]  # fmt: skip
        for variant in VARIANTS:
            e = _summary(res, pooling, variant)["edited"]
            medians = ", ".join(f"{m:.0f}" for m in e["median_percentile"])
            lines.append(f"| {variant} | {_pct(e['alarm'])} | {_pct(e['like'])} | "
                         f"{_pct(e['old_rule'])} | {medians} |")  # fmt: skip
        d = r["demo"]
        why = f"; not judged: {d['reason']}" if d["reason"] else ""
        lines += ["", f"Demo corpus (`data/sample.parquet`, {d['space']} space, reference of "
                  f"{d['reference_rows']} rows): share flagged "
                  + ", ".join(f"{g} {_pct(v)}" for g, v in d["flagged"].items())
                  + f"{why}. Examples:", ""]  # fmt: skip
        lines += [f"- {q!r}: {w}" for q, w in d["examples"].items()]
        lines.append("")
    return "\n".join(lines) + "\n"
