r"""``flowsearch export``: the live documents of an index as one Parquet file.

Example:
    $ flowsearch export docs.parquet --index idx
    $ flowsearch export docs.parquet --index idx --vectors --overwrite --json
"""

from __future__ import annotations

from typing import Annotated

import typer

from flowsearch.cli.app import app, user_errors
from flowsearch.cli.options import DEFAULT_INDEX, AsJson, IndexDir, flag
from flowsearch.cli.output import counted, literal, print_json, stderr_console

__all__ = ["export_cmd"]


@app.command("export")
@user_errors
def export_cmd(
    dest: Annotated[str, typer.Argument(help="The file to write: DEST.parquet.")],
    index: IndexDir = DEFAULT_INDEX,
    vectors: Annotated[
        bool, flag("--vectors", help="Also write each passage's raw encoder vector (raw).")
    ] = False,
    overwrite: Annotated[bool, flag("--overwrite", help="Replace an existing DEST.")] = False,
    as_json: AsJson = False,
) -> None:
    """Write the index's live documents (id, text, metadata) to a Parquet file."""
    from flowsearch.writes.export import export_index

    result = export_index(index, dest, vectors=vectors, overwrite=overwrite)
    if as_json:
        print_json(result.to_dict())
        return
    stderr_console().print(
        literal(
            f"exported {counted(result.n_documents, 'document')} of version "
            f"{result.version} to {result.path}"
        )  # fmt: skip
    )
