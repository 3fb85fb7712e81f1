"""The on-disk cache of the compiled kernels, keyed by every kernel source file at once.

Numba keys a cached function by the contents of the one file that defines it. A kernel that
inlines a helper from another file (``normalization_loops.normalize_rows`` inlines
``loops.row_max``; ``particle_loops`` inlines ``scalar_loops.exp_nonpositive_``) would then be read
back from the cache after that helper had changed (an editable install after ``git pull``,
say): the old helper's machine code, silently. So every function of the kernel files
(:data:`KERNEL_FILES`) is keyed by the contents of all of them: a change in any one compiles
them all again. Where the cache lives (beside the sources, or Numba's user-wide directory) is
Numba's own choice, unchanged.

:func:`install` puts the locator first in Numba's list of cache locators; every kernel module
calls it before it defines a kernel. Functions outside the kernel files are left to Numba's
locators as they are.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache

__all__ = ["KERNEL_FILES", "KernelFilesLocator", "install", "sources_stamp"]

# The modules that define compiled kernels, and those whose code or constants they inline.
KERNEL_FILES = ("loops.py", "scalar_loops.py", "normalization_loops.py", "few_rows_loops.py",
                "particle_loops.py", "team_loops.py", "normal_tail.py")
_HERE = os.path.dirname(os.path.abspath(__file__))


def sources_stamp(read=None) -> str:
    """SHA-256 of the kernel files' contents, in :data:`KERNEL_FILES` order, each preceded by
    its name and length. ``read``: ``name -> bytes`` (default: the files beside this module,
    hashed again only where a file's modification time or size changed)."""
    if read is None:
        stats = tuple((s.st_mtime_ns, s.st_size) for s in (os.stat(os.path.join(_HERE, n)) for n in KERNEL_FILES))
        return _files_stamp(stats)
    digest = hashlib.sha256()
    for name in KERNEL_FILES:
        content = read(name)
        digest.update(f"{name}:{len(content)}:".encode())
        digest.update(content)
    return digest.hexdigest()


@lru_cache(maxsize=8)
def _files_stamp(stats) -> str:
    """:func:`sources_stamp` of the files as they are (``stats``: their times and sizes, the
    cache's key)."""
    def read(name):
        with open(os.path.join(_HERE, name), "rb") as f:
            return f.read()
    return sources_stamp(read)


class KernelFilesLocator:
    """Numba's own cache locator for a function of a kernel file, its source stamp extended
    by :func:`sources_stamp` (the methods of Numba's locator interface)."""

    def __init__(self, inner):
        self._inner = inner
        self._py_file = inner._py_file  # read by Numba's cachability check

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_source_stamp(self):
        return (self._inner.get_source_stamp(), sources_stamp())

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    @classmethod
    def from_function(cls, py_func, py_file):
        path = os.path.abspath(py_file)
        if os.path.dirname(path) != _HERE or os.path.basename(path) not in KERNEL_FILES:
            return None
        from numba.core import caching

        for other in _locator_list(caching):
            inner = None if other is cls else other.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner)
        return None


def _locator_list(caching) -> list:
    """Numba's list of cache locator classes (``CacheImpl``, ``_CacheImpl`` before 0.61)."""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    return impl._locator_classes


def install() -> bool:
    """Put the kernel files' locator first among Numba's cache locators (once); False where
    this Numba keeps no such list (its own keys then stand, as before this module)."""
    from numba.core import caching

    try:
        classes = _locator_list(caching)
    except AttributeError:
        return False
    if KernelFilesLocator not in classes:
        classes.insert(0, KernelFilesLocator)
    return True
