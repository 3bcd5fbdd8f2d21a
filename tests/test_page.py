"""The search page (``/``) in a real browser: Debian's Chromium driven by Playwright.

One uvicorn server in a thread (the real app, with an API key) over a small index built with
the tiny test BERT and a whitening calibration (so the spectra before and after differ), and
one headless Chromium for the module. Each test saves a screenshot of what it checked under its
``tmp_path``. Skipped in one line when playwright or Chromium is not installed (``.ci/run``
installs Chromium).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from corpus_helpers import sentences, write_corpus

from flowsearch.search.searcher import Searcher
from flowsearch.server import create_app
from flowsearch.writes.build import build_index

CHROMIUM = os.environ.get("FLOWSEARCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KEY = "page-key"
TIMEOUT_MS = 15_000
#: Rows of the test corpus: over 3 per dimension of the tiny BERT (32), so whitening is trusted.
N_ROWS = 120

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
    pytest.skip(f"no Chromium at {CHROMIUM}", allow_module_level=True)

expect = sync_api.expect


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("page")
    corpus = write_corpus(root / "c.parquet", n=N_ROWS, seed=5)
    build_index(corpus, root / "idx", model=str(model_dir), calibration="whitening")
    return root / "idx"


@pytest.fixture(scope="module")
def server(index_dir: Path) -> Iterator[str]:
    """The app on a free port of 127.0.0.1, in a thread; stopped at the end of the module."""
    yield from _serving(index_dir)


#: Long documents: a window of 14 tokens, so a few sentences are cut into passages.
LONG_DOCUMENTS = [" ".join(s + "." for s in sentences(6, seed=300 + i)) for i in range(8)]


@pytest.fixture(scope="module")
def long_index(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("page_long")
    records = [{"id": f"L{i}", "text": t} for i, t in enumerate(LONG_DOCUMENTS)]
    pq.write_table(pa.Table.from_pylist(records), root / "c.parquet")
    build_index(root / "c.parquet", root / "idx", model=str(model_dir), max_length=16)
    return root / "idx"


@pytest.fixture(scope="module")
def long_server(long_index: Path) -> Iterator[str]:
    yield from _serving(long_index)


@pytest.fixture(scope="module")
def root_server(index_dir: Path, long_index: Path) -> Iterator[str]:
    """A server of a root holding copies of both indexes (``main`` and ``long``)."""
    root = index_dir.parent / "root"
    shutil.copytree(index_dir, root / "main")
    shutil.copytree(long_index, root / "long")
    yield from _serving(None, root=root)


def _serving(index_dir: Path | None, root: Path | None = None) -> Iterator[str]:
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    app = create_app(index_dir, api_key=KEY, root=root)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not instance.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield url
    instance.should_exit = True
    thread.join(timeout=30)
    assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=60_000
        )
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield tab
    context.close()
    # the 400s and 401s a test provokes on purpose are logged by the browser as failed loads
    provoked = ("status of 400", "status of 401")
    assert not [e for e in errors if not any(p in e for p in provoked)], errors


def _open(page: Any, server: str, query: str = "") -> None:
    page.goto(f"{server}/{query}#key={KEY}")


def _search(page: Any, text: str) -> None:
    page.fill("#q", text)
    page.press("#q", "Enter")


TEXTS = sentences(N_ROWS, 5)


def _words(index_dir: Path, query: str, **options: Any) -> str:
    """The library's report on ``query``, in words (what the page must say)."""
    searcher = Searcher.open(index_dir)
    try:
        report = searcher.query(query, k=10, **options).report
        assert report is not None
        return str(report.to_words())
    finally:
        searcher.close()


def test_typing_a_passage_finds_it_first_with_its_words_marked_and_bars(
    page: Any, server: str, index_dir: Path, tmp_path: Path
) -> None:
    _open(page, server)
    expect(page.locator("#q")).to_be_focused()
    page.type("#q", TEXTS[17], delay=5)  # search as you type: no Enter
    first = page.locator("#hits > li").first
    expect(first.locator(".hit-id")).to_have_text("d17")
    assert page.locator("#hits > li").count() == 10
    # the words of the query are marked in the text (hybrid: the index default)
    marked = first.locator("mark").all_inner_texts()
    assert marked and all(w.lower() in TEXTS[17].split() for w in marked)
    # three bars with values; metadata shown
    expect(first.locator(".bar-value[data-kind=score]")).not_to_have_text("\u2013")
    expect(first.locator(".bar-value[data-kind=dense]")).to_have_text("1.000")
    expect(first.locator(".bar-value[data-kind=lexical]")).not_to_have_text("\u2013")
    expect(first.locator(".metadata")).to_contain_text("year")
    expect(page.locator("#legend")).to_contain_text("BM25")
    # the report in the library's words, and the query's place among the corpus's best scores
    expect(page.locator("#report")).to_have_text(_words(index_dir, TEXTS[17]))
    expect(page.locator("#query-place line.query")).to_have_count(1)
    # the URL holds the query: loading it again runs it
    assert parse_qs(urlsplit(page.url).query)["q"] == [TEXTS[17]]
    page.screenshot(path=str(tmp_path / "search.png"), full_page=True)
    page.goto(page.url)
    expect(page.locator("#hits > li").first.locator(".hit-id")).to_have_text("d17")
    expect(page.locator("#q")).to_have_value(TEXTS[17])


def test_a_long_document_shows_whole_with_its_best_passage_set_apart(
    page: Any, long_server: str, long_index: Path, tmp_path: Path
) -> None:
    searcher = Searcher.open(long_index)
    try:
        doc = LONG_DOCUMENTS[3]
        hit = next(h for h in searcher.search(doc, k=8, mode="dense") if h.highlight)
        passage = hit.highlight.text if hit.highlight else ""
    finally:
        searcher.close()
    _open(page, long_server, "?" + urlencode({"q": passage, "mode": "dense"}))
    first = page.locator("#hits > li").first
    expect(first.locator(".passage")).to_have_count(1)
    expect(first.locator(".passage")).to_have_text(passage)
    whole = next(t for t in LONG_DOCUMENTS if passage in t)
    expect(first.locator(".text")).to_have_text(whole)  # the whole document, passage in place
    page.screenshot(path=str(tmp_path / "passage.png"), full_page=True)


def test_modes_change_the_scores_shown(page: Any, server: str, tmp_path: Path) -> None:
    _open(page, server)
    _search(page, TEXTS[3])
    expect(page.locator("#hits > li").first.locator(".hit-id")).to_have_text("d3")
    page.select_option("#mode", "lexical")
    first = page.locator("#hits > li").first
    expect(first.locator(".bar-value[data-kind=dense]")).to_have_text("\u2013")
    expect(first.locator(".bar-value[data-kind=lexical]")).not_to_have_text("\u2013")
    expect(first.locator(".hit-id")).to_have_text("d3")
    page.select_option("#mode", "dense")
    expect(first.locator(".bar-value[data-kind=lexical]")).to_have_text("\u2013")
    expect(first.locator(".hit-id")).to_have_text("d3")
    assert first.locator("mark").count() == 0  # no words matched in dense mode
    assert parse_qs(urlsplit(page.url).query)["mode"] == ["dense"]
    page.screenshot(path=str(tmp_path / "dense.png"), full_page=True)


def test_a_filter_applies_and_a_refused_one_says_why(
    page: Any, server: str, tmp_path: Path
) -> None:
    _open(page, server)
    page.fill("#where", "year = 1995")
    _search(page, "the cat and the dog")
    expect(page.locator("#hits > li").first).to_be_visible()
    years = page.locator("#hits .metadata").all_inner_texts()
    assert years and all("1995" in y for y in years)
    assert parse_qs(urlsplit(page.url).query)["where"] == ["year = 1995"]
    # a refused filter: the API's one-line error, shown as an alert, no hits left on screen
    page.fill("#where", "no_such_column = 1")
    page.press("#where", "Enter")
    expect(page.locator("#error")).to_be_visible()
    api = httpx.post(
        f"{server}/search",
        json={"query": "the cat and the dog", "k": 10, "where": "no_such_column = 1"},
        headers={"X-API-Key": KEY},
    )
    assert api.status_code == 400
    expect(page.locator("#error")).to_have_text(api.json()["detail"])
    expect(page.locator("#hits > li")).to_have_count(0)
    page.screenshot(path=str(tmp_path / "refused-filter.png"), full_page=True)


def test_without_the_key_the_page_asks_for_it(page: Any, server: str, tmp_path: Path) -> None:
    page.goto(f"{server}/?q=cat")  # no key in this tab
    expect(page.locator("#error")).to_contain_text("API key")
    expect(page.locator("#key-box")).to_have_attribute("open", "")
    page.fill("#key", KEY)
    page.press("#key", "Enter")
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("#hits > li").first).to_be_visible()
    page.screenshot(path=str(tmp_path / "key.png"))


def test_keyboard_enter_searches_and_arrows_move_through_hits(
    page: Any, server: str, tmp_path: Path
) -> None:
    _open(page, server)
    page.focus("#q")
    page.keyboard.type(TEXTS[40])
    page.keyboard.press("Enter")
    hits = page.locator("#hits > li")
    expect(hits.first.locator(".hit-id")).to_have_text("d40")
    page.keyboard.press("ArrowDown")
    expect(hits.nth(0)).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(hits.nth(1)).to_be_focused()
    page.keyboard.press("ArrowUp")
    expect(hits.nth(0)).to_be_focused()
    page.screenshot(path=str(tmp_path / "keyboard.png"))
    page.keyboard.press("ArrowUp")
    expect(page.locator("#q")).to_be_focused()


def test_index_view_draws_the_spectra_and_the_reference(
    page: Any, server: str, tmp_path: Path
) -> None:
    _open(page, server)
    _search(page, TEXTS[5])
    expect(page.locator("#hits > li").first).to_be_visible()
    page.click("#tab-index")
    expect(page.locator("#index-view")).to_be_visible()
    expect(page.locator("#search-view")).to_be_hidden()
    assert parse_qs(urlsplit(page.url).query)["view"] == ["index"]
    expect(page.locator("#summary")).to_contain_text("whitening")
    expect(page.locator("#segments tbody tr")).to_have_count(1)
    expect(page.locator("#segments tbody td").nth(1)).to_have_text(str(N_ROWS))
    expect(page.locator("#schema tbody")).to_contain_text("year")
    expect(page.locator("#history tbody tr")).to_have_count(1)
    expect(page.locator("#history tbody")).to_contain_text("build")
    # the spectrum: two lines (raw and searched), each with a point per dimension (32)
    raw = page.locator("#spectrum polyline[data-series=raw]")
    searched = page.locator("#spectrum polyline[data-series=searched]")
    expect(raw).to_have_attribute("data-points", "32")
    expect(searched).to_have_attribute("data-points", "32")
    assert raw.get_attribute("points") != searched.get_attribute("points")
    expect(page.locator("#spectrum-caption")).to_contain_text("effective dimension")
    # the reference: bins summing to about 100%, the cut, and the last query's place
    shares = [float(s) for s in page.locator("#reference rect").evaluate_all(
        "rects => rects.map(r => r.dataset.share)")]  # fmt: skip
    assert len(shares) >= 10 and abs(sum(shares) - 100) < 0.5
    expect(page.locator("#reference line.cut")).to_have_count(1)
    expect(page.locator("#reference line.query")).to_have_count(1)
    page.screenshot(path=str(tmp_path / "index.png"), full_page=True)
    # back to the search, as the browser's history has it
    page.go_back()
    expect(page.locator("#search-view")).to_be_visible()


def test_a_phone_width_page_fits_and_works(browser: Any, server: str, tmp_path: Path) -> None:
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True)
    context.set_default_timeout(TIMEOUT_MS)
    try:
        tab = context.new_page()
        _open(tab, server)
        _search(tab, TEXTS[9])
        expect(tab.locator("#hits > li").first.locator(".hit-id")).to_have_text("d9")
        fits = "document.documentElement.scrollWidth <= window.innerWidth"
        assert tab.evaluate(fits)
        tab.screenshot(path=str(tmp_path / "phone-search.png"), full_page=True)
        tab.click("#tab-index")
        expect(tab.locator("#spectrum polyline").first).to_be_visible()
        assert tab.evaluate(fits)
        tab.screenshot(path=str(tmp_path / "phone-index.png"), full_page=True)
    finally:
        context.close()


def test_the_index_picker_of_a_root(browser: Any, root_server: str, tmp_path: Path) -> None:
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        _open(page, root_server, "?index=main")
        picker = page.locator("#index")
        expect(page.locator("#index-picker")).to_be_visible()
        expect(picker.locator("option")).to_have_count(2)
        names = picker.locator("option").all_inner_texts()
        assert names == [f"long ({len(LONG_DOCUMENTS)} documents)", f"main ({N_ROWS} documents)"]
        expect(picker).to_have_value("main")  # the URL's choice
        _search(page, TEXTS[17])
        expect(page.locator("#hits > li").first.locator(".hit-id")).to_have_text("d17")
        picker.select_option("long")
        first = page.locator("#hits > li").first.locator(".hit-id")
        expect(first).to_have_text(re.compile("^L"))
        assert parse_qs(urlsplit(page.url).query)["index"] == ["long"]
        page.click("#tab-index")
        expect(page.locator("#index-view")).to_be_visible()
        expect(page.locator("#summary")).to_contain_text("root/long")
        page.screenshot(path=str(tmp_path / "picker.png"))
        page.go_back()  # the search of "long"
        page.go_back()  # the search of "main"
        expect(picker).to_have_value("main")
    finally:
        context.close()
    assert not errors, errors


def test_one_index_has_no_picker(page: Any, server: str) -> None:
    _open(page, server)
    expect(page.locator("#q")).to_be_focused()
    expect(page.locator("#index-picker")).to_be_hidden()


def test_words_are_marked_as_bm25_counts_them(page: Any, server: str, tmp_path: Path) -> None:
    """The page paints the server's marks: ``run`` in the text for the query ``runs`` (one
    stem), which the page's own word matching missed."""
    assert "runs" not in TEXTS[7].split() and "run" in TEXTS[7].split()
    _open(page, server, "?" + urlencode({"q": "runs door room milk", "mode": "lexical"}))
    hit = page.locator("#hits > li", has=page.locator(".hit-id", has_text="d7")).first
    expect(hit).to_be_visible()
    assert "run" in hit.locator("mark").all_inner_texts()
    page.screenshot(path=str(tmp_path / "stemmed.png"), full_page=True)


def test_sizes_are_in_binary_units(page: Any, server: str) -> None:
    _open(page, server, "?view=index")
    expect(page.locator("#summary")).to_contain_text("iB")
    shown = page.locator("#summary").inner_text() + page.locator("#segments").inner_text()
    assert " MB" not in shown and " KB" not in shown, shown
