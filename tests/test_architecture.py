"""The package's layers: every import (module level or inside a function) goes downward.

A unit is a top-level module or a subpackage of ``ctformer``. Each has a layer; a unit may
import only units of lower layers, so there are no import cycles and no import that climbs up
a layer. Lines of code per module stay readable (one concept a module).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ctformer"

LAYERS = {
    "environment": -2, "fft": -1,
    "backend": 0, "atomic": 0,
    "state": 1, "discretizations": 1, "solvers": 1, "model_inputs": 1,
    "kernels": 2,
    "operators": 3,
    "random_models": 4,
    "model": 5,
    "bridges": 6, "studies": 6, "adjoint": 6,
    "particles": 7,
    "cli": 8, "__main__": 9, "ctformer": 10,
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ctformer"


def _imports():
    """(importing unit, imported unit, file, line) for every ctformer import."""
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("").parts
        module = ".".join(rel if rel[-1] != "__init__" else rel[:-1])
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target == "ctformer" or (node.level and not node.module):
                    targets = [f"{target}.{alias.name}" for alias in node.names]
                else:
                    targets = [target]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target.startswith("ctformer") and _unit(target) != _unit(module):
                    yield _unit(module), _unit(target), path.name, node.lineno


def test_every_import_goes_down_a_layer():
    bad = [f"{src} imports {dst} ({name}:{line})" for src, dst, name, line in _imports()
           if LAYERS.get(dst, 99) >= LAYERS.get(src, -1)]
    assert bad == []


def test_every_unit_has_a_layer():
    units = set()
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        units.add(_unit(".".join(parts[:-1] if parts[-1] == "__init__" else parts)))
    assert units - set(LAYERS) == set()
