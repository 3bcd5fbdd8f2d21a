r"""Issue 32, one more attempt at +0.01 nDCG@10 past the published hybrids: query-dependent
fusion weights, an agreement bonus, per-query dense normalisation, and (for long documents) how
a document's score is built from its passages' scores; every parameter tuned on one half of
each set's queries and every figure reported on the other half.

Usage::

    python -m benchmarks run fusion_dump --data ../shared/data
    python -m benchmarks run fusion_adaptive --data ../shared/data
        [--encoders mean,static] [--report-only]

**Short sets** (the dumps of ``fusion_dump.py``: five dev sets, each corpus at most 6,000
passages, indexed with the shipped defaults; each side's top 100, complete scores). Each set's
queries are split once, seeded, into a *tune* half and a *test* half. A rule's parameters (the
fusion weight included) are the grid point with the best mean tune-half nDCG@10 over the five
sets (each set weighs the same); its figures are test-half nDCG@10 at that point. A stricter
column repeats it leave-one-set-out (parameters from the tune halves of the other four sets).
The rule to ship would also be chosen on the tune halves. Rules:

- **shipped**: :func:`flowsearch.search.fusion.fuse` as it stands (cosine above the corpus's
  background, BM25 share stretched at 0.7; weight 0.65 for ``mean``, 0.30 for ``static``,
  chosen on all five sets' queries, test halves included: a baseline with an edge), and the
  same rule with its weight re-tuned on the tune halves.
- **published**: RRF (k=60), min-max, z-score, TM2C2 (dense bound -1 and 0) and DBSF, complete
  and partial scores where they differ, weights tuned on the tune halves.
- **(a) query-dependent weight** ``w(q) = clip(w0 + beta * z(q), 0, 1)``, ``z`` a signal
  known at query time, standardised with the tune halves' mean and spread: the query terms'
  mean idf over ``log(1 + N)``; its token count (log); its lexical upper bound (sum of idf);
  the dense side's best normalised score; the lexical side's; the gap between the dense
  side's best two cosines; the best cosine's percentile among the reference rows' best
  neighbours; the two sides' top-10 overlap. Then the best two signals together.
- **(b) agreement bonus** (CombMNZ, Fox & Shaw 1994: a document both systems return counts
  more): the shipped score times ``1 + gamma`` for a row in both sides' top ``t``; and the
  continuous form, plus ``gamma * min(dense, lexical)``.
- **(c) per-query dense background** (score-distribution-aware normalisation, Arampatzis et
  al. 2009; the query-side view of Ethayarajh 2019's anisotropy baseline): the cosine above
  *this query's* mean cosine to the corpus (``q · mean row``, one dot product at query time)
  instead of the corpus-wide background; and a z-score against the query's own spread
  ``clip((cos - mu_q) / (c sd_q), 0, 1)``.

**Long documents** (``--long``, built here): QNLI dev sentences grouped 16 to a document by
topic (as ``bench_passages.py``), every QNLI question answered by one of them; indexed with the
shipped defaults (passages of 128 tokens, overlap 16, calibration ``auto``). All passages are
scored (no candidate cut). Rules for a document's score: the shipped one (its best passage's
fused score); best + ``s`` x the second best; each side's best passage fused (dense and
lexical from possibly different passages); the dense side's best passage with the lexical side
BM25 of the whole document. Same tune/test split of the queries. A second long set of the
paraphrase kind (``--long-sets stsb``): STS-B's second sentences of pairs with gold >= 4,
24 to a document by topic, each first sentence a query.

**Coherent long documents** (``--long-sets article16,article32``, built by
:func:`qnli_articles`): the sets above glue sentences of several topics into one document,
which weakens the dense side (a passage vector averages unrelated facts); these documents are
each one SQuAD article's QNLI sentences (about 16 or 32 to a document, 6 or 12 passages), so a
loss there is not the glue's. Beside the rules above: dense alone, BM25 alone, and the
length-aware weights ``shipped - beta ln(passages per document)`` (per document, and per
index from its mean: what ships, ``settings.fusion_length_slope``), with beta also chosen on
the two sets' tune halves pooled (``pooled``). ``--recheck-product`` searches the stored
indexes with the product as it ships now. For example::

    python -m benchmarks run fusion_adaptive --data
        ../shared/data --encoders "" --long-sets article16,article32 --merge

Writes ``benchmarks/studies/fusion/bench_fusion_adaptive.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent

from benchmarks.common import harness, tables  # noqa: E402
from benchmarks.common.harness import publish  # noqa: E402
from benchmarks.studies.fusion import fusion_rules as fr  # noqa: E402
from benchmarks.studies.fusion.bench_fusion import GRID, RULES  # noqa: E402
from benchmarks.studies.fusion.bench_fusion_query import ndcg_at  # noqa: E402
from benchmarks.studies.fusion.fusion_dump import ALL_SETS, OUT, WORK  # noqa: E402
from flowsearch.search import fusion  # noqa: E402
from flowsearch.search.scores import normalise_dense, normalise_lexical  # noqa: E402

LOG = logging.getLogger("bench_fusion_adaptive")

C = 100
SEED = 32
BETAS = (-0.3, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3)
FEATURES = ("idf", "terms", "upper", "dense_conf", "lex_conf", "dense_gap", "dense_pct", "agree")
PUBLISHED = (
    "rrf/complete",
    "minmax/complete",
    "zscore/partial",
    "tm2c2/complete",
    "tm2c2_0/complete",
    "dbsf/partial",
    "dbsf/complete",
)
#: Proxies for the issue's two kinds of set (neither is in ../shared): asymmetric short query
#: -> other text (claims -> abstracts), and symmetric text -> text of the same genre
#: (argument -> counterargument).
KINDS = {
    "asymmetric (claim -> abstract proxy)": ("qnli-dev", "snli-entail"),
    "symmetric (argument -> counterargument proxy)": ("stsb-para", "sick-para", "sts-para"),
}
SHORT = {
    "qnli-dev": "qnli",
    "stsb-para": "stsb",
    "sick-para": "sick",
    "snli-entail": "snli",
    "sts-para": "sts12-16",
}

# (per-query nDCG@10 at each grid point, the grid's parameters)
Swept = tuple[list[np.ndarray], list[Any]]


def split(n: int, name: str) -> np.ndarray:
    """bool (n,): the tune half of a set's queries (seeded by the set's name)."""
    rng = np.random.default_rng([SEED, *name.encode()])
    tune = np.zeros(n, bool)
    tune[rng.permutation(n)[: n // 2]] = True
    return tune


class ShortSet:
    """One (encoder, set) dump, its candidates, the shipped sides and the query signals."""

    def __init__(self, encoder: str, name: str, max_corpus: int) -> None:
        self.name = name
        self.st = fr.load(OUT / encoder / f"{name}.npz", WORK / f"dev_sets_{max_corpus}" / name,
                          encoder)  # fmt: skip
        self.ref = fr.reference(self.st)
        self.cand = fr.candidates(self.st, C, complete=True)
        self.partial = fr.candidates(self.st, C, complete=False)
        self.nd = np.nan_to_num(normalise_dense(self.cand.d, self.ref))
        self.nl = np.nan_to_num(normalise_lexical(self.cand.l, self.cand.upper))
        self.tune = split(len(self.st.qids), name)
        self.raw = self._signals()

    def _signals(self) -> dict[str, np.ndarray]:
        a, c = self.st.arrays, self.cand
        terms = np.maximum(a["q_terms"].astype(float), 1)
        valid = c.rows >= 0
        top_d = a["dense_scores"][:, :2].astype(float)
        d10, l10 = a["dense_rows"][:, :10], a["lex_rows"][:, :10]
        agree = np.array([len(np.intersect1d(x, y[y >= 0])) / 10 for x, y in zip(d10, l10)])
        return {
            "idf": a["q_upper"] / terms / math.log(1 + self.st.n_rows),
            "terms": np.log(terms),
            "upper": a["q_upper"],
            "dense_conf": np.max(np.where(valid, self.nd, 0), 1),
            "lex_conf": np.max(np.where(valid, self.nl, 0), 1),
            "dense_gap": top_d[:, 0] - top_d[:, 1],
            "dense_pct": fr.ecdf(a["ref_dense"][:, 0], top_d[:, 0]),
            "agree": agree,
        }

    def ndcg(self, fused: np.ndarray) -> np.ndarray:
        return ndcg_at(self.cand, self.st, fused)


# -- the rules, each swept over its grid on every set -------------------------------------------


def sweep_shipped(s: ShortSet) -> Swept:
    return [s.ndcg(w * s.nd + (1 - w) * s.nl) for w in GRID], [float(w) for w in GRID]


def sweep_published(s: ShortSet, key: str) -> Swept:
    rule, kind = key.split("/")
    cand = s.cand if kind == "complete" else s.partial
    fn = RULES[rule][1]
    if fn is None:
        return [ndcg_at(cand, s.st, fr.rrf_scores(cand))], [None]
    nd, nl = fn(cand, s.st)
    return [ndcg_at(cand, s.st, w * nd + (1 - w) * nl) for w in GRID], [float(w) for w in GRID]


def sweep_weight(s: ShortSet, z: dict[str, np.ndarray], feats: Sequence[str]) -> Swept:
    """``w = clip(w0 + sum beta_i z_i)``: every w0 of GRID, every beta of BETAS per feature."""
    out, params = [], []
    for betas in itertools.product(BETAS, repeat=len(feats)):
        shift = sum((b * z[f] for b, f in zip(betas, feats, strict=True)), np.zeros(len(s.nd)))
        for w0 in GRID:
            w = np.clip(w0 + shift, 0, 1)[:, None]
            out.append(s.ndcg(w * s.nd + (1 - w) * s.nl))
            params.append((float(w0), *betas))
    return out, params


def sweep_agreement(s: ShortSet) -> Swept:
    out, params = [], []
    c = s.cand
    for t in (10, 30, 100):
        both = ((c.d_rank <= t) & (c.l_rank <= t)).astype(float)
        for g in (0.05, 0.1, 0.2, 0.4):
            for w in GRID:
                out.append(s.ndcg((w * s.nd + (1 - w) * s.nl) * (1 + g * both)))
                params.append(("both top-t", t, g, float(w)))
    agree = np.minimum(s.nd, s.nl)
    for g in (0.1, 0.2, 0.4, 0.8):
        for w in GRID:
            out.append(s.ndcg(w * s.nd + (1 - w) * s.nl + g * agree))
            params.append(("min", None, g, float(w)))
    return out, params


def sweep_background(s: ShortSet) -> Swept:
    a = s.st.arrays
    mu = a["q_dense_mean"].astype(float)[:, None]
    sd = a["q_dense_std"].astype(float)[:, None]
    out, params = [], []
    d = np.nan_to_num(s.cand.d, nan=-1.0)
    variants: list[tuple[Any, np.ndarray]] = [("mean", np.clip((d - mu) / (1 - mu), 0, 1))]
    for c in (4, 6, 8, 10, 12, 15):
        variants.append((f"z/{c}", np.clip((d - mu) / (c * sd), 0, 1)))
    for label, nd in variants:
        for w in GRID:
            out.append(s.ndcg(w * nd + (1 - w) * s.nl))
            params.append((label, float(w)))
    return out, params


# -- choosing on tune halves, reporting on test halves ----------------------------------------


def choose(sets: list[ShortSet], swept: dict[str, Swept]) -> dict[str, Any]:
    """The grid point best on the tune halves (pooled: all five sets; and leave-one-set-out),
    and the per-query test-half nDCG@10 it gives."""
    names = [s.name for s in sets]
    tune = np.array([[x[s.tune].mean() for x in swept[s.name][0]] for s in sets])
    pooled = int(np.argmax(tune.mean(0)))
    out: dict[str, Any] = {
        "params": swept[names[0]][1][pooled],
        "tune": {n: float(tune[i, pooled]) for i, n in enumerate(names)},
        "test_q": {s.name: swept[s.name][0][pooled][~s.tune] for s in sets},
        "loso_q": {},
        "loso_params": {},
    }
    for i, s in enumerate(sets):
        j = int(np.argmax(np.delete(tune, i, 0).mean(0)))
        out["loso_q"][s.name] = swept[s.name][0][j][~s.tune]
        out["loso_params"][s.name] = swept[s.name][1][j]
    return out


def paired(a: dict[str, np.ndarray], b: dict[str, np.ndarray], names: Sequence[str],
           draws: int = 2000) -> list[float]:  # fmt: skip
    """Mean over ``names`` of the per-query difference a - b, with its 95% interval (queries
    resampled within each set, paired)."""
    rng = np.random.default_rng(0)
    means = np.zeros(draws)
    for n in names:
        d = a[n] - b[n]
        means += d[rng.integers(len(d), size=(draws, len(d)))].mean(axis=1)
    means /= len(names)
    point = float(np.mean([(a[n] - b[n]).mean() for n in names]))
    return [round(point, 4), *(round(float(x), 4) for x in np.percentile(means, [2.5, 97.5]))]


def study_short(encoder: str, max_corpus: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    sets = [ShortSet(encoder, n, max_corpus) for n in ALL_SETS]
    names = [s.name for s in sets]
    LOG.info("%s: loaded in %.0f s", encoder, time.perf_counter() - t0)
    shipped_w = fusion.DENSE_WEIGHT if encoder == "mean" else (
        fusion.DENSE_WEIGHT_STATIC)  # fmt: skip
    rules: dict[str, dict[str, Any]] = {}
    fixed = {s.name: s.ndcg(shipped_w * s.nd + (1 - shipped_w) * s.nl) for s in sets}
    rules[f"shipped (weight {shipped_w:.2f})"] = {
        "params": shipped_w,
        "test_q": {n: fixed[n][~s.tune] for n, s in zip(names, sets, strict=True)},
        "loso_q": {n: fixed[n][~s.tune] for n, s in zip(names, sets, strict=True)},
        "loso_params": {n: shipped_w for n in names},
        "family": "shipped",
    }

    def add(label: str, family: str, sweep: Callable[[ShortSet], Swept]) -> None:
        t = time.perf_counter()
        swept = {s.name: sweep(s) for s in sets}
        rules[label] = {**choose(sets, swept), "family": family}
        LOG.info("%s %s: %.1f s", encoder, label, time.perf_counter() - t)

    add("shipped rule, weight tuned", "shipped", sweep_shipped)
    for key in PUBLISHED:
        rule, kind = key.split("/")
        add(f"{RULES[rule][0]}, {kind}", "published", lambda s, k=key: sweep_published(s, k))
    # signals standardised on the tune halves (pooled)
    zs: dict[str, dict[str, np.ndarray]] = {s.name: {} for s in sets}
    for f in FEATURES:
        pool = np.concatenate([s.raw[f][s.tune] for s in sets])
        mu, sd = float(np.mean(pool)), float(np.std(pool)) or 1.0
        for s in sets:
            zs[s.name][f] = (s.raw[f] - mu) / sd
    for f in FEATURES:
        add(f"(a) weight by {f}", "candidate", lambda s, f=f: sweep_weight(s, zs[s.name], [f]))
    singles = sorted(
        FEATURES, key=lambda f: -np.mean(list(rules[f"(a) weight by {f}"]["tune"].values()))
    )
    pair = singles[:2]
    add(f"(a) weight by {pair[0]} + {pair[1]}", "candidate",
        lambda s: sweep_weight(s, zs[s.name], pair))  # fmt: skip
    add("(b) agreement bonus", "candidate", sweep_agreement)
    add("(c) per-query dense background", "candidate", sweep_background)
    base = rules["shipped rule, weight tuned"]["test_q"]
    pub = [k for k, v in rules.items() if v["family"] == "published"]
    out: dict[str, Any] = {"rules": {}, "seconds": 0.0}
    for label, r in rules.items():
        out["rules"][label] = {
            "family": r["family"],
            "params": r["params"],
            "loso_params": r["loso_params"],
            "test": {n: round(float(r["test_q"][n].mean()), 4) for n in names},
            "test_mean": round(float(np.mean([r["test_q"][n].mean() for n in names])), 4),
            "loso_mean": round(float(np.mean([r["loso_q"][n].mean() for n in names])), 4),
            "minus_tuned_shipped": paired(r["test_q"], base, names),
            "kinds": {},
        }
    # per kind: the best published rule on the tune halves of that kind's sets, and each rule
    # against it on that kind's test halves
    tune_mean = {k: {n: rules[k]["tune"][n] for n in names} for k in rules if "tune" in rules[k]}
    for kind, members in KINDS.items():
        best_pub = max(pub, key=lambda k: np.mean([tune_mean[k][n] for n in members]))
        for label, r in rules.items():
            out["rules"][label]["kinds"][kind] = {
                "test_mean": round(float(np.mean([r["test_q"][n].mean() for n in members])), 4),
                "minus_best_published": paired(r["test_q"], rules[best_pub]["test_q"], members),
            }
        out.setdefault("best_published", {})[kind] = best_pub
    cands = [k for k, v in rules.items() if v["family"] == "candidate"]
    out["chosen_on_tune"] = max(cands, key=lambda k: np.mean(list(rules[k]["tune"].values())))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["queries"] = {s.name: [int(s.tune.sum()), int((~s.tune).sum())] for s in sets}
    return out


# -- report ---------------------------------------------------------------------------------


def _ci(d: list[float]) -> str:
    return f"{d[0]:+.4f} ({d[1]:+.4f} to {d[2]:+.4f})"


def transfer(report: dict[str, Any]) -> str:
    """The published rules on the long set at the weights they got on the short sets."""
    long, short = report["long"], report.get("short", {}).get("mean")
    if not short or "curve" not in long:
        return ""
    grid = [float(w) for w in GRID]
    parts = []
    for label, key in (("TM2C2", "published: TM2C2, dense bound -1"), ("DBSF", "published: DBSF")):
        rule = next(k for k in short["rules"] if k.startswith(label))
        w = float(short["rules"][rule]["params"])
        parts.append(f"{label} {long['curve'][key][grid.index(w)]:.3f} (at {w:.2f})")
    return (
        " The published rules at the weights tuned on the short sets do no better: "
        + ", ".join(parts)
        + ": no rule's short-set weight transfers."
    )


def render(report: dict[str, Any]) -> str:
    lines = [
        "## Query-dependent fusion, agreement, per-query normalisation, passage combination "
        "(`benchmarks/studies/fusion/bench_fusion_adaptive.py`, issue 32)",
        "",
    ]
    lines += summary_lines(report)
    sets = list(SHORT)
    for enc, res in report.get("short", {}).items():
        kinds = list(KINDS)
        lines += [
            "",
            f"`{enc}`, short sets: test-half nDCG@10 with every parameter tuned on the tune "
            "halves (pooled over the five sets); 'LOSO' the same with parameters from the "
            "other four sets' tune halves; then, per kind of set, the test-half mean minus "
            "the published rule best on that kind's tune halves (95% CI, queries resampled "
            "within each set, paired). Test/tune queries per set: "
            + ", ".join(f"{SHORT[n]} {v[1]}/{v[0]}" for n, v in res["queries"].items())
            + ".",
            "",
            *tables.head(
                [
                    "rule",
                    "params (pooled tune)",
                    *(SHORT[s] for s in sets),
                    "mean",
                    "LOSO mean",
                    "minus shipped re-tuned",
                    *(f"{k.split(' ')[0]}: minus best published" for k in kinds),
                ],
                "ll" + "r" * (len(sets) + 2) + "l" * (1 + len(kinds)),
            ),
        ]
        for label, r in res["rules"].items():
            lines.append(
                tables.row(
                    [
                        label,
                        json.dumps(r["params"]),
                        *(f"{r['test'][s]:.4f}" for s in sets),
                        f"{r['test_mean']:.4f}",
                        f"{r['loso_mean']:.4f}",
                        _ci(r["minus_tuned_shipped"]),
                        *(_ci(r["kinds"][k]["minus_best_published"]) for k in kinds),
                    ]
                )
            )
        lines.append("")
        lines.append(
            f"`{enc}`: best published rule on the tune halves, per kind: "
            + "; ".join(f"{k}: {v}" for k, v in res["best_published"].items())
            + f". Candidate chosen on the tune halves: {res['chosen_on_tune']}. "
            f"{res['seconds']:.0f} s."
        )
    for key in [k for k in report if k.startswith("long")]:
        if report.get(key):
            lines += ["", *render_long(report[key])]
    lines += [
        "",
        "Commands: `python -m benchmarks run fusion_dump --data "
        "../shared/data`, then `PYTHONPATH=. HF_HUB_OFFLINE=1 python "
        "bench_fusion_adaptive.py --data ../shared/data`. Runs (load average at "
        f"start and end, 2 shared cores, this job on one): {json.dumps(report.get('runs'))}.",
    ]
    return "\n".join(lines)


def summary_lines(report: dict[str, Any]) -> list[str]:
    out = ["What this shows (figures from this run's JSON):", ""]
    out.append(
        "- The goal (+0.01 nDCG@10 over every published hybrid of all-MiniLM-L6-v2 + BM25 on "
        "SciFact-like and ArguAna-like sets) cannot be measured here: neither set is offline. "
        "Proxies: asymmetric sets (qnli, snli) for claims -> abstracts, symmetric ones "
        "(stsb, sick, sts12-16) for argument -> counterargument, and the long-document QNLI "
        "set for long abstracts."
    )
    for enc, res in report.get("short", {}).items():
        best = res["chosen_on_tune"]
        r = res["rules"][best]
        kinds = "; ".join(
            f"{k.split(' ')[0]} {_ci(v['minus_best_published'])} against {res['best_published'][k]}"
            for k, v in r["kinds"].items()
        )
        wins = [
            k
            for k, v in res["rules"].items()
            if v["family"] == "candidate"
            and all(x["minus_best_published"][0] >= 0.01 for x in v["kinds"].values())
        ]
        out.append(
            f"- `{enc}`: the candidate best on the tune halves is {best} "
            f"(test-half mean {r['test_mean']:.4f}; minus the shipped rule re-tuned "
            f"{_ci(r['minus_tuned_shipped'])}; minus the best published rule per kind: {kinds}). "
            "Candidates at +0.01 or more over the best published rule on both kinds: "
            + (", ".join(wins) if wins else "none")
            + "."
        )
    wins_any = [
        (enc, k)
        for enc, res in report.get("short", {}).items()
        for k, v in res["rules"].items()
        if v["family"] == "candidate"
        and all(x["minus_best_published"][0] >= 0.01 for x in v["kinds"].values())
    ]
    for enc in ("mean", "static"):
        if enc not in report.get("short", {}) and report.get("short"):
            out.append(
                f"- `{enc}`: not run (its dumps take ~15 min on the one shared core this "
                "session could use). A rule ships only if it wins for every encoder; with no "
                "candidate at +0.01 for "
                + ", ".join(f"`{e}`" for e in report["short"])
                + ", no `"
                + enc
                + "` figure could change that."
            )
    if not wins_any:
        out.append(
            "- Shipped: nothing from this study. No candidate reaches +0.01 over the best "
            "published rule on either kind of set; the gains are within +-0.003, inside the "
            "95% intervals, and the leave-one-set-out column is no better."
        )
    long = report.get("long")
    if long:
        best = long["chosen_on_tune"]
        r = long["rules"][best]
        fixed = next(v for k, v in long["rules"].items() if k.startswith("shipped (weight"))
        tuned = long["rules"]["best passage (shipped)"]
        p = long.get("product", {})
        same = bool(p) and abs(p["hybrid"] - fixed["test"]) < 1e-4
        out.append(
            f"- Long documents (`mean`): the document-scoring rule best on the tune half is "
            f"{best} (test {r['test']:.4f}, minus the shipped best-passage rule at its tuned "
            f"weight {_ci(r['minus_shipped'])}, not significant); every other combination of "
            "passage scores loses (table): best passage stays. Against us: the shipped "
            f"weight ({fixed['params']:.2f}, chosen on short sets) gives {fixed['test']:.4f}"
            + (
                f", below BM25 alone ({p['lexical']:.4f}; dense alone {p['dense']:.4f})"
                if p
                else ""
            )
            + f", where the same rule at weight {tuned['params']:.2f} (tuned on the tune half) "
            f"gives {tuned['test']:.4f}, level with TM2C2 and DBSF at their tuned weights; "
            "RRF gives "
            f"{long['rules']['published: RRF (k=60)']['test']:.4f}."
            + transfer(report)
            + (
                f" The study's shipped row {'equals' if same else 'differs from'} the product's "
                f"hybrid search ({p.get('hybrid', float('nan')):.4f})."
            )
            + (
                ""
                if report.get("long_stsb")
                else " A lower weight for indexes of long documents is the lead this points "
                "to; not shipped, since it rests on one long-document set of one kind "
                "(questions -> Wikipedia paragraphs)."
            )
        )
    para = report.get("long_stsb")
    if para:
        out.append(long_line(para, long, any(k.startswith("long_article") for k in report)))
    out += coherent_lines(report)
    return out


def coherent_lines(report: dict[str, Any]) -> list[str]:
    """One line per coherent long set: does the glued sets' loss to BM25 reproduce?"""
    out = []
    glued = report.get("long", {}).get("coherence")
    for key in [k for k in report if k.startswith("long_article")]:
        r = report[key]
        rules = r["rules"]
        fixed = next(v for k, v in rules.items() if k.startswith("shipped (weight"))
        tuned = rules["best passage (shipped)"]
        length = rules["length-aware weight, shipped - beta ln(passages)"]
        lo, hi = fixed["minus_bm25"][1:]
        verdict = (
            "below BM25 alone here too: the loss is not the glued documents' artefact"
            if hi < 0
            else "above BM25 alone: the glued sets' loss does not reproduce"
            if lo > 0
            else "level with BM25 alone (interval spans 0)"
        )
        coh = r.get("coherence", {})
        out.append(
            f"- Coherent long documents `{r['source']}` (`{r.get('encoder', 'mean')}`, "
            f"{r['size']['documents']} documents of one SQuAD article each, "
            f"{r['size']['test']} test-half questions; two passages of one document at mean "
            f"cosine {coh.get('within', float('nan')):.3f}"
            + (f", the glued QNLI set's {glued['within']:.3f}" if glued else "")
            + f"): the shipped weight ({fixed['params']:.2f}) gives {fixed['test']:.4f}, "
            f"BM25 alone {rules['BM25 alone']['test']:.4f}, dense alone "
            f"{rules['dense alone']['test']:.4f}; shipped minus BM25 {_ci(fixed['minus_bm25'])}: "
            f"{verdict}. The weight tuned on the tune half ({tuned['params']:.2f}) gives "
            f"{tuned['test']:.4f} (minus the shipped weight {_ci(tuned['minus_fixed'])}); the "
            f"length-aware weight (beta {length['params']}) {length['test']:.4f} (minus the "
            f"shipped weight {_ci(length['minus_fixed'])})."
        )
    out += transfer_lines(report)
    out += pooled_lines(report)
    return out


def pooled_lines(report: dict[str, Any]) -> list[str]:
    """The pooled choice (``pooled``) per encoder, and what the per-index rule at that slope
    gives on the glued long sets (their stored weight curves, at the nearest grid weight)."""
    out = []
    for enc, res in report.get("pooled", {}).items():
        for rule in (*POOLED, "best passage (shipped)"):
            r = res[rule]
            name = "one flat weight for long documents" if rule.startswith("best") else rule
            out.append(
                f"- `{enc}`, {name}: parameter {r['param']} chosen on the tune halves of "
                + " and ".join(f"`{x}`" for x in res["sets"])
                + " pooled; test halves: "
                + "; ".join(
                    f"`{src}` {v['test']:.4f} against {v['shipped']:.4f} at the shipped weight, "
                    f"{_ci(v['minus_shipped'])}"
                    for src, v in r["sets"].items()
                )
                + "."
            )
        beta = float(res[INDEX_RULE]["param"])
        wins = all(v["minus_shipped"][1] > 0 for v in res[INDEX_RULE]["sets"].values())
        slope = fusion.LENGTH_SLOPE if enc == "mean" else (
            fusion.LENGTH_SLOPE_STATIC)  # fmt: skip
        out.append(
            f"- `{enc}`: the per-index rule at beta {beta} "
            + (
                "wins on every coherent set's test half (95% CI above 0)"
                if wins
                else "does not win on every coherent set's test half"
            )  # fmt: skip
            + "; a one-passage document (every short dev set) keeps the shipped weight, so "
            "the short sets' figures (bench_fusion) cannot move. Shipped: "
            + (
                f"`settings.fusion_length_slope{'' if enc == 'mean' else '_static'}` = {slope}"
                if abs(slope - beta) < 1e-9
                else f"slope {slope} (not this beta)"
            )
            + " (flowsearch/search/fusion.py `default_weight`, from the index's live rows per "
            "live document)."
        )
        glued = []
        for key in ("long", "long_stsb"):
            g = report.get(key)
            if enc != "mean" or not g or "curve" not in g:
                continue
            fixed = next(v for n, v in g["rules"].items() if n.startswith("shipped (weight"))
            ratio = g["size"]["passages"] / g["size"]["documents"]
            w = min(max(float(fixed["params"]) - beta * math.log(ratio), 0.0), 1.0)
            curve = g["curve"]["best passage (shipped)"]
            glued.append(
                f"{key} ({ratio:.1f} passages per document): weight {w:.2f}, test half "
                f"{curve[grid_index(w)]:.4f} (at {float(GRID[grid_index(w)]):.2f}) against "
                f"{fixed['test']:.4f} at the shipped weight and "
                f"{g.get('product', {}).get('lexical', float('nan')):.4f} for BM25 alone"
            )
        if glued:
            out.append(
                f"- `{enc}`, the per-index rule at beta {beta} on the glued sets: "
                + "; ".join(glued)
                + "."
            )
    return out


def transfer_lines(report: dict[str, Any]) -> list[str]:
    """The length-aware slope chosen on one coherent set's tune half, on another's test half
    (documents of another length): does the rule, not just its weight, carry over?"""
    out = []
    keys = [k for k in report if k.startswith("long_article") and "length_curve" in report[k]]
    for a, b in itertools.permutations(keys, 2):
        ra, rb = report[a], report[b]
        if ra.get("encoder", "mean") != rb.get("encoder", "mean"):
            continue
        for rule in POOLED:
            curve_a = ra["length_curve"][rule]
            j = int(np.argmax(curve_a["tune"]))
            test_b = rb["length_curve"][rule]["test"]
            out.append(
                f"- `{ra.get('encoder', 'mean')}`, {rule}: beta {LENGTH_BETAS[j]} (best on "
                f"`{ra['source']}`'s tune half) on `{rb['source']}`'s test half "
                f"({rb['mean_passages']:.1f} passages per document): {test_b[j]:.4f} against "
                f"{test_b[0]:.4f} at the shipped weight ({test_b[j] - test_b[0]:+.4f}); the "
                f"best beta there in hindsight {LENGTH_BETAS[int(np.argmax(test_b))]} "
                f"({max(test_b):.4f})."
            )
    return out


def long_line(para: dict[str, Any], qnli: dict[str, Any] | None, coherent: bool = False) -> str:
    """The paraphrase-kind long set in one line, and whether it agrees with the QNLI one."""
    fixed = next(v for k, v in para["rules"].items() if k.startswith("shipped (weight"))
    tuned = para["rules"]["best passage (shipped)"]
    best = para["chosen_on_tune"]
    p = para.get("product", {})
    gain = tuned["test"] - fixed["test"]
    line = (
        f"- Long documents, paraphrase kind (`mean`, STS-B): the shipped weight "
        f"({fixed['params']:.2f}) gives {fixed['test']:.4f} (the product's hybrid search "
        f"{p.get('hybrid', float('nan')):.4f}; BM25 alone {p.get('lexical', float('nan')):.4f}, "
        f"dense alone {p.get('dense', float('nan')):.4f}); best passage at the tune half's "
        f"weight {tuned['params']:.2f} {tuned['test']:.4f} ({gain:+.4f}); the document-scoring "
        f"rule best on the tune half is {best} ({para['rules'][best]['test']:.4f}, minus best "
        f"passage {_ci(para['rules'][best]['minus_shipped'])})."
    )
    if qnli:
        q_fixed = next(v for k, v in qnli["rules"].items() if k.startswith("shipped (weight"))
        q_tuned = qnli["rules"]["best passage (shipped)"]
        both = gain >= 0.01 and q_tuned["test"] - q_fixed["test"] >= 0.01
        below = all(
            x.get("product", {}).get("lexical", -1.0) > f["test"]
            for x, f in ((para, fixed), (qnli, q_fixed))
        )
        line += (
            " Both long sets gain 0.01 or more from a lower weight than the short sets' "
            f"({q_tuned['params']:.2f} and {tuned['params']:.2f})"
            + (", and on both the shipped hybrid is below BM25 alone" if below else "")
            + ": the lead for a separate default weight for indexes "
            "of long documents. Not shipped: both sets are concatenations of short sentences, "
            "whose passage vectors average unrelated facts (dense alone far below BM25 on "
            "both), which a real abstract or argument, one text, is not; the weight may be "
            "the construction's. "
            + (
                "The coherent sets below (one SQuAD article per document) settle it."
                if coherent
                else "It needs a long-document set of real texts."
            )
            if both
            else " This set does not confirm the QNLI set's lower weight by 0.01 or more."
        )
    return line


# -- long documents ------------------------------------------------------------------------


LONG_WORK = WORK / "fusion_long"
#: The length-aware rules' slopes: weight = shipped - beta x ln(passages per document).
LENGTH_BETAS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6)
INDEX_RULE = "length-aware weight per index, shipped - beta ln(mean passages)"
#: Rules whose one parameter is also chosen on the coherent sets' tune halves pooled.
POOLED = ("length-aware weight, shipped - beta ln(passages)", INDEX_RULE)


def pooled(report: dict[str, Any]) -> dict[str, Any]:
    """Per encoder: each one-parameter rule's parameter chosen on the coherent sets' tune halves
    pooled (each set weighs the same), and each set's test half at it minus the shipped weight
    (95% CI, paired). Also the flat weight for long documents chosen the same way."""
    out: dict[str, Any] = {}
    keys = [k for k in report if k.startswith("long_article") and "_q" in report[k]]
    for enc in sorted({report[k].get("encoder", "mean") for k in keys}):
        mine = [k for k in keys if report[k].get("encoder", "mean") == enc]
        if len(mine) < 2:
            continue
        grids = {rule: list(LENGTH_BETAS) for rule in POOLED}
        grids["best passage (shipped)"] = [float(w) for w in GRID]
        res: dict[str, Any] = {"sets": [report[k]["source"] for k in mine]}
        for rule, grid in grids.items():
            tune = np.mean([report[k]["length_curve"][rule]["tune"] for k in mine], axis=0)
            j = int(np.argmax(tune))
            per = {}
            for k in mine:
                r = report[k]
                fixed = next(v for n, v in r["rules"].items() if n.startswith("shipped (weight"))
                w_s = float(fixed["params"])
                base = r["_q"]["best passage (shipped)"][grid_index(w_s)]
                got = r["_q"][rule][j]
                per[r["source"]] = {
                    "test": round(float(got.mean()), 4),
                    "shipped": round(float(base.mean()), 4),
                    "minus_shipped": paired({"x": got}, {"x": base}, ["x"]),
                }
            res[rule] = {"param": grid[j], "sets": per}
        out[enc] = res
    return out


def grid_index(w: float) -> int:
    return int(np.argmin(np.abs(GRID - w)))


#: Sentences per document of the STS-B long set (its sentences are short: ~300 tokens).
STSB_PER_DOC = 24


def stsb_long(data: Path, per_doc: int = STSB_PER_DOC, seed: int = 0) -> dict[str, Any]:
    """STS-B (train, dev, test; original text), pairs with gold >= 4: the second sentences
    grouped ``per_doc`` to a document by topic (as ``bench_passages.py``), each pair's first
    sentence a query whose relevant document holds its second (the paraphrase kind)."""
    from benchmarks.studies.quality.bench_passages import _topic_order

    pairs = []
    for split_name in ("train", "dev", "test"):
        for line in (data / "stsb" / f"sts-{split_name}.csv").read_text("utf-8").splitlines():
            cols = line.split("\t")
            if len(cols) >= 7 and float(cols[4]) >= 4.0 and cols[5] != cols[6]:
                pairs.append((cols[5], cols[6]))
    sentences = sorted({b for _, b in pairs})
    order = _topic_order(sentences, 100_000, per_doc, np.random.default_rng(seed))
    doc_of: dict[str, int] = {}
    docs = []
    for d in range(len(order) // per_doc):
        texts = [sentences[i] for i in order[d * per_doc : (d + 1) * per_doc]]
        for t in texts:
            doc_of[t] = d
        docs.append(" ".join(texts))
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for a, b in pairs:
        if b in doc_of and a not in queries.values():
            qid = f"q{len(queries)}"
            queries[qid] = a
            qrels[qid] = {f"doc{doc_of[b]}": 1}
    return {"docs": docs, "queries": queries, "qrels": qrels}


#: Sentences per document of the coherent QNLI sets (``article16``, ``article32``).
ARTICLE_SOURCES = {"article16": 16, "article32": 32}
#: Articles of SQuAD v1.1's dev split, whose paragraphs QNLI's dev set is built from.
SQUAD_DEV_ARTICLES = 48


def qnli_articles(data: Path, per_doc: int = 16) -> dict[str, Any]:
    """A long-document set whose documents are each ONE topic (issue 32: the other sets glue
    unrelated sentences). QNLI's dev pairs come from SQuAD's dev paragraphs: a question is
    paired with sentences of its own paragraph, so the question <-> sentence links (both
    labels) join sentences into paragraph fragments. The fragments are clustered into
    ``SQUAD_DEV_ARTICLES`` articles (average-linkage cosine over TF-IDF of each fragment's
    sentences and questions, terms in 2 or more fragments and at most 5% of them); within an
    article, a document is a seed fragment (fragments in text order) and the article's unused
    fragments nearest it, until ``per_doc`` sentences; an article's remainder under half of
    ``per_doc`` joins its last document, and an article with fewer than half of ``per_doc``
    sentences is left out. Queries: the questions with an ``entailment`` sentence in a kept
    document, relevant = that document (a question whose entailed sentences fall in two
    documents is dropped)."""
    from scipy.cluster.hierarchy import fcluster, linkage

    from flowsearch.evaluation.datasets import load_qnli
    from flowsearch.lexical.tokens import tokenize_batch

    pairs = load_qnli(data, "dev")
    parent: dict[str, str] = {}

    def root(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for q, s in zip(pairs.s1, pairs.s2, strict=True):
        a, b = root("Q" + q), root("S" + s)
        if a != b:
            parent[a] = b
    frag: dict[str, list[str]] = {}
    words: dict[str, list[str]] = {}
    for q, s in zip(pairs.s1, pairs.s2, strict=True):
        r = root("S" + s)
        if s not in frag.setdefault(r, []):
            frag[r].append(s)
        words.setdefault(r, []).append(q)
    keys = sorted(frag, key=lambda r: sorted(frag[r])[0])
    sents = [sorted(frag[k]) for k in keys]
    toks = tokenize_batch([" ".join(sents[i] + sorted(set(words[k]))) for i, k in
                           enumerate(keys)])  # fmt: skip
    df: dict[str, int] = {}
    for t in toks:
        for w in set(t):
            df[w] = df.get(w, 0) + 1
    vocab = {w: j for j, w in enumerate(sorted(w for w, n in df.items()
                                               if 2 <= n <= 0.05 * len(keys)))}  # fmt: skip
    X = np.zeros((len(keys), len(vocab)))
    for i, t in enumerate(toks):
        for w in t:
            if w in vocab:
                X[i, vocab[w]] += 1
    X = np.where(X > 0, 1 + np.log(np.maximum(X, 1)), 0.0)
    X *= np.log(len(keys) / np.array([df[w] for w in vocab]))[None, :]
    X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    empty = ~X.any(axis=1)
    X[empty, 0] = 1.0  # a fragment with no kept term: its own (far) point
    labels = fcluster(linkage(X, "average", metric="cosine"), SQUAD_DEV_ARTICLES, "maxclust")
    docs: list[list[str]] = []
    for c in sorted(set(labels.tolist())):
        members = list(np.flatnonzero(labels == c))
        if sum(len(sents[i]) for i in members) < per_doc // 2:
            continue
        free = set(members)
        first = len(docs)
        while free:
            seed = min(free)
            free.discard(seed)
            group = list(sents[seed])
            near = sorted(free, key=lambda i: (-float(X[i] @ X[seed]), i))
            for i in near:
                if len(group) >= per_doc:
                    break
                group += sents[i]
                free.discard(i)
            if len(group) < per_doc // 2 and len(docs) > first:
                docs[-1] += group
            else:
                docs.append(group)
    doc_of = {s: d for d, group in enumerate(docs) for s in group}
    answers: dict[str, set[int]] = {}
    for q, s, label in zip(pairs.s1, pairs.s2, pairs.scores, strict=True):
        if label == 1.0 and s in doc_of:
            answers.setdefault(q, set()).add(doc_of[s])
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    for q in sorted(answers):
        if len(answers[q]) == 1:
            qid = f"q{len(queries)}"
            queries[qid] = q
            qrels[qid] = {f"doc{next(iter(answers[q]))}": 1}
    return {"docs": [" ".join(g) for g in docs], "queries": queries, "qrels": qrels,
            "sentences": [len(g) for g in docs]}  # fmt: skip


def long_dump(data: Path, encoder: str = "mean", source: str = "qnli") -> Path:
    """Build the long-document set's index with the shipped defaults; dump passage vectors,
    query vectors, each row's document, and the texts. Returns the ``.npz``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.studies.quality.bench_passages import _dev_set
    from flowsearch import Searcher, build_index

    tag = encoder if source == "qnli" else f"{source}_{encoder}"
    target = LONG_WORK / f"{tag}.npz"
    if target.is_file():
        return target
    LONG_WORK.mkdir(parents=True, exist_ok=True)
    if source == "qnli":
        dev = _dev_set(data, 10_000, 16, 100_000, "topic")
    elif source in ARTICLE_SOURCES:
        dev = qnli_articles(data, ARTICLE_SOURCES[source])
    else:
        dev = stsb_long(data)
    ids = [f"doc{i}" for i in range(len(dev["docs"]))]
    corpus = LONG_WORK / f"docs_{tag}.parquet"
    pq.write_table(pa.table({"id": ids, "text": dev["docs"]}), corpus)
    build_index(corpus, LONG_WORK / f"index_{tag}", pooling=encoder, overwrite=True)
    s = Searcher.open(LONG_WORK / f"index_{tag}")
    rec_ids, texts = [], []
    for seg in s.version.segments:
        t = seg.reader.table(["id", "text"])
        rec_ids += [str(x) for x in t.column("id").to_pylist()]
        texts += [str(x) for x in t.column("text").to_pylist()]
    qids = list(dev["queries"])
    Z, _ = s.embed([dev["queries"][q] for q in qids])
    V = s.vectors()
    ref = s.version.fusion()
    doc_of = np.array([int(i[3:]) for i in rec_ids])
    np.savez_compressed(
        target,
        vectors=V.astype(np.float32),
        q_vectors=Z.astype(np.float32),
        doc_of=doc_of,
        relevant=np.array([int(next(iter(dev["qrels"][q]))[3:]) for q in qids]),
        background=np.array(ref.dense_background if ref is not None else 0.0),
    )
    (LONG_WORK / f"{tag}.json").write_text(
        json.dumps(
            {"docs": dev["docs"], "passages": texts, "queries": [dev["queries"][q] for q in qids]}
        )  # fmt: skip
    )
    s.close()
    return target


def coherence(V: np.ndarray, doc_of: np.ndarray, seed: int = 0) -> dict[str, float]:
    """How one-topic a set's documents are, seen by the dense side: the mean cosine between
    two passages of one document, and between passages of two documents (random pairs)."""
    rng = np.random.default_rng(seed)
    Vn = V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-12)
    order = np.argsort(doc_of, kind="stable")
    same = [
        float(Vn[a] @ Vn[b])
        for d in np.unique(doc_of)
        for a, b in itertools.combinations(order[doc_of[order] == d], 2)
    ]
    i, j = rng.integers(len(V), size=(2, 20_000))
    other = doc_of[i] != doc_of[j]
    across = np.einsum("ij,ij->i", Vn[i[other]], Vn[j[other]])
    return {"within": round(float(np.mean(same)), 4), "across": round(float(across.mean()), 4)}


def study_long(
    data: Path,
    encoder: str = "mean",
    source: str = "qnli",
    stored: dict[str, Any] | None = None,
    query_signals: bool = True,
) -> dict[str, Any]:
    from benchmarks.studies.fusion.bench_fusion_query import Lexical
    from flowsearch.search.scores import FusionReference

    t0 = time.perf_counter()
    tag = encoder if source == "qnli" else f"{source}_{encoder}"
    npz = np.load(long_dump(data, encoder, source))
    texts = json.loads((LONG_WORK / f"{tag}.json").read_text())
    V, Z, doc_of = npz["vectors"], npz["q_vectors"], npz["doc_of"]
    rel = npz["relevant"]
    n_docs = int(doc_of.max()) + 1
    ref = FusionReference(0, len(V), float(npz["background"]))
    D = Z @ V.T
    lp = Lexical(texts["passages"])
    qc, unknown = lp.queries(texts["queries"])
    Lp, up = lp.scores(qc, unknown)
    ld = Lexical(texts["docs"])
    qd, unk_d = ld.queries(texts["queries"])
    Ld, ud = ld.scores(qd, unk_d)
    nd = normalise_dense(D, ref)
    nl = normalise_lexical(Lp, up)
    nl_doc = normalise_lexical(Ld, ud)
    tune = split(len(Z), f"{source}-long")
    members = [np.flatnonzero(doc_of == j) for j in range(n_docs)]
    order = np.argsort(doc_of, kind="stable")
    starts = np.searchsorted(doc_of[order], np.arange(n_docs))

    def per_doc_max(x: np.ndarray) -> np.ndarray:
        return np.maximum.reduceat(x[:, order], starts, axis=1)

    def per_doc_second(x: np.ndarray) -> np.ndarray:
        out = np.zeros((len(x), n_docs))
        for j, m in enumerate(members):
            if len(m) > 1:
                out[:, j] = np.sort(x[:, m], axis=1)[:, -2]
        return out

    def ndcg(doc_scores: np.ndarray) -> np.ndarray:
        # binary relevance, one relevant document: 1 / log2(rank + 1) within the top 10
        mine = doc_scores[np.arange(len(rel)), rel]
        key = doc_scores - np.arange(n_docs)[None, :] * 1e-13
        above = (key > (mine - rel * 1e-13)[:, None]).sum(1)
        return np.where(above < 10, 1.0 / np.log2(above + 2), 0.0)

    sweeps: dict[str, Swept] = {}
    shares = (0.1, 0.2, 0.3, 0.5)
    best_q, second_q, par_s = [], [], []
    for w in GRID:
        fused = w * nd + (1 - w) * nl
        best, second = per_doc_max(fused), per_doc_second(fused)
        best_q.append(ndcg(best))
        for share in shares:
            second_q.append(ndcg(best + share * second))
            par_s.append((share, float(w)))
    sweeps["best passage (shipped)"] = (best_q, [float(w) for w in GRID])
    sweeps["best + share x second best passage"] = (second_q, par_s)
    md, ml = per_doc_max(nd), per_doc_max(nl)
    sweeps["each side's best passage, fused"] = ([ndcg(w * md + (1 - w) * ml) for w in GRID],
                                                 [float(w) for w in GRID])  # fmt: skip
    sweeps["dense best passage + document BM25"] = (
        [ndcg(w * md + (1 - w) * nl_doc) for w in GRID],
        [float(w) for w in GRID],
    )
    sweeps["dense best passage + max(passage, document) BM25"] = (
        [ndcg(w * md + (1 - w) * np.maximum(ml, nl_doc)) for w in GRID],
        [float(w) for w in GRID],
    )
    # published rules on passages (each side's statistics from its own top 100 passages,
    # every passage scored), a document by its best passage
    side_d = -np.sort(-D, axis=1)[:, :C]
    side_l = -np.sort(-Lp, axis=1)[:, :C]
    side_l = np.where(side_l > 0, side_l, np.nan)
    for label, (pd, pl) in {
        "published: TM2C2, dense bound -1": (fr.tm2c2(D, side_d, -1.0), fr.tm2c2(Lp, side_l, 0.0)),
        "published: DBSF": (fr.dbsf(D, side_d), np.where(Lp > 0, fr.dbsf(Lp, side_l), 0.0)),
    }.items():
        pd, pl = np.nan_to_num(pd), np.nan_to_num(pl)
        sweeps[label] = (
            [ndcg(per_doc_max(w * pd + (1 - w) * pl)) for w in GRID],
            [float(w) for w in GRID],
        )
    rank_d = np.argsort(np.argsort(-D, axis=1), axis=1) + 1.0
    rank_l = np.argsort(np.argsort(-Lp, axis=1), axis=1) + 1.0
    rrf = 1 / (60 + rank_d) + np.where(Lp > 0, 1 / (60 + rank_l), 0.0)
    sweeps["published: RRF (k=60)"] = ([ndcg(per_doc_max(rrf))], [None])
    # length-aware: a document's weight falls with its passages, w(n) = clip(w_s - beta ln n),
    # w_s the shipped weight, so a one-passage document (every short set) scores as today
    n_pass = np.bincount(doc_of, minlength=n_docs)
    w_s = fusion.DENSE_WEIGHT if encoder == "mean" else (
        fusion.DENSE_WEIGHT_STATIC)  # fmt: skip
    per, params = [], []
    for beta in LENGTH_BETAS:
        w = np.clip(w_s - beta * np.log(n_pass[doc_of]), 0, 1)[None, :]
        per.append(ndcg(per_doc_max(w * nd + (1 - w) * nl)))
        params.append(beta)
    sweeps["length-aware weight, shipped - beta ln(passages)"] = (per, params)
    # the same with one weight per index: its mean passages per document
    per = []
    for beta in LENGTH_BETAS:
        w = float(np.clip(w_s - beta * np.log(len(V) / n_docs), 0, 1))
        per.append(ndcg(per_doc_max(w * nd + (1 - w) * nl)))
    sweeps[INDEX_RULE] = (per, list(LENGTH_BETAS))
    # (a) query-dependent weight, signals standardised on the tune half
    terms = np.maximum(np.asarray(qc.sum(1)).reshape(-1) + unknown / lp.idf_unknown, 1)
    signals = {
        "idf": up / terms / math.log(1 + lp.n),
        "terms": np.log(terms),
        "dense_conf": nd.max(1),
        "lex_conf": nl.max(1),
    }
    for f, x in signals.items() if query_signals else ():
        z = (x - x[tune].mean()) / (x[tune].std() or 1.0)
        per, params = [], []
        for beta in BETAS:
            for w0 in GRID:
                w = np.clip(w0 + beta * z, 0, 1)[:, None]
                per.append(ndcg(per_doc_max(w * nd + (1 - w) * nl)))
                params.append((float(w0), beta))
        sweeps[f"(a) weight by {f}"] = (per, params)
    shipped_w = fusion.DENSE_WEIGHT if encoder == "mean" else (
        fusion.DENSE_WEIGHT_STATIC)  # fmt: skip
    fixed = ndcg(per_doc_max(shipped_w * nd + (1 - shipped_w) * nl))[~tune]
    res: dict[str, Any] = {"rules": {}}
    res["rules"][f"shipped (weight {shipped_w:.2f})"] = {"params": shipped_w,
                                                         "test": float(fixed.mean())}  # fmt: skip
    chosen_q = {}
    for label, (per, params) in sweeps.items():
        j = int(np.argmax([x[tune].mean() for x in per]))
        chosen_q[label] = per[j][~tune]
        res["rules"][label] = {
            "params": params[j],
            "tune": round(float(per[j][tune].mean()), 4),
            "test": round(float(per[j][~tune].mean()), 4),
        }
    alone = {
        "dense alone": ndcg(per_doc_max(nd))[~tune],
        "BM25 alone": ndcg(per_doc_max(nl))[~tune],
    }
    for label, q in alone.items():
        res["rules"][label] = {"params": None, "test": round(float(q.mean()), 4)}
        chosen_q[label] = q
    base = chosen_q["best passage (shipped)"]
    for label, r in res["rules"].items():
        q = chosen_q.get(label, fixed)
        r["minus_shipped"] = paired({"x": q}, {"x": base}, ["x"])
        r["minus_fixed"] = paired({"x": q}, {"x": fixed}, ["x"])
        r["minus_bm25"] = paired({"x": q}, {"x": alone["BM25 alone"]}, ["x"])
    res["curve"] = {
        label: [round(float(x[~tune].mean()), 4) for x in sweeps[label][0]]
        for label in ("best passage (shipped)", "published: TM2C2, dense bound -1",
                      "published: DBSF")
    }  # fmt: skip
    res["length_curve"] = {
        label: {
            "tune": [round(float(x[tune].mean()), 4) for x in sweeps[label][0]],
            "test": [round(float(x[~tune].mean()), 4) for x in sweeps[label][0]],
        }
        for label in (*POOLED, "best passage (shipped)")
    }
    # per-query test halves of every grid point, for pooling the tune halves across sets
    # (main: ``pooled``); not written to the JSON
    res["_q"] = {label: [x[~tune] for x in sweeps[label][0]] for label in res["length_curve"]}
    res["mean_passages"] = round(len(V) / n_docs, 3)
    if stored and stored.get("product") and stored.get("size", {}).get("passages") == len(V):
        res["product"] = stored["product"]  # the same index, searched before
    else:
        res["product"] = product_check(tag, texts["queries"], rel, ~tune)
    res["source"] = source
    cands = [k for k in sweeps if k != "best passage (shipped)" and not k.startswith("published")]
    res["chosen_on_tune"] = max(cands, key=lambda k: res["rules"][k]["tune"])
    res["encoder"] = encoder
    res["coherence"] = coherence(V, doc_of)
    res["passages_per_document"] = [round(float(x), 2) for x in
                                     np.percentile(n_pass, [0, 10, 50, 90, 100])]  # fmt: skip
    res["size"] = {"documents": n_docs, "passages": len(V), "queries": len(Z),
                   "tune": int(tune.sum()), "test": int((~tune).sum())}  # fmt: skip
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def product_check(tag: str, queries: list[str], rel: np.ndarray, test: np.ndarray,
                  modes: Sequence[str] = ("hybrid", "dense", "lexical")) -> dict:  # fmt: skip
    """nDCG@10 of ``Searcher.search(k=10)`` on the test half, each mode: the study's shipped
    row must equal the product's hybrid."""
    from flowsearch import Searcher

    s = Searcher.open(LONG_WORK / f"index_{tag}")
    which = np.flatnonzero(test)
    out = {}
    for mode in modes:
        hits = s.search([queries[i] for i in which], k=10, mode=mode)
        got = []
        for i, hs in zip(which, hits, strict=True):
            ids = [str(h.id) for h in hs]
            r = f"doc{rel[i]}"
            got.append(1 / math.log2(ids.index(r) + 2) if r in ids else 0.0)
        out[mode] = round(float(np.mean(got)), 4)
    s.close()
    return out


def recheck_product(report: dict[str, Any]) -> None:
    """The product's hybrid search, as it ships now (the length-aware default weight), on each
    coherent set's stored index and test half."""
    for key in [k for k in report if k.startswith("long_article")]:
        r = report[key]
        tag = f"{r['source']}_{r.get('encoder', 'mean')}"
        texts = json.loads((LONG_WORK / f"{tag}.json").read_text())
        rel = np.load(LONG_WORK / f"{tag}.npz")["relevant"]
        tune = split(len(rel), f"{r['source']}-long")
        got = product_check(tag, texts["queries"], rel, ~tune, ("hybrid",))
        r["product_shipped"] = {"hybrid": got["hybrid"],
                                "slope": fusion.LENGTH_SLOPE}  # fmt: skip


def render_long(long: dict[str, Any]) -> list[str]:
    sz = long["size"]
    source, enc = long.get("source", "qnli"), long.get("encoder", "mean")
    if source == "qnli":
        what = (
            f"Long documents (`{enc}`; {sz['documents']} documents of 16 QNLI dev sentences by "
            f"topic, {sz['passages']} passages at the shipped 128/16 cut, {sz['queries']} QNLI "
            f"questions"
        )
    elif source in ARTICLE_SOURCES:
        what = (
            f"Coherent long documents `{source}` (`{enc}`; {sz['documents']} documents of "
            f"about {ARTICLE_SOURCES[source]} QNLI dev sentences of one SQuAD article, "
            f"{sz['passages']} passages at the shipped 128/16 cut (per document, min/10%/"
            f"median/90%/max: {long['passages_per_document']}), {sz['queries']} QNLI questions"
        )
    else:
        what = (
            f"Long documents, paraphrase kind (`{enc}`; {sz['documents']} documents of "
            f"{STSB_PER_DOC} STS-B sentences by topic, {sz['passages']} passages at the "
            f"shipped 128/16 cut, {sz['queries']} STS-B first sentences (gold >= 4) whose "
            "paraphrase is in one document"
        )
    coh = long.get("coherence")
    lines = [
        what
        + f", {sz['test']} in the test half; every passage scored"
        + (
            f"; mean cosine of two passages of one document {coh['within']:.3f}, of two "
            f"documents {coh['across']:.3f}"
            if coh
            else ""
        )
        + "): test-half nDCG@10 with parameters tuned on the tune half; minus the shipped "
        "rule (best passage) at its tuned weight, at the shipped weight, and minus BM25 "
        "alone, 95% CI (queries resampled, paired):",
        "",
        "| document score | params (tune) | tune | test | minus best passage (tuned) "
        "| minus shipped weight | minus BM25 alone |",
        "|---|---|---:|---:|---|---|---|",
    ]
    for label, r in long["rules"].items():
        tune = f"{r['tune']:.4f}" if "tune" in r else "-"
        extra = [_ci(r[k]) if k in r else "-" for k in ("minus_fixed", "minus_bm25")]
        lines.append(
            f"| {label} | {json.dumps(r['params'])} | {tune} | {r['test']:.4f} "
            f"| {_ci(r['minus_shipped'])} | " + " | ".join(extra) + " |"
        )
    if "curve" in long:
        lines += [
            "",
            "Test-half nDCG@10 by dense weight (" + ", ".join(f"{w:.2f}" for w in GRID) + "):",
            "",
        ]
        lines += [f"- {k}: " + ", ".join(f"{x:.3f}" for x in v) for k, v in long["curve"].items()]
    if "product" in long:
        p = long["product"]
        lines += [
            "",
            f"The product itself (`Searcher.search(k=10)` on the test half): hybrid "
            f"{p['hybrid']:.4f}, dense {p['dense']:.4f}, lexical {p['lexical']:.4f}"
            + (
                f"; hybrid with the length-aware default weight (slope "
                f"{long['product_shipped']['slope']}): {long['product_shipped']['hybrid']:.4f}."
                if "product_shipped" in long
                else "."
            ),
        ]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="../shared/data (or $FLOWSEARCH_DATA)")
    parser.add_argument("--max-corpus", type=int, default=6000)
    parser.add_argument("--encoders", default="mean,static")
    parser.add_argument("--no-long", action="store_true", help="skip the long-document study")
    parser.add_argument("--long-sets", default="qnli,stsb", help="long-document sets to study")
    parser.add_argument("--no-signals", action="store_true", help="long sets: no (a) sweeps")
    parser.add_argument("--recheck-product", action="store_true", help="coherent sets: hybrid now")
    parser.add_argument("--long-encoders", default="mean", help="encoders of the long sets")
    parser.add_argument("--merge", action="store_true", help="keep the stored report's parts")
    parser.add_argument("--out", default=str(HERE / "bench_fusion_adaptive"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if args.report_only:
        publish(args.out, render, None)
        return 0
    from flowsearch.evaluation.datasets import resolve_data_dir

    stored = Path(args.out + ".json")
    report: dict[str, Any] = {"short": {}, "runs": []}
    if args.merge and stored.is_file():
        report = json.loads(stored.read_text())
    started, load = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    for enc in [e for e in args.encoders.split(",") if e]:
        report["short"][enc] = study_short(enc, args.max_corpus)
    if not args.no_long:
        for source in [x for x in args.long_sets.split(",") if x]:
            for enc in [e for e in args.long_encoders.split(",") if e]:
                key = ("long" if source == "qnli" else f"long_{source}") + (
                    "" if enc == "mean" else f"_{enc}")  # fmt: skip
                report[key] = study_long(resolve_data_dir(args.data), enc, source,
                                         report.get(key), not args.no_signals)  # fmt: skip
    if args.recheck_product:
        recheck_product(report)
    report["pooled"] = pooled(report) or report.get("pooled", {})
    for key in [k for k in report if k.startswith("long")]:
        report[key].pop("_q", None)
    report["runs"].append(
        {
            "encoders": args.encoders,
            "long": "" if args.no_long else args.long_sets,
            "load_average": [load, [round(x, 2) for x in os.getloadavg()]],
            "seconds": round(time.perf_counter() - started, 1),
        }
    )
    publish(args.out, render, report)
    return 0


if __name__ == "__main__":
    harness.script(main)
