"""The search page's numbers (``flowsearch.search.pictures``) and the routes that serve them and
the page (in-process app; the page in a browser is tests/test_page.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from corpus_helpers import write_corpus

from flowsearch.search.pictures import reference_histogram, space_pictures, spectrum
from flowsearch.search.searcher import Searcher
from flowsearch.space.reference import Reference
from flowsearch.writes.build import build_index
from flowsearch.writes.delete import delete

KEY = "k3y"


@pytest.fixture(scope="module")
def whitened(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("pictures")
    corpus = write_corpus(root / "c.parquet", n=120, seed=3)
    build_index(corpus, root / "idx", model=str(model_dir), calibration="whitening")
    return root / "idx"


# --- the math -------------------------------------------------------------------------------


def test_spectrum_shares_sum_to_one_largest_first_and_mean_cosine_is_pairwise() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(60, 8)) + np.array([3.0] + [0.0] * 7)
    s = spectrum(x)
    shares = np.array(s.shares)
    assert len(shares) == 8 and s.dim == 8 and s.n_rows == 60
    assert shares.sum() == pytest.approx(1.0, abs=1e-5)
    assert np.all(np.diff(shares) <= 1e-9)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = unit @ unit.T
    pairwise = (cos.sum() - np.trace(cos)) / (60 * 59)
    assert s.mean_cosine == pytest.approx(pairwise, abs=1e-5)
    assert 1.0 <= s.effective_dim <= 8.0


def test_spectrum_of_fewer_rows_than_dims_has_one_share_per_row_and_drops_zero_rows() -> None:
    rng = np.random.default_rng(2)
    x = np.vstack([rng.normal(size=(5, 20)), np.zeros((2, 20))])
    s = spectrum(x)
    assert s.n_rows == 5 and len(s.shares) == 5
    assert sum(s.shares) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="no non-zero"):
        spectrum(np.zeros((3, 4)))


def test_reference_histogram_reads_the_stored_percentiles() -> None:
    scores = np.random.default_rng(0).normal(0.5, 0.1, size=400)
    ref = Reference.from_scores(scores, method="leave-one-out", n_corpus=400)
    hist = reference_histogram(ref, bins=10)
    assert hist is not None and len(hist.edges) == 11 and len(hist.shares) == 10
    assert sum(hist.shares) == pytest.approx(100.0, abs=0.01)
    assert hist.edges[0] == pytest.approx(scores.min(), abs=1e-6)
    assert hist.edges[-1] == pytest.approx(scores.max(), abs=1e-6)
    assert hist.cut == pytest.approx(np.percentile(scores, 5), abs=1e-6)
    assert hist.median == pytest.approx(np.median(scores), abs=1e-6)
    # a normal sample: the middle bins hold more than the tails
    assert max(hist.shares[4:6]) > max(hist.shares[0], hist.shares[-1])
    assert reference_histogram(None) is None
    empty = Reference(method="leave-one-out", n_measured=0, n_corpus=1)
    assert reference_histogram(empty) is None


# --- on an index ----------------------------------------------------------------------------


def test_whitening_spreads_the_searched_space_and_the_answer_is_cached(whitened: Path) -> None:
    with _opened(whitened) as s:
        pictures = space_pictures(s.version)
        assert pictures.space == "calibrated" and pictures.version == 1
        assert pictures.n_sampled == pictures.n_live == 120
        assert pictures.raw is not None and pictures.searched is not None
        # the tiny BERT's vectors sit in a cone; whitening spreads them over every direction
        assert pictures.raw.mean_cosine > 0.5 > abs(pictures.searched.mean_cosine)
        assert pictures.searched.effective_dim > 4 * pictures.raw.effective_dim
        assert pictures.raw.shares[0] > 5 * pictures.searched.shares[0]
        assert "whitening" in pictures.space_words
        assert pictures.reference is not None
        assert pictures.reference.n_measured == s.version.reference().n_measured
        assert space_pictures(s.version) is pictures  # cached per version
        small = space_pictures(s.version, sample=50)
        assert small.n_sampled == 50 and small.searched is not None
        assert small.searched.n_rows == 50


def test_deleted_rows_are_not_sampled(tmp_path: Path, whitened: Path) -> None:
    import shutil

    idx = Path(shutil.copytree(whitened, tmp_path / "idx"))
    delete(idx, [f"d{i}" for i in range(0, 120, 3)])
    with _opened(idx) as s:
        pictures = space_pictures(s.version)
        assert pictures.version == 2
        assert pictures.n_live == pictures.n_sampled == 80
        live = np.concatenate(
            [
                np.flatnonzero(~d) if d is not None else np.arange(seg.n_rows)
                for seg, d in zip(s.version.segments, s.version.deleted, strict=True)
            ]
        )
        expected = spectrum(s.version.segments[0].vectors(live))
        assert pictures.searched is not None
        np.testing.assert_allclose(pictures.searched.shares, expected.shares, atol=1e-6)


def test_an_uncalibrated_index_shows_one_space(tmp_path: Path, model_dir: Path) -> None:
    corpus = write_corpus(tmp_path / "c.parquet", n=40, seed=4)
    build_index(corpus, tmp_path / "idx", model=str(model_dir), calibration="none")
    with _opened(tmp_path / "idx") as s:
        pictures = space_pictures(s.version)
        assert pictures.space == "encoder"
        assert pictures.raw is not None and pictures.searched is not None
        # the searched vectors are the raw ones made unit (raw is stored as float16)
        np.testing.assert_allclose(pictures.raw.shares, pictures.searched.shares, atol=1e-3)


class _opened:
    """``with _opened(path) as searcher``: a Searcher closed on exit."""

    def __init__(self, path: Path) -> None:
        self.searcher = Searcher.open(path)

    def __enter__(self) -> Searcher:
        return self.searcher

    def __exit__(self, *exc: object) -> None:
        self.searcher.close()


# --- the routes -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(whitened: Path) -> Iterator[Any]:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from flowsearch.server import create_app

    with TestClient(create_app(whitened, api_key=KEY), raise_server_exceptions=False) as c:
        yield c


def test_space_and_history_need_the_key_and_answer_the_librarys_json(
    client: Any, whitened: Path
) -> None:
    from flowsearch.search.version import index_history

    c = client
    for path in ("/space", "/history"):
        refused = c.get(path)
        assert refused.status_code == 401
        assert "API key" in refused.json()["detail"]
    space = c.get("/space", headers={"X-API-Key": KEY})
    assert space.status_code == 200
    with _opened(whitened) as s:
        assert space.json() == space_pictures(s.version).to_dict()
    history = c.get("/history", headers={"Authorization": f"Bearer {KEY}"})
    assert history.status_code == 200
    assert history.json() == [r.model_dump(mode="json") for r in index_history(whitened)]
    schema = c.get("/openapi.json").json()
    assert {"/space", "/history"} <= set(schema["paths"])


def test_the_page_and_its_files_are_served_without_the_key_and_nothing_else(
    client: Any,
) -> None:
    c = client
    page = c.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert '<input id="q" name="q" type="search"' in page.text
    for name, kind in (("page.js", "text/javascript"), ("page.css", "text/css")):
        got = c.get(f"/static/{name}")
        assert got.status_code == 200 and got.headers["content-type"].startswith(kind)
    # no CDN: every src/href is this server's or a fragment/data URL
    import re

    for url in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert url.startswith(("/", "?", "data:")), url
    for name in ("app.py", "..%2Fapp.py", "index.htm", "missing.js"):
        assert c.get(f"/static/{name}").status_code == 404
