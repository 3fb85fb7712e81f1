r"""Linear maps on discretized values: applied along an axis, and the interpolation matrices.

:func:`apply_matrix` contracts a dense ``(m, n)`` matrix with the length-``n`` axis of an
array; :func:`apply_along_first` applies any linear map (a sparse product, a factorized solve)
along an axis. :func:`barycentric_matrix` is the ``(P, n)`` matrix of the barycentric formula
(second kind) at points :math:`t_i`, with nodes :math:`x_j` and barycentric weights
:math:`\lambda_j`,

.. math::  L_{ij} = \frac{\lambda_j / (t_i - x_j)}{\sum_k \lambda_k / (t_i - x_k)},

and :func:`linear_matrix` that of piecewise-linear interpolation through the nodes.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from .memory import check_dense

__all__ = ["apply_matrix", "apply_along_first", "barycentric_matrix", "linear_matrix"]


def apply_matrix(mat, values, axis: int):
    """Contract a dense ``(m, n)`` matrix with the length-``n`` axis ``axis`` of ``values``.

    The axis keeps its position and gets length ``m``; all other axes are batch axes.
    """
    xp = array_api_compat.array_namespace(values)
    out = xp.moveaxis(values, axis, -1) @ xp.matrix_transpose(mat)
    return xp.moveaxis(out, -1, axis)


def apply_along_first(values, axis: int, linear_map):
    """Apply ``linear_map`` (acting on 2-D arrays ``(n, k)``, e.g. a sparse product or a
    factorized solve) along ``axis`` of ``values``, treating all other axes as columns."""
    xp = array_api_compat.array_namespace(values)
    v = xp.moveaxis(values, axis, 0)
    batch = tuple(v.shape[1:])
    cols = math.prod(batch)
    out = linear_map(xp.reshape(v, (v.shape[0], cols)))
    out = xp.reshape(xp.asarray(out), (out.shape[0],) + batch)
    return xp.moveaxis(out, 0, axis)


def barycentric_matrix(nodes: np.ndarray, bary: np.ndarray, points: np.ndarray) -> np.ndarray:
    r"""Matrix of the barycentric interpolation formula (second kind).

    .. math::  p(x) = \frac{\sum_j \frac{\lambda_j}{x - x_j} v_j}{\sum_j \frac{\lambda_j}{x - x_j}}

    Rows for points that coincide with a node are the unit vectors of that node; so are the
    rows of points so close to a node that :math:`\lambda_j / (x - x_j)` overflows (a
    subnormal distance from a node at 0): there :math:`p(x) = v_j` to rounding, where the
    formula itself would give :math:`\infty / \infty` = NaN.
    """
    check_dense(points.size, nodes.size, "the barycentric interpolation matrix")
    diff = points[:, None] - nodes[None, :]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c = bary[None, :] / diff
        total = c.sum(axis=1, keepdims=True)
        mat = c / total
    hit = ~(np.isfinite(c).all(axis=1) & np.isfinite(total[:, 0]))
    if hit.any():
        nearest = np.argmin(np.abs(diff[hit]), axis=1)
        mat[hit] = 0.0
        mat[np.flatnonzero(hit), nearest] = 1.0
    return mat


def linear_matrix(nodes: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Matrix of piecewise-linear interpolation through ``nodes`` (linear extrapolation at ends)."""
    n = nodes.size
    check_dense(points.size, n, "the linear interpolation matrix")
    mat = np.zeros((points.size, n))
    if n == 1:
        mat[:, 0] = 1.0
        return mat
    i = np.clip(np.searchsorted(nodes, points, side="right") - 1, 0, n - 2)
    t = (points - nodes[i]) / (nodes[i + 1] - nodes[i])
    rows = np.arange(points.size)
    mat[rows, i] = 1.0 - t
    mat[rows, i + 1] = t
    return mat
