"""Audit of the library called from several threads (and processes) at once, caches cold.

* A measurement of the store (the dense-against-FFT crossover of convolutions) times FFTs
  whose engines it stored first. Another thread's transforms could evict those plans from the
  process's plan cache in between; the measurement then asked the store for the engine again,
  under the store's lock, and the store refused: ``RuntimeError: ... which is not stored
  yet``, though it was stored. A user's ``Convolution.apply`` failed with it.
* Threads that start together on a fresh store (first measurements, plans, kernels) and
  processes that share one store give exactly the results of the same calls made alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from ctformer._numerics import convolution_route, store
from ctformer.backend import get_backend
from ctformer.discretizations import Midpoint
from ctformer.fft import _MAX_PLANS, PlannedFFT
from ctformer.kernels import Convolution


def _profile(z):
    return np.exp(np.cos(2 * np.pi * z))


def test_a_measurement_reads_engines_that_another_threads_plans_evicted(fresh_store, monkeypatch):
    """Between the route's first transforms (their engines stored) and the measurement, another
    thread runs more distinct transforms than the plan cache keeps: the measurement re-plans and
    reads the stored engines. Before: RuntimeError "... which is not stored yet"."""
    backend = get_backend("numpy")
    monkeypatch.setattr(backend, "fft", PlannedFFT(effort="FFTW_ESTIMATE", engine="auto"))
    route = convolution_route._fft_route

    def route_then_evicted(dtype):
        route(dtype)
        other = threading.Thread(target=lambda: [backend.fft.rfft(np.zeros((2, m)), axis=-1)
                                                 for m in range(17, 18 + _MAX_PLANS)])
        other.start()
        other.join()

    monkeypatch.setattr(convolution_route, "_fft_route", route_then_evicted)
    n = 64
    u = np.random.default_rng(0).standard_normal((8, n)).astype(np.float32)
    got = Convolution(_profile).apply(u, Midpoint(n), Midpoint(n))
    # the circulant matrix A_ij = p(((i - j) mod n) / n) / n, in float64
    i = np.arange(n)
    matrix = _profile(((i[:, None] - i[None, :]) % n) / n) / n
    np.testing.assert_allclose(got, u.astype(np.float64) @ matrix.T, rtol=2e-5, atol=2e-5)
    stored = store.read(store.cache_file())["convolution dense float32"]
    assert convolution_route.dense_below(np.float32) == stored["dense_below"]


def test_a_measurement_asking_for_a_choice_not_stored_is_refused(fresh_store):
    """Measuring one choice may not measure another (the lock is held): a clear RuntimeError."""
    def outer(dtype):
        store.entry("inner", "float64", lambda _: {"provider": "numpy"}, needs_torch=False)
        return {"provider": "numpy"}

    with pytest.raises(RuntimeError, match="measuring 'outer float64' asked for 'inner float64', which is "
                                           "not stored yet: the measurement's caller must ask for it first"):
        store.entry("outer", "float64", outer, needs_torch=False)


_THREADS = """
    import json, os, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np
    from ctformer import ContinuousTransformer
    from ctformer.backend import get_backend
    from ctformer.discretizations import Midpoint
    from ctformer.fft import PlannedFFT
    from ctformer.kernels import Convolution
    from ctformer.operators.local_attention import local_attention
    from ctformer.operators.quadrature_attention import quadrature_attention
    from ctformer.particles.dynamics import SelfAttentionDynamics

    def data(seed, shape, dtype):
        return np.random.default_rng(seed).standard_normal(shape).astype(dtype)

    def model(seed, shape, dtype):
        m = ContinuousTransformer.random_smooth(seed=seed)
        return lambda: m.run(data(seed, shape, dtype))

    def attention(seed, n, dtype, local):
        q, k, v = (data(seed + i, (2, n, 8), dtype) for i in range(3))
        if local:
            return lambda: local_attention(q, k, v, beta=0.5, causal=True)
        return lambda: quadrature_attention(q, k, v, beta=0.5)

    def transforms(seed, rows, m, dtype, fft):
        x = data(seed, (rows, m), dtype)
        return lambda: fft.irfft(0.5 * fft.rfft(x, axis=-1), n=m, axis=-1)

    def convolution(seed, rows, m, dtype):
        kernel, grid, u = Convolution(lambda z: np.exp(np.cos(2 * np.pi * z))), Midpoint(m), data(seed, (rows, m), dtype)
        return lambda: kernel.apply(u, grid, grid)

    def particles(seed, n, d, dtype):
        x = data(seed, (n, d), dtype)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return lambda: SelfAttentionDynamics(beta=1.0).solve(x, 0.3, 0.1).positions

    shared = get_backend("numpy").fft
    calls = [model(0, (2, 16, 8), np.float64), model(1, (1, 300, 8), np.float32),
             attention(2, 300, np.float64, False), attention(3, 64, np.float32, True),
             transforms(4, 64, 256, np.float64, shared), transforms(5, 32, 512, np.float32, shared),
             transforms(6, 8, 1000, np.float64, PlannedFFT(engine="fftw")),
             transforms(7, 8, 96, np.float32, PlannedFFT(engine="numpy")),
             convolution(8, 64, 64, np.float32), convolution(9, 16, 512, np.float64),
             particles(10, 16, 3, np.float64)]
    threads = 4
    barrier = threading.Barrier(threads)

    def worker(first):
        barrier.wait()  # first calls together: measurements, plans, kernels
        return [(j, np.asarray(calls[j]())) for rep in range(2)
                for j in [(first + i) % len(calls) for i in range(len(calls))]]

    with ThreadPoolExecutor(threads) as pool:
        together = [r for rs in pool.map(worker, range(threads)) for r in rs]
    alone = [np.asarray(call()) for call in calls]
    np.savez(sys.argv[1], *alone)
    print(json.dumps([j for j, got in together if not np.array_equal(got, alone[j])]))
"""


def test_threads_and_processes_on_a_fresh_store_give_the_results_made_alone(tmp_path):
    """Two processes start together on one empty store, each running eleven calls (networks,
    attention, both FFT engines, convolutions, particles) from four threads at once, twice: every
    result equals the call made alone afterwards, the two processes agree bit for bit, and the
    store is one valid JSON file."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("CTFORMER_GEMM", None)
    script = textwrap.dedent(_THREADS)
    runs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"{i}.npz")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == []
    first, second = (np.load(tmp_path / f"{i}.npz") for i in range(2))
    assert all(np.array_equal(first[name], second[name]) for name in first.files)
    files = list((tmp_path / "cache" / "ctformer").glob("*.json"))
    assert len(files) == 1
    kept = json.loads(files[0].read_text())
    assert {"convolution dense float32", "convolution dense float64", "products float64"} <= set(kept)
