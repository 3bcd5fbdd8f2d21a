"""Retake docs/images/search-page.png: the search page over data/sample.parquet, as it is now.

Builds the sample index with the bundled model (unless ``--index`` names one), serves it in a
thread, and has Debian's Chromium (Playwright) screenshot the answer to the README's query.

    $ HF_HUB_OFFLINE=1 python docs/images/search_page.py [--index DIR]
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parents[2]
QUERY = {"q": "why do tides happen twice a day", "k": "4"}
VIEWPORT = {"width": 1000, "height": 1240}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, help="an index of data/sample.parquet")
    parser.add_argument("--out", type=Path, default=REPO / "docs/images/search-page.png")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        index = args.index
        if index is None:
            from flowsearch.writes.build import build_index

            index = Path(tmp) / "sample_index"
            build_index(REPO / "data/sample.parquet", index)
        shoot(index, args.out, args.chromium)


def shoot(index: Path, out: Path, chromium: str) -> None:
    import uvicorn
    from playwright.sync_api import sync_playwright

    from flowsearch.server import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = uvicorn.Config(create_app(index), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"http://127.0.0.1:{port}/?{urlencode(QUERY)}")
            page.locator("#hits > li").first.wait_for()
            page.locator("#query-place line.query").wait_for(state="attached")
            page.screenshot(path=str(out))
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    _small(out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")


def _small(png: Path) -> None:
    """The screenshot in 256 colours (a page of flat colours: it reads the same, a third the
    bytes), when Pillow is there."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(png) as image:
        small = image.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE)
    small.save(png, optimize=True)


if __name__ == "__main__":
    main()
