r"""Absolute position encodings: part of the initial state :math:`u_0`, not of attention.

Learned and sinusoidal encodings are added to the embeddings. As functions of the real
position :math:`p(x)` (:meth:`ctformer.Grids.positions`) they can be evaluated on any token
discretization: :func:`sinusoidal_encoding` (an entire function of :math:`p`) and
:func:`interpolate_table` (a learned table between its integer rows, piecewise linear).
"""
from __future__ import annotations

import numpy as np

from .. import validation
from ..kernels import _to_host

__all__ = ["sinusoidal_encoding", "interpolate_table"]


def sinusoidal_encoding(positions, features: int, base: float = 10000.0) -> np.ndarray:
    r"""Sinusoidal position encodings at real positions (Vaswani et al. 2017).

    .. math::  e(p)_{2i} = \sin(p\, \Theta^{-2i/d}), \qquad e(p)_{2i+1} = \cos(p\, \Theta^{-2i/d}),

    an entire function of :math:`p`, so it can be evaluated at the positions of any token
    discretization (e.g. ``grids.positions()``) and added to :math:`u_0`.

    Parameters
    ----------
    positions : array_like of float
        Positions :math:`p`, any shape.
    features : int
        :math:`d`, the number of encoding features (even or odd).
    base : float
        :math:`\Theta`, default 10000.

    Returns
    -------
    ndarray of shape ``(*positions.shape, features)``
    """
    features = validation.integer(features, "features")
    base = validation.real(base, "base", positive=True)
    p = np.asarray(positions, dtype=np.float64)
    if not np.all(np.isfinite(p)):
        raise ValueError("positions must be finite")
    i = np.arange(features) // 2
    angles = p[..., None] * np.power(base, -2.0 * i / features)
    return np.where(np.arange(features) % 2 == 0, np.sin(angles), np.cos(angles))


def interpolate_table(table, positions) -> np.ndarray:
    r"""A learned position table evaluated between its rows, by piecewise-linear interpolation.

    Row :math:`j` of the table is the encoding at the integer position :math:`j`. At a real
    :math:`p \in [-1/2, P - 1/2]` (:math:`P` rows: the positions :math:`p(x)` of
    :math:`X = [0, 1]` with :math:`L = P`) the value is the linear interpolant of the two
    neighbouring rows, extended linearly over the half cells beyond the first and last rows.

    The interpolant is continuous with kinks at the integers, so it is second-order accurate
    for a smooth underlying function, and any token refinement that uses it converges at
    order at most 2 (the kinks limit Gauss-Legendre as well as the midpoint rule).

    Parameters
    ----------
    table : array_like of shape (P, d)
        The learned rows (e.g. GPT-2 ``wpe.weight``), ``P >= 2``.
    positions : array_like of float
        Positions, any shape, within :math:`[-1/2, P - 1/2]`.

    Returns
    -------
    ndarray of shape ``(*positions.shape, d)``

    Raises
    ------
    ValueError
        If the table has fewer than two rows or non-finite values, or a position lies outside
        :math:`[-1/2, P - 1/2]`.
    """
    table = np.asarray(_to_host(table), dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 2 or not np.all(np.isfinite(table)):
        raise ValueError(f"table must be a finite (P, d) array with P >= 2 rows, got shape {table.shape}")
    p = np.asarray(positions, dtype=np.float64)
    rows = table.shape[0]
    if not np.all(np.isfinite(p)) or p.size and (p.min() < -0.5 or p.max() > rows - 0.5):
        raise ValueError(f"positions must lie in [-1/2, {rows - 0.5}] for a table of {rows} rows")
    left = np.clip(np.floor(p), 0, rows - 2).astype(np.intp)
    t = (p - left)[..., None]
    return (1.0 - t) * table[left] + t * table[left + 1]
