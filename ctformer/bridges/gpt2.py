r"""Convert a HuggingFace ``GPT2Model`` to a :class:`ctformer.model.ContinuousTransformer`.

A GPT-2 block is pre-norm with causal attention (design notes, sections 1 and 2):

.. math::

    u \leftarrow u + \mathrm{Attn}(N_1 u), \qquad u \leftarrow u + F(N_2 u),

with ``ln_1`` as :math:`N_1`, the packed ``attn.c_attn`` and ``attn.c_proj`` in
:math:`\mathrm{Attn}` (causal mask :math:`1\{x' \le x\}`), ``ln_2`` as :math:`N_2`,
``mlp.c_fc``, the activation (``gelu_new`` is the tanh GELU) and ``mlp.c_proj`` in :math:`F`,
and the final ``ln_f`` applied at :math:`t = T`. GPT-2's ``Conv1D`` computes
:math:`x W + b`, so its weight is the transpose of an ``nn.Linear`` weight.

The score scale is :math:`1/\sqrt{d_h}` (``scale_attn_weights``), divided by :math:`l + 1` in
layer :math:`l` with ``scale_attn_by_inverse_layer_idx``: :math:`\beta_h = \sqrt{d_h}/(l+1)`
(without ``scale_attn_weights`` the scale is 1, :math:`\beta_h = d_h`). The learned position
table ``wpe`` is part of the embeddings: its output (``hidden_states[0]``) is :math:`u_0`.
``reorder_and_upcast_attn`` changes only the precision of HuggingFace's eager attention (its
scores in float32; a float64 module then raises inside HuggingFace), not the network: the
converted model computes the same scores in the state's dtype.
"""
from __future__ import annotations

import math

from .convert import convert
from .spec import ArchitectureSpec, ConfigNames, Refusal, register, spec_for, truthy

__all__ = ["from_gpt2", "GPT2"]


def _beta(cfg, layer, head_dim):
    """sqrt(d_h) (scale 1/sqrt(d_h)) or d_h (scale 1), divided by l + 1 with inverse layer scaling."""
    beta = math.sqrt(head_dim) if cfg.scale_attn_weights else float(head_dim)
    return beta / float(layer + 1) if cfg.scale_attn_by_inverse_layer_idx else beta


def _small(t):
    return t.GPT2Model(t.GPT2Config(n_embd=16, n_layer=3, n_head=4, n_inner=32, n_positions=64,
                                    bos_token_id=0, eos_token_id=0, vocab_size=64))


#: GPT-2: pre-norm, causal, packed ``c_attn`` (rows [Q; K; V] after the Conv1D transpose).
GPT2 = register(ArchitectureSpec(
    hf_class="GPT2Model", family="gpt2", layer="h.{i}.", qkv="attn.c_attn", output="attn.c_proj",
    transposed=True, up="mlp.c_fc", down="mlp.c_proj", norm_kind="layer", norm1="ln_1", norm2="ln_2",
    final="ln_f", causal=True, beta=_beta,
    names=ConfigNames(hidden="n_embd", heads="n_head", kv_heads="n_head", head_dim=None, eps="layer_norm_epsilon",
                      activation=("activation_function",), layers="n_layer"),
    refusals=(Refusal("add_cross_attention", truthy, "cross-attention layers",
                      "self-attention blocks only, add_cross_attention=False"),),
    small=_small))


def from_gpt2(model):
    r"""The continuous Transformer whose discrete limit is a HuggingFace ``GPT2Model``.

    Parameters
    ----------
    model : transformers.GPT2Model
        In memory, with float16, bfloat16, float32 or float64 weights (copied to float64
        exactly: every half-precision number is a float64).

    Returns
    -------
    ContinuousTransformer
        Pre-norm causal blocks and the final LayerNorm; ``features = Midpoint(n_embd)``,
        ``head_features = Midpoint(n_embd / n_head)``, ``hidden = Midpoint(n_inner)``.
        ``run(x, padding_mask)`` takes ``hidden_states[0]`` (token plus position embeddings)
        and returns ``last_hidden_state``.

    Raises
    ------
    TypeError
        If ``model`` is not a ``GPT2Model``, or a weight has another dtype (integer,
        quantized), named in the message.
    ValueError
        For options that are not modelled, named in the message: cross-attention layers
        (``add_cross_attention``) or an unknown activation.
    """
    if spec_for(model) is not GPT2:
        raise TypeError(f"from_gpt2 needs a transformers GPT2Model, got {type(model).__qualname__}")
    return convert(GPT2, model)
