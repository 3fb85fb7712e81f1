r"""Spectral discretizations: values at nodes, reconstruction by a global series.

==============  =====================================  =======================================
rule            nodes                                  reconstruction (``coefficients``)
==============  =====================================  =======================================
``Fourier``     :math:`a + (b - a) j / n` (periodic)    trigonometric polynomial, FFT
``Chebyshev``   Chebyshev extrema, both ends included   :math:`\sum_m a_m T_m`, DCT-I
``Legendre``    Legendre-Gauss points                   :math:`\sum_m a_m P_m`, Gauss quadrature
==============  =====================================  =======================================

All three converge geometrically for analytic data (Fourier only for periodic data) and
report ``order = inf``. Transforms run through the backend's FFT (pyFFTW on the CPU,
``cupyx.scipy.fft`` on the GPU) for NumPy/CuPy arrays and through ``xp.fft`` for other
array-API arrays; Legendre series are evaluated with the three-term recurrence. No
monomial basis is ever formed.
"""
from __future__ import annotations

import math
from functools import cached_property

import array_api_compat
import numpy as np

from ..backend import backend_of
from ..backend import constant
from .base import (
    Discretization,
    apply_matrix,
    barycentric_matrix,
    as_values,
    check_allocation,
    check_dense,
    is_native_array,
    register,
)
from .checks import is_half, through_float32
from .gauss import gauss_legendre
from .quadrature import ChebyshevExtremaGrid, chebyshev_barycentric_weights

__all__ = ["Fourier", "Chebyshev", "Legendre", "chebyshev_vandermonde", "legendre_vandermonde"]


def _fft_module(values):
    """The backend FFT for NumPy/CuPy arrays, the namespace's ``fft`` extension otherwise."""
    if is_native_array(values):
        return backend_of(values).fft
    return array_api_compat.array_namespace(values).fft


def _dct1(values, axis: int):
    r"""DCT-I along ``axis``: :math:`y_m = v_0 + (-1)^m v_N + 2 \sum_{k=1}^{N-1} v_k \cos(\pi k m / N)`.

    NumPy arrays use pyFFTW's DCT-I. CuPy (whose DCT lacks type I) and other namespaces use
    the real FFT of the even extension :math:`(v_0, \dots, v_N, v_{N-1}, \dots, v_1)`,
    whose real part is the DCT-I.
    """
    if array_api_compat.is_numpy_array(values):
        return backend_of(values).fft.dct(values, type=1, axis=axis)
    xp = array_api_compat.array_namespace(values)
    v = xp.moveaxis(values, axis, -1)
    ext = xp.concat([v, xp.flip(v[..., 1:-1], axis=-1)], axis=-1)
    return xp.moveaxis(xp.real(_fft_module(values).rfft(ext, axis=-1)), -1, axis)


def _scale_along(values, scale, axis: int):
    xp = array_api_compat.array_namespace(values)
    return xp.moveaxis(xp.moveaxis(values, axis, -1) * scale, -1, axis)


def chebyshev_vandermonde(t: np.ndarray, n: int) -> np.ndarray:
    r"""Matrix :math:`T_m(t_p)`, :math:`m < n`, by the recurrence
    :math:`T_{m+1} = 2 t T_m - T_{m-1}` (stable on :math:`[-1, 1]`)."""
    t = np.asarray(t, dtype=np.float64)
    check_dense(t.size, n, "the Chebyshev-Vandermonde matrix")
    V = np.empty((t.size, n))
    V[:, 0] = 1.0
    if n > 1:
        V[:, 1] = t
    for m in range(1, n - 1):
        V[:, m + 1] = 2.0 * t * V[:, m] - V[:, m - 1]
    return V


def legendre_vandermonde(t: np.ndarray, n: int) -> np.ndarray:
    r"""Matrix :math:`P_m(t_p)`, :math:`m < n`, by Bonnet's recurrence
    :math:`(m + 1) P_{m+1} = (2m + 1) t P_m - m P_{m-1}` (stable on :math:`[-1, 1]`)."""
    t = np.asarray(t, dtype=np.float64)
    check_dense(t.size, n, "the Legendre-Vandermonde matrix")
    V = np.empty((t.size, n))
    V[:, 0] = 1.0
    if n > 1:
        V[:, 1] = t
    for m in range(1, n - 1):
        V[:, m + 1] = ((2 * m + 1) * t * V[:, m] - m * V[:, m - 1]) / (m + 1)
    return V


class _Spectral(Discretization):
    kind = "spectral"
    order = math.inf

    def _reference(self, points: np.ndarray) -> np.ndarray:
        """Map points of the domain to :math:`[-1, 1]`."""
        a, b = self.domain
        return (2.0 * points - (a + b)) / (b - a)


@register
class Fourier(_Spectral):
    r"""Fourier (trigonometric) discretization of periodic functions on :math:`[a, b)`.

    Nodes :math:`x_j = a + (b - a) j / n`, weights :math:`(b - a)/n` (the trapezoidal rule
    for periodic integrands, exact for trigonometric polynomials of degree below ``n``).
    The reconstruction is the trigonometric interpolant

    .. math::

        p(x) = \sum_{|k| < n/2} c_k e^{i k \theta} + c_{n/2} \cos\left(\tfrac{n}{2}\theta\right),
        \qquad \theta = 2\pi \frac{x - a}{b - a},
        \qquad c_k = \frac{1}{n} \sum_j v_j e^{-i k \theta_j},

    where the last (Nyquist) term is present only for even ``n``: splitting
    :math:`c_{n/2}` equally between :math:`\pm n/2` gives the real interpolant of least
    oscillation. ``interpolate`` goes through a real FFT; :meth:`interpolation_matrix` is
    the equivalent Dirichlet-kernel matrix. For non-periodic data the reconstruction has
    Gibbs oscillations and the quadrature is only first order (a left Riemann sum).
    """

    name = "fourier"
    periodic = True

    def _nodes(self):
        a, _ = self.domain
        return a + self.length * np.arange(self.n) / self.n

    def _weights(self):
        return np.full(self.n, self.length / self.n)

    def coefficients(self, values, axis: int = -1):
        r"""Complex Fourier coefficients :math:`c_k` along ``axis``, in FFT order
        (:math:`k = 0, 1, \dots, -2, -1`), normalized so that :math:`c_0` is the mean."""
        values, xp, axis = as_values(values, self.n, axis)
        if is_half(values):  # FFTs have no half precision (complex64 out)
            return through_float32(lambda v: self.coefficients(v, axis), values, keep_complex=True)
        if not is_native_array(values) and xp.isdtype(values.dtype, "real floating"):
            # the array-API fft takes complex input only
            values = xp.astype(values, xp.complex64 if values.dtype == xp.float32 else xp.complex128)
        return _fft_module(values).fft(values, axis=axis) / self.n

    def _series_matrices(self, pts: np.ndarray):
        """``alpha_k cos(k theta_p)`` and ``alpha_k sin(k theta_p)`` for the real series."""
        half = self.n // 2 + 1
        check_dense(pts.size, 2 * half, "the Fourier series matrices")
        k = np.arange(half)
        alpha = np.full(half, 2.0)
        alpha[0] = 1.0
        if self.n % 2 == 0:
            alpha[-1] = 1.0  # Nyquist mode: split between +-n/2, i.e. counted once
        theta = 2.0 * np.pi * (pts - self.domain[0]) / self.length
        arg = np.outer(theta, k)
        return alpha * np.cos(arg), alpha * np.sin(arg)

    def interpolate(self, values, points, axis: int = -1):
        """Evaluate the trigonometric interpolant at ``points`` (real FFT, then the series).

        Complex ``values`` (the one method that accepts them: the interpolant is linear and
        real-valued for real data) use the Dirichlet-kernel matrix instead.
        """
        values, xp, axis = as_values(values, self.n, axis, allow_complex=True)
        if is_half(values):  # FFTs have no half precision: float32, rounded once
            return through_float32(lambda v: self.interpolate(v, points, axis), values)
        pts = self._check_points(points)
        if not xp.isdtype(values.dtype, "real floating"):
            mat = constant(None, None, lambda: self.interpolation_matrix(pts), values)
            return apply_matrix(xp.astype(mat, values.dtype), values, axis)
        c = _fft_module(values).rfft(xp.moveaxis(values, axis, -1), axis=-1) / self.n
        cos_m, sin_m = self._series_matrices(pts)
        cos_m = constant(None, None, lambda: cos_m, values)
        sin_m = constant(None, None, lambda: sin_m, values)
        out = xp.real(c) @ xp.matrix_transpose(cos_m) - xp.imag(c) @ xp.matrix_transpose(sin_m)
        return xp.moveaxis(out, -1, axis)

    def interpolation_matrix(self, points):
        r"""Dirichlet-kernel matrix: :math:`L_{pj} = \frac{\sin(n\pi s)}{n \sin(\pi s)}` for odd
        ``n`` and :math:`\frac{\sin(n\pi s)\cos(\pi s)}{n \sin(\pi s)}` for even ``n``, with
        :math:`s = (x_p - x_j)/(b - a)` reduced to :math:`[-1/2, 1/2]`."""
        pts = self._check_points(points)
        check_dense(pts.size, self.n, "the Fourier interpolation matrix")
        s = (pts[:, None] - self.nodes[None, :]) / self.length
        s -= np.round(s)  # periodicity; x = b coincides with x_0 = a
        hit = s == 0.0
        num = np.sin(self.n * np.pi * s)
        if self.n % 2 == 0:
            num *= np.cos(np.pi * s)
        with np.errstate(divide="ignore", invalid="ignore"):
            mat = num / (self.n * np.sin(np.pi * s))
        rows = hit.any(axis=1)
        mat[rows] = hit[rows].astype(np.float64)
        return mat


@register
class Chebyshev(ChebyshevExtremaGrid, _Spectral):
    r"""Chebyshev spectral discretization on the ``n`` Chebyshev extrema (ends included).

    The reconstruction is the interpolating Chebyshev series

    .. math::

        p(x) = \sum_{m=0}^{N} a_m T_m(t), \quad t = \frac{2x - a - b}{b - a}, \quad
        a_m = \frac{(-1)^m \gamma_m}{N} \mathrm{DCT\text{-}I}(v)_m, \quad N = n - 1,

    (:math:`\gamma_0 = \gamma_N = 1/2`, else 1; the sign comes from ordering the nodes
    :math:`t_j = -\cos(\pi j/N)` ascending). ``interpolate`` computes :math:`a_m` with a DCT
    and evaluates the series by the three-term recurrence; :meth:`interpolation_matrix` is
    the barycentric formula. Weights are Clenshaw-Curtis (exact integral of the series).
    Refinement keeps the nodes: ``n -> (n - 1) * factor + 1``.
    """

    name = "chebyshev"

    def _coefficient_scale(self) -> np.ndarray:
        m = self.n - 1
        scale = (-1.0) ** np.arange(self.n) / m
        scale[[0, -1]] *= 0.5
        return scale

    def coefficients(self, values, axis: int = -1):
        """Chebyshev coefficients :math:`a_m` of the interpolant along ``axis`` (via DCT-I)."""
        values, xp, axis = as_values(values, self.n, axis)
        if is_half(values):  # FFTs have no half precision: float32, rounded once
            return through_float32(lambda v: self._coefficients(v, axis), values)
        return self._coefficients(values, axis)

    def _coefficients(self, values, axis: int):
        scale = constant(self, "chebyshev_scale", self._coefficient_scale, values)
        return _scale_along(_dct1(values, axis), scale, axis)

    def interpolate(self, values, points, axis: int = -1):
        """Evaluate the Chebyshev series of ``values`` at ``points`` (DCT, then recurrence)."""
        values, xp, axis = as_values(values, self.n, axis)
        if is_half(values):  # FFTs have no half precision: float32, rounded once
            return through_float32(lambda v: self.interpolate(v, points, axis), values)
        pts = self._check_points(points)
        coef = self._coefficients(values, axis)
        vander = constant(None, None, lambda: chebyshev_vandermonde(self._reference(pts), self.n), values)
        return apply_matrix(vander, coef, axis)

    def interpolation_matrix(self, points):
        lam = chebyshev_barycentric_weights(self.n)
        return barycentric_matrix(self.nodes, lam, self._check_points(points))


@register
class Legendre(_Spectral):
    r"""Legendre spectral discretization on the ``n`` Legendre-Gauss points.

    The reconstruction is the Legendre series of degree :math:`n - 1` whose coefficients are
    computed by the Gauss rule (exact, since :math:`P_m p` has degree at most :math:`2n - 2`):

    .. math::

        p(x) = \sum_{m=0}^{n-1} a_m P_m(t), \qquad
        a_m = \frac{2m + 1}{2} \sum_j \omega_j P_m(t_j) v_j,

    with reference Gauss nodes :math:`t_j` and weights :math:`\omega_j` on :math:`[-1, 1]`.
    All Legendre values come from Bonnet's three-term recurrence. Quadrature weights are the
    Gauss weights (exact for degree :math:`2n - 1`).
    """

    name = "legendre"

    @cached_property
    def _gauss(self):
        return gauss_legendre(self.n)

    def _nodes(self):
        a, b = self.domain
        return 0.5 * (a + b) + 0.5 * (b - a) * self._gauss[0]

    def _weights(self):
        return 0.5 * self.length * self._gauss[1]

    @cached_property
    def coefficient_matrix(self) -> np.ndarray:
        r"""Host matrix :math:`C_{mj} = \frac{2m + 1}{2} \omega_j P_m(t_j)` mapping nodal values
        to Legendre coefficients.

        One step of iterative refinement, :math:`C \leftarrow C + C (I - V C)` with
        :math:`V_{jm} = P_m(t_j)` at the rounded nodes, makes :math:`C` the inverse of the
        interpolation problem actually posed; without it the rounding of the nodes is
        amplified like :math:`n^3` in the reconstruction (1e-12 at ``n = 40``)."""
        check_allocation(4 * 8.0 * self.n**2, f"the Legendre coefficient matrix of {self!r} "
                         f"({self.n} x {self.n}, dense, with its refinement step)",
                         "use a smaller n (argument n) or a quadrature rule")
        t, w = self._gauss
        vander = legendre_vandermonde(t, self.n)
        mat = (np.arange(self.n)[:, None] + 0.5) * vander.T * w[None, :]
        mat = mat + mat @ (np.eye(self.n) - vander @ mat)
        mat.setflags(write=False)
        return mat

    def coefficients(self, values, axis: int = -1):
        """Legendre coefficients :math:`a_m` of the interpolant along ``axis``."""
        values, xp, axis = as_values(values, self.n, axis)
        mat = constant(self, "legendre_coefficients", lambda: self.coefficient_matrix, values)
        return apply_matrix(mat, values, axis)

    def interpolation_matrix(self, points):
        """``P_m(t_p)`` (recurrence) times :attr:`coefficient_matrix`."""
        pts = self._check_points(points)
        return legendre_vandermonde(self._reference(pts), self.n) @ self.coefficient_matrix
