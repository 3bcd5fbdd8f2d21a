"""Fuzzed ``/search`` bodies (JSON of random shapes and types, and filters from the filter
fuzz's grammar) against the app in-process: never a 500, a 4xx carries one line, and the server
answers an ordinary filtered search after each."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from corpus_helpers import write_corpus
from hypothesis import given, settings
from hypothesis import strategies as st

from flowsearch.search.options import SearchOptions
from flowsearch.server import create_app
from flowsearch.writes.build import build_index
from fuzz.fuzz_limits import FILTER_MEMORY, FILTER_TIMEOUT
from fuzz.test_fuzz_filters import WHERES

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                       children, max_size=4),
    max_leaves=10,
)  # fmt: skip
FIELDS = {
    "query": st.one_of(st.text(max_size=30), st.lists(st.text(max_size=10), max_size=3), JSON),
    "k": st.one_of(st.integers(-5, 10**6), JSON),
    "where": st.one_of(WHERES, JSON),
    "mode": st.one_of(st.sampled_from(["dense", "lexical", "hybrid", "nope"]), JSON),
    "min_score": st.one_of(st.floats(allow_nan=True), JSON),
}
BODIES = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"query": st.text(min_size=1, max_size=20)},
        optional={k: v for k, v in FIELDS.items() if k != "query"},
    ),
    st.dictionaries(st.sampled_from([*FIELDS, "extra"]), JSON, max_size=5),
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    root = tmp_path_factory.mktemp("fuzz-http")
    build_index(write_corpus(root / "c.parquet", n=40, seed=7), root / "idx", model=str(model_dir))
    options = SearchOptions(filter_memory_bytes=FILTER_MEMORY, filter_timeout=FILTER_TIMEOUT)
    with TestClient(create_app(root / "idx", options=options), raise_server_exceptions=False) as c:
        yield c


@settings(parent=settings.get_profile("fuzz"), max_examples=120)
@given(body=BODIES)
def test_fuzzed_search_bodies_are_answers_or_one_line_4xx(client: Any, body: Any) -> None:
    r = client.post(
        "/search", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert r.status_code < 500, (body, r.status_code, r.text[:300])
    if r.status_code >= 400:
        detail = r.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail and "Traceback" not in detail
    ordinary = client.post("/search", json={"query": "tide", "k": 2, "where": "year >= 1990"})
    assert ordinary.status_code == 200 and ordinary.json()["hits"], ordinary.text
