"""Array backends: one code path for NumPy on the CPU and CuPy on the GPU.

A :class:`Backend` bundles what a numerical kernel needs from an array library:

* ``xp``: the array namespace (through :mod:`array_api_compat`, so the same code runs on
  NumPy, CuPy and ``array_api_strict`` arrays),
* ``fft``: FFTs and DCTs (pyFFTW with its plan cache on the CPU, ``cupyx.scipy.fft`` on the GPU),
* ``sparse``: 2-D sparse matrices (:mod:`scipy.sparse` on the CPU, :mod:`cupyx.scipy.sparse`
  on the GPU),
* ``asarray`` / ``asnumpy`` for moving data on and off the device.

The library's one *device seam* is two functions:

* :func:`constant`: a host constant (nodes, weights, kernel, Vandermonde or mass matrix,
  built once in float64 NumPy) as an array in the namespace, on the device and in the dtype
  of a given state. Each conversion is made once per (owner, key, namespace, device, dtype)
  and kept while the owner lives, so a time step never transfers or casts a constant.
* :func:`to_host`: any array (NumPy, CuPy, torch, ``array_api_strict``, nested lists) as a
  host NumPy array.

Nothing here copies data between host and device unless asked to.
"""
from __future__ import annotations

import math
import sys
import weakref
from functools import cached_property

import array_api_compat
import numpy as np

from .validation import one_of

__all__ = ["Backend", "get_backend", "backend_of", "cupy_available", "constant", "to_host",
           "namespace", "matmul_rows", "plus_bias", "all_finite", "floating_info"]

_NUMPY_NAMESPACE = array_api_compat.array_namespace(np.zeros(1))


def namespace(x):
    """The array-API namespace of ``x`` (a constant-time answer for plain NumPy arrays)."""
    if type(x) is np.ndarray:
        return _NUMPY_NAMESPACE
    return array_api_compat.array_namespace(x)


def matmul_rows(a, b):
    """``a @ b`` for a matrix ``b``, with the leading axes of a NumPy ``a`` folded into its rows.

    NumPy multiplies a stack ``(..., N, d) @ (d, m)`` as one BLAS call per matrix of the stack;
    one call on the ``(prod(...) N, d)`` rows is 15-30 % faster (torch and CuPy fold already).
    """
    if type(a) is np.ndarray and a.ndim > 2 and a.flags.c_contiguous and b.ndim == 2:
        return (a.reshape(-1, a.shape[-1]) @ b).reshape(*a.shape[:-1], b.shape[-1])
    return a @ b


def plus_bias(z, bias):
    """``z + bias`` (``None`` adds nothing); in place for a NumPy ``z``, which must be a new
    array that only the caller holds (a product it just made): one pass and no allocation."""
    if bias is None:
        return z
    if type(z) is np.ndarray and z.dtype == bias.dtype:
        z += bias
        return z
    return z + bias


def all_finite(u) -> bool:
    """Whether every entry of the real array ``u`` is finite (no NaN, no inf).

    torch tensors first take one sum, which is finite unless an entry is NaN or inf or the sum
    overflows; only then does the entry-wise test decide (on a 1M-entry CPU tensor 12 us
    against 300 us for ``isfinite`` and ``all``, at every step of a solve). Other arrays take
    the entry-wise test (NumPy's ``isfinite`` and ``all`` beat its pairwise sum)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(u, torch.Tensor):
        with torch.no_grad():
            wide = torch.float32 if u.dtype in (torch.float16, torch.bfloat16) else None
            if math.isfinite(float(u.sum(dtype=wide))):
                return True
    xp = namespace(u)
    return bool(xp.all(xp.isfinite(u)))


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
        """Return a host NumPy copy (or view) of ``x`` (:func:`to_host`)."""
        return to_host(x)

    # -- FFT -----------------------------------------------------------------------------
    @cached_property
    def fft(self):
        """FFT/DCT module with the ``scipy.fft`` interface.

        :class:`ctformer.fft.PlannedFFT` on the CPU (pyFFTW plans executed directly, cached;
        ``CTFORMER_FFT_THREADS`` threads for large transforms, default the library's worker
        count; planner effort
        ``CTFORMER_FFTW_PLANNER``, default ``auto``: small transforms' plans measured once per
        machine and stored); ``cupyx.scipy.fft`` on the GPU.
        """
        if self.name == "cupy":
            import cupyx.scipy.fft as cufft

            return cufft
        from .fft import PlannedFFT

        return PlannedFFT()

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
        """The device copy of the host array ``build()`` for ``(owner, key)``, built once.

        A thin wrapper over the library's one cache (see :func:`constant`): the copy keeps
        the dtype of the host array and lives on this backend's device.
        """
        return _cached(owner, (self.name, key), lambda: self._transfer(build()))

    def _transfer(self, host):
        if hasattr(host, "tocsr"):
            return self.sparse_from_host(host)
        return self.asarray(host)


# owner -> {key: converted constant}; entries die with their owner.
_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _cached(owner, key, make):
    if owner is None:
        return make()
    entries = _CACHE.get(owner)
    if entries is None:
        entries = _CACHE.setdefault(owner, {})
    value = entries.get(key)
    if value is None:
        value = entries[key] = make()
    return value


def _placement(like):
    """(namespace name, device, dtype string) of the array ``like``."""
    if type(like) is np.ndarray:  # the hot path: a plain NumPy state
        return "numpy", None, like.dtype.str
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):  # torch states: no namespace lookup
        return "array_api_compat.torch", str(like.device), str(like.dtype)
    if array_api_compat.is_numpy_array(like):
        return "numpy", None, like.dtype.str
    if array_api_compat.is_cupy_array(like):
        return "cupy", int(like.device.id), like.dtype.str
    xp = array_api_compat.array_namespace(like)
    return xp.__name__, str(array_api_compat.device(like)), str(like.dtype)


def constant(owner, key, host, like):
    """The host constant ``host`` as an array like ``like``: same namespace, device and dtype.

    Parameters
    ----------
    owner : object or None
        The object the constant belongs to (a discretization, a kernel, an operator); the
        converted copy is cached per ``(owner, key, namespace, device, dtype)`` and released
        with the owner. ``None`` converts without caching (one-off matrices).
    key : hashable
        What the constant is, within its owner.
    host : ndarray, scipy.sparse matrix, callable or None
        The host value, or a function returning it (called only when the cache misses).
        ``None`` stays ``None``.
    like : array
        A state of the target namespace (NumPy, CuPy, ``array_api_strict``, ...). A real
        floating ``like`` fixes the dtype; otherwise the host dtype is kept.

    Returns
    -------
    array or sparse matrix
        NumPy and CuPy keep sparse matrices sparse (``scipy.sparse`` / ``cupyx.scipy.sparse``,
        CSR); other namespaces get a dense copy.
    """
    if host is None:
        return None
    namespace, device, dtype = _placement(like)

    def make():
        value = host() if callable(host) else host
        if value is None:
            return None
        return _convert(value, like, namespace)

    return _cached(owner, ("constant", key, namespace, device, dtype), make)


def _convert(value, like, namespace):
    xp = array_api_compat.array_namespace(like)
    # a real floating (or, for complex host values, a complex) ``like`` fixes the dtype
    floating = xp.isdtype(like.dtype, "real floating") or (
        xp.isdtype(like.dtype, "complex floating") and np.iscomplexobj(value))
    if hasattr(value, "tocsr"):
        if namespace in ("numpy", "cupy"):
            matrix = value.tocsr()
            if floating:  # in the machine's byte order: SciPy refuses '>f8' matrices
                matrix = matrix.astype(np.dtype(like.dtype.str).newbyteorder("="))
            return get_backend(namespace).sparse_from_host(matrix)
        value = value.toarray()
    value = np.asarray(value)
    if namespace == "numpy":
        if not floating or value.dtype == like.dtype:
            return value  # shared, as it is
        # a new array either way: in row order, which OpenBLAS multiplies ~9% faster than a
        # transposed view's (AMD EPYC, float32 feature maps); MKL is indifferent
        return value.astype(like.dtype, order="C")
    if namespace == "cupy":
        import cupy

        with like.device:
            return cupy.asarray(value, dtype=like.dtype if floating else None)
    # other namespaces (torch, array_api_strict) get their own writable copy
    value = np.array(value)
    device = array_api_compat.device(like)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor) and torch.is_inference_mode_enabled():
        # cached for every later solve: an inference tensor would poison autograd solves
        with torch.inference_mode(False):
            return xp.asarray(value, dtype=like.dtype if floating else None, device=device)
    if floating:
        return xp.asarray(value, dtype=like.dtype, device=device)
    return xp.asarray(value, device=device)


def to_host(x, dtype=None) -> np.ndarray:
    """A host NumPy array from any array: NumPy, CuPy, torch, ``array_api_strict``, lists.

    Parameters
    ----------
    x : array_like
    dtype : dtype, optional
        Convert to this dtype (e.g. ``np.float64`` for results and diagnostics).

    Returns
    -------
    ndarray
        A view when ``x`` already is a NumPy array of that dtype. A torch bfloat16 tensor,
        which NumPy has no dtype for, comes as float32 (exactly: every bfloat16 number is one).
    """
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":  # torch's .numpy() raised "unsupported ScalarType"
            x = x.float()
        x = x.numpy()
    elif array_api_compat.is_cupy_array(x):
        x = x.get()
    elif not isinstance(x, np.ndarray) and hasattr(x, "__array_namespace__"):
        x = np.asarray(x.__array__() if hasattr(x, "__array__") else list(x))
    return np.asarray(x, dtype=dtype)


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
        The same object for every call with that library, from any thread (threads asking
        first at once included), so that all share its FFT plans.
    """
    one_of(name, "backend name", ("auto", "numpy", "cupy"))
    if name == "auto":
        name = "cupy" if cupy_available() else "numpy"
    found = _BACKENDS.get(name)
    if found is None:
        # setdefault, not a store: threads asking first at once all get the one kept
        found = _BACKENDS.setdefault(name, Backend(name))
    return found


def backend_of(*arrays) -> Backend:
    """Return the backend on which ``arrays`` live (CuPy arrays -> cupy, else numpy).

    Arrays of other array-API libraries (e.g. ``array_api_strict``) map to the NumPy backend;
    code that must stay generic should use :func:`array_api_compat.array_namespace` directly.
    """
    for a in arrays:
        if type(a) is not np.ndarray and array_api_compat.is_cupy_array(a):
            return get_backend("cupy")
    numpy_backend = _BACKENDS.get("numpy")  # the hot path: FFT convolutions ask on every call
    return numpy_backend if numpy_backend is not None else get_backend("numpy")


def floating_info(dtype):
    """``max``, ``eps`` and ``bits`` of a NumPy, CuPy, torch or array-API floating dtype
    (:func:`numpy.finfo`, of the real part for a complex dtype; torch's own for those NumPy
    lacks, bfloat16).

    Raises
    ------
    TypeError
        If ``dtype`` is not a floating dtype (an integer or boolean dtype, or no dtype).
    """
    name = str(dtype).split(".")[-1]
    for candidate in (dtype, name):
        try:
            found = np.dtype(candidate)
        except TypeError:
            continue
        if found.kind in "fc":
            return np.finfo(found)
        break
    torch = sys.modules.get("torch")
    wanted = getattr(torch, name, None) if torch is not None else None
    if wanted is not None and getattr(wanted, "is_floating_point", False):
        return torch.finfo(wanted)
    raise TypeError(f"floating_info needs a floating dtype (float16, bfloat16, float32, float64, ...), "
                    f"got {dtype!r}")
