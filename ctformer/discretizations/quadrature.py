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

import numpy as np

from .base import Discretization, barycentric_matrix, linear_matrix, register

__all__ = ["Midpoint", "GaussLegendre"]


@register
class Midpoint(Discretization):
    r"""Composite midpoint rule on ``n`` cells: :math:`x_j = a + (j + 1/2) h`, :math:`w_j = h`.

    Interpolation is piecewise linear through the cell centres, extended linearly over the two
    half cells at the ends, so that it is second order like the quadrature. With ``n`` tokens
    on :math:`[0, 1]` it is the grid on which a real Transformer lives (DESIGN.md section 2).
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
class GaussLegendre(Discretization):
    r"""Gauss-Legendre rule with ``n`` points: exact for polynomials of degree :math:`2n - 1`.

    Interpolation is the barycentric formula with the weights
    :math:`\lambda_j = (-1)^j \sqrt{(1 - t_j^2) w_j}` of Legendre points.
    """

    name = "gauss-legendre"
    order = math.inf

    def _reference(self):
        t, w = np.polynomial.legendre.leggauss(self.n)
        return t, w

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
