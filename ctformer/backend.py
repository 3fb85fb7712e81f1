"""Array backends: one code path for NumPy on the CPU and CuPy on the GPU.

A :class:`Backend` bundles what a numerical kernel needs from an array library:

* ``xp``: the array namespace (through :mod:`array_api_compat`, so the same code runs on
  NumPy, CuPy and ``array_api_strict`` arrays),
* ``fft``: FFTs and DCTs (pyFFTW with its plan cache on the CPU, ``cupyx.scipy.fft`` on the GPU),
* ``sparse``: 2-D sparse matrices (:mod:`scipy.sparse` on the CPU, :mod:`cupyx.scipy.sparse`
  on the GPU),
* ``asarray`` / ``asnumpy`` for moving data on and off the device, and
* a per-instance cache of device copies of host-built arrays (nodes, weights, Vandermonde
  and mass matrices are computed once on the host, then transferred once).

Nothing here copies data between host and device unless asked to.
"""
from __future__ import annotations

import os
import weakref
from functools import cached_property

import array_api_compat
import numpy as np

__all__ = ["Backend", "get_backend", "backend_of", "cupy_available"]


def cupy_available() -> bool:
    """Return True when CuPy imports *and* a CUDA device is usable.

    ``import cupy`` succeeds on machines without a GPU, so the device itself is probed.
    """
    try:
        import cupy
    except Exception:  # pragma: no cover - depends on the machine
        return False
    try:
        return bool(cupy.cuda.is_available())
    except Exception:  # pragma: no cover
        return False


class Backend:
    """Array library, FFT and sparse provider for one device kind.

    Parameters
    ----------
    name : {"numpy", "cupy"}
        Which array library to use.

    Notes
    -----
    Use :func:`get_backend` rather than the constructor: it validates the name and returns
    one shared instance per library, so that the device-array cache is shared too.
    """

    def __init__(self, name: str):
        if name not in ("numpy", "cupy"):
            raise ValueError(f"backend name must be 'numpy' or 'cupy', got {name!r}")
        if name == "cupy" and not cupy_available():
            raise RuntimeError(
                "backend 'cupy' was requested but no CUDA GPU is usable "
                "(cupy.cuda.is_available() is False); use 'numpy' or 'auto'"
            )
        self.name = name
        # owner object -> {key: device array}; entries die with their owner.
        self._cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"

    # -- array library ------------------------------------------------------------------
    @cached_property
    def module(self):
        """The raw array module (``numpy`` or ``cupy``)."""
        if self.name == "numpy":
            return np
        import cupy

        return cupy

    @cached_property
    def xp(self):
        """The array-API-compatible namespace of this backend."""
        return array_api_compat.array_namespace(self.module.zeros(1))

    def asarray(self, x, dtype=None):
        """Put ``x`` on this backend's device (no copy if it already lives there)."""
        return self.module.asarray(x, dtype=dtype)

    def asnumpy(self, x) -> np.ndarray:
        """Return a host NumPy copy (or view) of ``x``."""
        if self.name == "cupy":
            import cupy

            return cupy.asnumpy(x)
        return np.asarray(x)

    # -- FFT -----------------------------------------------------------------------------
    @cached_property
    def fft(self):
        """FFT/DCT module with the ``scipy.fft`` interface.

        pyFFTW on the CPU with cached plans, ``CTFORMER_FFT_THREADS`` (default 1) threads and
        the planner effort ``CTFORMER_FFTW_PLANNER`` (default ``FFTW_ESTIMATE``; ``FFTW_MEASURE``
        is faster for long transforms once planned); ``cupyx.scipy.fft`` on the GPU.
        """
        if self.name == "cupy":
            import cupyx.scipy.fft as cufft

            return cufft
        return _PyFFTW(int(os.environ.get("CTFORMER_FFT_THREADS", "1")))

    # -- sparse --------------------------------------------------------------------------
    @cached_property
    def sparse(self):
        """2-D sparse-matrix module: ``scipy.sparse`` or ``cupyx.scipy.sparse``."""
        if self.name == "cupy":
            import cupyx.scipy.sparse as cusparse

            return cusparse
        import scipy.sparse

        return scipy.sparse

    def sparse_from_host(self, matrix):
        """Transfer a host ``scipy.sparse`` matrix to this backend (CSR)."""
        matrix = matrix.tocsr()
        if self.name == "numpy":
            return matrix
        return self.sparse.csr_matrix(matrix)

    # -- cache ---------------------------------------------------------------------------
    def cached(self, owner, key, build):
        """Return the device copy of ``build()`` for ``(owner, key)``, building it once.

        ``build`` returns a host array (NumPy or scipy.sparse); it runs only on the first call
        for this owner and key. The copy is released when ``owner`` is garbage-collected.
        """
        entries = self._cache.setdefault(owner, {})
        if key not in entries:
            host = build()
            if hasattr(host, "tocsr"):
                entries[key] = self.sparse_from_host(host)
            else:
                entries[key] = self.asarray(host)
        return entries[key]


class _PyFFTW:
    """``scipy.fft``-style functions backed by pyFFTW, with plan caching.

    ``rfft`` and ``irfft`` (the transforms in time steps: convolutions, the mean-field flux)
    run planned :class:`pyfftw.FFTW` objects kept per (shape, dtype, n, axis): the
    ``pyfftw.interfaces`` layer re-validates and copies on every call, which made it slower
    than ``numpy.fft`` for the sizes we use. Every other function goes through
    ``pyfftw.interfaces.scipy_fft`` with its own plan cache.
    """

    def __init__(self, threads: int):
        import pyfftw
        import pyfftw.builders
        import pyfftw.interfaces.cache
        import pyfftw.interfaces.scipy_fft as pfft

        pyfftw.interfaces.cache.enable()
        pyfftw.interfaces.cache.set_keepalive_time(60.0)
        self._f = pfft
        self._builders = pyfftw.builders
        self._empty_aligned = pyfftw.empty_aligned
        self._plans: dict = {}
        self.threads = max(1, threads)
        # FFTW_MEASURE plans run ~20% faster for large n but take 0.1-2 s to make per shape
        self.planner_effort = os.environ.get("CTFORMER_FFTW_PLANNER", "FFTW_ESTIMATE")
        if self.planner_effort not in ("FFTW_ESTIMATE", "FFTW_MEASURE", "FFTW_PATIENT", "FFTW_EXHAUSTIVE"):
            raise ValueError(
                "CTFORMER_FFTW_PLANNER must be FFTW_ESTIMATE, FFTW_MEASURE, FFTW_PATIENT or "
                f"FFTW_EXHAUSTIVE, got {self.planner_effort!r}"
            )

    def _planned(self, kind, x, n, axis):
        x = np.asarray(x)
        key = (kind, x.shape, x.dtype.str, n, axis)
        plan = self._plans.get(key)
        if plan is None:
            build = getattr(self._builders, kind)
            # planning happens once per key; the plan copies inputs into its own aligned buffer
            plan = build(x, n=n, axis=axis, threads=self.threads, planner_effort=self.planner_effort,
                         overwrite_input=False, avoid_copy=False)
            self._plans[key] = plan
        # a fresh aligned output per call: the plan's own output buffer is reused by its next call
        out = self._empty_aligned(plan.output_shape, dtype=plan.output_dtype)
        return plan(x, output_array=out)

    def rfft(self, x, n=None, axis=-1):
        """Real-to-complex FFT along ``axis`` (``scipy.fft.rfft`` semantics)."""
        return self._planned("rfft", x, n, axis)

    def irfft(self, x, n=None, axis=-1):
        """Complex-to-real inverse FFT along ``axis`` (``scipy.fft.irfft`` semantics)."""
        return self._planned("irfft", x, n, axis)

    def __getattr__(self, name):
        func = getattr(self._f, name)

        def call(*args, **kwargs):
            kwargs.setdefault("workers", self.threads)
            return func(*args, **kwargs)

        call.__name__ = name
        return call


_BACKENDS: dict[str, Backend] = {}


def get_backend(name: str = "auto") -> Backend:
    """Return the shared :class:`Backend` for ``name``.

    Parameters
    ----------
    name : {"auto", "numpy", "cupy"}
        ``"auto"`` picks CuPy only when a CUDA GPU is usable, NumPy otherwise.
        ``"cupy"`` without a usable GPU raises :class:`RuntimeError`.

    Returns
    -------
    Backend
    """
    if not isinstance(name, str) or name not in ("auto", "numpy", "cupy"):
        raise ValueError(f"backend name must be one of 'auto', 'numpy', 'cupy'; got {name!r}")
    if name == "auto":
        name = "cupy" if cupy_available() else "numpy"
    if name not in _BACKENDS:
        _BACKENDS[name] = Backend(name)
    return _BACKENDS[name]


def backend_of(*arrays) -> Backend:
    """Return the backend on which ``arrays`` live (CuPy arrays -> cupy, else numpy).

    Arrays of other array-API libraries (e.g. ``array_api_strict``) map to the NumPy backend;
    code that must stay generic should use :func:`array_api_compat.array_namespace` directly.
    """
    for a in arrays:
        if array_api_compat.is_cupy_array(a):
            return get_backend("cupy")
    return get_backend("numpy")
