"""The history log (flowsearch.storage.history): one JSON line per write, a torn last line
trimmed and a lost record re-appended by the next writer, checked by verify."""

from __future__ import annotations

import json

import pytest
from segment_helpers import template

from flowsearch.errors import IndexDamaged
from flowsearch.storage import history
from flowsearch.storage.layout import HISTORY_NAME
from flowsearch.storage.manifest import WriteRecord


def _record(version: int, kind: str = "add", **detail) -> WriteRecord:
    return WriteRecord(
        version=version, kind=kind, time=f"t{version}", n_rows=version, detail=detail
    )


def _manifest(version: int):
    """A manifest at ``version``, published by the write ``_record(version)``."""
    return template().model_copy(update={"version": version, "last_write": _record(version)})


def test_one_json_line_per_record_read_back_in_order(tmp_path):
    assert history.read(tmp_path) == []  # no log yet
    records = [_record(1, "build"), _record(2, detail="ü"), _record(3, "delete", missing=2)]
    for record in records:
        history.append(tmp_path, record)
    lines = (tmp_path / HISTORY_NAME).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["version"] for line in lines] == [1, 2, 3]
    assert "ü" in lines[1]  # UTF-8 as written, one line each
    assert history.read(tmp_path) == records


def test_a_torn_last_line_is_ignored_then_trimmed_and_the_lost_record_appended(tmp_path):
    """A crash inside an append leaves part of a line; the manifest (the commit point) holds
    the record the log lost."""
    history.append(tmp_path, _record(1, "build"))
    history.append(tmp_path, _record(2))
    path = tmp_path / HISTORY_NAME
    whole = path.read_bytes()
    line3 = json.dumps(_record(3).model_dump(mode="json")).encode()
    path.write_bytes(whole + line3[:17])
    assert [r.version for r in history.read(tmp_path)] == [1, 2]
    assert history.verify(tmp_path, _manifest(3)) == 2  # one short: allowed, repaired later
    history.repair(tmp_path, _manifest(3))
    assert path.read_bytes().startswith(whole) and path.read_bytes().endswith(b"\n")
    assert history.read(tmp_path) == [_record(1, "build"), _record(2), _record(3)]
    history.repair(tmp_path, _manifest(3))  # nothing left to repair: unchanged
    assert [r.version for r in history.read(tmp_path)] == [1, 2, 3]


def test_repair_without_a_manifest_only_trims(tmp_path):
    history.append(tmp_path, _record(1, "build"))
    path = tmp_path / HISTORY_NAME
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"version": 2, "ki')
    history.repair(tmp_path, None)
    assert path.read_bytes() == whole
    history.repair(tmp_path, _manifest(1))  # the manifest's record is there already
    assert path.read_bytes() == whole


def test_a_missing_log_is_started_from_the_manifest(tmp_path):
    history.repair(tmp_path, _manifest(5))
    assert history.read(tmp_path) == [_record(5)]


def test_a_complete_line_that_is_not_a_record_is_named(tmp_path):
    history.append(tmp_path, _record(1, "build"))
    with open(tmp_path / HISTORY_NAME, "a", encoding="utf-8") as handle:
        handle.write("\n")  # blank lines are skipped
        handle.write('{"not": "a record"}\n')
    with pytest.raises(IndexDamaged, match=f"{HISTORY_NAME} line 2 is not a write record"):
        history.read(tmp_path)
    with pytest.raises(IndexDamaged, match="line 2 is not a write record"):
        history.verify(tmp_path, _manifest(1))


def test_repair_names_a_bad_last_line_instead_of_a_traceback(tmp_path):
    history.append(tmp_path, _record(1, "build"))
    with open(tmp_path / HISTORY_NAME, "a", encoding="utf-8") as handle:
        handle.write('{"not": "a record"}\n')
    with pytest.raises(IndexDamaged, match="line 2 is not a write record"):
        history.repair(tmp_path, _manifest(2))


def test_verify_counts_records_and_refuses_disorder_or_a_future(tmp_path):
    for version in (1, 2, 4):
        history.append(tmp_path, _record(version))
    assert history.verify(tmp_path, _manifest(4)) == 3  # a gap is fine (a lost record)
    with pytest.raises(IndexDamaged, match="records version 4, newer than the manifest's 3"):
        history.verify(tmp_path, _manifest(3))
    history.append(tmp_path, _record(4))
    with pytest.raises(IndexDamaged, match="lists versions out of order"):
        history.verify(tmp_path, _manifest(4))
