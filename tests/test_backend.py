"""ctformer.backend: selection, FFTs against numpy.fft / scipy.fft, the device cache; and one
CuPy-vs-NumPy comparison of every discretization (runs only where a CUDA GPU is usable)."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import scipy.fft
import scipy.sparse

import ctformer.backend as backend_module
import ctformer.discretizations as d
from ctformer.backend import Backend, backend_of, cupy_available, get_backend


def test_numpy_backend():
    be = get_backend("numpy")
    assert be.name == "numpy" and be is get_backend("numpy")
    assert be.module is np
    x = be.xp.asarray([1.0, 2.0])
    assert float(be.xp.sum(x)) == 3.0
    host = be.asnumpy(be.asarray([1.0, 2.0]))
    assert isinstance(host, np.ndarray) and host.tolist() == [1.0, 2.0]
    assert be.sparse is scipy.sparse
    assert be.sparse_from_host(scipy.sparse.coo_matrix(np.eye(3))).format == "csr"


def test_auto_picks_numpy_without_gpu(monkeypatch):
    assert get_backend("auto").name == ("cupy" if cupy_available() else "numpy")
    monkeypatch.setattr(backend_module, "cupy_available", lambda: False)
    assert get_backend("auto") is get_backend("numpy")


def test_cupy_without_gpu_raises_clear_error(monkeypatch):
    monkeypatch.setattr(backend_module, "cupy_available", lambda: False)
    monkeypatch.setattr(backend_module, "_BACKENDS", {})
    with pytest.raises(RuntimeError, match="no CUDA GPU is usable"):
        get_backend("cupy")
    with pytest.raises(RuntimeError, match="use 'numpy' or 'auto'"):
        Backend("cupy")


@pytest.mark.parametrize("name", ["torch", "NumPy", "", None, 3])
def test_invalid_backend_name(name):
    with pytest.raises(ValueError, match="backend name must be one of"):
        get_backend(name)


def test_invalid_backend_constructor_name():
    with pytest.raises(ValueError, match="backend name must be 'numpy' or 'cupy'"):
        Backend("jax")


def test_fft_matches_numpy_and_scipy(rng):
    fft = get_backend("numpy").fft
    x = rng.standard_normal((3, 10, 4))
    z = x + 1j * rng.standard_normal((3, 10, 4))
    np.testing.assert_allclose(fft.fft(z, axis=1), np.fft.fft(z, axis=1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(fft.ifft(z, axis=-1), np.fft.ifft(z, axis=-1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(fft.rfft(x, axis=1), np.fft.rfft(x, axis=1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(fft.irfft(np.fft.rfft(x, axis=1), n=10, axis=1), x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fft.dct(x, type=1, axis=1), scipy.fft.dct(x, type=1, axis=1), rtol=0, atol=1e-12)


def test_cached_builds_once_and_returns_the_same_object():
    be = get_backend("numpy")

    class Owner:
        pass

    owner = Owner()
    calls = []

    def build():
        calls.append(1)
        return np.arange(4.0)

    gc.collect()  # owners left unreachable by earlier tests must not die inside the count
    before = len(backend_module._CACHE)
    first = be.cached(owner, "k", build)
    assert be.cached(owner, "k", build) is first and len(calls) == 1
    np.testing.assert_array_equal(first, np.arange(4.0))
    sparse = be.cached(owner, "s", lambda: scipy.sparse.eye(3, format="coo"))
    assert sparse.format == "csr" and be.cached(owner, "s", lambda: None) is sparse
    assert len(backend_module._CACHE) == before + 1
    del owner
    gc.collect()
    assert len(backend_module._CACHE) == before  # entries die with their owner


def test_backend_of():
    import array_api_strict as xps

    assert backend_of(np.ones(2)).name == "numpy"
    assert backend_of(xps.ones(2)).name == "numpy"


@pytest.mark.cupy
def test_discretizations_on_cupy_match_numpy():
    import cupy

    for name in d.available():
        _compare_cupy_numpy(cupy, d.get(name, 9))


def _compare_cupy_numpy(cupy, disc):
    host = np.stack([disc.sample(np.cos), disc.sample(np.exp)], axis=1)  # values along axis 0
    dev = cupy.asarray(host)
    pts = np.linspace(0.0, 1.0, 7)
    np.testing.assert_allclose(cupy.asnumpy(disc.integrate(dev, axis=0)), disc.integrate(host, axis=0), atol=1e-13)
    np.testing.assert_allclose(cupy.asnumpy(disc.interpolate(dev, pts, axis=0)),
                               disc.interpolate(host, pts, axis=0), atol=1e-13)
    quad = disc.to_quadrature(dev, axis=0)
    assert isinstance(quad, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(quad), disc.to_quadrature(host, axis=0), atol=1e-13)
    np.testing.assert_allclose(cupy.asnumpy(disc.from_quadrature(quad, axis=0)), host, atol=1e-12)
    if hasattr(disc, "coefficients"):
        np.testing.assert_allclose(cupy.asnumpy(disc.coefficients(dev, axis=0)),
                                   disc.coefficients(host, axis=0), atol=1e-13)


def test_planned_real_ffts_match_numpy_and_never_alias():
    """rfft/irfft run cached FFTW plans: compare with numpy.fft for strided input, other axes
    and float32, and check that a second call does not overwrite the first call's result."""
    fft = get_backend("numpy").fft
    rng = np.random.default_rng(3)
    for shape, axis in (((6, 16), -1), ((15, 4), 0), ((3, 7, 9), 1)):
        x = rng.standard_normal(shape)
        X = fft.rfft(x, axis=axis)
        np.testing.assert_allclose(X, np.fft.rfft(x, axis=axis), rtol=0, atol=1e-13)
        n = shape[axis]
        np.testing.assert_allclose(fft.irfft(X, n=n, axis=axis), x, rtol=0, atol=1e-14)
    strided = rng.standard_normal((8, 20))[:, ::2]
    np.testing.assert_allclose(fft.rfft(strided), np.fft.rfft(strided), rtol=0, atol=1e-13)
    single = rng.standard_normal(12).astype(np.float32)
    assert fft.rfft(single).dtype == np.complex64
    np.testing.assert_allclose(fft.rfft(single), np.fft.rfft(single), rtol=0, atol=1e-5)
    a, b = rng.standard_normal((2, 10))
    fa = fft.rfft(a)
    fb = fft.rfft(b)  # same plan
    np.testing.assert_allclose(fa, np.fft.rfft(a), rtol=0, atol=1e-13)
    assert not np.shares_memory(fa, fb)
