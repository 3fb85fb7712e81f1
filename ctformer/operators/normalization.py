r"""Normalizations per token: LayerNorm as a projection, RMSNorm and the sphere projection.

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
model (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025). With a per-feature gain and
:math:`\varepsilon` it is RMSNorm (design notes, section 10),
:math:`N(u) = g(y)\, u / \sqrt{\mu(u^2) + \varepsilon}`; :class:`RMSNorm` is the same operator
under its usual name.

Scale safety. Every normalization is evaluated on the rescaled token
:math:`v = u / s(x)` with :math:`s(x) = 2^{\lfloor \log_2 \max_y |u(x, y)| \rfloor}` (a power
of two, so the division is exact), using

.. math::

    \frac{u - \mu(u)}{\sqrt{\mathrm{var}(u) + \varepsilon}}
        = \frac{v - \mu(v)}{\sqrt{\mathrm{var}(v) + \varepsilon / s^2}}, \qquad
    \frac{u}{\sqrt{\mu(u^2) + \varepsilon}} = \frac{v}{\sqrt{\mu(v^2) + \varepsilon / s^2}} .

Squares of :math:`v` lie in :math:`[0, 4)`, so nothing overflows or underflows however large
or small :math:`u` is, and with :math:`\varepsilon = 0` the result satisfies
:math:`N(c u) = N(u)` to rounding for every :math:`c > 0` representable in the dtype (exactly
for powers of two). With :math:`\varepsilon > 0`, :math:`s` is raised to at least
:math:`\sqrt{\varepsilon / R}` (:math:`R` a quarter of the dtype's largest number; a power of
two) in :math:`v` and in :math:`\varepsilon / s^2` alike, so that :math:`\varepsilon / s^2`
stays finite and a tiny token keeps its relative accuracy (in float32 with
:math:`\varepsilon = 10^{-5}`, a token of size :math:`10^{-30}` normalizes to about
:math:`3 \cdot 10^{-28}`, as torch's ``layer_norm`` gives).

Dtypes. The result has the dtype of :math:`u`. The compiled pass sums float32 tokens in float64
with the float64 feature weights (weights rounded to float32 sum to :math:`1 + O(10^{-7})`: a
constant float32 token with :math:`\varepsilon = 10^{-12}` then normalized to about
:math:`\pm 0.3` instead of 0). With :math:`\varepsilon > 0` a feature-constant token gives
exactly :math:`c(y)`: a mean whose rounding is all of the variance is corrected once. A NumPy
float16 state is normalized in float32 and rounded once to float16 (within half an ulp of
float16; float16 sums of squares would lose most of the variance's bits), and a result beyond
float16's largest number 65504 (a large gain) raises :class:`OverflowError` rather than
becoming inf.
"""
from __future__ import annotations

import math
import sys

import array_api_compat
import numpy as np

from .. import validation
from .._numerics.normalize import normalized_rows, rows_plan
from .small_plans import SmallPlans
from ..backend import to_host
from .activation_blocks import is_half
from .activations import via_float32
from .base import Constants, Grids, Normalization
from .functions import as_feature_function, named_parameters

__all__ = ["LayerNormProjection", "SphereProjection", "RMSNorm"]


# A float64 NumPy state with 2^-400 <= max |u| <= 2^400 (float32: 2^-40 <= max |u| <= 2^40)
# squares without overflow; if moreover every token's variance is clearly above rounding noise
# relative to max |u| (so far from subnormal numbers), nothing underflowed either, and the
# unscaled result is the scale-safe one (see _plain_centred).
_PLAIN = {np.dtype(np.float64): (2.0 ** 400, 64.0 * float(np.finfo(np.float64).eps)),
          np.dtype(np.float32): (2.0 ** 40, 64.0 * float(np.finfo(np.float32).eps))}


def _plain_centred(u, w, eps: float, centre: bool, w64=None):
    """The hot path for float64 and float32 NumPy states: ``(c, var)`` without rescaling, or ``None``.

    ``None`` for other arrays, when the state is too large to square, or (``eps == 0``) when some token's
    variance is not clearly above rounding noise relative to the largest entry: the careful
    path then rescales token by token and names a degenerate token. A float32 state's mean is
    its product with the float64 weights ``w64``, rounded once.
    """
    if type(u) is not np.ndarray or u.dtype not in _PLAIN:
        return None
    largest, noise = _PLAIN[u.dtype]
    top = float(np.abs(u).max(initial=0.0))
    if not 1.0 / largest <= top <= largest:
        return None
    wm = w64 if u.dtype == np.float32 else w  # a float32 mean in float64 (float32 weights sum to 1 + O(1e-7))
    mean = u @ wm if centre else None
    c = u - mean.astype(u.dtype, copy=False)[..., None] if centre else u
    var = ((c * c) @ w)[..., None]
    if not float(var.min(initial=np.inf)) > (noise * top) ** 2:
        if eps == 0.0:
            return None
        if centre:  # the mean's rounding is all of var (a constant token gave +-1, not 0): corrected once
            c = u - (mean + c @ wm).astype(u.dtype, copy=False)[..., None]
            var = ((c * c) @ w)[..., None]
    return c, var


def _torch_fused(u, uniform: bool, eps: float, centre: bool, gain, shift=None):
    """torch's fused ``layer_norm`` (``centre``) or ``rms_norm`` for a float32 or float64 torch
    tensor on the CPU (on a GPU the general path, which never waits for the device), where
    that is the scale-safe result: uniform feature weights (a midpoint grid, as
    converted networks use), ``eps > 0`` and the largest entry within the squaring range of
    ``_PLAIN`` (one reduction, outside autograd); else ``None``. One pass where the general
    path takes about fifteen tensor operations (a 16-token MiniLM forward on torch tensors:
    1.7 ms of 7 in its twelve normalizations)."""
    torch = sys.modules.get("torch")
    if (not uniform or eps <= 0.0 or torch is None or not isinstance(u, torch.Tensor) or u.numel() == 0
            or u.device.type != "cpu"):  # on a GPU the range check would wait for the device
        return None
    plain = _PLAIN.get(np.dtype(np.float64) if u.dtype == torch.float64 else
                       np.dtype(np.float32) if u.dtype == torch.float32 else None)
    if plain is None:
        return None
    with torch.no_grad():
        top = float(u.abs().amax())
    if not 1.0 / plain[0] <= top <= plain[0]:
        return None
    d = u.shape[-1]
    weight = None if gain is None else torch.broadcast_to(gain, (d,))
    if centre:
        bias = None if shift is None else torch.broadcast_to(shift, (d,))
        return torch.nn.functional.layer_norm(u, (d,), weight, bias, eps)
    return torch.nn.functional.rms_norm(u, (d,), weight, eps)


def _uniform(w) -> bool:
    """Whether the host feature weights ``w`` are all equal (the mean is the plain average)."""
    return bool(w.size) and bool(np.all(w == w[0]))


def _rescaled(xp, u):
    """``(v, s, peak)`` with ``v = u / s``, ``s`` the power of two at or below ``max |u|`` per token.

    Tokens that are exactly zero get ``s = 1`` (so ``v = 0``). Division by a power of two is
    exact, and ``max |v|`` lies in ``[1, 2)`` for every other token; ``peak`` is ``max |v|``.
    """
    peak = xp.max(xp.abs(u), axis=-1, keepdims=True)
    positive = peak > 0
    exponent = xp.floor(xp.log2(xp.where(positive, peak, xp.ones_like(peak))))
    s = xp.pow(xp.asarray(2.0, dtype=u.dtype), exponent)
    v = u / s
    return v, s, xp.max(xp.abs(v), axis=-1, keepdims=True)


def _eps_normalized(xp, x, square, eps: float, s):
    r""":math:`x / \sqrt{m + \varepsilon / s^2}` without overflow, ``m`` the mean square ``square``.

    Where :math:`\varepsilon / s^2` would exceed :math:`R` (a quarter of the dtype's largest
    number), ``s`` is raised to the power of two :math:`t \ge \sqrt{\varepsilon / R}` and
    ``x`` and ``m`` are rescaled by :math:`r = s / t` alike (exact: a power of two), the same
    quotient :math:`r x / \sqrt{r^2 m + \varepsilon / t^2}`; raising ``s`` in the
    :math:`\varepsilon` term alone multiplied tiny tokens by :math:`t / s`.
    """
    floor = math.sqrt(eps / (float(xp.finfo(x.dtype).max) / 4.0))
    if not floor > 0:
        return x / xp.sqrt(square + eps / s / s)
    safe = xp.maximum(s, xp.asarray(2.0 ** math.ceil(math.log2(floor)), dtype=s.dtype))
    ratio = s / safe
    # eps / safe^2 may underflow to 0 (float32, s = 2^99): a constant token then has x = 0 and
    # square = 0, and 0 / tiny = 0 where 0 / 0 was NaN
    root = xp.sqrt(square * ratio * ratio + eps / safe / safe)
    return (x * ratio) / xp.maximum(root, xp.asarray(float(xp.finfo(x.dtype).tiny), dtype=root.dtype))


def _check_eps(eps) -> float:
    return validation.real(eps, "eps", nonnegative=True)


def _feature_weights(grids: Grids) -> np.ndarray:
    y = grids.features
    return np.asarray(y.quadrature_weights, dtype=np.float64) / y.length


def _first_token(bad) -> tuple:
    """Index (batch..., token) of the first True entry of the boolean array ``bad``, on the host."""
    host = to_host(bad)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(host.reshape(-1))), host.shape))


class LayerNormProjection(Normalization):
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
        eps, uniform = self.eps, _uniform(_feature_weights(grids))

        def layer_norm(u):
            if is_half(u):
                return via_float32(layer_norm, u, "LayerNormProjection")
            w = constants("w", u)
            gain, shift = constants("gain", u), constants("shift", u)
            fused = normalized_rows(u, constants.host["w"], eps, True, gain, shift)
            if fused is not None:
                return fused
            fused = _torch_fused(u, uniform, eps, True, gain, shift)
            if fused is not None:
                return fused
            plain = _plain_centred(u, w, eps, True, constants.host["w"])
            if plain is not None:  # both arrays are new: finished in place
                centred, var = plain
                if eps:
                    var += eps
                np.sqrt(var, out=var)
                centred /= var
                if gain is not None:
                    centred *= gain
                if shift is not None:
                    centred += shift
                return centred
            xp = array_api_compat.array_namespace(u)
            v, s, peak = _rescaled(xp, u)
            mean = v @ w                                 # quadrature of the mean: one product
            # corrected once (float32 weights sum to 1 + O(1e-7); a constant token then centres to 0)
            centred = v - (mean + (v - mean[..., None]) @ w)[..., None]
            var = ((centred * centred) @ w)[..., None]
            if eps == 0.0:
                # rounding noise of the variance of v
                tiny = 64.0 * float(xp.finfo(u.dtype).eps)
                bad = var <= (tiny * peak) ** 2
                if bool(xp.any(bad)):
                    where = _first_token(bad[..., 0])
                    raise ValueError(
                        f"LayerNormProjection with eps=0: the token at index {where} (batch..., token) "
                        "has zero feature variance; the projection onto S1 is not defined there. "
                        "Use eps > 0 or avoid feature-constant states."
                    )
                normalized = centred / xp.sqrt(var)
            else:
                normalized = _eps_normalized(xp, centred, var, eps, s)
            out = normalized if gain is None else normalized * gain
            return out if shift is None else out + shift

        return SmallPlans(layer_norm, lambda u: _fused_plan(
            layer_norm, u, constants.host["w"], eps, True, constants("gain", u), constants("shift", u)))


class SphereProjection(Normalization):
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
        plain = self.is_projection or self.gain.is_none  # no gain to apply (gain=None: none, with any eps)
        constants = Constants(w=_feature_weights(grids), gain=None if plain else self.gain.evaluate(y))
        eps, name, uniform = self.eps, type(self).__name__, _uniform(_feature_weights(grids))

        def sphere(u):
            if is_half(u):
                return via_float32(sphere, u, name)
            w = constants("w", u)
            fused = normalized_rows(u, constants.host["w"], eps, False, None if plain else constants("gain", u))
            if fused is None:
                fused = _torch_fused(u, uniform, eps, False, None if plain else constants("gain", u))
            if fused is not None:
                return fused
            fast = _plain_centred(u, w, eps, False)
            if fast is not None:
                _, square = fast
                out = u / np.sqrt(square + eps) if eps else u / np.sqrt(square)
                return out if plain else out * constants("gain", u)
            xp = array_api_compat.array_namespace(u)
            v, s, peak = _rescaled(xp, u)
            positive = peak > 0
            square = ((v * v) @ w)[..., None]
            if eps == 0.0:
                if not bool(xp.all(positive)):
                    where = _first_token(~positive[..., 0])
                    raise ValueError(
                        f"{name}: the token at index {where} (batch..., token) is zero; "
                        "it has no projection onto the sphere. Use eps > 0."
                    )
                out = v / xp.sqrt(square)
            else:
                out = _eps_normalized(xp, v, square, eps, s)
            return out if plain else out * constants("gain", u)

        return SmallPlans(sphere, lambda u: _fused_plan(
            sphere, u, constants.host["w"], eps, False, None if plain else constants("gain", u)))


def _fused_plan(general, like, w, eps, centre, gain, shift=None):
    """The plan of a normalization for small states shaped like ``like`` (:class:`SmallPlans`):
    the compiled pass, and ``general`` where it declines (a token too large or too small to
    square, or without variance: the scale-safe formulas and their messages); None where the
    compiled pass does not apply."""
    fused = rows_plan(like, w, eps, centre, gain, shift)
    if fused is None:
        return None

    def normalized(u):
        out = fused(u)
        return general(u) if out is None else out

    return normalized


class RMSNorm(SphereProjection):
    r"""RMSNorm, :math:`N(u) = g(y)\, u / \sqrt{\mu(u^2) + \varepsilon}` (design notes, section 10).

    The same operator as :class:`SphereProjection` (with ``gain = 1`` and ``eps = 0`` the
    :math:`L^2(Y)` projection onto the sphere :math:`\{v : \mu(v^2) = 1\}`), under the name
    used by Llama-family networks; scale-safe like every normalization of this module.

    Parameters
    ----------
    gain : feature function, optional
        :math:`g(y)`, default 1 (a HuggingFace ``RMSNorm.weight`` as a 1-D array).
    eps : float, optional
        :math:`\varepsilon \ge 0`, default 0 (``rms_norm_eps``).

    Raises
    ------
    ValueError
        If ``eps`` is invalid; when applied with ``eps == 0`` to a token that is zero.
    """

    def __repr__(self) -> str:
        return f"RMSNorm(gain={self.gain!r}, eps={self.eps!r})"
