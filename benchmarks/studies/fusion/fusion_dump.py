r"""Stage 1 of the fusion study (issue 24): index each dev set with the shipped defaults and dump
both sides' candidates, their "complete" scores and the corpus reference into one ``.npz``.

Usage::

    python -m benchmarks run fusion_dump [--data DIR]
        [--encoders mean,static] [--sets qnli-dev,...] [--max-corpus 6000]

Every (set, encoder) is built once with :func:`flowsearch.build_index` (calibration ``auto``,
index ``auto``, BM25 on) into ``benchmarks/_work/fusion/<encoder>/<set>/index`` and dumped to
``benchmarks/_work/fusion/<encoder>/<set>.npz`` (git-ignored; nothing here is committed):

- ``dense_rows``, ``dense_scores`` (q, depth): the dense side's candidates, best first (cosine
  in the searched space); ``lex_rows``, ``lex_scores``: BM25's. A symmetric set's query is a
  corpus passage itself: its own row is removed from both sides before anything else (as if
  the query were not indexed), so the depth holds ``depth`` other rows.
- ``dense_of_lex`` (q, depth): the cosine of each lexical candidate; ``lex_of_dense``: the BM25
  of each dense candidate (0 when it holds no query term). With them every rule can score every
  candidate on both sides ("complete" scores).
- ``q_dense_mean``, ``q_dense_std`` (q,): the query's cosines to every row (its background);
  ``corpus_mean`` (dim,): the mean searched vector.
- ``q_upper`` (q,): the query's BM25 upper bound, sum over its tokens of idf (an unknown term at
  document frequency 0); ``q_upper_known``: only the terms the corpus holds; ``q_terms``: tokens.
- The reference, from the rows :func:`~flowsearch.space.reference.split_fit_rows` holds out of
  the calibrator fit (at most 2,000): ``ref_rows``; ``ref_dense`` (m, 100): each one's top-100
  cosines to the other rows; ``ref_dense_mean``, ``ref_dense_std``: its cosines to all other
  rows; ``ref_lex`` (m, 100): BM25 of the row's text as a query against the other rows, top 100;
  ``ref_upper``, ``ref_upper_known``: that pseudo-query's upper bounds.

Candidates come from the public API: :meth:`flowsearch.Searcher.embed` and
:meth:`~flowsearch.Searcher.vectors` (an exact scan, which is what the ``auto`` Flat index of a
corpus this size does), and the product's :class:`~flowsearch.lexical.bm25.Bm25` over postings
built from the same texts (one segment); both are checked against ``Searcher.search(...,
mode="dense"|"lexical")`` on the first :data:`CHECK_QUERIES` queries (same rows, scores within
1e-4), so the dump is the product's search.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.dev_sets import SETS, DevSet, make_dev_sets  # noqa: E402
from benchmarks.common.harness import WORK  # noqa: E402
from flowsearch.evaluation.beir import BeirDataset, load_beir  # noqa: E402
from flowsearch.evaluation.datasets import resolve_data_dir  # noqa: E402

LOG = logging.getLogger("fusion_dump")

OUT = WORK / "fusion"
#: Candidates kept per side (the Searcher fuses 100; the rest lets rules be studied deeper).
DEPTH = 1000
#: Neighbours kept per reference row.
REF_DEPTH = 100
#: Queries checked against ``Searcher.search`` per side.
CHECK_QUERIES = 100
ENCODERS = ("mean", "static")
#: The sets: make_dev_sets's four and the STS12-16 paraphrase set made here.
ALL_SETS = (*SETS, "sts-para")


def sts_para(data: Path) -> DevSet:
    """STS 2012-2016 (original text), pairs with a gold score >= 4 as paraphrases: s1 -> s2.

    An empty gold line is an unscored pair (STS15, STS16) and is skipped. STS-B was drawn from
    the same years, so this set shares sentences with ``stsb-para``; it adds the subsets STS-B
    left out (OnWN, FNWN, deft-forum, tweet-news, belief, question-question, ...).
    """
    ds = DevSet("sts-para", True, "STS12-16 raw, gold >= 4: s1 -> s2")
    pairs: list[tuple[str, str, float]] = []
    for year in sorted((data / "sts_raw").iterdir()):
        for gold in sorted(year.glob("STS.gs.*.txt")):
            inputs = gold.with_name(gold.name.replace("STS.gs.", "STS.input."))
            lines = inputs.read_text(encoding="utf-8").splitlines()
            scores = gold.read_text(encoding="utf-8").splitlines()
            for line, score in zip(lines, scores, strict=True):
                cols = line.split("\t")
                if score.strip():
                    pairs.append((cols[0], cols[1], float(score)))
    ds.add_corpus([p[0] for p in pairs] + [p[1] for p in pairs])
    for s1, s2, score in pairs:
        if score >= 4.0:
            ds.add_pair(s1, s2)
    return ds


def make_sets(data: Path, names: Sequence[str], max_corpus: int) -> Path:
    """Writes the BEIR directories under ``_work/dev_sets_<max_corpus>``; returns the root."""
    root = WORK / f"dev_sets_{max_corpus}"
    make_dev_sets(data, root, [n for n in names if n in SETS], max_corpus)
    if "sts-para" in names:
        sts_para(data).subsample(max_corpus).write(root)
    return root


def build(ds: BeirDataset, encoder: str, where: Path) -> Any:
    """Index ``ds``'s corpus with the shipped defaults; returns the open Searcher."""
    from flowsearch import Searcher, build_index
    from flowsearch.evaluation.retrieval import write_corpus_parquet

    where.mkdir(parents=True, exist_ok=True)
    parquet = write_corpus_parquet(ds, where / "corpus.parquet")
    build_index(parquet, where / "index", pooling=encoder, overwrite=True)
    return Searcher.open(where / "index")


def drop_self(scores: np.ndarray, rows: np.ndarray, own: np.ndarray, depth: int) -> tuple:
    """Each query's candidates without its own row (``own``, -1 = none), cut to ``depth``."""
    keep = rows != own[:, None]
    out_s = np.full((len(rows), depth), -np.inf, np.float32)
    out_r = np.full((len(rows), depth), -1, np.int64)
    for i in range(len(rows)):
        s, r = scores[i][keep[i]][:depth], rows[i][keep[i]][:depth]
        out_s[i, : len(s)], out_r[i, : len(r)] = s, r
    return out_s, out_r


def top_by_row(matrix: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``depth`` of each row of a dense (q, n) score matrix, ties by lower column (a full
    sort: BM25 ties are common, and a partition would cut a tie arbitrarily)."""
    cols = np.broadcast_to(np.arange(matrix.shape[1]), matrix.shape)
    rows = np.lexsort((cols, -matrix), axis=1)[:, :depth]
    return np.take_along_axis(matrix, rows, 1).astype(np.float32), rows.astype(np.int64)


class Bm25:
    """BM25 of whole corpus rows per query, and query upper bounds, from the product's index."""

    def __init__(self, texts: list[str]) -> None:
        from flowsearch.lexical import bm25
        from flowsearch.lexical.postings import Postings
        from flowsearch.lexical.tokens import tokenize_batch

        self.index = bm25.Bm25([(Postings.build(texts), None)])  # one segment, nothing deleted
        self.n = len(texts)
        df: dict[str, int] = {}
        for doc in tokenize_batch(texts):
            for term in set(doc):
                df[term] = df.get(term, 0) + 1
        self.df = df

    def idf(self, df: int) -> float:
        """Lucene's idf (bm25s ``lucene``, the product's default method)."""
        return math.log(1 + (self.n - df + 0.5) / (df + 0.5))

    def upper(self, queries: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(upper bound, upper bound over known terms, tokens) per query: lucene's term
        frequency part is below 1, so a row's BM25 is below the sum of its query terms' idf."""
        from flowsearch.lexical.tokens import tokenize_batch

        toks = tokenize_batch(queries)
        full = np.array([sum(self.idf(self.df.get(t, 0)) for t in q) for q in toks])
        known = np.array([sum(self.idf(self.df[t]) for t in q if t in self.df) for q in toks])
        return full, known, np.array([len(q) for q in toks])

    def all_rows(self, query: str) -> np.ndarray:
        """float32 (n,): every row's BM25 for ``query`` (0 for rows without a query term)."""
        scores, rows = self.index.search([query], self.n)
        out = np.zeros(self.n, np.float32)
        ok = rows[0] >= 0
        out[rows[0][ok]] = scores[0][ok]
        return out


def check_against_searcher(
    s: Any, queries: list[str], ids: list[str], dense: tuple, lex: tuple
) -> dict[str, float]:
    """Share of the first queries' top-``DEPTH`` rows equal to ``Searcher.search``'s, and the
    largest score difference, per side (with the query's own row kept: the Searcher has it)."""
    row_of = {d: i for i, d in enumerate(ids)}
    out = {}
    for mode, (scores, rows) in (("dense", dense), ("lexical", lex)):
        hits = s.search(queries[:CHECK_QUERIES], k=DEPTH, mode=mode)
        same, diff, total = 0, 0.0, 0
        for i, hs in enumerate(hits):
            got = np.array([row_of[str(h.id)] for h in hs])
            raw = [h.dense_score if mode == "dense" else h.lexical_score for h in hs]
            vals = np.array([h.score if r is None else r for h, r in zip(hs, raw, strict=True)])
            n = len(got)
            same += int(np.sum(got == rows[i][:n]))
            total += n
            diff = max(diff, float(np.max(np.abs(vals - scores[i][:n]))) if n else 0.0)
        out[mode] = {"same_rows": same / max(total, 1), "max_score_diff": diff}
    return out


def dump(ds: BeirDataset, symmetric: bool, encoder: str, where: Path) -> dict[str, Any]:
    from flowsearch.space.reference import split_fit_rows

    started = time.perf_counter()
    s = build(ds, encoder, where)
    row_of = {d: i for i, d in enumerate(ds.doc_ids)}
    qids = list(ds.queries)
    queries = [ds.queries[q] for q in qids]
    own = np.array([row_of.get(q, -1) if symmetric else -1 for q in qids])
    V = s.vectors()
    Zq, _ = s.embed(queries)
    full_dense = Zq @ V.T
    bm = Bm25(ds.texts)
    full_lex = np.stack([bm.all_rows(q) for q in queries])
    dense_kept = top_by_row(full_dense, DEPTH + 1)
    lex_kept = top_by_row(full_lex, DEPTH + 1)
    lex_kept[1][~(lex_kept[0] > 0)] = -1  # BM25's candidates hold a query term
    lex_kept[0][lex_kept[1] < 0] = -np.inf
    check = check_against_searcher(s, queries, ds.doc_ids, dense_kept, lex_kept)
    d_s, d_r = drop_self(*dense_kept, own, DEPTH)
    l_s, l_r = drop_self(*lex_kept, own, DEPTH)
    q_idx = np.arange(len(qids))[:, None]
    upper, upper_known, terms = bm.upper(queries)
    out: dict[str, np.ndarray] = {
        "dense_scores": d_s, "dense_rows": d_r, "lex_scores": l_s, "lex_rows": l_r,
        "dense_of_lex": np.where(l_r >= 0, full_dense[q_idx, np.maximum(l_r, 0)], np.nan),
        "lex_of_dense": np.where(d_r >= 0, full_lex[q_idx, np.maximum(d_r, 0)], np.nan),
        "q_upper": upper, "q_upper_known": upper_known, "q_terms": terms, "own": own,
        "q_dense_mean": full_dense.mean(axis=1), "q_dense_std": full_dense.std(axis=1),
        "corpus_mean": V.mean(axis=0),
        "vectors": V.astype(np.float32), "q_vectors": Zq.astype(np.float32),
    }  # fmt: skip
    del full_dense, full_lex
    _, held = split_fit_rows(len(ds.doc_ids), 200_000)
    ref_texts = [ds.texts[r] for r in held]
    ref_full = V[held] @ V.T
    ref_full[np.arange(len(held)), held] = -np.inf
    others = np.where(np.isinf(ref_full), np.nan, ref_full)
    ref_lex_full = np.stack([bm.all_rows(t) for t in ref_texts])
    ref_lex_full[np.arange(len(held)), held] = -np.inf
    r_upper, r_upper_known, r_terms = bm.upper(ref_texts)
    out.update(
        ref_rows=held,
        ref_dense=top_by_row(ref_full, REF_DEPTH)[0],
        ref_dense_mean=np.nanmean(others, axis=1),
        ref_dense_std=np.nanstd(others, axis=1),
        ref_lex=top_by_row(ref_lex_full, REF_DEPTH)[0],
        ref_upper=r_upper, ref_upper_known=r_upper_known, ref_terms=r_terms,
    )  # fmt: skip
    np.savez_compressed(where.with_suffix(".npz"), **out)
    m = s.manifest
    info = {
        "set": ds.name, "encoder": encoder, "rows": len(ds.doc_ids), "queries": len(qids),
        "symmetric": symmetric, "space": m.calibration.space, "held_out": len(held),
        "check": check, "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    s.close()
    LOG.info("dumped %s", info)
    return info


#: Nonsense queries per set: letter strings of 1-4 made-up words (and the issue's own example).
NONSENSE = 200


def nonsense_queries(n: int = NONSENSE, seed: int = 0) -> list[str]:
    """``n`` seeded nonsense queries, the first one ``"asdf qwerty zxcv"``."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    out = ["asdf qwerty zxcv"]
    while len(out) < n:
        words = [
            "".join(rng.choice(letters, rng.integers(3, 9))) for _ in range(rng.integers(1, 5))
        ]
        out.append(" ".join(words))
    return out


def dump_nonsense(ds: BeirDataset, where: Path) -> dict[str, Any]:
    """Every row's cosine and BM25 for the nonsense queries, from the index built before:
    ``<set>.nonsense.npz`` with ``dense_full``, ``lex_full`` (q, n) and ``q_upper`` (q,)."""
    from flowsearch import Searcher

    s = Searcher.open(where / "index")
    queries = nonsense_queries()
    Zq, _ = s.embed(queries)
    bm = Bm25(ds.texts)
    upper, known, terms = bm.upper(queries)
    np.savez_compressed(
        where.with_name(where.name + ".nonsense.npz"),
        dense_full=(Zq @ s.vectors().T).astype(np.float32),
        q_vectors=Zq.astype(np.float32),
        lex_full=np.stack([bm.all_rows(q) for q in queries]),
        q_upper=upper,
        q_upper_known=known,
        q_terms=terms,
    )
    s.close()
    return {"queries": len(queries), "with_a_corpus_term": int(np.sum(known > 0))}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="../shared/data (or $FLOWSEARCH_DATA)")
    parser.add_argument("--encoders", default=",".join(ENCODERS))
    parser.add_argument("--sets", default=",".join(ALL_SETS))
    parser.add_argument("--max-corpus", type=int, default=6000)
    parser.add_argument(
        "--nonsense-only",
        action="store_true",
        help="only score the nonsense queries on the indexes built before",
    )
    args = parser.parse_args(argv)
    names = [n for n in args.sets.split(",") if n]
    root = make_sets(resolve_data_dir(args.data), names, args.max_corpus)
    log = OUT / "dump.json"
    done = json.loads(log.read_text()) if log.is_file() else {}
    for encoder in [e for e in args.encoders.split(",") if e]:
        for name in names:
            info_path = root / name / "dataset.json"
            symmetric = json.loads(info_path.read_text())["symmetric"]
            ds = load_beir(root / name)
            if args.nonsense_only:
                LOG.info(
                    "nonsense %s/%s: %s", encoder, name, dump_nonsense(ds, OUT / encoder / name)
                )
                continue
            start = load_average()
            info = dump(ds, symmetric, encoder, OUT / encoder / name)
            info["load_average"] = [start, load_average()]
            info["nonsense"] = dump_nonsense(ds, OUT / encoder / name)
            done[f"{encoder}/{name}"] = info
            log.write_text(json.dumps(done, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")  # fmt: skip
    sys.exit(main())
