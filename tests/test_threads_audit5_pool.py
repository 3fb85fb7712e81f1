"""The worker pool survives exceptions raised by signal handlers at any moment of a pass.

``ThreadPoolExecutor.submit`` takes Python-level locks (its idle semaphore's ``Condition``):
a ``KeyboardInterrupt`` raised by a ``SIGALRM`` handler between the lock's acquisition and the
``with`` block that releases it kept that lock for good. The pool's threads then hung after
their next task, a later pass raised ``RuntimeError: release unlocked lock``, and the
interpreter hung at exit joining the stuck threads (3 runs of 10-20 s of passes interrupted at
random moments: 3 hangs). A SIGINT handler that returns instead of raising stopped the
handing out of tasks for good: the pass returned with 37 of 40 tasks never run.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

threads_module = importlib.import_module("ctformer._numerics.threads")

_STRESS = textwrap.dedent("""
    import faulthandler, json, random, signal, sys, time
    import numpy as np
    faulthandler.dump_traceback_later(90, exit=True)  # a hang ends the process, with its stacks
    from ctformer._numerics import threads
    from ctformer.operators.quadrature_attention import quadrature_attention

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 300, 16)) for _ in range(3))
    before = quadrature_attention(q, k, v, beta=0.7, mask="causal")

    def interrupt(signum, frame):
        raise KeyboardInterrupt("alarm")

    signal.signal(signal.SIGALRM, interrupt)
    pick = random.Random(1)
    counts = np.zeros(64, dtype=np.int64)

    def worker(next_task):
        while (task := next_task()) is not None:
            counts[task] += 1

    passes = interrupted = incomplete = 0
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        counts[:] = 0
        try:
            signal.setitimer(signal.ITIMER_REAL, pick.uniform(1e-6, 3e-4))
            threads.run_workers(worker, list(range(64)), pick.choice((2, 3, 4)))
            passes += 1
            incomplete += int(not (counts == 1).all())  # a pass that returns did every task once
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupted += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    after = quadrature_attention(q, k, v, beta=0.7, mask="causal")
    print(json.dumps({"passes": passes, "interrupted": interrupted, "incomplete": incomplete,
                      "equal": bool(np.array_equal(after, before))}), flush=True)
""")


def test_keyboard_interrupts_from_a_timer_never_hang_the_pool():
    """Passes on 2-4 threads, each interrupted by a SIGALRM handler's KeyboardInterrupt at a
    random moment (1-300 us in) for 4 s: the process neither hangs nor raises anything else,
    every pass that returns did all its tasks, the streamed attention afterwards has the bits
    of the one before, and the interpreter exits (it used to hang joining the pool)."""
    env = dict(os.environ, CTFORMER_NUM_THREADS="3")
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", _STRESS, "4"], env=env, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["interrupted"] > 100 and report["passes"] > 100, report
    assert report["incomplete"] == 0 and report["equal"], report
    assert time.monotonic() - start < 200


def test_a_sigint_handler_that_returns_leaves_no_task_undone():
    """A program's own SIGINT handler that only records the signal: the pass used to return
    with the tasks after the signal never run (3 of 40 done); now all 40 are done, once each,
    and the handler ran once."""
    assert threading.current_thread() is threading.main_thread()
    seen, done = [], []

    def worker(next_task):
        while (task := next_task()) is not None:
            if task == 2:
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.005)
            done.append(task)

    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        threads_module.run_workers(worker, list(range(40)), 2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sorted(done) == list(range(40)) and seen == [signal.SIGINT]


def test_row_blocks_are_whole_after_a_sigint_that_a_handler_absorbs(monkeypatch):
    """A token-wise map by row blocks (1400 rows, 6 blocks on 2 threads) with a SIGINT sent
    during the first block and a handler that returns: the result equals the map of the whole
    input (NumPy's product of the same numbers). Before, the blocks after the signal were left
    as ``numpy.empty`` gave them."""
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 48))
    u = rng.standard_normal((2, 700, 64))
    sent = []

    def flow(v):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.02)
        return v @ w

    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        got = threads_module.by_row_blocks(flow, width=48)(u)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert sent and got.shape == (2, 700, 48)
    np.testing.assert_allclose(got, u @ w, rtol=1e-13, atol=1e-13)
