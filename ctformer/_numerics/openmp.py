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
During a solve, the team of the launching thread is kept off that thread's CPU
(:class:`ctformer._numerics.placement.Team`): on a virtual machine that packs threads onto few
CPUs, a team thread put on its caller's CPU held a whole region back.
"""
from __future__ import annotations

import os
import sys
import threading

from . import threads as _threads
from . import placement as _placement
from .placement import Team

__all__ = ["keep_team_apart", "openmp_threads"]

_OPENMP = {"pid": None, "usable": None}  # the process that launched first; its layer's verdict
_TEAMS: dict = {}  # (calling thread's id, thread count) -> its Team
_LOCK = threading.Lock()


def openmp_threads(call, threads: int) -> bool:
    """Run ``call()`` (a Numba ``parallel`` kernel) on ``threads`` of Numba's threads and return
    True; return False, without running it, where that is not safe here (module docstring)."""
    if getattr(_threads._INSIDE, "worker", False):
        return False
    import numba

    return _launch(numba, call, threads, place=True)


def _launch(numba, call, threads: int, place: bool) -> bool:
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
        if place:  # off this thread's CPU during a solve (ctformer._numerics.placement)
            _placement.use_team(_team(threads))
        call()
    return True


def _team(threads: int) -> Team:
    """The calling thread's team at ``threads`` threads (found once; the count is set)."""
    key = (threading.get_native_id(), threads)
    team = _TEAMS.get(key)
    if team is None:
        team = _TEAMS[key] = Team.of_numba(threads)
    return team


def team(threads: int) -> Team | None:
    """The calling thread's OpenMP team at ``threads`` threads, for torch's parallel regions:
    found by a Numba launch where Numba runs on OpenMP in this process (where torch and Numba
    load the same OpenMP library, the team is torch's too), else an empty :class:`Team`
    (nothing placed); None, to be asked again later, while Numba is not loaded yet (it is not
    loaded for this: the library's compiled loops load it when they are first used)."""
    if "numba" not in sys.modules:
        return None
    if getattr(_threads._INSIDE, "worker", False):
        return Team()
    import numba

    found = []

    def find():
        found.append(_team(threads))  # a Numba launch itself (the team's kernel)

    if not _launch(numba, find, threads, place=False) or not _OPENMP["usable"]:
        return Team()
    return found[-1] if numba.threading_layer() == "omp" else Team()


def keep_team_apart(threads: int) -> None:
    """Before one of torch's OpenMP regions on ``threads`` threads during a solve: the calling
    thread's team off its CPU (:class:`~ctformer._numerics.placement.Team`; found by
    :func:`team` the first time it can be)."""
    if not _placement.solving():
        return
    known = _placement.caller_team()
    if known is not None:
        known.keep_apart()
        return
    found = team(threads)
    if found is not None:  # else not known yet: asked again at the next region
        _placement.use_team(found)


def usable() -> bool | None:
    """Whether :func:`openmp_threads` runs kernels in this process: None before its first launch."""
    if _OPENMP["pid"] is not None and _OPENMP["pid"] != os.getpid():
        return False
    return _OPENMP["usable"]


class _numba_threads:
    """Numba's thread count (a per-thread setting) at ``threads``, at most the size of its
    pool, for the block; restored after. Set only where it differs, and after the first
    launch by the threading layer's own setters (Numba's public ones check and launch again
    at every call: 5.7 us for a get and two sets, 0.8 us these, at each of a 16-token
    forward's 24 products; AMD EPYC, family 23 model 49)."""

    def __init__(self, numba, threads):
        self.numba, self.threads = numba, max(1, min(threads, numba.config.NUMBA_NUM_THREADS))

    def __enter__(self):
        get, set_ = _counts(self.numba)
        self.before = get()
        if self.before != self.threads:
            set_(self.threads)

    def __exit__(self, *exc):
        if self.before != self.threads:
            _counts(self.numba)[1](self.before)


def _counts(numba):
    """(get, set) of Numba's thread count: the threading layer's own functions once its threads
    run (found after the first launch), else Numba's public ones."""
    if _FAST_COUNTS:
        return _FAST_COUNTS[0]
    if _OPENMP["usable"] is not None:  # the threads have been launched
        from numba.np.ufunc import parallel

        get, set_ = getattr(parallel, "_get_num_threads", None), getattr(parallel, "_set_num_threads", None)
        _FAST_COUNTS.append((get, set_) if get is not None and set_ is not None
                            else (numba.get_num_threads, numba.set_num_threads))
        return _FAST_COUNTS[0]
    return numba.get_num_threads, numba.set_num_threads


_FAST_COUNTS: list = []  # [(get, set)] once known
