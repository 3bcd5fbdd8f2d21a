"""``serve --root``: many indexes behind one server, and ``GET /metrics`` (in-process TestClient).

One root holds two small indexes built with the tiny test BERT; each test serves a copy of it,
so builds and writes never leak between tests.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from corpus_helpers import write_corpus
from fastapi.testclient import TestClient

from flowsearch.cli import main
from flowsearch.search import timings
from flowsearch.server import create_app
from flowsearch.server.indexes import check_name
from flowsearch.writes.build import build_index
from flowsearch.writes.upsert import upsert

KEY = "root-key"
AUTH = {"X-API-Key": KEY}


@pytest.fixture(scope="module")
def built_root(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("root") / "indexes"
    for name, seed in (("alpha", 1), ("beta", 2)):
        corpus = write_corpus(root.parent / f"{name}.parquet", n=30, seed=seed, id_prefix=name)
        build_index(corpus, root / name, model=str(model_dir), calibration="none")
    (root / "not-an-index").mkdir()
    (root / "notes.txt").write_text("not an index")
    return root


@pytest.fixture
def root(built_root: Path, tmp_path: Path) -> Path:
    shutil.copytree(built_root, tmp_path / "indexes")
    return tmp_path / "indexes"


@pytest.fixture
def client(root: Path) -> TestClient:
    with TestClient(create_app(root=root, api_key=KEY)) as c:
        yield c


def test_lists_and_searches_every_index(client: TestClient) -> None:
    listed = client.get("/indexes", headers=AUTH).json()
    assert [e["name"] for e in listed] == ["alpha", "beta"]
    assert {e["rows"] for e in listed} == {30} and {e["mode"] for e in listed} == {"hybrid"}
    assert not any(e["open"] for e in listed) and listed[0]["model"].endswith("tiny_bert")
    for name in ("alpha", "beta"):
        hits = client.post(f"/indexes/{name}/search", json={"query": "the river", "k": 3},
                           headers=AUTH).json()["hits"]  # fmt: skip
        assert len(hits) == 3 and all(h["id"].startswith(name) for h in hits)
        assert client.get(f"/indexes/{name}/info", headers=AUTH).json()["n_live"] == 30
    assert all(e["open"] for e in client.get("/indexes", headers=AUTH).json())
    assert client.get("/health").json() == {"status": "ok", "indexes": 2, "rows": 60}


def test_writes_go_to_the_named_index(client: TestClient) -> None:
    up = client.post("/indexes/alpha/upsert", json={"records": [{"id": "n1", "text": "tides"}]},
                     headers=AUTH)  # fmt: skip
    assert up.status_code == 200 and up.json()["n_inserted"] == 1
    gone = client.post("/indexes/beta/delete", json={"ids": ["beta0", "nope"]}, headers=AUTH)
    assert gone.json()["n_deleted"] == 1 and gone.json()["missing"] == ["nope"]
    rows = {e["name"]: e["rows"] for e in client.get("/indexes", headers=AUTH).json()}
    assert rows == {"alpha": 31, "beta": 29}
    history = client.get("/indexes/alpha/history", headers=AUTH).json()
    assert [r["kind"] for r in history] == ["build", "upsert"]


def test_builds_a_new_index(client: TestClient, root: Path) -> None:
    records = [{"id": f"g{i}", "text": f"gamma text number {i}"} for i in range(6)]
    body = {"records": records, "like": "alpha", "calibration": "none"}
    made = client.post("/indexes/gamma", json=body, headers=AUTH)
    assert made.status_code == 201 and made.json()["n_written"] == 6
    hits = client.post("/indexes/gamma/search", json={"query": "gamma", "k": 2}, headers=AUTH)
    assert [h["id"][0] for h in hits.json()["hits"]] == ["g", "g"]
    again = client.post("/indexes/gamma", json=body, headers=AUTH)
    assert again.status_code == 409 and "already exists" in again.json()["detail"]
    taken = client.post("/indexes/alpha", json=body, headers=AUTH)
    assert taken.status_code == 409
    no_key = client.post("/indexes/delta", json=body)
    assert no_key.status_code == 401 and not (root / "delta").exists()
    bad = client.post("/indexes/delta", json={**body, "calibration": "bogus"}, headers=AUTH)
    assert bad.status_code == 400 and not (root / "delta").exists()


def test_an_index_made_elsewhere_is_served_without_restart(client: TestClient, root: Path) -> None:
    assert (
        client.post("/indexes/later/search", json={"query": "x"}, headers=AUTH).status_code == 404
    )
    shutil.copytree(root / "beta", root / "later")
    found = client.post("/indexes/later/search", json={"query": "river"}, headers=AUTH)
    assert found.status_code == 200 and found.json()["hits"]


@pytest.mark.parametrize(
    ("name", "status"),
    [(".hidden", 400), ("a b", 400), ("x" * 101, 400), ("not-an-index", 404), ("notes.txt", 404),
     ("missing", 404), ("..", 404), ("%2e%2e", 400)],
)  # fmt: skip
def test_names_are_checked(client: TestClient, name: str, status: int) -> None:
    answer = client.post(f"/indexes/{name}/search", json={"query": "x"}, headers=AUTH)
    assert answer.status_code == status
    detail = answer.json()["detail"]
    assert "\n" not in detail and "Traceback" not in detail
    if name in ("missing", ".."):
        return
    made = client.post(f"/indexes/{name}", json={"records": [{"id": "1", "text": "t"}]},
                       headers=AUTH)  # fmt: skip
    assert made.status_code == (409 if status == 404 else 400)  # taken by a non-index: 409


def test_a_link_out_of_the_root_is_refused(client: TestClient, root: Path, tmp_path: Path) -> None:
    shutil.copytree(root / "alpha", tmp_path / "outside")
    os.symlink(tmp_path / "outside", root / "escape")
    os.symlink(root / "alpha", root / "alias")  # a link inside the root is an index like another
    answer = client.post("/indexes/escape/search", json={"query": "x"}, headers=AUTH)
    assert answer.status_code == 400 and "outside" not in answer.json()["detail"]
    assert "link leading out" in answer.json()["detail"]
    assert (
        client.post("/indexes/alias/search", json={"query": "x"}, headers=AUTH).status_code == 200
    )
    assert "escape" not in [e["name"] for e in client.get("/indexes", headers=AUTH).json()]


def test_check_name() -> None:
    assert check_name("news_2024.v2") == "news_2024.v2"
    for bad in ("", ".", "..", "a/b", "-x"[1:] + "/", "é"):
        with pytest.raises(ValueError, match="not an index name"):
            check_name(bad)


def test_openapi_and_single_index_routes(root: Path) -> None:
    with TestClient(create_app(root=root, api_key=KEY)) as c:
        documented = c.get("/openapi.json").json()["paths"]
    paths = set(documented)
    # each route's error statuses are documented, as the single index's routes have theirs
    for path, method, statuses in (
        ("/indexes", "get", {"401"}),
        ("/indexes/{name}", "post", {"400", "401", "404", "409", "413", "422"}),
        ("/indexes/{name}/search", "post", {"400", "401", "404", "413", "422"}),
        ("/indexes/{name}/upsert", "post", {"400", "401", "404", "409", "413", "422"}),
        ("/indexes/{name}/info", "get", {"400", "401", "404"}),
    ):
        responses = documented[path][method]["responses"]
        assert statuses <= set(responses), (path, sorted(responses))
        assert responses["401"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ErrorDetail"
        )
    assert "name exists" in documented["/indexes/{name}"]["post"]["responses"]["409"]["description"]
    assert {"/indexes", "/indexes/{name}", "/indexes/{name}/search", "/indexes/{name}/upsert",
            "/indexes/{name}/delete", "/indexes/{name}/info", "/metrics"} <= paths  # fmt: skip
    assert "/search" not in paths
    with TestClient(create_app(root / "alpha")) as c:
        paths = set(c.get("/openapi.json").json()["paths"])
        assert c.get("/indexes").status_code == 404
    assert {"/search", "/upsert", "/delete", "/info", "/metrics"} <= paths
    assert not any(p.startswith("/indexes") for p in paths)


def _value(text: str, name: str, **labels: str) -> float:
    """A sample's value in the Prometheus text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def test_metrics(client: TestClient, root: Path) -> None:
    for mode in ("dense", "hybrid", "lexical"):
        client.post("/indexes/alpha/search", json={"query": "river", "mode": mode}, headers=AUTH)
    bad = client.post("/indexes/alpha/search", json={"query": "x", "where": "nope ="},
                      headers=AUTH)  # fmt: skip
    assert bad.status_code == 400
    client.post("/indexes/alpha/upsert", json={"records": [{"id": "m", "text": "t"}]},
                headers=AUTH)  # fmt: skip
    upsert(root / "alpha", [{"id": "m2", "text": "another process"}])  # picked up by a refresh
    client.app.state.services[0]._checked = float("-inf")  # look now, not in a second
    client.post("/indexes/alpha/search", json={"query": "river", "mode": "dense"}, headers=AUTH)
    assert client.get("/metrics").status_code == 401
    scraped = client.get("/metrics", headers=AUTH)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    text = scraped.text
    count = "flowsearch_searches_total"
    assert _value(text, count, index="alpha", mode="dense", status="200") == 2
    assert _value(text, count, index="alpha", mode="lexical", status="200") == 1
    assert _value(text, count, index="alpha", mode="hybrid", status="400") == 1
    assert _value(text, "flowsearch_writes_total", index="alpha", kind="upsert", status="200") == 1
    assert _value(text, "flowsearch_search_seconds_count", index="alpha", mode="hybrid") == 1
    stage = "flowsearch_stage_seconds_count"
    assert _value(text, stage, index="alpha", stage="encode") == 3  # lexical encodes nothing
    assert _value(text, stage, index="alpha", stage="fuse") == 1
    assert _value(text, stage, index="alpha", stage="search") == 4
    assert _value(text, "flowsearch_refreshes_total", index="alpha") == 2
    assert _value(text, "flowsearch_rows", index="alpha") == 32
    assert _value(text, "flowsearch_segments", index="alpha") >= 1
    assert _value(text, "flowsearch_version", index="alpha") == 3
    assert "beta" not in text  # never opened: nothing counted, no gauge


def test_metrics_of_one_index_and_apps_apart(root: Path) -> None:
    apps = [create_app(root / "alpha"), create_app(root / "alpha")]
    with TestClient(apps[0]) as one, TestClient(apps[1]) as two:
        one.post("/search", json={"query": "river"})
        assert _value(one.get("/metrics").text, "flowsearch_searches_total", index="alpha",
                      mode="hybrid", status="200") == 1  # fmt: skip
        assert "flowsearch_searches_total{" not in two.get("/metrics").text


def test_timings_are_collected_only_when_asked(root: Path) -> None:
    from flowsearch.search.searcher import Searcher

    searcher = Searcher.open(root / "alpha")
    try:
        with timings.collect() as seconds:
            searcher.search("river", mode="hybrid")
        assert {"encode", "search", "fuse", "rows"} <= set(seconds)
        assert all(v >= 0 for v in seconds.values())
        searcher.search("river")  # nobody collecting: nothing recorded anywhere
        assert len(seconds) == 4
    finally:
        searcher.close()


def test_cli_root_refusals(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--root", str(root / "nothing"), "--port", "8765"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: no directory at") and "Traceback" not in err
    code = main(["serve", "--root", str(root), "--index", str(root / "alpha")])
    assert code == 2 and "not both" in capsys.readouterr().err


def test_serve_root_stops_in_one_line_on_a_port_in_use(root: Path) -> None:
    import socket

    from flowsearch.errors import BadInput
    from flowsearch.server import serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(BadInput, match="cannot listen"):
            serve(root=root, port=int(taken.getsockname()[1]))
