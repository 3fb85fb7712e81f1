r"""Error norms for step-size control: the grids' weighted RMS and the plain RMS.

An error-controlled step compares an error estimate :math:`e` of the step
:math:`u \to u'` with the tolerances through the scaled norm

.. math::

    \|e\| = \left( \frac{\sum_{b,i,j} w_{ij}
        \left( \dfrac{e_{bij}}{\mathrm{atol} + \mathrm{rtol}\,\max(|u_{bij}|, |u'_{bij}|)}
        \right)^2}{\sum_{b,i,j} w_{ij}} \right)^{1/2},
    \qquad w_{ij} = w^x_i\, w^y_j,

with :math:`i` the token index, :math:`j` the feature index, :math:`b` any leading batch
indices (each batch entry weighs the same) and :math:`w^x, w^y` the quadrature weights of the
token and feature discretizations. It is a discrete :math:`L^2(X \times Y)` norm divided by
the measure of the domain, so a tolerance means the same thing at every token and feature
resolution. The plain RMS (:func:`rms`, all :math:`w_{ij} = 1`) is the norm of
``scipy.integrate.solve_ivp``, diffrax and torchdiffeq; on clustered nodes (Gauss,
Chebyshev) it over-weights the ends of the interval and its value drifts with the
resolution. For particles :math:`x_1, \dots, x_n` the token weights are :math:`1/n`
(uniform: the two norms agree).

A step is accepted when :math:`\|e\| \le 1` (Hairer, Norsett, Wanner, *Solving Ordinary
Differential Equations I*, section II.4, equation (4.11)).
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

__all__ = ["weighted_rms", "rms", "grid_weights"]


def _axis_weights(w, length: int, name: str, lead: tuple = ()):
    """Host weights of one axis, of shape ``(length,)`` or, for tokens, ``lead + (length,)``
    (one weight per token of each sequence: a padding mask's zeros)."""
    if w is None:
        return None
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (length,) and not (lead and w.shape == tuple(lead) + (length,)):
        per_sequence = f" or {tuple(lead) + (length,)}" if lead else ""
        raise ValueError(f"weights: the {name} weights must have shape ({length},){per_sequence} "
                         f"to match the error's {name} axis, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"weights: the {name} weights must be finite, non-negative and not all "
                         f"zero, got {w!r}")
    return w


def weighted_rms(e, u, u_new, rtol: float, atol: float, weights=None) -> float:
    r"""The scaled, quadrature-weighted RMS of an error estimate (the module's formula).

    .. math::

        \|e\| = \Bigl( \sum_{b,i,j} w^x_i w^y_j\, s_{bij}^2 \Big/
        \sum_{b,i,j} w^x_i w^y_j \Bigr)^{1/2}, \qquad
        s = \frac{e}{\mathrm{atol} + \mathrm{rtol}\,\max(|u|, |u'|)}.

    Parameters
    ----------
    e, u, u_new : array, shape (..., n_x, n_y)
        The error estimate, the state before the step and the state after it, in one array
        namespace (NumPy, torch, CuPy, ...: through ``array_api_compat``), equal shapes.
    rtol, atol : float
        Relative and absolute tolerance (checked by the controller, not here).
    weights : tuple (w_x, w_y), optional
        Token weights of shape ``(n_x,)`` and feature weights of shape ``(n_y,)``, host
        arrays, non-negative; either may be ``None`` (uniform on that axis). ``None``: all
        weights 1, which is :func:`rms`. Build them from grids with :func:`grid_weights`.
        The token weights may also have the shape ``e.shape[:-1]``, one weight per token of
        each sequence (:math:`w^x_{bi}` in the formula: zero for padded tokens).

    Returns
    -------
    float
        The norm; ``inf`` or ``nan`` when ``e`` is not finite or a scale is zero where ``e``
        is not (the controller then rejects the step with the smallest step ratio). An entry
        with ``e = 0`` counts 0, also where its scale is zero (``atol = 0`` at a zero entry).
        An empty ``e`` (no entries, e.g. an empty batch) has norm 0.

    Raises
    ------
    ValueError
        If the shapes differ or the weights do not match the last two axes.
    """
    if array_api_compat.is_torch_array(e):  # a step size is not part of the graph
        e, u, u_new = e.detach(), u.detach(), u_new.detach()
    xp = array_api_compat.array_namespace(e, u, u_new)
    if not (tuple(e.shape) == tuple(u.shape) == tuple(u_new.shape)):
        raise ValueError(f"e, u and u_new must have equal shapes, got {tuple(e.shape)}, "
                         f"{tuple(u.shape)} and {tuple(u_new.shape)}")
    w_x, w_y = (None, None) if weights is None else weights
    if (w_x is not None or w_y is not None) and e.ndim < 2:
        raise ValueError(f"weights need an error with a token and a feature axis (..., n_x, n_y), "
                         f"got shape {tuple(e.shape)}")
    w_x = _axis_weights(w_x, e.shape[-2] if e.ndim >= 2 else 0, "token",
                        tuple(e.shape[:-2]) if e.ndim > 2 else ())
    w_y = _axis_weights(w_y, e.shape[-1] if e.ndim >= 1 else 0, "feature")
    scale = atol + rtol * xp.maximum(xp.abs(u), xp.abs(u_new))
    if atol == 0:  # an exact zero error where the state is zero is resolved (not 0/0 = NaN)
        scale = xp.where(e == 0, xp.ones_like(scale), scale)
    s2 = xp.abs(e / scale) ** 2  # abs: complex states (Fourier coefficients)
    total = float(math.prod(e.shape))
    if total == 0:  # no entry, no error: 0, as the sum it would be (not 0/0)
        return 0.0
    device = array_api_compat.device(s2)
    if w_y is not None:
        s2 = s2 * xp.asarray(np.array(w_y), dtype=s2.dtype, device=device)
        total *= float(w_y.sum()) / w_y.size
    if w_x is not None:
        s2 = s2 * xp.asarray(np.array(w_x), dtype=s2.dtype, device=device)[..., None]
        total *= float(w_x.sum()) / w_x.size
    return math.sqrt(float(xp.sum(s2)) / total)


def rms(e, u, u_new, rtol: float, atol: float) -> float:
    r"""The scaled RMS over all components, every weight 1 (scipy's, diffrax's, torchdiffeq's).

    .. math::  \|e\| = \Bigl( \frac{1}{N} \sum_k
        \Bigl(\frac{e_k}{\mathrm{atol} + \mathrm{rtol} \max(|u_k|, |u'_k|)}\Bigr)^2 \Bigr)^{1/2}

    over all :math:`N` entries. Same arguments as :func:`weighted_rms` without weights.
    """
    return weighted_rms(e, u, u_new, rtol, atol, None)


def grid_weights(grids, *, points: bool = False) -> tuple[np.ndarray, np.ndarray]:
    r"""Token and feature weights :math:`(w^x, w^y)` of a :class:`~ctformer.Grids` for the norm.

    Parameters
    ----------
    grids : ctformer.Grids
    points : bool
        ``False`` (default): weights for *stored* values (what a solver steps), shapes
        ``grids.stored_shape``. ``True``: weights for values at the quadrature points
        (``grids.to_points(e)``), shapes ``grids.shape``.

    Returns
    -------
    tuple of two host float64 arrays

    Notes
    -----
    For nodal discretizations (quadrature and spectral rules, products of them, atoms)
    stored values are point values and both choices give the quadrature weights
    (``quadrature_weights``; atoms carry their mass, a product the outer product of its
    factors'). For a Galerkin axis (P1, P2) the stored values are the coefficients
    :math:`c_j = f_h(x_j)` at the element nodes, and ``points=False`` gives the nodal weights
    :math:`w_j = \int \phi_j` (the row sums of the mass matrix: the lumped mass-matrix norm
    :math:`c^T M_L c`, which for P1 satisfies :math:`c^T M c \le c^T M_L c \le 3\, c^T M c`);
    ``points=True`` gives the Gauss weights at its quadrature points, with which the norm of
    ``to_points(e)`` is the :math:`L^2` norm of the error function :math:`e_h` itself for
    constant scales.
    """
    def axis(disc):
        if points or disc.nodal:
            return np.asarray(disc.quadrature_weights, dtype=np.float64)
        return np.asarray(disc.weights, dtype=np.float64)

    return axis(grids.tokens), axis(grids.features)
