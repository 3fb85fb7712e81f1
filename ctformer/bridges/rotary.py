r"""Rotary positions of converted networks, and float64 HuggingFace references.

The frequencies of a converted network come from its configuration in float64
(:func:`~ctformer.bridges.rope_scaling.rope_from_config`), never from the float32
``rotary_emb.inv_freq`` buffer, which is only checked (:func:`check_rotary`).

Partial rotary (``partial_rotary_factor`` :math:`\rho < 1`, GPT-NeoX, Phi-3): HuggingFace
rotates the first :math:`d_r = \rho d_h` features of each head, pairing :math:`i` with
:math:`i + d_r/2`, and passes the others through. :class:`~ctformer.operators.RoPE` pairs
:math:`\sigma` with :math:`\sigma + 1/2` over the whole head, so the converter reorders the
head features of queries and keys (:func:`partial_rotary_order`) to
:math:`[r_{<d_r/2}, p_{<(d_h - d_r)/2}, r_{\ge d_r/2}, p_{\ge (d_h - d_r)/2}]` and gives the
pass-through pairs the frequency :math:`\omega = 0` (a rotation by angle 0 is the identity).
Scores :math:`q \cdot k` do not depend on the order of the head features, so the network is
unchanged; in the continuum :math:`\omega(\tau) = 0` on :math:`\tau \ge \rho`. HuggingFace
multiplies :math:`\cos` and :math:`\sin` by the attention scaling :math:`a`, so only the rotated
features of queries and keys carry it: their rows of the query and key projections are
multiplied by :math:`a` (:func:`partial_rotary_gains`) instead of a temperature :math:`a^2` on
the whole score.
"""
from __future__ import annotations

import functools
import types
from dataclasses import dataclass

import numpy as np

from ..operators import RoPE
from ..operators.positions import LengthFrequencies
from ..validation import is_real
from .common import to_numpy
from .rope_scaling import DynamicNTK, LongRoPE, RopeScaling, rope_from_config, rope_parameters

__all__ = ["rope_scaling_of", "rope_positions", "partial_rotary_order", "partial_rotary_gains", "check_rotary",
           "rope_frequencies", "float64_reference", "native_frequencies", "ZeroPadded"]


def rope_scaling_of(cfg, family: str = "llama", partial: bool = False) -> RopeScaling:
    """The configuration's float64 RoPE; a ``partial_rotary_factor`` other than 1 is refused unless
    ``partial`` (HuggingFace's Llama family rotates every head feature), naming the family
    whatever rotated width the factor gives."""
    factor = rope_parameters(cfg).get("partial_rotary_factor")
    # refused before the rotated width is derived: its checks (an odd width) would name another cause
    if not partial and is_real(factor) and float(factor) != 1.0:
        raise ValueError(f"partial_rotary_factor={factor!r} is not modelled for the {family.capitalize()} family: "
                         "HuggingFace rotates every head feature there (apply_rotary_pos_emb); set it to 1.0")
    return rope_from_config(cfg)  # any other factor value is refused there, by name


@dataclass(frozen=True)
class ZeroPadded(LengthFrequencies):
    """Length-dependent frequencies followed by ``zeros`` pass-through pairs (frequency 0)."""

    inner: LengthFrequencies
    zeros: int

    def at(self, length: float) -> np.ndarray:
        return np.concatenate([np.asarray(self.inner.at(length), dtype=np.float64), np.zeros(self.zeros)])


def rope_positions(scaling: RopeScaling) -> RoPE:
    """The :class:`~ctformer.operators.RoPE` of a scaling: ``d_h / 2`` frequencies, the last
    ``(d_h - d_r) / 2`` zero for partial rotary (module docstring)."""
    zeros = (scaling.head_dim - scaling.rotary_dim) // 2
    frequencies = scaling.frequencies
    if zeros:
        if isinstance(frequencies, LengthFrequencies):
            frequencies = ZeroPadded(frequencies, zeros)
        else:
            frequencies = np.concatenate([np.asarray(frequencies), np.zeros(zeros)])
    return RoPE(theta=scaling.theta, frequencies=frequencies)


def partial_rotary_order(head_dim: int, rotary_dim: int) -> np.ndarray:
    """The head-feature order that puts HuggingFace's partial rotary pairs at ``(s, s + d_h/2)``.

    Raises
    ------
    ValueError
        If ``head_dim - rotary_dim`` is odd (the pass-through features cannot be paired).
    """
    if (head_dim - rotary_dim) % 2:
        raise ValueError(f"partial rotary with head_dim={head_dim} and rotary_dim={rotary_dim}: the "
                         f"{head_dim - rotary_dim} pass-through features must be an even number")
    r, p = rotary_dim // 2, (head_dim - rotary_dim) // 2
    rot, rest = np.arange(rotary_dim), np.arange(rotary_dim, head_dim)
    return np.concatenate([rot[:r], rest[:p], rot[r:], rest[p:]])


def partial_rotary_gains(head_dim: int, rotary_dim: int, scale: float) -> np.ndarray:
    """The factor of each head feature of queries and keys in the order of
    :func:`partial_rotary_order`: the attention scaling ``scale`` on the rotated features, 1 on
    the pass-through ones (HuggingFace scales cos and sin, which touch only the rotated ones)."""
    gains = np.ones(head_dim)
    half, r = head_dim // 2, rotary_dim // 2
    gains[:r] = gains[half:half + r] = float(scale)
    return gains


def rope_frequencies(cfg, length=None) -> np.ndarray:
    r"""The RoPE frequencies of a Llama-family configuration, computed in float64.

    :math:`\omega_i = \Theta^{-2i/d_h}` without scaling, or the scaled frequencies of the
    ``rope_type`` (:mod:`ctformer.bridges.rope_scaling`); ``length`` is the sequence length
    for ``dynamic`` and ``longrope`` (default :math:`L_0`, what HuggingFace holds after
    initialization). HuggingFace's float32 ``inv_freq`` is never read for them.

    Returns
    -------
    ndarray, shape (head_dim / 2,), float64

    Raises
    ------
    ValueError
        For a RoPE type that is not modelled, ``partial_rotary_factor != 1``, or an odd ``head_dim``.
    """
    scaling = rope_scaling_of(cfg)
    if isinstance(scaling.frequencies, LengthFrequencies):
        return scaling.frequencies.at(scaling.frequencies.original_length if length is None else length)
    return np.array(scaling.frequencies)


def native_frequencies(theta: float, head_dim: int) -> np.ndarray:
    r"""The HuggingFace RoPE frequencies :math:`\Theta^{-2i/d_h}`, :math:`i < d_h/2`, in float64."""
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


#: Rounding an ``inv_freq`` buffer may carry: a bfloat16 cast and float16's subnormal spacing.
_BUFFER_RTOL, _BUFFER_ATOL = 2.0 ** -8, 2.0 ** -24


def _buffer_tables(scaling, rotary) -> list:
    frequencies = scaling.frequencies
    if isinstance(frequencies, DynamicNTK):
        return [frequencies.at(float(rotary.max_seq_len_cached))]
    if isinstance(frequencies, LongRoPE):
        return [frequencies.at(frequencies.original_length), frequencies.at(frequencies.original_length + 1)]
    return [np.asarray(frequencies)]


def check_rotary(rotary, scaling) -> None:
    r"""Refuse a rotary module whose ``inv_freq`` or ``attention_scaling`` is not the configuration's.

    Accepted where :math:`|\texttt{inv\_freq}_i - \omega_i| \le 2^{-8} \omega_i + 2^{-24}` (float32
    and half-precision rounding); ``attention_scaling`` must agree to :math:`10^{-12}`.
    """
    name = "rotary_emb.inv_freq"
    table = to_numpy(rotary.inv_freq, name)
    errors = []
    for frequencies in _buffer_tables(scaling, rotary):
        if table.shape != frequencies.shape:
            raise ValueError(f"{name} has shape {table.shape}, expected {frequencies.shape} (rotary_dim / 2)")
        error = np.abs(table - frequencies)
        if np.all(error <= _BUFFER_RTOL * frequencies + _BUFFER_ATOL):
            break
        errors.append(float(np.max(error / frequencies)))
    else:
        raise ValueError(
            f"{name} differs from the configuration's frequencies (rope_type={scaling.kind!r}, "
            f"rope_theta={scaling.theta:g}) by up to {min(errors):.2e} relative, more "
            "than the rounding of a bfloat16 cast (2^-8): the frequencies are computed from the "
            "configuration, so describe the model's RoPE in config.rope_parameters (or restore "
            "inv_freq) before converting")
    held = float(rotary.attention_scaling)
    if abs(held - scaling.attention_scaling) > 1e-12 * scaling.attention_scaling:
        raise ValueError(f"rotary_emb.attention_scaling={held!r} differs from the configuration's "
                         f"{scaling.attention_scaling!r} (rope_type={scaling.kind!r}): restore it or describe "
                         "the model's RoPE in config.rope_parameters")


# -- a float64 reference --------------------------------------------------------------------
def _rms_norm_float64(self, hidden_states, offset=0.0):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return (offset + self.weight) * (hidden_states * (variance + _eps(self)).rsqrt())


def _eps(module):
    return module.variance_epsilon if hasattr(module, "variance_epsilon") else module.eps


def _rotary_float64(self, x, position_ids, scaling=None):
    """HuggingFace's rotary forward with float64 angles (length-dependent tables at
    ``max(position_ids) + 1``, as a fresh HuggingFace module), cos and sin times the attention scaling."""
    import torch

    inv_freq = self.inv_freq
    if isinstance(scaling.frequencies, LengthFrequencies):
        inv_freq = torch.from_numpy(scaling.frequencies.at(int(position_ids.max()) + 1))
    angles = position_ids[..., None].to(inv_freq.dtype) * inv_freq
    both = torch.cat((angles, angles), dim=-1)
    a = scaling.attention_scaling
    return (both.cos() * a).to(x.dtype), (both.sin() * a).to(x.dtype)


def _sdpa_float64(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA in the inputs' dtype for models whose eager path takes the softmax in float32."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    softcap = kwargs.pop("softcap", None)
    kwargs.pop("sliding_window", None)  # already in attention_mask
    if softcap is not None:
        return _capped_float64(module, query, key, value, attention_mask, scaling, softcap)
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  **kwargs)


def _capped_float64(module, query, key, value, attention_mask, scaling, softcap):
    """HuggingFace's eager attention with soft-capping (Gemma 2), its softmax in float64:
    scores ``q k^T scaling``, then ``c tanh(s / c)``, then the mask, softmax, times ``v``."""
    import torch
    from transformers.models.gemma2.modeling_gemma2 import repeat_kv

    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if attention_mask is None:  # a causal network's mask is always materialized (_materialized_mask)
        raise RuntimeError("the float64 reference got no attention mask for a soft-capped attention: "
                           "its causal and sliding-window masks would be lost; this transformers "
                           "version builds masks in a way float64_reference does not know")
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    scores = softcap * torch.tanh(scores / softcap)
    mask = attention_mask[:, :, :, : key.shape[-2]]
    # the most negative finite score, not -inf: a padding query without keys (left padding) gets
    # finite weights, and no NaN reaches the real tokens through its values in the next layer
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _materialized_mask(*args, **kwargs):
    """HuggingFace's boolean SDPA mask, always built. SDPA's own mask function returns None
    for a causal mask without padding (SDPA then applies causality itself); the soft-capped
    path computes its scores by hand and needs the mask as an array."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _float64_attention(model) -> str:
    """``"sdpa"``, or for a class that refuses it (Gemma 2: for its softcapping) the same SDPA
    forward registered under another name, with masks that are always materialized."""
    if getattr(model, "_supports_sdpa", False):
        return "sdpa"
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register("ctformer_float64", _sdpa_float64)
    AttentionMaskInterface.register("ctformer_float64", _materialized_mask)
    return "ctformer_float64"


def float64_reference(model):
    r"""Make a HuggingFace RoPE network (Llama family, Phi-3, GPT-NeoX, Gemma, Gemma 2) a float64
    reference, in place.

    Cast to float64, evaluation mode; attention through PyTorch's SDPA (float64 softmax instead
    of the eager path's float32 one; Gemma 2's soft-capped scores by HuggingFace's eager formula
    with a float64 softmax, its causal and sliding-window masks always built); ``inv_freq``
    recomputed in float64 from the configuration, angles formed in float64, cos and sin times
    the float64 attention scaling (``dynamic`` and ``longrope`` at the call's
    ``max(position_ids) + 1``); every RMSNorm computes in float64 (gain :math:`w`, or
    :math:`1 + w` for Gemma).

    Raises
    ------
    TypeError
        If ``model`` is not a registered RoPE network.
    ValueError
        If its RoPE type is not modelled, or ``inv_freq`` / ``attention_scaling`` is not the
        configuration's (edited in place).
    """
    import torch

    from .spec import spec_for

    spec = spec_for(model)
    if spec is None or not spec.rope:
        rope = [name for name, s in _registered().items() if s.rope]
        raise TypeError(f"float64_reference supports {', '.join(rope)}; got {type(model).__qualname__}")
    scaling = rope_scaling_of(model.config, spec.family, spec.partial_rotary)
    check_rotary(model.rotary_emb, scaling)
    frequencies = scaling.table(scaling.frequencies.original_length) if isinstance(
        scaling.frequencies, LengthFrequencies) else np.array(scaling.frequencies)
    model.double().eval()
    model.set_attn_implementation(_float64_attention(model))
    rotary = model.rotary_emb
    rotary.inv_freq = torch.from_numpy(frequencies)
    rotary.forward = types.MethodType(functools.partial(_rotary_float64, scaling=scaling), rotary)
    if spec.norm_kind != "layer":
        norm_class = type(getattr(model, spec.final))
        offset = 1.0 if spec.norm_kind == "rms_offset" else 0.0
        for module in model.modules():
            if isinstance(module, norm_class):
                module.forward = types.MethodType(functools.partial(_rms_norm_float64, offset=offset), module)
    return model


def _registered():
    from .spec import ARCHITECTURES

    return ARCHITECTURES
