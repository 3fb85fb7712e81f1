"""Audit of the planned FFTs and FFT convolutions: every grid size that matters (powers of
two, 2^k +- 1, odd, primes) on both engines against long-double transforms, the cache of
repeated calls across dtypes, byte orders and argument types, and the FFT settings.
References: ``scipy.fft`` in long double, the dense circulant matrix, ``numpy.fft`` in float64."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.fft

from ctformer.discretizations import Midpoint
from ctformer.fft import PlannedFFT, planner_effort
from ctformer.kernels import Convolution

SIZES = (1, 2, 3, 7, 16, 17, 31, 97, 127, 128, 129, 509, 1023, 1024, 1025, 4093, 4096, 8191,
         16384, 16385, 65521, 65535, 65536)
TOL = {np.float32: 2e-6, np.float64: 1e-14}


def _engine(engine):
    # pinned engine and estimated plans: no measured choice is stored by these tests
    return PlannedFFT(threads=1, effort="FFTW_ESTIMATE", engine=engine)


@pytest.mark.parametrize("engine", ["fftw", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fft_convolutions_of_every_size_match_long_double(engine, dtype):
    """Worst relative errors measured: 6.0e-7 (float32) and 2.4e-15 (float64) up to M = 65536."""
    fft, rng = _engine(engine), np.random.default_rng(7)
    for m in SIZES:
        u, c = rng.standard_normal((2, m)), rng.standard_normal(m)
        exact = scipy.fft.irfft(scipy.fft.rfft(u.astype(np.longdouble), axis=-1)
                                * scipy.fft.rfft(c.astype(np.longdouble)), n=m, axis=-1)
        symbol = np.fft.rfft(c).astype(np.complex64 if dtype == np.float32 else np.complex128)
        for _ in range(2):  # the first call plans, the second takes the fast path
            spectrum = fft.rfft(u.astype(dtype), axis=-1)
            spectrum *= symbol
            got = fft.irfft(spectrum, n=m, axis=-1)
            assert got.dtype == dtype and got.shape == (2, m)
            error = float(np.abs(got - exact).max() / np.abs(exact).max())
            assert error < TOL[dtype] * max(1.0, np.log2(m)), (m, error)


@pytest.mark.parametrize("engine", ["fftw", "numpy"])
@pytest.mark.parametrize("dtype", ["float16", "longdouble", "int64", ">f8"])
def test_a_repeated_transform_of_a_converted_dtype_gives_the_first_calls_bits(engine, dtype):
    """With numpy.fft running the plan, the second call of a float16 or long-double input
    reused the first call's float64 plan on the unconverted array: complex64 (float16) or
    complex256 (long double) came back where complex128 came first, 1.4e-6 apart."""
    fft = _engine(engine)
    x = np.random.default_rng(1).standard_normal((3, 300)).astype(dtype)
    first, second = fft.rfft(x), fft.rfft(x)
    assert first.dtype == second.dtype == np.complex128
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, np.fft.rfft(x.astype(np.float64)), rtol=0, atol=1e-12)
    spectrum = np.fft.rfft(np.random.default_rng(2).standard_normal((3, 300)))
    for given in (spectrum[:, :151].real.astype("float16"), spectrum.astype(np.clongdouble)):
        first, second = fft.irfft(given, n=300), fft.irfft(given, n=300)
        assert first.dtype == second.dtype == np.float64
        np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("engine", ["fftw", "numpy"])
def test_big_endian_float32_keeps_its_precision(engine):
    """A big-endian float32 array (read from a file) was computed as float64: complex128 out
    of rfft, float64 out of irfft, where a native float32 array gives complex64 and float32."""
    fft = _engine(engine)
    native = np.random.default_rng(3).standard_normal((3, 96)).astype(np.float32)
    swapped = native.astype(">f4")
    for _ in range(2):
        got = fft.rfft(swapped)
        assert got.dtype == np.complex64
        np.testing.assert_array_equal(got, fft.rfft(native))
        back = fft.irfft(got.astype(">c8"), n=96)
        assert back.dtype == np.float32
        np.testing.assert_array_equal(back, fft.irfft(got, n=96))


def test_a_big_endian_float32_convolution_stays_float32():
    """Convolution.apply returned float64 for '>f4' rows (float32 rows give float32)."""
    def profile(z):
        return np.exp(np.cos(2 * np.pi * z))

    kernel, m = Convolution(profile), 300
    kernel.dense_below = 0  # the FFT route
    u = np.random.default_rng(4).standard_normal((3, m))
    c = profile(np.arange(m) / m) / m
    circulant = c[(np.arange(m)[:, None] - np.arange(m)[None, :]) % m]
    got = kernel.apply(u.astype(">f4"), Midpoint(m), Midpoint(m))
    assert got.dtype == np.float32
    exact = u @ circulant.T
    assert np.abs(got - exact).max() < 1e-6 * np.abs(exact).max()


@pytest.mark.parametrize("axis", [1.0, True, np.float64(1.0)])
def test_an_axis_that_is_not_an_integer_is_refused_after_an_integer_call_too(axis):
    """The fast path of repeated calls matched axis=1.0 (and True) to an earlier axis=1, so
    the same call returned a result or raised TypeError, depending on the calls before it."""
    fft = _engine("fftw")
    x = np.ones((2, 8))
    spectrum = fft.rfft(x, axis=1)
    fft.rfft(x, axis=1), fft.irfft(spectrum, n=8, axis=1), fft.irfft(spectrum, n=8, axis=1)
    with pytest.raises(TypeError, match="axis must be an integer"):
        fft.rfft(x, axis=axis)
    with pytest.raises(TypeError, match="axis must be an integer"):
        fft.irfft(spectrum, n=8, axis=axis)
    with pytest.raises(TypeError, match="n must be a positive integer, got 8.0"):
        fft.irfft(spectrum, n=8.0, axis=1)


@pytest.mark.parametrize("threads, error", [(0, ValueError), (-1, ValueError), (2**31, ValueError),
                                            (2.5, TypeError), ("2", TypeError)])
def test_a_thread_count_that_fftw_cannot_take_is_refused_by_name(threads, error):
    """threads=0 and -1 ran on one thread unannounced, 2.5 on two; 2**31 and more raised
    pyFFTW's OverflowError from inside the planner at the first large transform."""
    with pytest.raises(error, match=r"threads must be an integer >= 1 and <= 2147483647"):
        PlannedFFT(threads=threads)


def test_the_fft_thread_variable_is_refused_above_a_c_int(monkeypatch):
    monkeypatch.setenv("CTFORMER_FFT_THREADS", "2147483648")
    with pytest.raises(ValueError, match="CTFORMER_FFT_THREADS must be a positive integer at most "
                                         "2147483647, got '2147483648'"):
        PlannedFFT()
    monkeypatch.setenv("CTFORMER_FFT_THREADS", "3")
    assert PlannedFFT().threads == 3


@pytest.mark.parametrize("value, effort", [("fftw_measure", "FFTW_MEASURE"), ("AUTO", "auto"),
                                           (" Fftw_Estimate ", "FFTW_ESTIMATE"), ("", "auto")])
def test_the_planner_variable_is_read_in_any_case_as_the_other_settings(monkeypatch, value, effort):
    """CTFORMER_FFT_ENGINE=NUMPY was accepted, CTFORMER_FFTW_PLANNER=fftw_measure refused."""
    monkeypatch.setenv("CTFORMER_FFTW_PLANNER", value)
    assert planner_effort() == effort
    monkeypatch.setenv("CTFORMER_FFTW_PLANNER", "fftw_fast")
    with pytest.raises(ValueError, match="CTFORMER_FFTW_PLANNER must be one of auto, FFTW_ESTIMATE, "
                                         "FFTW_MEASURE, FFTW_PATIENT, FFTW_EXHAUSTIVE, got 'fftw_fast'"):
        planner_effort()


def test_a_float16_convolution_gives_the_same_bits_on_every_call(monkeypatch):
    """With numpy.fft running the transforms, the second call of a float16 FFT convolution
    took a complex64 spectrum where the first took complex128: 2 of 4000 entries differed."""
    from ctformer.backend import get_backend

    monkeypatch.setattr(get_backend("numpy"), "fft", _engine("numpy"))

    def profile(z):
        return np.exp(np.cos(2 * np.pi * z))

    kernel, m = Convolution(profile), 1000
    kernel.dense_below = 0
    u = np.random.default_rng(0).standard_normal((4, m)).astype(np.float16)
    first, second = (kernel.apply(u, Midpoint(m), Midpoint(m)) for _ in range(2))
    assert first.dtype == np.float16
    np.testing.assert_array_equal(first, second)
    c = profile(np.arange(m) / m) / m
    exact = u.astype(np.float64) @ c[(np.arange(m)[:, None] - np.arange(m)[None, :]) % m].T
    assert np.abs(first - exact).max() < 2e-3 * np.abs(exact).max()  # float16 rounding of the result
