r"""Normalizations per token: LayerNorm as a projection, and the sphere projection.

Means and variances are integrals over the feature variable with its quadrature, with respect
to the probability measure :math:`dy / |Y|` (on :math:`Y = [0, 1]` just :math:`dy`):

.. math::

    \mu(x) = \frac{1}{|Y|}\int_Y u(x, y)\, dy, \qquad
    \mathrm{var}(x) = \frac{1}{|Y|}\int_Y \big(u(x, y) - \mu(x)\big)^2 dy .

On ``Midpoint(d)`` these are the mean and the biased variance of torch's ``LayerNorm``.

:class:`LayerNormProjection`: :math:`N(u) = g(y) (u - \mu) / \sqrt{\mathrm{var} + \varepsilon} + c(y)`.
With scalar :math:`g = \sigma_2 > 0`, :math:`c = \sigma_1` and :math:`\varepsilon = 0` it is the
:math:`L^2(Y)` projection onto
:math:`S_1(\sigma_1, \sigma_2) = \{v : \mu(v) = \sigma_1, \mathrm{var}(v) = \sigma_2^2\}`
(Tai, Liu, Li, Chan 2025, Thm 3.1): idempotent, and the closest point of :math:`S_1`.

:class:`SphereProjection`: :math:`N(u) = u / \|u\|_{L^2(Y)}`, the unit sphere of the particle
model (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025).
"""
from __future__ import annotations

import math
from numbers import Real

import array_api_compat
import numpy as np

from ..backend import to_host
from .base import Constants, Grids, Operator
from .functions import as_feature_function, named_parameters

__all__ = ["LayerNormProjection", "SphereProjection"]


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, Real) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _feature_weights(grids: Grids) -> np.ndarray:
    y = grids.features
    return np.asarray(y.quadrature_weights, dtype=np.float64) / y.length


def _first_token(bad) -> tuple:
    """Index (batch..., token) of the first True entry of the boolean array ``bad``, on the host."""
    host = to_host(bad)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(host.reshape(-1))), host.shape))


class LayerNormProjection(Operator):
    r"""LayerNorm over the features, :math:`g (u - \mu) / \sqrt{\mathrm{var} + \varepsilon} + c`.

    Parameters
    ----------
    gain : feature function, optional
        :math:`g(y)`: a number (default 1), a callable, or a 1-D array read as piecewise
        constant (a torch ``LayerNorm.weight``); ``None``: no gain (1).
    shift : feature function, optional
        :math:`c(y)`, default 0 (a torch ``LayerNorm.bias``); ``None``: no shift (0).
    eps : float, optional
        :math:`\varepsilon \ge 0`, default 0.

    Raises
    ------
    ValueError
        If ``eps`` is negative or not finite; when applied with ``eps == 0`` to a token whose
        feature variance is zero (to rounding), naming the token.

    Notes
    -----
    With ``eps == 0`` a token is degenerate when its variance is at most
    :math:`(64\, \epsilon_{\mathrm{mach}} \max_y |u|)^2`: at that level the variance is
    rounding noise and the normalized result would be meaningless. LayerNorm is singular at
    feature-constant states (design notes, section 1).
    """

    def __init__(self, gain=1.0, shift=0.0, eps=0.0):
        self.gain = as_feature_function(gain, "gain")
        self.shift = as_feature_function(shift, "shift")
        self.eps = _check_eps(eps)

    def parameters(self) -> dict:
        """Named arrays of the gain and the shift (absent ones are left out)."""
        return named_parameters(gain=self.gain, shift=self.shift)

    @property
    def is_projection(self) -> bool:
        r"""True when this is the exact idempotent :math:`L^2(Y)` projection onto :math:`S_1`.

        That is: scalar gain :math:`\sigma_2 > 0`, scalar shift :math:`\sigma_1` and
        :math:`\varepsilon = 0`.
        """
        gain_ok = self.gain.is_none or (self.gain.is_constant and self.gain.spec > 0)
        return gain_ok and (self.shift.is_none or self.shift.is_constant) and self.eps == 0.0

    def __repr__(self) -> str:
        return f"LayerNormProjection(gain={self.gain!r}, shift={self.shift!r}, eps={self.eps!r})"

    def _discretize(self, grids: Grids):
        y = grids.features
        constants = Constants(w=_feature_weights(grids), gain=self.gain.evaluate(y),
                              shift=self.shift.evaluate(y))
        eps = self.eps

        def layer_norm(u):
            xp = array_api_compat.array_namespace(u)
            w = constants("w", u)
            mean = xp.sum(u * w, axis=-1, keepdims=True)
            centred = u - mean
            var = xp.sum(centred * centred * w, axis=-1, keepdims=True)
            if eps == 0.0:
                tiny = 64.0 * float(np.finfo(np.dtype(str(u.dtype))).eps)
                scale = xp.max(xp.abs(u), axis=-1, keepdims=True)
                bad = var <= (tiny * scale) ** 2
                if bool(xp.any(bad)):
                    where = _first_token(bad[..., 0])
                    raise ValueError(
                        f"LayerNormProjection with eps=0: the token at index {where} (batch..., token) "
                        "has zero feature variance; the projection onto S1 is not defined there. "
                        "Use eps > 0 or avoid feature-constant states."
                    )
            normalized = centred / xp.sqrt(var + eps)
            gain, shift = constants("gain", u), constants("shift", u)
            out = normalized if gain is None else normalized * gain
            return out if shift is None else out + shift

        return layer_norm


class SphereProjection(Operator):
    r"""Projection onto the unit sphere of :math:`L^2(Y)`: :math:`N(u) = g\, u / \|u\|`.

    .. math::  \|u\|^2 = \frac{1}{|Y|} \int_Y u(x, y)^2\, dy  \quad (+ \varepsilon)

    Parameters
    ----------
    gain : feature function, optional
        :math:`g(y)`, default 1 (RMSNorm's weight).
    eps : float, optional
        :math:`\varepsilon \ge 0` added to :math:`\|u\|^2`, default 0 (RMSNorm's eps).

    Raises
    ------
    ValueError
        If ``eps`` is invalid; when applied with ``eps == 0`` to a token that is zero.
    """

    def __init__(self, gain=1.0, eps=0.0):
        self.gain = as_feature_function(gain, "gain")
        self.eps = _check_eps(eps)

    def parameters(self) -> dict:
        """Named arrays of the gain (left out when absent)."""
        return named_parameters(gain=self.gain)

    @property
    def is_projection(self) -> bool:
        """True for the plain projection onto the unit sphere (gain 1, eps 0)."""
        plain_gain = self.gain.is_none or (self.gain.is_constant and self.gain.spec == 1.0)
        return plain_gain and self.eps == 0.0

    def __repr__(self) -> str:
        return f"SphereProjection(gain={self.gain!r}, eps={self.eps!r})"

    def _discretize(self, grids: Grids):
        y = grids.features
        plain = self.is_projection
        constants = Constants(w=_feature_weights(grids), gain=None if plain else self.gain.evaluate(y))
        eps = self.eps

        def sphere(u):
            xp = array_api_compat.array_namespace(u)
            w = constants("w", u)
            square = xp.sum(u * u * w, axis=-1, keepdims=True)
            if eps == 0.0:
                bad = square == 0
                if bool(xp.any(bad)):
                    where = _first_token(bad[..., 0])
                    raise ValueError(
                        f"SphereProjection: the token at index {where} (batch..., token) is zero; "
                        "it has no projection onto the sphere. Use eps > 0."
                    )
            out = u / xp.sqrt(square + eps)
            return out if plain else out * constants("gain", u)

        return sphere
