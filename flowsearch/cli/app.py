r"""The ``flowsearch`` command: ``index``, ``add``, ``query``, ``info``, ``eval``.

Output discipline: results go to stdout (``--json``: exactly one JSON document and nothing else);
progress bars, logs and warnings go to stderr. Bad input prints ``error: <one line>`` on stderr
and exits with code 2, without a traceback; so do usage errors.

Example:
    $ flowsearch index data/sample.parquet --index idx
    $ flowsearch query "how does sourdough rise?" --index idx -k 5 --json
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from flowsearch.errors import FlowsearchError
from flowsearch.jsonable import to_json

__all__ = ["app", "main"]

LOG = logging.getLogger(__name__)

app = typer.Typer(
    name="flowsearch",
    help="Semantic search over a calibrated (BERT-flow) index.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])

IndexDir = Annotated[
    Path,
    typer.Option(
        "--index",
        envvar="FLOWSEARCH_INDEX",
        help="Index directory (default: $FLOWSEARCH_INDEX, else ./flowsearch_index).",
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
DEFAULT_INDEX = Path("flowsearch_index")


#: Library errors name keyword arguments (``overwrite=True``); the command line names its flags.
_FLAG_WORDS = re.compile(
    r"\b(overwrite|text_column|id_column|batch_size|fit_sample|calibration|calibrator|"
    r"index_factory|max_length|pooling|model|where|mode|k)(=(?:True|[^\s;,)]*))?(?=[\s;,)]|$)"
)


def _as_flags(message: str) -> str:
    """``pass overwrite=True`` -> ``pass --overwrite``; ``model=`` -> ``--model``."""

    def flag(match: re.Match[str]) -> str:
        if match.group(2) is None:
            return match.group(0)  # the bare word, not a keyword argument
        name = "--" + match.group(1).replace("_", "-")
        value = match.group(2)[1:]
        return name if value in ("True", "") else f"{name} {value}"

    return _FLAG_WORDS.sub(flag, message)


def _user_errors(func: F) -> F:
    """Turn FlowsearchError into ``error: ...`` on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FlowsearchError as exc:
            message = _as_flags(" ".join(str(exc).split()))
            typer.echo(f"error: {_visible(message)}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _print_json(doc: Any) -> None:
    sys.stdout.write(to_json(doc) + "\n")


def _stdout_console() -> Any:
    from rich.console import Console

    return Console(soft_wrap=False)


@app.callback()
def _setup(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
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


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(text: Any) -> str:
    """User-supplied text made safe for a terminal: control characters (ESC, ...) shown as
    escapes instead of acting; newlines and tabs as spaces. Print it as markup-free text."""
    text = str(text).replace("\n", " ").replace("\t", " ")
    return _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def _literal(text: Any) -> Any:
    """A rich ``Text`` that prints ``text`` literally (no markup, control characters visible)."""
    from rich.text import Text

    return Text(_visible(text))


def _print_summary(summary: dict[str, Any], verb: str) -> None:
    from rich.console import Console
    from rich.text import Text

    err = Console(stderr=True, highlight=False)
    secs = ", ".join(f"{k} {v:.1f}s" for k, v in summary["seconds"].items() if k != "total")
    rows = summary.get("added", summary["rows"])
    line = Text()
    line.append(verb, style="bold")
    line.append(
        f" {rows:,} rows -> {_visible(summary['index'])} "
        f"(version {summary['version']}, dim {summary['dim']}, {summary['space']} space via "
        f"{summary['calibration']}, {summary['factory']}, {summary['bytes'] / 2**20:.1f} MiB) in "
        f"{summary['seconds']['total']:.1f}s [{secs}]"
    )
    err.print(line)
    if summary.get("skipped"):
        err.print(f"skipped {summary['skipped']:,} rows with a null or blank text")
    from flowsearch.space.drift import DriftReport

    report = DriftReport.from_record(summary.get("drift"))
    if report is not None:
        err.print(Text(f"drift: {report.to_words()}", style="bold yellow" if report.warn else ""))


@app.command("index")
@_user_errors
def index_cmd(
    corpus: Annotated[str, typer.Argument(help="Parquet, JSON Lines or CSV: file, dir or glob.")],
    index: IndexDir = DEFAULT_INDEX,
    text_column: Annotated[str, typer.Option(help="Column with the passages.")] = "text",
    id_column: Annotated[str, typer.Option(help="Column with unique ids.")] = "id",
    model: Annotated[str | None, typer.Option(help="Encoder model id or directory.")] = None,
    pooling: Annotated[str, typer.Option(help="cls|mean|last2avg|first_last_avg|static")] = "mean",
    max_length: Annotated[int | None, typer.Option(help="Tokens per passage.")] = None,
    calibration: Annotated[str, typer.Option(help="auto|flow|whitening|sn|natsv|none")] = "auto",
    calibrator: Annotated[Path | None, typer.Option(help="Reuse a fitted calibrator.")] = None,
    index_factory: Annotated[str, typer.Option(help="auto or a faiss factory string.")] = "auto",
    batch_size: Annotated[int, typer.Option(help="Texts per encoder pass.")] = 64,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing index.")] = False,
    fit_sample: Annotated[int, typer.Option(help="Rows to fit the calibrator on.")] = 200_000,
    strict: Annotated[bool, typer.Option(help="Refuse null/blank texts.")] = False,
    lexical: Annotated[
        bool, typer.Option("--lexical/--no-lexical", help="Also build a BM25 index (hybrid).")
    ] = True,
    backend: Annotated[str, typer.Option(help="Encoder runtime: torch|onnx.")] = "torch",
    quantize: Annotated[str | None, typer.Option(help="int8 (onnx backend only).")] = None,
    engine: Annotated[str, typer.Option(help="local, or ray (extra `ray`).")] = "local",
    address: Annotated[
        str | None, typer.Option(help="ray: the cluster to join (default: a local one).")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Build an index from a corpus."""
    from flowsearch.writes.build import build_index

    summary = build_index(
        corpus,
        index,
        text_column=text_column,
        id_column=id_column,
        model=model,
        pooling=pooling,
        max_length=max_length,
        calibration=calibration,
        calibrator=calibrator,
        index_factory=index_factory,
        batch_size=batch_size,
        overwrite=overwrite,
        fit_sample=fit_sample,
        strict=strict,
        lexical=lexical,
        backend=backend,
        quantize=quantize,
        engine=engine,
        address=address,
    )
    if as_json:
        _print_json(summary)
    else:
        _print_summary(summary, "indexed")


ModelMoved = Annotated[
    str | None, typer.Option("--model", help="Where the index's model directory is now.")
]


@app.command("add")
@_user_errors
def add_cmd(
    corpus: Annotated[str, typer.Argument(help="Parquet, JSON Lines or CSV: file, dir or glob.")],
    index: IndexDir = DEFAULT_INDEX,
    text_column: Annotated[str | None, typer.Option(help="Default: the index's.")] = None,
    id_column: Annotated[str | None, typer.Option(help="Default: the index's.")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per encoder pass.")] = 64,
    strict: Annotated[bool, typer.Option(help="Refuse null/blank texts.")] = False,
    model: ModelMoved = None,
    as_json: AsJson = False,
) -> None:
    """Append a corpus to an index (same encoder and calibrator); reports drift."""
    from flowsearch.writes.upsert import add_to_index

    summary = add_to_index(
        corpus,
        index,
        text_column=text_column,
        id_column=id_column,
        batch_size=batch_size,
        strict=strict,
        model=model,
    )
    if as_json:
        _print_json(summary)
    else:
        _print_summary(summary, "added")


def _snippet(text: str, width: int = 90) -> str:
    text = " ".join(_visible(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _density_caption(report: Any) -> str | None:
    """The query table's caption: the verdict in percentiles of the corpus."""
    return str(report.to_words())


@app.command("query")
@_user_errors
def query_cmd(
    text: Annotated[str, typer.Argument(help="The query.")],
    index: IndexDir = DEFAULT_INDEX,
    k: Annotated[int, typer.Option("-k", "--k", help="Hits to return.")] = 10,
    where: Annotated[
        str | None, typer.Option(help='SQL filter over metadata, e.g. "year >= 2020".')
    ] = None,
    mode: Annotated[
        str | None, typer.Option(help="dense|lexical|hybrid (default: hybrid if available).")
    ] = None,
    model: ModelMoved = None,
    as_json: AsJson = False,
) -> None:
    """Search an index."""
    from flowsearch.search.searcher import Searcher

    searcher = Searcher.open(index, model=model)
    result = searcher.query(text, k=k, where=where, mode=mode)
    if as_json:
        _print_json(result.to_dict())
        return
    from rich.table import Table

    table = Table(title=_literal(f"{text!r}: {len(result.hits)} hits"), title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("score", justify="right")
    table.add_column("id", overflow="fold")
    table.add_column("text", overflow="ellipsis")
    for hit in result.hits:
        score = f"{hit.score:.4f}"
        if hit.dense_score is not None or hit.lexical_score is not None:
            parts = [
                f"{v:.2f}" if v is not None else "-" for v in (hit.dense_score, hit.lexical_score)
            ]
            score += f" ({'/'.join(parts)})"
        table.add_row(str(hit.rank), score, _literal(hit.id), _literal(_snippet(hit.text)))
    caption = _density_caption(result.density)
    if caption:
        table.caption = _literal(caption)
    _stdout_console().print(table)


@app.command("info")
@_user_errors
def info_cmd(
    index: IndexDir = DEFAULT_INDEX,
    verify: Annotated[bool, typer.Option(help="Check the sha256 of every file.")] = False,
    as_json: AsJson = False,
) -> None:
    """Show what an index holds: manifest, calibration decision, sizes, what was verified."""
    from flowsearch.search.version import index_info
    from flowsearch.space.reference import reference_of
    from flowsearch.space.reports import describe_space

    info = index_info(index, verify=verify)
    if as_json:
        _print_json(info.to_dict())
        return
    from rich.table import Table

    m = info.manifest
    enc, cal, reference = m.encoder, m.calibration, reference_of(m)
    checked = info.verified
    table = Table(show_header=False, title=_literal(info.path), title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("version", f"{m.version} (format {m.format_version}, flowsearch {m.flowsearch_version})"),
        (
            "rows",
            f"{m.live_rows:,} live ({m.deleted:,} deleted, {m.skipped:,} skipped) "
            f"in {len(m.shards)} shards",
        ),
        ("created / updated", f"{m.created} / {m.updated or '-'}"),
        ("model", f"{enc.model} (revision {enc.revision})"),
        ("pooling / max_length / dim", f"{enc.pooling} / {enc.max_length} / {enc.dim}"),
        ("searched space", describe_space(cal, enc.pooling)),
        ("judged against", reference.to_words() if reference else "nothing: no reference"),
        ("anisotropy", ", ".join(f"{k} {v:.3f}" for k, v in cal.anisotropy.items())),
        ("FAISS index", f"{m.faiss.factory} {m.faiss.params}".strip()),
        ("size", ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in info.bytes.items())),
        (
            "verified",
            f"{checked.files} files by size, {checked.hashed} by sha256"
            + (
                f"; {len(checked.not_hashed)} large ones not hashed (--verify)"
                if checked.not_hashed
                else ""
            ),
        ),  # fmt: skip
    ]
    for key, value in rows:
        table.add_row(key, _literal(value))
    _stdout_console().print(table)


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
