r"""Convert HuggingFace Llama-family decoders (``LlamaModel``, ``MistralModel``, ``Qwen2Model``).

A Llama decoder layer is pre-norm with RMSNorm, rotary positions, grouped-query causal
attention and a SwiGLU feed-forward layer (design notes, section 10):

.. math::

    u \leftarrow u + \mathrm{Attn}(N_1 u), \qquad u \leftarrow u + F(N_2 u), \qquad
    F(u) = W_{\mathrm{down}}\big(\phi(W_{\mathrm{gate}} u) \odot W_{\mathrm{up}} u\big),

with ``input_layernorm`` as :math:`N_1`, ``post_attention_layernorm`` as :math:`N_2` (RMSNorm
with gain ``weight`` and :math:`\varepsilon` = ``rms_norm_eps``), ``q_proj``, ``k_proj``,
``v_proj`` (``num_key_value_heads`` key/value heads), ``o_proj`` and the final ``norm``.
Queries and keys are rotated by :class:`~ctformer.operators.positions.RoPE` with the network's
frequencies :math:`\omega_i = \Theta^{-2i/d_h}`, :math:`i < d_h/2` (:math:`\Theta` =
``rope_theta``, :math:`d_h` = ``head_dim``), computed in float64 from the configuration
(:func:`rope_frequencies`), never read from the ``inv_freq`` buffer of ``rotary_emb``, which
HuggingFace computes in float32 (``0.0099999998`` for ``0.01``); the score scale is
:math:`1/\sqrt{d_h}` (:math:`\beta_h = \sqrt{d_h}`, ``head_dim`` need not be
``hidden_size / heads``) and the mask is causal; Mistral's ``sliding_window`` and Qwen2's
sliding layers (``layer_types``) add the window :math:`0 \le p(x) - p(x') < W`.
``run`` on ``N`` tokens uses positions :math:`0, \dots, N - 1` (HuggingFace's default
``position_ids``); ``solve`` needs a ``context_length``.

:func:`float64_reference` turns a HuggingFace model of this family into a true float64
reference: in float64 HuggingFace still forms the RoPE angles and the RMSNorm variance in
float32 (and the eager softmax), about 1e-7 off.

Weights may be float16, bfloat16, float32 or float64: they are copied to float64 exactly
(:func:`ctformer.bridges.common.to_numpy`). A model cast with ``model.to(torch.bfloat16)``
also rounds its ``inv_freq`` buffer to bfloat16 (HuggingFace then rotates by those rounded
frequencies); the converted model keeps the configuration's frequencies.
"""
from __future__ import annotations

import functools
import math
import types

import numpy as np

from ..discretizations import Midpoint
from ..model import Block, ContinuousTransformer
from ..operators import RoPE
from ..operators.positions import LengthFrequencies
from .common import gated_feedforward_from_weights, grouped_attention_from_weights, rms_norm_from_weights, to_numpy
from .huggingface import HF_ACTIVATIONS
from .rope_scaling import DynamicNTK, LongRoPE, RopeScaling, rope_from_config, rope_parameters

__all__ = ["from_llama", "float64_reference", "rope_frequencies", "SUPPORTED_LLAMA"]

#: HuggingFace classes converted by :func:`from_llama` (those the installed transformers has).
SUPPORTED_LLAMA = ("LlamaModel", "MistralModel", "Qwen2Model")
_LAYER_TYPES = ("full_attention", "sliding_attention")


def _classes():
    import transformers

    return tuple(getattr(transformers, name) for name in SUPPORTED_LLAMA if hasattr(transformers, name))


def _scaling(cfg) -> RopeScaling:
    """The configuration's float64 RoPE (:func:`~ctformer.bridges.rope_scaling.rope_from_config`), with
    every head feature rotated (HuggingFace's Llama rotates them all)."""
    scaling = rope_from_config(cfg)
    if scaling.rotary_dim != scaling.head_dim:
        factor = rope_parameters(cfg).get("partial_rotary_factor")
        raise ValueError(f"partial_rotary_factor={factor!r} is not modelled for the Llama family: HuggingFace's "
                         "Llama rotates every head feature (apply_rotary_pos_emb); set it to 1.0")
    return scaling


def _head_dim(cfg) -> int:
    """``head_dim`` of the configuration, or ``hidden_size / num_attention_heads`` (HuggingFace's rule)."""
    return int(getattr(cfg, "head_dim", None) or int(cfg.hidden_size) // int(cfg.num_attention_heads))


def rope_frequencies(cfg, length=None) -> np.ndarray:
    r"""The RoPE frequencies of a Llama-family configuration, computed in float64.

    Without scaling (``rope_type='default'``)

    .. math::

        \omega_i = \Theta^{-2i/d_h}, \qquad i = 0, \dots, d_h/2 - 1,

    with :math:`\Theta` = ``rope_theta`` (transformers 5: ``config.rope_parameters``; 4:
    ``config.rope_theta``) and :math:`d_h` = ``head_dim`` (default ``hidden_size /
    num_attention_heads``); a ``rope_type`` of :data:`~ctformer.bridges.rope_scaling.SUPPORTED_ROPE_TYPES`
    gives its scaled frequencies (:mod:`ctformer.bridges.rope_scaling`). HuggingFace's
    ``rotary_emb.inv_freq`` holds the same numbers computed in float32 (relative error
    :math:`7 \cdot 10^{-8}` for :math:`\Theta = 10^4`, which moves the angles at position 511 by
    up to :math:`1.5 \cdot 10^{-5}` rad with :math:`d_h = 128`): it is never read for the
    frequencies.

    Parameters
    ----------
    cfg : transformers LlamaConfig, MistralConfig or Qwen2Config
    length : int, optional
        The sequence length, for ``rope_type`` ``dynamic`` and ``longrope`` only (default: the
        frequencies HuggingFace holds after initialization, at :math:`L_0`).

    Returns
    -------
    ndarray, shape (head_dim / 2,), float64

    Raises
    ------
    ValueError
        For a RoPE type that is not modelled (named in the message, with the supported ones),
        ``partial_rotary_factor != 1``, or an odd ``head_dim``.
    """
    scaling = _scaling(cfg)
    if isinstance(scaling.frequencies, LengthFrequencies):
        return scaling.frequencies.at(_initial_length(scaling) if length is None else length)
    return np.array(scaling.frequencies)


def _initial_length(scaling) -> float:
    """The length at which HuggingFace initializes a length-dependent RoPE (``L_0``)."""
    return scaling.frequencies.original_length


#: Relative and absolute rounding an ``inv_freq`` buffer may carry: that of a bfloat16 cast
#: (8 significant bits) and float16's subnormal spacing (it flushes frequencies below 3e-8).
_BUFFER_RTOL, _BUFFER_ATOL = 2.0 ** -8, 2.0 ** -24


def _buffer_tables(scaling, rotary) -> list:
    """The frequency tables HuggingFace's rotary module may hold: the fixed table, the dynamic
    table at the longest length it has seen, or LongRoPE's short or long table."""
    frequencies = scaling.frequencies
    if isinstance(frequencies, DynamicNTK):
        return [frequencies.at(float(rotary.max_seq_len_cached))]
    if isinstance(frequencies, LongRoPE):
        return [frequencies.at(frequencies.original_length), frequencies.at(frequencies.original_length + 1)]
    return [np.asarray(frequencies)]


def _check_rotary(rotary, scaling) -> None:
    r"""Refuse a rotary module whose ``inv_freq`` or ``attention_scaling`` is not the configuration's.

    The buffer carries float32 rounding (HuggingFace computes it in float32) and, after a cast
    such as ``model.to(torch.bfloat16)`` (even one followed by ``.double()``), the rounding of
    half precision: it is accepted where
    :math:`|\texttt{inv\_freq}_i - \omega_i| \le 2^{-8} \omega_i + 2^{-24}`. A buffer
    further off (edited in place, e.g. a hand-made position interpolation) belongs to a network
    that the configuration does not describe. ``attention_scaling`` (a Python float computed by
    HuggingFace with the same formula) must agree to :math:`10^{-12}`.
    """
    name = "rotary_emb.inv_freq"
    table = to_numpy(rotary.inv_freq, name)
    errors = []
    for frequencies in _buffer_tables(scaling, rotary):
        if table.shape != frequencies.shape:
            raise ValueError(f"{name} has shape {table.shape}, expected {frequencies.shape} (head_dim / 2)")
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


def _layer_windows(cfg, n_layers):
    """Sliding window of each layer (None = full causal attention)."""
    window = getattr(cfg, "sliding_window", None)
    types_ = getattr(cfg, "layer_types", None)
    if types_ is None:
        return [window] * n_layers
    out = []
    for i, kind in enumerate(list(types_)[:n_layers]):
        if kind not in _LAYER_TYPES:
            raise ValueError(f"layer_types[{i}]={kind!r} is not modelled; supported: {list(_LAYER_TYPES)}")
        if kind == "sliding_attention" and window is None:
            raise ValueError(f"layer_types[{i}]='sliding_attention' without a sliding_window")
        out.append(window if kind == "sliding_attention" else None)
    return out


def from_llama(model) -> ContinuousTransformer:
    r"""The continuous Transformer whose discrete limit is a Llama-family decoder.

    Parameters
    ----------
    model : transformers LlamaModel, MistralModel or Qwen2Model
        In memory, with float16, bfloat16, float32 or float64 weights (copied to float64
        exactly). The RoPE frequencies are computed in float64 from the configuration
        (:func:`rope_frequencies`, with any RoPE scaling of
        :mod:`ctformer.bridges.rope_scaling`), not copied from the float32
        ``rotary_emb.inv_freq``; the rotary ``attention_scaling`` :math:`a` becomes the score
        temperature :math:`\beta_h = a^2 \sqrt{d_h}`; ``dynamic`` and ``longrope`` take their
        frequencies at the context length (``N`` in ``run``).

    Returns
    -------
    ContinuousTransformer
        Pre-norm blocks (RMSNorm, grouped-query causal attention with RoPE, SwiGLU) and the
        final RMSNorm; ``features = Midpoint(hidden_size)``, ``head_features =
        Midpoint(head_dim)``, ``hidden = Midpoint(intermediate_size)``. ``run(x,
        padding_mask)`` takes ``hidden_states[0]`` (the token embeddings) and returns
        ``last_hidden_state``.

    Raises
    ------
    TypeError
        If ``model`` is not one of the supported classes.
    ValueError
        For configuration options that are not modelled, named in the message: a RoPE type
        not in :data:`~ctformer.bridges.rope_scaling.SUPPORTED_ROPE_TYPES` (listed),
        ``partial_rotary_factor != 1``, an unknown activation or layer type, or an odd
        ``head_dim``; an ``inv_freq`` buffer or ``attention_scaling`` that differs from the
        configuration's by more than rounding (edited in place).
    TypeError
        For weights of another dtype (integer or quantized), named in the message.
    """
    classes = _classes()
    if not isinstance(model, classes):
        raise TypeError(f"from_llama supports {', '.join(c.__name__ for c in classes)}; "
                        f"got {type(model).__qualname__}")
    cfg = model.config
    scaling = _scaling(cfg)
    _check_rotary(model.rotary_emb, scaling)
    act = cfg.hidden_act
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(f"hidden_act={act!r} is not modelled; supported: {sorted(HF_ACTIVATIONS)}")
    d, heads = int(cfg.hidden_size), int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = _head_dim(cfg)
    positions = RoPE(theta=scaling.theta, frequencies=scaling.frequencies)
    # HuggingFace multiplies cos and sin by a: every score q.k by a^2, the temperature a^2 beta
    beta = math.sqrt(head_dim) * scaling.attention_scaling ** 2
    eps = float(cfg.rms_norm_eps)
    state = model.state_dict()
    n_layers = len(model.layers)
    windows = _layer_windows(cfg, n_layers)

    def weight(name, optional=False):
        if name not in state:
            if optional:
                return None
            raise ValueError(f"missing weight {name}")
        return to_numpy(state[name], name)

    blocks = []
    for i in range(n_layers):
        p = f"layers.{i}."
        a = p + "self_attn."
        attention = grouped_attention_from_weights(
            weight(a + "q_proj.weight"), weight(a + "k_proj.weight"), weight(a + "v_proj.weight"),
            weight(a + "o_proj.weight"), weight(a + "q_proj.bias", True), weight(a + "k_proj.bias", True),
            weight(a + "v_proj.bias", True), weight(a + "o_proj.bias", True),
            heads=heads, kv_heads=kv_heads, head_dim=head_dim, beta=beta, mask="causal", positions=positions,
            window=windows[i])
        m = p + "mlp."
        feedforward = gated_feedforward_from_weights(
            weight(m + "gate_proj.weight"), weight(m + "gate_proj.bias", True),
            weight(m + "up_proj.weight"), weight(m + "up_proj.bias", True),
            weight(m + "down_proj.weight"), weight(m + "down_proj.bias", True), HF_ACTIVATIONS[act])
        norms = [rms_norm_from_weights(weight(p + f"{n}.weight"), eps)
                 for n in ("input_layernorm", "post_attention_layernorm")]
        blocks.append(Block(attention, feedforward, norms[0], norms[1], placement="pre"))
    final = rms_norm_from_weights(weight("norm.weight"), eps)
    d_ff = int(cfg.intermediate_size)
    return ContinuousTransformer(blocks, final_normalization=final, head_features=Midpoint(head_dim),
                                 hidden=Midpoint(d_ff), features=Midpoint(d))


# -- a float64 reference --------------------------------------------------------------------
def _rms_norm_float64(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * (variance + self.variance_epsilon).rsqrt())


def _rotary_float64(self, x, position_ids, scaling=None):
    """HuggingFace's rotary forward with float64 angles; a length-dependent RoPE takes its table at
    ``max(position_ids) + 1`` (what HuggingFace's ``dynamic_rope_update`` does for a fresh module),
    and cos and sin are multiplied by the attention scaling."""
    import torch

    inv_freq = self.inv_freq
    if isinstance(scaling.frequencies, LengthFrequencies):
        inv_freq = torch.from_numpy(scaling.frequencies.at(int(position_ids.max()) + 1))
    angles = position_ids[..., None].to(inv_freq.dtype) * inv_freq
    both = torch.cat((angles, angles), dim=-1)
    a = scaling.attention_scaling
    return (both.cos() * a).to(x.dtype), (both.sin() * a).to(x.dtype)


def float64_reference(model):
    r"""Make a Llama-family HuggingFace model a float64 reference, in place.

    The model is cast to float64 and put in evaluation mode; the attention runs through
    PyTorch's SDPA (float64 softmax instead of the eager path's float32 one); the rotary
    embedding's ``inv_freq`` is recomputed in float64 (:func:`rope_frequencies`, with the
    configuration's RoPE scaling), its angles are formed in float64 and cos and sin are
    multiplied by the float64 attention scaling; for ``dynamic`` and ``longrope`` the table is
    taken at the call's ``max(position_ids) + 1``, as a fresh HuggingFace module does; every
    RMSNorm computes its variance in float64.

    Parameters
    ----------
    model : transformers LlamaModel, MistralModel or Qwen2Model

    Returns
    -------
    the same model

    Raises
    ------
    TypeError
        If ``model`` is not one of the supported classes.
    ValueError
        If its RoPE type is not modelled, or its ``inv_freq`` buffer or ``attention_scaling``
        is not the configuration's (edited in place).
    """
    import torch

    classes = _classes()
    if not isinstance(model, classes):
        raise TypeError(f"float64_reference supports {', '.join(c.__name__ for c in classes)}; "
                        f"got {type(model).__qualname__}")
    scaling = _scaling(model.config)
    _check_rotary(model.rotary_emb, scaling)
    frequencies = rope_frequencies(model.config)
    model.double().eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("sdpa")
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = "sdpa"
    rotary = model.rotary_emb
    rotary.inv_freq = torch.from_numpy(frequencies)
    rotary.forward = types.MethodType(functools.partial(_rotary_float64, scaling=scaling), rotary)
    norm_class = type(model.norm)
    for module in model.modules():
        if isinstance(module, norm_class):
            module.forward = types.MethodType(_rms_norm_float64, module)
    return model


def native_frequencies(theta: float, head_dim: int) -> np.ndarray:
    r"""The HuggingFace RoPE frequencies :math:`\Theta^{-2i/d_h}`, :math:`i < d_h/2`, in float64."""
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
