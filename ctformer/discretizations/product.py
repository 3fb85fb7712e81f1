r"""Tensor-product discretizations of a rectangle: tokens on :math:`[0, 1]^2`.

An image cut into patches is a function on the square. :class:`Product` discretizes
:math:`X = [a_1, b_1] \times [a_2, b_2]` by the tensor product of two interval
discretizations ``first`` (:math:`x_1`) and ``second`` (:math:`x_2`):

.. math::

    \int_X f \approx \sum_{i, j} w^{(1)}_i w^{(2)}_j f(x^{(1)}_i, x^{(2)}_j), \qquad
    f(x) \approx \sum_{i, j} \ell^{(1)}_i(x_1)\, \ell^{(2)}_j(x_2)\, v_{ij}.

The token axis of a state stays one axis of length :math:`n = n_1 n_2`, in raster order
(first factor slow, as a vision transformer orders its patches), so attention and every
operator work unchanged. Nodes have shape ``(n, 2)``; weights are the outer product.

Galerkin factors give tensor-product elements (P1 x P1 = Q1, P2 x P2 = Q2) whose mass,
evaluation and projection matrices are Kronecker products of the factors'; a nodal factor
with a Galerkin one is the semi-discretization that stores point values in one variable and
element coefficients in the other (the same Kronecker formulas with the identity on the
nodal side). The expected order is the smaller of the two factors' orders; refinement
refines both factors.
"""
from __future__ import annotations

from functools import cached_property
from typing import Callable

import numpy as np

from ..backend import constant
from .base import (Discretization, as_values, check_allocation, check_dense, get, host_points,
                   real_host_array)

__all__ = ["Product"]


def _check_factor(disc, argname):
    if not isinstance(disc, Discretization) or disc.dimension != 1:
        raise TypeError(f"Product: {argname} must be a discretization of an interval, got "
                        f"{type(disc).__name__}{' (a product)' if isinstance(disc, Product) else ''}")
    if disc.atoms:
        raise TypeError(f"Product: {argname} has atoms; put the atoms on the product instead "
                        "(WithAtoms(Product(...)))")
    return disc


def _points(disc) -> int:
    """Number of quadrature points of an interval discretization, without building them."""
    return disc.n if disc.nodal else disc.elements * disc.gauss_points


def at_size(disc, n: int):
    """The discretization of the same family as ``disc`` with size ``n`` (per axis for products)."""
    if hasattr(disc, "at"):
        return disc.at(n)
    return get(disc.name, n, domain=disc.domain)


class Product(Discretization):
    r"""The tensor product ``first`` x ``second`` of two interval discretizations.

    Parameters
    ----------
    first, second : Discretization
        Discretizations of :math:`x_1` (slow index) and :math:`x_2` (fast index).

    Raises
    ------
    TypeError
        If a factor is not an interval discretization (products do not nest).

    Notes
    -----
    Two products are equal when their factors are equal (type, ``n`` and domain of each),
    so a cache keyed on a product never mixes, say, a Gauss-Legendre factor with a midpoint
    one of the same size.
    """

    name = "product"
    dimension = 2

    _ordered_nodes = False  # rows (x1, x2); each factor checks its own nodes

    def __init__(self, first, second):
        self.first = _check_factor(first, "first")
        self.second = _check_factor(second, "second")
        self.n = first.n * second.n
        self.domain = (first.domain, second.domain)
        # nodes (n, 2) and weights (24 bytes a row), at the stored values and, for a Galerkin
        # factor, again at the quadrature points (nodal products share one set)
        points = 0 if self.nodal else _points(self.first) * _points(self.second)
        check_allocation(24.0 * float(self.n + points), f"{self!r} ({self.n} values)",
                         "choose smaller factors (arguments first and second)")

    # -- value-object identity ------------------------------------------------------------
    def __getstate__(self):
        return {"first": self.first, "second": self.second}

    def __setstate__(self, state):
        self.__init__(state["first"], state["second"])
        self.__dict__["_frozen"] = True   # as after construction

    def __eq__(self, other) -> bool:
        return type(other) is Product and self.first == other.first and self.second == other.second

    def __hash__(self) -> int:
        return hash(("product", self.first, self.second))

    def __repr__(self) -> str:
        return f"Product({self.first!r}, {self.second!r})"

    @property
    def label(self) -> str:
        """A short name for tables and plots, e.g. ``"midpoint x midpoint"``."""
        return f"{self.first.name} x {self.second.name}"

    # -- geometry -------------------------------------------------------------------------
    @property
    def order(self) -> float:  # type: ignore[override]
        """The smaller of the factors' orders."""
        return min(self.first.order, self.second.order)

    @property
    def kind(self) -> str:  # type: ignore[override]
        """``"galerkin"`` when a factor stores element coefficients, else the first's kind."""
        kinds = (self.first.kind, self.second.kind)
        return "galerkin" if "galerkin" in kinds else kinds[0]

    @property
    def nodal(self) -> bool:  # type: ignore[override]
        """True when both factors store point values (False as soon as one is Galerkin)."""
        return self.first.nodal and self.second.nodal

    @property
    def length(self) -> float:
        """The measure (area) of the rectangle."""
        return self.first.length * self.second.length

    @property
    def h(self) -> float:
        """The larger of the factors' mesh widths."""
        return max(self.first.h, self.second.h)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n1, n2)``: the token axis read as a raster."""
        return (self.first.n, self.second.n)

    @staticmethod
    def _grid(x1, x2) -> np.ndarray:
        g1, g2 = np.meshgrid(np.asarray(x1, dtype=np.float64), np.asarray(x2, dtype=np.float64),
                             indexing="ij")
        return np.stack([g1.ravel(), g2.ravel()], axis=-1)

    def _nodes(self):
        return self._grid(self.first.nodes, self.second.nodes)

    def _weights(self):
        return np.outer(self.first.weights, self.second.weights).ravel()

    @cached_property
    def quadrature_nodes(self) -> np.ndarray:
        """Product of the factors' quadrature points, raster order: ``(q1 q2, 2)`` (the
        :attr:`nodes` themselves when both factors are nodal)."""
        if self.nodal:
            return self.nodes
        nodes = self._grid(self.first.quadrature_nodes, self.second.quadrature_nodes)
        nodes.setflags(write=False)
        return nodes

    @cached_property
    def quadrature_weights(self) -> np.ndarray:
        """Outer product of the factors' quadrature weights (:attr:`weights` when nodal)."""
        if self.nodal:
            return self.weights
        w = np.outer(self.first.quadrature_weights, self.second.quadrature_weights).ravel()
        w.setflags(write=False)
        return w

    # -- factor-wise linear maps ----------------------------------------------------------
    def _factorwise(self, values, axis, n1, n2, first_map, second_map):
        """Apply ``first_map`` along x1 and ``second_map`` along x2 of the raster axis."""
        # checked here as every other method checks its values: a list, a scalar, an axis out
        # of range or a raster of another length would otherwise fail inside the reshape
        values, xp, axis = as_values(values, n1 * n2, axis)
        v = xp.moveaxis(values, axis, -1)
        v = xp.reshape(v, (*v.shape[:-1], n1, n2))
        v = second_map(first_map(v, -2), -1)
        v = xp.reshape(v, (*v.shape[:-2], v.shape[-2] * v.shape[-1]))
        return xp.moveaxis(v, -1, axis)

    def to_quadrature(self, values, axis: int = -1):
        """Values at :attr:`quadrature_nodes` (the identity for nodal factors, checked as
        :meth:`Discretization.to_quadrature`)."""
        if self.nodal:
            return self._points_identity(values, axis)
        return self._factorwise(values, axis, self.first.n, self.second.n,
                                lambda v, a: self.first.to_quadrature(v, axis=a),
                                lambda v, a: self.second.to_quadrature(v, axis=a))

    def from_quadrature(self, values, axis: int = -1):
        """The :math:`L^2` projection :math:`\\Pi_1 \\otimes \\Pi_2` back to stored values
        (the identity for nodal factors, checked as :meth:`Discretization.from_quadrature`)."""
        if self.nodal:
            return self._points_identity(values, axis)
        q1, q2 = len(self.first.quadrature_nodes), len(self.second.quadrature_nodes)
        return self._factorwise(values, axis, q1, q2,
                                lambda v, a: self.first.from_quadrature(v, axis=a),
                                lambda v, a: self.second.from_quadrature(v, axis=a))

    # -- the contract ---------------------------------------------------------------------
    def _check_points(self, points) -> np.ndarray:
        pts = host_points(points)
        if pts.ndim != 2 or pts.shape[1] != 2:
            raise ValueError(f"points on a product domain must have shape (m, 2) (one row (x1, x2) "
                             f"per point), got shape {pts.shape}")
        return pts

    def interpolation_matrix(self, points) -> np.ndarray:
        """Dense ``(m, n)`` matrix: rows :math:`\\ell^{(1)}(p_1) \\otimes \\ell^{(2)}(p_2)`."""
        pts = self._check_points(points)
        check_dense(pts.shape[0], self.n, "the product interpolation matrix")
        l1 = self.first.interpolation_matrix(pts[:, 0])
        l2 = self.second.interpolation_matrix(pts[:, 1])
        return (l1[:, :, None] * l2[:, None, :]).reshape(pts.shape[0], self.n)

    def interpolate(self, values, points, axis: int = -1):
        """Evaluate the tensor-product reconstruction at ``points`` of shape ``(m, 2)``.

        Computed factor by factor, :math:`\\sum_i \\ell^{(1)}_i(p_1) \\sum_j \\ell^{(2)}_j(p_2)
        v_{ij}`, without forming the ``(m, n)`` matrix.
        """
        values, xp, axis = as_values(values, self.n, axis, allow_complex=True)  # as before: the factors decide
        pts = self._check_points(points)
        l1 = constant(None, None, lambda: self.first.interpolation_matrix(pts[:, 0]), values)
        l2 = constant(None, None, lambda: self.second.interpolation_matrix(pts[:, 1]), values)
        v = xp.moveaxis(values, axis, -1)
        v = xp.reshape(v, (*v.shape[:-1], self.first.n, self.second.n))
        inner = v @ xp.matrix_transpose(l2)                      # (..., n1, m)
        out = xp.sum(inner * xp.matrix_transpose(l1), axis=-2)   # (..., m)
        return xp.moveaxis(out, -1, axis)

    def sample(self, f: Callable) -> np.ndarray:
        """Stored values of :math:`f(x_1, x_2)` (vectorized over arrays of equal shape)."""
        x = self.quadrature_nodes
        g = real_host_array(f(x[:, 0], x[:, 1]), "the values of f")
        g = np.broadcast_to(g, (x.shape[0],)).copy() if g.ndim == 0 else g
        if g.shape != (x.shape[0],):
            raise ValueError(f"f(x1, x2) must return one value per point, got shape {g.shape}")
        if not np.all(np.isfinite(g)):
            raise ValueError("f returned NaN or inf at the nodes")
        return self.from_quadrature(g)

    def refine(self, factor: int = 2) -> "Product":
        """Both factors refined by ``factor``."""
        return Product(self.first.refine(factor), self.second.refine(factor))

    def at(self, n: int) -> "Product":
        """The same product with ``n`` values per factor (studies refine products this way)."""
        return Product(at_size(self.first, n), at_size(self.second, n))
