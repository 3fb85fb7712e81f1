r"""Zonal functions on :math:`S^{d-1}`: Gegenbauer polynomials, Gauss nodes, Funk-Hecke coefficients.

A function on the sphere :math:`S^{d-1} \subset \mathbb{R}^d` that depends only on
:math:`s = \langle x, e\rangle` for a fixed axis :math:`e` is integrated against the surface
measure through

.. math::

    \int_{S^{d-1}} f(\langle x, e\rangle)\, d\sigma(x) = |S^{d-2}| \int_{-1}^{1} f(s)\,
    (1 - s^2)^{\alpha}\, ds, \qquad \alpha = \frac{d-3}{2},
    \qquad |S^{k-1}| = \frac{2\pi^{k/2}}{\Gamma(k/2)} .

The orthogonal polynomials of the weight :math:`(1-s^2)^{\alpha}` are the Gegenbauer
polynomials :math:`C_l^{a}`, :math:`a = (d-2)/2` (Chebyshev for :math:`d = 2`, Legendre for
:math:`d = 3`). :class:`GegenbauerBasis` holds them orthonormal for :math:`d\sigma`,
:math:`\varphi_l(s)`, built by the three-term recurrence of the orthonormal Jacobi
polynomials with :math:`\alpha = \beta`,

.. math::

    s\,p_l = b_{l+1} p_{l+1} + b_l p_{l-1}, \qquad b_1^2 = \frac{1}{2\alpha + 3}, \qquad
    b_l^2 = \frac{l(l + 2\alpha)}{(2l + 2\alpha - 1)(2l + 2\alpha + 1)} \;(l \ge 2),

on the Gauss-Jacobi nodes of :func:`scipy.special.roots_jacobi`.

Funk-Hecke: :math:`\varphi_l(\langle\cdot, e\rangle)` is a spherical harmonic of degree
:math:`l`, so :math:`\int e^{\beta\langle x, y\rangle}\varphi_l(\langle y, e\rangle)\,d\sigma(y) =
\lambda_l(\beta)\varphi_l(\langle x, e\rangle)` with

.. math::

    \lambda_l(\beta) = (2\pi)^{d/2}\, |\beta|^{1 - d/2}\, I_{l + d/2 - 1}(|\beta|)\,
    \operatorname{sign}(\beta)^l

(for :math:`d = 2`, :math:`2\pi I_l(\beta)`, the circle's Fourier multiplier).
:func:`funk_hecke` returns it times :math:`e^{-|\beta|}` (:func:`scipy.special.ive`), and
:func:`kernel_multipliers` what the solvers use; both are formed in logarithms
(:func:`log_ive`), finite in every dimension. At :math:`\beta = 0` (uniform attention) they
take their closed form, :math:`\lambda_l(0) = |S^{d-1}|\,\delta_{l0}`, and the velocity's
:math:`\lambda_l/\beta` (:func:`gradient_multipliers`) its limit
:math:`\lambda_1/\beta \to |S^{d-1}|/d`, :math:`\lambda_l/\beta \to 0` for :math:`l \ne 1`
(:math:`\lambda_l = O(\beta^l)`): the velocity is the tangent part of the mean token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from ..discretizations.memory import check_allocation, memory_budget, surely_within
from ..validation import boolean, integer, real
from .dynamics import _check_beta

__all__ = ["GegenbauerBasis", "sphere_area", "log_sphere_area", "funk_hecke", "kernel_multipliers", "log_ive",
           "gradient_multipliers", "linear_growth_rate", "check_dimension", "check_beta", "check_noise", "laplace_eigenvalues",
           "kernel_energy", "check_size"]

_IVE_DIRECT = 1e-280  # scipy's ive above this, the log-domain series below (log_ive)


def check_dimension(dimension) -> int:
    """The ambient dimension d >= 2 of the sphere S^{d-1}."""
    if integer(dimension, "dimension", minimum=None) < 2:
        raise ValueError(f"dimension must be an integer >= 2 (tokens on S^(d-1) in R^d; d = 2 is the "
                         f"circle), got dimension={dimension!r}")
    return int(dimension)


def check_beta(beta) -> float:
    """A finite inverse temperature (0 included: uniform attention, the multipliers' closed form)."""
    return _check_beta(beta)


def check_noise(noise) -> float:
    """A finite diffusion coefficient nu >= 0."""
    return real(noise, "noise", nonnegative=True)


def check_size(estimate, value: int, argname: str, what: str, minimum: int = 1) -> None:
    r"""Refuse a size whose constructor would build more than the memory budget, before it does.

    ``estimate(n)`` is the bytes (increasing in :math:`n`) a solver of size :math:`n` builds at
    its peak; :math:`n` = ``value`` is refused with
    :class:`~ctformer.discretizations.SizeTooLargeError` when its estimate exceeds
    :func:`~ctformer.discretizations.memory.memory_budget`. The message names ``argname`` and
    the largest :math:`n \ge` ``minimum`` that fits (by bisection on ``estimate``).
    """
    nbytes = float(estimate(value))
    if surely_within(nbytes):
        return
    budget = memory_budget()
    if nbytes <= budget:
        return
    if estimate(minimum) > budget:
        remedy = f"even {argname}={minimum} does not fit: raise the budget (CTFORMER_MEMORY_BUDGET)"
    else:
        low, high = minimum, value  # estimate(low) fits, estimate(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if estimate(middle) <= budget else (low, middle)
        remedy = f"use {argname} <= {low} (argument {argname}), or raise CTFORMER_MEMORY_BUDGET"
    check_allocation(nbytes, f"{what} with {argname}={value}", remedy)


def sphere_area(dimension) -> float:
    r"""The surface area :math:`|S^{d-1}| = 2\pi^{d/2}/\Gamma(d/2)` of the unit sphere in :math:`\mathbb{R}^d`.

    ``dimension = 1`` gives :math:`|S^0| = 2` (two points). Beyond :math:`d = 340`, where
    :math:`\Gamma(d/2)` leaves the float64 range, through :func:`log_sphere_area` (0.0 once the
    area itself underflows, :math:`d > 1075`).
    """
    d = int(dimension)
    if d <= 340:  # math.gamma is accurate to a few ulp; exp(lgamma) loses digits at large d
        return 2.0 * math.pi ** (d / 2) / math.gamma(d / 2)
    return math.exp(log_sphere_area(d))


def log_sphere_area(dimension) -> float:
    r""":math:`\log|S^{d-1}| = \log 2 + \frac d2\log\pi - \log\Gamma(d/2)`, finite in every dimension."""
    d = int(dimension)
    return math.log(2.0) + 0.5 * d * math.log(math.pi) - math.lgamma(d / 2)


def laplace_eigenvalues(degrees, dimension) -> np.ndarray:
    r"""The eigenvalues :math:`l(l + d - 2)` of :math:`-\Delta_S` on degree-:math:`l` harmonics of :math:`S^{d-1}`."""
    degrees = np.asarray(degrees, dtype=np.float64)
    return degrees * (degrees + dimension - 2)


def log_ive(order, x) -> np.ndarray:
    r""":math:`\log(I_\nu(x)\,e^{-x})` for orders :math:`\nu \ge 0` and :math:`x > 0`, without underflow.

    :func:`scipy.special.ive` where it is a normal number above :math:`10^{-280}`; below, where
    it loses digits and then underflows to 0 (large :math:`\nu`, small :math:`x`: at
    :math:`d = 768` every :math:`I_{l+d/2-1}(1)` does), the power series

    .. math::  I_\nu(x) = \frac{(x/2)^\nu}{\Gamma(\nu+1)}\sum_{k\ge0}
               \frac{(x^2/4)^k}{k!\,(\nu+1)_k}

    summed in logarithms (positive terms, no cancellation) well past its largest term,
    :math:`k^* = (\sqrt{\nu^2+x^2}-\nu)/2`.
    """
    order = np.asarray(order, dtype=np.float64)
    flat = order.reshape(-1)
    with np.errstate(divide="ignore"):
        direct = special.ive(flat, x)
    out = np.empty(flat.shape)
    for i, (nu, value) in enumerate(zip(flat, direct)):
        if value > _IVE_DIRECT:
            out[i] = math.log(value)
            continue
        peak = 0.5 * (math.hypot(nu, x) - nu)
        k = np.arange(int(peak + 20.0 * math.sqrt(peak + 1.0)) + 40, dtype=np.float64)
        log_terms = np.concatenate([[0.0], np.cumsum(2 * math.log(x / 2) - np.log1p(k) - np.log(nu + 1 + k))])
        top = log_terms.max()
        out[i] = (nu * math.log(x / 2) - math.lgamma(nu + 1) - x + top
                  + math.log(np.sum(np.exp(log_terms - top))))
    return out.reshape(order.shape)


def _log_kernel(degrees, beta, dimension):
    r""":math:`\log(e^{-|\beta|}|\lambda_l(\beta)|)` and :math:`\operatorname{sign}(\beta)^l`."""
    degrees = np.asarray(degrees)
    b = abs(beta)
    logs = (0.5 * dimension * math.log(2 * math.pi) + (1 - 0.5 * dimension) * math.log(b)
            + log_ive(degrees + dimension / 2 - 1, b))
    return logs, np.where(degrees % 2 == 1, math.copysign(1.0, beta), 1.0)


def _at_zero(degrees, dimension, normalized):
    r""":math:`\lambda_l(0) = |S^{d-1}|\delta_{l0}` (SA: :math:`\delta_{l0}`), float64 of the shape of ``degrees``."""
    return np.where(np.asarray(degrees) == 0, 1.0 if normalized else sphere_area(dimension), 0.0)


def _times_exp(logs, b):
    """exp(logs + b) without losing the digits of a large b in the sum (exp(b) rounds once)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.where(logs > -600.0, np.exp(logs) * math.exp(b), np.exp(logs + b))


def funk_hecke(degrees, beta, dimension) -> np.ndarray:
    r"""Funk-Hecke coefficients of :math:`e^{\beta\langle x, y\rangle}` on :math:`S^{d-1}`, times :math:`e^{-|\beta|}`.

    .. math::  e^{-|\beta|}\lambda_l(\beta) = (2\pi)^{d/2} |\beta|^{1-d/2}\,
               \mathrm{ive}(l + d/2 - 1, |\beta|)\, \operatorname{sign}(\beta)^l ,

    formed in logarithms (:func:`log_ive`), so that neither :math:`|\beta|^{1-d/2}` nor
    :math:`\mathrm{ive}` leaves the float64 range on the way (at :math:`\beta = 1`,
    :math:`d = 300` the second is :math:`10^{-350}`); the result is 0 only where it underflows.

    Parameters
    ----------
    degrees : array of int
        Degrees :math:`l \ge 0`.
    beta : float
        Finite; at 0 the closed form :math:`|S^{d-1}|\,\delta_{l0}`.
    dimension : int
        :math:`d \ge 2`.

    Returns
    -------
    numpy.ndarray of float
    """
    if beta == 0:
        return _at_zero(degrees, dimension, False)
    logs, sign = _log_kernel(degrees, beta, dimension)
    return sign * np.exp(logs)


def kernel_multipliers(degrees, beta, dimension, normalized) -> np.ndarray:
    r"""The multipliers :math:`m_l` of :math:`G = \sum_l m_l c_l\varphi_l` that a solver uses.

    SA (``normalized``): :math:`m_l = \lambda_l/\lambda_0 = \operatorname{sign}(\beta)^l\,
    I_{l+d/2-1}(|\beta|)/I_{d/2-1}(|\beta|)`, at most 1 in every dimension (the velocity
    :math:`\nabla_S G/(\beta G)` does not see a common factor). USA: :math:`m_l = \lambda_l`.
    At :math:`\beta = 0`: :math:`\delta_{l0}` (SA), :math:`|S^{d-1}|\,\delta_{l0}` (USA).
    """
    if beta == 0:
        return _at_zero(degrees, dimension, normalized)
    logs, sign = _log_kernel(degrees, beta, dimension)
    if normalized:
        return sign * np.exp(logs - _log_kernel(0, beta, dimension)[0])
    return sign * _times_exp(logs, abs(beta))


def kernel_energy(power, beta, dimension, log=False):
    r""":math:`E = \frac{1}{2\beta}\sum_l \lambda_l(\beta) P_l` from the per-degree powers :math:`P_l`.

    :math:`P_l = \sum_m |c_{lm}|^2` (shape (..., L + 1)). The sum is formed with
    :math:`e^{-|\beta|}\lambda_l` and :math:`e^{|\beta|}` put back in the logarithm, so ``log=True``
    gives :math:`\log E` for every finite :math:`\beta > 0`; ``beta`` is nonzero (the callers
    refuse 0).

    Raises
    ------
    OverflowError
        When :math:`E` itself is beyond float64 (:math:`|\beta| \gtrsim 709`), naming ``log=True``.
    ValueError
        For ``log=True`` with :math:`\beta < 0`, where :math:`E < 0`.
    """
    if log and beta < 0:
        raise ValueError(f"energy(..., log=True) needs beta > 0: with beta={beta} the energy is negative; "
                         "use log=False")
    logs, sign = _log_kernel(np.arange(np.shape(power)[-1]), beta, dimension)
    scaled = np.asarray(power, dtype=np.float64) @ (sign * np.exp(logs))  # e^{-|beta|} sum_l lambda_l P_l
    with np.errstate(divide="ignore"):
        log_e = np.log(np.abs(scaled)) + abs(beta) - math.log(2 * abs(beta))
    if log:
        return log_e
    if np.max(log_e, initial=-np.inf) >= math.log(np.finfo(np.float64).max):
        # log=True is refused for beta < 0 (E < 0): there the message gives log|E| itself
        remedy = ("use energy(..., log=True) for log E" if beta > 0 else
                  f"E is negative (beta < 0), log|E| = {np.max(log_e):.17g}, and log=True needs beta > 0")
        raise OverflowError(f"the energy (1/(2 beta)) sum_l lambda_l |c_l|^2 = {'-' if beta < 0 else ''}"
                            f"exp({np.max(log_e):.1f}) at beta={beta} is beyond the float64 range; {remedy}")
    return np.sign(scaled) * math.copysign(1.0, beta) * np.exp(log_e)


def gradient_multipliers(degrees, beta, dimension, normalized) -> np.ndarray:
    r"""The multipliers :math:`m_l/\beta` of :math:`\nabla_S G/\beta = \sum_l (m_l/\beta)\,c_l\nabla_S\varphi_l`.

    :math:`m_l` as in :func:`kernel_multipliers`, divided by :math:`\beta` in logarithms (no
    loss for a tiny :math:`\beta`). At :math:`\beta = 0` the limit, from
    :math:`I_\nu(b) \sim (b/2)^\nu/\Gamma(\nu+1)`: :math:`\lambda_1/\beta \to |S^{d-1}|/d`
    and :math:`\lambda_l/\beta \to 0` for :math:`l \ne 1`, so :math:`m_1/\beta \to 1/d` (SA)
    or :math:`|S^{d-1}|/d` (USA): the velocity :math:`P^\perp_x\int y\,d\mu(y)` (divided by
    the mass for SA). The :math:`l = 0` entry is 0 for every :math:`\beta`: :math:`\varphi_0` is
    constant, and :math:`m_0/\beta` alone diverges as :math:`\beta \to 0`.
    """
    degrees = np.asarray(degrees)
    if beta == 0:
        return np.where(degrees == 1, (1.0 if normalized else sphere_area(dimension)) / dimension, 0.0)
    logs, sign = _log_kernel(degrees, beta, dimension)
    logs = logs - math.log(abs(beta))
    sign = sign * math.copysign(1.0, beta)
    if normalized:
        out = sign * np.exp(logs - _log_kernel(0, beta, dimension)[0])
    else:
        out = sign * _times_exp(logs, abs(beta))
    return np.where(degrees == 0, 0.0, out)


def linear_growth_rate(k, beta, normalized=True, dimension=2, noise=0.0):
    r"""Growth rate of a degree-:math:`l` harmonic linearized about the uniform density on :math:`S^{d-1}`.

    .. math::

        \sigma_l = \frac{l(l+d-2)\,\lambda_l(\beta)}{\beta\,\lambda_0(\beta)} - \nu\, l(l+d-2)
        \;\text{(SA)}, \qquad
        \sigma_l = \frac{l(l+d-2)\,\lambda_l(\beta)}{\beta\,|S^{d-1}|} - \nu\, l(l+d-2)
        \;\text{(USA, mass one)},

    with the Funk-Hecke coefficients :math:`\lambda_l` (:func:`funk_hecke`); for SA
    :math:`\lambda_l/\lambda_0 = I_{l+d/2-1}(\beta)/I_{d/2-1}(\beta)`. For :math:`d = 2` these
    are the circle's :math:`k^2 I_k(\beta)/(\beta I_0(\beta))` and :math:`k^2 I_k(\beta)/\beta`.
    The uniform state loses stability at :math:`l = 1` for
    :math:`\nu_c = \lambda_1/(\beta\lambda_0) = I_{d/2}(\beta)/(\beta I_{d/2-1}(\beta))` (SA).

    Parameters
    ----------
    k : int or array of int
        Degrees :math:`l \ge 0`.
    beta : float
        Finite (:math:`|\beta| \le 700` for USA); at 0 the limit
        :math:`\sigma_1 = (d-1)/d - \nu(d-1)`, :math:`\sigma_l = -\nu\,l(l+d-2)` otherwise
        (SA and USA alike: :math:`\lambda_1/(\beta\lambda_0) \to 1/d`).
    normalized : bool
        SA (True) or USA (False).
    dimension : int
        :math:`d \ge 2` (tokens on :math:`S^{d-1}`).
    noise : float
        :math:`\nu \ge 0`, the coefficient of :math:`\nu\Delta_S`.

    Returns
    -------
    float or numpy.ndarray
    """
    beta, d, nu = check_beta(beta), check_dimension(dimension), check_noise(noise)
    normalized = boolean(normalized, "normalized")
    degrees = np.asarray(k)
    if not np.issubdtype(degrees.dtype, np.integer) or np.any(degrees < 0):
        raise ValueError(f"k must be non-negative integer degrees, got {k!r}")
    if not normalized and abs(beta) > 700:
        raise ValueError(f"USA (normalized=False) needs |beta| <= 700: its rates carry exp(|beta|), "
                         f"got beta={beta}")
    logs, sign = _log_kernel(degrees, beta if beta else 1.0, d)
    # ratios formed in logarithms: finite in every dimension (d = 768 included)
    if beta == 0:  # lambda_l / (beta lambda_0) -> delta_{l1} / d, for SA and USA (mass one) alike
        ratio = np.where(degrees == 1, 1.0 / d, 0.0)
    elif normalized:
        ratio = sign * np.exp(logs - _log_kernel(0, beta, d)[0]) / beta
    else:
        ratio = sign * _times_exp(logs - log_sphere_area(d), abs(beta)) / beta
    lap = laplace_eigenvalues(degrees, d)
    rate = lap * ratio - nu * lap
    return float(rate) if rate.ndim == 0 else rate


@dataclass(frozen=True, eq=False)
class GegenbauerBasis:
    r"""Orthonormal zonal polynomials :math:`\varphi_0..\varphi_L` on Gauss-Jacobi nodes.

    :math:`\int_{S^{d-1}} \varphi_l \varphi_m\, d\sigma = \delta_{lm}`; ``weights`` integrate
    a zonal function against :math:`d\sigma`, exactly for polynomials in :math:`s` of degree up to
    ``2 * len(nodes) - 1``.

    Attributes
    ----------
    dimension, degree : int
    nodes, weights : numpy.ndarray, shape (M,)
    values, derivatives : numpy.ndarray, shape (M, L + 1)
        :math:`\varphi_l(s_j)` and :math:`\varphi_l'(s_j)`.
    """

    dimension: int
    degree: int
    nodes: np.ndarray
    weights: np.ndarray
    values: np.ndarray
    derivatives: np.ndarray

    @classmethod
    def build(cls, dimension: int, degree: int, n_nodes: int) -> "GegenbauerBasis":
        """The basis of degree ``degree`` on ``n_nodes`` Gauss-Jacobi nodes (exact to degree 2 M - 1)."""
        alpha = (dimension - 3) / 2
        s, w = special.roots_jacobi(n_nodes, alpha, alpha)
        weights = sphere_area(dimension - 1) * w
        values, derivatives = _orthonormal(s, degree, alpha)
        scale = 1.0 / math.sqrt(sphere_area(dimension - 1))
        return cls(dimension, degree, s, weights, values * scale, derivatives * scale)

    def evaluate(self, coefficients, s):
        r""":math:`\sum_l c_l \varphi_l(s)` at arbitrary ``s`` in [-1, 1] (``coefficients`` shape (..., L + 1))."""
        s = np.asarray(s, dtype=np.float64)
        values, _ = _orthonormal(s.reshape(-1), self.degree, (self.dimension - 3) / 2)
        values = values / math.sqrt(sphere_area(self.dimension - 1))
        return (np.asarray(coefficients) @ values.T).reshape(np.shape(coefficients)[:-1] + s.shape)

    def project(self, values):
        r"""Coefficients :math:`c_l = \int \rho\,\varphi_l\,d\sigma` of values at the nodes (Gauss quadrature)."""
        return (np.asarray(values) * self.weights) @ self.values


def _orthonormal(s: np.ndarray, degree: int, alpha: float):
    """Orthonormal Jacobi(alpha, alpha) polynomials for the weight (1 - s^2)^alpha and their derivatives."""
    b = np.zeros(degree + 2)
    b[1] = math.sqrt(1.0 / (2 * alpha + 3))
    n = np.arange(2, degree + 2, dtype=np.float64)
    b[2:] = np.sqrt(n * (n + 2 * alpha) / ((2 * n + 2 * alpha - 1) * (2 * n + 2 * alpha + 1)))
    mu0 = 2 ** (2 * alpha + 1) * math.exp(2 * special.gammaln(alpha + 1) - special.gammaln(2 * alpha + 2))
    p = np.zeros((degree + 1, s.shape[0]))  # rows: contiguous recurrences
    dp = np.zeros_like(p)
    p[0] = 1.0 / math.sqrt(mu0)
    if degree >= 1:
        p[1] = s * p[0] / b[1]
        dp[1] = p[0] / b[1]
    for l in range(1, degree):
        p[l + 1] = (s * p[l] - b[l] * p[l - 1]) / b[l + 1]
        dp[l + 1] = (p[l] + s * dp[l] - b[l] * dp[l - 1]) / b[l + 1]
    return p.T, dp.T
