r"""The rotation behind rotary positions (:class:`~ctformer.operators.positions.RoPE`): the
pairing of head features, frequency tables that depend on the context length, the angles of
axial RoPE, and the rotation of query and key pairs.

A head-feature rule on :math:`Y_h = [a, b]` with :math:`2m` points pairs node :math:`i` with
node :math:`i + m`; it respects the pairing :math:`\sigma \leftrightarrow \sigma + 1/2` when
:math:`\sigma_i < (a + b)/2`, :math:`\sigma_{i+m} = \sigma_i + (b - a)/2` and
:math:`w_{i+m} = w_i` for :math:`i < m`, to a relative :math:`10^{-12}`
(:func:`check_paired_head_features`). The pair :math:`i` has the pair variable
:math:`\tau_i = 2(\sigma_i - a)/(b - a) \in [0, 1)` and the frequency :math:`\omega(\tau_i)`;
a :class:`LengthFrequencies` gives the table :math:`\omega(\tau; L)` at the context length
:math:`L`. The angles are :math:`\theta_{ni} = \omega(\tau_i)\, p(x_n)`; on a two-dimensional
token domain (axial RoPE) they are

.. math::

    \theta_{ni} = \omega(2\tau_i)\, p_1(x_n) \quad (\tau_i < \tfrac12), \qquad
    \theta_{ni} = \omega(2\tau_i - 1)\, p_2(x_n) \quad (\tau_i \ge \tfrac12),

and :func:`rotate` turns each pair of the last axis (first half :math:`q_1`, second half
:math:`q_2`) by them:

.. math::

    (q_1, q_2) \mapsto (q_1 \cos\theta - q_2 \sin\theta,\; q_2 \cos\theta + q_1 \sin\theta).
"""
from __future__ import annotations

import abc

import numpy as np

from .._numerics import compiled as _compiled

__all__ = ["LengthFrequencies", "check_paired_head_features", "rotate"]


class LengthFrequencies(abc.ABC):
    r"""RoPE frequencies that depend on the context length: :math:`\omega(\tau; L)` (subclass).

    Dynamic NTK scaling and LongRoPE choose their frequencies from the length of the sequence;
    in the continuum that length is the grids' ``context_length`` :math:`L` (``N`` in
    ``run`` on ``N`` tokens), so token refinement at fixed :math:`L` keeps the frequencies.
    :meth:`at` returns the table of the :math:`d_h/2` frequencies at one length, read by
    :class:`RoPE` as piecewise constant on equal cells of :math:`\tau`.
    """

    @abc.abstractmethod
    def at(self, length: float) -> np.ndarray:
        """The float64 frequency table, shape ``(d_h / 2,)``, at context length ``length``."""


def check_paired_head_features(disc, what: str = "RoPE") -> int:
    """Check that a head-feature discretization respects the pairing sigma <-> sigma + 1/2.

    Parameters
    ----------
    disc : Discretization
        The head-feature discretization :math:`Y_h`.
    what : str
        Name used in the message.

    Returns
    -------
    int
        Half the number of quadrature points (the number of pairs).

    Raises
    ------
    ValueError
        If the number of points is odd, or the second half of the nodes (weights) is not the
        first half shifted by half the domain (equal), naming ``head_features`` and a remedy.
    """
    nodes = np.asarray(disc.quadrature_nodes, dtype=np.float64)
    weights = np.asarray(disc.quadrature_weights, dtype=np.float64)
    n = nodes.size
    a, b = disc.domain
    half = n // 2
    ok = n % 2 == 0 and n > 0
    if ok:
        shift = nodes[half:] - nodes[:half]
        ok = bool(np.allclose(shift, (b - a) / 2, rtol=0, atol=1e-12 * (b - a))
                  and np.allclose(weights[half:], weights[:half], rtol=1e-12, atol=0)
                  and np.all(nodes[:half] < a + (b - a) / 2))
    if not ok:
        raise ValueError(
            f"{what} rotates the head-feature pairs (sigma, sigma + 1/2): head_features must have "
            f"an even number of points whose second half is the first half shifted by 1/2, with "
            f"equal weights; got {disc!r}. Pass head_features=Midpoint(2 m) (or 'midpoint:2m') "
            "to solve")
    return half


def _axial_angles(rope, p, tau, length):
    """Axial angles: pairs with tau < 1/2 turn with x1, the others with x2, each half of tau
    stretched to [0, 1) so that both axes see the whole frequency range."""
    first = tau < 0.5
    omega = rope.omega(np.where(first, 2.0 * tau, 2.0 * tau - 1.0), length)
    return np.where(first[None, :], p[:, :1], p[:, 1:]) * omega[None, :]


def rotate(xp, q, cos, sin):
    """Rotate the pairs (first half, second half) of the last axis of ``q`` by the tables.

    ``q`` has shape ``(..., N, 2 m)``; ``cos`` and ``sin`` have shape ``(N, m)``. The formulas
    are those of the HuggingFace convention, ``q cos + rotate_half(q) sin``.
    """
    m = cos.shape[-1]
    if (type(q) is np.ndarray and q.dtype in (np.float32, np.float64) and q.ndim <= 4
            and type(cos) is np.ndarray and type(sin) is np.ndarray and cos.dtype == q.dtype
            and sin.dtype == q.dtype and cos.shape == sin.shape == (q.shape[-2], q.shape[-1] // 2)
            and q.shape[-1] == 2 * m):
        kernels = _compiled.kernels()
        if kernels is not None:  # one pass instead of six and a concatenation
            out = np.empty(q.shape, dtype=q.dtype)
            extra = (None,) * (4 - q.ndim)
            kernels.rotate_pairs(*_flat(q[extra]), cos, sin, out[extra])
            return out
    q1, q2 = q[..., :m], q[..., m:]
    return xp.concat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], axis=-1)


def _flat(q):
    """``(x, steps)``: a 1-d C view ``x`` of the memory the 4-d ``q`` spans and q's first three
    strides in elements, q[a, b, i, j] = x[a s0 + b s1 + i s2 + j] (q is copied first unless
    its last axis is contiguous and its strides are nonnegative multiples of the item size)."""
    size = q.itemsize
    if q.strides[-1] != size or any(s < 0 or s % size for s in q.strides) or not q.size:
        q = np.ascontiguousarray(q)
    steps = tuple(s // size for s in q.strides[:3])
    span = sum((n - 1) * s for n, s in zip(q.shape[:3], steps)) + q.shape[-1] if q.size else 0
    return np.lib.stride_tricks.as_strided(q, shape=(span,), strides=(size,)), steps
