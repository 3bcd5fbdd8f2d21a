r"""Cost of the lexical (BM25) side of hybrid search on 200k real short texts.

Corpus: every distinct sentence of ``../shared/data`` (STS-B, SICK, STS12-16, SNLI dev/test,
QNLI dev and the QNLI test *answer* sentences; about 65k), topped up to ``--rows`` (200k) with
splices of two real sentences (the first half of one, the second half of another, seeded,
distinct), so the vocabulary and lengths stay those of real text. Queries: QNLI test questions
(real questions, not in the corpus).

Measured, one process, wall time:

- build: :meth:`LexicalIndex.build` from the list of texts (tokenise + postings + weights), and
  for reference tokenising alone and bm25s's own ``BM25.index`` on the same tokens; best of
  ``--repeats`` runs (the machine is shared);
- keeping it in step: ``delete`` of 1% of rows, ``add`` of 1,000 rows, ``compact``, each of which
  recomputes every weight (so each equals a rebuild from the live texts without re-tokenising);
- files: ``save``, ``load`` and the size on disk;
- search: one query at a time (an online service), k=10 and k=100 (hybrid's candidate depth),
  with and without an ``allowed`` mask of 10% of rows; p50 and p95 over ``--queries`` queries.

Writes ``benchmarks/bench_lexical.json`` and its section of ``benchmarks/RESULTS.md`` (also
printed); ``--render`` only rewrites that section from the saved JSON (no measurement).

Usage:
    PYTHONPATH=. python benchmarks/bench_lexical.py [--data ../shared/data] [--rows 200000]
        [--queries 500] [--repeats 3]
    PYTHONPATH=. python benchmarks/bench_lexical.py --render
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
from results_md import write_section

from flowsearch.evaluation import datasets as ds
from flowsearch.lexical.legacy import LexicalIndex
from flowsearch.lexical.tokens import tokenize_batch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def real_sentences(data: Path) -> tuple[list[str], list[str]]:
    """(distinct corpus sentences, QNLI test questions not among them)."""
    texts: list[str] = []
    for split in ("train", "dev", "test"):
        texts += ds.load_stsb(data, split).sentences()
    for split in ("train", "trial", "test"):
        texts += ds.load_sick(data, split).sentences()
    for year in (12, 13, 14, 15, 16):
        texts += ds.load_sts_year(data, year).sentences()
    texts += ds.load_qnli(data, "dev").sentences()
    texts += ds.load_snli_sentences(data)
    questions = []
    # the test split is unlabelled (index, question, sentence), so load_qnli does not read it
    lines = (data / "qnli" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    for line in lines:
        cols = line.split("\t")
        if len(cols) >= 3:
            questions.append(cols[1])
            texts.append(cols[2])
    corpus = ds.unique_texts([t for t in texts if t.strip()])
    in_corpus = set(corpus)
    return corpus, ds.unique_texts([q for q in questions if q not in in_corpus])


def top_up(texts: list[str], rows: int, seed: int = 0) -> list[str]:
    """``texts`` plus distinct splices of two of them, up to ``rows`` texts."""
    rng = np.random.default_rng(seed)
    words = [t.split() for t in texts]
    out, seen = list(texts), set(texts)
    while len(out) < rows:
        for a, b in rng.integers(len(words), size=(rows - len(out), 2)):
            first, second = words[a], words[b]
            text = " ".join(first[: len(first) // 2] + second[len(second) // 2 :])
            if text and text not in seen:
                seen.add(text)
                out.append(text)
    return out[:rows]


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def best_of(repeats: int, fn: Any) -> tuple[Any, float]:
    runs = [timed(fn) for _ in range(repeats)]
    return runs[-1][0], min(t for _, t in runs)


def latency_ms(index: LexicalIndex, queries: list[str], k: int, allowed: Any = None) -> dict:
    for q in queries[:20]:  # warm-up
        index.search([q], k, allowed=allowed)
    times = []
    for q in queries:
        start = time.perf_counter()
        index.search([q], k, allowed=allowed)
        times.append(time.perf_counter() - start)
    ms = np.asarray(times) * 1e3
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95))}


def render(r: dict[str, Any]) -> str:
    """The RESULTS.md section, from the JSON document this script saves."""
    load = r["machine"]["load_average_1min"]
    search = r["search_ms"]
    worst_p95 = max(ms["p95"] for ms in search.values())
    what = f"{r['terms']:,} terms, {r['postings']:,} postings"
    lines = [
        "## Lexical (BM25) index cost (`benchmarks/bench_lexical.py`)",
        "",
        f"{r['rows']:,} short texts ({r['real_rows']:,} distinct real sentences of the STS/SICK/"
        f"SNLI/QNLI data, the rest splices of two of them; {r['words_per_text_mean']:.1f} words "
        f"on average), {r['queries']} QNLI test questions one at a time; no numeric target is "
        f"set, the figures are the lexical side's cost in hybrid search (build {r['build_s']:.1f} "
        f"s, single-query p95 at most {worst_p95:.2f} ms). Builds are the best of "
        f"{r['repeats']} runs; the 1-min load average was {load:.1f} on {r['machine']['cpus']} "
        "CPUs, and on a shared machine other processes' load sets much of the p95.",
        "",
        "| lexical index | |",
        "|---|---:|",
        f"| build (tokenise + postings + BM25 weights), best of {r['repeats']} "
        f"| {r['build_s']:.1f} s |",
        f"| of which tokenising (NFKC, stopwords, Snowball stemmer) | {r['tokenize_s']:.1f} s |",
        f"| reference: bm25s {r['bm25s']} `BM25.index` on the same tokens "
        f"| {r['bm25s_index_from_tokens_s']:.1f} s |",
        f"| delete 1% of rows (re-weigh all) | {r['delete_1pct_s'] * 1e3:.0f} ms |",
        f"| add 1,000 rows (re-weigh all) | {r['add_1000_s'] * 1e3:.0f} ms |",
        f"| compact | {r['compact_s'] * 1e3:.0f} ms |",
        f"| save / load | {r['save_s'] * 1e3:.0f} / {r['load_s'] * 1e3:.0f} ms |",
        f"| on disk ({what}) | {r['disk_mb']:.1f} MB |",
    ]
    for name, ms in search.items():
        lines.append(f"| one query, {name}: p50 / p95 | {ms['p50']:.2f} / {ms['p95']:.2f} ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3, help="builds timed, best kept")
    parser.add_argument(
        "--render", action="store_true", help="only rewrite the RESULTS.md section from the JSON"
    )
    args = parser.parse_args()
    if args.render:
        body = render(json.loads((HERE / "bench_lexical.json").read_text()))
        write_section(ROOT / "benchmarks" / "RESULTS.md", body, "bench_lexical")
        print(body)
        return

    real, questions = real_sentences(args.data)
    texts = top_up(real, args.rows)
    queries = questions[: args.queries]
    words = np.array([len(t.split()) for t in texts])
    print(f"{len(texts)} texts ({len(real)} real, the rest spliced), {len(queries)} queries")

    # the machine is shared: the best of --repeats runs is the cost of the work itself
    tokens, t_tokenize = best_of(args.repeats, lambda: tokenize_batch(texts))
    index, t_build = best_of(args.repeats, lambda: LexicalIndex.build(texts))
    _, t_bm25s = best_of(args.repeats, lambda: bm25s.BM25().index(tokens, show_progress=False))

    rng = np.random.default_rng(1)
    allowed = rng.random(index.n_rows) < 0.10
    search = {
        f"k={k}{' allowed 10%' if mask is not None else ''}": latency_ms(index, queries, k, mask)
        for k in (10, 100)
        for mask in (None, allowed)
    }

    with tempfile.TemporaryDirectory() as tmp:
        _, t_save = timed(lambda: index.save(Path(tmp) / "lexical"))
        size = sum(p.stat().st_size for p in (Path(tmp) / "lexical").iterdir())
        loaded, t_load = timed(lambda: LexicalIndex.load(Path(tmp) / "lexical"))
    assert loaded.nnz == index.nnz

    dead = rng.choice(index.n_rows, size=index.n_rows // 100, replace=False)
    _, t_delete = timed(lambda: index.delete(dead))
    _, t_add = timed(lambda: index.add(real[:1000]))
    _, t_compact = timed(lambda: index.compact())

    result = {
        "rows": len(texts),
        "real_rows": len(real),
        "words_per_text_mean": float(words.mean()),
        "terms": loaded.vocab_size,
        "postings": loaded.nnz,
        "queries": len(queries),
        "repeats": args.repeats,
        "build_s": t_build,
        "tokenize_s": t_tokenize,
        "bm25s_index_from_tokens_s": t_bm25s,
        "delete_1pct_s": t_delete,
        "add_1000_s": t_add,
        "compact_s": t_compact,
        "save_s": t_save,
        "load_s": t_load,
        "disk_mb": size / 2**20,
        "search_ms": search,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            # other processes' load: on a shared machine it, not the index, sets the p95
            "load_average_1min": os.getloadavg()[0],
        },
        "bm25s": bm25s.__version__,
    }
    (HERE / "bench_lexical.json").write_text(json.dumps(result, indent=2) + "\n")

    body = render(result)
    write_section(ROOT / "benchmarks" / "RESULTS.md", body, "bench_lexical")
    print(body)


if __name__ == "__main__":
    main()
