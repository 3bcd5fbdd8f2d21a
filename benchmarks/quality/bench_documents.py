r"""Long documents: passage scores against whole-document scores, and the hybrid's fusion, on
the public test collections in ``../shared/data/retrieval`` (study ``documents``).

Usage::

    python -m benchmarks run documents [--data DIR] [--sets cranfield,cisi,trec-dl19-passage]
    python -m benchmarks run documents --smoke    # 60 documents of one set; no figures

Every collection is cut as :func:`flowsearch.build_index` cuts it (the bundled encoder's
tokenizer, the default passage sizes: a text within the window is one passage) and encoded
once (whole documents truncated to the window, as ``passage_tokens=0`` indexes them, and every
passage), through :class:`flowsearch.evaluation.cache.VectorCache` (``$FLOWSEARCH_CACHE``), so
a rerun or another candidate never encodes again. BM25 is the product's
(:class:`flowsearch.lexical.bm25.Bm25` over :class:`~flowsearch.lexical.postings.Postings`),
once over the whole documents and once over the passages; fusion uses the product's
normalisations (:mod:`flowsearch.search.scores`). Every candidate rule ranks documents
exhaustively (every document scored), and is scored per query by pytrec_eval; differences
are paired over queries (bootstrap, 2,000 resamples, 95% interval). Rules with a free parameter
are tuned on one half of each collection's queries (even positions of a SHA-256 order) and
reported on the other half too, and the half they were not tuned on decides.

Writes ``benchmarks/quality/bench_documents.json`` and ``.md``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import harness
from flowsearch.evaluation.beir import BeirDataset, load_beir
from flowsearch.evaluation.cache import VectorCache

LOG = logging.getLogger("bench_documents")
SETS = ("cranfield", "cisi", "trec-dl19-passage")


@dataclass
class Collection:
    """One collection, cut and encoded: documents, passages, queries, vectors."""

    data: BeirDataset
    doc_texts: list[str]
    #: per document, its passages' character spans (one span: the whole text)
    spans: list[list[tuple[int, int]]]
    #: passage row -> its document
    owner: np.ndarray
    passage_texts: list[str]
    doc_vectors: np.ndarray  # whole documents, truncated to the window (unit rows)
    passage_vectors: np.ndarray  # (unit rows)
    query_ids: list[str]
    query_texts: list[str]
    query_vectors: np.ndarray


_ENCODER: Any = None


def encoder() -> Any:
    """The bundled encoder (mean pooling, its own max_length) on ONNX Runtime (the same
    vectors as torch to float precision, several times faster on a CPU), loaded once."""
    global _ENCODER
    if _ENCODER is None:
        from flowsearch.encode.encoder import Encoder

        _ENCODER = Encoder(None, backend="onnx")
    return _ENCODER


def _unit(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: np.ndarray = (x / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    return out


def _encode_unique(
    cache: VectorCache, texts: list[str], name: str, known: dict[str, np.ndarray] | None = None
) -> np.ndarray:
    """Unit vectors of ``texts``, each distinct text not in ``known`` encoded once (cached)."""
    known = known or {}
    unique = [t for t in dict.fromkeys(texts) if t not in known]
    vectors = cache.encode(encoder(), unique, dataset=name, batch_size=32) if unique else None
    where = {**known, **({t: v for t, v in zip(unique, vectors, strict=True)} if unique else {})}
    return _unit(np.stack([where[t] for t in texts]).astype(np.float32))


def load_collection(
    name: str,
    data: Path | None = None,
    limit: int | None = None,
    tokens: int | None = None,
    overlap: int | None = None,
) -> Collection:
    """Reads, cuts and encodes one collection (vectors from the cache when there)."""
    from flowsearch.ingest.passages import requested_sizes, split_texts

    root = (data or harness.data_dir()) / "retrieval" / name
    ds = load_beir(root)
    if limit is not None:
        ds = _subset(ds, limit)
    enc = encoder()
    sizes = requested_sizes(enc, tokens, overlap)
    spans = split_texts(enc, ds.texts, sizes)
    owner = np.repeat(np.arange(len(spans)), [len(s) for s in spans])
    passages = [ds.texts[d][a:b] for d, s in enumerate(spans) for a, b in s]
    cache = VectorCache()
    doc_vectors = _encode_unique(cache, ds.texts, f"{ds.name}-docs")
    whole = dict(zip(ds.texts, doc_vectors, strict=True))  # a passage that is a whole text
    passage_vectors = _encode_unique(cache, passages, f"{ds.name}-passages", whole)
    qids = list(ds.queries)
    qtexts = [ds.queries[q] for q in qids]
    query_vectors = _encode_unique(cache, qtexts, f"{ds.name}-queries")
    return Collection(ds, ds.texts, spans, owner, passages, doc_vectors, passage_vectors, qids,
                      qtexts, query_vectors)  # fmt: skip


def _subset(ds: BeirDataset, limit: int) -> BeirDataset:
    """The first ``limit`` documents and the queries judged on them (a smoke run)."""
    keep = set(ds.doc_ids[:limit])
    qrels = {q: {d: g for d, g in docs.items() if d in keep} for q, docs in ds.qrels.items()}
    qrels = {q: docs for q, docs in qrels.items() if any(g > 0 for g in docs.values())}
    return BeirDataset(ds.name, ds.doc_ids[:limit], ds.texts[:limit], ds.titles[:limit],
                       ds.metadata[:limit], {q: t for q, t in ds.queries.items() if q in qrels},
                       qrels)  # fmt: skip


# -- scores of every document ---------------------------------------------------------------


def _per_document(values: np.ndarray, owner: np.ndarray, how: str) -> np.ndarray:
    """(q, passages) -> (q, documents): each document's max, sum or mean over its passages."""
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    if how == "max":
        out: np.ndarray = np.maximum.reduceat(values, starts, axis=1)
    else:
        out = np.add.reduceat(values, starts, axis=1)
        if how == "mean":
            out = out / np.diff(np.r_[starts, len(owner)])[None, :]
    return out


def bm25_matrix(
    texts: Sequence[str], queries: Sequence[str], **params: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The product's BM25 of every text for every query (0 where no term is shared), and each
    query's upper bound."""
    from flowsearch.lexical.bm25 import Bm25
    from flowsearch.lexical.postings import Postings

    bm25 = Bm25([(Postings.build(texts), None)], **params)
    scores, rows = bm25.search(list(queries), k=len(texts))
    out = np.zeros((len(queries), len(texts)), np.float64)
    for qi in range(len(queries)):
        ok = rows[qi] >= 0
        out[qi, rows[qi][ok]] = scores[qi][ok]
    upper = np.array([bm25.upper_bound(q) for q in queries], np.float64)
    return out, upper


@dataclass
class Sides:
    """Every document's score on each side, by rule: ``dense[name]``, ``lexical[name]`` (q, n),
    with what the fusion normalises by."""

    dense: dict[str, np.ndarray]
    lexical: dict[str, np.ndarray]
    upper: dict[str, np.ndarray]
    background: dict[str, float]
    lengths: np.ndarray  # words per document


def sides(c: Collection) -> Sides:
    from flowsearch.search.scores import build_reference

    q = c.query_vectors
    dense_doc = q @ c.doc_vectors.T
    dense_passage = q @ c.passage_vectors.T
    best = _per_document(dense_passage, c.owner, "max")
    # a document's centroid: the mean of its passages' unit vectors (nothing more to encode)
    starts = np.flatnonzero(np.r_[True, c.owner[1:] != c.owner[:-1]])
    centroid = _unit(np.add.reduceat(c.passage_vectors, starts, axis=0))
    dense_centroid = q @ centroid.T
    first = dense_passage[:, np.flatnonzero(np.r_[True, c.owner[1:] != c.owner[:-1]])]
    lex_doc, up_doc = bm25_matrix(c.doc_texts, c.query_texts)
    lex_passage, up_passage = bm25_matrix(c.passage_texts, c.query_texts)
    bg_doc = build_reference(c.doc_vectors.sum(0), len(c.doc_vectors)).dense_background
    bg_passage = build_reference(c.passage_vectors.sum(0), len(c.passage_vectors)).dense_background
    return Sides(
        dense={"whole": dense_doc, "best passage": best, "first passage": first,
               "max(whole, best)": np.maximum(dense_doc, best),
               "mean(whole, best)": (dense_doc + best) / 2,
               "centroid": dense_centroid,
               "max(centroid, best)": np.maximum(dense_centroid, best),
               "mean(centroid, best)": (dense_centroid + best) / 2,
               "best + 0.25 mean passage": best + 0.25 * _per_document(dense_passage, c.owner,
                                                                       "mean")},
        lexical={"whole": lex_doc, "best passage": _per_document(lex_passage, c.owner, "max"),
                 "sum of passages": _per_document(lex_passage, c.owner, "sum")},
        upper={"whole": up_doc, "best passage": up_passage, "sum of passages": up_passage},
        background={"whole": bg_doc, "best passage": bg_passage, "first passage": bg_passage,
                    "max(whole, best)": bg_passage, "mean(whole, best)": bg_passage,
                    "centroid": bg_passage, "max(centroid, best)": bg_passage,
                    "mean(centroid, best)": bg_passage,
                    "best + 0.25 mean passage": bg_passage},
        lengths=np.array([len(t.split()) for t in c.doc_texts]),
    )  # fmt: skip


# -- fusion rules ---------------------------------------------------------------------------


def fused(s: Sides, dense: str, lexical: str, rule: str, weight: float) -> np.ndarray:
    """Hybrid document scores (q, n) by ``rule``: ``product`` (the shipped normalisations),
    ``share`` (BM25 / upper bound, unstretched), ``minmax`` (per query over every document),
    ``rrf`` (reciprocal ranks, k=60; ``weight`` weighs the dense side's term)."""
    from flowsearch.search.scores import FusionReference, normalise_dense, normalise_lexical

    d, lx = s.dense[dense], s.lexical[lexical]
    if rule == "rrf":
        rd = np.argsort(np.argsort(-d, axis=1), axis=1) + 1
        rl = np.argsort(np.argsort(-lx, axis=1), axis=1) + 1
        out: np.ndarray = weight / (60 + rd) + (1 - weight) / (60 + rl)
        return out
    if rule == "minmax":

        def mm(x: np.ndarray) -> np.ndarray:
            lo, hi = x.min(1, keepdims=True), x.max(1, keepdims=True)
            return (x - lo) / np.where(hi > lo, hi - lo, 1.0)

        return weight * mm(d) + (1 - weight) * mm(lx)
    ref = FusionReference(0, max(d.shape[1], 2), s.background[dense])
    nd = normalise_dense(d, ref)
    nl = normalise_lexical(lx, s.upper[lexical], 0.7 if rule == "product" else None)
    return weight * nd + (1 - weight) * nl


# -- metrics --------------------------------------------------------------------------------

Metric = dict[str, dict[str, float]]  # measure -> {query id: value}


def run_of(scores: np.ndarray, c: Collection, k: int = 100) -> dict[str, dict[str, float]]:
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    ids = c.data.doc_ids
    return {q: {ids[j]: float(scores[qi, j]) for j in top[qi]} for qi, q in enumerate(c.query_ids)}


def ndcg_exp(
    qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]], k: int = 10
) -> dict[str, float]:
    """nDCG@k with gain 2^rel - 1 (PROVENANCE.md's anchors; trec_eval's is linear)."""
    out = {}
    for q, docs in run.items():
        ranked = sorted(docs, key=lambda d: -docs[d])[:k]
        rel = qrels.get(q, {})
        dcg = sum((2 ** max(rel.get(d, 0), 0) - 1) / np.log2(i + 2) for i, d in enumerate(ranked))
        ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:k]
        idcg = sum((2**g - 1) / np.log2(i + 2) for i, g in enumerate(ideal))
        out[q] = dcg / idcg if idcg > 0 else 0.0
    return out


def measures(scores: np.ndarray, c: Collection) -> Metric:
    from flowsearch.evaluation.ranking_metrics import mrr_at_k, ndcg_at_k, recall_at_k

    run = run_of(scores, c)
    qrels = c.data.qrels
    return {"ndcg@10": ndcg_at_k(qrels, run), "recall@100": recall_at_k(qrels, run),
            "mrr@10": mrr_at_k(qrels, run), "ndcg@10 exp": ndcg_exp(qrels, run)}  # fmt: skip


def halves(query_ids: Sequence[str]) -> tuple[list[str], list[str]]:
    """(tune, held out): the queries in SHA-256 order, alternately."""
    order = sorted(query_ids, key=lambda q: hashlib.sha256(q.encode()).hexdigest())
    return order[0::2], order[1::2]


def mean_of(values: Mapping[str, float], ids: Sequence[str] | None = None) -> float:
    keys = list(values) if ids is None else [q for q in ids if q in values]
    return float(np.mean([values[q] for q in keys])) if keys else float("nan")


def paired(
    a: Mapping[str, float],
    b: Mapping[str, float],
    ids: Sequence[str] | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """Mean of a - b over queries, with a 95% bootstrap interval (paired over queries)."""
    keys = [q for q in (ids if ids is not None else list(a)) if q in a and q in b]
    diff = np.array([a[q] - b[q] for q in keys])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (resamples, len(diff)))].mean(1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return {"delta": float(diff.mean()), "lo": float(lo), "hi": float(hi), "n": len(diff)}


# -- the study ------------------------------------------------------------------------------

WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.8)
RULES = ("product", "share", "minmax", "rrf")
HYBRID_DENSE = (
    "whole",
    "best passage",
    "max(whole, best)",
    "mean(whole, best)",
    "mean(centroid, best)",
)
HYBRID_LEXICAL = ("whole", "best passage")
#: words below which a row is "short" (the issue's fragment "The Super Bowl 50" has 4)
SHORT_WORDS = 8
PRIORS = (0.0, 0.05, 0.1, 0.2, 0.4)


def rows_hybrid(
    c: Collection, s: Sides, weight: float, lexical: str = "best passage", dense: str = "row"
) -> np.ndarray:
    """What the product does: each passage row fused (product rule), a document scored by its
    best fused row. ``lexical``: a row's BM25 is its own passage's (``best passage``, the
    fifth release as it shipped) or its document's (``whole``: whole-document BM25, every row
    of a document carrying it). ``dense``: a row's cosine (``row``), or the mean of it and its
    document's whole-text (``whole``) or centroid (``centroid``) cosine."""
    from flowsearch.search.scores import FusionReference, normalise_dense, normalise_lexical

    ref = FusionReference(0, len(c.passage_vectors), s.background["best passage"])
    cos = c.query_vectors @ c.passage_vectors.T
    if dense == "whole":
        cos = (cos + s.dense["whole"][:, c.owner]) / 2
    elif dense == "centroid":
        cos = (cos + s.dense["centroid"][:, c.owner]) / 2
    nd = normalise_dense(cos, ref)
    if lexical == "whole":
        nl = normalise_lexical(s.lexical["whole"][:, c.owner], s.upper["whole"])
    else:
        lex, _ = bm25_matrix(c.passage_texts, c.query_texts)
        nl = normalise_lexical(lex, s.upper["best passage"])
    return _per_document(weight * nd + (1 - weight) * nl, c.owner, "max")


#: cut only texts longer than this many windows (1: what build_index does)
CUT_FROM = (1.0, 1.5, 2.0, 3.0)


def cut_from(c: Collection, s: Sides, windows: float) -> dict[str, np.ndarray]:
    """The index ``build_index`` would make if it cut only texts longer than ``windows``
    encoder windows (shorter ones one row, truncated for the dense side): every document's
    dense, lexical and hybrid score (product rule at the default weight for the index's
    passages per document, a document scored by its best row), as the Searcher ranks them."""
    from flowsearch.search.fusion import default_weight
    from flowsearch.search.scores import FusionReference, normalise_dense, normalise_lexical

    enc = encoder()
    tokens = np.array([len(t) for t in enc.token_offsets(c.doc_texts)])
    whole = tokens <= windows * enc.window
    rows_text, rows_vec, owner = [], [], []
    start = np.r_[0, np.cumsum([len(sp) for sp in c.spans])]
    for d in range(len(c.doc_texts)):
        if whole[d] or len(c.spans[d]) == 1:
            rows_text.append(c.doc_texts[d])
            rows_vec.append(c.doc_vectors[d])
            owner.append(d)
        else:
            for r in range(start[d], start[d + 1]):
                rows_text.append(c.passage_texts[r])
                rows_vec.append(c.passage_vectors[r])
                owner.append(d)
    vecs, own = np.stack(rows_vec), np.array(owner)
    cos = c.query_vectors @ vecs.T
    lex, upper = bm25_matrix(rows_text, c.query_texts)
    ref = FusionReference(0, len(vecs), build_reference_of(vecs))
    weight = default_weight("transformer", len(vecs) / len(c.doc_texts))
    hybrid = weight * normalise_dense(cos, ref) + (1 - weight) * normalise_lexical(lex, upper)
    return {"dense": _per_document(cos, own, "max"), "lexical": _per_document(lex, own, "max"),
            "hybrid": _per_document(hybrid, own, "max")}  # fmt: skip


def build_reference_of(vectors: np.ndarray) -> float:
    from flowsearch.search.scores import build_reference

    return build_reference(vectors.sum(0), len(vectors)).dense_background


def length_prior(scores: np.ndarray, words: np.ndarray, strength: float) -> np.ndarray:
    """``scores`` lowered for short rows: times ``min(1, words / SHORT_WORDS) ** strength``
    (scores are >= 0: fused in [0, 1])."""
    factor = np.minimum(1.0, np.maximum(words, 1) / SHORT_WORDS) ** strength
    out: np.ndarray = scores * factor[None, :]
    return out


def short_above_answers(scores: np.ndarray, c: Collection, words: np.ndarray) -> float:
    """Share of queries whose top 10 holds a short (< SHORT_WORDS words) non-relevant row
    above their best-ranked relevant one."""
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    ids = c.data.doc_ids
    hit = 0
    for qi, q in enumerate(c.query_ids):
        rel = {d for d, g in c.data.qrels[q].items() if g > 0}
        for j in top[qi]:
            if ids[j] in rel:
                break
            if words[j] < SHORT_WORDS:
                hit += 1
                break
    return hit / len(c.query_ids)


def study_collection(c: Collection) -> dict[str, Any]:
    from flowsearch.search.fusion import default_weight

    s = sides(c)
    ppd = len(c.passage_texts) / len(c.doc_texts)
    tune, held = halves(c.query_ids)
    per: dict[str, Metric] = {}
    for name, values in s.dense.items():
        per[f"dense: {name}"] = measures(values, c)
    for name, values in s.lexical.items():
        per[f"lexical: {name}"] = measures(values, c)
    shipped_w = default_weight("transformer", ppd)
    per["hybrid: fifth release (rows fused, best row)"] = measures(
        rows_hybrid(c, s, shipped_w), c)  # fmt: skip
    for dn in ("row", "centroid", "whole"):
        per[f"hybrid: rows fused, whole-document BM25, dense {dn}"] = measures(
            rows_hybrid(c, s, shipped_w, "whole", dn), c)  # fmt: skip
    for windows in CUT_FROM:
        for side, scores in cut_from(c, s, windows).items():
            per[f"{side}: cut beyond {windows} windows"] = measures(scores, c)
    hybrids: dict[str, np.ndarray] = {}
    for dn in HYBRID_DENSE:
        for ln in HYBRID_LEXICAL:
            for rule in RULES:
                for w in WEIGHTS:
                    key = f"hybrid: {rule} w={w} dense={dn} lexical={ln}"
                    scores = fused(s, dn, ln, rule, w)
                    hybrids[key] = scores
                    per[key] = measures(scores, c)
    return {"collection": c, "sides": s, "per": per, "tune": tune, "held": held, "ppd": ppd,
            "hybrids": hybrids}  # fmt: skip


def _summary(per: Mapping[str, Metric], tune: list[str], held: list[str]) -> dict[str, Any]:
    return {
        name: {
            **{m: mean_of(v) for m, v in metrics.items()},
            "ndcg@10 tune": mean_of(metrics["ndcg@10"], tune),
            "ndcg@10 held": mean_of(metrics["ndcg@10"], held),
        }
        for name, metrics in per.items()
    }


def run(names: Sequence[str], data: Path | None, limit: int | None) -> dict[str, Any]:
    from flowsearch.search.fusion import default_weight

    studies = {}
    for name in names:
        LOG.info("%s: loading and encoding (cached)", name)
        studies[name] = study_collection(load_collection(name, data, limit))
    report: dict[str, Any] = {
        "machine": harness.machine(),
        "sets": {},
        "load": harness.load_average(),
    }
    for name, st in studies.items():
        c = st["collection"]
        report["sets"][name] = {
            "documents": len(c.doc_texts), "passages": len(c.passage_texts),
            "cut": int(sum(len(sp) > 1 for sp in c.spans)), "queries": len(c.query_ids),
            "passages_per_document": st["ppd"],
            "fifth_release_weight": default_weight("transformer", st["ppd"]),
            "figures": _summary(st["per"], st["tune"], st["held"]),
        }  # fmt: skip
    # one hybrid for every collection: the best mean tune-half nDCG@10
    first = next(iter(studies.values()))["per"]
    keys = [k for k in first if k.startswith("hybrid: ") and " w=" in k and "fifth" not in k]

    def tuned(key: str) -> float:
        return float(np.mean([mean_of(st["per"][key]["ndcg@10"], st["tune"])
                              for st in studies.values()]))  # fmt: skip

    ranked = sorted(keys, key=tuned, reverse=True)
    best = ranked[0]
    report["tuned"] = {"best": best, "ranking": [(k, tuned(k)) for k in ranked]}
    report["paired"] = _comparisons(studies, best)
    report["short"] = _short_rows(studies, best)
    return report


def _comparisons(studies: Mapping[str, Any], best: str) -> dict[str, Any]:
    """Paired intervals per collection (all queries and the held-out half): the rules against
    whole-document scoring."""
    pairs = {
        "lexical: best passage - whole": ("lexical: best passage", "lexical: whole"),
        "dense: best passage - whole": ("dense: best passage", "dense: whole"),
        "dense: max(whole, best) - whole": ("dense: max(whole, best)", "dense: whole"),
        "dense: max(whole, best) - best passage": ("dense: max(whole, best)",
                                                   "dense: best passage"),
        "dense: mean(whole, best) - whole": ("dense: mean(whole, best)", "dense: whole"),
        "dense: mean(whole, best) - best passage": ("dense: mean(whole, best)",
                                                    "dense: best passage"),
        "dense: mean(centroid, best) - whole": ("dense: mean(centroid, best)", "dense: whole"),
        "dense: mean(centroid, best) - best passage": ("dense: mean(centroid, best)",
                                                       "dense: best passage"),
        "hybrid: tuned - whole (product w=0.65)": (best,
            "hybrid: product w=0.65 dense=whole lexical=whole"),
        "hybrid: tuned - passages (product w=0.65)": (best,
            "hybrid: product w=0.65 dense=best passage lexical=best passage"),
    }  # fmt: skip
    out: dict[str, Any] = {}
    for name, st in studies.items():
        per = st["per"]
        fifth = next(k for k in per if "fifth" in k)
        items = {**pairs, "hybrid: tuned - fifth release": (best, fifth),
                 "hybrid: fifth release - whole (product w=0.65)": (
                     fifth, "hybrid: product w=0.65 dense=whole lexical=whole")}  # fmt: skip
        for dn in ("row", "centroid", "whole"):
            rows = f"hybrid: rows fused, whole-document BM25, dense {dn}"
            items[f"{rows} - whole (product w=0.65)"] = (
                rows,
                "hybrid: product w=0.65 dense=whole lexical=whole",
            )
            items[f"{rows} - fifth release"] = (rows, fifth)
        for side in ("dense", "lexical", "hybrid"):
            base = (
                "hybrid: product w=0.65 dense=whole lexical=whole"
                if side == "hybrid"
                else f"{side}: whole"
            )
            for windows in CUT_FROM[1:]:
                items[f"{side}: cut beyond {windows} windows - whole"] = (
                    f"{side}: cut beyond {windows} windows",
                    base,
                )
        out[name] = {
            label: {"all": paired(per[a]["ndcg@10"], per[b]["ndcg@10"]),
                    "held": paired(per[a]["ndcg@10"], per[b]["ndcg@10"], st["held"])}
            for label, (a, b) in items.items()
        }  # fmt: skip
    return out


def _short_rows(studies: Mapping[str, Any], best: str) -> dict[str, Any]:
    """How often a short row outranks every relevant one (dense and the tuned hybrid), and a
    length prior's effect, tuned on one half."""
    out: dict[str, Any] = {}
    for name, st in studies.items():
        c, s = st["collection"], st["sides"]
        words = s.lengths
        entry: dict[str, Any] = {"short_rows": int((words < SHORT_WORDS).sum())}
        base = {"dense": s.dense["whole"], "hybrid": st["hybrids"][best]}
        for side, scores in base.items():
            prior = {}
            for strength in PRIORS:
                adjusted = length_prior(np.maximum(scores, 0.0), words, strength)
                m = measures(adjusted, c)["ndcg@10"]
                prior[str(strength)] = {
                    "short_above_answers": short_above_answers(adjusted, c, words),
                    "ndcg@10 tune": mean_of(m, st["tune"]), "ndcg@10 held": mean_of(m, st["held"]),
                    "ndcg@10": mean_of(m),
                }  # fmt: skip
            entry[side] = prior
        out[name] = entry
    return out


def render(report: dict[str, Any]) -> str:
    lines = ["| set | docs | cut | passages | queries |", "|---|---:|---:|---:|---:|"]
    for name, st in report["sets"].items():
        lines.append(f"| {name} | {st['documents']} | {st['cut']} | {st['passages']} | "
                     f"{st['queries']} |")  # fmt: skip
    lines += ["", "nDCG@10 (trec_eval, linear gain) / held-out half / nDCG@10 with gain 2^rel-1:",
              "", "| rule | " + " | ".join(report["sets"]) + " |",
              "|---|" + "---:|" * len(report["sets"])]  # fmt: skip
    first = next(iter(report["sets"].values()))["figures"]
    shown = [k for k in first if not k.startswith("hybrid: ") or "fifth" in k or "cut" in k
             or "w=0.65" in k or k == report["tuned"]["best"]]  # fmt: skip
    for key in shown:
        cells = [report["sets"][n]["figures"][key] for n in report["sets"]]
        lines.append(f"| {key} | " + " | ".join(
            f"{c['ndcg@10']:.4f} / {c['ndcg@10 held']:.4f} / {c['ndcg@10 exp']:.4f}"
            for c in cells) + " |")  # fmt: skip
    lines += ["", f"Tuned hybrid (best mean tune-half nDCG@10): `{report['tuned']['best']}`", "",
              "Paired differences of nDCG@10 (95% bootstrap interval), all queries / held-out:",
              "", "| difference | " + " | ".join(report["paired"]) + " |",
              "|---|" + "---:|" * len(report["paired"])]  # fmt: skip
    labels = next(iter(report["paired"].values()))
    for label in labels:
        cells = []
        for name in report["paired"]:
            a, h = report["paired"][name][label]["all"], report["paired"][name][label]["held"]
            cells.append(f"{a['delta']:+.4f} [{a['lo']:+.4f}, {a['hi']:+.4f}] / "
                         f"{h['delta']:+.4f} [{h['lo']:+.4f}, {h['hi']:+.4f}]")  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Every hybrid candidate, by mean tune-half nDCG@10 (top 15 and bottom 5 of "
              f"{len(report['tuned']['ranking'])}; all in the JSON):", ""]  # fmt: skip
    ranking = report["tuned"]["ranking"]
    for key, value in [*ranking[:15], ("...", float("nan")), *ranking[-5:]]:
        lines.append(f"- {key}: {value:.4f}")
    lines += ["", f"Short rows (< {SHORT_WORDS} words) above every relevant one in the top 10, "
              "share of queries, by length-prior strength (nDCG@10 held-out):", ""]  # fmt: skip
    for name, entry in report["short"].items():
        for side in ("dense", "hybrid"):
            cells = ", ".join(f"{k}: {v['short_above_answers']:.3f} ({v['ndcg@10 held']:.4f})"
                              for k, v in entry[side].items())  # fmt: skip
            lines.append(f"- {name} ({entry['short_rows']} short rows), {side}: {cells}")
    return harness.markdown("Long documents and hybrid fusion on public test collections", lines,
                            report, "python -m benchmarks run documents")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = harness.arguments(__doc__, "60 documents of cranfield", "bench_documents")
    parser.add_argument("--sets", default=",".join(SETS))
    args = harness.parse(parser, argv, sets="cranfield", limit=60)
    if harness.rendered(args, render):
        return 0
    names = [n.strip() for n in args.sets.split(",") if n.strip()]
    data = Path(args.data) if args.data else None
    harness.finish(args, render, run(names, data, getattr(args, "limit", None)))
    return 0


if __name__ == "__main__":
    harness.script(main)
