"""Threads for the NumPy paths: worker pool, BLAS limits, configuration.

This module holds everything about *how many* threads work on a call and how they share the
cores; the mathematics stays in the operators that use it (attention, the activations, the
feed-forward maps).

* :func:`num_threads`: the number of worker threads, ``CTFORMER_NUM_THREADS`` when set
  (a positive integer), else the BLAS library's current thread count.
* :func:`single_thread_blas`: a context manager limiting the loaded BLAS libraries to one
  thread (through ``threadpoolctl``), or ``None`` when that is impossible.
* :func:`run_workers`: run ``worker(next_task)`` on ``threads`` threads (the calling thread
  and ``threads - 1`` pool threads) over a list of tasks handed out one at a time.
* :func:`run_blas_tasks`: the same for tasks that call BLAS, each worker with a
  single-threaded BLAS.
* :func:`by_row_blocks`: a token-wise map (each row of the last axis computed alone, such as
  a feed-forward layer) run on blocks of rows by the workers, each with a single-threaded BLAS.
  For many rows this beats threaded BLAS products with threaded element-wise passes between
  them: OpenBLAS's idle threads keep spinning for a while after each call (up to about 0.1 s,
  ``OPENBLAS_THREAD_TIMEOUT``) and take a core from the workers of the next pass (a GELU after
  a product took 2x its time), while blocks keep all three steps of a row block on one core.

Results never depend on the thread count: callers split their work into tasks that do not
depend on it, each task is computed by one thread with a single-threaded BLAS (for every
count, one worker included: a threaded BLAS product can round differently from a
single-threaded one, e.g. OpenBLAS with transposed operands), and a task writes only its own
part of the output.
"""
from __future__ import annotations

import functools
import itertools
import os
import queue
import sys
import threading

import numpy as np

from .. import fft as _fft
from ..environment import positive_int
from . import placement as _placement
from . import worker_pool as _worker_pool
# the BLAS limit of a parallel pass (its own module), its names importable from here as before;
# streamed and the tests read single_thread_blas here, and tests replace it here
from .blas_limits import (_BLAS, _CONTROLLER, _LIMIT, _blas_libraries, _limit_after_fork, _OneBlasThread,
                          _set_threads, blas_controller, single_thread_blas)
from .compiled import sigint_deferred

_MAX_THREADS = 2**31 - 1  # a C int: the thread counts of FFTW and OpenBLAS

__all__ = ["num_threads", "fixed_threads", "single_thread_blas", "run_workers", "run_blas_tasks", "by_row_blocks"]

# by_row_blocks: inputs with fewer rows take the map as it is (threaded BLAS splits the
# columns of a short product better), but for the shorter inputs below; blocks have at least
# _BLOCK_ROWS rows (BLAS efficiency), and a call has at most _MAX_BLOCKS of them.
_ROW_BLOCKS_MIN_ROWS = 512
_BLOCK_ROWS = 256
_MAX_BLOCKS = 8
# Inputs of _PACKED_MIN_ROWS to _ROW_BLOCKS_MIN_ROWS rows go by blocks of at least
# _PACKED_BLOCK_ROWS too, where the map's products run packed on one thread (float32,
# ctformer._numerics.packed: no threaded product to fall back on; float32 MiniLM, GPT-2, Llama
# of 256 tokens on two threads: 0.53-0.57 of HuggingFace's time by blocks, 1.4-2.7 before; AMD
# EPYC, family 26 model 2), and where their products run on BLAS's own threads and have at
# least _SHORT_MIN_PRODUCT multiply-adds: there one threaded product varied from call to call
# (on a KVM guest, 1.8 ms after another product, 3.5 ms after a pause of 20 ms, its threads
# held on separate CPUs or not; AMD EPYC, family 23 model 49), and 256-token forwards took
# 0.89-1.04 of HuggingFace's time by blocks against 1.01-1.41 (MiniLM, GPT-2, Llama). Timed
# alone, the blocks were slower (the pool's wake-up): the choice is the networks'.
_PACKED_MIN_ROWS = 256
_PACKED_BLOCK_ROWS = 128
_SHORT_MIN_PRODUCT = 1 << 22


class _Inside(threading.local):
    # class defaults: getattr of an attribute a thread never set raises and catches an
    # AttributeError inside (0.85 us on a virtual AMD EPYC, family 23 model 49), and these
    # are read several times in every evaluation of a small state
    worker = False  # this thread is running a worker of run_workers


class _Fixed(threading.local):
    count = None  # the thread count fixed by fixed_threads on this thread


_INSIDE, _FIXED = _Inside(), _Fixed()
_TORCH_THREADS = __name__.rsplit(".", 1)[0] + ".torch_threads"  # torch's counts (pass end)


def _pool(threads: int):
    """The shared worker pool, with at least ``threads - 1`` threads (module worker_pool)."""
    return _worker_pool.pool(threads)


def num_threads() -> int:
    """Worker threads: ``CTFORMER_NUM_THREADS``, else the BLAS library's thread count
    (inside :class:`fixed_threads` on this thread: the count read when it was entered). While
    passes hold the shared one-thread limit (:class:`_OneBlasThread`), the count it will
    restore: a pass started on another thread meanwhile gets the user's workers, not one.

    Raises
    ------
    ValueError
        If ``CTFORMER_NUM_THREADS`` is set but is not a positive integer that a C ``int``
        holds (FFTW's and OpenBLAS's thread counts are C ints).
    """
    fixed = getattr(_FIXED, "count", None)
    if fixed is not None:
        return fixed
    count = positive_int("CTFORMER_NUM_THREADS", maximum=_MAX_THREADS)
    if count is not None:
        return count
    libraries = _blas_libraries()
    if libraries:
        held = {id(library): count for library, count in _LIMIT["restore"]}  # one read: atomic
        return max(held.get(id(library)) or library.num_threads or 1 for library in libraries)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            return max(1, int(os.environ.get(name, "").split(",")[0]))
        except ValueError:
            pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class fixed_threads:
    """A block in which :func:`num_threads` on this thread returns the count it had on entry.

    A solve reads the count for every product, attention and activation call, 2-5 us each
    through the BLAS libraries (about 1% of a 16-token network forward); a model's and a
    particle system's solves read it once. The count only decides how work is shared, never
    a result (see the module docstring), so a limit changed during a solve applies from the
    next one. Nested blocks keep the outer count; other threads are not affected."""

    __slots__ = ("entered",)

    def __enter__(self):
        self.entered = getattr(_FIXED, "count", None) is None
        if self.entered:
            _FIXED.count = num_threads()
            _placement.solve_started()  # OpenMP's team may be held apart meanwhile
        return self

    def __exit__(self, *exc):
        if self.entered:
            _FIXED.count = None
            _placement.solve_ended()


def runs_alone() -> bool:
    """Whether a pass started on this thread runs on it alone: inside a worker's task, or
    with one thread in all."""
    return getattr(_INSIDE, "worker", False) or num_threads() == 1


def run_workers(worker, tasks: list, threads: int) -> None:
    """Run ``worker(next_task)`` on ``threads`` threads until ``tasks`` are all taken.

    ``next_task()`` returns the next task or None. The calling thread is one of the workers.
    An exception in any worker (a ``MemoryError`` in one task, say) stops the handing out of
    tasks, and once every worker has finished its current task the first exception raised is
    raised to the caller as it is (its type, message and traceback). On the main thread a
    Ctrl-C (SIGINT) stops the handing out of tasks too and is raised (``KeyboardInterrupt``)
    once all workers have finished their current task, a kernel compile among them
    (:func:`ctformer._numerics.compiled.sigint_deferred`); where the program's SIGINT handler
    returns instead of raising, the remaining tasks are handed out again and all are done. An
    exception raised by another signal handler on the calling thread (``KeyboardInterrupt``
    from a ``SIGALRM`` handler, say) stops the pass the same way and is raised once the
    workers have stopped; the pool takes no lock that such an exception could leave held.
    Either way the pass leaves no worker running and gives back what it changed: the caller's
    CPU set and torch's thread count for new threads. Called from inside a worker (an
    activation inside a feed-forward task, say) it runs on that worker's thread alone: nested
    pools would wait on each other.
    """
    threads = 1 if getattr(_INSIDE, "worker", False) else max(1, min(threads, len(tasks)))
    counter = itertools.count()
    stop, failures = [], []  # stop: no more tasks are handed out (Ctrl-C, a failed task)

    def next_task():
        if stop:
            return None
        i = next(counter)  # atomic in CPython
        return tasks[i] if i < len(tasks) else None

    def marked(next_task, index=None, placement=None):
        if index is not None:  # a pool worker: on a CPU of its own (module placement)
            _placement.hold_worker(placement, index)
        outer = getattr(_INSIDE, "worker", False)
        _INSIDE.worker = True
        try:
            worker(next_task)
        except BaseException as exc:
            stop.append(True)  # the other workers take no more tasks: the pass has failed
            failures.append(exc)  # in the order raised (list.append is atomic)
            raise
        finally:
            _INSIDE.worker = outer

    if threads == 1:
        marked(next_task)
        return
    _parallel_pass(marked, next_task, threads, stop, failures)
    while stop and not failures:  # a SIGINT handler returned without raising: the rest is done
        stop.clear()
        _parallel_pass(marked, next_task, threads, stop, failures)
    if failures:  # the first exception of any worker, as it was raised
        raise failures[0]


def _parallel_pass(marked, next_task, threads: int, stop: list, failures: list) -> None:
    """The pool part of :func:`run_workers`: ``threads - 1`` pool workers and the caller, all
    waited for, and the caller's CPU set and torch's count for new threads given back whatever
    is raised (a worker's exception is left in ``failures``)."""
    torch_threads = sys.modules.get(_TORCH_THREADS)  # loaded only where torch is used
    torch_count = None if torch_threads is None else torch_threads.caller_count()
    jobs, done = [], queue.SimpleQueue()
    try:
        # Ctrl-C is held until every worker has stopped: a worker may be compiling a kernel
        # (LLVM), and a KeyboardInterrupt that overtook it would unwind the program while the
        # compile runs; held from before the caller is put on its CPU, so that no interrupt
        # leaves it there
        with sigint_deferred(on_signal=lambda: stop.append(True)):
            # the caller is held on its CPU for the pass, each worker on another one (placement)
            placement = _placement.hold_caller(threads)
            try:
                pool = _pool(threads)
                for i in range(threads - 1):
                    # recorded before it is queued: settle then finds every queued job
                    jobs.append(_worker_pool.Job(functools.partial(marked, next_task, i, placement), done))
                    pool.put(jobs[-1])
                marked(next_task)
            except BaseException as exc:
                _failed(exc, stop, failures)
            finally:
                # every started worker is waited for (its exception is in failures already); a
                # worker that has not started by now would find no task: it is withdrawn
                # (a virtual CPU woken from a halt can take milliseconds to run it). Another
                # signal handler's exception meanwhile (a SIGALRM's KeyboardInterrupt, say)
                # stops the pass and is raised once the wait is over.
                while True:
                    try:
                        _worker_pool.settle(jobs, done)
                        break
                    except BaseException as exc:
                        _failed(exc, stop, failures)
    finally:
        # the caller back on its CPUs, also where the hold was interrupted before it returned
        _placement.release_caller()
        # the pool threads keep one torch thread; torch's count for new threads goes back
        torch_threads = sys.modules.get(_TORCH_THREADS)
        if torch_threads is not None:
            torch_threads.pass_ended(torch_count)


def _failed(exc, stop: list, failures: list) -> None:
    """A pass stopped by ``exc`` raised outside a task (by a signal handler, say)."""
    stop.append(True)
    if all(exc is not f for f in failures):
        failures.append(exc)


def run_blas_tasks(worker, tasks: list, parallel: bool) -> None:
    """:func:`run_workers` for tasks that call BLAS.

    Not ``parallel``: on the calling thread, with BLAS as configured. ``parallel``: on
    :func:`num_threads` threads, each task with a single-threaded BLAS *whatever the thread
    count, one included*, so that a task's arithmetic never depends on the thread count (a
    threaded BLAS product rounds differently from a single-threaded one) and no OpenBLAS
    thread busy-waits on a core that a worker needs. Without a way to limit BLAS (no
    threadpoolctl controller) every thread count runs the tasks on the calling thread with
    BLAS as configured: the same numbers for every count again.
    """
    # the count first: making the limiter already sets the BLAS count (that it reads) to 1
    threads = num_threads() if parallel else 1
    limiter = _threads_limiter() if parallel else None
    if limiter is None:  # small, inside a worker (BLAS limited already), or no threadpoolctl
        run_workers(worker, tasks, 1)
        return
    with limiter:
        run_workers(worker, tasks, threads)


def _threads_limiter():
    return None if getattr(_INSIDE, "worker", False) else single_thread_blas()


def by_row_blocks(flow, width=None, whole=None, packed=None):
    """``flow`` for a token-wise map ``(..., d) -> (..., width)`` (``width`` None: ``d``), run
    by blocks of rows on the workers for NumPy inputs of at least ``_ROW_BLOCKS_MIN_ROWS``
    rows (and for some shorter ones, below); other inputs go to ``flow`` as they are. The blocks (at least ``_BLOCK_ROWS`` rows,
    at most ``_MAX_BLOCKS`` of them) depend on the input's shape only, and every block runs
    with a single-threaded BLAS whatever the number of workers, one included
    (:func:`run_blas_tasks`), so the result has the same bits for every thread count.

    ``whole``: None, or a test of the dtype that sends the whole input to ``flow`` where it
    holds. The dense maps pass :func:`ctformer._numerics.gemm.threaded_rows` (their products
    run on torch's threads with the same bits for every thread count): one threaded product
    beat the blocks' one-thread products in 6 of 7 networks and sizes measured (Intel Xeon,
    2 threads).

    ``packed``: None, or a test of the dtype that holds where the map's products run packed
    on one thread (:func:`ctformer._numerics.gemm.packed_rows`); such inputs are run by blocks
    from ``_PACKED_MIN_ROWS`` rows, of at least ``_PACKED_BLOCK_ROWS``, below
    ``_ROW_BLOCKS_MIN_ROWS`` too: there is no threaded product that would use the threads.
    So are the inputs of that many rows whose map is not ``whole`` and has at least
    ``_SHORT_MIN_PRODUCT`` multiply-adds (rows x d x ``width``), which BLAS's own threads
    would multiply otherwise (see ``_SHORT_MIN_PRODUCT``)."""
    def blocked(u):
        # cheapest tests first: small solves call this a few times per step
        if type(u) is not np.ndarray or u.size < _PACKED_MIN_ROWS or u.ndim < 2:
            return flow(u)
        rows = u.size // u.shape[-1] if u.shape[-1] else 0
        if rows < _PACKED_MIN_ROWS or getattr(_INSIDE, "worker", False):
            return flow(u)
        if rows < _ROW_BLOCKS_MIN_ROWS:
            if (packed is None or not packed(u.dtype)) and (
                    u.size * (u.shape[-1] if width is None else width) < _SHORT_MIN_PRODUCT
                    or (whole is not None and whole(u.dtype))):
                return flow(u)
            least = _PACKED_BLOCK_ROWS
        elif whole is not None and whole(u.dtype):
            return flow(u)
        else:
            least = _BLOCK_ROWS
        flat = u.reshape(rows, u.shape[-1])
        out = np.empty((rows, u.shape[-1] if width is None else width), dtype=u.dtype)
        step = max(least, -(-rows // _MAX_BLOCKS))
        tasks = [slice(start, min(rows, start + step)) for start in range(0, rows, step)]

        def worker(next_task):
            while (block := next_task()) is not None:
                out[block] = flow(flat[block])

        run_blas_tasks(worker, tasks, True)
        return out.reshape(*u.shape[:-1], out.shape[-1])

    blocked.__wrapped__ = flow
    return blocked


# large FFTs run on the worker count too, one thread inside worker tasks (ctformer.fft sits
# below this package and cannot import it)
_fft.use_workers(num_threads, lambda: getattr(_INSIDE, "worker", False))
