r"""The engine's commands: ``upsert``, ``delete``, ``compact``, ``recalibrate``, ``serve``.

Registered on :data:`flowsearch.cli.app`; like every command they parse, call the library and
print what it returns (``--json``: one JSON document on stdout).

Example:
    $ flowsearch upsert changed.jsonl --index idx
    $ flowsearch delete doc-17 doc-18 --index idx --json
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flowsearch.cli.app import (
    DEFAULT_INDEX,
    AsJson,
    IndexDir,
    _print_json,
    _print_summary,
    _user_errors,
    _visible,
    app,
)
from flowsearch.errors import FlowsearchError

__all__: list[str] = []


@app.command("upsert")
@_user_errors
def upsert_cmd(
    corpus: Annotated[str, typer.Argument(help="Parquet, JSON Lines or CSV: file, dir or glob.")],
    index: IndexDir = DEFAULT_INDEX,
    text_column: Annotated[str | None, typer.Option(help="Default: the index's.")] = None,
    id_column: Annotated[str | None, typer.Option(help="Default: the index's.")] = None,
    batch_size: Annotated[int, typer.Option(help="Texts per encoder pass.")] = 64,
    strict: Annotated[bool, typer.Option(help="Refuse null/blank texts.")] = False,
    model: Annotated[
        str | None, typer.Option("--model", help="Where the index's model directory is now.")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Insert new ids and replace existing ones (re-encoded under the frozen calibrator)."""
    from flowsearch.writes.upsert import upsert

    summary = upsert(
        index,
        corpus,
        text_column=text_column,
        id_column=id_column,
        batch_size=batch_size,
        strict=strict,
        model=model,
    )
    if as_json:
        _print_json(summary)
        return
    _print_summary({**summary, "added": summary["upserted"]}, "upserted")
    typer.echo(f"{summary['inserted']:,} inserted, {summary['replaced']:,} replaced", err=True)


@app.command("delete")
@_user_errors
def delete_cmd(
    ids: Annotated[list[str] | None, typer.Argument(help="Ids to delete.")] = None,
    ids_file: Annotated[
        Path | None, typer.Option("--ids-file", help="A file of ids, one per line.")
    ] = None,
    index: IndexDir = DEFAULT_INDEX,
    as_json: AsJson = False,
) -> None:
    """Delete rows by id (they are never returned again; compact reclaims the space)."""
    from flowsearch.writes.rewrite import delete

    wanted = list(ids or [])
    if ids_file is not None:
        try:
            lines = ids_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise FlowsearchError(f"cannot read --ids-file {ids_file} ({exc})") from None
        wanted += [line.strip() for line in lines if line.strip()]
    if not wanted:
        raise FlowsearchError("no ids to delete; give ids or --ids-file")
    result = delete(index, wanted)
    if as_json:
        _print_json(result.to_dict())
        return
    typer.echo(f"deleted {result.deleted:,} rows from {_visible(index)}", err=True)
    if result.missing:
        shown = ", ".join(_visible(m) for m in result.missing[:10])
        more = f" and {len(result.missing) - 10} more" if len(result.missing) > 10 else ""
        typer.echo(f"not found: {shown}{more}", err=True)


@app.command("compact")
@_user_errors
def compact_cmd(index: IndexDir = DEFAULT_INDEX, as_json: AsJson = False) -> None:
    """Rewrite the index without its deleted rows; reports the space freed."""
    from flowsearch.writes.rewrite import compact

    result = compact(index)
    if as_json:
        _print_json(result)
        return
    typer.echo(
        f"compacted {_visible(index)}: {result['rows']:,} rows, dropped {result['dropped']:,}, "
        f"freed {result['bytes_freed'] / 2**20:.2f} MiB (version {result['version']})",
        err=True,
    )


@app.command("recalibrate")
@_user_errors
def recalibrate_cmd(
    index: IndexDir = DEFAULT_INDEX,
    calibration: Annotated[str, typer.Option(help="auto|flow|whitening|sn|natsv|none")] = "auto",
    calibrator: Annotated[Path | None, typer.Option(help="Load a fitted calibrator.")] = None,
    fit_sample: Annotated[int, typer.Option(help="Rows to fit the calibrator on.")] = 200_000,
    as_json: AsJson = False,
) -> None:
    """Refit the calibrator on the stored raw vectors and rewrite the searched space."""
    from flowsearch.writes.rewrite import recalibrate

    result = recalibrate(index, calibration, calibrator, fit_sample)
    if as_json:
        _print_json(result)
        return
    typer.echo(
        f"recalibrated {_visible(index)} ({result['rows']:,} rows): {result['calibration']}, "
        f"{result['space']} space ({result['decision']}), version {result['version']}",
        err=True,
    )


@app.command("serve")
@_user_errors
def serve_cmd(
    index: IndexDir = DEFAULT_INDEX,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="FLOWSEARCH_API_KEY", help="Require this key on every request."),
    ] = None,
) -> None:
    """Serve the index over HTTP (FastAPI; extra `server`)."""
    try:
        from flowsearch.server import serve
    except ImportError as exc:
        raise FlowsearchError(
            f"the server needs its extra ({exc.name} is missing); pip install 'flowsearch[server]'"
        ) from None
    serve(index, host=host, port=port, api_key=api_key)
