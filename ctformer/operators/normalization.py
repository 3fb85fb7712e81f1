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

import numpy as np

from .base import Grids, Operator, check_state, device_array
from .functions import as_feature_function

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
    host = bad.get() if type(bad).__module__.split(".")[0] == "cupy" else np.asarray(bad)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(host.reshape(-1))), host.shape))


class LayerNormProjection(Operator):
    r"""LayerNorm over the features, :math:`g (u - \mu) / \sqrt{\mathrm{var} + \varepsilon} + c`.

    Parameters
    ----------
    gain : feature function, optional
        :math:`g(y)`: a number (default 1), a callable, or a 1-D array read as piecewise
        constant (a torch ``LayerNorm.weight``).
    shift : feature function, optional
        :math:`c(y)`, default 0 (a torch ``LayerNorm.bias``).
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
    feature-constant states (DESIGN.md section 1).
    """

    def __init__(self, gain=1.0, shift=0.0, eps=0.0):
        self.gain = as_feature_function(1.0 if gain is None else gain, "gain")
        self.shift = as_feature_function(0.0 if shift is None else shift, "shift")
        self.eps = _check_eps(eps)

    @property
    def is_projection(self) -> bool:
        r"""True when this is the exact idempotent :math:`L^2(Y)` projection onto :math:`S_1`.

        That is: scalar gain :math:`\sigma_2 > 0`, scalar shift :math:`\sigma_1` and
        :math:`\varepsilon = 0`.
        """
        return (self.gain.is_constant and self.gain.spec > 0 and self.shift.is_constant
                and self.eps == 0.0)

    def __repr__(self) -> str:
        return f"LayerNormProjection(gain={self.gain!r}, shift={self.shift!r}, eps={self.eps!r})"

    def _discretize(self, grids: Grids):
        y = grids.features
        weights = _feature_weights(grids)
        gain, shift = self.gain.evaluate(y), self.shift.evaluate(y)
        eps, owner = self.eps, self

        def layer_norm(u):
            xp = check_state(u, grids)
            w = device_array(owner, u, (grids, "w"), weights)
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
            return (normalized * device_array(owner, u, (grids, "gain"), gain)
                    + device_array(owner, u, (grids, "shift"), shift))

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
        self.gain = as_feature_function(1.0 if gain is None else gain, "gain")
        self.eps = _check_eps(eps)

    @property
    def is_projection(self) -> bool:
        """True for the plain projection onto the unit sphere (gain 1, eps 0)."""
        return self.gain.is_constant and self.gain.spec == 1.0 and self.eps == 0.0

    def __repr__(self) -> str:
        return f"SphereProjection(gain={self.gain!r}, eps={self.eps!r})"

    def _discretize(self, grids: Grids):
        y = grids.features
        weights = _feature_weights(grids)
        gain = self.gain.evaluate(y)
        eps, owner = self.eps, self

        def sphere(u):
            xp = check_state(u, grids)
            w = device_array(owner, u, (grids, "w"), weights)
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
            return out if self.is_projection else out * device_array(owner, u, (grids, "gain"), gain)

        return sphere
