r"""Issue 32, long documents: passages against truncation, how a document is scored from its
passages, and passage sizes (nDCG@10 on a long-document dev set).

Usage::

    python -m benchmarks run passages [--data DIR] [--docs 120] [--smoke]
    python -m benchmarks run passages --render

The dev set (built here, deterministic, under ``benchmarks/_work``): QNLI dev sentences
(``../shared/data/qnli``, Wikipedia) concatenated ``--sentences`` (16) at a time into
documents. ``--layout topic`` (the default): each document one topic, as the issue asks: a
seeded seed sentence and the 15 unused sentences nearest it by TF-IDF cosine over the lexical
side's own tokens (a grouping the dense encoder has no part in); ``--layout mixed``: sentences
shuffled (one document mixes topics, as a crawled page does; its run is kept in
``bench_passages_mixed.json`` and shown beside). Queries are the QNLI dev questions whose answering
(``entailment``) sentence lies in a kept document (a seeded sample of ``--queries``), and the
relevant documents are those holding one. Each query is also labelled by where its answer
sits: within the first 254 tokens of the document (what the encoder reads without passages) or
past them.

Every configuration is a real :func:`flowsearch.build_index` of the documents with the bundled
all-MiniLM-L6-v2 (``calibration="none"``: this measures the cutting, not the calibrator) and
its queries go through :meth:`Searcher.search` (``k=10`` documents) in ``dense`` and ``hybrid``
mode: ``truncation`` is ``passage_tokens=0`` (the behaviour before passages: each document read
to the window), the others cut at ``tokens/overlap``. How a document is scored from its
passages is studied on the default cut's stored passage vectors (exact cosines of every query
to every passage, in numpy): the best passage (what the Searcher ships), the mean of the best
two, the mean of all, and the best plus a tenth of the others' sum.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
from benchmarks.common import harness  # noqa: E402

SECTION = "bench_passages"
#: (name, passage_tokens, passage_overlap): None = the default; 0 tokens = no passages
CONFIGS = (
    ("truncation", 0, None),
    ("254/32", 254, 32),
    ("128/16", 128, 16),
    ("128/0", 128, 0),
    ("64/8", 64, 8),
)
#: the cut whose passage vectors the combination study reads
STUDIED = "128/16"
SMOKE_CONFIGS = CONFIGS[:2]


def _topic_order(sentences: list[str], n_docs: int, per_doc: int, rng: Any) -> np.ndarray:
    """Sentence numbers, ``per_doc`` at a time one topic: a random unused seed sentence, then
    the unused ones nearest it by TF-IDF cosine (the lexical tokeniser's terms)."""
    from flowsearch.lexical.tokens import tokenize_batch

    tokens = tokenize_batch(sentences)
    vocab: dict[str, int] = {}
    for terms in tokens:
        for t in set(terms):
            vocab.setdefault(t, len(vocab))
    tf = np.zeros((len(sentences), len(vocab)), np.float32)
    for i, terms in enumerate(tokens):
        for t in terms:
            tf[i, vocab[t]] += 1
    idf = np.log(len(sentences) / np.maximum((tf > 0).sum(axis=0), 1)).astype(np.float32)
    X = tf * idf
    X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-9)
    free = np.ones(len(sentences), bool)
    order: list[int] = []
    for seed in rng.permutation(len(sentences)):
        if len(order) >= n_docs * per_doc:
            break
        if not free[seed]:
            continue
        sims = X @ X[seed]
        sims[~free] = -np.inf
        group = np.argsort(-sims, kind="stable")[:per_doc]
        if len(group) < per_doc or not np.isfinite(sims[group]).all():
            break
        free[group] = False
        order.extend(int(g) for g in group)
    return np.array(order, dtype=np.int64)


def _dev_set(
    data: Path, n_docs: int, per_doc: int, n_queries: int, layout: str, seed: int = 0
) -> dict[str, Any]:
    """Documents, queries, qrels and where each query's answer sits (see the docstring)."""
    from flowsearch.evaluation.datasets import load_qnli, unique_texts

    pairs = load_qnli(data, "dev")
    sentences = sorted(unique_texts(list(pairs.s2)))
    rng = np.random.default_rng(seed)
    if layout == "topic":
        order = _topic_order(sentences, n_docs, per_doc, rng)
        n_docs = len(order) // per_doc
    else:
        order = rng.permutation(len(sentences))[: n_docs * per_doc]
    docs: list[str] = []
    doc_of: dict[str, tuple[int, int]] = {}  # sentence -> (document, character offset)
    for d in range(n_docs):
        texts = [sentences[i] for i in order[d * per_doc : (d + 1) * per_doc]]
        at = 0
        for t in texts:
            doc_of.setdefault(t, (d, at))
            at += len(t) + 1
        docs.append(" ".join(texts))
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    answer_at: dict[str, int] = {}
    for question, sentence, label in zip(pairs.s1, pairs.s2, pairs.scores, strict=True):
        if label != 1.0 or sentence not in doc_of:
            continue
        d, at = doc_of[sentence]
        qid = f"q{len(queries)}" if question not in queries.values() else None
        if qid is None:
            continue
        queries[qid] = question
        qrels[qid] = {f"doc{d}": 1}
        answer_at[qid] = at
    if len(queries) > n_queries:  # a seeded sample, to keep the run short
        keep = sorted(rng.choice(len(queries), n_queries, replace=False))
        names = list(queries)
        chosen = [names[i] for i in keep]
        queries = {q: queries[q] for q in chosen}
        qrels = {q: qrels[q] for q in chosen}
        answer_at = {q: answer_at[q] for q in chosen}
    return {"docs": docs, "queries": queries, "qrels": qrels, "answer_at": answer_at}


def _past_window(dev: dict[str, Any], enc: Any) -> dict[str, bool]:
    """Per query: does its answer start past the tokens the encoder reads of its document."""
    offsets = enc.token_offsets(dev["docs"])
    out = {}
    for qid, at in dev["answer_at"].items():
        d = int(next(iter(dev["qrels"][qid]))[3:])
        toks = offsets[d]
        limit = toks[enc.window - 1][1] if len(toks) > enc.window else len(dev["docs"][d]) + 1
        out[qid] = at >= limit
    return out


def _ndcg(qrels: dict[str, Any], run: dict[str, dict[str, float]], keep: set[str]) -> float:
    from flowsearch.evaluation.ranking_metrics import ndcg_at_k

    per = ndcg_at_k({q: qrels[q] for q in keep}, {q: run.get(q, {}) for q in keep}, 10)
    return float(np.mean([per.get(q, 0.0) for q in keep])) if keep else float("nan")


def _build(work: Path, corpus: Path, name: str, tokens: int | None, overlap: int | None) -> Path:
    from flowsearch.writes.build import build_index

    target = work / ("idx_" + "".join(c if c.isalnum() else "_" for c in name))
    if target.exists():
        shutil.rmtree(target)
    build_index(corpus, target, calibration="none", overwrite=True,
                passage_tokens=tokens, passage_overlap=overlap)  # fmt: skip
    return target


def _combinations(searcher: Any, dev: dict[str, Any], groups: dict[str, set[str]]) -> dict:
    """nDCG@10 of ways to score a document from its passages' exact cosines."""
    ids = np.array(
        [i for seg in searcher.version.segments for i in seg.reader.table(["id"]).column("id")
         .to_pylist()]
    )  # fmt: skip
    V = searcher.vectors()
    qids = list(dev["queries"])
    Z, _ = searcher.embed([dev["queries"][q] for q in qids])
    cos = Z @ V.T
    docs, inverse = np.unique(ids, return_inverse=True)
    rules = {
        "best passage": lambda s: s.max(),
        "mean of best 2": lambda s: np.sort(s)[-2:].mean(),
        "mean of all": lambda s: s.mean(),
        "best + 0.1 x others": lambda s: s.max() + 0.1 * (s.sum() - s.max()),
    }
    members = [np.flatnonzero(inverse == j) for j in range(len(docs))]
    out: dict[str, dict[str, float]] = {}
    for rule, fn in rules.items():
        run = {}
        for qi, q in enumerate(qids):
            scores = np.array([fn(cos[qi, m]) for m in members])
            top = np.argsort(-scores)[:10]
            run[q] = {str(docs[j]): float(scores[j]) for j in top}
        out[rule] = {g: _ndcg(dev["qrels"], run, keep) for g, keep in groups.items()}
    return out


def main() -> int:
    parser = harness.arguments(__doc__, "40 documents, 2 configurations", SECTION)
    parser.add_argument("--docs", type=int, default=120, help="documents in the dev set")
    parser.add_argument("--sentences", type=int, default=16, help="sentences per document")
    parser.add_argument("--queries", type=int, default=500, help="queries, at most (seeded)")
    parser.add_argument("--layout", choices=("topic", "mixed"), default="topic")
    args = harness.parse(parser, docs=40, queries=100)
    if harness.rendered(args, render):
        return 0
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flowsearch.search.searcher import Searcher

    data = harness.data_dir(args.data)
    work = harness.WORK / ("smoke" if args.smoke else "") / "passages"
    work.mkdir(parents=True, exist_ok=True)
    dev = _dev_set(data, args.docs, args.sentences, args.queries, args.layout)
    corpus = work / "docs.parquet"
    ids = [f"doc{i}" for i in range(len(dev["docs"]))]
    pq.write_table(pa.table({"id": ids, "text": dev["docs"]}), corpus)
    load_before = harness.load_average()
    results: dict[str, Any] = {}
    groups: dict[str, set[str]] = {}
    combos: dict[str, Any] = {}
    for name, tokens, overlap in SMOKE_CONFIGS if args.smoke else CONFIGS:
        t0 = time.perf_counter()
        target = _build(work, corpus, name, tokens, overlap)
        seconds = time.perf_counter() - t0
        s = Searcher.open(target)
        if not groups:
            past = _past_window(dev, s.encoder)
            groups = {
                "all": set(past),
                "answer in the window": {q for q, p in past.items() if not p},
                "answer past the window": {q for q, p in past.items() if p},
            }
        row: dict[str, Any] = {"passages": int(s.manifest.n_live), "build_s": round(seconds, 1)}
        qids = list(dev["queries"])
        for mode in ("dense", "hybrid"):
            hits = s.search([dev["queries"][q] for q in qids], k=10, mode=mode)
            run = {q: {str(h.id): h.score for h in hs} for q, hs in zip(qids, hits, strict=True)}
            row[mode] = {g: _ndcg(dev["qrels"], run, keep) for g, keep in groups.items()}
        results[name] = row
        if name == STUDIED:
            combos = _combinations(s, dev, groups)
        s.close()
        logging.getLogger(SECTION).info("%s: %s", name, row)
    report = {
        "command": harness.command_line(),
        "machine": harness.machine(),
        "load_average": [load_before, harness.load_average()],
        "layout": args.layout,
        "studied": STUDIED,
        "documents": len(dev["docs"]),
        "sentences_per_document": args.sentences,
        "queries": {g: len(k) for g, k in groups.items()},
        "configs": results,
        "combinations": combos,
    }
    harness.finish(args, render, report)
    return 0


def _tables(report: dict[str, Any]) -> list[str]:
    """One run's tables: every cut in both modes, then the combination study."""
    groups = list(report["queries"])
    modes = ("dense", "hybrid")
    head = " | ".join(f"{m} {g} ({report['queries'][g]})" for m in modes for g in groups)
    lines = [f"| cut (tokens/overlap) | passages | {head} |", "|" + "---|" * (2 + 2 * len(groups))]
    from flowsearch.ingest.passages import DEFAULT_OVERLAP, DEFAULT_TOKENS

    shipped = f"{DEFAULT_TOKENS}/{DEFAULT_OVERLAP}"
    for name, row in report["configs"].items():
        cells = " | ".join(f"{row[m][g]:.3f}" for m in modes for g in groups)
        label = f"**{name}** (default)" if name == shipped else name
        lines.append(f"| {label} | {row['passages']:,} | {cells} |")
    studied = report.get("studied", "254/32")
    if report.get("combinations"):
        lines += [
            "",
            f"A document's score from its passages ({studied} cut, exact cosines, dense nDCG@10):",
            "",
            "| rule | " + " | ".join(groups) + " |",
            "|---|" + "---|" * len(groups),
        ]
        for rule, row in report["combinations"].items():
            lines.append(f"| {rule} | " + " | ".join(f"{row[g]:.3f}" for g in groups) + " |")
    return lines


def render(report: dict[str, Any]) -> str:
    body = [
        f"Long-document dev sets: {report['documents']} documents of "
        f"{report['sentences_per_document']} QNLI dev sentences (Wikipedia), "
        f"{report['queries']['all']} QNLI questions (a seeded sample), the relevant document "
        "the one holding the answering sentence; bundled all-MiniLM-L6-v2, "
        '`calibration="none"`, every figure a real `build_index` and `Searcher.search(k=10)` '
        '(nDCG@10). "past the window": the answer starts after the 254 tokens the encoder '
        'reads of its document; "truncation" is `passage_tokens=0` (before passages).',
        "",
        "**One topic per document** (each document a seed sentence and its 15 nearest by TF-IDF):",
        "",
        *_tables(report),
    ]
    mixed = HERE / "bench_passages_mixed.json"
    if report.get("layout", "topic") == "topic" and mixed.is_file():
        other = json.loads(mixed.read_text())
        body += [
            "",
            f"**Mixed topics** (sentences shuffled; {other['documents']} documents, "
            f"{other['queries']['all']} questions; `--layout mixed`, run at "
            f"{other['command']!r}):",
            "",
            *_tables(other),
        ]
    title = "Passages: long documents (issue 32)"
    return harness.markdown(title, body, report, "python -m benchmarks run passages")


if __name__ == "__main__":
    harness.script(main)
