"""Planned pyFFTW transforms (ctformer.fft) against numpy.fft, the independent reference."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from ctformer.backend import get_backend
from ctformer.fft import PlannedFFT


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(params=[(1, "fftw"), (2, "fftw"), (1, "auto")], ids=["1 thread", "2 threads", "auto"])
def fft(request, monkeypatch):
    # a tiny threading threshold so that the 2-thread plans really run threaded
    monkeypatch.setattr("ctformer.fft._THREADED_MIN_POINTS", 16)
    threads, engine = request.param
    return PlannedFFT(threads=threads, engine=engine)


@pytest.mark.parametrize("shape, axis", [((64,), -1), ((7, 48), -1), ((33, 5), 0), ((3, 17, 9), 1), ((2, 3, 128), 2)])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_rfft_irfft_equal_numpy(rng, fft, shape, axis, dtype, tol):
    x = rng.standard_normal(shape).astype(dtype)
    X = fft.rfft(x, axis=axis)
    ref = np.fft.rfft(x, axis=axis)
    assert X.dtype == ref.dtype and X.shape == ref.shape
    assert _rel(X, ref) < tol
    n = shape[axis]
    back = fft.irfft(ref, n=n, axis=axis)
    assert back.dtype == x.dtype
    assert _rel(back, np.fft.irfft(ref, n=n, axis=axis)) < tol
    assert _rel(back, x) < tol


def test_padding_truncation_and_default_length(rng, fft):
    x = rng.standard_normal((4, 20))
    for n in (8, 20, 31):
        assert _rel(fft.rfft(x, n=n), np.fft.rfft(x, n=n)) < 1e-13
        X = np.fft.rfft(x)
        assert _rel(fft.irfft(X, n=n), np.fft.irfft(X, n=n)) < 1e-13
    X = np.fft.rfft(x)
    assert _rel(fft.irfft(X), np.fft.irfft(X)) < 1e-13  # n = 2 (m - 1) = 20


def test_non_contiguous_misaligned_read_only_and_list_inputs(rng, fft):
    base = rng.standard_normal((9, 41))
    strided = base[:, ::2]
    misaligned = np.frombuffer(np.r_[0.0, base.ravel()].tobytes()[8:], dtype=np.float64).reshape(9, 41)
    read_only = base.copy()
    read_only.setflags(write=False)
    broadcast = np.broadcast_to(base[0], (5, 41))
    for x in (strided, misaligned, read_only, broadcast, base.T):
        assert _rel(fft.rfft(x), np.fft.rfft(x)) < 1e-13
    assert _rel(fft.rfft(base[0].tolist()), np.fft.rfft(base[0])) < 1e-13
    X = np.fft.rfft(base)
    assert _rel(fft.irfft(X[:, ::1].T, n=41, axis=0), np.fft.irfft(X.T, n=41, axis=0)) < 1e-13


def test_inputs_are_preserved_and_outputs_never_aliased(rng, fft):
    a, b = rng.standard_normal((2, 6, 32))
    a0 = a.copy()
    fa = fft.rfft(a)
    fb = fft.rfft(b)  # the same plan: must not overwrite fa
    assert np.array_equal(a, a0)
    assert _rel(fa, np.fft.rfft(a)) < 1e-13 and _rel(fb, np.fft.rfft(b)) < 1e-13
    spectrum = np.fft.rfft(a)
    s0 = spectrum.copy()
    ia = fft.irfft(spectrum, n=32)
    ib = fft.irfft(np.fft.rfft(b), n=32)
    assert np.array_equal(spectrum, s0)  # complex-to-real plans destroy their input: not ours
    assert _rel(ia, a) < 1e-14 and _rel(ib, b) < 1e-14


def test_repeated_calls_skip_the_checks_and_keep_the_values(rng, fft, monkeypatch):
    """A call seen before (ndarray, shape, dtype, axis, n) goes straight to its plan: the first
    calls' checks are not run again, and the values are those of numpy.fft for inputs of any
    layout with that shape (strided, misaligned, read-only). Only transforms below the
    threading threshold take this path: a larger one's plan depends on the calling context
    (tests/test_fft_plan_context.py), so the fixture's tiny threshold is lifted here."""
    monkeypatch.setattr("ctformer.fft._THREADED_MIN_POINTS", 1 << 18)
    x = rng.standard_normal((6, 40))
    spectrum = np.fft.rfft(x)
    fft.rfft(x), fft.irfft(spectrum, n=40)
    monkeypatch.setattr(fft, "_rfft_first", lambda *a: pytest.fail("rfft checked again"))
    monkeypatch.setattr(fft, "_irfft_first", lambda *a: pytest.fail("irfft checked again"))
    misaligned = np.frombuffer(np.r_[0.0, x.ravel()].tobytes()[8:], dtype=np.float64).reshape(6, 40)
    read_only = x.copy()
    read_only.setflags(write=False)
    for y in (rng.standard_normal((6, 40)), rng.standard_normal((6, 80))[:, ::2], misaligned, read_only):
        assert _rel(fft.rfft(y), np.fft.rfft(y)) < 1e-13
        z = np.fft.rfft(y)
        assert _rel(fft.irfft(z, n=40), y) < 1e-13
        assert _rel(fft.irfft(np.asfortranarray(z), n=40), y) < 1e-13


def test_convolution_through_the_backend_equals_numpy_fft(rng):
    from ctformer.discretizations import Fourier
    from ctformer.kernels import Convolution

    assert isinstance(get_backend("numpy").fft, PlannedFFT)
    kernel = Convolution(lambda z: np.exp(np.cos(2 * np.pi * z)))
    for m in (16, 256, 1024):
        grid = Fourier(m)
        u = rng.standard_normal((8, m))
        ref = np.fft.irfft(np.fft.rfft(u, axis=-1) * kernel.symbol(grid), n=m, axis=-1)
        assert _rel(kernel.apply(u, grid, grid), ref) < 1e-13
    dense = kernel.matrix(grid, grid)  # the independent O(m^2) product
    assert _rel(kernel.apply(u, grid, grid), u @ dense.T) < 1e-12


def test_threads_share_one_object(rng):
    fft = PlannedFFT(threads=1)
    xs = [rng.standard_normal((16, 256)) for _ in range(4)]
    results = [None] * 4

    def run(i):
        for _ in range(20):
            results[i] = fft.irfft(fft.rfft(xs[i]), n=256)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for x, r in zip(xs, results):
        assert _rel(r, x) < 1e-14


def test_measured_plans_equal_numpy(rng):
    fft = PlannedFFT(threads=1, effort="FFTW_MEASURE", engine="fftw")
    x = rng.standard_normal((4, 64))
    assert _rel(fft.rfft(x), np.fft.rfft(x)) < 1e-13
    assert _rel(fft.irfft(np.fft.rfft(x), n=64), x) < 1e-14


def test_other_functions_go_through_scipy_interface(rng):
    import scipy.fft

    fft = PlannedFFT(threads=1)
    z = rng.standard_normal((3, 10)) + 1j * rng.standard_normal((3, 10))
    assert _rel(fft.fft(z, axis=1), np.fft.fft(z, axis=1)) < 1e-13
    x = rng.standard_normal((3, 9))
    assert _rel(fft.dct(x, type=1, axis=1), scipy.fft.dct(x, type=1, axis=1)) < 1e-13


def test_bad_arguments_and_environment(rng, monkeypatch):
    fft = PlannedFFT(threads=1)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        fft.rfft(np.ones(8), n=0)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        fft.rfft(np.ones((2, 8)), axis=2)
    with pytest.raises(TypeError, match="rfft needs real input"):
        fft.rfft(np.ones(8) + 1j)
    monkeypatch.setenv("CTFORMER_FFT_THREADS", "zero")
    with pytest.raises(ValueError, match="CTFORMER_FFT_THREADS must be a positive integer"):
        PlannedFFT()
    monkeypatch.setenv("CTFORMER_FFT_THREADS", "2")
    monkeypatch.setenv("CTFORMER_FFTW_PLANNER", "FFTW_FAST")
    with pytest.raises(ValueError, match="CTFORMER_FFTW_PLANNER must be one of"):
        PlannedFFT()
    monkeypatch.setenv("CTFORMER_FFTW_PLANNER", "FFTW_ESTIMATE")
    assert PlannedFFT().threads == 2
    monkeypatch.setenv("CTFORMER_FFT_ENGINE", "mkl")
    with pytest.raises(ValueError, match="CTFORMER_FFT_ENGINE must be one of auto, fftw, numpy"):
        PlannedFFT()
    with pytest.raises(ValueError, match="engine must be one of"):
        PlannedFFT(engine="cufft")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_engines_agree_and_auto_keeps_one_of_them(rng, dtype):
    """numpy is numpy.fft bit for bit; fftw agrees to rounding; auto is exactly one of the two,
    chosen once per plan (the same engine on every later call)."""
    x = rng.standard_normal((16, 256)).astype(dtype)
    spectrum = np.fft.rfft(x)
    by = {engine: PlannedFFT(threads=1, engine=engine) for engine in ("numpy", "fftw", "auto")}
    forward = {e: f.rfft(x) for e, f in by.items()}
    backward = {e: f.irfft(spectrum, n=256) for e, f in by.items()}
    np.testing.assert_array_equal(forward["numpy"], spectrum)
    np.testing.assert_array_equal(backward["numpy"], np.fft.irfft(spectrum, n=256))
    tol = 1e-13 if dtype == np.float64 else 2e-6
    assert _rel(forward["fftw"], spectrum) < tol and _rel(backward["fftw"], x) < tol
    for results in (forward, backward):
        assert any(np.array_equal(results["auto"], results[e]) for e in ("numpy", "fftw"))
    again = by["auto"].rfft(x)
    np.testing.assert_array_equal(again, forward["auto"])


def _planned_threads(monkeypatch, fft):
    """The thread counts of the FFTW plans ``fft`` makes from now on, in order."""
    made = []
    original = PlannedFFT._fftw

    def record(self, kind, source, target, axis, threads):
        made.append(threads)
        return original(self, kind, source, target, axis, threads)

    monkeypatch.setattr(PlannedFFT, "_fftw", record)
    return made


def test_large_transforms_run_on_the_workers_count_by_default(rng, monkeypatch):
    """Unset, CTFORMER_FFT_THREADS means the library's worker count, read when a plan is made;
    below 2^18 points, and inside worker tasks, one thread. The threaded plans give the bits
    of one-thread plans (checked as each is made) and numpy.fft's values to rounding."""
    from ctformer._numerics import threads

    monkeypatch.delenv("CTFORMER_FFT_THREADS", raising=False)
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "3")
    fft = PlannedFFT(engine="fftw")
    assert fft.threads is None
    made = _planned_threads(monkeypatch, fft)
    x = rng.standard_normal((8, 1 << 15))                    # 2^18 points: threaded
    spectrum = fft.rfft(x)
    back = fft.irfft(spectrum, n=x.shape[-1])
    assert made == [3, 1, 3, 1]  # each threaded plan, then the one-thread plan it is checked against
    single = PlannedFFT(threads=1, engine="fftw")
    assert np.array_equal(spectrum, single.rfft(x)) and np.array_equal(back, single.irfft(spectrum, n=x.shape[-1]))
    assert _rel(spectrum, np.fft.rfft(x)) < 1e-13 and _rel(back, x) < 1e-13
    made.clear()
    fft.rfft(rng.standard_normal((7, 1 << 15)))  # 7 x 2^15 < 2^18 points: one thread
    threads.run_workers(lambda next_task: next_task() and fft.rfft(x[:, :-2]), [1], 2)  # inside a worker
    assert made == [1, 1]
    monkeypatch.setenv("CTFORMER_FFT_THREADS", "2")
    assert PlannedFFT().threads == 2


def test_a_threaded_plan_that_rounds_differently_is_replaced(rng, monkeypatch):
    monkeypatch.setattr("ctformer.fft.same_bits", lambda threaded, single, source: False)
    fft = PlannedFFT(threads=2, engine="fftw")
    made = _planned_threads(monkeypatch, fft)
    x = rng.standard_normal((8, 1 << 15))
    assert _rel(fft.rfft(x), np.fft.rfft(x)) < 1e-13
    assert made == [2, 1, 1]  # threaded, the one-thread check, then the one-thread plan kept


def test_the_bit_check_compares_real_plans():
    from ctformer.fft import same_bits

    fft = PlannedFFT(threads=1)
    source, target = fft._empty((4, 96), np.float64), fft._empty((4, 49), np.complex128)
    two = fft._fftw("rfft", source, target, -1, 2)
    one = fft._fftw("rfft", fft._empty((4, 96), np.float64), fft._empty((4, 49), np.complex128), -1, 1)
    assert same_bits(two, one, source)
    assert not same_bits(_Scaled(two), one, source)


class _Scaled:
    """A plan whose results are 1 + 2^-40 times another's (as a plan that rounds differently)."""

    def __init__(self, plan):
        self.plan, self.input_array = plan, plan.input_array

    def execute(self):
        self.plan.execute()
        self.output_array = self.plan.output_array * (1 + 2.0 ** -40)


_FORK_CHECK = """
import multiprocessing, sys
import numpy as np
from ctformer.fft import PlannedFFT

fft = PlannedFFT(threads=2, engine="fftw")
x = np.random.default_rng(0).standard_normal((8, 1 << 15))  # 2^18 points: a threaded plan
parent = fft.rfft(x)


def child(queue):
    queue.put(bool(np.array_equal(fft.rfft(x), parent)))  # a bool: a large item would hold the child


context = multiprocessing.get_context("fork")
queue = context.Queue()
process = context.Process(target=child, args=(queue,))
process.start()
process.join(60)
if process.is_alive():
    process.kill()
    sys.exit("hung")
print(process.exitcode == 0 and queue.get(timeout=10))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork is POSIX only")
def test_a_forked_child_does_not_wait_for_fftws_threads():
    """FFTW's threads do not survive a fork: the parent's threaded plan, run in a forked
    child, waited forever. The child's PlannedFFT drops the parent's plans and plans on one
    thread (the same bits: threaded plans are kept only with one thread's bits). Run in a
    fresh interpreter, without the suite's one-thread limits (under them FFTW's OpenMP
    threads are one, and nothing would hang)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", _FORK_CHECK], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]
