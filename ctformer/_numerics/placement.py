"""Where the threads of a parallel pass run: the caller on its CPU, each pool worker on another.

Some virtual machines schedule their guest's threads onto as few virtual CPUs as they can, so
that the host may halt the others ("packing"). After the process had been idle for 0.1 s or
more, a worker woken for a parallel pass was then placed on the CPU of the thread that woke
it, and the two shared one CPU until the scheduler moved one away: the first layers of a
forward ran at half speed. On an AMD EPYC (family 26, model 2; a Firecracker guest with two
vCPUs) forwards of 8 x 128 tokens took 1.25-1.35x their time after a pause of 0.2 s (MiniLM,
GPT-2 and Llama, float32: 84-86 against 63-68 ms), 256 tokens 1.5-1.7x; with the threads held
apart, 0.99-1.01x and 1.03-1.07x, and without a pause as long as before.

So :func:`ctformer._numerics.threads.run_workers` holds its calling thread on the CPU it runs
on for the duration of a pass (its own set of CPUs is restored after: threads the caller starts
later inherit that set), and each pool worker holds itself on one of the other CPUs of that
set, where it stays between passes (a pool thread runs nothing but the library's tasks).
Threads are held only where a pass has as many threads as the caller has usable CPUs (the
default: BLAS's thread count, all the CPUs), never where ``CTFORMER_PLACEMENT=off``, where
the platform has no per-thread affinity (not Linux), or where changing it fails. Numba's
OpenMP team is kept off its caller's CPU the same way (:class:`Team`). Placement never
changes a result: each task is computed alone, whichever thread runs it, and OpenMP's loops
are split by the thread count alone.
"""
from __future__ import annotations

import ctypes
import os
import threading
from functools import lru_cache

from ..environment import choice

__all__ = ["Placement", "Team", "caller_team", "hold_caller", "hold_worker", "placing", "release_caller",
           "solve_ended", "solve_started", "solving", "use_team"]

# a pool worker's .cpus: the set it last put itself on; a caller's .team (its OpenMP Team),
# .solving (a solve runs on it) and .held (the set a pass holds it from, until released)
_LOCAL = threading.local()
_CPU: list = []  # [the C library's sched_getcpu, or None]


class Placement:
    """A pass's placement: the caller's CPU set (``home``: restored on release, where the
    caller was held) and the CPUs its workers are held on in turn (``cpus``; empty: none
    held, the workers run on ``home``)."""

    __slots__ = ("home", "cpus")

    def __init__(self, home, cpus=()):
        self.home, self.cpus = frozenset(home), tuple(cpus)

    def worker_cpus(self, index: int) -> frozenset:
        """The CPU set of the ``index``-th worker of a parallel pass (0-based)."""
        return frozenset((self.cpus[index % len(self.cpus)],)) if self.cpus else self.home

    def release(self) -> None:
        """The caller back on its own CPU set, where it was held."""
        if self.cpus:
            release_caller()


class whole_cpus:
    """The calling thread on its whole CPU set for the block, where a pass holds it on one CPU
    (its own set after). A library loaded meanwhile sizes its threads by the CPUs it finds:
    torch imported on a held thread ran every later torch call of the process on one
    thread (GNU OpenMP's default count), with the bits of one thread."""

    __slots__ = ("own",)

    def __enter__(self):
        home, self.own = getattr(_LOCAL, "home", None), None
        if home is not None:
            own = os.sched_getaffinity(0)
            if own != home and _set_affinity(home):
                self.own = own
        return self

    def __exit__(self, *exc):
        if self.own is not None:
            _set_affinity(self.own)


def _current_cpu():
    """The CPU the calling thread runs on, or None where that cannot be asked."""
    if not _CPU:
        try:
            function = ctypes.CDLL(None, use_errno=True).sched_getcpu
            function.restype, function.argtypes = ctypes.c_int, []
            _CPU.append(function)
        except (OSError, AttributeError):  # no C library symbol here
            _CPU.append(None)
    if _CPU[0] is None:
        return None
    cpu = _CPU[0]()
    return cpu if cpu >= 0 else None


def _set_affinity(cpus) -> bool:
    try:
        os.sched_setaffinity(0, cpus)
        return True
    except (OSError, AttributeError, ValueError):  # not Linux, or a set this thread may not use
        return False


def placing(threads: int, cpus: int) -> bool:
    """Whether ``threads`` threads on ``cpus`` usable CPUs are placed: ``CTFORMER_PLACEMENT``
    is ``auto`` (not ``off``) and the threads are as many as the CPUs, at least two. With fewer
    threads than CPUs the scheduler is left to find idle ones (a thread held on a CPU that
    another process keeps busy could not leave it); with more, they share CPUs anyway."""
    return threads == cpus > 1 and choice("CTFORMER_PLACEMENT", ("auto", "off")) == "auto"


def _after(cpu, cpus) -> list:
    """``cpus`` (without ``cpu``) in the order that follows ``cpu``: the workers of callers on
    different CPUs go to different CPUs."""
    ordered = sorted(cpus)
    return [c for c in ordered if c > cpu] + [c for c in ordered if c < cpu]


def hold_caller(threads: int):
    """Hold the calling thread on its CPU for a pass on ``threads`` threads; return the
    :class:`Placement` (release it afterwards), with no CPUs for the workers where nothing is
    held (:func:`placing` says no, or setting the affinity failed), or None where the
    platform has no per-thread affinity."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    release_caller()  # an earlier pass on this thread stopped before it let go (an interrupt)
    home = os.sched_getaffinity(0)
    cpu = _current_cpu() if placing(threads, len(home)) else None
    if cpu is None or cpu not in home:
        return Placement(home)
    placement = Placement(home, _after(cpu, home))
    # recorded before the hold: release_caller finds it whatever stops the pass after it
    _LOCAL.held = _LOCAL.home = home  # home: the set it is held within (whole_cpus)
    if not _set_affinity({cpu}):
        _LOCAL.held = _LOCAL.home = None
        return Placement(home)
    return placement


def release_caller() -> None:
    """The calling thread back on the CPU set a pass held it from (:func:`hold_caller`);
    nothing where it is not held. Called when a pass ends, whatever ended it, and again
    before the next pass: an exception raised at any moment of a pass (a signal handler's
    ``KeyboardInterrupt`` inside :func:`hold_caller`, say) left the caller on one CPU for the
    rest of the process, and every thread it started later too."""
    held = getattr(_LOCAL, "held", None)
    if held is not None:
        _set_affinity(held)
        _LOCAL.held = _LOCAL.home = None


def hold_worker(placement, index: int) -> None:
    """On a pool worker: put this thread on the CPUs of the ``index``-th worker of
    ``placement`` (None: leave it where it is). One system call where its set changes, none
    otherwise."""
    if placement is None:
        return
    cpus = placement.worker_cpus(index)
    if getattr(_LOCAL, "cpus", None) != cpus and _set_affinity(cpus):
        _LOCAL.cpus, _LOCAL.home = cpus, placement.home


class Team:
    """The threads of Numba's OpenMP team of the calling thread, kept off the CPU that thread
    runs on.

    OpenMP's threads spin between parallel regions and split a loop statically, so one that
    had been placed on its caller's CPU held the whole region back: a 16-token float64 GPT-2
    forward (its products on the team) took 15.7-15.9 ms after a pause of 0.1 s or more,
    against 4.8-5.0 ms without one (AMD EPYC, family 26 model 2). The caller itself is not
    held (a region of 60-200 us is too short for three system calls), so :meth:`keep_apart`
    asks, at each region, which CPU the caller is on: a call into the C library, and system
    calls only where that CPU changed. Where torch and Numba load the same OpenMP library
    (torch's CPU wheels and Numba here), the team also runs torch's parallel regions, so it is
    held only while a solve runs (:func:`solve_started`, :func:`solve_ended`) and put back on
    the caller's CPUs when the solve ends: torch's regions outside ctformer find it as they
    would have."""

    __slots__ = ("tids", "cpu", "before", "pid")

    def __init__(self, tids=()):
        self.tids, self.cpu, self.before, self.pid = tuple(tids), None, {}, os.getpid()

    @classmethod
    def of_numba(cls, size: int):
        """The team that runs Numba's parallel loops for the calling thread, at its current
        thread count, found by a kernel that reports each thread's id (none where that kernel
        cannot run: no ``gettid`` in the C library, say)."""
        try:
            import numpy as np

            from .team_loops import thread_ids

            ids = np.zeros(max(64, size), dtype=np.int64)
            thread_ids(ids)
        except Exception:  # a kernel that cannot be compiled or linked here: nothing is placed
            return cls()
        return cls(sorted(set(ids.tolist()) - {0, threading.get_native_id()}))

    def keep_apart(self) -> None:
        """Before a region: the team on CPUs other than the caller's (nothing where it cannot
        be placed, or where the user binds OpenMP's threads: ``OMP_PROC_BIND``,
        ``OMP_PLACES``, ``GOMP_CPU_AFFINITY``)."""
        # in a forked child the ids are its parent's threads: nothing is placed there
        if not self.tids or self.pid != os.getpid() or _bound_by_user():
            return
        cpu = _current_cpu()
        if cpu is None or cpu == self.cpu:
            return
        home = os.sched_getaffinity(0)
        if not placing(len(self.tids) + 1, len(home)):
            return
        others = _after(cpu, home)
        for i, tid in enumerate(self.tids):
            if tid not in self.before:
                self.before[tid] = _affinity_of(tid)
            _set_thread(tid, {others[i % len(others)]})
        self.cpu = cpu

    def release(self) -> None:
        """The team back on the CPUs each of its threads had before it was placed."""
        if self.cpu is not None and self.pid == os.getpid():
            for tid, cpus in self.before.items():
                if cpus is not None:
                    _set_thread(tid, cpus)
            self.cpu = None
            self.before = {}


@lru_cache(maxsize=1)
def _bound_by_user() -> bool:
    """Whether the environment binds OpenMP's threads to CPUs (then they stay as bound). Read
    once: OpenMP reads these when it starts, before there is a team to place, and three
    lookups of ``os.environ`` took 4.4 us at every launch of a 16-token forward's 24 products
    (AMD EPYC, family 23 model 49)."""
    bind = os.environ.get("OMP_PROC_BIND", "").strip().lower()
    return bool(bind and bind != "false" or os.environ.get("OMP_PLACES") or os.environ.get("GOMP_CPU_AFFINITY"))


def _affinity_of(tid):
    try:
        return os.sched_getaffinity(tid)
    except OSError:  # the thread has ended
        return None


def _set_thread(tid, cpus) -> None:
    """``tid``, a thread of this process, on ``cpus``; nothing where it has ended (its id could
    name another process's thread by now) or may not run there."""
    try:
        if os.path.exists(f"/proc/self/task/{tid}"):
            os.sched_setaffinity(tid, cpus)
    except OSError:
        pass


def use_team(team) -> None:
    """Record ``team`` as the calling thread's OpenMP team and, during a solve, keep it off the
    caller's CPU (:meth:`Team.keep_apart`)."""
    _LOCAL.team = team
    if getattr(_LOCAL, "solving", False):
        team.keep_apart()


def caller_team():
    """The calling thread's recorded OpenMP :class:`Team`, or None."""
    return getattr(_LOCAL, "team", None)


def solving() -> bool:
    """Whether a solve runs on the calling thread (between :func:`solve_started` and
    :func:`solve_ended`)."""
    return getattr(_LOCAL, "solving", False)


def solve_started() -> None:
    """A solve starts on the calling thread: its OpenMP team may be held (:class:`Team`)."""
    _LOCAL.solving = True


def solve_ended() -> None:
    """The solve has ended: the calling thread's team back where it was."""
    _LOCAL.solving = False
    team = getattr(_LOCAL, "team", None)
    if team is not None:
        team.release()
