r"""Reading and writing retrieval sets in the BEIR layout (Thakur et al., NeurIPS 2021 D&B).

A BEIR directory holds:

- ``corpus.jsonl``: one JSON object per line, ``{"_id", "title", "text", ...}``; keys other than
  those three are the passage's metadata.
- ``queries.jsonl``: ``{"_id", "text", ...}`` per line (other keys ignored).
- ``qrels/test.tsv`` (or ``qrels/<split>.tsv``, or ``qrels.tsv`` beside the JSONL files):
  tab-separated ``query-id``, ``corpus-id``, ``score`` (an integer grade) after a header line.

As BEIR's own loader does, queries without any qrels row are dropped, and a passage's text for a
dense model is ``title + " " + text`` when it has a non-empty title (BEIR's dense retrievers join
the two with a space), else ``text``. Every id is read as a string.

Qrels that name corpus ids the corpus lacks are kept, with a warning: some official BEIR
releases are so, and BEIR's and MTEB's evaluators score them (those relevant passages are
unreachable and count against every run). When more than
:data:`QRELS_MISSING_MAX_SHARE` of the judgements miss, the qrels
belong to another corpus, and the directory is refused.

Example:
    >>> ds = load_beir("benchmarks/_work/dev_sets/stsb-para")  # doctest: +SKIP
    >>> len(ds.doc_ids), len(ds.queries), ds.mean_relevant()  # doctest: +SKIP
    (14281, 1875, 1.2...)
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flowsearch.errors import BadInput, NotFound

__all__ = ["BeirDataset", "find_qrels", "load_beir", "passage_text", "write_beir"]

#: A BEIR directory where more than this share of the qrels' judgements name corpus ids its
#: corpus lacks is refused: most missing means the qrels belong to another corpus.
QRELS_MISSING_MAX_SHARE = 0.5

LOG = logging.getLogger(__name__)

Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class BeirDataset:
    r"""A retrieval set: a corpus, queries and graded relevance judgements.

    Attributes:
        name: the directory's name, e.g. ``"scifact"``.
        doc_ids: corpus ids in file order, length n.
        texts: passage texts (title joined to text, see :func:`passage_text`), length n.
        titles: the titles as given (``""`` when absent), length n.
        metadata: the other keys of each corpus line, length n.
        queries: query id -> query text, only queries that have qrels, in file order.
        qrels: query id -> {corpus id: grade}; a grade <= 0 means judged not relevant.
        missing_ids: corpus ids the qrels name that the corpus lacks, sorted (unreachable).
    """

    name: str
    doc_ids: list[str]
    texts: list[str]
    titles: list[str]
    metadata: list[dict[str, object]]
    queries: dict[str, str]
    qrels: Qrels
    missing_ids: tuple[str, ...] = ()

    def mean_relevant(self) -> float:
        """Mean number of relevant (grade > 0) passages per query."""
        if not self.qrels:
            return 0.0
        return sum(sum(g > 0 for g in d.values()) for d in self.qrels.values()) / len(self.qrels)

    def unreachable_judgements(self) -> int:
        """How many (query, corpus id) judgements name a passage the corpus lacks."""
        missing = set(self.missing_ids)
        return sum(d in missing for docs in self.qrels.values() for d in docs)


def passage_text(title: str | None, text: str | None) -> str:
    """``title + " " + text`` when the title is non-empty (BEIR's convention for dense models)."""
    title = (title or "").strip()
    text = text or ""
    return f"{title} {text}" if title else text


def find_qrels(root: str | os.PathLike[str], split: str = "test") -> Path:
    """The qrels file of ``split``: ``qrels/<split>.tsv``, else ``qrels.tsv``.

    Raises:
        NotFound: neither file exists.
    """
    root = Path(root)
    for path in (root / "qrels" / f"{split}.tsv", root / "qrels.tsv"):
        if path.is_file():
            return path
    raise NotFound(
        f"no qrels in {root}: expected qrels/{split}.tsv or qrels.tsv (query-id, corpus-id, score)"
    )


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """(line number, object) for every non-blank line; a bad line is named with its number."""
    if not path.is_file():
        raise NotFound(
            f"{path} is missing: a BEIR directory holds corpus.jsonl, queries.jsonl and "
            "qrels/test.tsv"
        )
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise BadInput(
                    f"{path}:{lineno} is not valid JSON ({err.msg}); fix or remove that line"
                ) from None
            if not isinstance(obj, dict):
                raise BadInput(f"{path}:{lineno} is not a JSON object; expected {{...}}")
            if "_id" not in obj:
                raise BadInput(f'{path}:{lineno} has no "_id"; every line needs one')
            yield lineno, obj


def _text_field(obj: dict[str, object], key: str, path: Path, lineno: int) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadInput(
            f"{path}:{lineno} has a {type(value).__name__} as {key!r}; expected a string"
        )
    return value


def _read_corpus(path: Path) -> tuple[list[str], list[str], list[str], list[dict[str, object]]]:
    ids: list[str] = []
    texts: list[str] = []
    titles: list[str] = []
    metadata: list[dict[str, object]] = []
    first_line: dict[str, int] = {}
    for lineno, obj in _json_lines(path):
        doc_id = str(obj["_id"])
        if doc_id in first_line:
            raise BadInput(
                f"{path}:{lineno} repeats _id {doc_id!r} (first on line {first_line[doc_id]}); "
                "corpus ids must be unique"
            )
        first_line[doc_id] = lineno
        title = _text_field(obj, "title", path, lineno)
        ids.append(doc_id)
        titles.append(title)
        texts.append(passage_text(title, _text_field(obj, "text", path, lineno)))
        metadata.append({k: v for k, v in obj.items() if k not in ("_id", "title", "text")})
    if not ids:
        raise BadInput(f"{path} holds no passages")
    return ids, texts, titles, metadata


def _read_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for lineno, obj in _json_lines(path):
        qid = str(obj["_id"])
        if qid in queries:
            raise BadInput(f"{path}:{lineno} repeats query _id {qid!r}; ids must be unique")
        queries[qid] = _text_field(obj, "text", path, lineno)
    return queries


def _read_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    with path.open(encoding="utf-8", newline="") as handle:
        lines = [line.rstrip("\r\n") for line in handle]
    if not lines:
        raise BadInput(f"{path} is empty; expected a header and query-id, corpus-id, score")
    for lineno, line in enumerate(lines[1:], start=2):  # line 1 is the header
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 3:
            raise BadInput(
                f"{path}:{lineno} has {len(cols)} tab-separated columns, expected 3: "
                "query-id, corpus-id, score"
            )
        try:
            grade = int(float(cols[2]))
        except ValueError:
            raise BadInput(
                f"{path}:{lineno} has score {cols[2]!r}; expected an integer grade"
            ) from None
        qrels.setdefault(cols[0], {})[cols[1]] = grade
    return qrels


def _missing_corpus_ids(qrels: Qrels, doc_ids: list[str], qrels_path: Path) -> tuple[str, ...]:
    """Corpus ids the qrels name that the corpus lacks: warned about when a few, refused when
    more than :data:`QRELS_MISSING_MAX_SHARE` of the judgements (then the qrels are another
    corpus's)."""
    known = set(doc_ids)
    judgements = [d for docs in qrels.values() for d in docs]
    missing = sorted({d for d in judgements if d not in known})
    if not missing:
        return ()
    absent = sum(d not in known for d in judgements)
    counts = f"{absent:,} of {len(judgements):,} judgements name {len(missing):,} corpus id(s)"
    if absent > QRELS_MISSING_MAX_SHARE * len(judgements):
        raise BadInput(
            f"{counts} absent from corpus.jsonl (e.g. {missing[0]!r}): the qrels in "
            f"{qrels_path} do not belong to this corpus",
            fix="check that corpus.jsonl and the qrels come from the same dataset",
        )
    LOG.warning(
        "%s: %s absent from corpus.jsonl (e.g. %r); those passages are unreachable and are "
        "scored as BEIR and MTEB score them",
        qrels_path,
        counts,
        missing[0],
    )
    return tuple(missing)


def load_beir(root: str | os.PathLike[str], split: str = "test") -> BeirDataset:
    """Reads a BEIR directory (see the module docstring for the layout).

    Args:
        root: the directory holding ``corpus.jsonl``, ``queries.jsonl`` and the qrels.
        split: which ``qrels/<split>.tsv`` to read (a bare ``qrels.tsv`` serves any split).

    Returns:
        The dataset, with only the queries that have qrels; ``missing_ids`` lists the corpus ids
        the qrels name that the corpus lacks (a warning is logged when there are any).

    Raises:
        NotFound: a missing directory or file.
        BadInput: a line that is not JSON (named with its number), repeated ids, qrels naming a
            query that does not exist, or qrels most of whose judgements name absent passages.
    """
    path = Path(root).expanduser()
    if not path.is_dir():
        raise NotFound(f"BEIR directory {path} does not exist")
    ids, texts, titles, metadata = _read_corpus(path / "corpus.jsonl")
    all_queries = _read_queries(path / "queries.jsonl")
    qrels_path = find_qrels(path, split)
    qrels = _read_qrels(qrels_path)
    unknown_q = [q for q in qrels if q not in all_queries]
    if unknown_q:
        raise BadInput(
            f"{qrels_path} names {len(unknown_q)} query id(s) absent from queries.jsonl "
            f"(e.g. {unknown_q[0]!r}); the qrels do not belong to these queries"
        )
    missing = _missing_corpus_ids(qrels, ids, qrels_path)
    queries = {q: t for q, t in all_queries.items() if q in qrels}
    if not queries:
        raise BadInput(f"{qrels_path} judges no query; nothing to evaluate")
    dropped = len(all_queries) - len(queries)
    if dropped:
        LOG.info("%s: %d queries without qrels dropped (as BEIR does)", path.name, dropped)
    ordered = {q: qrels[q] for q in queries}  # qrels in the queries' file order
    return BeirDataset(path.name, ids, texts, titles, metadata, queries, ordered, missing)


def write_beir(
    root: str | os.PathLike[str],
    corpus: Sequence[Mapping[str, object]],
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    split: str = "test",
) -> Path:
    """Writes a BEIR directory that :func:`load_beir` (and BEIR's own loader) reads.

    Args:
        root: the directory to create or fill.
        corpus: one mapping per passage with ``_id``, ``text``, optionally ``title`` and other
            keys (metadata).
        queries: query id -> text.
        qrels: query id -> {corpus id: grade}, written to ``qrels/<split>.tsv``.

    Returns:
        ``root`` as a Path.
    """
    out = Path(root)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as handle:
        for doc in corpus:
            handle.write(json.dumps(dict(doc), ensure_ascii=False) + "\n")
    with (out / "queries.jsonl").open("w", encoding="utf-8") as handle:
        for qid, text in queries.items():
            handle.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
    with (out / "qrels" / f"{split}.tsv").open("w", encoding="utf-8") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        for qid, docs in qrels.items():
            for doc_id, grade in docs.items():
                handle.write(f"{qid}\t{doc_id}\t{int(grade)}\n")
    return out
