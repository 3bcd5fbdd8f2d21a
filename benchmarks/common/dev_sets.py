r"""Builds BEIR-format retrieval development sets from ``../shared/data`` (issue 16).

Usage::

    python -m benchmarks.common.dev_sets [DATA_DIR] [OUT_DIR] [--sets qnli-dev,stsb-para]
                                         [--max-corpus N]
    python -m benchmarks.common.dev_sets --smoke    # 300 passages each, under _work/smoke

``DATA_DIR`` defaults to ``$FLOWSEARCH_DATA``, else ``../shared/data``; ``OUT_DIR`` to
``benchmarks/_work/dev_sets`` (git-ignored: evaluation data is never committed). The benchmarks
that need the sets build them themselves (:func:`dev_sets`). Each set is a directory
``load_beir`` and BEIR's own loader read, plus a ``dataset.json`` saying how it was made and
whether to evaluate with ``ignore_identical_ids``.

- ``qnli-dev`` (asymmetric, question -> passage): QNLI dev questions; relevant = the sentences
  labelled ``entailment`` (they answer the question); corpus = every distinct dev sentence.
- ``stsb-para`` (symmetric): STS-B pairs of all splits with a gold score >= 4; query = s1,
  relevant = s2; corpus = every distinct STS-B sentence.
- ``sick-para`` (symmetric): SICK pairs of all splits with relatedness >= 4, likewise.
- ``snli-entail`` (symmetric, NLI-hard): SNLI dev + test premises; relevant = their
  ``entailment`` hypotheses; corpus = every distinct premise and hypothesis, so each query's
  neutral and contradicting hypotheses are in the corpus as near-miss distractors.

In the symmetric sets every query is itself a corpus sentence, and it has the same id there (ids
are a hash of the text), so evaluate them with ``ignore_identical_ids=True`` as BEIR does for
ArguAna; a pair whose two sides are the same text is skipped. Ids are the first 16 hex digits of
the SHA-256 of the UTF-8 text (stable across runs, unlike Python's salted ``hash``), prefixed
``s`` for sentences and ``q`` for QNLI questions.

``--max-corpus N`` subsamples deterministically: queries in id order are kept while the passages
they need (their relevant ones and, for symmetric sets, their own text) fill at most half of N;
the rest of N is filled with other corpus sentences in id order. Every kept query keeps all of
its relevant passages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common.harness import DEV_SETS, WORK, data_dir
from flowsearch.evaluation.beir import write_beir
from flowsearch.evaluation.datasets import (
    load_qnli,
    load_sick,
    load_stsb,
    resolve_data_dir,
    unique_texts,
)

__all__ = ["SETS", "DevSet", "dev_sets", "make_dev_sets", "text_id"]

LOG = logging.getLogger(__name__)

DEFAULT_OUT = WORK / "dev_sets"


def text_id(text: str, prefix: str = "s") -> str:
    """A stable id for a text: ``prefix`` + 16 hex digits of its SHA-256."""
    return prefix + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass
class DevSet:
    """A retrieval set in memory: corpus texts by id, queries by id, binary qrels."""

    name: str
    symmetric: bool
    source: str
    corpus: dict[str, str] = field(default_factory=dict)
    queries: dict[str, str] = field(default_factory=dict)
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)

    def add_corpus(self, texts: Iterable[str]) -> None:
        for text in unique_texts([t.strip() for t in texts if t.strip()]):
            self.corpus.setdefault(text_id(text), text)

    def add_pair(self, query: str, passage: str, query_prefix: str = "s") -> None:
        """Marks ``passage`` relevant to ``query`` (both must be in the corpus if symmetric)."""
        query, passage = query.strip(), passage.strip()
        if not query or not passage or query == passage:
            return
        qid, did = text_id(query, query_prefix), text_id(passage)
        self.queries.setdefault(qid, query)
        self.qrels.setdefault(qid, {})[did] = 1

    def mean_relevant(self) -> float:
        return sum(len(d) for d in self.qrels.values()) / max(len(self.qrels), 1)

    def subsample(self, max_corpus: int) -> DevSet:
        """At most ``max_corpus`` passages, deterministically (see the module docstring)."""
        if len(self.corpus) <= max_corpus:
            return self
        needed: set[str] = set()
        kept: list[str] = []
        for qid in sorted(self.qrels):
            want = set(self.qrels[qid]) | ({qid} if self.symmetric else set())
            if len(needed | want) > max_corpus // 2:
                break
            needed |= want
            kept.append(qid)
        fill = [d for d in sorted(self.corpus) if d not in needed][: max_corpus - len(needed)]
        ids = sorted(needed | set(fill))
        return DevSet(
            self.name,
            self.symmetric,
            f"{self.source}; subsampled from {len(self.corpus)} passages, "
            f"{len(self.qrels)} queries",
            {d: self.corpus[d] for d in ids},
            {q: self.queries[q] for q in kept},
            {q: self.qrels[q] for q in kept},
        )

    def write(self, root: Path) -> dict[str, Any]:
        """Writes the BEIR directory ``root / name`` and returns its ``dataset.json`` record."""
        out = root / self.name
        corpus = [{"_id": d, "title": "", "text": t} for d, t in self.corpus.items()]
        write_beir(out, corpus, self.queries, self.qrels)
        info = {
            "name": self.name,
            "source": self.source,
            "symmetric": self.symmetric,
            "ignore_identical_ids": self.symmetric,
            "corpus": len(self.corpus),
            "queries": len(self.queries),
            "mean_relevant": round(self.mean_relevant(), 4),
        }
        (out / "dataset.json").write_text(json.dumps(info, indent=2) + "\n")
        return info


def _qnli(data: Path) -> DevSet:
    pairs = load_qnli(data, "dev")
    ds = DevSet("qnli-dev", False, "QNLI dev: question -> entailment sentences")
    ds.add_corpus(pairs.s2)
    for question, sentence, label in zip(pairs.s1, pairs.s2, pairs.scores, strict=True):
        if label == 1.0:
            ds.add_pair(question, sentence, query_prefix="q")
    return ds


def _paraphrases(name: str, source: str, sets: Sequence[Any], threshold: float) -> DevSet:
    ds = DevSet(name, True, source)
    for pairs in sets:
        ds.add_corpus(pairs.s1 + pairs.s2)
    for pairs in sets:
        for s1, s2, score in zip(pairs.s1, pairs.s2, pairs.scores, strict=True):
            if score >= threshold:
                ds.add_pair(s1, s2)
    return ds


def _stsb(data: Path) -> DevSet:
    splits = [load_stsb(data, split) for split in ("train", "dev", "test")]
    return _paraphrases("stsb-para", "STS-B train+dev+test, score >= 4: s1 -> s2", splits, 4.0)


def _sick(data: Path) -> DevSet:
    splits = [load_sick(data, split) for split in ("train", "trial", "test")]
    return _paraphrases("sick-para", "SICK train+trial+test, relatedness >= 4: A -> B", splits, 4.0)


def _snli(data: Path) -> DevSet:
    root = data / "snli"
    ds = DevSet("snli-entail", True, "SNLI dev+test: premise -> entailment hypotheses")
    rows: list[tuple[str, str, str]] = []
    for split in ("dev", "test"):
        cols = [
            (root / f"{part}.{split}").read_text(encoding="utf-8").splitlines()
            for part in ("s1", "s2", "labels")
        ]
        rows.extend(zip(*cols, strict=True))
    ds.add_corpus([r[0] for r in rows] + [r[1] for r in rows])
    for premise, hypothesis, label in rows:
        if label.strip() == "entailment":
            ds.add_pair(premise, hypothesis)
    return ds


SETS: dict[str, Callable[[Path], DevSet]] = {
    "qnli-dev": _qnli,
    "stsb-para": _stsb,
    "sick-para": _sick,
    "snli-entail": _snli,
}


def make_dev_sets(
    data_dir: str | Path | None,
    out_dir: str | Path = DEFAULT_OUT,
    names: Sequence[str] | None = None,
    max_corpus: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Builds the named sets (all by default) under ``out_dir``; returns each one's record."""
    data = resolve_data_dir(data_dir)
    wanted = list(SETS) if names is None else list(names)
    unknown = [n for n in wanted if n not in SETS]
    if unknown:
        raise SystemExit(f"unknown set {unknown[0]!r}; choose from {', '.join(SETS)}")
    out = Path(out_dir)
    records = {}
    for name in wanted:
        ds = SETS[name](data)
        if max_corpus is not None:
            ds = ds.subsample(max_corpus)
        records[name] = ds.write(out)
    return records


def dev_sets(
    data: Path, max_corpus: int, names: Iterable[str] = DEV_SETS
) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The BEIR dev sets of :func:`make_dev_sets` at ``max_corpus`` passages, (re)built under
    ``_work/dev_sets_<max_corpus>`` (deterministic, seconds): ``(root, {name: record})``."""
    root = WORK / f"dev_sets_{max_corpus}"
    return root, make_dev_sets(data, root, list(names), max_corpus)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", nargs="?", default=None, help="evaluation data folder")
    parser.add_argument("out_dir", nargs="?", default=str(DEFAULT_OUT))
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated set names")
    parser.add_argument("--max-corpus", type=int, default=None, help="subsample larger corpora")
    parser.add_argument("--smoke", action="store_true", help="300 passages, under _work/smoke")
    args = parser.parse_args(argv)
    if args.smoke:
        args.out_dir, args.max_corpus = str(WORK / "smoke" / "dev_sets"), 300
    names = [n.strip() for n in args.sets.split(",") if n.strip()]
    records = make_dev_sets(data_dir(args.data_dir), args.out_dir, names, args.max_corpus)
    print(f"{'set':<14} {'corpus':>8} {'queries':>8} {'rel/query':>9}  (in {args.out_dir})")
    for name, info in records.items():
        print(f"{name:<14} {info['corpus']:>8} {info['queries']:>8} {info['mean_relevant']:>9.3f}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    sys.exit(main())
