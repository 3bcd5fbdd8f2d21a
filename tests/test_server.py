"""HTTP server: the real ``serve`` in a subprocess, talked to with httpx on 127.0.0.1.

Two server processes for the module: a read server (with an API key, on the index the in-process
Searcher also opens) and a write server on a copy of that index (upserts and deletes). Each is
stopped with SIGTERM in its fixture's finalizer, which checks the exit code is 0. The property
tests run the same app in-process (``create_app`` + TestClient), which is much faster.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from corpus_helpers import sentences, write_corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowsearch.errors import FlowsearchError
from flowsearch.jsonable import json_safe
from flowsearch.search.searcher import Searcher
from flowsearch.server import (
    MAX_K,
    MAX_QUERIES,
    MAX_QUERY_CHARS,
    REFRESH_SECONDS,
    DeleteRequest,
    UpsertRequest,
    create_app,
    serve,
)
from flowsearch.writes.build import build_index

REPO = Path(__file__).resolve().parents[1]
KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
START_SECONDS = 90


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("server")
    corpus = write_corpus(root / "c.parquet", n=80, seed=5)
    build_index(corpus, root / "idx", model=str(model_dir))
    return root / "idx"


@pytest.fixture(scope="module")
def write_index(built: Path) -> Path:
    """A copy of the built index that the write tests change."""
    target = built.parent / "idx-writes"
    shutil.copytree(built, target)
    return target


@pytest.fixture(scope="module")
def searcher(built: Path) -> Iterator[Searcher]:
    s = Searcher.open(built)
    yield s
    s.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A ``serve`` subprocess on a free port of 127.0.0.1."""

    def __init__(self, index_dir: Path, log: Path, api_key: str | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        code = (
            "from flowsearch.server import serve; "
            f"serve({str(index_dir)!r}, port={self.port}, api_key={api_key!r})"
        )
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
        env.pop("FLOWSEARCH_API_KEY", None)
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code], cwd=REPO, env=env, stdout=err, stderr=err
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.proc.kill()
        raise AssertionError(f"server did not answer /health in {START_SECONDS}s")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, then the exit code (killed after 30 s: a failure)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("server ignored SIGTERM for 30 s") from None


def _stopped_cleanly(server: Server) -> None:
    code = server.stop()
    out = server.output()
    assert code == 0, f"exit code {code} after SIGTERM: {out}"
    assert "Traceback" not in out, out
    assert out.rstrip().splitlines()[-1].startswith("flowsearch: stopped serving "), out


@pytest.fixture(scope="module")
def reader(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(built, tmp_path_factory.mktemp("logs") / "reader.log", api_key=KEY)
    yield server
    _stopped_cleanly(server)


@pytest.fixture(scope="module")
def writer(write_index: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(write_index, tmp_path_factory.mktemp("logs") / "writer.log")
    yield server
    _stopped_cleanly(server)


@pytest.fixture(scope="module")
def client(reader: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=reader.url, headers=AUTH, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def wclient(writer: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=writer.url, timeout=120) as c:
        yield c


def _plain(value: Any) -> Any:
    """What a library result looks like after the server's JSON."""
    return json.loads(json.dumps(json_safe(value), default=str))


def _ids(hits: list[dict[str, Any]]) -> list[Any]:
    return [h["id"] for h in hits]


def _hits(batch: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Each query's hits of a batch answer."""
    return [result["hits"] for result in batch["results"]]


# --- reads --------------------------------------------------------------------------------


def test_health_and_info(client: httpx.Client, searcher: Searcher) -> None:
    r = client.get("/health")
    assert len(searcher) == 80
    assert r.status_code == 200 and r.json() == {"status": "ok", "rows": 80}
    info = client.get("/info").json()
    assert info == _plain(searcher.info().to_dict())
    assert info["n_live"] == 80
    assert client.get("/openapi.json").json()["paths"].keys() >= {
        "/health",
        "/info",
        "/search",
        "/upsert",
        "/delete",
    }
    assert client.get("/docs").status_code == 200


def test_single_search_is_query_json(client: httpx.Client, searcher: Searcher) -> None:
    text = sentences(80, seed=5)[12]  # the corpus's row d12
    r = client.post("/search", json={"query": text, "k": 5})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc == _plain(searcher.query(text, k=5).to_dict())
    assert set(doc) == {"query", "hits", "report"} and doc["query"] == text
    assert doc["report"]["top_score"] == pytest.approx(doc["hits"][0]["dense_score"])
    assert [h["rank"] for h in doc["hits"]] == [1, 2, 3, 4, 5]
    assert doc["hits"][0]["id"] == "d12" and doc["hits"][0]["text"] == text
    assert set(doc["hits"][0]) >= {"rank", "id", "score", "text", "metadata"}
    assert doc["hits"][0]["metadata"].keys() == {"topic", "year"}
    default_k = client.post("/search", json={"query": text}).json()
    assert len(default_k["hits"]) == 10


def test_batch_search_equals_library(client: httpx.Client, searcher: Searcher) -> None:
    queries = sentences(5, seed=21)
    r = client.post("/search", json={"query": queries, "k": 4})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    # each query's answer has the shape of a single query's: hits and the query's report
    assert results == _plain([res.to_dict() for res in searcher.query_batch(queries, k=4)])
    for result, query in zip(results, queries, strict=True):  # as a single query's (the batch
        single = searcher.query(query, k=4).to_dict()  # encodes padded: float noise only)
        assert _ids(result["hits"]) == _ids(single["hits"])
        assert [h["score"] for h in result["hits"]] == pytest.approx(
            [h["score"] for h in single["hits"]], abs=1e-5
        )
    assert [res["query"] for res in results] == queries
    assert [len(res["hits"]) for res in results] == [4] * 5
    assert all(set(res) == {"query", "hits", "report"} for res in results)
    assert all("log_density" not in h for res in results for h in res["hits"])
    # k larger than the index: every row once
    everything = client.post("/search", json={"query": ["the cat"], "k": MAX_K}).json()
    assert len(everything["results"][0]["hits"]) == 80


def test_filter_and_modes_equal_library(client: httpx.Client, searcher: Searcher) -> None:
    query, where = "the cat and the dog", "year >= 2010 AND topic <> 'cat'"
    r = client.post("/search", json={"query": query, "k": 10, "where": where})
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert hits and all(
        h["metadata"]["year"] >= 2010 and h["metadata"]["topic"] != "cat" for h in hits
    )
    assert hits == _plain(searcher.query(query, k=10, where=where).to_dict())["hits"]
    for mode in ("dense", "lexical", "hybrid"):
        body = {"query": [query, "red fish"], "k": 6, "where": "year < 2000", "mode": mode}
        r = client.post("/search", json=body)
        assert r.status_code == 200, (mode, r.text)
        expected = searcher.query_batch([query, "red fish"], k=6, where="year < 2000", mode=mode)
        assert r.json()["results"] == _plain([res.to_dict() for res in expected])
        hits = [h for res in r.json()["results"] for h in res["hits"]]
        assert hits and all(h["metadata"]["year"] < 2000 for h in hits)
        # every hit has both component scores; a side that did not score it gives null
        assert all(h.keys() >= {"dense_score", "lexical_score"} for h in hits)
        dense = [h["dense_score"] is not None for h in hits]
        lexical = [h["lexical_score"] is not None for h in hits]
        if mode == "dense":
            assert all(dense) and not any(lexical)
        elif mode == "lexical":
            assert all(lexical) and not any(dense)
        else:
            assert all(d or x for d, x in zip(dense, lexical, strict=True))


def test_min_score_drops_what_the_library_drops(client: httpx.Client, searcher: Searcher) -> None:
    query = "the cat and the dog"
    scores = [h["score"] for h in client.post("/search", json={"query": query}).json()["hits"]]
    cut = (scores[0] + scores[-1]) / 2  # between the best and the worst hit: some go
    r = client.post("/search", json={"query": [query], "min_score": cut})
    assert r.status_code == 200, r.text
    kept = r.json()["results"][0]["hits"]
    assert 0 < len(kept) < len(scores) and all(h["score"] >= cut for h in kept)
    expected = searcher.query_batch([query], min_score=cut)
    assert r.json()["results"] == _plain([res.to_dict() for res in expected])
    assert client.post("/search", json={"query": query, "min_score": 1}).status_code == 200


def test_concurrent_queries_equal_serial(reader: Server, searcher: Searcher) -> None:
    queries = sentences(25, seed=33)
    modes = ["dense", "lexical", "hybrid", None, "dense"]

    def body(i: int) -> dict[str, Any]:
        return {"query": queries[i], "k": 5, "mode": modes[i % 5], "where": None}

    def run(thread: int) -> list[Any]:
        with httpx.Client(base_url=reader.url, headers=AUTH, timeout=120) as c:
            out = []
            for i in range(len(queries)):
                r = c.post("/search", json=body((i + thread) % len(queries)))
                assert r.status_code == 200, r.text
                out.append(r.json())
            return out

    with httpx.Client(base_url=reader.url, headers=AUTH, timeout=60) as c:
        serial = [c.post("/search", json=body(i)).json() for i in range(len(queries))]
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(run, range(8)))
    for thread, answers in enumerate(parallel):
        for i, answer in enumerate(answers):
            assert answer == serial[(i + thread) % len(queries)]
    assert serial[0] == _plain(searcher.query(queries[0], k=5, mode="dense").to_dict())


# --- auth ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": KEY},
        {"X-API-Key": "wrong"},
        {"X-API-Key": ""},
        {"Authorization": "Bearer ÿé".encode("latin-1")},
    ],
    ids=["none", "wrong", "longer", "basic", "no-scheme", "x-wrong", "x-empty", "latin1"],
)
def test_wrong_or_missing_key_is_401_on_every_route(reader: Server, headers: dict) -> None:
    calls = [
        ("GET", "/info", None),
        ("POST", "/search", {"query": "the cat"}),
        ("POST", "/upsert", {"records": [{"id": "x", "text": "the cat"}]}),
        ("POST", "/delete", {"ids": ["d1"]}),
        ("POST", "/search", {"bad": "body"}),  # auth is checked before the body
    ]
    with httpx.Client(base_url=reader.url, timeout=30) as c:
        for method, path, body in calls:
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (path, r.text)
            assert "API key" in r.json()["detail"]
            assert r.headers["www-authenticate"] == "Bearer"


def test_right_key_either_header_and_open_routes(reader: Server) -> None:
    with httpx.Client(base_url=reader.url, timeout=30) as c:
        assert c.get("/info", headers=AUTH).status_code == 200
        assert c.get("/info", headers={"X-API-Key": KEY}).status_code == 200
        r = c.post("/search", json={"query": "the cat", "k": 2}, headers={"X-API-Key": KEY})
        assert r.status_code == 200 and len(r.json()["hits"]) == 2
        # a wrong header beside the right one still gets in (either header suffices)
        both = {"Authorization": "Bearer nope", "X-API-Key": KEY}
        assert c.get("/info", headers=both).status_code == 200
        # open without a key: liveness and the (static) schema
        assert c.get("/health").json()["status"] == "ok"
        assert c.get("/openapi.json").status_code == 200


# --- writes -------------------------------------------------------------------------------


def test_upsert_then_search(wclient: httpx.Client) -> None:
    new = {"id": "n1", "text": "the piano music song guitar", "topic": "music", "year": 2024}
    r = wclient.post("/upsert", json={"records": [new]})
    assert r.status_code == 200, r.text
    summary = r.json()
    assert summary["kind"] == "upsert" and summary["n_written"] == 1
    assert summary["n_inserted"] == 1 and summary["n_replaced"] == 0 and summary["n_live"] == 81
    assert wclient.get("/health").json()["rows"] == 81
    hits = wclient.post("/search", json={"query": new["text"], "k": 3}).json()["hits"]
    assert hits[0]["id"] == "n1" and hits[0]["text"] == new["text"]
    assert hits[0]["metadata"] == {"topic": "music", "year": 2024}
    found = wclient.post("/search", json={"query": "piano", "where": "year = 2024"}).json()
    assert _ids(found["hits"]) == ["n1"]

    # replacing: the id now answers with the new text, the old text is gone for every mode
    old_text = sentences(80, seed=5)[3]
    replaced = {"id": "d3", "text": "the moon star sun sea ship", "topic": "sky", "year": 2025}
    r = wclient.post("/upsert", json={"records": [replaced]})
    assert r.status_code == 200, r.text
    assert r.json()["n_replaced"] == 1 and r.json()["n_inserted"] == 0
    assert wclient.get("/health").json()["rows"] == 81
    for mode in ("dense", "lexical", "hybrid"):
        body = {"query": [replaced["text"], old_text], "k": 81, "mode": mode}
        new_hits, old_hits = _hits(wclient.post("/search", json=body).json())
        assert new_hits[0]["id"] == "d3" and new_hits[0]["text"] == replaced["text"], mode
        d3 = [h for h in old_hits if h["id"] == "d3"]
        assert len(d3) == 1 and d3[0]["text"] == replaced["text"], mode
        assert all(h["text"] != old_text for hs in (new_hits, old_hits) for h in hs), mode


def test_delete_then_search(wclient: httpx.Client) -> None:
    texts = sentences(80, seed=5)
    rows = wclient.get("/health").json()["rows"]
    r = wclient.post("/delete", json={"ids": ["d10", "d11", "nope", "d10"]})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["kind"] == "delete" and doc["n_deleted"] == 2 and doc["n_live"] == rows - 2
    assert "nope" in doc["missing"] and "d11" not in doc["missing"]
    assert wclient.get("/health").json()["rows"] == rows - 2
    for mode in ("dense", "lexical", "hybrid"):
        for where in (None, "year >= 1990"):
            body = {"query": [texts[10], texts[11]], "k": 100, "mode": mode, "where": where}
            results = _hits(wclient.post("/search", json=body).json())
            assert all(h["id"] not in ("d10", "d11") for hs in results for h in hs), (mode, where)
            if mode == "dense":  # every live row has a dense score (BM25 only matching ones)
                assert all(len(hs) == rows - 2 for hs in results), where
    again = wclient.post("/delete", json={"ids": ["d10"]}).json()
    assert again["n_deleted"] == 0 and again["missing"] == ["d10"]


@contextlib.contextmanager
def _another_writer(index_dir: Path) -> Iterator[None]:
    """Hold the index's writer lock as another flowsearch process would."""
    from flowsearch.storage.layout import LOCK_NAME

    fd = os.open(index_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


WRITES_WHILE_LOCKED = [
    ("/upsert", {"records": [{"id": "locked", "text": "the cat"}]}),
    ("/delete", {"ids": ["d20"]}),
]


def test_another_process_writing_is_refused_and_nothing_changes(
    wclient: httpx.Client, write_index: Path
) -> None:
    rows = wclient.get("/health").json()["rows"]
    with _another_writer(write_index):
        for path, body in WRITES_WHILE_LOCKED:
            r = wclient.post(path, json=body)
            assert 400 <= r.status_code < 500, r.text
            assert "another flowsearch process is writing" in r.json()["detail"]
    assert wclient.get("/health").json()["rows"] == rows
    r = wclient.post("/delete", json={"ids": ["d20"]})
    assert r.status_code == 200 and r.json()["n_deleted"] == 1


def test_another_process_writing_is_409(wclient: httpx.Client, write_index: Path) -> None:
    with _another_writer(write_index):
        for path, body in WRITES_WHILE_LOCKED:
            assert wclient.post(path, json=body).status_code == 409


def test_concurrent_writes_are_serialized(wclient: httpx.Client, writer: Server) -> None:
    rows = wclient.get("/health").json()["rows"]

    def upsert(i: int) -> int:
        with httpx.Client(base_url=writer.url, timeout=120) as c:
            record = {"id": f"c{i}", "text": f"the train {WORDS_FOR[i]} road", "topic": "t"}
            return c.post("/upsert", json={"records": [{**record, "year": 2000 + i}]}).status_code

    with ThreadPoolExecutor(8) as pool:
        pending = [pool.submit(upsert, i) for i in range(8)]
        # while the writes queue, liveness answers at once (no worker waits on the queue)
        time.sleep(0.2)
        started = time.monotonic()
        assert wclient.get("/health").status_code == 200
        assert time.monotonic() - started < 5
        codes = [p.result() for p in pending]
    assert codes == [200] * 8  # the server queues its own writes; none meets the file lock
    assert wclient.get("/health").json()["rows"] == rows + 8


WORDS_FOR = ["cat", "dog", "bird", "fish", "sun", "moon", "tree", "car"]


def test_another_process_write_is_served_soon(wclient: httpx.Client, write_index: Path) -> None:
    from flowsearch import upsert

    rows = wclient.get("/health").json()["rows"]
    text = "the blue whale sea ship"
    upsert(write_index, [{"id": "ext1", "text": text, "topic": "sea", "year": 2001}])
    deadline = time.monotonic() + 10 * REFRESH_SECONDS
    while wclient.get("/health").json()["rows"] != rows + 1:
        assert time.monotonic() < deadline, "the server never moved to the new version"
        time.sleep(0.1)
    hits = wclient.post("/search", json={"query": text, "k": 1}).json()["hits"]
    assert hits[0]["id"] == "ext1"


# --- bad requests -------------------------------------------------------------------------

BAD_SEARCH: list[Any] = [
    b"not json",
    b"{",
    b"",
    b"\xff\xfe{}",
    b'{"query": "a", "query": }',
    [],
    None,
    42,
    "the cat",
    {},
    {"query": 1},
    {"query": None},
    {"query": True},
    {"query": {"text": "a"}},
    {"query": "a", "min_score": -0.1},
    {"query": "a", "min_score": 1.5},
    {"query": "a", "min_score": "0.2"},
    {"query": "a", "min_score": True},
    {"query": [1]},
    {"query": ["a", None]},
    {"query": []},
    {"query": ""},
    {"query": "   "},
    {"query": ["the cat", " \t\n"]},
    {"query": "a" * (MAX_QUERY_CHARS + 1)},
    {"query": ["a"] * (MAX_QUERIES + 1)},
    {"query": "a", "k": 0},
    {"query": "a", "k": -1},
    {"query": "a", "k": 10**9},
    {"query": "a", "k": 2**70},
    {"query": "a", "k": 1.5},
    {"query": "a", "k": 2.0},
    {"query": "a", "k": "5"},
    {"query": "a", "k": True},
    {"query": "a", "k": None},
    {"query": "a", "k": [5]},
    {"query": "a", "where": 5},
    {"query": "a", "where": ["year > 1"]},
    {"query": "a", "where": "nosuchcolumn > 1"},
    {"query": "a", "where": "year >"},
    {"query": "a", "where": "1=1; DROP TABLE shards"},
    {"query": "a", "where": "year IN (SELECT 1 FROM read_csv('/etc/passwd'))"},
    {"query": "a", "mode": "fuzzy"},
    {"query": "a", "mode": 1},
    {"query": "a", "mode": ""},
    {"query": "a", "mode": ["dense"]},
    {"query": "a", "kk": 1},
    {"query": "a", "records": []},
]

BAD_UPSERT: list[Any] = [
    b"{]",
    [],
    {},
    {"records": []},
    {"records": "x"},
    {"records": {"id": "a", "text": "b"}},
    {"records": [1]},
    {"records": [[]]},
    {"records": [None]},
    {"records": [{"id": "a"}]},
    {"records": [{"text": "the cat"}]},
    {"records": [{"id": "a", "text": 5}]},
    {"records": [{"id": "a", "text": ["the", "cat"]}]},
    {"records": [{"id": {"x": 1}, "text": "the cat"}]},
    {"records": [{"id": "a", "text": "the cat"}, {"id": "a", "text": "the dog"}]},
    {"records": [{"id": "a", "text": "the cat"}], "extra": 1},
]

BAD_DELETE: list[Any] = [
    b"nope",
    [],
    {},
    {"ids": []},
    {"ids": "d1"},
    {"ids": 1},
    {"ids": [None]},
    {"ids": [1.5]},
    {"ids": [True]},
    {"ids": [["d1"]]},
    {"ids": [{"id": "d1"}]},
    {"ids": [""]},
    {"ids": [2**70]},
    {"ids": ["d1"], "where": "1=1"},
]


def _post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return client.post(path, content=body, headers={"content-type": "application/json"})
    return client.post(path, json=body)


def _assert_4xx(r: httpx.Response, what: Any) -> None:
    assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
    detail = r.json()["detail"]
    assert isinstance(detail, str) and detail and "\n" not in detail, (what, r.text)
    assert "Traceback" not in detail


@pytest.mark.parametrize("body", BAD_SEARCH, ids=[f"search-{i}" for i in range(len(BAD_SEARCH))])
def test_bad_search_is_4xx_with_detail(client: httpx.Client, body: Any) -> None:
    _assert_4xx(_post(client, "/search", body), body)


@pytest.mark.parametrize("body", BAD_UPSERT, ids=[f"upsert-{i}" for i in range(len(BAD_UPSERT))])
def test_bad_upsert_is_4xx_and_changes_nothing(wclient: httpx.Client, body: Any) -> None:
    before = wclient.get("/info").json()["version"]
    _assert_4xx(_post(wclient, "/upsert", body), body)
    assert wclient.get("/info").json()["version"] == before


@pytest.mark.parametrize("body", BAD_DELETE, ids=[f"delete-{i}" for i in range(len(BAD_DELETE))])
def test_bad_delete_is_4xx_and_changes_nothing(wclient: httpx.Client, body: Any) -> None:
    before = wclient.get("/info").json()["version"]
    _assert_4xx(_post(wclient, "/delete", body), body)
    assert wclient.get("/info").json()["version"] == before


def test_bad_routes_methods_and_content(client: httpx.Client) -> None:
    _assert_4xx(client.get("/search"), "GET /search")
    _assert_4xx(client.post("/health"), "POST /health")
    _assert_4xx(client.get("/nope"), "GET /nope")
    _assert_4xx(client.delete("/delete"), "DELETE /delete")
    r = client.post("/search", content=b'{"query": "a"}', headers={"content-type": "text/plain"})
    assert r.status_code == 200 or 400 <= r.status_code < 500, r.text
    # a lone surrogate (valid JSON escape, not valid Unicode) in every string field
    for body in (
        b'{"query": "\\ud800"}',
        b'{"query": ["the cat", "\\udfff"]}',
        b'{"query": "a", "where": "topic = \'\\ud800\'"}',
    ):
        _assert_4xx(_post(client, "/search", body), body)
    r = client.post("/search", content=b'{"query": "a", "k": NaN}')
    _assert_4xx(r, "k NaN")


def test_control_characters_and_unicode_queries_answer(client: httpx.Client) -> None:
    for query in ("the \x00 cat\x1b[31m", "日本語のテキスト", "🐈 cat", "[/] [bold]x[/bold]"):
        r = client.post("/search", json={"query": query, "k": 3})
        assert r.status_code == 200, (query, r.text)
        assert r.json()["query"] == query


def test_bad_surrogates_in_writes(wclient: httpx.Client) -> None:
    before = wclient.get("/info").json()["version"]
    for path, body in [
        ("/upsert", b'{"records": [{"id": "s1", "text": "the cat \\ud800"}]}'),
        ("/upsert", b'{"records": [{"id": "\\udfff", "text": "the cat"}]}'),
        ("/delete", b'{"ids": ["\\ud800"]}'),
    ]:
        r = _post(wclient, path, body)
        assert r.status_code != 500, (path, body, r.text)
        if r.status_code >= 400:
            _assert_4xx(r, body)
    if wclient.get("/info").json()["version"] != before:  # accepted: must then be searchable
        assert wclient.get("/health").status_code == 200


# --- startup ------------------------------------------------------------------------------


def test_serve_without_an_index_fails_before_binding(tmp_path: Path) -> None:
    port = _free_port()
    with pytest.raises(FlowsearchError) as info:
        serve(tmp_path / "missing", port=port)
    assert "\n" not in str(info.value)
    with socket.socket() as sock:  # nothing was bound
        sock.bind(("127.0.0.1", port))


def test_empty_api_key_is_refused(built: Path) -> None:
    with pytest.raises(FlowsearchError, match="API key is empty"):
        create_app(built, api_key="  ")


def test_serve_on_a_taken_port_is_one_line(built: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(FlowsearchError, match=f"cannot listen on 127.0.0.1:{port}"):
            serve(built, port=port)


# --- property tests of the request models (in-process) ------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["the cat", "dense", "hybrid", "year > 2000"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
queries = st.one_of(
    st.text(max_size=40),
    st.lists(st.text(max_size=20), max_size=3),
    st.sampled_from(["the cat", "  ", "red fish in the sea", ""]),
    json_values,
)
search_bodies = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "query": queries,
            "k": st.one_of(st.integers(-3, 30), st.integers(), json_values),
            "where": st.one_of(
                st.none(),
                st.sampled_from(
                    [
                        "year >= 2000",
                        "topic = 'cat'",
                        "nosuch = 1",
                        "year >",
                        "",
                        "1=1; DROP TABLE x",
                        "read_csv('/etc/passwd') IS NOT NULL",
                        "year = 'x'",
                    ]
                ),
                st.text(max_size=20),
                json_values,
            ),
            "mode": st.one_of(
                st.none(), st.sampled_from(["dense", "lexical", "hybrid"]), st.text(max_size=6)
            ),
            "extra": json_values,
        },
    ),
    json_values,
)


@pytest.fixture(scope="module")
def app_client(built: Path) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    with TestClient(create_app(built), raise_server_exceptions=False) as c:
        yield c


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=search_bodies)
def test_random_search_bodies_never_500(app_client: Any, body: Any) -> None:
    r = app_client.post(
        "/search", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert r.status_code != 500, (body, r.text)
    doc = r.json()
    if r.status_code == 200:
        assert ("hits" in doc) if isinstance(body["query"], str) else ("results" in doc)
    else:
        assert 400 <= r.status_code < 500 and isinstance(doc["detail"], str), (body, r.text)


@settings(max_examples=200, deadline=None)
@given(body=st.one_of(json_values, st.fixed_dictionaries({}, optional={"ids": json_values})))
def test_delete_model_accepts_only_bounded_id_lists(body: Any) -> None:
    from pydantic import ValidationError

    try:
        req = DeleteRequest.model_validate(body)
    except ValidationError:
        return
    assert isinstance(body, dict) and set(body) == {"ids"} and body["ids"]
    for value in req.ids:
        assert (isinstance(value, str) and value) or (
            type(value) is int and -(2**63) <= value < 2**63
        )


@settings(max_examples=200, deadline=None)
@given(body=st.one_of(json_values, st.fixed_dictionaries({}, optional={"records": json_values})))
def test_upsert_model_accepts_only_lists_of_objects(body: Any) -> None:
    from pydantic import ValidationError

    try:
        req = UpsertRequest.model_validate(body)
    except ValidationError:
        return
    assert isinstance(body, dict) and set(body) == {"records"}
    assert req.records and all(isinstance(r, dict) for r in req.records)


# --- what serve says ----------------------------------------------------------------------


def test_serve_says_where_what_and_whether_a_key_is_needed(
    reader: Server, writer: Server, built: Path, write_index: Path
) -> None:
    for server, index_dir, key in ((reader, built, "API key required"),
                                   (writer, write_index, "no API key")):  # fmt: skip
        first = server.output().splitlines()[0]
        assert first == (
            f"flowsearch: serving {index_dir.resolve()} (80 documents, version 1) at {server.url} "
            f"({key}; search page at {server.url}/, docs at {server.url}/docs); Ctrl-C stops"
        )


# --- the boundary: body size, content type, docs ------------------------------------------


def test_chunked_and_declared_bodies_over_the_limit_are_413(client: httpx.Client) -> None:
    from flowsearch.server import MAX_BODY_BYTES

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        yield b'{"query": "'
        for _ in range(MAX_BODY_BYTES // 2**20 + 1):
            yield b"a" * 2**20
        yield b'"}'

    r = client.post("/search", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than" in r.json()["detail"], r.text
    assert "content-length" not in r.request.headers
    # a declared length over the bound is refused before any byte of the body is read
    with socket.create_connection(("127.0.0.1", int(client.base_url.port or 80))) as sock:
        head = (
            f"POST /search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n"
        )
        sock.sendall(head.encode() + b"{}")
        sock.settimeout(30)
        answer = sock.recv(65536).decode("latin-1")
    assert answer.startswith("HTTP/1.1 413 "), answer
    # a small chunked body is read as usual
    small = iter([b'{"query": "the ', b'cat", "k": 2}'])
    r = client.post("/search", content=small, headers={"content-type": "application/json"})
    assert r.status_code == 200 and len(r.json()["hits"]) == 2, r.text


@pytest.mark.parametrize("bounds", [1, 2])
def test_a_refused_chunked_body_leaves_no_traceback(reader: Server, bounds: int) -> None:
    """A chunked body past the bound (1: its rest is read and dropped; 2: past twice the bound,
    answered at once) followed by malformed framing: one answer, the connection closed, and no
    traceback in the log (uvicorn's h11 protocol logged one parsing the rest after a 413)."""
    from flowsearch.server import MAX_BODY_BYTES

    mb = b"a" * 2**20
    before = len(reader.output())
    with socket.create_connection(("127.0.0.1", reader.port)) as sock:
        sock.sendall(
            f"POST /search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        for _ in range(bounds * MAX_BODY_BYTES // len(mb) + 2):
            # past twice the bound the server answers and closes at once: stop sending when the
            # answer is there (a chunk written after its close is reset, on a loaded machine too)
            if bounds == 2 and select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(b"%x\r\n" % len(mb) + mb + b"\r\n")
            except (ConnectionResetError, BrokenPipeError):
                if bounds == 1:
                    raise
                break
        sock.settimeout(30)
        if bounds == 2:  # answered already: read it before the rest arrives
            answer = sock.recv(65536)
        with contextlib.suppress(OSError):  # the server may have closed the connection
            sock.sendall(b"zz\r\nnot a chunk\r\n")
        if bounds == 1:
            answer = b""
            while chunk := sock.recv(65536):  # the server closes the connection after it
                answer += chunk
    text = answer.decode("latin-1")
    # the malformed rest is a bad request when it comes before the answer
    allowed = {"413"} if bounds == 2 else {"400", "413"}
    assert text.startswith("HTTP/1.1 ") and text.split(" ")[1] in allowed, text
    assert "connection: close" in text.lower() and text.count("HTTP/1.1 ") == 1, text
    time.sleep(0.5)
    log = reader.output()[before:]
    assert "Traceback" not in log and "Error" not in log, log


@pytest.mark.parametrize(
    "content_type",
    [None, "application/x-www-form-urlencoded", "text/plain", "multipart/form-data"],
)
def test_a_json_body_is_read_whatever_the_content_type(
    client: httpx.Client, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    r = client.post("/search", content=b'{"query": "the cat", "k": 3}', headers=headers)
    assert r.status_code == 200, r.text
    assert len(r.json()["hits"]) == 3


def test_curl_as_the_readme_writes_it(reader: Server, searcher: Searcher) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl on this machine")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = next(x.strip() for x in readme.splitlines() if x.strip().startswith("curl "))
    args = [a.replace("localhost:8000", reader.url) for a in shlex.split(line)]
    assert args[0] == "curl" and any(a.startswith(reader.url) for a in args), line
    args = [curl, *args[1:], "-H", f"Authorization: Bearer {KEY}"]  # this server has a key
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    doc = json.loads(out.stdout)
    where = json.loads(args[args.index("-d") + 1])["where"]
    assert doc["query"] == "heat pumps" and set(doc) == {"query", "hits", "report"}
    assert doc == _plain(searcher.query("heat pumps", k=5, where=where).to_dict())


def test_docs_work_offline_and_need_no_key(reader: Server) -> None:
    import re

    with httpx.Client(base_url=reader.url, timeout=30) as c:  # no key
        page = c.get("/docs")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
        urls += re.findall(r"url: ?'([^']+)'", page.text)
        assert urls and not [u for u in urls if "://" in u or u.startswith("//")], urls
        assets = [u for u in urls if u.startswith("/docs/assets/")]
        assert len(assets) == 3, urls
        for url in assets:
            r = c.get(url)
            assert r.status_code == 200 and len(r.content) > 500, url
        bundle = c.get("/docs/assets/swagger-ui-bundle.js").text
        assert "SwaggerUIBundle" in bundle
        schema = c.get("/openapi.json").json()
        # Swagger UI 5 reads OpenAPI 3.1 (4.x refuses it): the bundle matches the schema
        assert schema["openapi"].startswith("3.1")
        assert c.get("/docs/assets/index.html").status_code == 404  # only the page's files
        assert c.get("/redoc").status_code == 404  # the CDN page is gone


# --- response models ----------------------------------------------------------------------


def test_responses_validate_against_their_models(
    client: httpx.Client, wclient: httpx.Client
) -> None:
    from pydantic import ValidationError

    from flowsearch.server.models import BatchResult, QueryResult, WriteResult

    for mode in ("dense", "lexical", "hybrid"):
        one = client.post("/search", json={"query": "the cat", "k": 3, "mode": mode}).json()
        model = QueryResult.model_validate(one)
        assert model.model_dump(mode="json") == one == model.to_dict()
        batch = client.post("/search", json={"query": ["the cat", "a dog"], "mode": mode}).json()
        assert BatchResult.model_validate(batch).model_dump(mode="json") == batch
    record = {"id": "m1", "text": "the red ship", "topic": "sea", "year": 2020}
    summary = wclient.post("/upsert", json={"records": [record]}).json()
    assert WriteResult.model_validate(summary).n_written == 1
    assert WriteResult.model_validate(summary).to_dict() == summary
    deleted = wclient.post("/delete", json={"ids": ["m1"]}).json()
    assert WriteResult.model_validate(deleted).to_dict() == deleted
    with pytest.raises(ValidationError):  # the models can fail: a hit without its score
        QueryResult.model_validate({**one, "hits": [{"id": "x", "rank": 1, "text": "t"}]})
    paths = client.get("/openapi.json").json()["paths"]
    answer = paths["/search"]["post"]["responses"]["200"]["content"]["application/json"]
    refs = json.dumps(answer["schema"])
    assert "QueryResult" in refs and "BatchResult" in refs
    for route in ("/upsert", "/delete"):
        answer = paths[route]["post"]["responses"]["200"]["content"]["application/json"]
        assert "WriteResult" in json.dumps(answer["schema"]), route


# --- errors mapped by class (in-process) --------------------------------------------------


@pytest.mark.parametrize(
    "error,status,detail",
    [
        ("IndexLocked", 409, 'another writer; pass "wait": 30'),
        ("NotFound", 404, 'another writer; pass "wait": 30'),
        ("IndexDamaged", 500, 'another writer; pass "wait": 30'),
        ("WriteFailed", 507, 'another writer; pass "wait": 30'),
        ("FlowsearchError", 400, 'another writer; pass "wait": 30'),
        ("ValueError", 500, "internal error"),
    ],
)
def test_library_errors_map_by_class(
    app_client: Any, monkeypatch: pytest.MonkeyPatch, error: str, status: int, detail: str
) -> None:
    from flowsearch import errors
    from flowsearch.writes import delete as delete_module

    def fail(*args: Any, **kwargs: Any) -> Any:
        if error == "ValueError":
            raise ValueError("a bug")
        raise getattr(errors, error)("another writer", "pass {wait=30}", param="wait")

    monkeypatch.setattr(delete_module, "delete", fail)  # what the route calls
    r = app_client.post("/delete", json={"ids": ["d1"]})
    assert (r.status_code, r.json()) == (status, {"detail": detail})


@pytest.fixture(scope="module")
def int_ids(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("int-ids")
    pq.write_table(pa.table({"id": list(range(10)), "text": sentences(10, seed=3)}),
                   root / "c.parquet")  # fmt: skip
    build_index(root / "c.parquet", root / "idx", model=str(model_dir), calibration="none")
    return root / "idx"


def test_delete_a_digit_that_is_not_a_number_is_400(int_ids: Path) -> None:
    from fastapi.testclient import TestClient

    with TestClient(create_app(int_ids), raise_server_exceptions=False) as c:
        r = c.post("/delete", json={"ids": ["²"]})
        assert r.status_code == 400, r.text
        assert "'²'" in r.json()["detail"] and "\n" not in r.json()["detail"]
        assert c.get("/info").json()["version"] == 1  # nothing written
        r = c.post("/delete", json={"ids": ["3", 4]})  # canonical decimal text is an integer id
        assert r.status_code == 200 and r.json()["n_deleted"] == 2, r.text


@pytest.mark.parametrize(
    ("path", "body", "detail"),
    [
        ("/search", {"query": ""}, "invalid request: query: String should have at least 1 "
         "character or Input should be a valid list"),
        ("/search", {"query": 5}, "invalid request: query: Input should be a valid string or "
         "Input should be a valid list"),
        ("/delete", {"ids": [{"a": 1}]}, "invalid request: ids.0: Input should be a valid string "
         "or Input should be a valid integer"),
        ("/search", b"{not json", "the body is not valid JSON (Expecting property name enclosed "
         "in double quotes); send one JSON object"),
    ],
)  # fmt: skip
def test_a_refused_body_names_the_fields_the_client_sent(
    client: httpx.Client, path: str, body: Any, detail: str
) -> None:
    """No schema internals (``query.constrained-str``, ``1: JSON decode error``) in a detail:
    the field as the client wrote it, once, with what it may be."""
    r = _post(client, path, body)
    assert r.status_code == 422 and r.json() == {"detail": detail}


# --- edges: id limit, key bytes, HEAD, host, docs examples, what serve says, SIGTERM --------


@pytest.fixture
def write_app(built: Path, tmp_path: Path) -> Iterator[Any]:
    """The app in-process over a copy of the index (writes allowed)."""
    from fastapi.testclient import TestClient

    copy = tmp_path / "idx"
    shutil.copytree(built, copy)
    with TestClient(create_app(copy), raise_server_exceptions=False) as c:
        yield c


def test_one_id_limit_for_upsert_and_delete(write_app: Any) -> None:
    from flowsearch.ingest.columns import MAX_ID_CHARS

    for n, accepted in ((MAX_ID_CHARS + 1, False), (MAX_ID_CHARS, True)):
        record = {"id": "i" * n, "text": "the cat and the dog"}
        up = write_app.post("/upsert", json={"records": [record]})
        gone = write_app.post("/delete", json={"ids": [record["id"]]})
        if accepted:
            assert up.status_code == gone.status_code == 200, (up.text, gone.text)
            assert gone.json()["n_deleted"] == 1
        else:
            assert 400 <= up.status_code < 500 and 400 <= gone.status_code < 500, up.text
            assert f"{MAX_ID_CHARS:,}" in up.json()["detail"], up.text


def _in_thread(app: Any) -> Iterator[str]:
    """A real uvicorn (its HTTP parser) serving ``app`` on a free port, in a thread."""
    import threading

    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


@pytest.mark.parametrize("key", ["ключ-🔑-secret", "café-key"])
def test_a_key_beyond_latin1_matches_in_either_header(built: Path, key: str) -> None:
    raw = key.encode("utf-8")  # what curl -H and every client send: the key's UTF-8 bytes
    for url in _in_thread(create_app(built, api_key=key)):
        for header in ({"X-API-Key": raw}, {"Authorization": b"Bearer " + raw}):
            assert httpx.get(url + "/info", headers=header).status_code == 200, header
        wrong = "ключ-🔑-secreT".encode()
        for header in ({"X-API-Key": wrong}, {"Authorization": b"Bearer " + wrong}):
            assert httpx.get(url + "/info", headers=header).status_code == 401, header


def test_head_health_is_200(client: httpx.Client, app_client: Any) -> None:
    for c in (client, app_client):
        r = c.head("/health")
        assert r.status_code == 200 and r.content == b"", r


def test_an_unresolvable_host_says_so(built: Path) -> None:
    with pytest.raises(FlowsearchError) as info:
        serve(built, host="no.such.host.invalid", port=_free_port())
    said = str(info.value)
    assert "cannot resolve host 'no.such.host.invalid'" in said and "port" not in said


def test_the_docs_examples_answer_and_errors_are_documented(built: Path) -> None:
    from fastapi.testclient import TestClient

    with TestClient(create_app(built, api_key=KEY), raise_server_exceptions=False) as c:
        doc = c.get("/openapi.json").json()
        schemas = doc["components"]["schemas"]
        (example,) = schemas["SearchRequest"]["examples"]
        assert c.post("/search", json=example, headers=AUTH).status_code == 200
        for name in ("UpsertRequest", "DeleteRequest"):
            for body in schemas[name]["examples"]:  # valid bodies (the index may lack the id)
                (UpsertRequest if name == "UpsertRequest" else DeleteRequest).model_validate(body)
        paths = doc["paths"]
        for path, statuses in (("/search", {"400", "401", "413", "422"}),
                               ("/upsert", {"400", "401", "409", "413", "422"}),
                               ("/delete", {"400", "401", "409", "413", "422"})):  # fmt: skip
            responses = paths[path]["post"]["responses"]
            assert statuses <= set(responses), (path, sorted(responses))
            detail = responses["400"]["content"]["application/json"]["schema"]["$ref"]
            assert detail.endswith("/ErrorDetail")
        assert "401" in paths["/info"]["get"]["responses"]
    with TestClient(create_app(built), raise_server_exceptions=False) as open_app:
        assert (
            "401"
            not in open_app.get("/openapi.json").json()["paths"]["/search"]["post"]["responses"]
        )


def test_serve_counts_documents_and_passages(tmp_path: Path, model_dir: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flowsearch.server.run import _holding

    texts = [" ".join(sentences(5, seed=40 + i)) for i in range(4)] + sentences(3, seed=7)
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), tmp_path / "c.pq")
    build_index(tmp_path / "c.pq", tmp_path / "idx", model=str(model_dir), max_length=16)
    s = Searcher.open(tmp_path / "idx")
    try:
        rows = len(s)
        assert rows > len(texts)
        assert _holding(s) == f"{len(texts)} documents ({rows} passages)"
    finally:
        s.close()


def test_the_command_stops_within_a_second_or_two_of_sigterm(built: Path, tmp_path: Path) -> None:
    """The real ``flowsearch serve`` process, stopped by SIGTERM to its pid (killed if it
    overstays: the time box)."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    code = "import sys; from flowsearch.cli import main; sys.exit(main())"
    args = [sys.executable, "-c", code, "serve", "--index", str(built), "--port", str(port)]
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        assert httpx.post(f"http://127.0.0.1:{port}/search", json={"query": "the cat"}).is_success
        os.kill(proc.pid, signal.SIGTERM)
        sent = time.monotonic()
        code_ = proc.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    assert code_ == 0 and "stopped serving" in out, out
    # before: 3-9 s on a loaded 2-core machine (the interpreter's last collection of the heap)
    assert took < 2.5, f"{took:.1f} s from SIGTERM to exit"
