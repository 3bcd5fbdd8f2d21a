"""FAISS factory strings are checked before FAISS sees them (issue 41: ``HNSW1`` segfaulted the
build, ``HNSW0`` aborted it). What crashed FAISS is tried in a subprocess, so a hole here fails
this test instead of killing the test run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from corpus_helpers import write_corpus

from flowsearch.ann import factory as af
from flowsearch.ann.policy import AnnPolicy
from flowsearch.errors import BadInput, FlowsearchError
from flowsearch.writes import build as build_module
from flowsearch.writes.build import build_index

REPO = Path(__file__).resolve().parents[1]

#: Factory strings that crashed the process in FAISS 1.15 (abort 134, segfault 139, SIGFPE 136)
#: or hung it (NSG on a few rows), with what the check says instead.
CRASHERS = [
    ("HNSW0", "HNSW's M must be 2 to 256, got 0"),
    ("HNSW1", "HNSW's M must be 2 to 256, got 1"),
    ("HNSW0_Flat", "HNSW's M"),
    ("IVF4_HNSW1,Flat", "HNSW's M"),
    ("IVF4,Flat,Refine(HNSW1)", "HNSW's M"),
    ("PQ4x0", "the code bits must be 1 to 16, got 0"),
    ("IVF4,PQ4x0", "the code bits"),
    ("RR0,Flat", "RR's output dimension must be 1"),
    ("PCAR0,Flat", "PCA's output dimension must be 1"),
    ("RQ0x8", "sub-quantizers must be 1 to 16, got 0"),
    ("LSQ4x0", "code bits must be 1 to"),
    ("RQ2x30", "code bits must be 1 to"),
    ("NSG32", "unknown part 'NSG32'"),
    ("IVF2(HNSW1),Flat", "unknown part"),
]


@pytest.mark.parametrize(("factory", "message"), CRASHERS, ids=[c[0] for c in CRASHERS])
def test_factories_that_crashed_faiss_are_one_line_errors(factory: str, message: str) -> None:
    with pytest.raises(BadInput, match="rejects index factory") as info:
        af.validate_factory(factory, 16)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_check_factory_and_new_index_refuse_them_before_faiss_sees_them() -> None:
    """In a subprocess: before the check, the first of these killed the interpreter."""
    script = (
        "import json, sys\n"
        "from flowsearch.ann import factory as af\n"
        "from flowsearch.errors import BadInput\n"
        "out = []\n"
        "for f in json.loads(sys.argv[1]):\n"
        "    for call in (lambda: af.check_factory(f, 16), lambda: af.new_index(16, f)):\n"
        "        try:\n"
        "            call()\n"
        "            out.append('built ' + f)\n"
        "        except BadInput as e:\n"
        "            out.append('refused')\n"
        "print(json.dumps(out))\n"
    )
    factories = [f for f, _ in CRASHERS]
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(factories)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert json.loads(done.stdout) == ["refused"] * (2 * len(factories))


@pytest.mark.parametrize(
    ("factory", "dim", "rows", "message"),
    [
        ("", 16, None, "it is empty"),
        ("HNSW257", 16, None, "HNSW's M must be 2 to 256"),
        ("IVF0,Flat", 16, None, "IVF's nlist must be 1 to"),
        ("IVF2000000,Flat", 16, None, "IVF's nlist must be 1 to"),
        ("IVF64,Flat", 16, 10, "more than the 10 rows"),
        ("PQ5", 16, None, "multiple of"),
        ("PQ32", 16, None, "sub-quantizers must be 1 to 16"),
        ("PQ4x17", 16, None, "code bits must be 1 to 16"),
        ("PQ4x8fs", 16, None, "fast-scan PQ codes are 4 bits"),
        ("PCA32,Flat", 16, None, "PCA's output dimension must be 1 to 16"),
        ("OPQ3_16,PQ4", 16, None, "not a multiple of its 3"),
        ("IVF4,IVF4,Flat", 16, None, "'IVF4' is out of place"),
        ("Flat,PCA8", 16, None, "'PCA8' is out of place"),
        ("IVF4", 16, None, "names no encoding"),
        ("Refine(Flat", 16, None, "parentheses"),
        ("HNSW" + "9" * 5000, 16, None, "is too large"),
        (" Flat", 16, None, "unknown part ' Flat'"),
        # found by the fuzz suite: more stages than dimensions hung FAISS's training (> 30 s)
        ("PCA8,RQ32x3,Refine(PQ8)", 16, None, "sub-quantizers must be 1 to 8, got 32"),
        ("RR1,RQ32x8,Refine(Flat)", 16, None, "sub-quantizers must be 1 to 1, got 32"),
    ],
)
def test_parameters_out_of_range_are_refused(
    factory: str, dim: int, rows: int | None, message: str
) -> None:
    with pytest.raises(BadInput, match="rejects index factory") as info:
        af.validate_factory(factory, dim, rows)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "factory",
    ["auto", "Flat", "HNSW2", "HNSW32", "HNSW32_PQ4", "IVF1,Flat", "IVF1024,PQ48,RFlat",
     "PQ4x4fs", "OPQ4_16,IVF4,PQ4", "PCAR8,HNSW16", "SQ8", "RaBitQfs,RFlat", "L2norm,Flat",
     "IVF4,Flat,Refine(SQfp16)", "IDMap,Flat", "IMI2x4,PQ4", "RQ2x8", "LSQ2x4"],
)  # fmt: skip
def test_the_grammar_takes_what_flowsearch_builds(factory: str) -> None:
    dim = 384 if factory == "IVF1024,PQ48,RFlat" else 16
    af.validate_factory(factory, dim)


def test_a_graph_factory_is_checked_at_build_start(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A corpus far below flat_max_rows never needs the graph: the check came only when one was
    built (a later, larger write), after the work; now before any encoding."""

    def no_encoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("encoded before the graph factory was checked")

    monkeypatch.setattr(build_module, "_encode_pass", no_encoding)
    corpus = write_corpus(tmp_path / "c.parquet", n=20, seed=1)
    for graph, message in [("HNSW1", "HNSW's M must be 2"), ("PQ5", "multiple of")]:
        with pytest.raises(FlowsearchError, match=message) as info:
            build_index(corpus, tmp_path / "idx", model=str(model_dir),
                        ann=AnnPolicy(graph_factory=graph))  # fmt: skip
        assert "\n" not in str(info.value)
    assert not (tmp_path / "idx").exists()


def test_the_cli_refuses_hnsw1_with_exit_2(tmp_path: Path, model_dir: Path) -> None:
    corpus = write_corpus(tmp_path / "c.parquet", n=20, seed=2)
    cmd = [sys.executable, "-c", "import sys; from flowsearch.cli import main; sys.exit(main())"]
    done = subprocess.run(
        [*cmd, "index", str(corpus), "--index", str(tmp_path / "idx"), "--model",
         str(model_dir), "--index-factory", "HNSW1"],
        capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    assert "HNSW's M must be 2 to 256" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0
