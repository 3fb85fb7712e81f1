r"""The periodic convolution kernel :math:`W_{\mathrm{ref}}(s, t) = p((s - t) \bmod 1)`.

On a uniform periodic grid of :math:`n` points (the same for input and output) its matrix is
circulant, :math:`A_{ij} = c_{(i - j) \bmod n}` with :math:`c_k = p(k / n) / n`, which the DFT
diagonalizes: :math:`W u = \mathrm{irfft}(\mathrm{rfft}(c)\, \mathrm{rfft}(u))`, in
:math:`O(n \log n)`. NumPy grids of at most :attr:`Convolution.dense_below` points (by default
this machine's measured crossover, :func:`ctformer._numerics.convolution_route.dense_below`)
take one product with the cached dense matrix instead, and so does every other pair of grids.
"""
from __future__ import annotations

from typing import Callable

import array_api_compat
import numpy as np

from .._numerics.convolution_route import dense_below as measured_dense_below
from .._numerics.convolution_route import route_setting
from ..backend import _cached, backend_of, constant
from ..validation import is_integer
from .base import Kernel, _as_input, _check_discretization, _check_input
from .parameters import callable_parameters
from .smooth import _function_values


class Convolution(Kernel):
    r"""A translation-invariant periodic kernel :math:`W_{\mathrm{ref}}(s, t) = p((s - t) \bmod 1)`.

    On a uniform periodic grid (same grid for input and output, :math:`n` equally spaced
    points with equal weights :math:`1/n` of the period, e.g. ``Midpoint`` or ``Fourier``) the
    matrix is circulant, :math:`A_{ij} = p(((i - j) \bmod n)/n) / n`, and :meth:`apply` computes
    it by FFT in :math:`O(n \log n)` through the backend (pyFFTW on the CPU, ``cupyx.scipy.fft``
    on the GPU), except on NumPy arrays of at most :attr:`dense_below` points, where one
    product with the (cached) dense matrix is faster than two FFTs. Elsewhere it uses the
    dense matrix. Both ways give the same values to rounding.

    Parameters
    ----------
    profile : callable
        ``profile(z)`` for ``z`` in :math:`[0, 1)`, vectorized; read as 1-periodic. A
        parametrized profile (with a ``parameters()`` method) whose numbers are torch tensors
        may return tensors: the kernel then applies its dense matrix, built in torch (so
        autograd sees it), instead of the FFT.

    Raises
    ------
    TypeError
        If ``profile`` is not callable.
    """

    #: NumPy grids of at most this many points apply the dense matrix instead of FFTs; 0
    #: always uses the FFT. None (the default): this machine's crossover for the array's
    #: dtype, measured once and stored (:func:`ctformer._numerics.convolution_route.dense_below`;
    #: 16-256 points on an AMD EPYC, by dtype and BLAS kernel). Set an int on the class or an
    #: instance to pin it, e.g. for the same bits on different machines. A route, not part of
    #: the kernel's value: settable on the frozen kernel, not compared by ``==``.
    dense_below: int | None = None
    _settings = frozenset({"dense_below"})

    def __init__(self, profile: Callable):
        if not callable(profile):
            raise TypeError(f"Convolution needs a callable profile(z), got {type(profile).__name__}")
        self.profile = profile

    def __repr__(self) -> str:
        return f"Convolution({getattr(self.profile, '__name__', self.profile)!r})"

    def parameters(self) -> dict:
        """The profile's own ``parameters()`` (read-only views), if it has any."""
        return callable_parameters(self.profile)

    def evaluate(self, s, t):
        z = np.asarray(s, dtype=np.float64) - np.asarray(t, dtype=np.float64)
        nearest = np.round(z)
        # differences that are integers up to rounding are exactly 0 mod 1 (no p(1 - eps) vs p(0))
        z = np.where(np.abs(z - nearest) < 1e-13, 0.0, z - np.floor(z))
        return _function_values(self, self.profile(z), "the profile")

    @staticmethod
    def is_uniform_periodic(disc) -> bool:
        """True when ``disc`` has equally spaced quadrature points with equal weights ``L / n``."""
        x = np.asarray(disc.quadrature_nodes, dtype=np.float64)
        w = np.asarray(disc.quadrature_weights, dtype=np.float64)
        n, length = x.size, disc.length
        h = length / n
        tol = 1e-12 * length
        return bool(
            np.all(np.abs(w - h) <= tol)
            and (n == 1 or np.all(np.abs(np.diff(x) - h) <= tol))
            and -tol <= x[0] - disc.domain[0] < h
        )

    def symbol(self, disc) -> np.ndarray:
        r"""``rfft`` of the circulant's first column :math:`c_k = p(k / n) / n` (host, complex)."""
        n = len(disc.quadrature_nodes)
        from ..discretizations.base import real_host_array

        c = real_host_array(self.profile(np.arange(n) / n), f"{self!r}: the profile") / n
        if c.shape not in ((), (n,)):
            raise ValueError(f"Convolution profile must map {n} points z to {n} values (or one), "
                             f"got shape {c.shape}")
        c = np.broadcast_to(c, (n,))
        if not np.all(np.isfinite(c)):
            raise ValueError(f"Convolution profile takes NaN or inf values on {disc!r}")
        return np.fft.rfft(c)

    def _dense_limit(self, dtype) -> int:
        """:attr:`dense_below`, or this machine's measured crossover for ``dtype`` where it is None.

        Raises
        ------
        TypeError
            If :attr:`dense_below` is neither None nor an integer (``"64"`` failed inside a
            comparison, ``2.5`` and ``True`` were read as numbers)."""
        if self.dense_below is None:
            return measured_dense_below(dtype)
        if not is_integer(self.dense_below):
            raise TypeError(f"Convolution.dense_below must be None (this machine's crossover) or an "
                            f"integer number of grid points (0: always the FFT), got {self.dense_below!r}")
        return int(self.dense_below)

    def _numpy_route(self, out, inp, dtype):
        """How NumPy rows of ``dtype`` are applied: ``(True, n, symbol in dtype's complex
        type)`` by FFT, ``(False, n, transposed matrix in dtype)`` by one product on a host
        kernel, else ``()`` (:meth:`Kernel.apply`; not None, which the cache would take for a miss)."""
        _check_discretization(out, "out")
        _check_discretization(inp, "inp")
        if not self._host():
            return ()    # tensor parameters: Kernel.apply, in their namespace
        n = len(inp.quadrature_nodes)
        if not (out == inp and self.is_uniform_periodic(inp)) or n <= self._dense_limit(dtype):
            like = np.empty(0, dtype=dtype)
            return False, n, constant(self, ("matrix_t", out, inp), lambda: self.transposed_matrix(out, inp), like)
        complex_dtype = np.complex64 if dtype == np.float32 else np.complex128
        return True, n, self.symbol(inp).astype(complex_dtype)

    def apply(self, u, out, inp, axis: int = -1):
        """Apply by FFT when ``out == inp`` is uniform periodic, else by the dense matrix.

        See :meth:`Kernel.apply` for the parameters.
        """
        if type(u) is np.ndarray and u.dtype.char in "fd" and axis in (-1, u.ndim - 1):
            # the hot path: one cached lookup says how, no axis moves, no further checks (float32
            # and float64 only: the transforms return float64 for float16 and longdouble rows)
            # keyed by what the route was chosen under: the pinned limit, else CTFORMER_GEMM
            limit = self.dense_below
            route = _cached(self, ("numpy route", out, inp, u.dtype.char, limit,
                                   route_setting() if limit is None else None),
                            lambda: self._numpy_route(out, inp, u.dtype))
            if not route:
                return super().apply(u, out, inp, axis)
            by_fft, n, operand = route
            if u.shape[-1] == n and not by_fft:
                return u @ operand
            if u.shape[-1] == n:
                symbol = operand
                fft = backend_of(u).fft
                spectrum = fft.rfft(u, axis=-1)
                spectrum *= symbol
                return fft.irfft(spectrum, n=n, axis=-1)
        if not self._host() or not (out == inp and _cached(inp, "uniform periodic",
                                                           lambda: self.is_uniform_periodic(inp))):
            # tensor parameters take the dense matrix in their namespace: the cached host
            # symbol would hide them from autograd and from in-place updates
            return super().apply(u, out, inp, axis)
        if type(u) is not np.ndarray or u.dtype.kind != "f":
            u = _as_input(u)
        n = len(inp.quadrature_nodes)
        if type(u) is np.ndarray and n <= self._dense_limit(u.dtype):
            return super().apply(u, out, inp, axis)
        xp, axis = _check_input(u, inp, axis)
        if not all(u.shape):  # an empty batch: torch's MKL FFT raised "inconsistent configuration"
            return xp.zeros_like(u)
        moved = xp.moveaxis(u, axis, -1)
        # pyFFTW / cupyx for NumPy and CuPy, the namespace's own fft (torch.fft, ...) otherwise
        if array_api_compat.is_numpy_array(u) or array_api_compat.is_cupy_array(u):
            fft = backend_of(u).fft
            spectrum = fft.rfft(moved, axis=-1)
            symbol = constant(self, ("symbol", inp), lambda: self.symbol(inp), spectrum)
            result = fft.irfft(spectrum * symbol, n=n, axis=-1)
        else:
            if moved.dtype not in (xp.float32, xp.float64):  # half precision: torch.fft has no CPU kernels
                moved = xp.astype(moved, xp.float32)
            spectrum = xp.fft.rfft(moved)
            symbol = constant(self, ("symbol", inp), lambda: self.symbol(inp), spectrum)
            result = xp.fft.irfft(spectrum * symbol, n=n)
        return xp.moveaxis(xp.astype(xp.asarray(result), u.dtype, copy=False), -1, axis)
