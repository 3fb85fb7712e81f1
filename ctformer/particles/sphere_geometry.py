r"""The unit sphere of the particles: tolerance, tangent projection, retraction.

* :func:`sphere_tolerance`: :math:`\sqrt{\varepsilon}` of the dtype, the largest
  :math:`\max_i |\|x_i\| - 1|` accepted as "on the unit sphere".
* :func:`tangent_projection`: :math:`P^\perp_x y = y - \langle x, y\rangle x`.
* :func:`retract`: :math:`x \mapsto x / \|x\|` along the last axis, checked (``_unit_rows``: the
  same unchecked, the projection of a solve; ``_row_norms``: :math:`\|x\|` row-wise).

Every norm here is scale-safe: with :math:`s = \max_j |x_j|` the largest absolute entry of a
row, :math:`\|x\| = s\,\|x / s\|`, the row divided by :math:`s` before it is squared, so
:math:`N(c x) = N(x)` to rounding for every representable :math:`c > 0` (no overflow at
:math:`10^{155}`, no underflow at :math:`10^{-160}`). NumPy states take one compiled pass per
row where Numba is installed (:mod:`ctformer._numerics.particles`).
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from ..backend import floating_info
from .._numerics import particles as _fused

__all__ = ["sphere_tolerance", "tangent_projection", "retract"]


def sphere_tolerance(dtype) -> float:
    r"""Largest :math:`\max_i |\|x_i\| - 1|` accepted as "on the unit sphere" in ``dtype``.

    :math:`\sqrt{\varepsilon}` of the dtype: 1.5e-8 in float64, 3.5e-4 in float32, so that
    data normalized in its own precision (a few :math:`\varepsilon` off) is accepted while
    data that was never normalized is not.
    """
    return math.sqrt(float(floating_info(dtype).eps))


def tangent_projection(x, y):
    r"""Project ``y`` on the tangent space of the sphere at ``x``.

    .. math::  P^\perp_x y = y - \langle x, y\rangle x.

    Parameters
    ----------
    x, y : array, shape (..., d)

    Returns
    -------
    array, shape (..., d)

    Notes
    -----
    NumPy float arrays of one shape and dtype are projected in one compiled pass per row
    (where Numba is installed), the inner product accumulated in float64.
    """
    projected = _fused.tangent_rows(x, y)  # NumPy states: one compiled pass
    if projected is not None:
        return projected
    xp = array_api_compat.array_namespace(x, y)
    return y - xp.sum(x * y, axis=-1, keepdims=True) * x


def _row_scale(xp, x):
    """The largest absolute entry of each row (keepdims): the scale divided out before squaring."""
    return xp.max(xp.abs(x), axis=-1, keepdims=True)


def _unit_rows(xp, x):
    """x / |x| row-wise, scale-safe, unchecked (a zero row gives NaN): the projection of a solve
    (one compiled pass for NumPy states with short rows)."""
    fused = _fused.unit_rows(x)
    if fused is not None:
        return fused
    y = x / _row_scale(xp, x)
    return y / xp.sqrt(xp.sum(y * y, axis=-1, keepdims=True))


def _row_norms(xp, x):
    """|x| row-wise (keepdims), without overflow or underflow in the squares."""
    scale = _row_scale(xp, x)
    safe = xp.where(scale > 0, scale, xp.ones_like(scale))
    y = x / safe
    return scale * xp.sqrt(xp.sum(y * y, axis=-1, keepdims=True))


def retract(x):
    r"""The retraction onto the unit sphere, :math:`x \mapsto x / \|x\|` along the last axis.

    Scale-safe: each row is divided by its largest absolute entry before squaring, so
    ``retract(c * x)`` equals ``retract(x)`` to rounding for every representable ``c > 0``.

    Raises
    ------
    ValueError
        If some vector is zero or not finite.
    """
    xp = array_api_compat.array_namespace(x)
    scale = _row_scale(xp, x)
    if not bool(xp.all(scale > 0)):
        raise ValueError("cannot project a zero vector onto the sphere")
    if not bool(xp.all(xp.isfinite(scale))):
        raise ValueError("cannot project a vector with NaN or infinite entries onto the sphere")
    return _unit_rows(xp, x)
