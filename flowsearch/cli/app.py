r"""The ``flowsearch`` command group, its error mapping and its entry point (:func:`main`).

Output discipline: results go to stdout (``--json``: exactly one JSON document and nothing else);
progress bars, logs and warnings go to stderr. An error prints one line, ``error: <message>``, on
stderr and exits without a traceback: a :class:`~flowsearch.errors.FlowsearchError` with its
``exit_code`` and its message as the command line spells the fix (``--overwrite``, not
``overwrite=True``; :meth:`~flowsearch.errors.FlowsearchError.render`), a usage error with 2.

The commands live beside this module (``search``, ``writes``, ``serve``, ``evaluate``) and
register themselves on :data:`app`; ``flowsearch.cli`` imports them all.

Example:
    $ flowsearch index data/sample.parquet --index idx
    $ flowsearch query "how does sourdough rise?" --index idx -k 5 --json
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

from flowsearch.cli.options import flag
from flowsearch.cli.output import visible
from flowsearch.errors import FlowsearchError

__all__ = ["app", "main", "user_errors"]

app = typer.Typer(
    name="flowsearch",
    help="Semantic search over a calibrated (BERT-flow) index.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

P = ParamSpec("P")
R = TypeVar("R")


def user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Run a command: a FlowsearchError becomes ``error: ...`` on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except FlowsearchError as exc:
            typer.echo(f"error: {visible(exc.render('cli'))}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper


@app.callback()
def _setup(
    verbose: Annotated[bool, flag("--verbose", "-v", help="Log progress details.")] = False,
) -> None:
    """Semantic search over a calibrated (BERT-flow) index."""
    from rich.console import Console
    from rich.logging import RichHandler

    handler = RichHandler(console=Console(stderr=True), show_path=False, show_time=False)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[handler],
        force=True,
    )
    logging.getLogger("flowsearch").setLevel(logging.INFO if verbose else logging.WARNING)


def _click_errors() -> tuple[Any, Any]:
    """(ClickException, UsageError) of the click that typer runs on (recent typers vendor it)."""
    try:
        from typer._click.exceptions import ClickException, UsageError
    except ImportError:  # typer on the real click
        from click.exceptions import ClickException, UsageError  # type: ignore[assignment]
    return ClickException, UsageError


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (2 for bad input or usage)."""
    click_exception, usage_error = _click_errors()
    try:
        result = app(args=argv, standalone_mode=False)
    except usage_error as exc:
        if not exc.format_message().strip():  # bare `flowsearch`: help was printed
            return 2
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path if ctx else 'flowsearch'} --help`)"
        typer.echo(f"error: {' '.join(exc.format_message().split())}{hint}", err=True)
        return 2
    except click_exception as exc:
        typer.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        return int(getattr(exc, "exit_code", 1))
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("interrupted", err=True)
        return 130
    except typer.Exit as exc:
        return int(exc.exit_code)
    return int(result) if isinstance(result, int) else 0
