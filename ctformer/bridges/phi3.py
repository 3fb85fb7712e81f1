r"""Phi-3 (``Phi3Model``): a Llama-type decoder with fused weights.

.. math::

    u \leftarrow u + \mathrm{Attn}(N_1 u), \qquad
    u \leftarrow u + W_{\mathrm{down}}\big(\phi(W_{\mathrm{gate}} N_2 u) \odot W_{\mathrm{up}} N_2 u\big),

with RMSNorm ``input_layernorm`` / ``post_attention_layernorm`` and the final ``norm``. The
query, key and value projections are one ``self_attn.qkv_proj`` weight, rows
:math:`[W_Q; W_K; W_V]` of :math:`H d_h`, :math:`H_{kv} d_h`, :math:`H_{kv} d_h` rows; the gate
and up projections are one ``mlp.gate_up_proj``, rows :math:`[W_{gate}; W_{up}]`. RoPE (any
:data:`~ctformer.bridges.rope_scaling.SUPPORTED_ROPE_TYPES`, ``longrope`` included) with a
``partial_rotary_factor`` (:mod:`ctformer.bridges.rotary`), and an optional ``sliding_window`` on
every layer (HuggingFace's Phi-3 does not read ``layer_types``).
"""
from __future__ import annotations

from .spec import ArchitectureSpec, ConfigNames, register

__all__ = ["PHI3"]

def _small(t):
    from .rotary import float64_reference

    return float64_reference(t.Phi3Model(t.Phi3Config(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, vocab_size=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)))


#: Phi-3: fused qkv and gate-up, RMSNorm, RoPE (partial rotary allowed), causal, sliding window.
PHI3 = register(ArchitectureSpec(
    hf_class="Phi3Model", family="phi3", layer="layers.{i}.", qkv="self_attn.qkv_proj", qkv_layout="stacked",
    output="self_attn.o_proj", gate_up="mlp.gate_up_proj", down="mlp.down_proj", norm_kind="rms",
    norm1="input_layernorm", norm2="post_attention_layernorm", final="norm", causal=True, rope=True,
    partial_rotary=True, windows="uniform", names=ConfigNames(eps="rms_norm_eps"), small=_small))
