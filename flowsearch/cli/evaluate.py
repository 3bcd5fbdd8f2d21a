r"""``flowsearch eval``: STS (Spearman), QNLI (AUC) and BEIR-format retrieval (nDCG@10, ...).

Registered on :data:`flowsearch.cli.app`; it parses, calls :mod:`flowsearch.evaluation` and
prints the numbers it returns (``--json``: one JSON document on stdout).

Example:
    $ flowsearch eval sts --data ../shared/data --pooling static --calibration flow --json
    $ flowsearch eval retrieval path/to/scifact --mode all --json
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

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
        Path | None, typer.Argument(help="retrieval: a BEIR-format directory.", show_default=False)
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
    backend: Backend = "torch",
    quantize: Quantize = None,
    tasks: Annotated[
        str | None, typer.Option(help="sts only: comma list, e.g. STSB,SICKR (default all).")
    ] = None,
    mode: Annotated[
        str,
        typer.Option(help=f"retrieval: {choices((*MODES, 'all'))}.", metavar="MODE"),
    ] = "all",
    ignore_identical_ids: IgnoreIdenticalIds = False,
    keep: Keep = False,
    as_json: AsJson = False,
) -> None:
    """Evaluate an encoder + calibration: STS (Spearman), QNLI (AUC), retrieval (nDCG@10)."""
    options = dict(model=model, pooling=pooling, max_length=max_length, batch_size=batch_size)
    if backend != "torch" or quantize is not None:
        options.update(backend=backend, quantize=quantize)
    if task is Task.retrieval:
        if beir_dir is None:
            raise BadInput("eval retrieval needs a BEIR-format directory", "give its path")
        result = _retrieval(beir_dir, calibration or "auto", mode, keep, ignore_identical_ids,
                            options)  # fmt: skip
    else:
        if beir_dir is not None:
            raise BadInput(
                f"eval {task.value} takes no directory argument", "give the data folder with --data"
            )
        result = _pairs(task, data, calibration or "none", tasks, options)
    if as_json:
        print_json(result)
    else:
        _print_table(task, result, keep)


def _print_table(task: Task, result: dict[str, Any], keep: bool) -> None:
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
    if result.get("index_dir") and keep:
        table.caption = literal(f"index kept at {result['index_dir']}")
    stdout_console().print(table)
    if result.get("unreachable_judgements"):
        stdout_console().print(literal(
            f"note: {result['unreachable_judgements']:,} judgement(s) of the qrels name passages "
            "the corpus lacks; scored as unreachable, as BEIR and MTEB score them"
        ))  # fmt: skip


def _retrieval(
    beir_dir: Path,
    calibration: str,
    mode: str,
    keep: bool,
    ignore_identical_ids: bool,
    options: dict[str, Any],
) -> dict[str, Any]:
    from flowsearch import evaluation

    result: dict[str, Any] = evaluation.run_retrieval(
        beir_dir,
        modes=mode,
        calibration=calibration,
        keep=keep,
        ignore_identical_ids=ignore_identical_ids,
        **options,
    )
    return result


def _pairs(
    task: Task, data: Path | None, calibration: str, tasks: str | None, options: dict[str, Any]
) -> dict[str, Any]:
    """STS (Spearman) or QNLI (AUC) on the data folder."""
    from flowsearch import evaluation

    kwargs = {**options, "calibration": calibration, "data_dir": data}
    result: dict[str, Any]
    if task is Task.sts:
        names = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
        result = evaluation.run_sts(tasks=names, **kwargs)
    else:
        result = evaluation.run_qnli(**kwargs)
    return result
