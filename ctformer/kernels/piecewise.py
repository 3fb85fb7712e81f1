r"""The piecewise-constant kernel: a discrete weight matrix embedded in the continuum.

A weight :math:`A \in \mathbb{R}^{d_{out} \times d_{in}}` is the kernel

.. math::  W_{\mathrm{ref}}(s, t) = d_{\mathrm{in}}\, A_{i(s)\, j(t)} ,

constant on the cells of the uniform partitions of :math:`[0, 1]` into :math:`d_{out}` and
:math:`d_{in}` cells (:func:`cell_index`). On ``Midpoint(d_out)`` x ``Midpoint(d_in)`` its
matrix is :math:`A` itself, bit for bit: a torch ``nn.Linear`` is this operator on the midpoint
grid.
"""
from __future__ import annotations

import array_api_compat
import numpy as np

from .. import validation
from .base import Kernel
from .parameters import _to_host, is_host, read_only


def cell_index(points, domain, cells: int) -> np.ndarray:
    r"""Index of the uniform cell of ``domain`` that contains each point.

    .. math::  i(y) = \min(\max(\lfloor d\,(y - a) / (b - a) \rfloor, 0), d - 1)

    Points on an interior cell boundary belong to the cell on their right; the right end
    :math:`b` belongs to the last cell.

    Parameters
    ----------
    points : array_like
        Points in ``domain``.
    domain : tuple of float
        The interval ``(a, b)``.
    cells : int
        Number ``d`` of uniform cells.

    Returns
    -------
    ndarray of int
        Cell indices in ``0 .. d - 1``, same shape as ``points``.
    """
    a, b = domain
    idx = np.floor((np.asarray(points, dtype=np.float64) - a) * (cells / (b - a)))
    return np.clip(idx, 0, cells - 1).astype(np.intp)


def _finite_sum(a) -> bool:
    """True when the sum of ``a`` is finite (then every entry is; NaN and inf propagate)."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, or an overflowing sum
        return bool(np.isfinite(np.sum(a)))


def _identity(index, cells: int) -> bool:
    """True when the cell indices are ``0, 1, ..., cells - 1``: one node per cell, in order."""
    return index.size == cells and bool(np.all(index == np.arange(cells)))


class PiecewiseConstant(Kernel):
    r"""The embedding of a discrete weight matrix :math:`A \in \mathbb{R}^{d_{out} \times d_{in}}`.

    .. math::  W_{\mathrm{ref}}(s, t) = d_{\mathrm{in}}\, A_{i(s)\, j(t)} ,

    where :math:`i(s)`, :math:`j(t)` are the cells of the uniform partitions of :math:`[0, 1]`
    into :math:`d_{out}` and :math:`d_{in}` cells (:func:`cell_index`). On
    ``Midpoint(d_out)`` x ``Midpoint(d_in)`` the discretized matrix is exactly :math:`A`, so a
    torch ``nn.Linear`` (weight ``A``, :math:`y = A x`) is this operator on the midpoint grid.
    On refined midpoint grids, piecewise-constant data are mapped to the same values.

    The kernel jumps at the interior cell boundaries :math:`t = j/d_{in}`, so a rule converges
    at its own ``order`` only where its cells are unions of kernel cells (``Midpoint(n)``
    with ``d_in`` dividing ``n``; P1/P2 with ``d_in`` dividing the number of elements): see
    :meth:`quadrature_order`. Elsewhere it is first order. That is the right order, not a
    defect: a node on a jump (trapezoid with ``d_in`` dividing ``n - 1``, the middle
    Chebyshev point) takes the cell on its right, with the full node weight :math:`h` where
    the integral gives :math:`h/2` to each side, an error :math:`\tfrac h2 |\text{jump}|`
    per jump; a jump inside a cell of a rule (Gauss, midpoint with misaligned cells) costs
    :math:`O(h)` the same way.

    Parameters
    ----------
    matrix : array_like, shape (d_out, d_in)
        The weight (NumPy, CuPy or a torch tensor; copied to the host in float64).
    copy : bool, optional
        ``False`` keeps a float64 NumPy ``matrix`` as a read-only view of its memory, in its
        own layout (what the bridges do: one copy of each weight); the caller then must not
        change it in place. Other inputs are copied either way. Default ``True``.

    Raises
    ------
    ValueError
        If ``matrix`` is not 2-D, is empty, or contains NaN or inf.

    Notes
    -----
    On ``Midpoint(d_out)`` x ``Midpoint(d_in)`` (the discrete limit) :meth:`matrix` is the
    weight itself, a view: no matrix is built, and the transposed matrix of a product is its
    transposed view.
    """

    def __init__(self, matrix, copy: bool = True):
        from ..discretizations.base import real_host_array

        if not validation.boolean(copy, "copy") and type(matrix) is np.ndarray and matrix.dtype == np.float64:
            a = matrix.view()
        else:
            try:
                a = np.array(real_host_array(_to_host(matrix), "matrix"))
            except TypeError as exc:
                raise TypeError(f"PiecewiseConstant: {exc} (got {type(matrix).__name__})") from None
        if a.ndim != 2 or a.size == 0:
            raise ValueError(f"PiecewiseConstant matrix must be a non-empty 2-D array (d_out, d_in), got shape {a.shape}")
        # a finite sum needs finite entries; only an overflowing sum takes the full check
        if not _finite_sum(a) and not np.all(np.isfinite(a)):
            raise ValueError("PiecewiseConstant matrix contains NaN or inf")
        a.setflags(write=False)
        self.weight = a

    def quadrature_order(self, inp) -> float:
        r"""Order in :math:`h` of :math:`\sum_k W(s, t_k) w_k u(t_k) \to \int W(s, t) u(t)\,dt`
        for smooth :math:`u` as grids like ``inp`` are refined.

        Parameters
        ----------
        inp : Discretization
            The input (column) discretization of an interval.

        Returns
        -------
        float
            ``inp.order`` when the kernel has no jump in :math:`t` (``d_in = 1``) or when
            every jump :math:`a + j (b - a)/d_{in}` lies on a cell boundary of ``inp`` and no
            quadrature point lies on a jump: ``Midpoint(n)`` with ``n % d_in == 0``, P1/P2
            with ``elements % d_in == 0``. Otherwise 1.0: a jump inside a cell of the rule or
            under a node costs :math:`O(h)` (class notes). Measured on
            :math:`e^t \cos(3t + 1)`, ``d_in = 4``: fitted slopes 2.00 (midpoint, n = 4..64),
            1.00 (trapezoid, n = 5..129), 0.94 (Gauss-Legendre), 1.01 (midpoint, n = 6..162).

        Raises
        ------
        TypeError
            If ``inp`` is not a discretization of an interval.
        """
        from ..discretizations.base import Discretization
        from ..discretizations.quadrature import Midpoint

        if not isinstance(inp, Discretization) or inp.dimension != 1 or inp.atoms:
            raise TypeError(f"inp must be a Discretization of an interval (no product, no atoms), "
                            f"got {inp!r}")
        d_in = self.shape[1]
        if d_in == 1:
            return float(inp.order)
        # only composite rules with nodes strictly inside their cells can align with the jumps
        if type(inp) is Midpoint:
            cells = inp.n
        elif inp.kind == "galerkin":
            cells = inp.elements
        else:
            return 1.0
        return float(inp.order) if cells % d_in == 0 else 1.0

    def parameters(self) -> dict:
        """``{"weight": A}``: the discrete weight, as many numbers as the ``nn.Linear`` has
        (a read-only view; ``model.with_parameters`` changes it)."""
        return {"weight": read_only(self.weight)}

    def _host(self) -> bool:
        return type(self.weight) is np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """``(d_out, d_in)``."""
        return self.weight.shape

    def __repr__(self) -> str:
        return f"PiecewiseConstant(shape={self.shape})"

    def evaluate(self, s, t):
        d_out, d_in = self.shape
        i = cell_index(s, (0.0, 1.0), d_out)
        j = cell_index(t, (0.0, 1.0), d_in)
        return d_in * self.weight[i, j]

    def _build_matrix(self, out, inp):
        d_out, d_in = self.shape
        i = cell_index(out.quadrature_nodes, out.domain, d_out)
        j = cell_index(inp.quadrature_nodes, inp.domain, d_in)
        # w_j / (cell width) is exactly 1 on Midpoint(d_in) and exactly 1/2 on Midpoint(2 d_in):
        # the discrete weight is reproduced bit for bit in the discrete limit.
        ratio = np.asarray(inp.quadrature_weights) / (inp.length / d_in)
        if is_host(self.weight):
            if _identity(i, d_out) and _identity(j, d_in) and np.all(ratio == 1.0):
                return self.weight  # the discrete limit: the weight itself, no copy
            return self.weight[i[:, None], j[None, :]] * ratio[None, :]
        xp = array_api_compat.array_namespace(self.weight)
        device = array_api_compat.device(self.weight)
        rows = xp.take(self.weight, xp.asarray(i, device=device), axis=0)
        return xp.take(rows, xp.asarray(j, device=device), axis=1) * xp.asarray(
            ratio[None, :], dtype=self.weight.dtype, device=device)
