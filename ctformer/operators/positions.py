r"""Positions as functions of the continuous token variable (design notes, section 10).

A token at :math:`x \in X` has the position

.. math::  p(x) = L\, s(x) - \tfrac12, \qquad s(x) = \frac{x - a}{b - a} \in [0, 1],

with :math:`L` the model's reference length (``context_length``) and :math:`X = [a, b]`
(:meth:`ctformer.Grids.positions`). Midpoint nodes of ``N`` tokens with :math:`L = N` give
:math:`p = 0, 1, \dots, N - 1` exactly: the discrete network. Refining the tokens at fixed
:math:`L` samples the same continuous positions more finely (position interpolation).

On a two-dimensional token domain (image patches) each axis has its own length and position,
:math:`p_k(x) = L_k s_k(x) - 1/2`, and :class:`RoPE` is axial: pairs with :math:`\tau < 1/2`
turn with :math:`p_1`, the others with :math:`p_2` (each half of :math:`\tau` stretched to
:math:`[0, 1)`), so the score depends on :math:`p_1 - p_1'` and :math:`p_2 - p_2'`.

Rotary positions (:class:`RoPE`, HuggingFace convention). The head-feature variable
:math:`\sigma \in Y_h = [0, 1]` is split into pairs :math:`(\sigma, \sigma + 1/2)`,
:math:`\sigma \in [0, 1/2)`, with the pair variable :math:`\tau = 2\sigma \in [0, 1)` and a
frequency :math:`\omega(\tau)`. Queries and keys are rotated by the angle
:math:`\omega(\tau)\, p(x)`,

.. math::

    \begin{pmatrix} q(x, \sigma) \\ q(x, \sigma + \tfrac12) \end{pmatrix} \mapsto
    \begin{pmatrix} \cos \theta & -\sin \theta \\ \sin \theta & \cos \theta \end{pmatrix}
    \begin{pmatrix} q(x, \sigma) \\ q(x, \sigma + \tfrac12) \end{pmatrix},
    \qquad \theta = \omega(2\sigma)\, p(x),

so that the score :math:`\int_{Y_h} q k\, d\sigma` depends on the positions only through
:math:`p(x) - p(x')`. The default frequency is :math:`\omega(\tau) = \Theta^{-\tau}` with the
base :math:`\Theta` (``rope_theta``); a converted network instead carries the table of its
native frequencies :math:`\Theta^{-2i/d_h}`, :math:`i < d_h/2`, read as piecewise constant on
the :math:`d_h/2` cells of :math:`\tau` (so the native head-feature nodes see exactly the
network's frequencies). A head-feature discretization must respect the pairing: its nodes
and weights on :math:`[1/2, 1)` are those on :math:`[0, 1/2)` shifted by :math:`1/2` (e.g.
``Midpoint(d_h)`` with :math:`d_h` even).

ALiBi (:class:`ALiBi`) adds :math:`-m_h |p(x) - p(x')|` to the exponent of head :math:`h`
(with a causal mask this is :math:`-m_h (p(x) - p(x'))`): a kernel that is Lipschitz but has a
kink on the diagonal :math:`x = x'`. The default slopes are the geometric sequence of the ALiBi
paper, :math:`m_h = 2^{-8 (h + 1) / H}` for :math:`H` a power of two.

Absolute encodings are part of the input :math:`u_0`: :func:`sinusoidal_encoding` evaluates the
sinusoidal table at any real position, and :func:`interpolate_table` evaluates a learned table
between its integer rows by piecewise-linear interpolation.
"""
from __future__ import annotations

import hashlib
import math
from numbers import Real

import numpy as np

from ..kernels import _to_host, cell_index

__all__ = ["RoPE", "ALiBi", "alibi_slopes", "sinusoidal_encoding", "interpolate_table",
           "check_paired_head_features"]


def _positive_number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class _GeometricFrequencies:
    r""":math:`\omega(\tau) = \Theta^{-\tau}` (vectorized, picklable)."""

    def __init__(self, theta: float):
        self.theta = theta

    def __call__(self, tau):
        return np.power(self.theta, -np.asarray(tau, dtype=np.float64))

    def __repr__(self) -> str:
        return f"theta**(-tau), theta={self.theta!r}"


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


class RoPE:
    r"""Rotary positions: rotate query and key pairs :math:`(\sigma, \sigma + 1/2)` by :math:`\omega p`.

    Parameters
    ----------
    theta : float, optional
        The base :math:`\Theta` of the default frequencies :math:`\omega(\tau) = \Theta^{-\tau}`
        (HuggingFace ``rope_theta``), default 10000.
    frequencies : None, callable or 1-D array_like, optional
        :math:`\omega(\tau)` on the pair variable :math:`\tau = 2\sigma \in [0, 1)`: a
        vectorized callable, or the table of a network's native frequencies (``inv_freq``,
        length :math:`d_h / 2`), read as piecewise constant on equal cells of :math:`\tau`.
        Default: :math:`\Theta^{-\tau}`.

    Raises
    ------
    ValueError
        If ``theta`` is not a positive finite number, or a table is empty, not 1-D or not
        finite.
    TypeError
        If ``frequencies`` is neither a callable nor an array.

    Notes
    -----
    :meth:`tables` gives :math:`\cos(\omega p)` and :math:`\sin(\omega p)` at the token and pair
    nodes of a :class:`ctformer.Grids`; :func:`rotate` applies them. The frequencies are part of
    the model's structure (not of ``parameters()``: a network's ``inv_freq`` is a buffer, not a
    weight); they are pickled with the model.
    """

    def __init__(self, theta=10000.0, frequencies=None):
        self.theta = _positive_number(theta, "theta")
        if frequencies is None:
            self.frequencies = _GeometricFrequencies(self.theta)
        elif callable(frequencies) and not hasattr(frequencies, "__array__"):
            self.frequencies = frequencies
        else:
            try:
                table = np.array(_to_host(frequencies), dtype=np.float64)
            except (TypeError, ValueError):
                raise TypeError("frequencies must be None, a callable omega(tau) or a 1-D array of "
                                f"frequencies, got {type(frequencies).__name__}") from None
            if table.ndim != 1 or table.size == 0 or not np.all(np.isfinite(table)):
                raise ValueError(f"frequencies must be a non-empty 1-D array of finite numbers, got shape "
                                 f"{table.shape}")
            table.setflags(write=False)
            self.frequencies = table

    def __repr__(self) -> str:
        if isinstance(self.frequencies, np.ndarray):
            digest = hashlib.sha256(self.frequencies.tobytes()).hexdigest()[:12]
            return f"RoPE(frequencies=table of {self.frequencies.size}, sha256 {digest})"
        return f"RoPE(theta={self.theta!r}, frequencies={self.frequencies!r})"

    def parameters(self) -> dict:
        """Nothing: the frequencies are structure (pickled with the model), not weights."""
        return {}

    def omega(self, tau) -> np.ndarray:
        r""":math:`\omega(\tau)` at pair coordinates ``tau`` in :math:`[0, 1)` (host float64)."""
        tau = np.asarray(tau, dtype=np.float64)
        if isinstance(self.frequencies, np.ndarray):
            return self.frequencies[cell_index(tau, (0.0, 1.0), self.frequencies.size)]
        values = np.asarray(_to_host(self.frequencies(tau)), dtype=np.float64)
        if values.shape != tau.shape or not np.all(np.isfinite(values)):
            raise ValueError("frequencies(tau) must return one finite value per point (vectorized)")
        return values

    def tables(self, grids) -> tuple[np.ndarray, np.ndarray]:
        r"""``(cos, sin)`` of the angles :math:`\omega(\tau_i) p(x_n)`, shape ``(N, d_h / 2)``.

        Raises
        ------
        ValueError
            If the grids have no ``context_length`` or a head-feature rule without the pairing.
        """
        half = check_paired_head_features(grids.head_features)
        disc = grids.head_features
        a, b = disc.domain
        tau = 2.0 * (np.asarray(disc.quadrature_nodes[:half], dtype=np.float64) - a) / (b - a)
        p = grids.positions()
        if p.ndim == 1:
            angles = p[:, None] * self.omega(tau)[None, :]
        else:
            # axial: pairs with tau < 1/2 turn with x1, the others with x2, each half of tau
            # stretched to [0, 1) so that both axes see the whole frequency range
            first = tau < 0.5
            omega = self.omega(np.where(first, 2.0 * tau, 2.0 * tau - 1.0))
            angles = np.where(first[None, :], p[:, :1], p[:, 1:]) * omega[None, :]
        return np.cos(angles), np.sin(angles)


def rotate(xp, q, cos, sin):
    """Rotate the pairs (first half, second half) of the last axis of ``q`` by the tables.

    ``q`` has shape ``(..., N, 2 m)``; ``cos`` and ``sin`` have shape ``(N, m)``. The formulas
    are those of the HuggingFace convention, ``q cos + rotate_half(q) sin``.
    """
    m = cos.shape[-1]
    q1, q2 = q[..., :m], q[..., m:]
    return xp.concat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], axis=-1)


def alibi_slopes(heads: int) -> np.ndarray:
    r"""The ALiBi slopes :math:`m_h` of ``heads`` heads (Press, Smith, Lewis 2022).

    For :math:`H` a power of two, :math:`m_h = 2^{-8 (h + 1) / H}`; otherwise the slopes of the
    largest power of two :math:`P < H`, followed by every other slope of :math:`2P` heads.
    """
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1:
        raise ValueError(f"heads must be a positive integer, got {heads!r}")

    def geometric(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    power = 2 ** int(math.floor(math.log2(heads)))
    slopes = geometric(power)
    if power < heads:
        slopes += geometric(2 * power)[0::2][: heads - power]
    return np.array(slopes, dtype=np.float64)


class ALiBi:
    r"""ALiBi: add :math:`-m_h |p(x) - p(x')|` to the attention exponent of head :math:`h`.

    Parameters
    ----------
    slopes : None or sequence of float, optional
        :math:`m_h \ge 0`, one per head; ``None`` takes :func:`alibi_slopes` of the number of
        heads of the attention operator using it.

    Raises
    ------
    ValueError
        If a slope is negative or not finite.
    """

    def __init__(self, slopes=None):
        if slopes is not None:
            arr = np.array(_to_host(slopes), dtype=np.float64).reshape(-1)
            if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise ValueError(f"slopes must be finite numbers >= 0, one per head, got {arr.tolist()}")
            arr.setflags(write=False)
            slopes = arr
        self.slopes = slopes

    def __repr__(self) -> str:
        return "ALiBi(slopes=default)" if self.slopes is None else f"ALiBi(slopes={self.slopes.tolist()})"

    def parameters(self) -> dict:
        """Nothing: the slopes are structure, not weights."""
        return {}

    def slopes_for(self, heads: int) -> np.ndarray:
        """The slopes of ``heads`` heads.

        Raises
        ------
        ValueError
            If explicit slopes do not have one value per head.
        """
        if self.slopes is None:
            return alibi_slopes(heads)
        if self.slopes.size != heads:
            raise ValueError(f"ALiBi has {self.slopes.size} slopes; the attention has {heads} heads")
        return np.asarray(self.slopes)


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
    if isinstance(features, bool) or not isinstance(features, (int, np.integer)) or features < 1:
        raise ValueError(f"features must be a positive integer, got {features!r}")
    base = _positive_number(base, "base")
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
