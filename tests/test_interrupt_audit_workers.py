"""A failed or interrupted parallel pass leaves nothing behind: the first exception of a worker
reaches the caller as it was raised and stops the handing out of tasks, every worker has
stopped when it does, and the caller's CPU set, the BLAS libraries' thread counts and the shared
one-thread limit are those from before the pass; the next call gives the same bits."""
from __future__ import annotations

import importlib
import os
import threading
import time

import numpy as np
import pytest

import ctformer

threads_module = importlib.import_module("ctformer._numerics.threads")
placement = importlib.import_module("ctformer._numerics.placement")
blas_limits = importlib.import_module("ctformer._numerics.blas_limits")

linux = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="per-thread affinity is Linux's")


def _blas_counts():
    return [library.num_threads for library in blas_limits._blas_libraries()]


def _data(a):
    return a.__array_interface__["data"][0]


def _failing_in_the_pool(message, started):
    """A worker whose tasks on a pool thread raise a MemoryError (the caller's tasks pass)."""
    def worker(next_task):
        while (task := next_task()) is not None:
            started.append(task)
            time.sleep(0.005)
            if threading.current_thread().name.startswith("ctformer-"):
                raise MemoryError(message)
    return worker


@linux
def test_a_failed_pool_task_gives_the_caller_its_cpus_back(monkeypatch):
    """A MemoryError in a pool worker's task left the caller held on one CPU for good (the
    pass's finally stopped at the worker's exception before it released the caller): with 2
    CPUs, {0, 1} became {0}, and every thread the caller started later inherited it."""
    home = os.sched_getaffinity(0)
    monkeypatch.setattr(placement, "placing", lambda threads, cpus: threads == cpus and cpus > 1)
    threads = max(2, len(home))
    for _ in range(3):
        started = []
        with pytest.raises(MemoryError, match=r"^task 1 ran out of memory$"):
            threads_module.run_workers(_failing_in_the_pool("task 1 ran out of memory", started),
                                       list(range(200)), threads)
        assert os.sched_getaffinity(0) == home
        # the failure stopped the handing out of tasks: the workers took their current task
        # each, one more at most while the failure was on its way, not the 200
        assert len(started) <= 3 * threads


def test_the_first_exception_stops_the_other_workers_before_the_caller_gets_it():
    """Two workers fail: the caller used to get the second exception while the first worker's
    thread went on taking tasks after the caller had returned (2 of 40 done at the return,
    38 a moment later), with the shared BLAS limit already given back."""
    taken = []
    gate = threading.Barrier(2, timeout=10)

    def worker(next_task):
        while (task := next_task()) is not None:
            taken.append(task)
            if task in (0, 1):
                gate.wait()  # both workers hold a failing task
                if task == 1:
                    time.sleep(0.05)  # task 1 fails second
                raise ValueError(f"task {task} failed")
            time.sleep(0.005)

    with pytest.raises(ValueError, match=r"^task 0 failed$"):
        threads_module.run_workers(worker, list(range(40)), 2)
    at_return = len(taken)
    time.sleep(0.2)
    assert len(taken) == at_return == 2  # nothing ran after the caller got the exception
    assert blas_limits._LIMIT["blocks"] == 0


def test_an_interrupt_inside_a_task_stops_the_pass_and_reaches_the_caller():
    """A KeyboardInterrupt raised by a task (a callback) is raised as it is, the other worker
    takes no task after it (it took all that were left before), and the next pass is whole."""
    taken = []

    def worker(next_task):
        while (task := next_task()) is not None:
            taken.append(task)
            time.sleep(0.005)
            if task == 4:
                raise KeyboardInterrupt("stopped in task 4")

    with pytest.raises(KeyboardInterrupt, match=r"stopped in task 4"):
        threads_module.run_workers(worker, list(range(200)), 2)
    assert len(taken) <= 8
    before = threading.active_count()
    done = []
    threads_module.run_workers(lambda next_task: [done.append(t) for t in iter(next_task, None)],
                               list(range(50)), 2)
    assert sorted(done) == list(range(50)) and threading.active_count() == before


@linux
@pytest.mark.skipif(hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) < 2,
                    reason="one usable CPU: a pass holds no caller, so there is nothing to give back")
def test_an_interrupt_right_after_the_caller_is_held_gives_its_cpus_back(monkeypatch):
    """A signal handler's KeyboardInterrupt that arrives just after the caller was held on its
    CPU, before the hold returned, left the caller there for good ({0} of {0, 1})."""
    home = os.sched_getaffinity(0)
    monkeypatch.setattr(placement, "placing", lambda threads, cpus: True)
    real = placement._set_affinity
    calls = []

    def interrupted(cpus):
        done = real(cpus)
        calls.append(set(cpus))
        if len(calls) == 1:  # the hold itself
            raise KeyboardInterrupt
        return done

    monkeypatch.setattr(placement, "_set_affinity", interrupted)
    with pytest.raises(KeyboardInterrupt):
        threads_module.run_workers(lambda next_task: list(iter(next_task, None)), list(range(4)), 2)
    assert len(calls[0]) == 1 and os.sched_getaffinity(0) == home


@pytest.mark.skipif(not blas_limits._blas_libraries(), reason="no BLAS library threadpoolctl can limit")
def test_an_interrupt_while_the_blas_limit_is_taken_gives_the_counts_back(monkeypatch):
    """A KeyboardInterrupt inside the shared one-thread limit's entry (a signal handler's, at
    the call that sets a count) left every BLAS library on one thread for the rest of the
    process, and its count forgotten (2 threads became 1; or the limit counted as held)."""
    before = _blas_counts()
    if all(c == 1 for c in before):
        blas_limits._set_threads(blas_limits._blas_libraries()[0], 2)
    try:
        _interrupted_limit_gives_the_counts_back(monkeypatch)
    finally:
        # the suite's one BLAS thread back: later tests in this process would otherwise
        # multiply on two OpenBLAS threads, which round some products differently from one
        # thread on its Haswell kernel (AMD EPYC, family 25 model 1)
        for library, count in zip(blas_limits._blas_libraries(), before):
            blas_limits._set_threads(library, count)


def _interrupted_limit_gives_the_counts_back(monkeypatch):
    counts = _blas_counts()
    real = blas_limits._set_threads

    def interrupted(library, count):
        real(library, count)
        if count == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(blas_limits, "_set_threads", interrupted)
    with pytest.raises(KeyboardInterrupt):
        threads_module.run_blas_tasks(lambda next_task: list(iter(next_task, None)), list(range(4)), True)
    monkeypatch.setattr(blas_limits, "_set_threads", real)
    assert _blas_counts() == counts
    assert blas_limits._LIMIT["blocks"] == 0 and not blas_limits._LIMIT["restore"]


def test_a_failed_group_of_a_solve_is_raised_as_itself_and_the_next_solve_is_exact(monkeypatch):
    """A MemoryError in one group's task of a grouped forward reaches the caller as itself;
    the same forward then gives the bits of an uninterrupted one, and the process's BLAS
    counts and CPU set are those from before."""
    groups_module = importlib.import_module("ctformer._numerics.sequence_groups")
    monkeypatch.setattr(groups_module, "machine_cpus", lambda: 2)
    model = ctformer.ContinuousTransformer.random_smooth(seed=3, layers=3, heads=2, placement="pre")
    x = np.random.default_rng(10).standard_normal((4, 128, 8))
    full = model.run(x)
    counts, home = _blas_counts(), os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    advance = groups_module.SequenceGroups.advance

    def failing(self, scheme, u, segments, steps, keep):
        step = scheme.step

        class Failing:  # the second group's first step fails
            def __getattr__(self, name):
                return getattr(scheme, name)

            def step(self, problem, v, h):
                if _data(v) == _data(u[self_slices[1]]):
                    raise MemoryError("no memory for group 1")
                return step(problem, v, h)

        self_slices = self.slices
        return advance(self, Failing(), u, segments, steps, keep)

    monkeypatch.setattr(groups_module.SequenceGroups, "advance", failing)
    with pytest.raises(MemoryError, match=r"^no memory for group 1$"):
        model.run(x)
    monkeypatch.setattr(groups_module.SequenceGroups, "advance", advance)
    assert _blas_counts() == counts and blas_limits._LIMIT["blocks"] == 0
    if home is not None:
        assert os.sched_getaffinity(0) == home
    assert np.array_equal(model.run(x), full)
