"""A query imports torch only when its encoder needs it (issues 24, 25).

A cold ``flowsearch query`` on a static-table or ONNX index spent 3.4-4.2 s importing torch to
load the index's flow calibrator (``benchmarks/RESULTS.md``, "Cold single query"). A saved flow
now loads straight into its frozen numpy form: these tests open such indexes in a fresh
interpreter, query them, and check which heavy libraries that loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from corpus_helpers import write_corpus

from flowsearch import build_index
from flowsearch.storage import manifest as mf

ROOT = Path(__file__).resolve().parents[1]
#: Libraries a query must not import unless its encoder runs on them (scipy: 0.25 s of a cold
#: query, once pulled in by bm25s for its stopword list and by the static table's sparse mean).
HEAVY = ("torch", "transformers", "sentence_transformers", "sklearn", "onnxruntime", "scipy")

QUERY = r"""
import json, sys
from flowsearch import Searcher
searcher = Searcher.open(sys.argv[1])
result = searcher.query("the cat sat by the river", k=3)
_, log_density = searcher.embed(["the cat sat by the river"])
print(json.dumps({
    "hits": [hit.id for hit in result.hits],
    "log_density": None if log_density is None else float(log_density[0]),
    "loaded": {name: name in sys.modules for name in sys.argv[2].split(",")},
}))
"""


def query_in_fresh_process(index: Path, cache: Path) -> dict:
    """Opens ``index`` in a new interpreter, runs one query; its hits, the query's
    log-density and which of :data:`HEAVY` were imported."""
    done = subprocess.run(
        [sys.executable, "-c", QUERY, str(index), ",".join(HEAVY)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "FLOWSEARCH_CACHE": str(cache)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _build(root: Path, model_dir: Path, rows: int, **options) -> Path:
    corpus = write_corpus(root / f"corpus_{rows}.parquet", rows)
    index = root / "index"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWSEARCH_CACHE", str(root / "cache"))  # an ONNX export lands here
        build_index(corpus, index, model=str(model_dir), **options)
    return index


#: case -> (rows, build_index options, the calibrator and space the manifest must name).
#: 60 rows are under auto's 3 rows per dimension (dim 32): auto keeps the encoder's space and
#: fits a whitening-flow for the density, as it does on the 300-passage sample corpus.
CASES = {
    "static-auto": (60, {"pooling": "static"}, "whitening-flow", "encoder"),
    "static-flow": (120, {"pooling": "static", "calibration": "flow"}, "flow", "calibrated"),
    "onnx-auto": (60, {"backend": "onnx"}, "whitening-flow", "encoder"),
    # no options: the default encoder on a CPU is ONNX Runtime fp32 (issue 44)
    "default": (60, {}, "whitening-flow", "encoder"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_query_on_a_flow_index_loads_no_torch(case, tmp_path, model_dir):
    rows, options, calibrator, space = CASES[case]
    runs_onnx = options.get("pooling") != "static"
    if runs_onnx:
        pytest.importorskip("onnxruntime")
    index = _build(tmp_path, model_dir, rows, **options)
    calibration = mf.read(index).calibration
    assert (calibration.calibrator, calibration.space) == (calibrator, space)

    seen = query_in_fresh_process(index, tmp_path / "cache")

    assert len(seen["hits"]) == 3
    assert seen["log_density"] is not None and abs(seen["log_density"]) < 1e6  # the flow ran
    loaded = seen.pop("loaded")
    assert loaded.pop("onnxruntime") == runs_onnx, loaded
    assert not any(loaded.values()), loaded  # torch, transformers, ...


LOAD = r"""
import json, sys, tempfile
import numpy as np
from flowsearch.calibration import load_calibrator, make_calibrator
make_calibrator("flow"), make_calibrator("whitening-flow")
cal = load_calibrator(sys.argv[1])
U = np.random.default_rng(0).normal(size=(5, cal.dim_in))
z, lp = cal.transform_and_log_prob(U)
back = cal.inverse(cal.transform(U))
assert np.isfinite(lp).all() and np.abs(back - U).max() < 1e-4
again = tempfile.mkdtemp()
cal.save(again)
assert (load_calibrator(again).log_prob(U) == cal.log_prob(U)).all()
before = "torch" in sys.modules
cal.module  # the trainable form: asked for, so torch comes
print(json.dumps({"before": before, "after": "torch" in sys.modules}))
"""


@pytest.mark.parametrize("case", ["flow", "whitening-flow"])
def test_loading_running_and_saving_a_flow_imports_no_torch(case, tmp_path):
    folder = ROOT / "tests" / "assets" / "calibrators" / case
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(folder)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"before": False, "after": True}


def test_the_stopwords_kept_here_are_bm25s_list():
    """The tokeniser keeps its own copy of the list (importing bm25s pulled scipy.sparse into
    every cold query); it must stay the list the lexical side was built and checked with."""
    from bm25s.stopwords import STOPWORDS_EN

    from flowsearch.lexical import tokens

    assert tuple(STOPWORDS_EN) == tokens.STOPWORDS_EN
    done = subprocess.run(
        [sys.executable, "-c", "import sys, flowsearch.cli; print('bm25s' in sys.modules, "
         "'flowsearch.writes.build' in sys.modules)"],
        capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.stdout.split() == ["False", "False"], done.stderr[-2000:]
