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

from flowsearch.cli.app import AsJson, _literal, _print_json, _stdout_console, _user_errors, app
from flowsearch.errors import FlowsearchError

__all__ = ["Task"]


class Task(str, enum.Enum):
    """Evaluation tasks of ``flowsearch eval``."""

    sts = "sts"
    qnli = "qnli"
    retrieval = "retrieval"


@app.command("eval")
@_user_errors
def eval_cmd(
    task: Annotated[Task, typer.Argument(help="sts, qnli or retrieval.")],
    beir_dir: Annotated[
        Path | None, typer.Argument(help="retrieval: a BEIR-format directory.", show_default=False)
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="sts/qnli: data folder (default $FLOWSEARCH_DATA).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Encoder model id or directory.")] = None,
    pooling: Annotated[str, typer.Option(help="cls|mean|last2avg|first_last_avg|static")] = "mean",
    calibration: Annotated[
        str | None, typer.Option(help="none|auto|flow|whitening|... (sts/qnli: none)")
    ] = None,
    max_length: Annotated[int | None, typer.Option(help="Tokens per text.")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per encoder pass.")] = 64,
    backend: Annotated[str, typer.Option(help="Encoder runtime: torch|onnx.")] = "torch",
    quantize: Annotated[str | None, typer.Option(help="int8 (onnx backend only).")] = None,
    tasks: Annotated[
        str | None, typer.Option(help="sts only: comma list, e.g. STSB,SICKR (default all).")
    ] = None,
    mode: Annotated[str, typer.Option(help="retrieval: dense|lexical|hybrid|all.")] = "all",
    ignore_identical_ids: Annotated[
        bool, typer.Option(help="retrieval: drop a hit whose id is the query's.")
    ] = False,
    keep: Annotated[bool, typer.Option(help="retrieval: keep the index built.")] = False,
    as_json: AsJson = False,
) -> None:
    """Evaluate an encoder + calibration: STS (Spearman), QNLI (AUC), retrieval (nDCG@10)."""
    from flowsearch import evaluation

    encoder: dict[str, Any] = {}
    if backend != "torch" or quantize is not None:
        encoder = {"backend": backend, "quantize": quantize}
    if task is Task.retrieval:
        if beir_dir is None:
            raise FlowsearchError("eval retrieval needs a BEIR-format directory; give its path")
        result = evaluation.run_retrieval(
            beir_dir,
            modes=mode,
            model=model,
            pooling=pooling,
            calibration=calibration or "auto",
            keep=keep,
            batch_size=batch_size,
            ignore_identical_ids=ignore_identical_ids,
            max_length=max_length,
            **encoder,
        )
    else:
        if beir_dir is not None:
            raise FlowsearchError(f"eval {task.value} takes no directory argument; use --data")
        kwargs: dict[str, Any] = {
            "model": model,
            "pooling": pooling,
            "calibration": calibration or "none",
            "max_length": max_length,
            "data_dir": data,
            "batch_size": batch_size,
            **encoder,
        }
        if task is Task.sts:
            names = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
            result = evaluation.run_sts(tasks=names, **kwargs)
        else:
            result = evaluation.run_qnli(**kwargs)
    if as_json:
        _print_json(result)
        return
    from rich.table import Table

    table = Table(
        title=_literal(
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
            table.add_row(_literal(name), metric, shown)
    if "avg" in result:
        table.add_row("avg", "", f"{result['avg']:.4f}")
    if result.get("index_dir") and keep:
        table.caption = _literal(f"index kept at {result['index_dir']}")
    console = _stdout_console()
    console.print(table)
    if result.get("unreachable_judgements"):
        console.print(
            f"note: {result['unreachable_judgements']:,} judgement(s) of the qrels name passages "
            "the corpus lacks; scored as unreachable, as BEIR and MTEB score them",
            highlight=False,
        )
