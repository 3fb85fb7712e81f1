"""Discretizations of an interval: quadrature rules, spectral methods, Galerkin elements.

>>> import ctformer.discretizations as d
>>> d.available()
['midpoint', 'trapezoid', 'gauss-legendre', 'clenshaw-curtis', 'fourier', 'chebyshev', 'legendre', 'p1', 'p2']
"""
from .base import Discretization, SizeTooLargeError, available, get, as_discretization, memory_budget
from .quadrature import Midpoint, Trapezoid, GaussLegendre, ClenshawCurtis
from .spectral import Fourier, Chebyshev, Legendre
from .galerkin import P1, P2
from .product import Product
from .atoms import WithAtoms
from .report import error_table, format_error_table

__all__ = [
    "Discretization",
    "available",
    "get",
    "as_discretization",
    "SizeTooLargeError",
    "memory_budget",
    "Midpoint",
    "Trapezoid",
    "GaussLegendre",
    "ClenshawCurtis",
    "Fourier",
    "Chebyshev",
    "Legendre",
    "P1",
    "P2",
    "Product",
    "WithAtoms",
    "error_table",
    "format_error_table",
]
