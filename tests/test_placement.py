"""Where a parallel pass runs: the caller held on its CPU, the pool's workers on the others, the
caller restored afterwards; and a worker that has not started is not waited for."""
import contextlib
import importlib
import os
import threading
import time

import numpy as np
import pytest

threads_module = importlib.import_module("ctformer._numerics.threads")
placement = importlib.import_module("ctformer._numerics.placement")

linux = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="per-thread affinity is Linux's")


@contextlib.contextmanager
def _idle_threads(count):
    """``count`` threads of this process that wait (a stand-in for an OpenMP team)."""
    stop = threading.Event()
    started = [threading.Thread(target=stop.wait) for _ in range(count)]
    for t in started:
        t.start()
    try:
        yield started
    finally:
        stop.set()
        for t in started:
            t.join()


def _processor(tid):
    """The CPU a thread last ran on, as the kernel reports it (/proc: field 39 of its stat)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[36])  # fields after "(comm)" start at field 3


def _usable_cpus():
    return os.sched_getaffinity(0)


def _record_pass():
    """{native thread id: its CPU set} for each thread that took a task of a pass on as many
    threads as there are usable CPUs (the default, and where threads are placed)."""
    threads = max(2, len(os.sched_getaffinity(0)))
    seen = {}

    def worker(next_task):
        while next_task() is not None:
            seen[threading.get_native_id()] = os.sched_getaffinity(0)
            time.sleep(0.02)  # the other thread takes the next task

    threads_module.run_workers(worker, list(range(3 * threads)), threads)
    return seen


@linux
def test_a_pass_holds_its_caller_on_its_cpu_and_the_workers_on_the_others(monkeypatch):
    home = _usable_cpus()
    if len(home) < 2:
        seen = _record_pass()
        assert all(cpus == home for cpus in seen.values())  # one usable CPU: nothing is held
        return
    caller = threading.get_native_id()
    seen = _record_pass()
    assert os.sched_getaffinity(0) == home  # restored after the pass
    held = seen.get(caller)
    assert held is not None and len(held) == 1 and held <= home
    others = {tid: cpus for tid, cpus in seen.items() if tid != caller}
    assert others, "no pool worker took a task"
    for cpus in others.values():
        assert len(cpus) == 1 and cpus <= home - held
    # the CPU the kernel reports for a worker is its held one
    tid, cpus = next(iter(others.items()))
    assert _processor(tid) in cpus

    # where the caller cannot be held, a held worker runs on the caller's CPUs again
    monkeypatch.setattr(placement, "_current_cpu", lambda: None)
    seen = _record_pass()
    assert all(cpus == home for cpus in seen.values())


@linux
def test_nothing_is_held_for_one_thread_or_one_cpu(monkeypatch):
    home = _usable_cpus()
    assert placement.hold_caller(1).cpus == ()
    assert os.sched_getaffinity(0) == home
    one = {min(home)}
    os.sched_setaffinity(0, one)
    try:
        seen = _record_pass()
        assert all(cpus == one for cpus in seen.values())  # workers follow the caller's set
        assert placement.hold_caller(2).cpus == ()
    finally:
        os.sched_setaffinity(0, home)


@linux
def test_nothing_is_held_where_the_setting_is_off_or_the_threads_are_not_the_cpus(monkeypatch):
    home = _usable_cpus()
    monkeypatch.setenv("CTFORMER_PLACEMENT", "off")
    assert placement.hold_caller(len(home)).cpus == ()
    seen = _record_pass()
    assert all(cpus == home for cpus in seen.values())
    monkeypatch.setenv("CTFORMER_PLACEMENT", "auto")
    assert placement.hold_caller(len(home) + 1).cpus == ()  # more threads than CPUs
    assert placement.placing(2, 2) and not placement.placing(2, 3) and not placement.placing(1, 1)
    assert placement._after(2, {0, 1, 2, 3}) == [3, 0, 1]  # the CPUs after the caller's, in turn
    monkeypatch.setenv("CTFORMER_PLACEMENT", "on")
    with pytest.raises(ValueError, match="CTFORMER_PLACEMENT"):
        placement.hold_caller(2)
    assert os.sched_getaffinity(0) == home


@linux
def test_a_failed_hold_leaves_the_caller_as_it_was(monkeypatch):
    home = _usable_cpus()

    def refuse(pid, cpus):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(placement.os, "sched_setaffinity", refuse)
    held = placement.hold_caller(2)
    assert held.cpus == () and held.home == home
    assert os.sched_getaffinity(0) == home
    seen = _record_pass()  # the pass still runs, its caller where it was
    assert seen.get(threading.get_native_id(), home) == home


def test_a_worker_that_has_not_started_is_not_waited_for(monkeypatch):
    """The pool's one thread is kept busy: the caller takes every task and returns at once,
    where it used to wait for the busy thread to start (and find nothing left)."""
    pool = threads_module._pool(2)
    release = threading.Event()
    busy = pool.submit(release.wait, 10)
    done = []
    try:
        start = time.perf_counter()
        threads_module.run_workers(lambda next_task: [done.append(t) for t in iter(next_task, None)],
                                   list(range(5)), 2)
        elapsed = time.perf_counter() - start
    finally:
        release.set()
        busy.result()
    assert sorted(done) == list(range(5))
    assert elapsed < 5.0  # not the 10 s the busy pool thread would have taken


def test_a_solve_gives_the_same_bits_with_and_without_placement(monkeypatch):
    from ctformer.discretizations import Midpoint
    from ctformer.model import ContinuousTransformer

    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    model = ContinuousTransformer.random_smooth(layers=2, heads=2)
    u0 = np.cos(np.arange(600 * 16).reshape(600, 16) / 7.0)  # row blocks and streamed attention
    grid = dict(tokens=Midpoint(600), features=Midpoint(16), steps_per_layer=2, scheme="strang")
    held = model.solve(u0, **grid)
    monkeypatch.setattr(placement, "_current_cpu", lambda: None)
    np.testing.assert_array_equal(model.solve(u0, **grid), held)
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "1")
    np.testing.assert_array_equal(model.solve(u0, **grid), held)


@pytest.fixture
def omp_threads():
    """(openmp module, usable CPUs, thread count, whether a team can be placed here: Numba on
    OpenMP and two or more CPUs), after a first launch of the team's kernel."""
    numba = pytest.importorskip("numba")
    openmp = importlib.import_module("ctformer._numerics.openmp")
    home = _usable_cpus()
    threads = len(home)  # where teams are placed: as many threads as CPUs
    from ctformer._numerics.team_loops import thread_ids

    ids = np.zeros(64, dtype=np.int64)
    ran = openmp.openmp_threads(lambda: thread_ids(ids), threads)
    return openmp, home, threads, ran and threads > 1 and numba.threading_layer() == "omp"


def _nothing_to_place(openmp, threads):
    """Where no team can be placed, the team found is empty: nothing is ever moved."""
    team = openmp.team(threads)
    assert team is not None and team.tids == ()


@linux
def test_numbas_team_is_kept_off_its_callers_cpu(monkeypatch, omp_threads):
    openmp, home, threads, placeable = omp_threads
    if not placeable:
        return _nothing_to_place(openmp, threads)
    team = openmp.team(threads)
    tasks = {int(t) for t in os.listdir("/proc/self/task")}
    assert len(team.tids) == threads - 1 and set(team.tids) <= tasks - {threading.get_native_id()}
    try:
        for cpu in sorted(home)[:2]:  # the caller found on one CPU, then on another
            monkeypatch.setattr(placement, "_current_cpu", lambda: cpu)
            team.keep_apart()
            for tid in team.tids:
                assert os.sched_getaffinity(tid) <= home - {cpu} and len(os.sched_getaffinity(tid)) == 1
            assert team.cpu == cpu
        assert os.sched_getaffinity(0) == home  # the caller itself is not held
    finally:
        team.release()
    assert all(os.sched_getaffinity(tid) == home for tid in team.tids) and team.cpu is None
    assert placement.Team().tids == ()  # an empty team places nothing
    placement.Team().keep_apart()


@linux
def test_the_team_is_held_during_a_solve_only(monkeypatch, omp_threads):
    openmp, home, threads, placeable = omp_threads
    if not placeable:
        return _nothing_to_place(openmp, threads)
    from ctformer._numerics.team_loops import thread_ids

    ids = np.zeros(64, dtype=np.int64)
    team = openmp.team(threads)
    assert len(team.tids) == threads - 1
    cpu = min(home)
    monkeypatch.setattr(placement, "_current_cpu", lambda: cpu)

    openmp.openmp_threads(lambda: thread_ids(ids), threads)  # outside a solve: left alone
    assert all(os.sched_getaffinity(tid) == home for tid in team.tids)
    with threads_module.fixed_threads():
        openmp.openmp_threads(lambda: thread_ids(ids), threads)  # a Numba region in a solve
        assert all(os.sched_getaffinity(tid) <= home - {cpu} for tid in team.tids)
        assert set(ids[ids != 0].tolist()) <= set(team.tids) | {threading.get_native_id()}
    assert all(os.sched_getaffinity(tid) == home for tid in team.tids)  # released
    with threads_module.fixed_threads():
        openmp.keep_team_apart(threads)  # before one of torch's regions
        assert all(os.sched_getaffinity(tid) <= home - {cpu} for tid in team.tids)
    assert all(os.sched_getaffinity(tid) == home for tid in team.tids)


@linux
def test_a_forked_child_leaves_its_parents_team_alone(monkeypatch):
    """A team's thread ids name the parent's threads in a forked child: the child must not
    move them (nor any other process's threads)."""
    home = _usable_cpus()
    if len(home) < 2:  # one usable CPU: nothing is ever placed
        assert not placement.placing(len(home), len(home))
        return
    with _idle_threads(len(home) - 1) as started:
        team = placement.Team(t.native_id for t in started)
        monkeypatch.setattr(placement, "_current_cpu", lambda: min(home))
        pid = os.fork()
        if pid == 0:  # the child: placing the team must do nothing
            try:
                team.keep_apart()
                team.release()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert all(os.sched_getaffinity(t.native_id) == home for t in started)
        team.keep_apart()  # in the parent it does place them
        assert all(os.sched_getaffinity(t.native_id) <= home - {min(home)} for t in started)
        team.release()
        assert all(os.sched_getaffinity(t.native_id) == home for t in started)
        placement._set_thread(2 ** 22 + 12345, home)  # no such thread here: nothing happens


@linux
def test_a_team_bound_by_the_user_stays_bound_and_is_given_back_its_own_sets(monkeypatch):
    home = _usable_cpus()
    if len(home) < 2:  # one usable CPU: nothing is ever placed
        assert not placement.placing(len(home), len(home))
        return
    with _idle_threads(len(home) - 1) as started:
        own = {max(home)}  # each thread's own set before placement, not the caller's
        for t in started:
            os.sched_setaffinity(t.native_id, own)
        team = placement.Team(t.native_id for t in started)
        monkeypatch.setattr(placement, "_current_cpu", lambda: max(home))
        monkeypatch.setenv("OMP_PROC_BIND", "close")
        placement._bound_by_user.cache_clear()  # read once a process, as OpenMP reads it
        team.keep_apart()
        assert all(os.sched_getaffinity(t.native_id) == own for t in started) and team.cpu is None
        monkeypatch.delenv("OMP_PROC_BIND")
        placement._bound_by_user.cache_clear()
        team.keep_apart()
        assert all(max(home) not in os.sched_getaffinity(t.native_id) for t in started)
        team.release()
        assert all(os.sched_getaffinity(t.native_id) == own for t in started)
