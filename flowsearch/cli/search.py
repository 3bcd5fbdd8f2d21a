r"""The reading commands: ``query`` (hits and the query report) and ``info`` (what an index holds).

Example:
    $ flowsearch query "how does sourdough rise?" --index idx -k 5
    $ flowsearch info --index idx --verify --json
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from flowsearch.cli.app import app, user_errors
from flowsearch.cli.options import (
    DEFAULT_INDEX,
    MODES,
    AsJson,
    IndexDir,
    ModelMoved,
    choices,
    flag,
)
from flowsearch.cli.output import (
    density_caption,
    literal,
    print_json,
    snippet,
    stdout_console,
)

__all__ = ["info_cmd", "query_cmd"]


@app.command("query")
@user_errors
def query_cmd(
    text: Annotated[str, typer.Argument(help="The query.")],
    index: IndexDir = DEFAULT_INDEX,
    k: Annotated[int, typer.Option("-k", "--k", help="Hits to return.")] = 10,
    where: Annotated[
        str | None, typer.Option(help="SQL filter over metadata, e.g. \"topic = 'cooking'\".")
    ] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help=f"Search mode: {choices(MODES)} (default: hybrid if the index has a lexical "
            "part, else dense).",
            metavar="MODE",
        ),
    ] = None,
    model: ModelMoved = None,
    as_json: AsJson = False,
) -> None:
    """Search an index."""
    from flowsearch.search.searcher import Searcher

    searcher = Searcher.open(index, model=model)
    result = searcher.query(text, k=k, where=where, mode=mode)
    if as_json:
        print_json(result.to_dict())
        return
    _print_hits(text, result)


def _print_hits(text: str, result: Any) -> None:
    """The hit table, with the query report under it on a line of its own."""
    from rich.table import Table

    console = stdout_console()
    title = literal(f"{text!r}: {len(result.hits)} hits")
    caption = density_caption(result.density)
    if not result.hits:
        # an empty table is as narrow as its headers, and would fold the report into a column
        console.print(title)
        console.print(literal(caption))
        return
    table = Table(title=title, title_justify="left")
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
        table.add_row(str(hit.rank), score, literal(hit.id), literal(snippet(hit.text)))
    table.caption = literal(caption)
    console.print(table)


@app.command("info")
@user_errors
def info_cmd(
    index: IndexDir = DEFAULT_INDEX,
    verify: Annotated[bool, flag("--verify", help="Check every file's sha256.")] = False,
    as_json: AsJson = False,
) -> None:
    """Show what an index holds: manifest, calibration decision, sizes, what was verified."""
    from flowsearch.search.version import index_info

    info = index_info(index, verify=verify)
    if as_json:
        print_json(info.to_dict())
        return
    from rich.table import Table

    table = Table(show_header=False, title=literal(info.path), title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in _info_rows(info):
        table.add_row(key, literal(value))
    stdout_console().print(table)


def _info_rows(info: Any) -> list[tuple[str, str]]:
    """``info``'s table: (what, value) pairs read from the manifest and the verification."""
    m = info.manifest
    enc, cal, density, checked = m.encoder, m.calibration, m.density, info.verified
    unhashed = (
        f"; {len(checked.not_hashed)} large ones not hashed (--verify)"
        if checked.not_hashed
        else ""
    )
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
        ("calibration", f"{cal.name}: {cal.calibrator} fitted on {cal.fitted_on}"),
        ("searched space", f"{cal.space} ({cal.decision})"),
        ("anisotropy", ", ".join(f"{k} {v:.3f}" for k, v in cal.anisotropy.items())),
        ("FAISS index", f"{m.faiss.factory} {m.faiss.params}".strip()),
        ("size", ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in info.bytes.items())),
        ("verified", f"{checked.files} files by size, {checked.hashed} by sha256{unhashed}"),
    ]
    if density:
        rows.append(
            ("corpus log-density", f"{density.mean_log_prob:.1f} ± {density.std_log_prob:.1f}")
        )
    return rows
