r"""From tokens to a density on the sphere: harmonic moments, the distribution of :math:`s`, sampling.

The empirical measure :math:`\mu_n = \sum_i w_i\delta_{x_i}` (:math:`w_i = 1/n`) of particles
on :math:`S^{d-1}` has the harmonic moments

.. math::

    c_l = \sum_i w_i\,\varphi_l(\langle x_i, e\rangle) \;\text{(zonal)}, \qquad
    a_{lm} = \sum_i w_i\,\overline{Y_{lm}(x_i)} \;\text{(}S^2\text{)},

the coefficients of its projection on degrees :math:`\le L` (:func:`empirical_density`): for a
density :math:`\rho` these are exactly the solvers' coefficients :math:`\int\rho\,\varphi_l\,
d\sigma`, and for i.i.d. :math:`x_i \sim \rho` their error is :math:`O(n^{-1/2})`.
:func:`s_distance` compares the distributions of :math:`s = \langle x, e\rangle` (Kolmogorov
distance) of particles and of a zonal mean field; :func:`sample_zonal` draws i.i.d. tokens
from a zonal density.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np
from scipy import special

from ..backend import to_host
from .sphere_basis import sphere_area
from .sphere_geometry import sphere_tolerance

__all__ = ["empirical_density", "s_distance", "zonal_cdf", "sample_zonal"]


def _host_reals(values, what: str) -> np.ndarray:
    """``values`` (any array or array-like of real numbers) as a host NumPy array, dtype kept.

    A complex array is refused: its imaginary part would be dropped, with a NumPy warning only.
    """
    host = np.asarray(to_host(values) if array_api_compat.is_array_api_obj(values) else values)
    if np.iscomplexobj(host):
        raise TypeError(f"{what} must be real, got complex values (dtype {host.dtype}); pass the "
                        "real part explicitly if that is meant")
    if host.dtype.kind not in "biuf":
        raise TypeError(f"{what} must be an array of real numbers, got dtype {host.dtype}")
    return host


def _positions(positions, dimension=None) -> np.ndarray:
    x = _host_reals(positions, "positions")
    # data normalized in its own precision is accepted: float16 rows are ~1e-3 off the sphere
    # (the dtype asked before the host copy: a torch bfloat16 tensor arrives as float32)
    tol = 1e-6
    if x.dtype.kind == "f":
        tol = max(tol, sphere_tolerance(getattr(positions, "dtype", x.dtype)))
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or (dimension is not None and x.shape[1] != dimension):
        want = f"(n, {dimension})" if dimension is not None else "(n, d)"
        raise ValueError(f"positions must have shape {want}, got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("positions have NaN or infinite values")
    if np.max(np.abs(np.linalg.norm(x, axis=1) - 1)) > tol:
        raise ValueError(f"positions must lie on the unit sphere (|x_i| = 1 to {tol:.2g}, the larger of "
                         "1e-6 and sqrt(eps) of their dtype); normalize them first")
    return x


def _axis(axis, d) -> np.ndarray:
    e = np.zeros(d)
    e[-1] = 1.0
    if axis is None:
        return e
    e = np.asarray(axis, dtype=np.float64).reshape(-1)
    if e.shape != (d,) or not np.isfinite(np.linalg.norm(e)) or np.linalg.norm(e) == 0:
        raise ValueError(f"axis must be a nonzero vector of length {d}, got {axis!r}")
    return e / np.linalg.norm(e)


def empirical_density(positions, solver, *, axis=None, weights=None):
    r"""Harmonic moments of particles: coefficients in ``solver``'s representation.

    Parameters
    ----------
    positions : array, shape (n, d)
        Points on :math:`S^{d-1}` (:math:`d` = ``solver.dimension``; 3 for :class:`SphericalMeanField`).
    solver : ZonalMeanField or SphericalMeanField
        Fixes the degree :math:`L` and the basis.
    axis : array, shape (d,), optional
        The zonal axis :math:`e` (default the last coordinate vector); zonal only.
    weights : array, shape (n,), optional
        Particle weights, finite and >= 0 (default :math:`1/n`).

    Returns
    -------
    numpy.ndarray
        :math:`c_l` (shape (L+1,)) or :math:`a_{lm}` (complex, healpy order); ``solver``'s
        ``energy``, ``order_parameter`` and ``dominant_mode`` accept them.

    Raises
    ------
    TypeError
        For complex or non-numeric ``positions`` or ``weights`` (read in float64 on the host
        from any library otherwise).
    ValueError
        For a wrong shape, NaN or inf, or points off the sphere by more than the larger of
        1e-6 and :math:`\sqrt{\varepsilon}` of their dtype.
    """
    d = getattr(solver, "dimension", 3)
    x = _positions(positions, d)
    w = (np.full(x.shape[0], 1.0 / x.shape[0]) if weights is None
         else np.asarray(_host_reals(weights, "weights"), dtype=np.float64))
    if w.shape != (x.shape[0],) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must be {x.shape[0]} finite numbers >= 0 (a measure), got "
                         f"shape {w.shape} and values from {np.min(w, initial=np.inf):.6g}")
    if hasattr(solver, "basis"):  # zonal
        s = np.clip(x @ _axis(axis, d), -1.0, 1.0)
        return w @ solver.basis.evaluate(np.eye(solver.degree + 1), s).T
    if axis is not None:
        raise ValueError("axis is for zonal solvers; SphericalMeanField uses the coordinate axes")
    theta = np.arccos(np.clip(x[:, 2], -1.0, 1.0))
    phi = np.arctan2(x[:, 1], x[:, 0])
    y = special.sph_harm_y(solver.l[None, :], solver.m[None, :], theta[:, None], phi[:, None])
    return w @ np.conj(y)


def zonal_cdf(solver, coefficients, s) -> np.ndarray:
    r"""The distribution function :math:`F(s) = \int_{\langle x, e\rangle \le s}\rho\,d\sigma` of a zonal density.

    :math:`F(s) = |S^{d-2}|\int_{\arccos s}^{\pi}\rho(\cos\vartheta)\sin^{d-2}\vartheta\,d\vartheta`,
    by 6-point Gauss-Legendre on each interval between the requested angles and 64 equispaced
    ones (a smooth integrand in :math:`\vartheta`: exact to rounding for moderate degrees).
    """
    s = np.clip(np.asarray(s, dtype=np.float64), -1.0, 1.0)
    theta = np.arccos(s.reshape(-1))
    cuts = np.unique(np.concatenate([theta, np.linspace(0.0, math.pi, 65)]))
    u, w = np.polynomial.legendre.leggauss(6)
    left, width = cuts[:-1, None], np.diff(cuts)[:, None]
    nodes = left + width * (u + 1) / 2
    values = solver.basis.evaluate(coefficients, np.cos(nodes)) * np.sin(nodes) ** (solver.dimension - 2)
    pieces = np.sum(values * w, axis=-1) * width[:, 0] / 2
    tail = np.concatenate([np.cumsum(pieces[::-1])[::-1], [0.0]])  # integral from cuts[k] to pi
    return sphere_area(solver.dimension - 1) * tail[np.searchsorted(cuts, theta)].reshape(s.shape)


def s_distance(positions, solver, coefficients, *, axis=None) -> float:
    r"""Kolmogorov distance :math:`\sup_s |F_n(s) - F(s)|` of the :math:`s`-distributions.

    Of particles (``positions``) and of the zonal density with ``coefficients``.
    """
    x = _positions(positions, solver.dimension)
    s = np.sort(np.clip(x @ _axis(axis, solver.dimension), -1.0, 1.0))
    f = zonal_cdf(solver, coefficients, s) / zonal_cdf(solver, coefficients, 1.0)
    n = s.shape[0]
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def sample_zonal(solver, coefficients, n, rng, *, table=2049) -> np.ndarray:
    r"""``n`` i.i.d. points on :math:`S^{d-1}` from the zonal density with ``coefficients`` (axis: last coordinate).

    :math:`s` by inverting :func:`zonal_cdf` on a table of ``table`` points (linear
    interpolation), the direction orthogonal to the axis uniform (a normalized Gaussian).
    """
    d = solver.dimension
    grid = -np.cos(np.linspace(0.0, math.pi, table))
    cdf = zonal_cdf(solver, coefficients, grid)
    cdf = np.maximum.accumulate(cdf / cdf[-1])
    s = np.interp(rng.random(n), cdf, grid)
    g = rng.standard_normal((n, d - 1))
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    return np.concatenate([np.sqrt(1 - s * s)[:, None] * g, s[:, None]], axis=1)
