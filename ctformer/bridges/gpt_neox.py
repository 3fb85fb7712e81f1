r"""GPT-NeoX / Pythia (``GPTNeoXModel``): partial rotary and the parallel residual.

With ``use_parallel_residual`` (the default) a layer adds both sub-flows evaluated at the
same state,

.. math::

    u \leftarrow u + \mathrm{Attn}(N_1 u) + F(N_2 u),

one explicit Euler step of :math:`\partial_t u = \mathrm{Attn}(N_1 u) + F(N_2 u)`, the
equation of the sequential pre-norm block, whose Lie splitting is the sequential layer
(``use_parallel_residual=False``). The converted model is an
:class:`~ctformer.bridges.composite.EulerNetwork`: ``run`` solves with ``scheme="euler"``;
``solve(scheme="lie")`` is then the sequential network with the same weights, and both
converge to one continuous model as the steps per layer grow.

The query-key-value weight ``attention.query_key_value`` is laid out per head (rows of head
:math:`h`: :math:`q_h, k_h, v_h`); each head's block is a view of it, not a copy. The heads have
``hidden_size / num_attention_heads`` features: a configuration ``head_dim`` that differs
(HuggingFace reads it for the rotary features only) is refused, naming it. RoPE rotates the first ``partial_rotary_factor`` (Pythia:
0.25) of each head's features; the converter reorders the head features of queries and keys
and gives the others frequency 0 (:mod:`ctformer.bridges.rotary`). LayerNorm with gain and
shift, GELU (``hidden_act``), the final ``final_layer_norm``.
"""
from __future__ import annotations

from .spec import ArchitectureSpec, ConfigNames, register

__all__ = ["GPT_NEOX"]

def _small(t):
    from .rotary import float64_reference

    return float64_reference(t.GPTNeoXModel(t.GPTNeoXConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2, max_position_embeddings=64,
        vocab_size=64, bos_token_id=0, eos_token_id=0)))


#: GPT-NeoX: fused per-head qkv, partial rotary, LayerNorm, parallel residual (Euler).
GPT_NEOX = register(ArchitectureSpec(
    hf_class="GPTNeoXModel", family="gpt_neox", layer="layers.{i}.", qkv="attention.query_key_value",
    qkv_layout="per_head", output="attention.dense", up="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h",
    norm_kind="layer", norm1="input_layernorm", norm2="post_attention_layernorm", final="final_layer_norm",
    causal=True, rope=True, partial_rotary=True, parallel="use_parallel_residual",
    names=ConfigNames(kv_heads="num_attention_heads"), small=_small))
