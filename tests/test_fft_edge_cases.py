"""Edge cases of the planned FFTs (ctformer.fft) and the periodic convolution kernel
(ctformer.kernels.Convolution) against independent references: numpy.fft and the dense
circulant product."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from ctformer.discretizations import Midpoint
from ctformer.fft import PlannedFFT
from ctformer.kernels import Convolution


def _profile(z):
    return np.exp(np.cos(2 * np.pi * z)) + 0.3 * np.sin(2 * np.pi * z)


def _circulant(n):
    """The dense matrix A_ij = p(((i - j) mod n) / n) / n, built entry by entry."""
    c = _profile(np.arange(n) / n) / n
    return np.array([[c[(i - j) % n] for j in range(n)] for i in range(n)])


def _rel(ours, ref):
    ref = np.asarray(ref, dtype=np.float64) if np.isrealobj(ref) else np.asarray(ref, dtype=np.complex128)
    return float(np.abs(np.asarray(ours).astype(ref.dtype) - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("engine", ["fftw", "numpy"])
@pytest.mark.parametrize("n", [1, 2, 3, 97, 256, 1009, 1 << 16])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_planned_transforms_match_numpy_fft(engine, n, dtype, tol):
    fft = PlannedFFT(effort="FFTW_ESTIMATE", engine=engine)
    x = np.random.default_rng(n).standard_normal((3, n)).astype(dtype)
    for rows in (x, x[::-1, ::-1], np.asfortranarray(x)):  # contiguous, negative strides, Fortran order
        ref = np.fft.rfft(rows.astype(np.float64))
        for _ in range(2):  # the first call and the repeated call's fast path
            spectrum = fft.rfft(rows)
            assert spectrum.dtype == np.result_type(dtype, np.complex64) and _rel(spectrum, ref) <= tol
            for m in (n, n + 1):
                back = fft.irfft(spectrum, n=m)
                assert back.dtype == dtype and _rel(back, np.fft.irfft(ref, n=m)) <= tol


@pytest.mark.parametrize("n", [15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_both_routes_give_the_dense_circulant_product_around_the_crossover(n, dtype, tol):
    grid = Midpoint(n)
    u = np.random.default_rng(n).standard_normal((4, n)).astype(dtype)
    ref = u.astype(np.float64) @ _circulant(n).T
    for dense_below in (0, 10 ** 9, None):  # always FFT, always dense, this machine's crossover
        kernel = Convolution(_profile)
        kernel.dense_below = dense_below
        for rows, expected in ((u, ref), (u[::-1], ref[::-1])):
            result = kernel.apply(rows, grid, grid)
            assert result.dtype == dtype and _rel(result, expected) <= tol


@pytest.mark.parametrize("dtype, tol", [(np.float16, 2e-3), (np.longdouble, 1e-14)])
def test_other_float_dtypes_are_kept_on_both_routes(dtype, tol):
    # the FFT route's transforms return float64; it used to hand that back for float16 and
    # longdouble rows, while the dense route (and every other kernel) kept the rows' dtype
    n = 300
    grid = Midpoint(n)
    u = np.random.default_rng(0).standard_normal((4, n)).astype(dtype)
    ref = u.astype(np.float64) @ _circulant(n).T
    for dense_below in (0, 10 ** 9):
        kernel = Convolution(_profile)
        kernel.dense_below = dense_below
        result = kernel.apply(u, grid, grid)
        assert result.dtype == dtype and _rel(result, ref) <= tol


def test_half_precision_torch_tensors_are_convolved():
    torch = pytest.importorskip("torch")
    n = 64
    grid = Midpoint(n)
    ref_rows = np.random.default_rng(1).standard_normal((4, n))
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1e-2)):
        u = torch.from_numpy(ref_rows).to(dtype)  # torch.fft has no half-precision CPU kernels
        result = Convolution(_profile).apply(u, grid, grid)
        ref = u.double().numpy() @ _circulant(n).T
        assert result.dtype == dtype and _rel(result.double().numpy(), ref) <= tol


def test_threads_sharing_one_object_get_the_bits_of_one_thread():
    x = np.random.default_rng(2).standard_normal((16, 1000))
    alone = PlannedFFT(effort="FFTW_ESTIMATE", engine="fftw")
    expected = alone.irfft(alone.rfft(x) * 0.5, n=1000)
    shared = PlannedFFT(effort="FFTW_ESTIMATE", engine="fftw")
    results, barrier = [], threading.Barrier(4)

    def work():
        barrier.wait()
        for _ in range(50):
            results.append(shared.irfft(shared.rfft(x) * 0.5, n=1000))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 200 and all(np.array_equal(r, expected) for r in results)
    assert _rel(expected, 0.5 * x) <= 1e-15


@pytest.mark.parametrize("axis", [0.0, 1.0, True])
def test_an_axis_that_is_not_an_integer_is_refused_by_name(axis):
    """0.0 on a 2-D array was a bare "tuple indices" TypeError, 1.0 on a 1-D one "out of range"."""
    from ctformer.fft import PlannedFFT

    with pytest.raises(TypeError, match="axis must be an integer"):
        PlannedFFT().rfft(np.ones((4, 8)), axis=axis)
    with pytest.raises(TypeError, match="axis must be an integer"):
        PlannedFFT().irfft(np.ones((4, 5), dtype=complex), axis=axis)
    np.testing.assert_allclose(PlannedFFT().rfft(np.arange(8.0).reshape(2, 4), axis=0),
                               np.fft.rfft(np.arange(8.0).reshape(2, 4), axis=0), atol=1e-15)
