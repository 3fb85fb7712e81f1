"""The FFT settings are read at every call: a plan chosen under one setting never serves a
call made under another.

The NumPy backend's :class:`~ctformer.fft.PlannedFFT` read ``CTFORMER_FFT_ENGINE``,
``CTFORMER_FFTW_PLANNER`` and ``CTFORMER_FFT_THREADS`` once, at its first use: switching to
``CTFORMER_FFT_ENGINE=numpy`` (the documented way to the same bits on every machine) kept
running FFTW's plans, and a bad value set afterwards passed unchecked."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.backend import get_backend
from ctformer.discretizations import Midpoint
from ctformer.fft import PlannedFFT
from ctformer.kernels import Convolution


def _profile(z):
    return np.exp(np.cos(2 * np.pi * z))


def test_switching_the_engine_between_two_convolutions_takes_effect(monkeypatch):
    """After ``CTFORMER_FFT_ENGINE=numpy`` the FFT convolution is numpy.fft's, bit for bit;
    before the fix it stayed FFTW's (the first call's engine)."""
    grid = Midpoint(512)
    kernel = Convolution(_profile)
    kernel.dense_below = 0   # always the FFT route
    u = np.random.default_rng(3).standard_normal((16, 512))
    symbol = np.fft.rfft(_profile(np.arange(512) / 512) / 512)
    reference = np.fft.irfft(np.fft.rfft(u) * symbol, n=512)
    monkeypatch.setenv("CTFORMER_FFT_ENGINE", "fftw")
    by_fftw = kernel.apply(u, grid, grid)
    np.testing.assert_allclose(by_fftw, reference, rtol=0, atol=1e-13 * np.abs(reference).max())
    monkeypatch.setenv("CTFORMER_FFT_ENGINE", "numpy")
    np.testing.assert_array_equal(kernel.apply(u, grid, grid), reference)
    assert get_backend("numpy").fft.engine == "numpy"


@pytest.mark.parametrize("name, value, message", [
    ("CTFORMER_FFT_ENGINE", "mkl", "CTFORMER_FFT_ENGINE must be one of auto, fftw, numpy"),
    ("CTFORMER_FFTW_PLANNER", "FFTW_FAST", "CTFORMER_FFTW_PLANNER must be one of"),
    ("CTFORMER_FFT_THREADS", "zero", "CTFORMER_FFT_THREADS must be a positive integer"),
])
def test_a_bad_setting_made_after_the_first_call_is_refused_by_name(monkeypatch, name, value, message):
    fft = PlannedFFT()
    x = np.ones((4, 32))
    fft.rfft(x)   # the fast path of a repeated call is taken from now on
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        fft.rfft(x)
    with pytest.raises(ValueError, match=message):
        fft.irfft(np.ones((4, 17), complex), n=32)
    with pytest.raises(ValueError, match=message):
        fft.fft(x)


def test_settings_given_to_the_constructor_stay_and_the_planner_setting_is_followed(monkeypatch):
    """Arguments pin a setting whatever the variable says; a setting left to its variable
    follows it: the plans of ``FFTW_ESTIMATE`` after ``FFTW_MEASURE`` are estimated ones."""
    monkeypatch.setenv("CTFORMER_FFTW_PLANNER", "FFTW_MEASURE")
    pinned, following = PlannedFFT(threads=1, engine="fftw", effort="FFTW_MEASURE"), PlannedFFT(engine="fftw")
    x = np.random.default_rng(4).standard_normal((4, 64))
    for fft in (pinned, following):
        np.testing.assert_allclose(fft.rfft(x), np.fft.rfft(x), rtol=0, atol=1e-13)
    monkeypatch.setenv("CTFORMER_FFTW_PLANNER", "FFTW_ESTIMATE")
    monkeypatch.setenv("CTFORMER_FFT_ENGINE", "numpy")
    for fft in (pinned, following):
        np.testing.assert_allclose(fft.rfft(x), np.fft.rfft(x), rtol=0, atol=1e-13)
    assert (pinned.planner_effort, pinned.engine) == ("FFTW_MEASURE", "fftw")
    assert (following.planner_effort, following.engine) == ("FFTW_ESTIMATE", "fftw")
    flags = [entry[0].flags for entry in following._plans.values()]
    assert flags and all("FFTW_ESTIMATE" in f and "FFTW_MEASURE" not in f for f in flags)


def test_a_convolution_route_chosen_under_auto_is_not_kept_after_pinning_the_gemm(monkeypatch):
    """A machine whose measured crossover is 16 points: under ``CTFORMER_GEMM=auto`` a grid of
    100 points goes by FFT. Pinned to ``numpy`` it takes the default route (the dense product
    up to 128 points), as a fresh process does; the cached route of the first call had kept
    the FFT (last bits apart, 3.9e-16 measured)."""
    from ctformer._numerics import convolution_route

    monkeypatch.setattr(convolution_route, "_measured", lambda name: 16)
    monkeypatch.setenv("CTFORMER_FFT_ENGINE", "numpy")   # nothing measured or stored
    monkeypatch.setenv("CTFORMER_GEMM", "auto")
    grid, kernel = Midpoint(100), Convolution(_profile)
    u = np.random.default_rng(5).standard_normal((64, 100))
    symbol = np.fft.rfft(_profile(np.arange(100) / 100) / 100)
    np.testing.assert_array_equal(kernel.apply(u, grid, grid), np.fft.irfft(np.fft.rfft(u) * symbol, n=100))
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    dense = kernel.apply(u, grid, grid)
    np.testing.assert_array_equal(dense, u @ kernel.matrix(grid, grid).T)
    i = np.arange(100)
    circulant = _profile(((i[:, None] - i[None, :]) % 100) / 100) / 100
    np.testing.assert_allclose(dense, u @ circulant.T, rtol=0, atol=1e-13)
