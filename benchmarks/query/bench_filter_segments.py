r"""The segment filter against a plain DuckDB table: what one table per segment costs a predicate.

The filter (``flowsearch.search.filters``) keeps one DuckDB table per segment, shared by the
versions that hold the segment, and answers a version through a UNION ALL view that numbers
rows globally; the first release loaded one DuckDB table per version (all its rows). Both
answer the same predicates over the same 200k rows here, interleaved query by query (their
order alternating), so the ratio compares like with like on a loaded machine. Ours is timed
warm (predicate checked before, rows not cached: DuckDB runs every time) and cold (the
syntax-tree check paid too); the peer runs the SQL directly (no check). Also: the memory each
holds, and how long a filter heavy in total takes to stop with a 1 s timeout.

Run from the repository root (about a minute on 2 cores)::

    python -m benchmarks run filter_segments [--rows 200000] [--repeats 40]
    python -m benchmarks run filter_segments --smoke   # figures untouched

It writes ``benchmarks/query/bench_filter_segments.{json,md}`` beside it;
``--render`` rewrites them from the saved JSON.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from benchmarks.common import harness
from flowsearch.search.filters import MetadataFilter, SegmentRef, VersionFilter

WORDS = ["tide", "moon", "sea", "heat", "pump", "bread", "yeast", "salt", "river", "stone"]
PREDICATES = {
    "1% (bucket = 7)": "bucket = 7",
    "10% (bucket < 10)": "bucket < 10",
    "50% (bucket < 50)": "bucket < 50",
    "two columns": "year >= 2020 AND lang = 'en'",
    "text LIKE": "text LIKE '%tide moon sea%'",
}


def corpus(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    texts = [" ".join(row) for row in words[rng.integers(0, len(words), (n, 50))]]
    return pa.table(
        {
            "id": [f"doc{i}" for i in range(n)],
            "text": texts,
            "bucket": rng.permutation(np.arange(n) % 100),
            "year": rng.integers(1990, 2026, n),
            "lang": np.array(["en", "de", "fr", "es"])[rng.integers(0, 4, n)],
        }
    )


def ours(
    table: pa.Table, segments: int, timeout: float | None = None
) -> tuple[MetadataFilter, VersionFilter]:
    db = MetadataFilter(timeout=timeout)
    size = -(-table.num_rows // segments)
    refs = []
    for i, start in enumerate(range(0, table.num_rows, size)):
        part = table.slice(start, size)
        refs.append(SegmentRef(f"s{i}", start, part.num_rows, lambda part=part: part))
    schema = [(field.name, field.type) for field in table.schema]
    return db, db.version(refs, schema)


def peer(table: pa.Table) -> Any:
    """The first release's shape: one native table per version, with __row."""
    con = duckdb.connect(":memory:", config={"threads": 1, "temp_directory": ""})
    rows = pa.array(np.arange(table.num_rows, dtype=np.int64))
    con.register("source", table.add_column(0, "__row", rows))
    con.execute("CREATE TABLE meta AS SELECT * FROM source")
    con.unregister("source")
    return con


def timed_ms(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def compare(table: pa.Table, segments: int, repeats: int) -> dict[str, Any]:
    db, flt = ours(table, segments)
    con = peer(table)
    cursor = con.cursor()
    out: dict[str, Any] = {}
    for name, where in PREDICATES.items():
        sql = f"SELECT __row FROM meta WHERE ({where})"
        expected = np.sort(cursor.execute(sql).fetchnumpy()["__row"])
        assert np.array_equal(flt.rows(where), expected), name  # same answer, and warm
        times: dict[str, list[float]] = {"ours": [], "ours_cold": [], "peer": []}
        for rep in range(repeats):

            def run_ours(where: str = where) -> None:
                flt._rows.clear()
                flt.rows(where)

            def run_cold(where: str = where) -> None:
                flt._rows.clear()
                flt._checked.clear()
                flt.rows(where)

            def run_peer(sql: str = sql) -> None:
                np.sort(cursor.execute(sql).fetchnumpy()["__row"])

            steps = [("ours", run_ours), ("ours_cold", run_cold), ("peer", run_peer)]
            for key, fn in steps if rep % 2 == 0 else steps[::-1]:
                times[key].append(timed_ms(fn))
        p50 = {key: float(np.median(values)) for key, values in times.items()}
        out[name] = {
            "rows": int(expected.size),
            **{f"{key}_p50_ms": value for key, value in p50.items()},
            "ratio": p50["ours"] / p50["peer"],
            "ratio_cold": p50["ours_cold"] / p50["peer"],
        }
    held = db._con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0]
    native = con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
    out["memory"] = {"ours_mb": (held or 0) / 2**20, "peer_mb": (native[0] or 0) / 2**20}
    flt.close()
    db.close()
    con.close()
    return out


def heavy_stop(table: pa.Table) -> dict[str, float]:
    """Seconds until a filter heavy in total is stopped by a 1 s timeout; and until a filter
    that would make values of any size is refused."""
    db, flt = ours(table, 1, timeout=1.0)
    flt.rows("bucket = 1")  # loaded
    concat = " || ".join(["text"] * 16)
    heavy = f"length({concat}) > 0 AND levenshtein(text, 'tide moon sea heat pump') > 0"
    out = {}
    for key, where in (("heavy_s", heavy), ("repeat_s", "length(repeat(text, 100000)) > 0")):
        start = time.perf_counter()
        with contextlib.suppress(ValueError):
            flt.rows(where)
        out[key] = time.perf_counter() - start
    flt.close()
    db.close()
    return out


def render(report: dict[str, Any]) -> str:
    load = report["load_average"]
    lines = [
        "## Segment filter against a native DuckDB table (`bench_filter_segments.py`)",
        "",
        f"{report['rows']:,} rows (id, text of ~300 characters, bucket, year, lang), DuckDB on "
        f"one thread, {report['repeats']} runs per predicate, ours and the peer interleaved with "
        "their order alternating; p50 ms. Ours: one DuckDB table per segment behind a UNION ALL "
        "view (warm: predicate checked before; cold: the syntax-tree check too). "
        "Peer: one native DuckDB table, the SQL run directly. "
        f"Load average {load[0]:.1f} / {load[1]:.1f} (1 / 5 min) at the end of the run. "
        f"Command: `{report['command']}`.",
        "",
        "| segments | predicate | rows | ours p50 ms | cold p50 ms | peer p50 ms | ours / peer "
        "| cold / peer |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for segments, result in report["by_segments"].items():
        for name in PREDICATES:
            r = result[name]
            lines.append(
                f"| {segments} | {name} | {r['rows']:,} | {r['ours_p50_ms']:.2f} | "
                f"{r['ours_cold_p50_ms']:.2f} | {r['peer_p50_ms']:.2f} | {r['ratio']:.2f}x | "
                f"{r['ratio_cold']:.2f}x |"
            )
    mem = report["by_segments"]["1"]["memory"]
    stop = report["stop"]
    lines += [
        "",
        f"Memory (DuckDB's own accounting, within its memory_limit): ours {mem['ours_mb']:.1f} MB "
        f"in one table per segment, the peer {mem['peer_mb']:.1f} MB in one table. A filter "
        "heavy in total (16-fold concat and levenshtein on every row) with "
        f"a 1 s timeout stopped after {stop['heavy_s']:.2f} s; `length(repeat(text, 100000)) "
        f"> 0` was refused after {stop['repeat_s'] * 1e3:.1f} ms without running (the first "
        "release ran it 18 s and grew the server by 2.3 GB).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = harness.arguments(
        __doc__, "2,000 rows, 3 repeats", "bench_filter_segments", data=False
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=40)
    args = harness.parse(parser, rows=2_000, repeats=3)
    if harness.rendered(args, render):
        return
    table = corpus(args.rows)
    report: dict[str, Any] = {
        "rows": args.rows,
        "repeats": args.repeats,
        "command": harness.command_line(),
        "by_segments": {str(s): compare(table, s, args.repeats) for s in (1, 10)},
        "stop": heavy_stop(table),
    }
    report["load_average"] = list(os.getloadavg())
    harness.finish(args, render, report)


if __name__ == "__main__":
    main()
