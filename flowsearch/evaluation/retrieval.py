r"""``flowsearch eval retrieval``: a BEIR directory through the product, scored as BEIR scores it.

:func:`run_retrieval` runs the product path end to end: the corpus is written to Parquet,
indexed with :func:`flowsearch.build_index`, every query is answered by
:meth:`flowsearch.Searcher.search` (:func:`search_run`), and the run is scored by
:mod:`flowsearch.evaluation.ranking_metrics` (pytrec_eval).

Example:
    >>> out = run_retrieval("scifact", modes="all")  # doctest: +SKIP
    >>> out["results"]["hybrid"]["ndcg@10"]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from typing_extensions import Unpack  # typing.Unpack is 3.11+

from flowsearch.errors import BadInput, NotFound
from flowsearch.evaluation import ranking_metrics
from flowsearch.evaluation.beir import BeirDataset, load_beir
from flowsearch.evaluation.reports import (
    RetrievalCorpus,
    RetrievalReport,
    RetrievalSeconds,
    RetrievalSuiteReport,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from flowsearch.ann.policy import AnnPolicy
    from flowsearch.search.modes import Mode
    from flowsearch.search.searcher import Searcher
from flowsearch.evaluation.ranking_metrics import retrieval_scores
from flowsearch.search.modes import MODES, Mode

__all__ = [
    "MEASURES",
    "MODES",
    "Mode",
    "beir_dirs",
    "run_retrieval",
    "run_retrieval_suite",
    "search_run",
    "write_corpus_parquet",
]

#: The figures of every mode, as BEIR and MTEB report them.
MEASURES = ("ndcg@10", "recall@100", "mrr@10")

LOG = logging.getLogger(__name__)


def __getattr__(name: str) -> object:
    """The metrics (``ndcg_at_k``, ``retrieval_scores``, ...) lived here before
    :mod:`~flowsearch.evaluation.ranking_metrics`: imports of them from here keep working."""
    if name in ranking_metrics.__all__:
        return getattr(ranking_metrics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def search_run(
    searcher: Searcher,
    queries: Mapping[str, str],
    *,
    k: int = 100,
    mode: str = "dense",
    batch_size: int = 64,
    ignore_identical_ids: bool = False,
) -> dict[str, dict[str, float]]:
    """Answers every query with ``searcher.search`` and returns the run.

    Args:
        searcher: an open :class:`flowsearch.Searcher` (or anything with its ``search``).
        queries: query id -> text.
        k: hits kept per query.
        mode: ``"dense"``, ``"lexical"`` or ``"hybrid"``, always passed on (the Searcher's own
            default is hybrid when the index has a lexical part).
        batch_size: queries per ``search`` call.
        ignore_identical_ids: fetch one hit more and drop the query's own id, so ``k`` remain
            (as BEIR's exact search does).

    Returns:
        query id -> {doc id (as str): score}.
    """
    fetch = k + 1 if ignore_identical_ids else k
    ids = list(queries)
    run: dict[str, dict[str, float]] = {}
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        results = searcher.search([queries[q] for q in chunk], k=fetch, mode=cast("Mode", mode))
        for qid, hits in zip(chunk, results, strict=True):
            docs = [(str(h.id), float(h.score)) for h in hits]
            if ignore_identical_ids:
                docs = [(d, s) for d, s in docs if d != qid]
            run[qid] = dict(docs[:k])
    return run


def _metadata_columns(dataset: BeirDataset, reserved: Sequence[str]) -> dict[str, pa.Array]:
    """pyarrow arrays of the corpus's metadata keys; nested or mixed values become JSON text."""
    import pyarrow as pa

    keys = list(dict.fromkeys(k for meta in dataset.metadata for k in meta))
    keys = (["title"] if any(dataset.titles) else []) + keys
    columns: dict[str, pa.Array] = {}
    for key in keys:
        if key == "title":
            values: list[object] = [t or None for t in dataset.titles]
        else:
            values = [meta.get(key) for meta in dataset.metadata]
        name = key
        while name in reserved or name in columns:
            name += "_"  # "id" / "text" / "vector" are the index's own columns
        try:
            if any(isinstance(v, (dict, list)) for v in values):
                raise TypeError("nested")
            columns[name] = pa.array(values)
        except (TypeError, ValueError, pa.ArrowException):
            columns[name] = pa.array(
                [None if v is None else json.dumps(v, ensure_ascii=False) for v in values],
                pa.string(),
            )
    return columns


def write_corpus_parquet(dataset: BeirDataset, path: str | os.PathLike[str]) -> Path:
    """The corpus as the Parquet file ``build_index`` reads: ``id``, ``text``, then metadata.

    ``text`` is the title joined to the text (:func:`~flowsearch.evaluation.beir.passage_text`);
    ``title`` is kept as a metadata column too. A metadata key that clashes with the index's own
    columns gets a trailing underscore.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flowsearch.storage.rows import RESERVED_COLUMNS

    table = pa.table(
        {
            "id": pa.array(dataset.doc_ids, pa.string()),
            "text": pa.array(dataset.texts, pa.string()),
            **_metadata_columns(dataset, RESERVED_COLUMNS),
        }
    )
    out = Path(path)
    pq.write_table(table, out)
    return out


def _modes(modes: str | Sequence[str]) -> list[str]:
    """The modes asked for, in order, ``"all"`` expanded; unknown names refused."""
    items = [modes] if isinstance(modes, str) else list(modes)
    wanted: list[str] = []
    for item in items:
        for name in list(MODES) if item == "all" else [item]:
            if name not in MODES:
                raise BadInput(
                    f"unknown retrieval mode {item!r}",
                    fix="choose dense, lexical, hybrid or all",
                    param="mode",
                )
            if name not in wanted:
                wanted.append(name)
    if not wanted:
        raise BadInput("no retrieval mode given", fix="e.g. {mode=dense}", param="mode")
    return wanted


def _check_k(k: int) -> None:
    if k < 10:
        raise BadInput(
            f"k must be at least 10 for nDCG@10 and MRR@10, got {k}", fix="pass {k=100}", param="k"
        )
    if k < 100:
        LOG.warning("k=%d < 100: recall@100 counts only the top %d", k, k)


class IndexOptions(TypedDict, total=False):
    """:func:`flowsearch.build_index`'s options that :func:`run_retrieval` passes on as they are
    (its own arguments give the model, pooling, calibration and batch size; the corpus's
    columns are its own)."""

    max_length: int | None
    calibrator: str | os.PathLike[str] | None
    index_factory: str
    overwrite: bool
    fit_sample: int
    strict: bool
    lexical: bool
    backend: str
    quantize: str | None
    engine: str
    address: str | None
    wait: float | None
    passage_tokens: int | None
    passage_overlap: int | None
    ann: AnnPolicy | None


class _BuildOptions(IndexOptions, total=False):
    """Everything :func:`run_retrieval` passes to :func:`flowsearch.build_index`."""

    model: str | os.PathLike[str] | None
    pooling: str
    calibration: str
    batch_size: int


class RetrievalOptions(IndexOptions, total=False):
    """:func:`run_retrieval`'s keyword arguments that :func:`run_retrieval_suite` passes on
    (``index_dir`` is refused there)."""

    model: str | os.PathLike[str] | None
    pooling: str
    calibration: str
    index_dir: str | os.PathLike[str] | None
    keep: bool
    k: int
    batch_size: int
    weight: float | None


def _index_and_score(
    dataset: BeirDataset,
    parquet: Path,
    target: Path,
    modes: list[str],
    build: _BuildOptions,
    search: _SearchOptions,
    seconds: RetrievalSeconds,
    weight: float | None = None,
) -> tuple[RetrievalCorpus, dict[str, dict[str, float]]]:
    """Writes the corpus to ``parquet``, indexes it at ``target`` with ``build`` options,
    searches it per mode with ``search`` options (the hybrid at ``weight``); what was
    evaluated, and its results per mode."""
    from flowsearch.search.options import SearchOptions
    from flowsearch.search.searcher import Searcher
    from flowsearch.writes.build import build_index

    start = time.perf_counter()
    write_corpus_parquet(dataset, parquet)
    summary = build_index(parquet, target, **build)
    seconds["index"] = time.perf_counter() - start
    searcher = Searcher.open(target, options=SearchOptions(hybrid_weight=weight))
    try:
        results = _score_modes(searcher, dataset, modes, seconds=seconds["search"], **search)
        return _describe(dataset, searcher, summary.n_skipped), results
    finally:
        searcher.close()


def _score_modes(
    searcher: Searcher,
    dataset: BeirDataset,
    modes: list[str],
    *,
    k: int,
    batch_size: int,
    ignore_identical_ids: bool,
    seconds: dict[str, float],
) -> dict[str, dict[str, float]]:
    """``{mode: {"ndcg@10", "recall@100", "mrr@10"}}``, each mode's search time in ``seconds``."""
    results: dict[str, dict[str, float]] = {}
    for mode in modes:
        start = time.perf_counter()
        run = search_run(
            searcher,
            dataset.queries,
            k=k,
            mode=mode,
            batch_size=batch_size,
            ignore_identical_ids=ignore_identical_ids,
        )
        seconds[mode] = time.perf_counter() - start
        scores = retrieval_scores(dataset.qrels, run, ignore_identical_ids=ignore_identical_ids)
        scores.pop("queries")
        results[mode] = scores
        LOG.info("%s %s: %s", dataset.name, mode, scores)
    return results


class _SearchOptions(TypedDict):
    """How :func:`_score_modes` searches."""

    k: int
    batch_size: int
    ignore_identical_ids: bool


def _describe(dataset: BeirDataset, searcher: Searcher, skipped: int) -> RetrievalCorpus:
    """What was evaluated: the set's sizes (``skipped``: the build's rows without text) and the
    index's encoder and searched space."""
    encoder = searcher.manifest.encoder
    record = searcher.manifest.calibration
    return {
        "dataset": dataset.name,
        "n_corpus": len(dataset.doc_ids),
        "n_indexed": len(searcher),
        "skipped": skipped,
        "queries": len(dataset.queries),
        "missing_corpus_ids": len(dataset.missing_ids),
        "unreachable_judgements": dataset.unreachable_judgements(),
        "model": encoder.model,
        "pooling": encoder.pooling,
        "calibrator": record.calibrator,
        "space": record.space,
    }


def run_retrieval(
    beir_dir: str | os.PathLike[str],
    modes: str | Sequence[str] = ("dense",),
    *,
    model: str | os.PathLike[str] | None = None,
    pooling: str = "mean",
    calibration: str = "auto",
    index_dir: str | os.PathLike[str] | None = None,
    keep: bool = False,
    k: int = 100,
    batch_size: int = 64,
    ignore_identical_ids: bool = False,
    weight: float | None = None,
    **index_options: Unpack[IndexOptions],
) -> RetrievalReport:
    r"""Indexes a BEIR directory with the product and scores its search, per mode.

    Qrels naming passages the corpus lacks are scored as unreachable (see
    :func:`~flowsearch.evaluation.beir.load_beir`); the result counts them.

    Args:
        beir_dir: a BEIR-format directory (see :mod:`flowsearch.evaluation.beir`).
        modes: any of ``"dense"``, ``"lexical"``, ``"hybrid"``, or ``"all"``.
        model: encoder id or directory; None is the bundled all-MiniLM-L6-v2.
        pooling: encoder pooling.
        calibration: as for :func:`flowsearch.build_index` (``auto``, ``none``, ``flow``, ...).
        index_dir: where to build the index; None builds it in a temporary directory.
        keep: keep the temporary index (its path is returned as ``index_dir``); an
            ``index_dir`` you name is always kept.
        k: hits retrieved per query (recall@100 needs k >= 100).
        batch_size: texts per encoder batch, and queries per search call.
        ignore_identical_ids: drop a retrieved passage whose id is the query's id.
        weight: the hybrid's dense weight in [0, 1]; None: the Searcher's default.
        \**index_options: passed on to :func:`flowsearch.build_index` (e.g. ``max_length``,
            ``passage_tokens``, ``passage_overlap``, ``index_factory``, ``overwrite``).

    Returns:
        ``{"dataset", "n_corpus", "n_indexed", "skipped", "queries",
        "missing_corpus_ids", "unreachable_judgements", "model", "pooling", "calibration",
        "calibrator", "space", "k", "ignore_identical_ids", "weight", "index_dir", "results": {mode:
        {"ndcg@10", "recall@100", "mrr@10"}}, "seconds": {"load", "index", "search": {mode},
        "total"}}``.

    Raises:
        NotFound: a missing directory or file.
        BadInput: a bad file, an unknown mode or calibration, k < 10.
    """
    wanted = _modes(modes)
    _check_k(k)
    if weight is not None:
        from flowsearch.search.options import SearchOptions

        SearchOptions(hybrid_weight=weight)  # refused before anything is encoded
    t0 = time.perf_counter()
    dataset = load_beir(beir_dir)
    seconds: RetrievalSeconds = {"load": time.perf_counter() - t0, "search": {}}
    scratch = Path(tempfile.mkdtemp(prefix="flowsearch-retrieval-"))
    target = Path(index_dir).expanduser() if index_dir is not None else scratch / "index"
    build = _BuildOptions(model=model, pooling=pooling, calibration=calibration,
                          batch_size=batch_size, **index_options)  # fmt: skip
    search: _SearchOptions = {
        "k": k,
        "batch_size": batch_size,
        "ignore_identical_ids": ignore_identical_ids,
    }
    try:
        described, results = _index_and_score(
            dataset, scratch / "corpus.parquet", target, wanted, build, search, seconds, weight
        )
    finally:
        if keep and index_dir is None:
            (scratch / "corpus.parquet").unlink(missing_ok=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    seconds["total"] = time.perf_counter() - t0
    return {
        **described,
        "results": results,
        "calibration": calibration,
        "k": k,
        "ignore_identical_ids": ignore_identical_ids,
        "weight": weight,
        "index_dir": str(target) if (keep or index_dir is not None) else None,
        "seconds": seconds,
    }


def _is_beir(path: Path) -> bool:
    return (path / "corpus.jsonl").is_file()


def beir_dirs(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The BEIR directories named: each path is one (it holds ``corpus.jsonl``) or a folder
    of them (its subfolders that hold one, by name).

    Raises:
        NotFound: a path that does not exist.
        BadInput: no path, a folder holding no BEIR directory, or one named twice.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise BadInput("no BEIR directory given", fix="give one or more paths", param="beir_dir")
    found: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if not path.is_dir():
            raise NotFound(f"BEIR directory {path} does not exist")
        inner = [path] if _is_beir(path) else sorted(p for p in path.iterdir() if _is_beir(p))
        if not inner:
            raise BadInput(
                f"{path} is not a BEIR directory and holds none",
                fix="give folders holding corpus.jsonl, queries.jsonl and qrels",
                param="beir_dir",
            )
        found.extend(inner)
    resolved = [p.resolve() for p in found]
    twice = next((p for i, p in enumerate(resolved) if p in resolved[:i]), None)
    if twice is not None:
        raise BadInput(f"{twice} is named twice", fix="name each collection once",
                       param="beir_dir")  # fmt: skip
    return found


def _says_ignore_identical_ids(path: Path) -> bool:
    """Whether the folder's ``dataset.json`` (the project's dev sets) asks for
    ``ignore_identical_ids`` (its symmetric sets: each query is a passage of the corpus)."""
    try:
        info = json.loads((path / "dataset.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("ignore_identical_ids") is True


def run_retrieval_suite(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    modes: str | Sequence[str] = ("dense",),
    *,
    ignore_identical_ids: bool = False,
    **options: Unpack[RetrievalOptions],
) -> RetrievalSuiteReport:
    r""":func:`run_retrieval` over several BEIR directories, with the mean of each figure, as
    BEIR's and MTEB's tables give them.

    Args:
        paths: BEIR directories, or folders of them (see :func:`beir_dirs`).
        modes: as for :func:`run_retrieval`.
        ignore_identical_ids: for every collection; a collection whose ``dataset.json`` asks
            for it (the project's symmetric dev sets) gets it anyway.
        \**options: passed on to :func:`run_retrieval` (model, calibration, k, weight, passage
            sizes, ...); ``index_dir`` is refused (each collection has its own index).

    Returns:
        ``{"collections": [each run_retrieval result], "mean": {mode: {measure: mean}},
        "modes", "model", "pooling", "calibration", "weight", "seconds"}``.

    Raises:
        NotFound, BadInput: as :func:`beir_dirs` and :func:`run_retrieval`.
    """
    if options.get("index_dir") is not None:
        raise BadInput("index_dir names one index; a suite builds one per collection",
                       fix="omit it, or pass keep=True", param="index_dir")  # fmt: skip
    wanted = _modes(modes)
    _check_k(int(options.get("k", 100)))
    dirs = beir_dirs(paths)
    t0 = time.perf_counter()
    results: list[RetrievalReport] = []
    for path in dirs:
        ignore = ignore_identical_ids or _says_ignore_identical_ids(path)
        LOG.info("retrieval suite: %s (%d of %d)", path.name, len(results) + 1, len(dirs))
        results.append(run_retrieval(path, wanted, ignore_identical_ids=ignore, **options))
    mean = {
        mode: {m: sum(r["results"][mode][m] for r in results) / len(results) for m in MEASURES}
        for mode in wanted
    }
    first = results[0]
    return {
        "collections": results,
        "mean": mean,
        "modes": wanted,
        "model": first["model"],
        "pooling": first["pooling"],
        "calibration": first["calibration"],
        "weight": first["weight"],
        "seconds": {"total": time.perf_counter() - t0},
    }
