"""The encode package's boundaries: what it imports, and what a query through it loads."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ENCODE = Path(__file__).resolve().parents[1] / "flowsearch" / "encode"
#: Layer 0: all that encode may import of ours, besides itself (docs/ARCHITECTURE.md).
BASE = {"flowsearch.errors", "flowsearch.settings", "flowsearch.progress", "flowsearch.atomic"}


def _our_imports(path: Path) -> set[str]:
    """Every flowsearch module a file imports, at any depth (functions and TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] == "flowsearch"}


@pytest.mark.parametrize("path", sorted(ENCODE.glob("*.py")), ids=lambda p: p.name)
def test_encode_imports_only_itself_and_the_base_modules(path):
    upward = {
        m for m in _our_imports(path) if not m.startswith("flowsearch.encode") and m not in BASE
    }
    assert not upward, f"{path.name} imports {sorted(upward)}"


def _modules_after(code: str, env: dict[str, str] | None = None) -> dict[str, bool]:
    """Runs ``code`` in a fresh interpreter; which heavy modules it left loaded."""
    probe = code + (
        "\nimport json, sys\n"
        "print(json.dumps({m: m in sys.modules for m in "
        "('torch', 'transformers', 'onnxruntime', 'scipy')}))"
    )
    root = str(ENCODE.parents[1])
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={"PYTHONPATH": root, "HF_HUB_OFFLINE": "1", **(env or {})},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_encoder_loads_no_framework():
    loaded = _modules_after("import flowsearch.encode.encoder")
    assert not any(loaded.values()), loaded


def test_a_static_query_loads_neither_torch_nor_transformers(tiny_model_dir):
    loaded = _modules_after(
        "from flowsearch.encode.encoder import Encoder\n"
        f"v = Encoder({str(tiny_model_dir)!r}, pooling='static').encode(['the cat sat'])\n"
        "assert v.shape == (1, 32) and abs(v).sum() > 0"
    )
    assert not loaded["torch"] and not loaded["transformers"], loaded


def test_a_cached_onnx_query_loads_neither_torch_nor_transformers(tiny_model_dir, tmp_path):
    pytest.importorskip("onnxruntime")
    make = (
        "from flowsearch.encode.encoder import Encoder\n"
        f"enc = Encoder({str(tiny_model_dir)!r}, backend='onnx', quantize='int8')\n"
        "print('exported', enc._onnx[()].exported)\n"
        "assert enc.encode(['the cat sat']).shape == (1, 32)"
    )
    env = {"FLOWSEARCH_CACHE": str(tmp_path)}
    first = _modules_after(make, env)  # exports: needs torch
    assert first["torch"] and first["onnxruntime"]
    again = _modules_after(make, env)  # from the cache
    assert again["onnxruntime"] and not again["torch"] and not again["transformers"], again


def test_the_default_encoder_queries_without_torch_once_exported(tiny_model_dir, tmp_path):
    """``Encoder()`` on a CPU runs ONNX Runtime: the first one exports (torch), every later
    process reads the cached graph and the tokenizer, nothing else (issue 44)."""
    pytest.importorskip("onnxruntime")
    make = (
        "from flowsearch.encode.encoder import Encoder\n"
        f"enc = Encoder({str(tiny_model_dir)!r})\n"
        "assert enc.backend == 'onnx' and enc.encode(['the cat sat']).shape == (1, 32)"
    )
    env = {"FLOWSEARCH_CACHE": str(tmp_path)}
    assert _modules_after(make, env)["torch"]  # the export
    again = _modules_after(make, env)
    assert again["onnxruntime"] and not again["torch"] and not again["transformers"], again
