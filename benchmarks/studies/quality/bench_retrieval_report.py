r"""Markdown tables of ``bench_retrieval.json`` (written by ``bench_retrieval.py``).

Every figure comes from the JSON's rows; nothing here measures. Cells are
``nDCG@10 / recall@100 / MRR@10`` unless a table says it shows nDCG@10 only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from benchmarks.common import tables
from benchmarks.common.harness import produced_by

__all__ = ["best_weight", "render"]

SETS = ("qnli-dev", "stsb-para", "sick-para", "snli-entail")
#: The dense weight the second release proposed for static poolings (0.6 for the rest).
STATIC_WEIGHT = 0.3
#: The hybrid weights of a report that does not record its own: the second release's Searcher
#: (the ``convex`` rule) used 0.6 for transformer poolings and 0.3 for static ones.
SECOND_RELEASE_WEIGHTS = {"transformer": 0.6, "static": STATIC_WEIGHT}
SHORT = {"qnli-dev": "qnli", "stsb-para": "stsb", "sick-para": "sick", "snli-entail": "snli"}


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return found[-1] if found else None


def _cell(row: dict[str, Any] | None, full: bool = True) -> str:
    if row is None:
        return "-"
    if not full:
        return f"{row['ndcg@10']:.3f}"
    return f"{row['ndcg@10']:.3f} / {row['recall@100']:.2f} / {row['mrr@10']:.3f}"


def _mean(values: Iterable[float | None]) -> str:
    vals = [v for v in values if v is not None]
    return f"{sum(vals) / len(vals):.3f}" if vals else "-"


def _dense_table(rows: list[dict[str, Any]], pairs: Sequence[tuple[str, str]],
                 full: bool = True, delta: bool = False) -> list[str]:  # fmt: skip
    """One line per (encoder, calibration): the four sets, the mean nDCG@10, and with ``delta``
    the worst and mean change of nDCG@10 against the same encoder uncalibrated."""
    header = ["encoder", "calibration", *(SHORT[s] for s in SETS), "mean nDCG@10"]
    header += ["worst / mean Δ vs none"] if delta else []
    body = []
    for enc, cal in pairs:
        got = [_find(rows, set=s, encoder=enc, calibration=cal, mode="dense") for s in SETS]
        if not any(got):
            continue
        line = [f"`{enc}`", cal, *(_cell(g, full) for g in got),
                _mean(g["ndcg@10"] if g else None for g in got)]  # fmt: skip
        if delta:
            diffs = []
            for s, g in zip(SETS, got, strict=True):
                raw = _find(rows, set=s, encoder=enc, calibration="none", mode="dense")
                if g and raw:
                    diffs.append(g["ndcg@10"] - raw["ndcg@10"])
            line.append(f"{min(diffs):+.3f} / {sum(diffs) / len(diffs):+.3f}" if diffs else "-")
        body.append(line)
    return tables.table(header, body)


def hybrid_grid(rows: list[dict[str, Any]], enc: str, cal: str) -> dict[float, dict[str, float]]:
    """weight -> {set: nDCG@10} of the convex fusion."""
    out: dict[float, dict[str, float]] = {}
    for r in rows:
        if r["mode"] == "hybrid" and r["encoder"] == enc and r["calibration"] == cal:
            out.setdefault(r["weight"], {})[r["set"]] = r["ndcg@10"]
    return out


def best_weight(grids: Sequence[dict[float, dict[str, float]]]) -> tuple[float, float]:
    """The weight whose worst shortfall from each (grid, set)'s own best weight is smallest.

    Returns:
        ``(weight, its worst shortfall in nDCG@10)``.
    """
    weights = sorted(set.intersection(*(set(g) for g in grids)))
    best: tuple[float, float] | None = None
    for w in weights:
        regret = max(max(g[x][s] for x in g) - g[w][s] for g in grids for s in g[w])
        if best is None or regret < best[1] - 1e-12:
            best = (w, regret)
    assert best is not None
    return best


def _hybrid_table(rows: list[dict[str, Any]], enc: str, cal: str) -> list[str]:
    grid = hybrid_grid(rows, enc, cal)
    if not grid:
        return []
    best = {s: max(grid[w].get(s, 0.0) for w in grid) for s in SETS}
    header = ["dense weight", *(SHORT[s] for s in SETS), "mean", "worst shortfall from best"]
    body = []
    for w in sorted(grid):
        vals = [grid[w].get(s) for s in SETS]
        short = max(best[s] - v for s, v in zip(SETS, vals, strict=True) if v is not None)
        body.append([f"{w:.1f}", *(f"{v:.3f}" if v is not None else "-" for v in vals),
                     _mean(vals), f"{short:.3f}"])  # fmt: skip
    rrf = [_find(rows, set=s, encoder=enc, calibration=cal, mode="hybrid-rrf") for s in SETS]
    vals = [r["ndcg@10"] if r else None for r in rrf]
    short = max(best[s] - v for s, v in zip(SETS, vals, strict=True) if v is not None)
    body.append(["RRF (k=60)", *(_cell(r, False) for r in rrf), _mean(vals), f"{short:.3f}"])
    lex = [_find(rows, set=s, mode="lexical") for s in SETS]
    body.append(["BM25 alone", *(_cell(r, False) for r in lex),
                 _mean(r["ndcg@10"] if r else None for r in lex), ""])  # fmt: skip
    return [f"`{enc}`, calibration `{cal}` (nDCG@10):", "", *tables.table(header, body)]


def render(report: dict[str, Any]) -> str:
    """The markdown report (and ``bench_retrieval.md``), from the JSON the study saves."""
    rows = report["rows"]
    default = report["default_static_variant"]
    variants = ["static:raw", "static:raw+special", "static:layernorm",
                "static:layernorm+special", "embedding_layer"]  # fmt: skip
    base = ["none", "whitening", "partial (p=0.25)"]
    out = ["## Retrieval study on the dev sets (`bench_retrieval.py`)", ""]
    notes = [f"Note: {n}" for n in report.get("notes", [])]
    out += [*notes, ""] if notes else []
    sizes = ", ".join(f"{n} {r['corpus']:,} passages / {r['queries']:,} queries"
                      for n, r in report["sets"].items())  # fmt: skip
    out += [f"Dev sets from `../shared/data` (at most {report['max_corpus']:,} passages each): "
            f"{sizes}. Bundled all-MiniLM-L6-v2; calibrators fitted on each corpus's raw "
            "vectors; exact dense search; cells are nDCG@10 / recall@100 / MRR@10. These are "
            "*development* figures: the issue's targets (public BEIR SciFact and ArguAna) are "
            "not available here and are not claimed.", ""]  # fmt: skip

    out += ["### 1. Position-free static variants", ""]
    out += _dense_table(rows, [(v, c) for v in variants for c in base], delta=True)
    out += [f"Default static variant: `{default}`.", ""]

    out += ["### 2. Calibration strength (whitening `power`, `shrinkage`; the flows)", ""]
    strengths = ["none", "whitening", "p=0.375", "partial (p=0.25)", "p=0.125", "shrink 0.02",
                 "shrink 0.1", "shrink 0.5", "whitening-flow", "flow"]  # fmt: skip
    for enc in (default, "model2vec", "mean"):
        out += _dense_table(rows, [(enc, c) for c in strengths], full=False, delta=True)

    out += ["### 3. `auto` for query -> passage search", ""]
    header = ["encoder", "mean cosine", "auto searches", *(SHORT[s] for s in SETS), "worst Δ"]
    body = []
    for enc in [*variants, "model2vec", "mean"]:
        cells, diffs, chosen, cos = [], [], set(), []
        for s in SETS:
            a = _find(rows, set=s, encoder=enc, calibration="auto", mode="dense")
            r = _find(rows, set=s, encoder=enc, calibration="none", mode="dense")
            if not a or not r:
                cells.append("-")
                continue
            d = a["ndcg@10"] - r["ndcg@10"]
            diffs.append(d)
            cfg = "".join(f" {k}={v}" for k, v in a["chosen_config"].items())
            chosen.add(a["chosen"] + cfg)
            cos.append(a["mean_cosine"])
            cells.append(f"{r['ndcg@10']:.3f} -> {a['ndcg@10']:.3f} ({d:+.3f})")
        if diffs:
            body.append([f"`{enc}`", f"{min(cos):.2f}-{max(cos):.2f}", ", ".join(sorted(chosen)),
                         *cells, f"{min(diffs):+.3f}"])  # fmt: skip
    out += ["Raw -> auto nDCG@10 per set (auto as `build_index` decides it, fitted on the corpus):",
            "", *tables.table(header, body)]  # fmt: skip

    out += ["### 4. Hybrid weight (convex fusion of min-max normalised scores)", ""]
    grids: dict[str, dict[float, dict[str, float]]] = {}
    for enc, cal in (("mean", "auto"), (default, "auto"), (default, "none"), ("model2vec", "auto")):
        out += _hybrid_table(rows, enc, cal)
        if hybrid_grid(rows, enc, cal) and enc in ("mean", default) and cal == "auto":
            grids[enc] = hybrid_grid(rows, enc, cal)
    if grids:
        per = {name: best_weight([g]) for name, g in grids.items()}
        w, regret = best_weight(list(grids.values()))
        out += ["Most robust weight (smallest worst shortfall from each set's own best): "
                + ", ".join(f"`{n}` alone {x[0]:.1f} (worst shortfall {x[1]:.3f})"
                            for n, x in per.items())
                + f"; one weight for both: **{w:.1f}** (worst shortfall {regret:.3f}).",
                ""]  # fmt: skip
    sts = report.get("sts") or {}
    if sts:
        cols = ["none", "whitening", "partial (p=0.25)", "whitening-flow", "auto"]
        body = [[f"`{enc}`", f"{r['mean_cosine']:.3f}", *(f"{r[c]:.2f}" for c in cols),
                 r["auto_searches"]] for enc, r in sts.items()]  # fmt: skip
        title = "### STS-B under the new `auto` (test Spearman x 100, fitted on STS-B sentences)"
        out += [title, "", *tables.table(["encoder", "mean cosine", "raw", "whitening",
                                    "partial (p=0.25)", "whitening-flow (old auto)", "auto now",
                                    "auto searches"], body)]  # fmt: skip

    out += ["### 5. The calibrated static tier", ""]
    sp = report.get("speed") or {}
    if sp:
        body = [[f"`{k}`", f"{v['rows_per_cpu_s']:,.0f}", f"{v['rows_per_wall_s']:,.0f}"]
                for k, v in sp.items() if isinstance(v, dict)]  # fmt: skip
        out += [f"Encoding speed on {sp['texts']:,} QNLI passages (mean {sp['mean_chars']} "
                f"characters), uncached, on a shared 2-core machine"
                + (f" (load average {sp['load_average']})" if "load_average" in sp else "")
                + (f", OMP_NUM_THREADS={sp['omp_num_threads']}" if "omp_num_threads" in sp
                   else "")
                + ": static / mean = "
                f"**{sp['static_over_mean_cpu']}x** per CPU second.", "",
                *tables.table(["encoder", "rows / CPU s", "rows / wall s"], body)]  # fmt: skip
    tier = [
        (default, "none"),
        (default, "auto"),
        ("model2vec", "none"),
        ("model2vec", "auto"),
        ("model2vec", "whitening"),
        ("model2vec", "partial (p=0.25)"),
        ("mean", "none"),
    ]
    out += ["Dense:", "", *_dense_table(rows, tier)]
    chosen = report.get("hybrid_weights") or SECOND_RELEASE_WEIGHTS
    transformer, static = chosen["transformer"], chosen["static"]
    body = []
    weights = sorted({transformer, static})
    pairs = [(default, "none"), (default, "auto"), ("model2vec", "auto"), ("mean", "auto")]
    for (enc, cal), w in ((p, w) for p in pairs for w in weights):
        got = [_find(rows, set=s, encoder=enc, calibration=cal, mode="hybrid", weight=w)
               for s in SETS]  # fmt: skip
        if any(got):
            body.append([f"`{enc}` + BM25, weight {w}", cal, *(_cell(g) for g in got),
                         _mean(g["ndcg@10"] if g else None for g in got)])  # fmt: skip
    lex = [_find(rows, set=s, mode="lexical") for s in SETS]
    body.append(["BM25 alone", "-", *(_cell(g) for g in lex),
                 _mean(g["ndcg@10"] if g else None for g in lex)])  # fmt: skip
    out += [
        f"Hybrid (`convex`) at the Searcher's dense weights of the run, {transformer} for "
        f"transformer poolings and {static} for static ones:",
        "",
        *tables.table(["search", "calibration", *(SHORT[s] for s in SETS), "mean nDCG@10"], body),
    ]
    check = report.get("product_check") or {}
    if check:
        out += [f"Product-path check (build_index + Searcher on {check['set']}, "
                f"`{check['encoder']}`, calibration `{check['calibration']}`, hybrid weight "
                f"{check['weight']}{_rules(check)}): product {check['product']}; this script "
                f"{check['this_script']}.", ""]  # fmt: skip
    default = f"python -m benchmarks run retrieval --max-corpus {report['max_corpus']}"
    out += [produced_by(report, default)]
    return "\n".join(out) + "\n"


def _rules(check: dict[str, Any]) -> str:
    """The hybrid rules the product check compared, when they differ (the third release's
    product fuses with ``fuse``, this script with ``convex``)."""
    rules = check.get("hybrid_rules")
    if not rules or rules["product"] == rules["this_script"]:
        return ""
    return f"; hybrid rule: product `{rules['product']}`, this script `{rules['this_script']}`"
