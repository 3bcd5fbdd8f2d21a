"""Build data/sample.parquet from data/sample.jsonl.

The sample corpus is 300 short hand-written passages (15 topics x ~20),
one JSON object per line with keys id, text, topic and source. This script
converts it to a zstd-compressed Parquet file with the columns
id, text, topic, source (all strings, in that order).

Usage:
    python data/build_sample.py
"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
SRC = HERE / "sample.jsonl"
DST = HERE / "sample.parquet"
COLUMNS = ["id", "text", "topic", "source"]


def main() -> None:
    rows = []
    with SRC.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
    schema = pa.schema([(name, pa.string()) for name in COLUMNS])
    table = pa.table({name: [r[name] for r in rows] for name in COLUMNS}, schema=schema)
    pq.write_table(table, DST, compression="zstd")
    print(f"wrote {table.num_rows} rows to {DST}")


if __name__ == "__main__":
    main()
