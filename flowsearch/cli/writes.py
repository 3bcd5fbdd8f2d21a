r"""The writing commands: ``index``, ``add``, ``upsert``, ``delete``, ``compact``, ``recalibrate``.

Each calls one library write and prints its summary (stderr) or, with ``--json``, the summary as
one JSON document (stdout). ``--wait SECONDS`` waits that long for another process's write to
finish instead of failing at once (the library's ``wait=``).

Example:
    $ flowsearch upsert changed.jsonl --index idx --wait 30
    $ flowsearch delete doc-17 doc-18 --index idx --json
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flowsearch.cli.app import app, user_errors
from flowsearch.cli.options import (
    BACKENDS,
    DEFAULT_INDEX,
    ENGINES,
    POOLINGS,
    QUANTIZATIONS,
    AsJson,
    BatchSize,
    Calibration,
    CalibratorDir,
    FitSample,
    IdColumnOr,
    IndexDir,
    ModelMoved,
    Strict,
    TextColumnOr,
    Wait,
    choices,
    flag,
    wait_kwargs,
)
from flowsearch.cli.output import (
    counted,
    literal,
    print_json,
    print_summary,
    shown_id,
    stderr_console,
    visible,
)
from flowsearch.errors import BadInput

if TYPE_CHECKING:
    from flowsearch.writes.results import WriteResult

__all__: list[str] = []

Corpus = Annotated[str, typer.Argument(help="Parquet, JSON Lines or CSV: a file, dir or glob.")]


@app.command("index")
@user_errors
def index_cmd(
    corpus: Corpus,
    index: IndexDir = DEFAULT_INDEX,
    text_column: Annotated[str, typer.Option(help="Column with the texts.")] = "text",
    id_column: Annotated[str, typer.Option(help="Column with unique ids.")] = "id",
    model: Annotated[str | None, typer.Option(help="Encoder model id or directory.")] = None,
    pooling: Annotated[
        str, typer.Option(help=f"Pooling: {choices(POOLINGS)}.", metavar="NAME")
    ] = "mean",
    max_length: Annotated[
        int | None, typer.Option(help="Tokens the encoder reads of a text (its window).")
    ] = None,
    passage_tokens: Annotated[
        int | None,
        typer.Option(
            help="Texts longer than the window are cut into passages of at most N tokens "
            "(default: 128, at most the window; 0: not cut, only the first tokens read).",
            metavar="N",
        ),
    ] = None,
    passage_overlap: Annotated[
        int | None,
        typer.Option(help="Tokens a passage shares with the previous one.", metavar="N"),
    ] = None,
    calibration: Calibration = "auto",
    calibrator: CalibratorDir = None,
    index_factory: Annotated[str, typer.Option(help="auto, or a FAISS factory string.")] = "auto",
    batch_size: BatchSize = 64,
    overwrite: Annotated[bool, flag("--overwrite", help="Replace an existing index.")] = False,
    fit_sample: FitSample = 200_000,
    strict: Strict = False,
    lexical: Annotated[
        bool, flag("--lexical/--no-lexical", help="Also build a BM25 index (hybrid search).")
    ] = True,
    backend: Annotated[
        str,
        typer.Option(
            help=f"Encoder runtime: {choices(BACKENDS)} (auto: ONNX Runtime fp32 on the CPU, "
            "torch on CUDA).",
            metavar="NAME",
        ),
    ] = "auto",
    quantize: Annotated[
        str | None,
        typer.Option(help=f"{choices(QUANTIZATIONS)} (onnx backend only).", metavar="NAME"),
    ] = None,
    engine: Annotated[
        str, typer.Option(help=f"Engine: {choices(ENGINES)} (ray: extra `ray`).", metavar="NAME")
    ] = "local",
    address: Annotated[
        str | None, typer.Option(help="ray: the cluster to join (default: a local one).")
    ] = None,
    wait: Wait = None,
    as_json: AsJson = False,
) -> None:
    """Build an index from a corpus."""
    from flowsearch.ingest.corpus import CorpusOptions
    from flowsearch.writes.build import BuildRequest, EncoderOptions, build

    request = BuildRequest(
        corpus=CorpusOptions(text_column, id_column, strict),
        encoder=EncoderOptions(model, pooling, max_length, backend, quantize),
        calibration=calibration, calibrator=calibrator, index_factory=index_factory,
        batch_size=batch_size, overwrite=overwrite, fit_sample=fit_sample, lexical=lexical,
        engine=engine, address=address, wait=_seconds(wait),
        passage_tokens=passage_tokens, passage_overlap=passage_overlap,
    )  # fmt: skip
    _done(build(corpus, index, request), "indexed", as_json)


def _seconds(wait: float | None) -> float | None:
    """``--wait`` as the library's ``wait=`` (None: refuse at once)."""
    return None if wait is None else float(wait)


def _done(result: WriteResult, verb: str, as_json: bool) -> None:
    if as_json:
        print_json(result.to_dict())
    else:
        print_summary(result, verb)


@app.command("add")
@user_errors
def add_cmd(
    corpus: Corpus,
    index: IndexDir = DEFAULT_INDEX,
    text_column: TextColumnOr = None,
    id_column: IdColumnOr = None,
    batch_size: BatchSize = 64,
    strict: Strict = False,
    model: ModelMoved = None,
    wait: Wait = None,
    as_json: AsJson = False,
) -> None:
    """Append a corpus to an index (same encoder and calibrator); reports drift."""
    from flowsearch.writes.upsert import WriteRequest, write

    request = WriteRequest("add", text_column, id_column, batch_size, strict, model,
                           wait=_seconds(wait))  # fmt: skip
    _done(write(index, corpus, request), "added", as_json)


@app.command("upsert")
@user_errors
def upsert_cmd(
    corpus: Corpus,
    index: IndexDir = DEFAULT_INDEX,
    text_column: TextColumnOr = None,
    id_column: IdColumnOr = None,
    batch_size: BatchSize = 64,
    strict: Strict = False,
    model: ModelMoved = None,
    wait: Wait = None,
    as_json: AsJson = False,
) -> None:
    """Insert new ids and replace existing ones (re-encoded under the frozen calibrator)."""
    from flowsearch.writes.upsert import WriteRequest, write

    request = WriteRequest("upsert", text_column, id_column, batch_size, strict, model,
                           wait=_seconds(wait))  # fmt: skip
    summary = write(index, corpus, request)
    if as_json:
        print_json(summary.to_dict())
        return
    print_summary(summary, "upserted")
    typer.echo(f"{summary.n_inserted:,} inserted, {summary.n_replaced:,} replaced", err=True)


#: The most an ``--ids-file`` (or ``--tune-queries`` file) may hold (read no further:
#: ``/dev/zero`` never ends).
MAX_IDS_FILE_BYTES = 64 << 20


def _read_lines(path: Path, what: str, param: str, split: str) -> list[str]:
    """The non-blank lines of the UTF-8 file ``path`` (``what`` it is, for the message), at
    most :data:`MAX_IDS_FILE_BYTES` of it (``split``: what to do with a larger one)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_IDS_FILE_BYTES + 1)
        lines = data.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read the {what} {path} ({exc})", param=param) from None
    if len(data) > MAX_IDS_FILE_BYTES:
        raise BadInput(f"the {what} {path} holds more than {MAX_IDS_FILE_BYTES >> 20} MiB",
                       split, param=param)  # fmt: skip
    return [line.strip() for line in lines if line.strip()]


def _read_ids(ids: list[str] | None, ids_file: Path | None) -> list[str]:
    wanted = list(ids or [])
    if ids_file is not None:
        split = "split it and delete in several runs"
        wanted += _read_lines(ids_file, "ids file", "ids_file", split)
    if not wanted:
        raise BadInput("no ids to delete", "give ids, or --ids-file with one id per line")
    return wanted


@app.command("delete")
@user_errors
def delete_cmd(
    ids: Annotated[list[str] | None, typer.Argument(help="Ids to delete.")] = None,
    ids_file: Annotated[
        Path | None,
        typer.Option("--ids-file", help="A file of ids, one per line (at most 64 MiB)."),
    ] = None,
    index: IndexDir = DEFAULT_INDEX,
    wait: Wait = None,
    as_json: AsJson = False,
) -> None:
    """Delete rows by id (they are never returned again; compact reclaims the space)."""
    from flowsearch.writes.delete import delete

    result = delete(index, _read_ids(ids, ids_file), **wait_kwargs(wait))
    if as_json:
        print_json(result.to_dict())
        return
    typer.echo(f"deleted {counted(result.n_deleted, 'document')} from {visible(index)}", err=True)
    if result.missing:
        shown = ", ".join(visible(shown_id(m)) for m in result.missing[:10])
        more = f" and {len(result.missing) - 10} more" if len(result.missing) > 10 else ""
        typer.echo(f"not found: {shown}{more}", err=True)


@app.command("compact")
@user_errors
def compact_cmd(
    index: IndexDir = DEFAULT_INDEX,
    full: Annotated[bool, flag("--full", help="Merge everything into one segment.")] = False,
    tune_queries: Annotated[
        Path | None,
        typer.Option(
            "--tune-queries",
            help="A text file of your users' queries, one per line (at least 90): tune every "
            "auto vector index on them instead of on held-out rows.",
        ),
    ] = None,
    wait: Wait = None,
    as_json: AsJson = False,
) -> None:
    """Merge small segments and drop deleted rows; re-tune segments an older release tuned
    (their files kept), or every one on your queries; reports the space freed."""
    from flowsearch.writes.compact import compact

    queries = None
    if tune_queries is not None:
        queries = _read_lines(tune_queries, "queries file", "tune_queries",
                              "keep the most recent queries")  # fmt: skip
    before = _version(index)
    result = compact(index, full=full, tune_queries=queries, **wait_kwargs(wait))
    if as_json:
        print_json(result.to_dict())
        return
    summary = _compacted(index, result, result.version != before, queries is not None)
    stderr_console().print(literal(summary))


def _compacted(
    index: object, result: WriteResult, published: bool = True, on_queries: bool = False
) -> str:
    """``compact``'s summary: what it merged or rewrote, what it dropped, what it freed
    (``published``: whether it wrote a version; ``on_queries``: re-tuned on the user's)."""
    where = f"{index} (version {result.version}): {counted(result.n_live, 'live passage')} in "
    where += counted(result.n_segments, "segment")
    why = "on your queries" if on_queries else "an older rule had tuned"
    retuned = f"re-tuned {counted(result.n_retuned, 'segment')} {why}" if result.n_retuned else ""
    if not result.n_merged:
        upgraded = _key_ids_given(index, result.version) if published else 0
        given = f"gave {counted(upgraded, 'older segment')} key_ids.arrow" if upgraded else ""
        done = [x for x in (given, retuned) if x]  # the upgrades of older segments only
        return f"compacted {where}; {'; '.join(done)}" if done else f"nothing to compact in {where}"
    merged = (
        f"merged {result.n_merged} segments into one"
        if result.n_merged > 1
        else "rewrote 1 segment"
    )
    # n_written: the passages the history's line for this write counts
    merged += f" ({counted(result.n_written, 'passage')} written)"
    return (
        f"compacted {where}; {merged}, dropped {counted(result.n_dropped, 'deleted passage')}, "
        f"freed {result.bytes_freed / 2**20:.2f} MiB" + (f"; {retuned}" if retuned else "")
    )


def _version(index: object) -> int | None:
    """The index's current version (None: no index; the write says so in its own words)."""
    from flowsearch.errors import FlowsearchError
    from flowsearch.storage import manifest as mf

    try:
        return mf.read(Path(str(index))).version
    except FlowsearchError:
        return None


def _key_ids_given(index: object, version: int) -> int:
    """How many older segments the compaction that published ``version`` gave key_ids.arrow."""
    from flowsearch.storage import manifest as mf

    last = mf.read(Path(str(index))).last_write
    if last is None or last.version != version or last.kind != "compact":
        return 0
    given = last.detail.get("key_ids", 0)
    return int(given) if isinstance(given, (int, float, str)) else 0


@app.command("recalibrate")
@user_errors
def recalibrate_cmd(
    index: IndexDir = DEFAULT_INDEX,
    calibration: Calibration = "auto",
    calibrator: CalibratorDir = None,
    fit_sample: FitSample = 200_000,
    wait: Wait = None,
    as_json: AsJson = False,
) -> None:
    """Refit the calibrator on the stored raw vectors and rewrite the searched space."""
    from flowsearch.writes.compact import recalibrate

    result = recalibrate(
        index,
        calibration=calibration,
        calibrator=calibrator,
        fit_sample=fit_sample,
        **wait_kwargs(wait),
    )
    if as_json:
        print_json(result.to_dict())
        return
    stderr_console().print(
        literal(
            f"recalibrated {index} (version {result.version}, "
            f"{counted(result.n_live, 'live passage')}): {result.calibration}, searches the "
            f"{result.space} space ({result.decision})"
        )
    )
