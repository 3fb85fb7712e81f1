r"""Numba's ``parallel`` kernels on its OpenMP threads, where that is safe.

The library's own pool wakes its threads from sleep for every task: on a virtual Intel Xeon
they started 0.2-0.6 ms late (median and 90th percentile), and on an AMD EPYC (family 26,
model 2) a round trip to a sleeping thread took 45 us. Work of a few hundred microseconds (a
16-row product, a step of small particle systems) then gains little from a second thread.
OpenMP's threads spin for a while after each parallel region and start the next one at once.
:func:`openmp_threads` runs a compiled ``parallel`` kernel on them and says where it did not:

* inside a worker of the library's pool (no nested teams);
* in a process forked from one that has started the OpenMP threads (GNU OpenMP is not
  fork-safe: Numba would abort the child);
* where Numba's threading layer is not OpenMP or TBB (its fallback, ``workqueue``, wakes its
  threads from sleep, and aborts on launches from two threads at once). The first launch,
  alone, finds out which it is.

The caller then runs its work another way (the pool, one thread, or BLAS's own threads).
"""
from __future__ import annotations

import os
import threading

from . import threads as _threads

__all__ = ["openmp_threads"]

_OPENMP = {"pid": None, "usable": None}  # the process that launched first; its layer's verdict
_LOCK = threading.Lock()


def openmp_threads(call, threads: int) -> bool:
    """Run ``call()`` (a Numba ``parallel`` kernel) on ``threads`` of Numba's threads and return
    True; return False, without running it, where that is not safe here (module docstring)."""
    if getattr(_threads._INSIDE, "worker", False):
        return False
    import numba

    with _LOCK:
        if _OPENMP["pid"] is None:
            _OPENMP["pid"] = os.getpid()
            with _numba_threads(numba, threads):
                call()
            _OPENMP["usable"] = numba.threading_layer() in ("omp", "tbb")
            return True
    if _OPENMP["pid"] != os.getpid() or not _OPENMP["usable"]:
        return False
    with _numba_threads(numba, threads):
        call()
    return True


def usable() -> bool | None:
    """Whether :func:`openmp_threads` runs kernels in this process: None before its first launch."""
    if _OPENMP["pid"] is not None and _OPENMP["pid"] != os.getpid():
        return False
    return _OPENMP["usable"]


class _numba_threads:
    """Numba's thread count (a per-thread setting) at ``threads``, at most the size of its
    pool, for the block; restored after."""

    def __init__(self, numba, threads):
        self.numba, self.threads = numba, max(1, min(threads, numba.config.NUMBA_NUM_THREADS))

    def __enter__(self):
        self.before = self.numba.get_num_threads()
        self.numba.set_num_threads(self.threads)

    def __exit__(self, *exc):
        self.numba.set_num_threads(self.before)
