"""The package's layers: every import (module level or inside a function) goes downward.

A unit is a top-level module or a subpackage of ``ctformer``. Each has a layer; a unit may
import only units of lower layers, so there are no import cycles and no import that climbs up
a layer. Inside a unit the modules form no cycle either: every import statement (module level,
inside functions, under ``if``/``try``) is an edge of the module graph, and that graph has no
strongly connected component of more than one module. Modules and functions stay readable:
one concept a module (at most ``MAX_MODULE_LINES`` lines), a function's code on a screen (at
most ``MAX_FUNCTION_LINES`` lines besides its docstring).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ctformer"

LAYERS = {
    "environment": -2, "validation": -2, "labelled_methods": -2, "_fftw_shared": -1.5, "fft": -1,
    "backend": 0, "atomic": 0, "shared_tensors": 0,
    "discretizations": 1, "solvers": 1, "model_inputs": 1,
    "state": 2,
    "_numerics": 2.5,  # the fast kernels: below the operators that call them
    "kernels": 2.7,  # feature kernels: a convolution reads the measured dense/FFT crossover
    "operators": 3,
    "random_models": 4,
    "evolution": 4.5,  # a model's depth evolution: the loop over its layers, below the model
    "model": 5,
    "studies": 6, "adjoint": 6,
    "bridges": 7,   # a bridge's study fits its order with the studies' one fitter
    "particles": 8,
    "labelled_files": 8.4, "labelled_attrs": 8.45, "labelled": 8.5,  # converts every result kind (they sit below)
    # the command line: shared pieces and Ctrl-C, the parser, the commands, the entry point
    "cli_common": 8.6, "cli_interrupt": 8.6, "cli_parser": 8.7,
    "cli_study": 8.8, "cli_limit": 8.8, "cli_demo": 8.9,  # demo ends with limit's check
    "cli": 9, "__main__": 10, "ctformer": 11,
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ctformer"


def _modules(root: Path = ROOT) -> dict:
    """Dotted module name -> path, for every module of the package at ``root``."""
    modules = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(rel if rel[-1] != "__init__" else rel[:-1])] = path
    return modules


def _targets(node, package: str, modules: dict) -> list:
    """The modules an ``import`` / ``from ... import`` node names (absolute dotted names).

    ``from pkg import name`` names the module ``pkg.name`` when there is one (``from . import
    compiled``), else ``pkg`` itself; ``import a.b.c`` names ``a.b.c``.
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        target = base + ("." + node.module if node.module else "")
    else:
        target = node.module or ""
    submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
    return submodules or [target]


def _module_imports(root: Path = ROOT):
    """(importing module, imported module, line) for every import between modules of the
    package at ``root``: at module level, inside functions and methods, under ``if``/``try``."""
    modules = _modules(root)
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _targets(node, package, modules):
                while target not in modules and "." in target:  # a name inside a module
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != module:
                    yield module, target, node.lineno


def _imports():
    """(importing unit, imported unit, file, line) for every ctformer import between units."""
    modules = _modules()
    for module, target, line in _module_imports():
        if _unit(target) != _unit(module):
            yield _unit(module), _unit(target), modules[module].name, line


def _cycles(edges) -> list:
    """The import cycles of a graph given by (source, target, line) edges: its strongly
    connected components of more than one module (Tarjan's algorithm), each sorted."""
    graph: dict = {}
    for source, target, _ in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


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


def test_no_import_cycle_between_modules():
    """No cycle among the modules, counting every import (module level and inside functions),
    also between modules of one package (a function-level import hides a cycle from Python's
    import machinery until the function runs, but the modules still depend on each other)."""
    assert _cycles(_module_imports()) == []


# One concept a module and a function a screen: the longest each may be, in lines (a
# function's docstring, which states its mathematics, is not counted).
MAX_MODULE_LINES = 410
MAX_FUNCTION_LINES = 65


def _function_code_lines(node) -> int:
    first = node.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str)
    return node.end_lineno - (first.end_lineno + 1 if docstring else first.lineno) + 1


def test_every_module_and_function_stays_readable():
    long_modules, long_functions = {}, {}
    for name, path in _modules().items():
        text = path.read_text()
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            long_modules[name] = lines
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    (lines := _function_code_lines(node)) > MAX_FUNCTION_LINES:
                long_functions[f"{name}.{node.name}"] = lines
    assert long_modules == {} and long_functions == {}


def test_readability_limits_count_lines_as_stated():
    """The counter itself: a docstring is not code, every other line is."""
    tree = ast.parse('def f():\n    """Doc\n    string."""\n    a = 1\n\n    return a\n\n'
                     'def g():\n    return 2\n')
    assert [_function_code_lines(node) for node in tree.body] == [3, 1]


def test_cycle_detection_sees_imports_inside_functions_and_inside_a_package(tmp_path):
    """The detector itself, on a made-up package: ``a`` imports ``b`` at module level, ``b``
    imports ``a`` inside a function (the form of the cycles _numerics.loops <-> compiled and
    studies.plotting <-> results), ``c`` <-> ``d`` through ``from . import`` in methods and an
    absolute import under ``if``; ``e`` imports only downward."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import x\n",
        "a.py": "from .b import y\nx = 1\n",
        "b.py": "y = 2\ndef f():\n    from .a import x\n    return x\n",
        "e.py": "from .sub import c\n",
        "sub/__init__.py": "",
        "sub/c.py": "class C:\n    def m(self):\n        from . import d\n",
        "sub/d.py": "if True:\n    import pkg.sub.c\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    edges = list(_module_imports(package))
    assert ("pkg.b", "pkg.a", 3) in edges and ("pkg.sub.c", "pkg.sub.d", 3) in edges
    assert _cycles(edges) == [["pkg.a", "pkg.b"], ["pkg.sub.c", "pkg.sub.d"]]
