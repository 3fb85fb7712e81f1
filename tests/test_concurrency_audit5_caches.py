"""Audit of the in-memory caches of a forward pass, called from 8 threads at once.

* ``get_backend`` is documented to return one shared :class:`Backend` per library (its FFT
  plans shared too). Its first call tested ``name not in _BACKENDS`` and then stored a new
  instance: threads that asked first at once each got their own (2 distinct backends in 9 of
  200 rounds of 8 threads at a 1 us switch interval; 8 of 8 when building one takes a moment),
  each with its own plan cache. Now one instance is kept, and every thread gets it.
* The caches that a forward pass fills (the discretizations per grids, the constants per
  dtype and device, the small-state plans of attention, feed-forward and normalization, the
  ALiBi slopes and the explicit patterns per array type, the backend's conversion cache)
  give every thread the bits of the same call made alone: 8 threads start together on cold
  caches of one shared model, with the plan caches shrunk so that they fill and empty while
  the others read them, NumPy and torch states, float32 and float64, padding masks.
"""
from __future__ import annotations

import copy
import sys
import threading
import time

import numpy as np
import pytest

import ctformer.backend as backend_module
from ctformer import ContinuousTransformer
from ctformer.operators import attention_flow, small_plans

THREADS = 8


def _together(work, count=THREADS):
    """Run ``work(i)`` on ``count`` threads released together; their results and errors."""
    barrier, results, errors = threading.Barrier(count), [None] * count, []

    def run(i):
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as error:  # reported by the test, with the thread's index
            errors.append((i, repr(error)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def test_threads_asking_first_for_a_backend_share_one(monkeypatch):
    """Before: 8 threads asking first at once got 8 distinct backends (the construction slowed
    by 10 ms to widen the window that a switch of threads hits by chance)."""
    monkeypatch.setattr(backend_module, "_BACKENDS", {})
    build = backend_module.Backend.__init__

    def slow(self, name):
        time.sleep(0.01)
        build(self, name)

    monkeypatch.setattr(backend_module.Backend, "__init__", slow)
    results, errors = _together(lambda i: backend_module.get_backend("numpy"))
    assert not errors
    kept = backend_module._BACKENDS["numpy"]
    assert sum(result is kept for result in results) == THREADS
    assert backend_module.backend_of(np.zeros(2)) is kept


def _models():
    return {
        "plain": ContinuousTransformer.random_smooth(seed=1, layers=1, heads=2),
        "causal_half": ContinuousTransformer.random_smooth(seed=2, layers=1, heads=2, mask="causal",
                                                           diagonal="half"),
        "alibi": ContinuousTransformer.random_smooth(seed=3, layers=1, heads=2, mask="causal",
                                                     positions="alibi", context_length=16),
        "window_alibi": ContinuousTransformer.random_smooth(seed=4, layers=1, heads=2, mask="causal", window=5,
                                                            positions="alibi", context_length=16),
        "rope_gqa": ContinuousTransformer.random_smooth(seed=5, layers=1, heads=4, kv_heads=2, positions="rope",
                                                        context_length=16, feedforward="swiglu",
                                                        normalization="rmsnorm"),
    }


def _cases(torch):
    rng = np.random.default_rng(0)
    cases = []
    for name in ("plain", "causal_half", "alibi", "window_alibi", "rope_gqa"):
        for shape in ((6, 8), (2, 9, 8), (11, 12), (3, 7, 6)):
            for dtype in (np.float64, np.float32):
                x = rng.standard_normal(shape).astype(dtype)
                padding = None
                if len(shape) == 3 and name != "causal_half":  # half diagonal: no padding
                    padding = np.ones(shape[:2], dtype=bool)
                    padding[0, -2:] = False
                cases.append((name, x, padding))
                if torch is not None and dtype == np.float64 and len(shape) == 3:
                    cases.append((name, torch.from_numpy(x.copy()),
                                  None if padding is None else torch.from_numpy(padding.copy())))
    return cases


def _host(out):
    return out.detach().numpy() if hasattr(out, "detach") else np.asarray(out)


def test_one_model_from_8_threads_gives_the_bits_of_each_call_alone(monkeypatch):
    """Every call of 8 threads on one model (caches cold, plan caches of 2 shapes: filled and
    emptied while read) equals, bit for bit and in dtype, the same call made alone."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:  # the NumPy cases still run
            torch = None
    cases = _cases(torch)
    alone = _models()
    expected = [_host(alone[name].run(x, padding_mask=padding)) for name, x, padding in cases]
    shared = {name: copy.deepcopy(model) for name, model in alone.items()}  # cold caches
    monkeypatch.setattr(attention_flow, "_SMALL_SHAPES", 2)
    monkeypatch.setattr(small_plans, "_SHAPES", 2)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(2e-5)  # switch threads often: inside the caches' reads and writes

    def work(i):
        order = np.random.default_rng(i).permutation(len(cases) * 2) % len(cases)
        wrong = []
        for j in order:
            name, x, padding = cases[j]
            out = _host(shared[name].run(x, padding_mask=padding))
            if out.dtype != expected[j].dtype or not np.array_equal(out, expected[j]):
                wrong.append((name, tuple(x.shape), str(x.dtype)))
        return wrong

    try:
        results, errors = _together(work)
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    assert all(result == [] for result in results), results
