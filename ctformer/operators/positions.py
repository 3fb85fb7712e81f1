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

Every relative encoding is a :class:`PositionEncoding`, which says what it contributes to the
score :math:`s(x, x')`: a rotation of the queries and keys in the head-feature variable
(:meth:`PositionEncoding.rotation`: :class:`RoPE`, :class:`AxialRoPE`) or an additive term in
:math:`p(x) - p(x')` (:meth:`PositionEncoding.score_bias`: :class:`ALiBi`); :class:`NoPositions`
contributes nothing. The attention operator asks the object, never its type, so a new encoding
is one subclass.

Absolute encodings are part of the input :math:`u_0`: :func:`sinusoidal_encoding` evaluates the
sinusoidal table at any real position, and :func:`interpolate_table` evaluates a learned table
between its integer rows by piecewise-linear interpolation
(:mod:`ctformer.operators.absolute_positions`).
"""
from __future__ import annotations

import hashlib
import math

import array_api_compat
import numpy as np

from .. import validation
from .._numerics import compiled as _compiled  # noqa: F401  (positions._compiled.kernels: what rotate reads)
from ..kernels import _to_host, cell_index
from .absolute_positions import interpolate_table, sinusoidal_encoding
from .masks import _same
# the rotation of RoPE, re-exported here where it was defined before
from .rope_rotation import LengthFrequencies, _axial_angles, _flat, check_paired_head_features, rotate  # noqa: F401

__all__ = ["PositionEncoding", "NoPositions", "RoPE", "AxialRoPE", "LengthFrequencies", "ALiBi",
           "alibi_slopes", "sinusoidal_encoding", "interpolate_table", "check_paired_head_features"]


class PositionEncoding:
    r"""How token positions enter the attention score (subclass to add an encoding).

    An encoding contributes to :math:`s^h(x, x')` in one or both of two ways, and the attention
    operator asks for each:

    * :meth:`rotation`: tables :math:`(\cos\theta, \sin\theta)` that rotate the pairs
      :math:`(\sigma, \sigma + 1/2)` of queries and keys in the head-feature variable before the
      score (RoPE);
    * :meth:`score_bias`: an additive term :math:`b_h(p(x) - p(x'))` of the exponent (ALiBi).
      The banded engine evaluates it block by block, so a model with one is computed by
      :func:`~ctformer.operators.local_attention.local_attention`.

    Attributes
    ----------
    needs_positions : bool
        Whether the grids must have a ``context_length`` (class attribute, default True).
    """

    needs_positions = True

    def __eq__(self, other):
        """Equal encodings are the same computation: same type, attributes of the same types
        and values (arrays: same shape, dtype and entries), as for masks."""
        return type(self) is type(other) and _same(self.__dict__, other.__dict__)

    def __hash__(self):
        return hash(type(self))

    def __setattr__(self, name, value):
        # the library's encodings are frozen once built (a new theta would not reach the
        # frequencies made from the old one); a user's subclass may opt in the same way
        _check_unfrozen(self, name)
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        _check_unfrozen(self, name)
        object.__delattr__(self, name)

    def parameters(self) -> dict:
        """Trainable arrays of the encoding: none by default (frequencies and slopes are
        structure, pickled with the model)."""
        return {}

    def check_heads(self, heads: int) -> None:
        """Refuse an attention of ``heads`` heads this encoding cannot serve (checked when the
        attention operator is built); the default accepts any."""

    def rotation(self, grids):
        r"""``(cos, sin)``, each ``(N, d_h / 2)`` (host float64), rotating query and key pairs by
        the angles :math:`\theta` at the token and pair nodes of ``grids``; ``None`` (the
        default): no rotation."""
        return None

    def score_bias(self, heads: int):
        r"""A callable ``bias(difference)`` for :math:`b_h(p(x) - p(x'))`, or ``None`` (the default).

        ``difference`` is an array ``(rows, cols)`` of :math:`p(x_i) - p(x'_j)` in the namespace
        and dtype of the state; the result broadcasts to ``(heads, rows, cols)`` (one term per
        head) in that namespace and dtype.
        """
        return None


def _check_unfrozen(encoding, name: str) -> None:
    if encoding.__dict__.get("_frozen", False):
        raise AttributeError(f"{type(encoding).__name__} is immutable: cannot set or delete {name!r}; "
                             f"build a new encoding instead (e.g. {type(encoding).__name__}(...) with "
                             "other arguments)")


class NoPositions(PositionEncoding):
    r"""No relative positions: the score is :math:`\beta \int q k\, d\sigma` alone."""

    needs_positions = False

    def __repr__(self) -> str:
        return "NoPositions()"

    def __eq__(self, other):
        return type(other) is NoPositions

    def __hash__(self):
        return hash(NoPositions)


def _positive_number(value, name: str) -> float:
    return validation.real(value, name, positive=True)


class _GeometricFrequencies:
    r""":math:`\omega(\tau) = \Theta^{-\tau}` (vectorized, picklable)."""

    def __init__(self, theta: float):
        self.theta = theta

    def __eq__(self, other):
        return type(other) is _GeometricFrequencies and self.theta == other.theta

    def __hash__(self):
        return hash((_GeometricFrequencies, self.theta))

    def __call__(self, tau):
        return np.power(self.theta, -np.asarray(tau, dtype=np.float64))

    def __repr__(self) -> str:
        return f"theta**(-tau), theta={self.theta!r}"


class RoPE(PositionEncoding):
    r"""Rotary positions: rotate query and key pairs :math:`(\sigma, \sigma + 1/2)` by :math:`\omega p`.

    Parameters
    ----------
    theta : float, optional
        The base :math:`\Theta` of the default frequencies :math:`\omega(\tau) = \Theta^{-\tau}`
        (HuggingFace ``rope_theta``), default 10000.
    frequencies : None, callable, 1-D array_like or LengthFrequencies, optional
        :math:`\omega(\tau)` on the pair variable :math:`\tau = 2\sigma \in [0, 1)`: a
        vectorized callable, or the table of a network's native frequencies (``inv_freq``,
        length :math:`d_h / 2`), read as piecewise constant on equal cells of :math:`\tau`, or
        a :class:`LengthFrequencies` whose table depends on the grids' ``context_length``
        (dynamic NTK, LongRoPE). Default: :math:`\Theta^{-\tau}`.

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
        elif isinstance(frequencies, LengthFrequencies):
            self.frequencies = frequencies
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
        self.__dict__["_frozen"] = True

    def __repr__(self) -> str:
        if isinstance(self.frequencies, np.ndarray):
            digest = hashlib.sha256(self.frequencies.tobytes()).hexdigest()[:12]
            return f"RoPE(frequencies=table of {self.frequencies.size}, sha256 {digest})"
        return f"RoPE(theta={self.theta!r}, frequencies={self.frequencies!r})"

    def parameters(self) -> dict:
        """Nothing: the frequencies are structure (pickled with the model), not weights."""
        return {}

    def omega(self, tau, length=None) -> np.ndarray:
        r""":math:`\omega(\tau)` at pair coordinates ``tau`` in :math:`[0, 1)` (host float64).

        ``length`` is the context length :math:`L`, needed (and only read) when the frequencies
        are :class:`LengthFrequencies`.
        """
        tau = np.asarray(tau, dtype=np.float64)
        table = self.frequencies
        if isinstance(table, LengthFrequencies):
            if not validation.is_real(length):
                raise ValueError(f"{table!r} depends on the context length: omega(tau, length) needs a "
                                 f"real length (the grids' context_length), got {length!r}")
            table = np.asarray(table.at(float(length)), dtype=np.float64)
        if isinstance(table, np.ndarray):
            return table[cell_index(tau, (0.0, 1.0), table.size)]
        values = np.asarray(_to_host(self.frequencies(tau)), dtype=np.float64)
        if values.shape != tau.shape or not np.all(np.isfinite(values)):
            raise ValueError("frequencies(tau) must return one finite value per point (vectorized)")
        return values

    def tables(self, grids) -> tuple[np.ndarray, np.ndarray]:
        r"""``(cos, sin)`` of the angles :math:`\omega(\tau_i) p(x_n)`, shape ``(N, d_h / 2)``.

        On a two-dimensional token domain the angles are those of :class:`AxialRoPE`.

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
        length = grids.context_length
        angles = self._angles(p, tau, length) if p.ndim == 1 else _axial_angles(self, p, tau, length)
        return np.cos(angles), np.sin(angles)

    def _angles(self, p, tau, length):
        return p[:, None] * self.omega(tau, length)[None, :]

    def rotation(self, grids):
        """The rotation tables on ``grids`` (:meth:`tables`)."""
        return self.tables(grids)


class AxialRoPE(RoPE):
    r"""Two-dimensional (axial) RoPE of image patches, :math:`x = (x_1, x_2)`.

    Pairs with :math:`\tau < 1/2` turn by :math:`\omega(2\tau)\, p_1(x)`, the others by
    :math:`\omega(2\tau - 1)\, p_2(x)`, so the score depends on :math:`p_1 - p_1'` and
    :math:`p_2 - p_2'`. The same as :class:`RoPE` on a two-dimensional token domain, and
    refused on an interval. Parameters as :class:`RoPE`.
    """

    def __repr__(self) -> str:
        return "Axial" + super().__repr__()

    def _angles(self, p, tau, length):
        raise ValueError("AxialRoPE rotates with the two positions of a two-dimensional token "
                         "domain (image patches); these grids have one: use RoPE")


def alibi_slopes(heads: int) -> np.ndarray:
    r"""The ALiBi slopes :math:`m_h` of ``heads`` heads (Press, Smith, Lewis 2022).

    For :math:`H` a power of two, :math:`m_h = 2^{-8 (h + 1) / H}`; otherwise the slopes of the
    largest power of two :math:`P < H`, followed by every other slope of :math:`2P` heads.
    """
    heads = validation.integer(heads, "heads")

    def geometric(n):
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    power = 2 ** int(math.floor(math.log2(heads)))
    slopes = geometric(power)
    if power < heads:
        slopes += geometric(2 * power)[0::2][: heads - power]
    return np.array(slopes, dtype=np.float64)


class ALiBi(PositionEncoding):
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
        self.__dict__["_frozen"] = True

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
        # a writable copy: torch warns when it converts a read-only NumPy array
        return np.array(self.slopes)

    def check_heads(self, heads: int) -> None:
        """One slope per head (explicit slopes must match ``heads``)."""
        self.slopes_for(heads)

    def score_bias(self, heads: int):
        r""":math:`-m_h |p(x) - p(x')|` for the ``heads`` slopes."""
        return _ALiBiBias(self.slopes_for(heads))


class _ALiBiBias:
    """``bias(difference) = -m_h |difference|`` as an array (heads, rows, cols).
    ``distance_slopes``: the :math:`m_h`, by which the dense engine evaluates the same term
    block by block (:class:`ctformer._numerics.score_terms.DistanceTerm`)."""

    def __init__(self, slopes):
        self.slopes = self.distance_slopes = slopes
        self._cache = {}   # (namespace, dtype, device) -> slopes (heads, 1, 1)

    def __call__(self, difference):
        xp = array_api_compat.array_namespace(difference)
        device = array_api_compat.device(difference)
        key = (xp.__name__, str(difference.dtype), str(device))
        slopes = self._cache.get(key)
        if slopes is None:
            slopes = self._cache[key] = xp.asarray(self.slopes, dtype=difference.dtype, device=device)[:, None, None]
        return -(slopes * xp.abs(difference))
