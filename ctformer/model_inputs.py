r"""Input handling of :class:`ctformer.model.ContinuousTransformer`: initial data and masks.

- :func:`sample_initial` turns :math:`u_0(x, y)` into discrete values on tokens x features;
- :func:`as_state_array` accepts NumPy/CuPy arrays (kept on their device) and anything
  NumPy can read (lists, torch CPU tensors);
- :func:`check_key_mask` validates a padding mask (1 = real token).
"""
from __future__ import annotations

from typing import Callable

import array_api_compat
import numpy as np

from .discretizations import Discretization

__all__ = ["sample_initial", "as_state_array", "check_key_mask"]


def sample_initial(u0: Callable, tokens: Discretization, features: Discretization) -> np.ndarray:
    r"""Discrete values of :math:`u_0(x, y)` on ``tokens`` x ``features``.

    Parameters
    ----------
    u0 : callable
        ``u0(x, y)`` for ``x`` of shape ``(Nq, 1)`` and ``y`` of shape ``(1, dq)`` (broadcasting).
    tokens, features : Discretization
        Discretizations of :math:`x` and :math:`y`.

    Returns
    -------
    ndarray, shape (tokens.n, features.n)
        Point values at the nodes for nodal rules; the :math:`L^2` projection (evaluation at
        the quadrature points, then ``from_quadrature`` on both axes) for Galerkin rules.

    Raises
    ------
    ValueError
        If the values do not broadcast to the grid or are not finite.
    """
    x = np.asarray(tokens.quadrature_nodes)[:, None]
    y = np.asarray(features.quadrature_nodes)[None, :]
    g = np.asarray(u0(x, y), dtype=np.float64)
    try:
        g = np.broadcast_to(g, (x.shape[0], y.shape[1])).copy()
    except ValueError:
        raise ValueError(
            f"u0(x, y) must broadcast to shape ({x.shape[0]}, {y.shape[1]}) for x of shape "
            f"{x.shape} and y of shape {y.shape}; got shape {g.shape}"
        ) from None
    if not np.all(np.isfinite(g)):
        raise ValueError("u0(x, y) returned NaN or inf")
    return tokens.from_quadrature(features.from_quadrature(g, axis=-1), axis=-2)


def as_state_array(x, name):
    """An array-API array from ``x`` (NumPy/CuPy kept, anything else through NumPy).

    Parameters
    ----------
    x : array_like
        NumPy or CuPy array, torch tensor, nested lists.
    name : str
        Argument name for error messages.

    Returns
    -------
    array
        A real floating array (integers are converted to float64).

    Raises
    ------
    TypeError
        If ``x`` is not numeric, or is boolean.
    """
    if array_api_compat.is_numpy_array(x) or array_api_compat.is_cupy_array(x):
        arr = x
    else:
        if hasattr(x, "detach"):  # torch tensors
            x = x.detach().cpu().numpy()
        try:
            arr = np.asarray(x)
        except Exception:
            raise TypeError(f"{name} must be an array, got {type(x).__name__}") from None
    if not np.issubdtype(arr.dtype, np.floating):
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
            raise TypeError(f"{name} must be a real floating array, got dtype {arr.dtype}")
        arr = arr.astype(np.float64)
    return arr


def check_key_mask(mask, u):
    """A boolean key mask of shape ``u.shape[:-1]`` (1 = keep) on ``u``'s device.

    Parameters
    ----------
    mask : array_like of bool or 0/1, shape (..., N)
        1 (True) for a real token, 0 for padding.
    u : array, shape (..., N, d)
        The state the mask belongs to.

    Returns
    -------
    bool array, shape (..., N)

    Raises
    ------
    ValueError
        For a wrong shape, values other than 0/1, or a sequence without real tokens.
    """
    xp = array_api_compat.array_namespace(u)
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    if not (array_api_compat.is_numpy_array(mask) or array_api_compat.is_cupy_array(mask)):
        mask = np.asarray(mask)
    if tuple(mask.shape) != tuple(u.shape[:-1]):
        raise ValueError(
            f"mask must have shape {tuple(u.shape[:-1])} (batch, tokens), got {tuple(mask.shape)}"
        )
    if mask.dtype != bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be boolean or hold only 0 and 1 (1 = real token)")
        mask = mask == 1
    if not bool(mask.any(axis=-1).all()):
        raise ValueError("mask has a sequence without any real token (a row of zeros)")
    return xp.asarray(mask)
