r"""Reports in plain words (issue 24): how often the query verdict and the drift report are right.

Usage::

    python -m benchmarks run drift [--data ../shared/data] [--dev DIR]
        [--poolings mean,static] [--batches 200] [--render]
    python -m benchmarks run drift --smoke   # static, 5 batches; figures untouched

The dev sets are ``make_dev_sets.py``'s at ``--max-corpus 3000`` (built under
``benchmarks/_work/dev_sets_3000`` when ``--dev`` is not given).

Writes ``benchmarks/studies/drift/bench_drift.json`` and ``.md``.

Each dev set's 3,000-text corpus (``make_dev_sets.py``) is split, seeded: 500 texts are kept
aside as *new rows* to add later, and an index is built the product's way from the others:
:func:`~flowsearch.space.reference.split_fit_rows`, ``auto``
(:func:`~flowsearch.space.fitting.fit_for_index` with the encoder's pooling), every row projected
into the searched space. Three indexes per set and pooling:

- ``2,500 rows, held-out``: the product's reference for a corpus this size, the 250 rows held
  out of the calibrator's fit (:func:`~flowsearch.space.reference.reference_rows`);
- ``2,500 rows, leave-one-out``: 2,000 rows of the same index, each against the others (fit
  rows included): does measuring on rows the calibrator saw matter?
- ``300 rows, leave-one-out``: a corpus as small as the demo's (no rows held out; ``auto``
  keeps the encoder's space below 3 rows per dimension), the product's reference for it.

**Query verdict** (:func:`~flowsearch.space.reports.query_report`): every query of every set is
searched in every index; its best score excludes a row with the very same text (the symmetric
sets' queries are corpus sentences). Flagged = percentile below ``OOD_PERCENTILE``
(:mod:`flowsearch.space.reference`).
The set's own queries flagged are false alarms; other sets' queries flagged are catches (the
caption sets, SICK and SNLI, are close to each other: their cross catches are low by nature).
The product declines to judge in an anisotropic encoder space (mean cosine above ``auto``'s
0.33): those cells give the rule's rates as if it had judged, and say so.

**Drift** (:func:`~flowsearch.space.drift.drift_report`): batches of 5, 20 and 100 new rows,
each row's best score against the index, drawn (seeded) from the set's own 500 aside (the same
distribution: an alarm is false) or from another set's (an alarm is a catch; the other set is
drawn per batch). Beside it, the previous release's rule on the same batches: the new rows' mean
log-density one held-out standard deviation or more below the held-out rows' mean. And batches
of 20 index rows with one word prepended, each against the index without its own original (an
edited passage upserted): the previous rule's complaint in issue 24.

**Demo corpus**: ``data/sample.parquet`` (300 passages, 15 topics) built with ``build_index`` and
searched with ``Searcher.query``: 30 questions written for it (2 per topic, answered by its
passages) and 200 queries of each dev set.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.dev_sets import dev_sets  # noqa: E402
from benchmarks.common.harness import (  # noqa: E402
    ROOT,
    WORK,
    arguments,
    command_line,
    data_dir,
    finish,
    parse,
    rendered,
)
from benchmarks.studies.density.density_data import VectorStore  # noqa: E402
from benchmarks.studies.drift.bench_drift_report import BATCH_SIZES, SETS, VARIANTS, markdown  # noqa: E402
from flowsearch.evaluation.beir import load_beir  # noqa: E402
from flowsearch.space.drift import drift_report  # noqa: E402
from flowsearch.space.fitting import fit_for_index  # noqa: E402
from flowsearch.space.reference import (  # noqa: E402
    OOD_PERCENTILE,
    Reference,
    reference_rows,
    reliable,
    split_fit_rows,
)
from flowsearch.space.reports import query_report  # noqa: E402
from flowsearch.space.search_space import SearchSpace  # noqa: E402

LOG = logging.getLogger("bench_drift")
ASIDE = 500
SMALL = 300
DEMO_QUESTIONS = (
    "Which painting movement tried to capture fleeting light?",
    "How does linear perspective create depth?",
    "Why do we see phases of the Moon?",
    "What causes a solar eclipse?",
    "How do octopuses change colour?",
    "How do plants turn light into sugar?",
    "How does a hash table find a key quickly?",
    "How does public-key encryption work?",
    "What makes sourdough bread rise?",
    "Why does meat brown when it is seared?",
    "What do central banks do with interest rates?",
    "Why do countries gain from trade?",
    "How do I make compost from kitchen scraps?",
    "What soil pH do most garden plants like?",
    "Which river carries the most water?",
    "How high is Mount Everest?",
    "When was the Magna Carta sealed?",
    "What was the Black Death?",
    "What was the Great Vowel Shift?",
    "Is Mandarin a tonal language?",
    "How do vaccines train the immune system?",
    "How do bacteria become resistant to antibiotics?",
    "How does a violin make its sound?",
    "Where did the blues come from?",
    "How does a heat pump move heat?",
    "What are Newton's laws of motion?",
    "What is the offside rule in football?",
    "How long is a marathon?",
    "How does a jet engine produce thrust?",
    "How do aircraft wings generate lift?",
)


def best_excluding(Zq: np.ndarray, Z: np.ndarray, same: list[np.ndarray] | None) -> np.ndarray:
    """float64 (q,): each query's best inner product over rows Z, skipping ``same[i]``."""
    out = np.empty(len(Zq), np.float64)
    for start in range(0, len(Zq), 1024):
        S = Zq[start : start + 1024] @ Z.T
        if same is not None:
            for i, rows in enumerate(same[start : start + 1024]):
                S[i, rows] = -np.inf
        out[start : start + len(S)] = S.max(axis=1)
    return out


class Index:
    """One index the product's way: split, ``auto`` fit, projection, and its references."""

    def __init__(self, texts: list[str], U: np.ndarray, pooling: str) -> None:
        self.texts = texts
        self.where = {}
        for i, t in enumerate(texts):
            self.where.setdefault(t, []).append(i)
        n = len(texts)
        fit, held = split_fit_rows(n, 200_000)
        cal, spec = fit_for_index(U[fit], "auto", pooling=pooling)
        self.space, self.spec = SearchSpace(cal, spec), spec
        self.Z, lp = self.space.project(U)
        self.lp = lp if lp is not None and reliable(spec.fit_rows, self.space.dim) else None
        self.held = held
        self.mean_cosine = spec.anisotropy.get("mean_cosine") if spec.space == "encoder" else None

    def reference(self, rows: np.ndarray, method: Any) -> Reference:
        own = [np.array([r]) for r in rows]
        top = best_excluding(self.Z[rows], self.Z, own)
        return Reference.from_scores(
            top,
            method=method,
            n_corpus=len(self.texts),
            space=self.spec.space,
            mean_cosine=self.mean_cosine,
            log_densities=None if self.lp is None else self.lp[rows],
        )

    def best(self, texts: list[str], U: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Best scores of texts (raw vectors U) against the index, a same-text row excluded;
        their log-densities (None without a reliable density)."""
        Zq, lp = self.space.project(U)
        same = [np.array(self.where.get(t, []), dtype=np.int64) for t in texts]
        return best_excluding(Zq, self.Z, same), None if self.lp is None else lp


def verdicts(index: Index, ref: Reference, queries: dict[str, tuple[list[str], np.ndarray]],
             ) -> dict[str, Any]:  # fmt: skip
    """Share of each set's queries flagged, and whether the product judges at all."""
    out: dict[str, Any] = {"flagged": {}}
    probe = query_report(ref.score_at(50.0), ref)
    out["judged"] = probe.verdict != "not judged"
    out["reason"] = probe.reason
    cut = OOD_PERCENTILE
    for name, (texts, U) in queries.items():
        top, _ = index.best(texts, U)
        out["flagged"][name] = round(float(np.mean(ref.percentiles(top) < cut)), 4)
    return out


def old_rule(lp_new: np.ndarray | None, lp_ref: np.ndarray | None) -> bool | None:
    """The previous release's drift alarm: mean log-density >= 1 reference std below."""
    if lp_new is None or lp_ref is None:
        return None
    gap = (lp_ref.mean() - lp_new.mean()) / max(float(lp_ref.std()), 1e-9)
    return bool(gap >= 1.0)


Scored = dict[str, tuple[np.ndarray, np.ndarray | None]]


def drift(index: Index, ref: Reference, aside: Scored, own: str, ref_lp: np.ndarray | None,
          batches: int, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Verdict shares over batches of new rows from the set itself and from the others."""
    rng = np.random.default_rng(seed)
    others = [s for s in aside if s != own]
    out: dict[str, Any] = {}
    for n in BATCH_SIZES:
        row: dict[str, Any] = {}
        for case in ("same", "other"):
            counts: dict[str, int] = {}
            old = []
            for _ in range(batches):
                source = own if case == "same" else others[int(rng.integers(len(others)))]
                scores, lp = aside[source]
                pick = rng.choice(len(scores), n, replace=False)
                rep = drift_report(scores[pick], ref)
                counts[rep.verdict] = counts.get(rep.verdict, 0) + 1
                o = old_rule(None if lp is None else lp[pick], ref_lp)
                if o is not None:
                    old.append(o)
            row[case] = {k: round(v / batches, 4) for k, v in sorted(counts.items())}
            row[case + "_old_rule"] = round(float(np.mean(old)), 4) if old else None
        out[str(n)] = row
    return out


def edited(index: Index, ref: Reference, U_edit: np.ndarray, rows: np.ndarray,
           lp_ref: np.ndarray | None, batches: int) -> dict[str, Any]:  # fmt: skip
    """Batches of 20 index rows with a word prepended, each against the index without its own
    original: verdict shares (new and previous rule)."""
    Zq, lp = index.space.project(U_edit)
    top = best_excluding(Zq, index.Z, [np.array([r]) for r in rows])
    rng = np.random.default_rng(1)
    counts: dict[str, int] = {}
    old = []
    for _ in range(batches):
        pick = rng.choice(len(rows), 20, replace=False)
        rep = drift_report(top[pick], ref)
        counts[rep.verdict] = counts.get(rep.verdict, 0) + 1
        o = old_rule(None if lp is None or index.lp is None else lp[pick], lp_ref)
        if o is not None:
            old.append(o)
    return {
        "verdicts": {k: round(v / batches, 4) for k, v in sorted(counts.items())},
        "old_rule": round(float(np.mean(old)), 4) if old else None,
        "median_percentile": round(float(np.median(ref.percentiles(top))), 1),
    }


def study_set(name: str, sets: dict[str, Any], store: VectorStore, pooling: str,
              batches: int) -> dict[str, Any]:  # fmt: skip
    corpus = sets[name]["corpus"]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(corpus))
    aside_rows, index_rows = np.sort(order[:ASIDE]), np.sort(order[ASIDE:])
    small_rows = np.sort(rng.choice(index_rows, SMALL, replace=False))
    queries = {s: (sets[s]["queries"], store.get(sets[s]["queries"])) for s in sets}
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        rows = small_rows if variant.startswith("300") else index_rows
        texts = [corpus[i] for i in rows]
        index = Index(texts, store.get(texts), pooling)
        if variant.endswith("held-out") or variant.startswith("300"):
            measured, method = reference_rows(len(texts), index.held)
        else:
            measured = np.sort(np.random.default_rng(0).choice(len(texts), 2000, replace=False))
            method = "leave-one-out"
        ref = index.reference(measured, method)
        ref_lp = None if index.lp is None else index.lp[measured]
        aside: Scored = {}
        for s in sets:
            pool = [t for t in (sets[s]["aside"] if s != name else [corpus[i] for i in aside_rows])
                    if t not in index.where]  # fmt: skip
            aside[s] = index.best(pool, store.get(pool))
        edit_rows = np.sort(np.random.default_rng(2).choice(len(texts), 200, replace=False))
        U_edit = store.get(["Indeed, " + texts[i] for i in edit_rows])
        out[variant] = {
            "space": index.spec.space,
            "decision": index.spec.decision,
            "reference": {
                "method": ref.method,
                "rows": ref.n_measured,
                "p05": ref.score_at(5.0),
                "median": ref.score_at(50.0),
            },  # fmt: skip
            "verdict": verdicts(index, ref, queries),
            "drift": drift(index, ref, aside, name, ref_lp, batches),
            "edited": edited(index, ref, U_edit, edit_rows, ref_lp, batches),
        }
        LOG.info("%s %s %s: %s", pooling, name, variant, out[variant]["verdict"])
    return out


def demo(pooling: str, sets: dict[str, Any], per_set: int = 200) -> dict[str, Any]:
    """The demo corpus as a user gets it: build_index, Searcher.query, the verdict."""
    from flowsearch import Searcher, build_index

    repo = ROOT
    with tempfile.TemporaryDirectory() as tmp:
        build_index(repo / "data" / "sample.parquet", Path(tmp) / "idx", pooling=pooling)
        s = Searcher.open(Path(tmp) / "idx")
        groups = {"demo questions": list(DEMO_QUESTIONS)}
        rng = np.random.default_rng(0)
        for name in sets:
            qs = sets[name]["queries"]
            groups[name] = [qs[i] for i in sorted(rng.choice(len(qs), per_set, replace=False))]
        out: dict[str, Any] = {"flagged": {}, "not_judged": {}, "reason": None}
        for g, qs in groups.items():
            reports = [s.query(q, k=1, mode="dense").report for q in qs]
            judged = [r for r in reports if r.verdict != "not judged"]
            out["not_judged"][g] = round(1 - len(judged) / len(reports), 4)
            if len(judged) < len(reports):
                out["reason"] = next(r.reason for r in reports if r.verdict == "not judged")
            flagged = [r.verdict == "out-of-distribution" for r in judged]
            out["flagged"][g] = round(float(np.mean(flagged)), 4) if flagged else None
        m = s.manifest
        out["space"] = m.calibration.space
        out["reference_rows"] = m.reference.n_measured if m.reference is not None else None
        out["examples"] = {q: s.query(q, k=1, mode="dense").report.to_words()
                           for q in (DEMO_QUESTIONS[0], "asdf qwerty zxcv",
                                     "A man is playing a guitar.")}  # fmt: skip
        s.close()
    return out


def load_sets(dev: Path) -> dict[str, Any]:
    """Per set: its corpus texts, its query texts, and the texts it keeps aside (seeded)."""
    out = {}
    for name in SETS:
        ds = load_beir(dev / name)
        order = np.random.default_rng(0).permutation(len(ds.texts))
        out[name] = {
            "corpus": ds.texts,
            "queries": list(ds.queries.values()),
            "aside": [ds.texts[i] for i in np.sort(order[:ASIDE])],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = arguments(__doc__, "static only, 5 batches per drift cell", "bench_drift")
    p.add_argument("--dev", default=None, help="the dev sets (default: built from --data)")
    p.add_argument("--vectors", default=str(WORK / "density_vectors"))
    p.add_argument("--poolings", default="mean,static")
    p.add_argument("--batches", type=int, default=200, help="batches per drift cell")
    args = parse(p, argv, poolings="static", batches=5)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if rendered(args, markdown):
        return 0
    from flowsearch.encode.encoder import Encoder

    t0 = time.perf_counter()
    load = [round(x, 2) for x in os.getloadavg()]
    dev = Path(args.dev) if args.dev else dev_sets(data_dir(args.data), 3000)[0]
    sets = load_sets(dev)
    res: dict[str, Any] = {"poolings": {}, "batches": args.batches}
    for pooling in args.poolings.split(","):
        store = VectorStore(Path(args.vectors) / f"{pooling}.npz", Encoder(None, pooling=pooling))
        per_set = {name: study_set(name, sets, store, pooling, args.batches) for name in SETS}
        res["poolings"][pooling] = {"sets": per_set, "demo": demo(pooling, sets)}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["load_average"] = [load, [round(x, 2) for x in os.getloadavg()]]
    res["setup"] = (
        f"Bundled model (all-MiniLM-L6-v2), {os.cpu_count()} shared cores; {res['seconds']:.0f} s "
        f"(vectors cached in `benchmarks/_work/density_vectors`); load average {load[0]} at "
        f"the start, {res['load_average'][1][0]} at the end. Dev sets from `make_dev_sets.py "
        f"--max-corpus 3000`: per set 2,500 rows indexed, {ASIDE} kept aside as new rows; "
        + ", ".join(f"{n} {len(sets[n]['queries'])} queries" for n in SETS)
        + f". Command: `{command_line()}`."
    )
    res["command"] = command_line()
    finish(args, markdown, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
