"""A parallel pass leaves torch's thread count as it found it.

Two ways a NumPy pass had changed the thread count of every later torch call in the process,
and with it the bits of torch's reductions (they split their sums by thread count):

* torch loaded inside a pass, on a thread the pass holds on one CPU (the default placement
  where the workers are as many as the CPUs): GNU OpenMP counted that one CPU, and torch ran
  on one thread for the rest of the process. On two CPUs, ``quadrature_attention`` on NumPy
  arrays and then ``import torch`` gave ``torch.get_num_threads() == 1`` (2 without the pass).
* ``torch.set_num_threads(1)`` on a pool thread (its products run on one thread) also sets
  the count that every thread which has not used torch yet starts with: a user's thread
  started after the pass ran torch on one thread.

``adjoint.gradient``'s parameter gradients then differed between ``CTFORMER_NUM_THREADS`` = 2
and 3 after a NumPy solve (by up to 1.2e-10 in float32 and 4.4e-16 in float64). Each case
runs in a fresh process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from tests.conftest import require

_FRESH = """
    import json, os, sys, threading
    import numpy as np

    def on_a_new_thread(call):
        out = []
        thread = threading.Thread(target=lambda: out.append(call()))
        thread.start()
        thread.join()
        return out[0]
"""

_LOADED_IN_A_PASS = _FRESH + """
    from ctformer._numerics import threads, torch_threads

    cpus = len(os.sched_getaffinity(0))

    def worker(next_task):  # torch first loaded by a task, as a pass's products load it
        while next_task() is not None:
            torch_threads._torch()

    threads.run_workers(worker, list(range(4 * cpus)), cpus)
    import torch
    print(json.dumps({"main": torch.get_num_threads(),
                      "new thread": on_a_new_thread(torch.get_num_threads)}))
"""

_PLAIN = _FRESH + """
    import torch
    print(json.dumps({"main": torch.get_num_threads(),
                      "new thread": on_a_new_thread(torch.get_num_threads)}))
"""

_SET_BY_THE_POOL = _FRESH + """
    import torch
    from ctformer import ContinuousTransformer, adjoint
    from ctformer._numerics import gemm, threads
    from ctformer.discretizations import GaussLegendre

    model = ContinuousTransformer.random_smooth(seed=6, layers=2, heads=2)

    def gradients():
        out = {}
        for dtype in (torch.float32, torch.float64):
            u0 = torch.from_numpy(np.random.default_rng(17).standard_normal((17, 12))).to(dtype)
            _, params = adjoint.gradient(model, u0, lambda u: (u ** 2).sum(), tokens=GaussLegendre(17),
                                         features=GaussLegendre(12), scheme="rk4", steps_per_layer=2,
                                         route="autograd", parameters=True)
            out.update({f"{dtype}-{name}": g.numpy() for name, g in params.items()})
        return out

    before = on_a_new_thread(gradients)
    count = on_a_new_thread(torch.get_num_threads)
    meet = threading.Barrier(2, timeout=60)
    a, b = np.ones((64, 64)), np.ones((64, 64))

    def worker(next_task):  # a task each; the pool thread's product on one torch thread
        while next_task() is not None:
            meet.wait()
            if threading.current_thread() is not threading.main_thread():
                gemm.torch_matmul(a, b, np.empty((64, 64)))

    threads.run_workers(worker, [0, 1], 2)
    after = on_a_new_thread(gradients)
    differ = {name: float(np.max(np.abs(after[name].astype(np.float64) - before[name])))
              for name in before if not np.array_equal(before[name], after[name])}
    print(json.dumps({"before": count, "after": on_a_new_thread(torch.get_num_threads),
                      "main": torch.get_num_threads(), "differ": differ, "gradients": len(before),
                      "finite": all(bool(np.all(np.isfinite(g))) for g in before.values())}))
"""


def _run(script, **settings):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "CTFORMER_NUM_THREADS")}
    env.update(settings)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_torch_loaded_inside_a_pass_keeps_its_default_thread_count():
    """torch first loaded by the tasks of a pass on as many threads as CPUs (caller and workers
    held on one CPU each): the thread count of torch loaded by a plain ``import torch`` in a
    process of the same settings, on the main thread and on a thread started afterwards."""
    require("torch")
    plain = _run(_PLAIN)
    assert plain["main"] >= 1
    assert _run(_LOADED_IN_A_PASS) == plain
    assert _run(_LOADED_IN_A_PASS, CTFORMER_PLACEMENT="off") == plain


def test_a_pool_thread_setting_torch_to_one_thread_leaves_new_threads_alone():
    """A pass whose pool thread multiplies on one torch thread: a thread started afterwards
    gets torch's default (two, ``OMP_NUM_THREADS=2``) as one started before did (one,
    before), the caller keeps its two, and ``adjoint.gradient``'s parameter gradients on
    such a thread have the bits of those computed before the pass."""
    require("torch")
    report = _run(_SET_BY_THE_POOL, OMP_NUM_THREADS="2", CTFORMER_GEMM="torch")
    assert report["before"] == 2
    assert report["after"] == 2
    assert report["main"] == 2
    assert report["gradients"] > 20 and report["finite"]
    assert report["differ"] == {}


def test_the_callers_own_count_stays(monkeypatch):
    """A caller that set torch to 3 threads keeps 3 after a pass of two threads whose pool
    thread multiplied on one, and a thread started afterwards gets 3 (torch's rule: the last
    count the user set)."""
    torch = require("torch")
    import threading

    from ctformer._numerics import gemm, threads

    before = torch.get_num_threads()
    meet = threading.Barrier(2, timeout=60)
    a = np.arange(64.0 * 64).reshape(64, 64) / 4096
    out = np.empty((64, 64))

    def worker(next_task):  # a task each; the pool thread's product on one torch thread
        while next_task() is not None:
            meet.wait()
            if threading.current_thread() is not threading.main_thread():
                gemm.torch_matmul(a, a, out)

    torch.set_num_threads(3)
    try:
        threads.run_workers(worker, [0, 1], 2)
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert torch.get_num_threads() == 3
        assert seen == [3]
    finally:
        torch.set_num_threads(before)
    assert np.allclose(out, a @ a, rtol=1e-14, atol=0)
