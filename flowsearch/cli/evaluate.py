r"""``flowsearch eval``: STS (Spearman), QNLI (AUC) and BEIR-format retrieval (nDCG@10, ...).

Registered on :data:`flowsearch.cli.app`; it parses, calls :mod:`flowsearch.evaluation` and
prints the numbers it returns (``--json``: one JSON document on stdout).

Example:
    $ flowsearch eval sts --data ../shared/data --pooling static --calibration flow --json
    $ flowsearch eval retrieval path/to/scifact --mode all --json
    $ flowsearch eval retrieval ../shared/data/retrieval --passage-tokens 0   # every collection
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypedDict

import typer

from flowsearch.cli.app import app, user_errors
from flowsearch.cli.options import (
    BACKENDS,
    CALIBRATIONS,
    MODES,
    POOLINGS,
    QUANTIZATIONS,
    AsJson,
    choices,
    flag,
)
from flowsearch.cli.output import literal, print_json, stdout_console
from flowsearch.errors import BadInput

if TYPE_CHECKING:
    from flowsearch.evaluation.reports import (
        QnliReport,
        RetrievalReport,
        RetrievalSuiteReport,
        StsReport,
    )

__all__ = ["Task"]


class Task(str, enum.Enum):
    """Evaluation tasks of ``flowsearch eval``."""

    sts = "sts"
    qnli = "qnli"
    retrieval = "retrieval"


Backend = Annotated[
    str, typer.Option(help=f"Encoder runtime: {choices(BACKENDS)}.", metavar="NAME")
]
Quantize = Annotated[
    str | None, typer.Option(help=f"{choices(QUANTIZATIONS)} (onnx backend only).", metavar="NAME")
]
IgnoreIdenticalIds = Annotated[
    bool, flag("--ignore-identical-ids", help="retrieval: drop a hit whose id is the query's.")
]
Keep = Annotated[bool, flag("--keep", help="retrieval: keep the index built.")]


@app.command("eval")
@user_errors
def eval_cmd(
    task: Annotated[Task, typer.Argument(help="sts, qnli or retrieval.")],
    beir_dir: Annotated[
        list[Path] | None,
        typer.Argument(
            help="retrieval: BEIR-format directories, or folders of them (one table).",
            show_default=False,
            metavar="BEIR_DIR",
        ),
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="sts/qnli: data folder (default $FLOWSEARCH_DATA).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Encoder model id or directory.")] = None,
    pooling: Annotated[
        str, typer.Option(help=f"Pooling: {choices(POOLINGS)}.", metavar="NAME")
    ] = "mean",
    calibration: Annotated[
        str | None,
        typer.Option(
            help=f"retrieval: {choices(CALIBRATIONS)} (default auto); sts/qnli: an evaluation "
            "setting (default none; an unknown name lists them).",
            metavar="NAME",
        ),
    ] = None,
    max_length: Annotated[int | None, typer.Option(help="Tokens per text.")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per encoder pass.")] = 64,
    backend: Backend = "auto",
    quantize: Quantize = None,
    tasks: Annotated[
        str | None, typer.Option(help="sts only: comma list, e.g. STSB,SICKR (default all).")
    ] = None,
    mode: Annotated[
        str,
        typer.Option(help=f"retrieval: {choices((*MODES, 'all'))}.", metavar="MODE"),
    ] = "all",
    ignore_identical_ids: IgnoreIdenticalIds = False,
    passage_tokens: Annotated[
        int | None,
        typer.Option(help="retrieval: as `index` (0: documents not cut).", metavar="N"),
    ] = None,
    passage_overlap: Annotated[
        int | None, typer.Option(help="retrieval: as `index`.", metavar="N")
    ] = None,
    weight: Annotated[
        float | None,
        typer.Option(
            help="retrieval: the hybrid's dense weight in [0, 1] (default: the Searcher's).",
            metavar="W",
        ),
    ] = None,
    keep: Keep = False,
    as_json: AsJson = False,
) -> None:
    """Evaluate an encoder + calibration: STS (Spearman), QNLI (AUC), retrieval (nDCG@10)."""
    result: StsReport | QnliReport | RetrievalReport | RetrievalSuiteReport
    if task is Task.retrieval:
        if not beir_dir:
            raise BadInput("eval retrieval needs a BEIR-format directory", "give its path")
        retrieval = _Retrieval(calibration=calibration or "auto", keep=keep, weight=weight,
                               ignore_identical_ids=ignore_identical_ids, model=model,
                               pooling=pooling, max_length=max_length, batch_size=batch_size,
                               backend=backend, quantize=quantize)  # fmt: skip
        if passage_tokens is not None:
            retrieval["passage_tokens"] = passage_tokens
        if passage_overlap is not None:
            retrieval["passage_overlap"] = passage_overlap
        result = _retrieval(beir_dir, mode, retrieval)
    else:
        if beir_dir:
            raise BadInput(
                f"eval {task.value} takes no directory argument", "give the data folder with --data"
            )
        options = _Encoding(model=model, pooling=pooling, max_length=max_length,
                            batch_size=batch_size, backend=backend, quantize=quantize)  # fmt: skip
        result = _pairs(task, data, calibration or "none", tasks, options)
    if as_json:
        print_json(result)
    elif "collections" in result:
        _print_suite(result, keep)
    else:
        _print_table(task, result, keep)


def _print_table(task: Task, result: StsReport | QnliReport | RetrievalReport, keep: bool) -> None:
    """The evaluation's figures as a table (task, metric, value) on stdout."""
    from rich.table import Table

    table = Table(
        title=literal(
            f"{task.value}: {result['model']} / {result['pooling']} / {result['calibration']}"
        ),
        title_justify="left",
    )
    table.add_column("task")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, metrics in result["results"].items():
        for metric, value in metrics.items():
            shown = f"{value:.4f}" if isinstance(value, float) else str(value)
            table.add_row(literal(name), metric, shown)
    if "avg" in result:
        table.add_row("avg", "", f"{result['avg']:.4f}")
    if "index_dir" in result and result["index_dir"] and keep:
        table.caption = literal(f"index kept at {result['index_dir']}")
    stdout_console().print(table)
    if "unreachable_judgements" in result and result["unreachable_judgements"]:
        stdout_console().print(literal(
            f"note: {result['unreachable_judgements']:,} judgement(s) of the qrels name passages "
            "the corpus lacks; scored as unreachable, as BEIR and MTEB score them"
        ))  # fmt: skip


def _print_suite(result: RetrievalSuiteReport, keep: bool) -> None:
    """Several collections as one table, as BEIR and MTEB report them: nDCG@10, recall@100
    and MRR@10 of each collection and mode, then their mean over the collections."""
    from rich.table import Table

    from flowsearch.evaluation.retrieval import MEASURES

    table = Table(
        title=literal(f"retrieval: {result['model']} / {result['pooling']} / "
                      f"{result['calibration']}"),
        title_justify="left",
    )  # fmt: skip
    table.add_column("collection")
    table.add_column("mode")
    for m in MEASURES:
        table.add_column(m, justify="right")
    named = [(run["dataset"], run["results"]) for run in result["collections"]]
    for name, figures in [*named, ("mean", result["mean"])]:
        for mode in result["modes"]:
            table.add_row(literal(name) if mode == result["modes"][0] else "", mode,
                          *(f"{figures[mode][m]:.4f}" for m in MEASURES))  # fmt: skip
    kept = [path for run in result["collections"] if (path := run["index_dir"])]
    if keep and kept:
        table.caption = literal("indexes kept at " + ", ".join(kept))
    stdout_console().print(table)
    unreachable = sum(run.get("unreachable_judgements", 0) for run in result["collections"])
    if unreachable:
        stdout_console().print(literal(
            f"note: {unreachable:,} judgement(s) of the qrels name passages the corpora lack; "
            "scored as unreachable, as BEIR and MTEB score them"
        ))  # fmt: skip


class _Encoding(TypedDict):
    """The encoder options every task takes."""

    model: str | None
    pooling: str
    max_length: int | None
    batch_size: int
    backend: str
    quantize: str | None


class _Retrieval(_Encoding, total=False):
    """What ``eval retrieval`` passes to :func:`~flowsearch.evaluation.run_retrieval` (or
    :func:`~flowsearch.evaluation.run_retrieval_suite`)."""

    calibration: str
    keep: bool
    weight: float | None
    ignore_identical_ids: bool
    passage_tokens: int
    passage_overlap: int


class _Pairs(_Encoding):
    """What ``eval sts`` / ``eval qnli`` pass to :func:`~flowsearch.evaluation.run_sts` /
    :func:`~flowsearch.evaluation.run_qnli`."""

    calibration: str
    data_dir: Path | None


def _retrieval(
    beir_dir: list[Path], mode: str, options: _Retrieval
) -> RetrievalReport | RetrievalSuiteReport:
    """One BEIR directory: :func:`~flowsearch.evaluation.run_retrieval`'s result; several (or
    a folder of them): :func:`~flowsearch.evaluation.run_retrieval_suite`'s."""
    from flowsearch import evaluation
    from flowsearch.evaluation.retrieval import beir_dirs

    dirs = beir_dirs(beir_dir)
    result: RetrievalReport | RetrievalSuiteReport
    if len(beir_dir) == 1 and dirs == [beir_dir[0].expanduser()]:
        result = evaluation.run_retrieval(dirs[0], modes=mode, **options)
    else:
        result = evaluation.run_retrieval_suite(dirs, modes=mode, **options)
    return result


def _pairs(
    task: Task, data: Path | None, calibration: str, tasks: str | None, options: _Encoding
) -> StsReport | QnliReport:
    """STS (Spearman) or QNLI (AUC) on the data folder."""
    from flowsearch import evaluation

    kwargs = _Pairs(calibration=calibration, data_dir=data, **options)
    result: StsReport | QnliReport
    if task is Task.sts:
        names = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
        result = evaluation.run_sts(tasks=names, **kwargs)
    else:
        result = evaluation.run_qnli(**kwargs)
    return result
