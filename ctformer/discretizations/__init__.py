"""Discretizations of an interval: quadrature rules, spectral methods, Galerkin elements.

>>> import ctformer.discretizations as d
>>> d.available()
['midpoint', 'trapezoid', 'gauss-legendre', 'clenshaw-curtis', 'fourier', 'chebyshev', 'legendre', 'p1', 'p2']
"""
from .base import Discretization, available, get, as_discretization
from .quadrature import Midpoint, GaussLegendre

__all__ = ["Discretization", "available", "get", "as_discretization", "Midpoint", "GaussLegendre"]
