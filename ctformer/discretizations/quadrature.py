r"""Quadrature rules: values are point values, integrals are weighted sums.

==================  ==================================  ===========================
rule                nodes                               order on smooth data
==================  ==================================  ===========================
``Midpoint``        cell centres                        2
``Trapezoid``       uniform, ends included              2 (spectral if periodic)
``GaussLegendre``   Gauss points                        spectral
``ClenshawCurtis``  Chebyshev extrema                   spectral
==================  ==================================  ===========================
"""
from __future__ import annotations

import math
from functools import cached_property

import numpy as np
import scipy.fft

from .base import Discretization, barycentric_matrix, linear_matrix, register
from .gauss import gauss_legendre

__all__ = [
    "Midpoint",
    "Trapezoid",
    "GaussLegendre",
    "ClenshawCurtis",
    "chebyshev_extrema",
    "clenshaw_curtis_weights",
    "chebyshev_barycentric_weights",
]


@register
class Midpoint(Discretization):
    r"""Composite midpoint rule on ``n`` cells: :math:`x_j = a + (j + 1/2) h`, :math:`w_j = h`.

    Interpolation is piecewise linear through the cell centres, extended linearly over the two
    half cells at the ends, so that it is second order like the quadrature. With ``n`` tokens
    on :math:`[0, 1]` it is the grid on which a real Transformer lives (design notes, section 2).
    """

    name = "midpoint"
    order = 2.0

    def _nodes(self):
        a, _ = self.domain
        return a + (np.arange(self.n) + 0.5) * self.h

    def _weights(self):
        return np.full(self.n, self.h)

    def interpolation_matrix(self, points):
        return linear_matrix(self.nodes, self._check_points(points))


@register
class Trapezoid(Discretization):
    r"""Composite trapezoidal rule on ``n`` uniform nodes including both ends.

    :math:`x_j = a + j h` with :math:`h = (b - a)/(n - 1)`, :math:`w_j = h` except
    :math:`w_0 = w_{n-1} = h/2`. Second order; for periodic smooth integrands the
    quadrature converges geometrically (Euler-Maclaurin). Interpolation is piecewise linear
    through the nodes. Refinement keeps the nodes: ``n -> (n - 1) * factor + 1``.
    """

    name = "trapezoid"
    order = 2.0
    min_n = 2

    @property
    def h(self) -> float:
        """Node spacing :math:`(b - a)/(n - 1)`."""
        return self.length / (self.n - 1)

    def _nodes(self):
        return np.linspace(*self.domain, self.n)

    def _weights(self):
        w = np.full(self.n, self.h)
        w[[0, -1]] = 0.5 * self.h
        return w

    def interpolation_matrix(self, points):
        return linear_matrix(self.nodes, self._check_points(points))

    def _refined_n(self, factor):
        return (self.n - 1) * factor + 1


@register
class GaussLegendre(Discretization):
    r"""Gauss-Legendre rule with ``n`` points: exact for polynomials of degree :math:`2n - 1`.

    Interpolation is the barycentric formula with the weights
    :math:`\lambda_j = (-1)^j \sqrt{(1 - t_j^2) w_j}` of Legendre points.

    Nodes and weights come from :func:`ctformer.discretizations.gauss.gauss_legendre`:
    NumPy's ``leggauss`` up to ``n = 100``, above it Newton's method on asymptotic
    expansions in :math:`O(n)` memory and time (``n = 2000`` in milliseconds,
    ``n = 10**6`` in about a second), nodes and weights accurate to a few units of rounding.
    """

    name = "gauss-legendre"
    order = math.inf

    @cached_property
    def _reference_rule(self):
        return gauss_legendre(self.n)

    def _reference(self):
        return self._reference_rule

    def _nodes(self):
        a, b = self.domain
        t, _ = self._reference()
        return 0.5 * (a + b) + 0.5 * (b - a) * t

    def _weights(self):
        _, w = self._reference()
        return 0.5 * self.length * w

    def interpolation_matrix(self, points):
        t, w = self._reference()
        bary = (-1.0) ** np.arange(self.n) * np.sqrt((1 - t**2) * w)
        return barycentric_matrix(self.nodes, bary, self._check_points(points))


def chebyshev_extrema(n: int) -> np.ndarray:
    r"""The ``n`` Chebyshev extreme points :math:`t_j = -\cos(\pi j/(n - 1))` in ascending order.

    Computed as :math:`\sin(\pi (2j - n + 1)/(2(n - 1)))`, which is exactly antisymmetric
    and hits :math:`\pm 1` and (for odd ``n``) 0 exactly.
    """
    m = n - 1
    return np.sin(np.pi * (2.0 * np.arange(n) - m) / (2.0 * m))


def clenshaw_curtis_weights(n: int) -> np.ndarray:
    r"""Clenshaw-Curtis weights on :math:`[-1, 1]` for the ``n`` points :func:`chebyshev_extrema`.

    With :math:`N = n - 1`, the interpolant :math:`\sum_m a_m T_m` has coefficients
    :math:`a_m = \gamma_m N^{-1} \mathrm{DCT\text{-}I}(v)_m` (:math:`\gamma_0 = \gamma_N = 1/2`,
    else 1) and :math:`\int_{-1}^1 T_m = 2/(1 - m^2)` for even :math:`m`, 0 for odd. The
    DCT-I matrix is symmetric up to the end factors :math:`\gamma`, so the weights are

    .. math::  w_k = \frac{\gamma_k}{N} \mathrm{DCT\text{-}I}(\mu)_k, \qquad
               \mu_m = \int_{-1}^1 T_m.
    """
    m = n - 1
    k = np.arange(n, dtype=np.float64)
    even = np.arange(n) % 2 == 0
    mu = np.zeros(n)
    mu[even] = 2.0 / (1.0 - k[even] ** 2)
    w = scipy.fft.dct(mu, type=1) / m
    w[[0, -1]] *= 0.5
    # the rule is symmetric; average with the mirror image to remove rounding asymmetry
    return 0.5 * (w + w[::-1])


def chebyshev_barycentric_weights(n: int) -> np.ndarray:
    r"""Barycentric weights :math:`\lambda_j = (-1)^j \delta_j` of the Chebyshev extrema
    (:math:`\delta_j = 1/2` at the two ends, 1 elsewhere)."""
    lam = (-1.0) ** np.arange(n)
    lam[[0, -1]] *= 0.5
    return lam


class ChebyshevExtremaGrid(Discretization):
    r"""Nodes :math:`t_j = -\cos(\pi j/(n-1))` mapped to :math:`[a, b]`, Clenshaw-Curtis weights.

    Shared by :class:`ClenshawCurtis` (a quadrature rule with barycentric interpolation) and
    :class:`~ctformer.discretizations.spectral.Chebyshev` (the spectral method on the same
    points). Refinement keeps the nodes: ``n -> (n - 1) * factor + 1``.
    """

    min_n = 2

    @property
    def h(self) -> float:
        """Mean node spacing :math:`(b - a)/(n - 1)`."""
        return self.length / (self.n - 1)

    def _nodes(self):
        a, b = self.domain
        x = 0.5 * (a + b) + 0.5 * (b - a) * chebyshev_extrema(self.n)
        x[[0, -1]] = a, b
        return x

    def _weights(self):
        return 0.5 * self.length * clenshaw_curtis_weights(self.n)

    def _refined_n(self, factor):
        return (self.n - 1) * factor + 1


@register
class ClenshawCurtis(ChebyshevExtremaGrid):
    r"""Clenshaw-Curtis rule on the ``n`` Chebyshev extrema (both ends included).

    :math:`x_j = \tfrac{a + b}{2} - \tfrac{b - a}{2} \cos(\pi j / (n - 1))`; the weights
    integrate the polynomial interpolant exactly (:func:`clenshaw_curtis_weights`), so the rule
    is exact for degree :math:`n - 1` and converges geometrically for analytic integrands.
    Interpolation is the barycentric formula with weights :math:`(-1)^j \delta_j`.
    Refinement keeps the nodes: ``n -> (n - 1) * factor + 1``.
    """

    name = "clenshaw-curtis"
    order = math.inf

    def interpolation_matrix(self, points):
        lam = chebyshev_barycentric_weights(self.n)
        return barycentric_matrix(self.nodes, lam, self._check_points(points))
