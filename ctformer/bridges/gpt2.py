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
"""
from __future__ import annotations

import math

from ..discretizations import Midpoint
from ..model import Block, ContinuousTransformer
from .common import feedforward_from_weights, grouped_attention_from_weights, layer_norm_from_weights, to_numpy
from .huggingface import HF_ACTIVATIONS

__all__ = ["from_gpt2"]


def from_gpt2(model) -> ContinuousTransformer:
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
    from transformers import GPT2Model

    if not isinstance(model, GPT2Model):
        raise TypeError(f"from_gpt2 needs a transformers GPT2Model, got {type(model).__qualname__}")
    cfg = model.config
    if getattr(cfg, "add_cross_attention", False):
        raise ValueError("GPT-2 with add_cross_attention=True (cross-attention layers) is not modelled")
    act = cfg.activation_function
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(f"activation_function={act!r} is not modelled; supported: {sorted(HF_ACTIVATIONS)}")
    d, heads = int(cfg.n_embd), int(cfg.n_head)
    d_h = d // heads
    eps = float(cfg.layer_norm_epsilon)
    state = model.state_dict()

    def weight(name, transpose=False):
        if name not in state:
            raise ValueError(f"missing GPT-2 weight {name}")
        arr = to_numpy(state[name], name)
        return arr.T.copy() if transpose else arr

    blocks = []
    for i in range(len(model.h)):
        p = f"h.{i}."
        w_qkv, b_qkv = weight(p + "attn.c_attn.weight", True), weight(p + "attn.c_attn.bias")
        w_q, w_k, w_v = w_qkv.reshape(3, d, d)
        b_q, b_k, b_v = b_qkv.reshape(3, d)
        beta = math.sqrt(d_h) if cfg.scale_attn_weights else float(d_h)
        if cfg.scale_attn_by_inverse_layer_idx:
            beta /= float(i + 1)
        attention = grouped_attention_from_weights(
            w_q, w_k, w_v, weight(p + "attn.c_proj.weight", True), b_q, b_k, b_v,
            weight(p + "attn.c_proj.bias"), heads=heads, kv_heads=heads, head_dim=d_h, beta=beta,
            mask="causal")
        feedforward = feedforward_from_weights(weight(p + "mlp.c_fc.weight", True), weight(p + "mlp.c_fc.bias"),
                                               weight(p + "mlp.c_proj.weight", True), weight(p + "mlp.c_proj.bias"),
                                               HF_ACTIVATIONS[act])
        norms = [layer_norm_from_weights(weight(p + f"{n}.weight"), weight(p + f"{n}.bias"), eps)
                 for n in ("ln_1", "ln_2")]
        blocks.append(Block(attention, feedforward, norms[0], norms[1], placement="pre"))
    final = layer_norm_from_weights(weight("ln_f.weight"), weight("ln_f.bias"), eps)
    d_ff = weight("h.0.mlp.c_fc.weight").shape[1]
    return ContinuousTransformer(blocks, final_normalization=final, head_features=Midpoint(d_h),
                                 hidden=Midpoint(d_ff), features=Midpoint(d))

