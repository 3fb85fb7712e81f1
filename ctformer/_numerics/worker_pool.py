"""The threads of the library's parallel passes: a pool whose caller never takes a Python lock.

:func:`ctformer._numerics.threads.run_workers` hands ``threads - 1`` jobs to this pool and runs
one share itself. The caller's side of the pool is made of operations that a signal handler's
exception cannot split: ``queue.SimpleQueue.put`` and ``get`` and ``list.append`` are single
C calls (an interrupted ``get`` takes nothing from the queue), and a job's state is read from
lists those calls fill, so waiting can be repeated after an interrupt as often as needed.

``concurrent.futures.ThreadPoolExecutor`` was not safe there: its ``submit`` acquires its idle
semaphore's ``threading.Condition`` in Python code, and a ``KeyboardInterrupt`` raised by a
``SIGALRM`` handler just after that acquisition left the lock held for good. The pool's threads
hung at their next task, later passes raised ``RuntimeError: release unlocked lock``, and the
interpreter hung at exit joining the stuck threads.

The pool threads are daemon threads started by :func:`_thread.start_new_thread` (no
``threading.Event`` for the starter to wait on), named ``ctformer-attention_<i>`` (torch's
thread bookkeeping recognises them by that prefix), and never joined: between passes they wait
in ``SimpleQueue.get``, so the interpreter exits whatever a pass was interrupted by.
"""
from __future__ import annotations

import _thread
import os
import queue
import threading

__all__ = ["Job", "pool", "settle"]

_CALLER, _WORKER = object(), object()
_LOCK = threading.Lock()
_POOL: dict = {}  # {process id: [the jobs queue, the number of threads started]}


class Job:
    """One call handed to the pool. Its owner is the first entry of ``owner`` (a pool thread
    that took it, or the caller that withdrew it: one atomic ``append`` each); ``finished`` is
    filled before the pool thread posts to ``done``."""

    __slots__ = ("owner", "finished", "call", "done", "outcome")

    def __init__(self, call, done=None):
        self.owner, self.finished, self.call = [], [], call
        self.done = queue.SimpleQueue() if done is None else done
        self.outcome = []  # [value] or [value, exception]

    def settled(self) -> bool:
        """Nothing runs for this job, nor will: withdrawn by its caller, or finished."""
        return bool(self.owner) and (self.owner[0] is _CALLER or bool(self.finished))

    def result(self):
        """Wait for a job that a pool thread runs; its value, or its exception raised."""
        while not self.finished:
            self.done.get()
        if len(self.outcome) == 2:
            raise self.outcome[1]
        return self.outcome[0]


def _serve(jobs, name: str) -> None:
    """A pool thread: runs the jobs it takes first, until the process ends."""
    threading.current_thread().name = name
    while True:
        job = jobs.get()
        job.owner.append(_WORKER)
        if job.owner[0] is not _WORKER:  # withdrawn: its pass ended without it
            continue
        try:
            job.outcome.append(job.call())
        except BaseException as exc:  # the pass records its workers' exceptions itself
            job.outcome[:] = [None, exc]
        finally:
            job.finished.append(True)
            job.done.put(None)


class _Pool:
    __slots__ = ("jobs",)

    def __init__(self, jobs):
        self.jobs = jobs

    def put(self, job: Job) -> None:
        """Queue ``job`` for the first idle pool thread."""
        self.jobs.put(job)

    def submit(self, function, *args) -> Job:
        """Run ``function(*args)`` on a pool thread; the :class:`Job` (wait with ``result``)."""
        job = Job(lambda: function(*args))
        self.jobs.put(job)
        return job


def pool(threads: int) -> _Pool:
    """The process's pool, with at least ``threads - 1`` threads (started afresh after a
    fork: the parent's threads do not exist in the child). Threads are only added: idle ones
    cost nothing while they wait."""
    with _LOCK:  # a C lock in a with statement: no interrupt between taking and the block
        entry = _POOL.get(os.getpid())
        if entry is None:
            _POOL.clear()
            entry = _POOL[os.getpid()] = [queue.SimpleQueue(), 0]
        while entry[1] < threads - 1:
            _thread.start_new_thread(_serve, (entry[0], f"ctformer-attention_{entry[1]}"))
            entry[1] += 1
        return _Pool(entry[0])


def settle(jobs: list, done) -> None:
    """Withdraw every job of ``jobs`` that no pool thread has taken and wait for those taken
    (each posts once to ``done`` when finished). Repeatable after an interrupt: a job's state
    is read from its lists, so a wake-up lost to an interrupt is a finished job seen here."""
    for job in jobs:
        job.owner.append(_CALLER)  # ignored where a pool thread was first
    while not all(job.settled() for job in jobs):
        done.get()
