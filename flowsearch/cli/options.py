r"""The options the commands share, and every choice list the help prints, each from its owner.

A choice list is read from the module that owns the concept (calibration names from the
calibration registry, poolings and backends from :mod:`flowsearch.encode.encoder`, modes from the
Searcher, engines from the build), so ``--help`` lists exactly what the library accepts. Choices
are printed as comma-separated words, which the help's column wraps instead of cutting.

Example:
    >>> "auto" in CALIBRATIONS and "whitening" in CALIBRATIONS
    True
    >>> choices(("dense", "lexical"))
    'dense, lexical'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, TypedDict

import typer

from flowsearch.calibration import names as calibrator_names
from flowsearch.encode.encoder import BACKENDS, POOLINGS, QUANTIZATIONS
from flowsearch.search.modes import MODES
from flowsearch.writes import ENGINES

__all__ = [
    "BACKENDS",
    "CALIBRATIONS",
    "DEFAULT_INDEX",
    "ENGINES",
    "MODES",
    "POOLINGS",
    "QUANTIZATIONS",
    "AsJson",
    "BatchSize",
    "Calibration",
    "CalibratorDir",
    "FitSample",
    "IdColumnOr",
    "IndexDir",
    "ModelMoved",
    "RerankModel",
    "Strict",
    "TextColumnOr",
    "Wait",
    "choices",
    "flag",
    "wait_kwargs",
]

#: What ``--calibration`` accepts: ``auto`` and every registered calibrator (``none`` included).
CALIBRATIONS: tuple[str, ...] = ("auto", *calibrator_names())
#: ``--index`` without a value and without ``$FLOWSEARCH_INDEX``.
DEFAULT_INDEX = Path("flowsearch_index")


def choices(values: Sequence[str]) -> str:
    """Choices as the help prints them: words and commas, so a narrow terminal wraps them."""
    return ", ".join(values)


def flag(*names: str, help: str) -> typer.models.OptionInfo:
    """A boolean ``--x/--no-x`` flag whose help shows no value type (it takes none)."""
    option: typer.models.OptionInfo = typer.Option(*names, help=help, metavar="")
    return option


IndexDir = Annotated[
    Path,
    typer.Option(
        "--index",
        envvar="FLOWSEARCH_INDEX",
        help="Index directory (default: $FLOWSEARCH_INDEX, else ./flowsearch_index).",
        show_default=False,
    ),
]
AsJson = Annotated[bool, flag("--json", help="Print one JSON document on stdout.")]
Strict = Annotated[bool, flag("--strict", help="Refuse null or blank texts.")]
BatchSize = Annotated[int, typer.Option(help="Texts per encoder pass.")]
FitSample = Annotated[int, typer.Option(help="Rows to fit the calibrator on.")]
TextColumnOr = Annotated[
    str | None, typer.Option(help="Column with the passages (default: the index's).")
]
IdColumnOr = Annotated[
    str | None, typer.Option(help="Column with unique ids (default: the index's).")
]
ModelMoved = Annotated[
    str | None, typer.Option("--model", help="Where the index's model directory is now.")
]
RerankModel = Annotated[
    str | None,
    typer.Option(
        "--rerank",
        help="Rerank the top hits with this cross-encoder (a sentence-transformers "
        "CrossEncoder id or directory).",
        metavar="MODEL",
        show_default=False,
    ),
]
Calibration = Annotated[
    str,
    typer.Option(help=f"Calibration: {choices(CALIBRATIONS)}.", metavar="NAME"),
]
CalibratorDir = Annotated[
    Path | None, typer.Option(help="A fitted calibrator's directory, used instead of fitting.")
]
Wait = Annotated[
    float | None,
    typer.Option(
        "--wait",
        min=0,
        metavar="SECONDS",
        help="Wait up to this long for another writer to finish (default: fail at once).",
        show_default=False,
    ),
]


class WaitKwargs(TypedDict, total=False):
    """A library write's ``wait=`` keyword, present only when ``--wait`` was given."""

    wait: float


def wait_kwargs(wait: float | None) -> WaitKwargs:
    """``{"wait": seconds}`` for a library write when ``--wait`` was given, else nothing."""
    return {} if wait is None else {"wait": float(wait)}
