r"""The reading commands: ``query`` (hits and the query report) and ``info`` (what an index holds).

Example:
    $ flowsearch query "how does sourdough rise?" --index idx -k 5
    $ flowsearch info --index idx --verify --json
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from flowsearch.cli.app import app, user_errors
from flowsearch.cli.options import (
    DEFAULT_INDEX,
    MODES,
    AsJson,
    IndexDir,
    ModelMoved,
    RerankModel,
    choices,
    flag,
)
from flowsearch.cli.output import (
    counted,
    literal,
    print_json,
    report_caption,
    shown_id,
    snippet,
    stdout_console,
    visible,
)

if TYPE_CHECKING:
    from flowsearch.search.results import QueryResult
    from flowsearch.search.version import IndexInfo
    from flowsearch.storage.manifest import SegmentRecord, WriteRecord

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
    min_score: Annotated[
        float | None, typer.Option(help="Drop hits scoring below this (0-1).")
    ] = None,
    explain: Annotated[
        bool, flag("--explain", help="Also print the raw figures behind the report.")
    ] = False,
    model: ModelMoved = None,
    rerank: RerankModel = None,
    as_json: AsJson = False,
) -> None:
    """Search an index."""
    from flowsearch.search.modes import as_mode
    from flowsearch.search.searcher import Searcher

    searcher = Searcher.open(index, model=model, reranker=rerank)
    result = searcher.query(text, k=k, where=where, mode=as_mode(mode), min_score=min_score)
    if as_json:
        print_json(result.to_dict())
        return
    _print_hits(text, result)
    explained = result.report.to_explain() if explain and result.report is not None else ""
    if explained and explained != report_caption(result.report):  # the caption said it
        stdout_console().print(literal(explained))


#: The hit table's legend: what each figure means (README "Scores").
SCORE_LEGEND = (
    "score: 0-1, comparable across queries (0: no closer than an average passage, or no query "
    "term); dense: raw cosine; BM25: raw, grows with the query's terms"
)
#: The legend's line for a reranked table.
RERANK_LEGEND = "rerank: the cross-encoder's score, by which the hits are ordered"


def _print_hits(text: str, result: QueryResult) -> None:
    """The hit table, with the query report under it on a line of its own."""
    from rich.table import Table
    from rich.text import Text

    console = stdout_console()
    title = literal(f"{text!r}: {counted(len(result.hits), 'hit')}")
    caption = report_caption(result.report)
    if not result.hits:
        # an empty table is as narrow as its headers, and would fold the report into a column
        console.print(title)
        console.print(literal(caption))
        return
    table = Table(title=title, title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("score", justify="right")
    table.add_column("dense / BM25", justify="right")
    reranked = any(hit.rerank_score is not None for hit in result.hits)
    if reranked:
        table.add_column("rerank", justify="right")
    table.add_column("id", overflow="fold")
    table.add_column("text", overflow="ellipsis")
    for hit in result.hits:
        # a long document: where the passage that matched sits in it; the query's words shown
        h = hit.highlight
        where = f"[{h.start}:{h.end}] " if h is not None else ""
        shown = where + snippet(hit, 90 - len(where))
        parts = [f"{v:.2f}" if v is not None else "-" for v in (hit.dense_score, hit.lexical_score)]
        rerank = [f"{hit.rerank_score:.3f}" if hit.rerank_score is not None else "-"]
        table.add_row(
            str(hit.rank),
            f"{hit.score:.3f}",
            " / ".join(parts),
            *(rerank if reranked else []),
            literal(shown_id(hit.id)),
            literal(shown),
        )
    # each line its own literal: literal() shows a newline inside a text as an escape
    legend = (SCORE_LEGEND, RERANK_LEGEND if reranked else "", caption)
    table.caption = Text("\n").join(literal(line) for line in legend if line)
    console.print(table)


@app.command("info")
@user_errors
def info_cmd(
    index: IndexDir = DEFAULT_INDEX,
    verify: Annotated[
        bool, flag("--verify", help="Check every file's sha256 and the log.")
    ] = False,
    history: Annotated[bool, flag("--history", help="List the writes, oldest first.")] = False,
    as_json: AsJson = False,
) -> None:
    """Show what an index holds: what it searches, its schema, segments, sizes, checks."""
    from flowsearch.search.version import index_history, index_info

    if history:
        records = index_history(index)
        if as_json:
            print_json([r.model_dump(mode="json") for r in records])
            return
        for record in records:
            stdout_console().print(literal(_history_line(record)))
        return
    info = index_info(index, verify=verify)
    strays = info.verified.strays
    if strays:  # not damage: never read, removed by the next write
        more = f" and {len(strays) - 3} more" if len(strays) > 3 else ""
        typer.echo(
            visible(
                f"warning: {counted(len(strays), 'stray file')} in the index, not part of it "
                f"(ignored; the next write removes them): {', '.join(strays[:3])}{more}"
            ),
            err=True,
        )
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


def _history_line(record: WriteRecord) -> str:
    detail = ", ".join(f"{k} {v}" for k, v in record.detail.items() if k != "drift" and v)
    # a history record counts rows: passages (a document read whole is one passage)
    done = "deleted" if record.kind == "delete" else "written"
    rows = counted(record.n_rows, "passage")
    line = f"v{record.version} {record.time} {record.kind}: {rows} {done}"
    return f"{line} ({detail})" if detail else line


def _documents_line(info: IndexInfo) -> str:
    """Live documents, the live rows they make (passages) and how texts are cut."""
    m = info.manifest
    docs = info.n_documents if info.n_documents is not None else m.n_live
    cut = m.passages
    how = (
        f"longer than {cut.window} tokens cut into passages of {cut.tokens} tokens, "
        f"{cut.overlap} overlapping"
        if cut is not None
        else "not cut: only the first max_length tokens of a text are read"
    )
    return f"{docs:,} live in {counted(m.n_live, 'passage')} ({how})"


def _tuned_recall(segments: Sequence[SegmentRecord], requested: str = "auto") -> str:
    """What ``auto``'s tuning measured, per segment with an approximate index it tuned; a
    segment ``compact`` would re-tune (an older rule's tuning, or none recorded) says so."""
    from flowsearch.writes.compact import tuned_by_older_rule

    shown = []
    for s in segments:
        older = tuned_by_older_rule(s, requested)
        if s.ann.tuning is None and not older:
            continue
        words = s.ann.tuning.to_words() if s.ann.tuning is not None else "not measured"
        again = " (by an older rule: `flowsearch compact` re-tunes it)" if older else ""
        shown.append(f"{s.name} {s.ann.factory} {s.ann.params}: {words}{again}")
    if not shown:
        return "exact (Flat)" if all(s.ann.factory == "Flat" for s in segments) else "not measured"
    return "; ".join(shown)


def _graph_builds(segments: Sequence[SegmentRecord]) -> str | None:
    """How ``auto`` built the segments whose graph was built over principal components (None:
    no segment was)."""
    built = [(s, p) for s in segments if (p := s.ann.projection) is not None]
    if not built:
        return None
    return "; ".join(f"{s.name} {s.ann.factory}: {p.to_words()}" for s, p in built)


def _info_rows(info: IndexInfo) -> list[tuple[str, str]]:
    """``info``'s table: (what, value) pairs read from the manifest and the verification."""
    from flowsearch.space.reference import reference_of
    from flowsearch.space.reports import describe_space

    m = info.manifest
    enc, cal, checked = m.encoder, m.calibration, info.verified
    unhashed = (
        f"; {len(checked.not_hashed)} large ones not hashed (--verify)"
        if checked.not_hashed
        else ""
    )
    factories = sorted({s.ann.factory for s in m.segments})
    reference = reference_of(m)
    rows = [
        ("version", f"{m.version} (format {m.format_version}, flowsearch {m.flowsearch_version})"),
        ("rows", f"{m.n_live:,} live ({m.n_deleted:,} deleted, {m.skipped:,} skipped)"),
        ("documents", _documents_line(info)),
        (
            "segments",
            f"{len(m.segments)} ({', '.join(f'{s.n_live:,}' for s in m.segments)} "
            f"live rows; vector index {', '.join(factories)})",
        ),
        ("created / updated", f"{m.created} / {m.updated or '-'}"),
        *[
            ("restored from", f"{o.snapshot} (version {o.source_version} of {o.source})")
            for o in [m.restored_from]
            if o is not None
        ],  # fmt: skip
        ("model", f"{enc.model} (revision {enc.revision})"),
        ("pooling / max_length / dim", f"{enc.pooling} / {enc.max_length} / {enc.dim}"),
        ("searches", describe_space(cal, enc.pooling)),
        ("judged against", reference.to_words() if reference is not None else "nothing"),
        ("schema", ", ".join(f"{c.name} {c.type}" for c in m.schema_) or "(no metadata)"),
        ("size", ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in info.bytes.items())),
        ("vector index recall", _tuned_recall(m.segments, m.ann_requested)),
        *[("vector index build", b) for b in [_graph_builds(m.segments)] if b is not None],
        (
            "verified",
            f"{counted(checked.n_files, 'file')} by size, {checked.n_hashed} by sha256{unhashed}"
            + (
                f"; {counted(checked.history_records, 'history record')}"
                if checked.history_records is not None
                else ""
            ),
        ),
    ]
    return rows
