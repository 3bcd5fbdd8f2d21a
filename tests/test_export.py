"""export_index / ``flowsearch export`` (writes/export.py): the live documents of one version,
whole (passages joined), with their metadata and optionally their raw vectors; re-indexing the
file gives the same documents; bad destinations are one line and leave nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from corpus_helpers import sentences, write_corpus
from typer.testing import CliRunner

from flowsearch.cli import app
from flowsearch.encode.encoder import Encoder
from flowsearch.errors import BadInput, NotFound
from flowsearch.writes.build import build_index
from flowsearch.writes.delete import delete
from flowsearch.writes.export import export_index
from flowsearch.writes.upsert import upsert

runner = CliRunner()
MAX_LENGTH = 16  # a window of 14 tokens: a few sentences make a long document


def _long(seed: int) -> str:
    return " ".join(s + "." for s in sentences(6, seed=seed, length=(3, 7)))


@pytest.fixture(scope="module")
def written(tmp_path_factory, model_dir):
    """An index of two segments (a later upsert adds a metadata column) with deletions, and
    the documents it should hold."""
    root = tmp_path_factory.mktemp("export")
    corpus = write_corpus(root / "c.parquet", n=30, seed=2)
    build_index(corpus, root / "idx", model=str(model_dir))
    delete(root / "idx", ["d3", "d4"])
    extra = [
        {"id": "d5", "text": "the new cat", "topic": "cat", "year": 2021, "lang": "en"},
        {"id": "e1", "text": "the blue sea", "topic": "sea", "year": 2022, "lang": "fr"},
    ]
    upsert(root / "idx", extra)
    docs = {r["id"]: {**r, "lang": None} for r in pq.read_table(corpus).to_pylist()}
    for gone in ("d3", "d4"):
        del docs[gone]
    docs.update({r["id"]: r for r in extra})
    return root, docs


def test_export_holds_the_live_documents(written, tmp_path):
    root, docs = written
    result = export_index(root / "idx", tmp_path / "docs.parquet")
    table = pq.read_table(tmp_path / "docs.parquet")
    assert result.n_documents == len(docs) == table.num_rows and not result.vectors
    assert table.column_names == ["id", "text", "topic", "year", "lang"] == list(result.columns)
    assert {r["id"]: r for r in table.to_pylist()} == docs
    described = json.loads(table.schema.metadata[b"flowsearch"])
    assert described["version"] == result.version and described["dim"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["docs.parquet"]  # nothing left aside


def test_reindexing_the_export_gives_the_same_documents(written, tmp_path, model_dir):
    root, docs = written
    out = runner.invoke(app, ["export", str(tmp_path / "a.parquet"), "--index",
                              str(root / "idx"), "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["n_documents"] == len(docs)
    again = runner.invoke(app, ["index", str(tmp_path / "a.parquet"), "--index",
                                str(tmp_path / "idx2"), "--model", str(model_dir)])  # fmt: skip
    assert again.exit_code == 0, again.output
    export_index(tmp_path / "idx2", tmp_path / "b.parquet")
    first, second = (pq.read_table(tmp_path / n).to_pylist() for n in ("a.parquet", "b.parquet"))
    key = lambda r: r["id"]  # noqa: E731
    assert sorted(first, key=key) == sorted(second, key=key)


def test_long_documents_come_back_whole_with_their_passage_vectors(tmp_path, model_dir):
    texts = [_long(10), "the cat", _long(11)]
    records = [{"id": i, "text": t, "n": i * 10} for i, t in enumerate(texts)]
    build_index(records, tmp_path / "idx", model=str(model_dir), max_length=MAX_LENGTH)
    result = export_index(tmp_path / "idx", tmp_path / "v.parquet", vectors=True)
    rows = pq.read_table(tmp_path / "v.parquet").to_pylist()
    assert result.vectors and [r["text"] for r in rows] == texts
    assert [r["n"] for r in rows] == [0, 10, 20]
    assert [len(r["raw"]) for r in rows][1] == 1 and len(rows[0]["raw"]) > 1  # cut into several
    encoder = Encoder(str(model_dir), max_length=MAX_LENGTH)
    for row in rows:
        spans = [(p["start"], p["end"]) for p in row["raw"]]
        assert spans[0][0] == 0 and spans[-1][1] == len(row["text"])
        passages = [row["text"][a:b] for a, b in spans]
        expected = encoder.encode(passages)
        got = np.array([p["vector"] for p in row["raw"]], dtype=np.float32)
        # the index keeps the encoder's output as float16
        np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)
    schema = pq.read_schema(tmp_path / "v.parquet")
    assert schema.field("raw").type.value_type.field("vector").type == pa.list_(
        pa.float32(), expected.shape[1]
    )
    # the command line's --vectors writes the same column
    out = runner.invoke(app, ["export", str(tmp_path / "cli.parquet"), "--index",
                              str(tmp_path / "idx"), "--vectors", "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["vectors"] and json.loads(out.stdout)["columns"][-1] == "raw"
    assert pq.read_table(tmp_path / "cli.parquet").to_pylist() == rows
    # the index reserves `raw`: re-indexing such an export is refused in one line
    refused = runner.invoke(app, ["index", str(tmp_path / "v.parquet"), "--index",
                                  str(tmp_path / "again"), "--model", str(model_dir)])  # fmt: skip
    assert refused.exit_code == 2 and "raw" in refused.stderr
    assert refused.stderr.strip().count("\n") == 0


def test_bad_destinations_are_one_line(written, tmp_path):
    root, _ = written
    idx = root / "idx"
    cases = [
        (tmp_path / "docs.csv", "does not end in .parquet"),
        (tmp_path / "no" / "such" / "docs.parquet", "no directory"),
        (idx / "docs.parquet", "inside the index"),
        (tmp_path, "does not end in .parquet"),
    ]
    for dest, message in cases:
        with pytest.raises(BadInput, match=message):
            export_index(idx, dest)
        out = runner.invoke(app, ["export", str(dest), "--index", str(idx)])
        assert out.exit_code == 2 and message in out.stderr and "Traceback" not in out.output
        assert out.stderr.strip().count("\n") == 0
    (tmp_path / "old.parquet").write_bytes(b"keep me")
    with pytest.raises(BadInput, match="already exists"):
        export_index(idx, tmp_path / "old.parquet")
    out = runner.invoke(app, ["export", str(tmp_path / "old.parquet"), "--index", str(idx)])
    assert out.exit_code == 2 and "--overwrite" in out.stderr
    assert (tmp_path / "old.parquet").read_bytes() == b"keep me"
    export_index(idx, tmp_path / "old.parquet", overwrite=True)
    assert pq.read_table(tmp_path / "old.parquet").num_rows > 0
    with pytest.raises(NotFound):
        export_index(tmp_path / "nothing", tmp_path / "x.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.parquet"]
