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
``hidden_size / heads``) and the mask is causal; Mistral's ``sliding_window`` (every layer) and
Qwen2's sliding layers (``layer_types``) add the window :math:`0 \le p(x) - p(x') < W`; a
``sliding_window`` on a Llama configuration is ignored, as HuggingFace's ``LlamaModel`` ignores it.
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

from dataclasses import replace

from ..model import ContinuousTransformer
from .convert import convert
from .rotary import float64_reference, native_frequencies, rope_frequencies
from .spec import ArchitectureSpec, ConfigNames, Refusal, register, spec_for

__all__ = ["from_llama", "float64_reference", "rope_frequencies", "native_frequencies", "SUPPORTED_LLAMA",
           "LLAMA", "MISTRAL", "QWEN2"]


def _small(t):
    model = t.LlamaModel(t.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=64, rms_norm_eps=1e-6,
                                       rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                                       bos_token_id=0, eos_token_id=0, pad_token_id=0, vocab_size=64))
    return float64_reference(model)  # float64 RoPE angles, RMSNorm variance and softmax


#: Llama: pre-norm RMSNorm, RoPE, grouped-query causal attention, SwiGLU; optional biases.
LLAMA = register(ArchitectureSpec(
    hf_class="LlamaModel", family="llama", layer="layers.{i}.", query="self_attn.q_proj", key="self_attn.k_proj",
    value="self_attn.v_proj", output="self_attn.o_proj", gate="mlp.gate_proj", up="mlp.up_proj",
    down="mlp.down_proj", norm_kind="rms", norm1="input_layernorm", norm2="post_attention_layernorm",
    final="norm", causal=True, rope=True, names=ConfigNames(eps="rms_norm_eps"),
    refusals=(Refusal("num_local_experts", bool, "mixture-of-experts layers",
                      "one dense gated feed-forward per layer, num_local_experts None or 0"),), small=_small))
#: Mistral: Llama with a sliding window on every layer (HuggingFace ignores ``layer_types`` there).
MISTRAL = register(replace(LLAMA, hf_class="MistralModel", windows="uniform", small=None))
#: Qwen2: Llama with q, k, v biases and sliding layers (``layer_types``).
QWEN2 = register(replace(LLAMA, hf_class="Qwen2Model", windows=True, small=None))

#: HuggingFace classes converted by :func:`from_llama`.
SUPPORTED_LLAMA = ("LlamaModel", "MistralModel", "Qwen2Model")


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
    spec = spec_for(model)
    if spec is None or spec.hf_class not in SUPPORTED_LLAMA:
        raise TypeError(f"from_llama supports {', '.join(SUPPORTED_LLAMA)}; got {type(model).__qualname__}")
    return convert(spec, model)
