r"""HuggingFace's RoPE scalings as frequency functions of the pair variable, in float64.

A scaled RoPE is a frequency function :math:`\omega(\tau)` of the pair variable
:math:`\tau = 2i/d_r \in [0, 1)` (:math:`d_r` the rotated head features) and a factor
:math:`a` by which HuggingFace multiplies :math:`\cos` and :math:`\sin`; both queries and keys
carry it, so every score :math:`q \cdot k` is multiplied by :math:`a^2`: in the continuum a
temperature of the score, :math:`\beta_h \mapsto a^2 \beta_h` (with a ``partial_rotary_factor``
below 1 only the rotated features carry :math:`a`: :mod:`ctformer.bridges.rotary`). With
:math:`\Theta` = ``rope_theta``, :math:`s` = ``factor`` and :math:`L_0` the original length:

* ``default``: :math:`\omega = \Theta^{-\tau}`, :math:`a = 1`;
* ``linear``: :math:`\omega = \Theta^{-\tau}/s` (position interpolation), :math:`a = 1`;
* ``dynamic`` (NTK): :math:`\omega = \Theta_L^{-\tau}` with
  :math:`\Theta_L = \Theta\,\big(s L/L_0 - (s - 1)\big)^{d_r/(d_r - 2)}` at context length
  :math:`L > L_0` (``max_position_embeddings``), the default at :math:`L \le L_0`;
  :math:`a = 1`;
* ``yarn``: :math:`\omega = \Theta^{-\tau}\big(r/s + 1 - r\big)`, with the ramp
  :math:`r(i) = \mathrm{clip}((i - l)/(h - l), 0, 1)` between the correction dimensions
  :math:`l, h` of ``beta_fast`` and ``beta_slow`` (floored and ceiled unless
  ``truncate=False``); :math:`a` = ``attention_factor``, or :math:`0.1 \ln s + 1`, or the ratio
  of the two mscales;
* ``llama3``: :math:`\omega = \Theta^{-\tau}` for wavelengths :math:`2\pi/\omega` below
  :math:`L_0/`\ ``high_freq_factor``, :math:`\Theta^{-\tau}/s` above :math:`L_0/`\
  ``low_freq_factor``, and in between :math:`(1 - g)\,\Theta^{-\tau}/s + g\,\Theta^{-\tau}` with
  :math:`g = (L_0 \omega/2\pi - \text{low})/(\text{high} - \text{low})`; :math:`a = 1`;
* ``longrope``: :math:`\omega_i = \Theta^{-\tau_i}/f_i` with :math:`f` = ``short_factor`` at
  :math:`L \le L_0` and ``long_factor`` at :math:`L > L_0`;
  :math:`a = \sqrt{1 + \ln s/\ln L_0}` (:math:`s` = ``factor`` or
  ``max_position_embeddings`` / :math:`L_0`), or ``attention_factor``.

``partial_rotary_factor`` :math:`\rho` rotates the first :math:`d_r = \lfloor \rho d_h \rfloor`
head features: the frequencies have :math:`d_r/2` entries, :math:`\tau = 2i/d_r`.

The length :math:`L` of ``dynamic`` and ``longrope`` is the context length of the grids (the
number of tokens of the input in ``run``, padding included: HuggingFace's
``max(position_ids) + 1`` for the default ids ``0, ..., N - 1``; ``generate()`` counts from the
first real token, so it takes the longest real length of a left-padded batch instead).
HuggingFace's dynamic module also remembers the longest length it has seen until a call
shorter than :math:`L_0`; the continuous model has no such state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import validation
from ..operators.positions import LengthFrequencies

__all__ = ["SUPPORTED_ROPE_TYPES", "RopeScaling", "DynamicNTK", "LongRoPE", "rope_parameters",
           "rope_from_config", "scaled_frequencies"]

#: The keys each ``rope_type`` may carry beside ``rope_type``, ``rope_theta`` and ``partial_rotary_factor``.
_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "original_max_position_embeddings", "truncate"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "factor", "attention_factor", "original_max_position_embeddings"),
}
#: The HuggingFace ``rope_type`` values converted.
SUPPORTED_ROPE_TYPES = tuple(_KEYS)
_COMMON = ("rope_type", "rope_theta", "partial_rotary_factor")


def rope_parameters(cfg) -> dict:
    """The RoPE parameters of a configuration as one dict (transformers 5 ``rope_parameters``, or
    transformers 4 ``rope_theta`` and ``rope_scaling``), checked against :data:`SUPPORTED_ROPE_TYPES`.

    ``"type"`` (the old name of ``"rope_type"``, which transformers 5 keeps beside it) is dropped,
    ``"rope_type"`` read first. A transformers 4 ``longrope`` configuration with
    ``original_max_position_embeddings`` on the configuration (Phi-3) gets that :math:`L_0` and
    the factor ``max_position_embeddings`` :math:`/ L_0`, as transformers 4 computes them.

    Raises
    ------
    ValueError
        For an unknown ``rope_type`` (the supported ones are listed), keys the type does not
        take, or no ``rope_theta``.
    """
    params = getattr(cfg, "rope_parameters", None)
    legacy = params is None
    if legacy:  # transformers 4
        params = {"rope_theta": getattr(cfg, "rope_theta", 10000.0), **dict(getattr(cfg, "rope_scaling", None) or {})}
    params = dict(params)
    # "type" is the old name of "rope_type": transformers 5 keeps it beside "rope_type" in
    # rope_parameters (a configuration saved with rope_scaling={"type": ...}); both versions read
    # "rope_type" first
    old_name = params.pop("type", None)
    params.setdefault("rope_type", old_name or "default")
    kind = params["rope_type"]
    if legacy and kind == "longrope" and getattr(cfg, "original_max_position_embeddings", None):
        # transformers 4 reads Phi-3's L0 from the configuration, not rope_scaling, with the
        # factor max_position_embeddings / L0 (transformers 5 moves it into rope_parameters)
        params["original_max_position_embeddings"] = cfg.original_max_position_embeddings
        params["factor"] = float(cfg.max_position_embeddings) / float(cfg.original_max_position_embeddings)
    if kind not in _KEYS:
        raise ValueError(f"rope_type={kind!r} is not modelled; supported rope types: {list(SUPPORTED_ROPE_TYPES)}")
    unknown = sorted(set(params) - set(_COMMON) - set(_KEYS[kind]))
    if unknown:
        raise ValueError(f"rope_parameters keys {unknown} are not modelled for rope_type={kind!r} (it takes "
                         f"{list(_COMMON) + list(_KEYS[kind])})")
    if "rope_theta" not in params:
        raise ValueError("rope_parameters has no 'rope_theta': the RoPE base is needed to compute the "
                         "frequencies; set config.rope_parameters['rope_theta']")
    return params


@dataclass(frozen=True)
class DynamicNTK(LengthFrequencies):
    r"""Dynamic NTK frequencies :math:`\Theta_L^{-2i/d_r}`,
    :math:`\Theta_L = \Theta (s \max(L, L_0)/L_0 - (s - 1))^{d_r/(d_r - 2)}`."""

    theta: float
    rotary_dim: int
    factor: float
    original_length: float

    def at(self, length: float) -> np.ndarray:
        length = max(float(length), float(self.original_length))
        dim = self.rotary_dim
        base = self.theta * (self.factor * length / self.original_length - (self.factor - 1.0)) ** (dim / (dim - 2))
        return _powers(base, dim)


@dataclass(frozen=True)
class LongRoPE(LengthFrequencies):
    """LongRoPE frequencies: the ``short`` table at :math:`L \\le L_0`, the ``long`` one above."""

    short: tuple
    long: tuple
    original_length: float

    def at(self, length: float) -> np.ndarray:
        return np.array(self.long if float(length) > self.original_length else self.short, dtype=np.float64)


@dataclass(frozen=True)
class RopeScaling:
    """A configuration's RoPE: ``frequencies`` (a float64 table or a :class:`LengthFrequencies`),
    the ``attention_scaling`` :math:`a` of cos and sin (score temperature :math:`a^2`), the
    ``rope_type``, ``rope_theta`` and the rotated ``rotary_dim`` of ``head_dim``."""

    kind: str
    theta: float
    head_dim: int
    rotary_dim: int
    frequencies: object
    attention_scaling: float

    def table(self, length=None) -> np.ndarray:
        """The frequency table at context ``length`` (needed only for dynamic and longrope)."""
        if isinstance(self.frequencies, LengthFrequencies):
            if length is None:
                raise ValueError(f"rope_type={self.kind!r} depends on the sequence length: pass length=")
            return self.frequencies.at(length)
        return self.frequencies


def _powers(base: float, dim: int) -> np.ndarray:
    r""":math:`\text{base}^{-2i/d}`, :math:`i < d/2`, in float64 (HuggingFace's expression)."""
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def _original_length(params, cfg) -> float:
    value = params.get("original_max_position_embeddings") or getattr(cfg, "max_position_embeddings", None)
    if value is None:
        raise ValueError(f"rope_type={params['rope_type']!r} needs original_max_position_embeddings (or the "
                         "configuration's max_position_embeddings)")
    return float(validation.real(value, "original_max_position_embeddings", positive=True))


def _factor(params, cfg, original=None) -> float:
    factor = params.get("factor")
    if factor is None and original is not None:  # yarn, longrope: max_position_embeddings / L0
        factor = float(cfg.max_position_embeddings) / original
    return float(validation.real(factor, "rope_parameters['factor']", positive=True))


def _yarn(params, cfg, theta, dim):
    original = _original_length(params, cfg)
    factor = _factor(params, cfg, original)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if (m and m_all) else mscale(factor)
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(fast), correction(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HuggingFace's guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    default = _powers(theta, dim)
    return default / factor * ramp + default * (1.0 - ramp), float(attention)


def _llama3(params, cfg, theta, dim):
    original = _original_length(params, cfg)
    factor = _factor(params, cfg)
    low = float(validation.real(params["low_freq_factor"], "low_freq_factor", positive=True))
    high = float(validation.real(params["high_freq_factor"], "high_freq_factor", positive=True))
    default = _powers(theta, dim)
    wavelength = 2 * math.pi / default
    smooth = (original / wavelength - low) / (high - low)
    out = np.where(wavelength > original / low, default / factor, default)
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return np.where(medium, (1.0 - smooth) * default / factor + smooth * default, out), 1.0


def _longrope(params, cfg, theta, dim):
    original = _original_length(params, cfg)
    factor = _factor(params, cfg, original)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    tables = []
    for name in ("short_factor", "long_factor"):
        values = np.asarray(params[name], dtype=np.float64)
        if values.shape != (dim // 2,) or not np.all(values > 0):
            raise ValueError(f"rope_parameters[{name!r}] must hold {dim // 2} positive numbers (rotary_dim / 2), "
                             f"got shape {values.shape}")
        tables.append(tuple((_powers(theta, dim) / values).tolist()))
    return LongRoPE(tables[0], tables[1], original), float(attention)


def rope_from_config(cfg) -> RopeScaling:
    r"""The float64 RoPE of a HuggingFace configuration: frequencies and attention scaling.

    Computed in float64 NumPy from the configuration (module docstring for the formulas);
    HuggingFace's ``ROPE_INIT_FUNCTIONS`` compute the same numbers in float32.

    Raises
    ------
    ValueError
        For a ``rope_type`` not in :data:`SUPPORTED_ROPE_TYPES` (listed in the message), keys it
        does not take, an odd rotated dimension, or out-of-range factors.
    """
    params = rope_parameters(cfg)
    kind, theta = params["rope_type"], float(validation.real(params["rope_theta"], "rope_theta", positive=True))
    head_dim = int(getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // int(cfg.num_attention_heads))
    partial = float(validation.real(params.get("partial_rotary_factor", 1.0), "partial_rotary_factor", positive=True))
    dim = int(head_dim * partial)
    if dim % 2 or dim < 2 or (kind == "dynamic" and dim < 4):
        raise ValueError(f"the rotated head features (head_dim={head_dim} x partial_rotary_factor={partial:g} = "
                         f"{dim}) must be an even number of at least {4 if kind == 'dynamic' else 2}")
    attention = 1.0
    if kind == "default":
        frequencies = _powers(theta, dim)
    elif kind == "linear":
        frequencies = _powers(theta, dim) / _factor(params, cfg)
    elif kind == "dynamic":
        frequencies = DynamicNTK(theta, dim, _factor(params, cfg), float(cfg.max_position_embeddings))
    else:
        frequencies, attention = {"yarn": _yarn, "llama3": _llama3, "longrope": _longrope}[kind](params, cfg, theta, dim)
    if isinstance(frequencies, np.ndarray):
        frequencies.setflags(write=False)
    return RopeScaling(kind, theta, head_dim, dim, frequencies, attention)


def scaled_frequencies(cfg, length=None) -> tuple[np.ndarray, float]:
    r"""``(omega, attention_scaling)`` of a configuration at sequence ``length`` (float64).

    ``omega`` has ``rotary_dim / 2`` entries; ``length`` is needed only for ``dynamic`` and
    ``longrope`` (for ``dynamic`` at :math:`L \le L_0` and ``longrope`` at :math:`L \le L_0`
    the frequencies are those HuggingFace holds after initialization).
    """
    scaling = rope_from_config(cfg)
    return np.asarray(scaling.table(length), dtype=np.float64), scaling.attention_scaling
