"""The package's layers: every import goes down (docs/ARCHITECTURE.md), none goes in a circle.

The imports are read from the source (every ``import`` and ``from ... import``, at any depth,
including the ones inside functions and under ``TYPE_CHECKING``), so a lazy import cannot hide
an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flowsearch"

#: Each top-level part of the package and its layer (docs/ARCHITECTURE.md); a module may import
#: only parts of a strictly lower layer, or modules of its own part.
LAYERS = {
    "_version": 0,
    "errors": 0,
    "settings": 1,  # a shim saying where the fourth release's settings went
    "atomic": 0,
    "progress": 0,
    "jsonable": 0,
    "encode": 1,
    "calibration": 1,
    "ingest": 1,
    "storage": 2,
    "space": 3,
    "ann": 3,
    "lexical": 3,
    "search": 4,
    "writes": 5,
    "evaluation": 6,
    "server": 6,
    "integrations": 6,
    "cli": 7,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, module: str) -> set[str]:
    """The package's modules (or the package face) that ``module`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            names = [f"{base}.{a.name}" for a in node.names]
            modules = [n for n in names if n in _ALL]
            found.update(modules if modules else [base])
    return {name for name in found if name == "flowsearch" or name.startswith("flowsearch.")}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


MODULES = _modules()
_ALL = set(MODULES)
GRAPH = {m: {i for i in _imports(p, m) if i in MODULES} for m, p in MODULES.items()}


def test_every_part_has_a_layer():
    parts = {_part(m) for m in MODULES} - {None, "__main__"}
    assert parts <= set(LAYERS), sorted(parts - set(LAYERS))


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _part(m)))
def test_imports_only_go_down(module):
    part = _part(module)
    assert part is not None
    upward = []
    for target in sorted(GRAPH[module]):
        other = _part(target)
        # the package face imports everything, so nothing may import it
        face = target == "flowsearch"
        if face or (other is not None and other != part and LAYERS[other] >= LAYERS[part]):
            upward.append(target)
    assert not upward, f"{module} imports {upward} (layer {LAYERS[part]})"


def test_no_import_cycles():
    seen: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        seen[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if nxt == node:
                continue
            if seen.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in seen:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        seen[node] = 2
        return None

    for module in sorted(GRAPH):
        if module not in seen and module != "flowsearch":
            cycle = visit(module)
            assert cycle is None, " -> ".join(cycle)
