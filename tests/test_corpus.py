"""Corpus reading: every format, records in memory, upsert overlap, and one line for bad input."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from corpus_helpers import scan_corpus

from flowsearch.errors import FlowsearchError
from flowsearch.ingest import readers as readers
from flowsearch.ingest.corpus import CorpusPlan
from flowsearch.ingest.files import resolve_files

ROWS = [
    {"id": "a", "text": "the cat", "year": 2001},
    {"id": "b", "text": "the dog", "year": 2002},
    {"id": "c", "text": "  ", "year": 2003},
    {"id": "d", "text": "the bird", "year": None},
]


def _write(path: Path, rows: list[dict], fmt: str | None = None) -> Path:
    """``rows`` as a file of the format its name says (JSONL written by hand, line by line)."""
    fmt = fmt or readers.format_of(path)
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "jsonl":
        body = "".join(json.dumps(r) + "\n" for r in rows)
        if path.suffix == ".gz":
            with gzip.open(path, "wt", encoding="utf-8") as out:
                out.write(body)
        else:
            path.write_text(body, encoding="utf-8")
    else:
        delimiter = "\t" if fmt == "tsv" else ","
        options = pcsv.WriteOptions(delimiter=delimiter)
        pcsv.write_csv(pa.Table.from_pylist(rows), path, write_options=options)
    return path


def _rows(plan: CorpusPlan, batch_rows: int = 2) -> list[tuple]:
    out = []
    for ids, texts, meta in plan.batches(batch_rows):
        assert len(ids) == len(texts) == meta.num_rows <= batch_rows
        out += list(zip(ids.to_pylist(), texts, meta.column("year").to_pylist()))
    return out


EXPECTED = [("a", "the cat", 2001), ("b", "the dog", 2002), ("d", "the bird", None)]


@pytest.mark.parametrize(
    "name", ["c.parquet", "c.jsonl", "c.json", "c.ndjson", "c.jsonl.gz", "c.csv", "c.tsv"]
)
def test_every_format_yields_the_same_rows(tmp_path, name):
    plan = scan_corpus(_write(tmp_path / name, ROWS))
    assert (plan.n_rows_in, plan.n_rows, plan.n_skipped, plan.id_type) == (4, 3, 1, "string")
    assert plan.metadata_columns == ["year"] and pa.types.is_integer(plan.metadata_schema[0].type)
    assert _rows(plan) == EXPECTED


@pytest.mark.parametrize("kind", ["records", "table"])
def test_records_in_memory(kind):
    corpus = ROWS if kind == "records" else pa.Table.from_pylist(ROWS)
    plan = scan_corpus(corpus)
    assert plan.files == [] and _rows(plan) == EXPECTED


def test_directory_mixes_formats_in_sorted_path_order(tmp_path):
    (tmp_path / "b").mkdir()
    _write(tmp_path / "b" / "2.csv", ROWS[2:])
    _write(tmp_path / "a.jsonl", ROWS[:1])
    _write(tmp_path / "b" / "1.parquet", ROWS[1:2])
    (tmp_path / "notes.txt").write_text("not a corpus")
    (tmp_path / ".hidden.csv").write_text("id,text\nz,zzz\n")
    assert [p.name for p in resolve_files(tmp_path)] == ["a.jsonl", "1.parquet", "2.csv"]
    assert _rows(scan_corpus(tmp_path)) == EXPECTED
    assert _rows(scan_corpus(str(tmp_path / "**" / "*.*"))) == EXPECTED  # a glob


def test_auto_ids_continue_across_files_and_skipped_rows(tmp_path):
    rows = [{"text": r["text"], "year": r["year"]} for r in ROWS]
    _write(tmp_path / "1.csv", rows[:3])
    _write(tmp_path / "2.jsonl", rows[3:])
    plan = scan_corpus(tmp_path, auto_id_start=10)
    assert plan.id_column is None and [r[0] for r in _rows(plan)] == [10, 11, 13]


def test_metadata_types_unify_across_files(tmp_path):
    pq.write_table(pa.table({"id": [1], "text": ["x"], "score": pa.array([1], pa.int32())}),
                   tmp_path / "1.parquet")  # fmt: skip
    _write(tmp_path / "2.jsonl", [{"id": 2, "text": "y", "score": 2.5}])
    _write(tmp_path / "3.jsonl", [{"id": 3, "text": "z", "score": None}])
    plan = scan_corpus(tmp_path)
    assert plan.metadata_schema.field("score").type == pa.float64()
    metas = [m for _, _, m in plan.batches()]
    assert [m.column("score").to_pylist() for m in metas] == [[1.0], [2.5], [None]]


def test_float_ids_that_are_whole_become_integers(tmp_path):
    _write(tmp_path / "c.jsonl", [{"id": 1.0, "text": "x"}, {"id": 2, "text": "y"}])
    plan = scan_corpus(tmp_path / "c.jsonl")
    assert plan.id_type == "int" and next(plan.batches())[0].to_pylist() == [1, 2]


def test_valid_utf8_binary_is_text_and_control_characters_pass(tmp_path):
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": pa.array([b"caf\xc3\xa9", b"a\x01b"])}), path)
    assert next(scan_corpus(path).batches())[1] == ["café", "a\x01b"]
    csv = tmp_path / "c.csv"
    csv.write_bytes(b'id,text\n1,"tab\there\x1b[31m"\n')
    assert next(scan_corpus(csv).batches())[1] == ["tab\there\x1b[31m"]


def test_a_one_megabyte_text_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "FIRST_BLOCK", 1 << 16)  # the retry with larger blocks, cheaply
    big = "word " * 200_000
    for name in ("big.jsonl", "big.csv", "big.parquet"):
        path = _write(tmp_path / name, [{"id": 1, "text": "small"}, {"id": 2, "text": big}])
        texts = [t for _, batch, _ in scan_corpus(path).batches() for t in batch]
        assert texts[1] == big.strip() or texts[1] == big


def test_late_keys_and_late_types_grow_the_inference_block(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "FIRST_BLOCK", 1 << 12)
    rows = [{"id": i, "text": f"t{i}", "tag": None} for i in range(400)]
    rows[-1]["tag"] = "late"
    _write(tmp_path / "late.jsonl", rows)
    _write(tmp_path / "late.csv", [{**r, "tag": r["tag"] or ""} for r in rows])
    for name in ("late.jsonl", "late.csv"):
        plan = scan_corpus(tmp_path / name)
        tags = [t for _, _, m in plan.batches(1000) for t in m.column("tag").to_pylist()]
        assert tags[-1] == "late" and plan.n_rows == 400


def test_a_write_checks_the_schema_and_the_id_type(tmp_path):
    """Into an existing index, every record is checked against its schema and id type."""
    from flowsearch.storage.schema import columns_of

    path = _write(tmp_path / "c.jsonl", ROWS)
    schema = columns_of(pa.schema([("year", pa.int64())]))
    plan = scan_corpus(path, schema=schema, id_type="string")
    assert plan.metadata_schema == pa.schema([("year", pa.int64())]) and plan.n_rows == 3
    typed = [{"id": 1, "text": "a", "year": 1.0}, {"id": 2, "text": "b", "year": 2.0}]
    plan = scan_corpus(typed, schema=schema, id_type="string")  # ints into a string index
    assert plan.metadata_schema.field("year").type == pa.int64()
    ids = [i.to_pylist() for i, _, _ in plan.batches(10)]
    assert ids == [["1", "2"]]
    with pytest.raises(FlowsearchError, match="record 2: column 'year' expects int64, got double"):
        scan_corpus([{"id": 1, "text": "a", "year": 1.0}, {"id": 2, "text": "b", "year": 2.5}],
                    schema=schema, id_type="int")  # fmt: skip
    with pytest.raises(FlowsearchError, match="integer ids, this corpus has string ids"):
        scan_corpus(path, schema=schema, id_type="int")
    with pytest.raises(FlowsearchError, match="duplicate|more than once"):
        scan_corpus(ROWS + ROWS[:1])


# --- bad input: one line each, naming the file (column, row/line) and the fix ---------------


def _bad(tmp_path: Path) -> dict[str, tuple[object, dict, str]]:
    t = tmp_path
    _write(t / "ok.parquet", ROWS[:2])
    buf = (t / "ok.parquet").read_bytes()
    (t / "trunc.parquet").write_bytes(buf[: len(buf) // 2])
    (t / "rand.parquet").write_bytes(os.urandom(600))
    for ext in ("parquet", "jsonl", "csv"):
        (t / f"empty.{ext}").write_bytes(b"")
    (t / "badline.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": \n')
    (t / "array.json").write_text('[{"id": 1, "text": "a"}]\n')
    (t / "ctrl.jsonl").write_bytes(b'{"id": 1, "text": "a"}\n{"id": 2, "text": "a\x01b"}\n')
    (t / "utf8.jsonl").write_bytes(b'{"id": 1, "text": "ok"}\n{"id": 2, "text": "a\xff"}\n')
    (t / "utf8.csv").write_bytes(b"id,text\n1,ok\n2,a\xff\n")
    (t / "ragged.csv").write_text("id,text\n1,a\n2,b,c\n3,d\n")
    (t / "mixed.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": "x", "text": "b"}\n')
    (t / "numtext.csv").write_text("id,text\n1,3.0\n2,4\n")
    _write(t / "numtext.jsonl", [{"id": 1, "text": 3.5}])
    pq.write_table(pa.table({"id": [1], "text": [["a", "b"]]}), t / "list.parquet")
    pq.write_table(pa.table({"id": [1], "text": [{"a": "b"}]}), t / "struct.parquet")
    pq.write_table(pa.table({"id": [1, 2], "text": pa.array([b"ok", b"\xff\xfe"])}),
                   t / "binary.parquet")  # fmt: skip
    _write(t / "nulltext.jsonl", [{"id": 1, "text": None}, {"id": 2, "text": None}])
    _write(t / "nullid.csv", [{"id": "a", "text": "x"}, {"id": None, "text": "y"}])
    _write(t / "dup.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    _write(t / "floatid.jsonl", [{"id": 1.0, "text": "x"}, {"id": 1.5, "text": "y"}])
    pq.write_table(pa.table({"id": [1], "text": ["x"], "vector": [1.0]}), t / "reserved.parquet")
    (t / "none").mkdir()
    (t / "none" / "readme.md").write_text("hi")
    (t / "types").mkdir()
    _write(t / "types" / "1.jsonl", [{"id": 1, "text": "x", "year": 2001}])
    _write(t / "types" / "2.jsonl", [{"id": 2, "text": "y", "year": "MMII"}])
    (t / "idkinds").mkdir()
    _write(t / "idkinds" / "1.jsonl", [{"id": 1, "text": "x"}])
    _write(t / "idkinds" / "2.jsonl", [{"id": "b", "text": "y"}])
    (t / "cols").mkdir()
    _write(t / "cols" / "1.jsonl", [{"id": 1, "text": "x", "year": 1}])
    _write(t / "cols" / "2.jsonl", [{"id": 2, "text": "y"}])
    (t / "notes.txt").write_text("id,text\n1,a\n")
    (t / "header.csv").write_text("id,text\n")
    (t / "blank.jsonl").write_text("\n  \n")
    packed = gzip.compress("".join(f'{{"id": {i}, "text": "w"}}\n' for i in range(9000)).encode())
    (t / "cut.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    return {
        "missing file": (t / "nope.jsonl", {}, r"corpus not found: .*nope\.jsonl"),
        "empty parquet": (t / "empty.parquet", {}, r"empty\.parquet is empty \(0 bytes\)"),
        "empty jsonl": (t / "empty.jsonl", {}, r"empty\.jsonl is empty \(0 bytes\)"),
        "empty csv": (t / "empty.csv", {}, r"empty\.csv is empty \(0 bytes\)"),
        "corrupt parquet": (t / "rand.parquet", {}, r"rand\.parquet is not a Parquet file"),
        "truncated parquet": (t / "trunc.parquet", {}, r"trunc\.parquet is not a Parquet .*trunc"),
        "jsonl bad line": (t / "badline.jsonl", {}, r"badline\.jsonl: line 2 is not valid JSON"),
        "json array": (t / "array.json", {}, r"array\.json: line 1 is a JSON array.*jq"),
        "jsonl raw control": (t / "ctrl.jsonl", {}, r"ctrl\.jsonl: line 2 is not valid JSON"),
        "jsonl non-utf8": (t / "utf8.jsonl", {}, r"'text' in .*utf8\.jsonl .*UTF-8 \(row 2\)"),
        "csv non-utf8": (t / "utf8.csv", {}, r"'text' in .*utf8\.csv .*not valid UTF-8 \(row 2\)"),
        "csv ragged": (t / "ragged.csv", {}, r"ragged\.csv line 3 has 3 fields, the header has 2"),
        "jsonl mixed types": (t / "mixed.jsonl", {}, r"key 'id' is a string on line 2 but a"),
        "csv number text": (t / "numtext.csv", {}, r"'text' in .*numtext\.csv holds numbers"),
        "jsonl number text": (t / "numtext.jsonl", {}, r"holds numbers \(double\).*text_column="),
        "parquet number text": (t / "ok.parquet", {"text_column": "year"},
                                r"'year' in .*ok\.parquet holds numbers \(int64\)"),
        "list text": (t / "list.parquet", {}, r"'text' in .*list\.parquet holds lists"),
        "struct text": (t / "struct.parquet", {}, r"'text' in .*struct\.parquet holds objects"),
        "binary not utf8": (t / "binary.parquet", {}, r"'text' in .*binary\.parquet .* \(row 2\)"),
        "all-null texts": (t / "nulltext.jsonl", {}, "has no non-blank 'text' values"),
        "text column absent": (t / "ok.parquet", {"text_column": "body"},
                               r"no text column 'body' in .*ok\.parquet \(columns: id, text, "
                               r"year\); name the text column with text_column="),  # fmt: skip
        "id column absent": (t / "ok.parquet", {"id_column": "key"}, "no id column 'key'"),
        "null id": (t / "nullid.csv", {}, r"nullid\.csv have a null or empty id .*row 2"),
        "duplicate ids": (t / "dup.jsonl", {}, r"1 id\(s\) occur more than once .*'a'"),
        "fractional id": (t / "floatid.jsonl", {}, r"id 1\.5 .*\(row 2\) is not a whole number"),
        "no supported files": (t / "none", {}, r"no Parquet, JSON Lines or CSV files in dir"),
        "unknown format": (t / "notes.txt", {}, r"notes\.txt: unknown corpus format '\.txt'"),
        "reserved column": (t / "reserved.parquet", {}, r"'vector' clashes with the index's own"),
        "metadata types": (t / "types", {}, r"column 'year' is int64 in .*1\.jsonl but string"),
        "id kinds": (t / "idkinds", {}, r"ids in 'id' are integers in .*1\.jsonl but strings"),
        "missing metadata": (t / "cols", {}, r"2\.jsonl has no column 'year' that .*1\.jsonl"),
        "records keys": ([{"id": 1, "text": "a"}, {"id": 2}], {},
                         r"records\[1\] lacks key 'text' that records\[0\] has"),  # fmt: skip
        "records types": ([{"id": 1, "text": "a"}, {"id": "2", "text": "b"}], {},
                          r"records\[1\]\['id'\] is a string but records\[0\]\['id'\] is a num"),
        "records not dicts": ([{"id": 1, "text": "a"}, "b"], {}, r"records\[1\] is a string"),
        "records null id": ([{"id": 1, "text": "a"}, {"id": None, "text": "b"}], {},
                            r"of records have a null or empty id .*records\[1\]"),  # fmt: skip
        "no records": ([], {}, "empty list"),
        "header-only csv": (t / "header.csv", {}, "the corpus has no rows; nothing to index"),
        "blank jsonl": (t / "blank.jsonl", {}, r"blank\.jsonl holds no JSON records"),
        "truncated gzip": (t / "cut.jsonl.gz", {}, r"cut\.jsonl\.gz is a truncated or corrupt"),
    }  # fmt: skip


BAD_CASES = [
    "missing file", "empty parquet", "empty jsonl", "empty csv", "corrupt parquet",
    "truncated parquet", "jsonl bad line", "json array", "jsonl raw control", "jsonl non-utf8",
    "csv non-utf8", "csv ragged", "jsonl mixed types", "csv number text", "jsonl number text",
    "parquet number text", "list text", "struct text", "binary not utf8", "all-null texts",
    "text column absent", "id column absent", "null id", "duplicate ids", "fractional id",
    "no supported files", "unknown format", "reserved column", "metadata types", "id kinds",
    "missing metadata", "records keys", "records types", "records not dicts", "records null id",
    "no records", "header-only csv", "blank jsonl", "truncated gzip",
]  # fmt: skip


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_naming_the_problem(tmp_path, case):
    corpus, kwargs, message = _bad(tmp_path)[case]
    with pytest.raises(FlowsearchError, match=message) as info:
        plan = scan_corpus(corpus, **kwargs)
        list(plan.batches())
    assert "\n" not in str(info.value) and len(str(info.value)) < 400
    assert info.value.__cause__ is None or isinstance(info.value.__cause__, FlowsearchError)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
@pytest.mark.parametrize("name", ["locked.parquet", "locked.jsonl", "locked.csv"])
def test_unreadable_file(tmp_path, name):
    path = _write(tmp_path / name, ROWS)
    path.chmod(0)
    try:
        with pytest.raises(FlowsearchError, match="permission denied"):
            scan_corpus(path)
    finally:
        path.chmod(0o600)
