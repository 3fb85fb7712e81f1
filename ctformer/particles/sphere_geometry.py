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
        Real arrays of one namespace (NumPy, CuPy, torch, ``array_api_strict``) whose last
        axes have the same length ``d`` (the other axes broadcast); lists and integer arrays
        become float64, floating arrays keep their dtype (two dtypes: the wider).

    Returns
    -------
    array, shape (..., d)

    Raises
    ------
    TypeError
        For complex, boolean or non-numeric ``x`` or ``y``, or arrays of two namespaces.
    ValueError
        For a 0-d array, last axes of different lengths, or NaN or inf entries.

    Notes
    -----
    NumPy float arrays of one shape and dtype are projected in one compiled pass per row
    (where Numba is installed), the inner product accumulated in float64.
    """
    x, y = _real_vectors(x, "x"), _real_vectors(y, "y")
    if array_api_compat.array_namespace(x) is not array_api_compat.array_namespace(y):
        raise TypeError(f"x and y must be arrays of one library, got {type(x).__name__} and "
                        f"{type(y).__name__}; convert one of them")
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"x and y must have the same last axis (the dimension d), got shapes "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    return _tangent_rows(x, y)


def _tangent_rows(x, y):
    """:func:`tangent_projection` unchecked: the velocity of a solve, at every stage."""
    projected = _fused.tangent_rows(x, y)  # NumPy states: one compiled pass
    if projected is not None:
        return projected
    xp = array_api_compat.array_namespace(x, y)
    return y - xp.sum(x * y, axis=-1, keepdims=True) * x


def _as_real_floating(x, what: str):
    """``x`` as a real floating array of its own namespace (lists and integers become float64)."""
    if not array_api_compat.is_array_api_obj(x):
        x = np.asarray(x)
    xp = array_api_compat.array_namespace(x)
    if xp.isdtype(x.dtype, "complex floating"):
        raise TypeError(f"{what} must be real; got a complex array (dtype {x.dtype}): the particles "
                        "live on the real sphere, pass the real part explicitly if that is meant")
    if xp.isdtype(x.dtype, "real floating"):
        return x
    if xp.isdtype(x.dtype, "integral"):
        return xp.astype(x, xp.float64)
    raise TypeError(f"{what} must be a real floating or integer array, got dtype {x.dtype}")


def _real_vectors(x, what: str):
    """``x`` as a finite real floating array with a last axis of coordinates (or refused)."""
    x = _as_real_floating(x, what)
    if x.ndim == 0:
        raise ValueError(f"{what} must have a last axis holding the coordinates, got a 0-d array; "
                         "pass shape (d,) or (..., d)")
    xp = array_api_compat.array_namespace(x)
    if not bool(xp.all(xp.isfinite(x))):
        raise ValueError(f"{what} contains NaN or infinite entries")
    return x


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

    Parameters
    ----------
    x : array, shape (..., d)
        Real vectors of any namespace; lists and integer arrays become float64, floating
        arrays keep their dtype.

    Raises
    ------
    TypeError
        For complex, boolean or non-numeric ``x`` (a complex row has no real norm to divide by).
    ValueError
        If some vector is zero or not finite, or ``x`` is 0-d.
    """
    x = _as_real_floating(x, "x")
    if x.ndim == 0:
        raise ValueError("x must have a last axis holding the coordinates, got a 0-d array; "
                         "pass shape (d,) or (..., d)")
    xp = array_api_compat.array_namespace(x)
    scale = _row_scale(xp, x)
    if not bool(xp.all(scale > 0)):
        raise ValueError("cannot project a zero vector onto the sphere")
    if not bool(xp.all(xp.isfinite(scale))):
        raise ValueError("cannot project a vector with NaN or infinite entries onto the sphere")
    return _unit_rows(xp, x)
