r"""``snapshot`` and ``restore``: a consistent copy of one index version; an index made from one.

Example:
    $ flowsearch snapshot backups/idx-monday.tar --index idx
    $ flowsearch restore backups/idx-monday.tar --index idx-restored
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flowsearch.cli.app import app, user_errors
from flowsearch.cli.options import DEFAULT_INDEX, AsJson, IndexDir
from flowsearch.cli.output import counted, print_json, stderr_console, visible

__all__: list[str] = []


@app.command("snapshot")
@user_errors
def snapshot_cmd(
    dest: Annotated[
        Path, typer.Argument(help="Where to write it (a new directory, or a file ending .tar).")
    ],
    index: IndexDir = DEFAULT_INDEX,
    as_json: AsJson = False,
) -> None:
    """Copy the index's current version, consistent while writes run (hard links where the
    file system allows); refuses a damaged index and an existing DEST."""
    from flowsearch.storage.snapshot import snapshot

    result = snapshot(index, dest)
    if as_json:
        print_json(result.to_dict())
        return
    linked = f", {result.n_linked} hard-linked" if result.n_linked else ""
    stderr_console().print(
        f"snapshot of {visible(result.source)} version {result.version} "
        f"({counted(result.n_live, 'live row')}; {counted(result.n_files, 'file')}{linked}, "
        f"{result.bytes / 2**20:.2f} MiB) -> {visible(result.path)}",
        markup=False,
        highlight=False,
    )


@app.command("restore")
@user_errors
def restore_cmd(
    snapshot_path: Annotated[
        Path, typer.Argument(metavar="SNAPSHOT", help="A directory or .tar `snapshot` wrote.")
    ],
    index: Annotated[
        Path, typer.Option("--index", help="The new index directory (must not exist).")
    ],
    as_json: AsJson = False,
) -> None:
    """Make a new, verified index from a snapshot (`info` names the snapshot it came from)."""
    from flowsearch.storage.snapshot import restore

    result = restore(snapshot_path, index)
    if as_json:
        print_json(result.to_dict())
        return
    stderr_console().print(
        f"restored {visible(result.path)} from {visible(result.snapshot)} (version "
        f"{result.source_version} of {visible(result.source)}; "
        f"{counted(result.n_live, 'live row')}, {result.verified.n_hashed} files verified by "
        f"sha256)",
        markup=False,
        highlight=False,
    )
