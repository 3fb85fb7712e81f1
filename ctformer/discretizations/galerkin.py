r"""Continuous Galerkin finite elements: piecewise linear (P1) and piecewise quadratic (P2).

The interval :math:`[a, b]` is cut into ``E`` uniform elements of width :math:`H`. The
``n`` degrees of freedom are the coefficients :math:`c_j` of

.. math::  f_h(x) = \sum_{j=0}^{n-1} c_j \phi_j(x),

where :math:`\phi_j` is the Lagrange basis of degree ``p`` on the uniform nodes
:math:`x_j = a + j (b - a)/(n - 1)` (element ends, plus midpoints for P2), so
:math:`n = pE + 1` and :math:`c_j = f_h(x_j)`.

* ``integrate(c)`` :math:`= \sum_j c_j \int \phi_j = \int f_h` exactly.
* ``sample(f)`` = ``project(f)`` is the :math:`L^2` projection :math:`M c = b`,
  :math:`M_{ij} = \int \phi_i \phi_j` (sparse mass matrix),
  :math:`b_i = \int f \phi_i`, with :math:`b` computed by a ``q``-point Gauss rule on every
  element (``q = p + 2``, exact for :math:`M`).
* The quadrature-point view: ``quadrature_nodes`` are those per-element Gauss points,
  ``to_quadrature(c)`` :math:`= B c` with :math:`B_{kj} = \phi_j(\xi_k)`, and
  ``from_quadrature(g)`` :math:`= M^{-1} B^T W g`, the :math:`L^2` projection of the function
  whose values at the Gauss points are ``g``. Thus ``from_quadrature(to_quadrature(c)) = c``.

Expected :math:`L^2` (and, on uniform meshes, maximum-norm) order ``p + 1``. Because
constants lie in the space, :math:`\int P_h f = \int f` up to the element Gauss rule, so
``integrate(sample(f))`` converges with the Gauss order ``2q``, faster than ``p + 1``.
"""
from __future__ import annotations

from functools import cached_property
from typing import Callable, ClassVar

import array_api_compat
import numpy as np
import scipy.sparse
import scipy.sparse.linalg

from ..backend import constant
from .base import (
    Discretization,
    apply_along_first,
    apply_matrix,
    as_values,
    check_dense,
    check_node_gaps,
    real_host_array,
    is_native_array,
    register,
)
from .checks import is_half, through_float32

__all__ = ["P1", "P2", "element_bytes_per_value"]


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def element_bytes_per_value(degree: int, gauss_points: int) -> float:
    r"""Host bytes per degree of freedom of Lagrange elements, for large ``n = p E + 1``.

    With :math:`p` = ``degree`` and :math:`q` = ``gauss_points`` there are :math:`q/p`
    quadrature points per value. Float64 data and int32 sparse indices (12 bytes a non-zero,
    4 a row pointer) give

    .. math::

        \underbrace{16}_{\text{nodes, weights}}
        + \underbrace{16 q/p}_{\text{quadrature nodes, weights}}
        + \underbrace{12 q (p + 1)/p + 4 q/p}_{B}
        + \underbrace{12 q (p + 1)/p + 4}_{B^T W}
        + \underbrace{12 m + 4}_{M}
        + \underbrace{12 (m + 1) + 8}_{\text{LU factors of } M},
        \qquad m = \frac{(p + 1)^2 - 1}{p},

    with :math:`m` the non-zeros per row of the mass matrix (its banded LU factors have no
    fill-in: :math:`m + 1` non-zeros per row, the diagonal counted twice). P1: 320 bytes,
    P2: 324 bytes.
    """
    p, q = degree, gauss_points
    m = ((p + 1) ** 2 - 1) / p
    basis = 12 * q * (p + 1) / p
    return (16 + 16 * q / p + (basis + 4 * q / p) + (basis + 4) + (12 * m + 4)
            + (12 * (m + 1) + 8))


class _LagrangeElements(Discretization):
    """Continuous piecewise polynomials of degree ``degree`` on a uniform mesh."""

    kind = "galerkin"
    nodal = False  # stored values are element coefficients
    degree: ClassVar[int]
    gauss_points: ClassVar[int]

    def __init__(self, n: int, domain=(0.0, 1.0)):
        super().__init__(n, domain)
        if (self.n - 1) % self.degree:
            raise ValueError(
                f"{type(self).__name__} needs n = {self.degree} * elements + 1 degrees of freedom "
                f"(an odd n), got n = {self.n}"
            )

    def _check_resolution(self) -> None:
        self.quadrature_nodes

    # -- mesh ----------------------------------------------------------------------------
    @property
    def elements(self) -> int:
        """Number of elements ``(n - 1) / degree``."""
        return (self.n - 1) // self.degree

    @property
    def element_width(self) -> float:
        """Element width :math:`H = (b - a)/E`."""
        return self.length / self.elements

    @property
    def h(self) -> float:
        """Node spacing :math:`(b - a)/(n - 1)` (``H / degree``)."""
        return self.length / (self.n - 1)

    def _nodes(self):
        return np.linspace(*self.domain, self.n)

    def _refined_n(self, factor):
        return (self.n - 1) * factor + 1

    # -- basis ---------------------------------------------------------------------------
    def _local_basis(self, xi: np.ndarray) -> np.ndarray:
        r"""Lagrange basis on :math:`[0, 1]` with nodes :math:`k/p`, evaluated at ``xi``: ``(P, p+1)``."""
        p = self.degree
        local = np.arange(p + 1) / p
        out = np.ones((xi.size, p + 1))
        for k in range(p + 1):
            for m in range(p + 1):
                if m != k:
                    out[:, k] *= (xi - local[m]) / (local[k] - local[m])
        return out

    def basis_matrix(self, points) -> scipy.sparse.csr_matrix:
        r"""Sparse ``(P, n)`` matrix :math:`\phi_j(x_p)` (points in the closed domain)."""
        pts = self._check_points(points)
        s = (pts - self.domain[0]) / self.element_width
        element = np.clip(np.floor(s).astype(np.int64), 0, self.elements - 1)
        values = self._local_basis(s - element)
        cols = self.degree * element[:, None] + np.arange(self.degree + 1)[None, :]
        rows = np.broadcast_to(np.arange(pts.size)[:, None], cols.shape)
        return scipy.sparse.csr_matrix(
            (values.ravel(), (rows.ravel(), cols.ravel())), shape=(pts.size, self.n)
        )

    def interpolation_matrix(self, points) -> np.ndarray:
        """Dense ``(P, n)`` matrix evaluating the FE function at ``points``."""
        pts = self._check_points(points)
        check_dense(pts.size, self.n, "the finite-element interpolation matrix")
        return self.basis_matrix(pts).toarray()

    def interpolate(self, values, points, axis: int = -1):
        """Evaluate :math:`f_h = \\sum_j c_j \\phi_j` at ``points`` (sparse for NumPy/CuPy)."""
        values, xp, axis = as_values(values, self.n, axis)
        if not is_native_array(values):
            return super().interpolate(values, points, axis)
        if is_half(values):  # sparse matrices have no float16
            return through_float32(lambda v: self.interpolate(v, points, axis), values)
        basis = constant(None, None, lambda: self.basis_matrix(points), values)
        return apply_along_first(values, axis, lambda v: basis @ v)

    # -- quadrature-point view -----------------------------------------------------------
    @cached_property
    def _gauss(self):
        return np.polynomial.legendre.leggauss(self.gauss_points)

    @cached_property
    def quadrature_nodes(self) -> np.ndarray:
        """The ``gauss_points`` Gauss points of every element, element by element: ``(E q,)``."""
        t, _ = self._gauss
        left = self.domain[0] + self.element_width * np.arange(self.elements)
        points = (left[:, None] + 0.5 * self.element_width * (t + 1.0)[None, :]).ravel()
        return _readonly(check_node_gaps(points, self, "quadrature points"))

    @cached_property
    def quadrature_weights(self) -> np.ndarray:
        """Gauss weights belonging to :attr:`quadrature_nodes`."""
        _, w = self._gauss
        return _readonly(np.tile(0.5 * self.element_width * w, self.elements))

    @cached_property
    def quadrature_basis(self) -> scipy.sparse.csr_matrix:
        r"""Sparse :math:`B_{kj} = \phi_j(\xi_k)` at :attr:`quadrature_nodes`: ``(E q, n)``."""
        return self.basis_matrix(self.quadrature_nodes)

    @cached_property
    def _projection_rhs(self) -> scipy.sparse.csr_matrix:
        """Sparse :math:`B^T W`: ``(n, E q)``."""
        return (self.quadrature_basis.T @ scipy.sparse.diags(self.quadrature_weights)).tocsr()

    @cached_property
    def mass(self) -> scipy.sparse.csr_matrix:
        r"""Sparse mass matrix :math:`M_{ij} = \int \phi_i \phi_j = (B^T W B)_{ij}` (exact)."""
        return (self._projection_rhs @ self.quadrature_basis).tocsr()

    def mass_on(self, backend):
        """The mass matrix on ``backend`` (``scipy.sparse`` or ``cupyx.scipy.sparse``), cached."""
        return backend.cached(self, "mass", lambda: self.mass)

    def _weights(self):
        # integrals of the basis functions: B^T W 1
        return np.asarray(self._projection_rhs.sum(axis=1)).ravel()

    @cached_property
    def _mass_lu(self):
        return scipy.sparse.linalg.splu(self.mass.tocsc())

    @cached_property
    def projection_matrix(self) -> np.ndarray:
        """Dense :math:`M^{-1} B^T W` (``(n, E q)``), used for non-NumPy/CuPy namespaces."""
        check_dense(self.n, self.quadrature_nodes.size, "the dense L2 projection matrix",
                    "use NumPy or CuPy arrays (sparse solves) or a smaller n")
        return _readonly(self._mass_lu.solve(self._projection_rhs.toarray()))

    def _solver(self, values):
        if array_api_compat.is_cupy_array(values):
            lu = self.__dict__.get("_cupy_lu")
            if lu is None:
                from cupyx.scipy.sparse.linalg import SuperLU

                lu = self.__dict__["_cupy_lu"] = SuperLU(self._mass_lu)
            return lu.solve
        return self._mass_lu.solve

    def to_quadrature(self, values, axis: int = -1):
        r"""Values of :math:`f_h` at :attr:`quadrature_nodes`: :math:`B c` along ``axis``."""
        values, xp, axis = as_values(values, self.n, axis)
        if is_half(values) and is_native_array(values):  # sparse matrices have no float16
            return through_float32(lambda v: self.to_quadrature(v, axis), values)
        basis = constant(self, "quadrature_basis", lambda: self.quadrature_basis, values)
        if not is_native_array(values):
            return apply_matrix(basis, values, axis)
        return apply_along_first(values, axis, lambda v: basis @ v)

    def from_quadrature(self, values, axis: int = -1):
        r""":math:`L^2` projection :math:`M^{-1} B^T W g` of values ``g`` at the quadrature nodes."""
        values, xp, axis = as_values(values, self.quadrature_nodes.size, axis)
        if not is_native_array(values):
            mat = constant(self, "projection_matrix", lambda: self.projection_matrix, values)
            return apply_matrix(mat, values, axis)
        if is_half(values):  # sparse matrices and their solves have no float16
            return through_float32(lambda g: self.from_quadrature(g, axis), values)
        rhs = constant(self, "projection_rhs", lambda: self._projection_rhs, values)
        solve = self._solver(values)
        out = apply_along_first(values, axis, lambda g: solve(rhs @ g))
        return out.astype(values.dtype, copy=False)

    def project(self, f: Callable) -> np.ndarray:
        r""":math:`L^2` projection of the vectorized function ``f`` (host array of ``n`` coefficients).

        Raises
        ------
        ValueError
            If ``f`` returns NaN/inf or an array of the wrong shape at the quadrature nodes.
        """
        x = self.quadrature_nodes
        g = real_host_array(f(x), "the values of f")
        if g.ndim == 0:
            g = np.full(x.shape, float(g))
        if g.shape != x.shape:
            raise ValueError(f"f must map an array of shape {x.shape} to the same shape, got {g.shape}")
        return self.from_quadrature(g)

    def sample(self, f: Callable) -> np.ndarray:
        """For Galerkin elements sampling is the :math:`L^2` projection :meth:`project`."""
        return self.project(f)


@register
class P1(_LagrangeElements):
    r"""Continuous piecewise-linear elements (hat functions) with ``n >= 2`` nodes.

    ``n - 1`` uniform elements; 3 Gauss points per element. Element mass matrix
    :math:`\frac{H}{6}\begin{pmatrix} 2 & 1 \\ 1 & 2 \end{pmatrix}`. Order 2 in :math:`L^2`.
    """

    name = "p1"
    order = 2.0
    min_n = 2
    degree = 1
    gauss_points = 3
    _bytes_per_value = element_bytes_per_value(1, 3)


@register
class P2(_LagrangeElements):
    r"""Continuous piecewise-quadratic elements with an odd number ``n >= 3`` of nodes.

    ``(n - 1)/2`` uniform elements with nodes at element ends and midpoints; 4 Gauss points
    per element. Element mass matrix (ends, midpoint, end)
    :math:`\frac{H}{30}\begin{pmatrix} 4 & 2 & -1 \\ 2 & 16 & 2 \\ -1 & 2 & 4 \end{pmatrix}`.
    Order 3 in :math:`L^2`.
    """

    name = "p2"
    order = 3.0
    min_n = 3
    degree = 2
    gauss_points = 4
    _bytes_per_value = element_bytes_per_value(2, 4)
