"""The compiled kernels' on-disk cache is keyed by every kernel file (ctformer._numerics.kernel_cache):
a kernel that inlines a helper of another file is compiled again when that file changes."""
from __future__ import annotations

import hashlib
import importlib
import re
import sys
from pathlib import Path

from ctformer._numerics import compiled, kernel_cache

from .conftest import require

HERE = Path(kernel_cache.__file__).parent


def _independent_stamp(contents: dict) -> str:
    digest = hashlib.sha256()
    for name in kernel_cache.KERNEL_FILES:
        digest.update(f"{name}:{len(contents[name])}:".encode() + contents[name])
    return digest.hexdigest()


def test_the_stamp_covers_every_kernel_file_and_changes_with_any_one():
    contents = {name: (HERE / name).read_bytes() for name in kernel_cache.KERNEL_FILES}
    stamp = kernel_cache.sources_stamp()
    assert stamp == _independent_stamp(contents) == kernel_cache.sources_stamp(contents.__getitem__)
    for name in kernel_cache.KERNEL_FILES:
        edited = dict(contents, **{name: contents[name] + b"\n# an edit\n"})
        assert kernel_cache.sources_stamp(edited.__getitem__) not in (stamp, kernel_cache.sources_stamp(
            dict(contents, **{name: contents[name] + b"\n# another edit\n"}).__getitem__))


def test_every_kernel_file_and_what_it_imports_is_listed():
    """Files that define compiled functions, and the package modules they import from, are
    all among KERNEL_FILES (a missing one would be left out of the stamp)."""
    defining = {p.name for p in HERE.glob("*.py")
                if re.search(r"^\s*@(njit|jit|inline|_sum_jit)\b|^\s*@njit\(", p.read_text(), re.M)}
    imported = {m + ".py" for name in defining
                for m in re.findall(r"^from \.(\w+) import", (HERE / name).read_text(), re.M)}
    imported |= {m + ".py" for name in defining
                 for m in re.findall(r"^from \. import (\w+)", (HERE / name).read_text(), re.M)}
    assert "loops.py" in defining and "normalization_loops.py" in defining
    missing = (defining | imported) - set(kernel_cache.KERNEL_FILES) - {"kernel_cache.py"}
    assert not missing, f"kernel files left out of the cache stamp: {sorted(missing)}"


def test_kernels_are_cached_by_the_stamp_where_numba_would_put_them(monkeypatch, tmp_path):
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    assert compiled.kernels() is not None
    from numba.core import caching

    from ctformer._numerics import loops, normalization_loops, particle_loops
    assert kernel_cache._locator_list(caching)[0] is kernel_cache.KernelFilesLocator
    for kernel in (normalization_loops.normalize_rows, loops.exp_rows, particle_loops.sa_velocity):
        locator = kernel._cache._impl.locator
        assert isinstance(locator, kernel_cache.KernelFilesLocator)
        own = next(c.from_function(kernel.py_func, kernel.py_func.__code__.co_filename)
                   for c in kernel_cache._locator_list(caching)[1:]
                   if c.from_function(kernel.py_func, kernel.py_func.__code__.co_filename) is not None)
        assert locator.get_cache_path() == own.get_cache_path()
        assert locator.get_source_stamp() == (own.get_source_stamp(), kernel_cache.sources_stamp())

    # a function of another file keeps Numba's own locator and stamp
    (tmp_path / "user_kernel.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef one(x):\n"
                                             "    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("user_kernel")
    try:
        assert not isinstance(module.one._cache._impl.locator, kernel_cache.KernelFilesLocator)
        assert module.one(1) == 2
    finally:
        sys.modules.pop("user_kernel", None)


def test_install_is_idempotent():
    require("numba")
    from numba.core import caching

    assert kernel_cache.install() and kernel_cache.install()
    assert kernel_cache._locator_list(caching).count(kernel_cache.KernelFilesLocator) == 1


def test_an_edited_helper_of_another_file_is_compiled_again(tmp_path):
    """End to end, in a copy of the package: normalize_rows (normalization_loops.py) inlines
    loops.row_max; after row_max is edited to return 1e300, a new process's kernel refuses the
    rows (their largest entry now seems too large to square), where Numba's own keys would
    have served the cached kernel compiled before the edit."""
    require("numba")
    import subprocess

    import ctformer

    package = Path(ctformer.__file__).parent
    for source in package.rglob("*.py"):
        target = tmp_path / "ctformer" / source.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import numpy as np, ctformer\n"
              "assert ctformer.__file__.startswith(sys.argv[1]), ctformer.__file__\n"
              "from ctformer._numerics import normalization_loops as N\n"
              "u = np.arange(1.0, 9.0).reshape(2, 4); w = np.full(4, 0.25); e = np.zeros(0)\n"
              "print(N.normalize_rows(u, w, 0.0, True, e, e, 1e150, 1e-12, 0.0, np.empty_like(u)))\n")

    def accepted() -> str:
        run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                             cwd=tmp_path, timeout=300)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert accepted() == "True"  # compiled and cached
    loops = tmp_path / "ctformer" / "_numerics" / "loops.py"
    text = loops.read_text()
    assert text.count("    return top\n") == 1
    loops.write_text(text.replace("    return top\n", "    return top * 0 + 1e300\n"))
    assert accepted() == "False"
