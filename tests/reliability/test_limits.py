"""Limits that must not grow with use: the manifest after thousands of writes (the history log
grows instead, and lists every write), the cost of a ``refresh()`` that finds nothing new, and
the memory of a search asked for a huge k (library, command line, HTTP)."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from corpus_helpers import sentences

from flowsearch.search.searcher import Searcher
from flowsearch.storage import manifest as mf
from flowsearch.writes import measure
from flowsearch.writes.merge import MergePolicy

#: small writes in the manifest-growth test (one-row upserts and one-id deletes, alternating):
#: the default suite's (15 merges of the lowest tier), and ``-m slow``'s
N_WRITES = 300
N_WRITES_SLOW = 2000
HUGE_K = 10**9


def _manifest_bytes(index: Path) -> int:
    return (index / mf.MANIFEST_NAME).stat().st_size


def _bound(index: Path) -> int:
    """What the manifest may hold after any number of small writes: the first version's bytes
    plus, per extra segment the merge policy allows, one segment record with a deletion file,
    plus the last write's record (an upsert's holds its drift report: under 1 KiB).

    Writes merge a size tier once it holds ``segments_per_tier`` segments, so after a write a
    tier holds at most ``segments_per_tier - 1``; these writes keep every segment below
    ``floor_segment_rows`` (the lowest tier), so a version has at most that many segments and
    the manifest a bounded size however many writes made it; the reference sample's deltas
    fold into a new base past ``REFERENCE_DELTA_MAX``, so its record is bounded too. Only the
    log grows per write.
    """
    raw = json.loads((index / mf.MANIFEST_NAME).read_text())
    (segment,) = raw["segments"]
    deletion = {"deleted-v000000.npy": {"bytes": 10**6, "sha256": "f" * 64}}
    record = {**segment, "files": {**segment["files"], **deletion}, "n_rows": 10**6,
              "deletions": "deleted-v000000.npy", "n_deleted": 10**6}  # fmt: skip
    per_segment = len(json.dumps(record, indent=1)) + 64  # + digits of a bigger segment number
    last_write = 1024
    # the reference sample's deltas since its base: at most REFERENCE_DELTA_MAX records
    delta = {"delta.npz": {"bytes": 10**6, "sha256": "f" * 64}}
    piece = {"path": "references/r000000", "files": delta}
    chain = measure.REFERENCE_DELTA_MAX * (len(json.dumps(piece, indent=1)) + 64)
    tiers = MergePolicy().segments_per_tier
    return _manifest_bytes(index) + (tiers - 2) * per_segment + last_write + chain


def log_lines(index: Path) -> list[str]:
    return (index / "history.jsonl").read_text().splitlines()


class _Counted:
    """Counts calls of ``func`` (optionally only those whose first argument passes ``when``)."""

    def __init__(self, func: Callable[..., Any], when: Callable[[Any], bool] | None = None):
        self.func, self.when, self.calls = func, when, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.when is None or (args and self.when(args[0])):
            self.calls += 1
        return self.func(*args, **kwargs)


def _refresh_cost(searcher: Searcher, monkeypatch: pytest.MonkeyPatch) -> tuple[bool, int, int]:
    """(refresh()'s answer, manifest reads, stat calls on the manifest) of one refresh."""
    reads = _Counted(mf.read)
    stats = _Counted(os.stat, when=lambda p: str(p).endswith(mf.MANIFEST_NAME))
    with monkeypatch.context() as patch:
        patch.setattr(mf, "read", reads)
        patch.setattr(os, "stat", stats)
        moved = searcher.refresh()
    return moved, reads.calls, stats.calls


def _moved(cost: tuple[bool, int, int]) -> bool:
    """A refresh that found a new version: one stat, and the manifest read (refresh() reads
    it, and opening the version reads it again to retry on a race: two small reads)."""
    moved, reads, stats = cost
    return moved and 1 <= reads <= 2 and stats == 1


@pytest.mark.parametrize(
    "n_writes", [N_WRITES, pytest.param(N_WRITES_SLOW, marks=pytest.mark.slow)]
)
def test_manifest_stays_small_and_the_log_lists_every_write(
    built, tmp_path, encoder, monkeypatch, capsys, n_writes
):
    """Thousands of small writes (one-row upserts, one-id deletes): the manifest never exceeds
    its bound (:func:`_bound`), the history log holds one line per write, ``info --history``
    lists every write, and a reader's ``refresh()`` with nothing new costs one ``stat``.

    ``os.fsync`` is skipped here (the sizes are what is measured; durability is the crash
    trials'): it is half of a small write's time on this machine's disk."""
    from flowsearch.cli import main
    from flowsearch.writes.delete import delete
    from flowsearch.writes.upsert import upsert

    monkeypatch.setattr(os, "fsync", lambda fd: None)
    index = tmp_path / "idx"
    shutil.copytree(built, index)
    bound = _bound(index)
    reader = Searcher.open(index, encoder=encoder)
    texts = sentences(n_writes // 2, seed=123)
    sizes, segments = [], []
    for i in range(n_writes):
        if i % 2 == 0:
            row = {"id": f"w{i}", "text": texts[i // 2], "topic": "new", "year": 2000 + i % 25}
            upsert(index, [row], encoder=encoder)
        else:  # a row upserted five upserts ago (the first few: rows of the build)
            j = i // 2
            delete(index, [f"w{i - 11}" if j >= 5 else f"d{j}"])
        sizes.append(_manifest_bytes(index))
        segments.append(len(mf.read(index).segments) if i % 50 == 0 else 0)
        if i % 250 == 0:  # a reader moves along: a refresh reads the new manifest
            assert _moved(_refresh_cost(reader, monkeypatch))
    final = mf.read(index)
    assert final.version == n_writes + 1
    print(f"manifest: {sizes[0]} bytes after the first write, at most {max(sizes)} over "
          f"{n_writes} (bound {bound}); log {len(log_lines(index))} lines")  # fmt: skip
    assert max(sizes) <= bound, (max(sizes), bound)
    assert max(segments) < MergePolicy().segments_per_tier
    half = n_writes // 2  # no growth with the writes: the second half as big as the first
    assert max(sizes[half:]) <= max(sizes[:half]) + 64, (max(sizes[half:]), max(sizes[:half]))
    log_bytes = len((index / "history.jsonl").read_bytes())
    assert log_bytes > max(100 * n_writes, max(sizes))  # the log grows: a line per write
    # nothing new: one stat of the manifest, no read; then a write: one read
    assert reader.refresh()
    for _ in range(3):
        assert _refresh_cost(reader, monkeypatch) == (False, 0, 1)
    delete(index, ["d30"])
    assert _moved(_refresh_cost(reader, monkeypatch))
    assert reader.manifest.version == n_writes + 2
    reader.close()

    # the log grows instead: one line per write, every one listed by `info --history`
    assert len(log_lines(index)) == n_writes + 2
    capsys.readouterr()
    assert main(["info", "--history", "--json", "--index", str(index)]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["version"] for r in records] == list(range(1, n_writes + 3))
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "build" and kinds[1:3] == ["upsert", "delete"]
    assert kinds.count("upsert") == n_writes // 2 and kinds.count("delete") == n_writes // 2 + 1
    assert main(["info", "--history", "--index", str(index)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == n_writes + 2 and lines[-1].startswith(f"v{n_writes + 2} ")
    assert lines[-1].endswith(" delete: 1 passage deleted")


def test_info_history_lists_every_write_kind(cli, index, corpora):
    """Every kind of write appears in `info --history`, in order, as written."""
    writes = [
        ("add", corpora["more"]),
        ("upsert", corpora["changed"]),
        ("delete", "d1", "d2"),
        ("compact",),
        ("recalibrate", "--calibration", "whitening"),
        ("compact", "--full"),
    ]
    for args in writes:
        assert cli.run(*args, "--index", index).code == 0
    records = json.loads(cli.run("info", "--history", "--json", "--index", index).out)
    assert [r["kind"] for r in records] == ["build", *[w[0] for w in writes]]
    assert [r["version"] for r in records] == list(range(1, len(writes) + 2))
    by_kind = {r["kind"]: r for r in records}
    assert by_kind["add"]["n_rows"] == 20 and by_kind["delete"]["n_rows"] == 2
    assert by_kind["upsert"]["detail"]["replaced"] == 10
    text = cli.run("info", "--history", "--index", index).out.splitlines()
    assert [line.split()[2].rstrip(":") for line in text] == [r["kind"] for r in records]


# -- a huge k --------------------------------------------------------------------------------


def _peak(func: Callable[[], Any]) -> tuple[Any, int]:
    """``func()``'s result and the peak of Python-traced memory (numpy included) while it ran."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = func()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


#: Slack between a huge k's peak and the same search's at k = the row count: noise of the
#: allocator and caches, far below the 4 GB a (1, 10^9) float32 result array would take.
SLACK = 2 * 2**20


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
@pytest.mark.parametrize("where", [None, "year >= 2005"])
def test_huge_k_in_the_library_costs_what_the_hits_cost(built, encoder, mode, where):
    searcher = Searcher.open(built, encoder=encoder)
    n = len(searcher)
    queries = ["the cat and the dog", "red train on the river"]
    searcher.query_batch(queries, k=n, mode=mode, where=where)  # warm: filter made, caches
    small, small_peak = _peak(lambda: searcher.query_batch(queries, k=n, mode=mode, where=where))
    huge, huge_peak = _peak(lambda: searcher.query_batch(queries, k=HUGE_K, mode=mode, where=where))
    assert [r.to_dict() for r in huge] == [r.to_dict() for r in small]  # every row, once
    assert all(len(r.hits) <= n for r in huge) and any(len(r.hits) > 10 for r in huge)
    assert huge_peak <= small_peak + SLACK, (huge_peak, small_peak)
    if mode == "dense" and where is None:
        Z = searcher.vectors()[:2]
        _, vec_peak = _peak(lambda: searcher.search_vectors(Z, k=HUGE_K))
        assert len(searcher.search_vectors(Z, k=HUGE_K)[0]) == n
        assert vec_peak <= small_peak + SLACK
    searcher.close()


def test_huge_k_on_the_command_line(built, capsys):
    """`query -k 1000000000`: every row once, in the memory of a query at k = the row count."""
    from flowsearch.cli import main

    def run(k: int) -> dict:
        assert main(["query", "the cat", "--index", str(built), "-k", str(k), "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    run(60)  # warm: imports, the model's files in the page cache
    small, small_peak = _peak(lambda: run(60))
    huge, huge_peak = _peak(lambda: run(HUGE_K))
    assert len(huge["hits"]) == 60 and huge == small
    assert huge_peak <= small_peak + SLACK, (huge_peak, small_peak)


def test_the_server_caps_k(built):
    """Over HTTP, k is at most ``MAX_K`` (a 422 naming the bound above it), and a search at
    that bound costs the hits it returns."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from flowsearch.server import MAX_K, create_app

    with TestClient(create_app(built), raise_server_exceptions=False) as client:

        def ask(k: int) -> Any:
            return client.post("/search", json={"query": ["the cat", "a dog"], "k": k})

        for k in (HUGE_K, MAX_K + 1):
            r = ask(k)
            assert r.status_code == 422 and str(MAX_K) in r.json()["detail"], r.text
        ask(60)  # warm
        small, small_peak = _peak(lambda: ask(60))
        huge, huge_peak = _peak(lambda: ask(MAX_K))
        assert huge.status_code == 200 and huge.json() == small.json()
        assert [len(r["hits"]) for r in huge.json()["results"]] == [60, 60]
        assert huge_peak <= small_peak + SLACK, (huge_peak, small_peak)
