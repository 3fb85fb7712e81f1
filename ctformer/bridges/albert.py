r"""Convert a HuggingFace ``AlbertModel`` to a :class:`ctformer.model.ContinuousTransformer`.

An ALBERT layer is a post-norm BERT layer (design notes, section 2):

.. math::

    h = N_1\big(u + \mathrm{Attn}(u)\big), \qquad u \leftarrow N_2\big(h + F(h)\big),

with ``attention.{query,key,value,dense}`` in :math:`\mathrm{Attn}`, ``attention.LayerNorm``
as :math:`N_1`, ``ffn``, the activation and ``ffn_output`` in :math:`F`, and
``full_layer_layer_norm`` as :math:`N_2`. ALBERT shares parameters across depth: layer
:math:`l` of ``num_hidden_layers`` runs the layer group
:math:`\lfloor l\, G / L \rfloor` of the ``num_hidden_groups`` groups (each of
``inner_group_num`` layers). With one group the continuous model's parameters do not depend on
:math:`t`: every block holds the same operators (discretized once).

The embeddings (of size ``embedding_size``) and ``embedding_hidden_mapping_in`` (to
``hidden_size``) come before the evolution: their output, ``hidden_states[0]`` of width
``hidden_size``, is :math:`u_0`. The per-feature affine LayerNorms make refinement in depth
inconsistent, as for BERT: ``solve(steps_per_layer > 1)`` warns
(:class:`ctformer.model.InconsistentDepthLimitWarning`).
"""
from __future__ import annotations

from ..discretizations import Midpoint
from ..model import Block, ContinuousTransformer
from .common import attention_from_weights, feedforward_from_weights, layer_norm_from_weights, to_numpy
from .huggingface import HF_ACTIVATIONS

__all__ = ["from_albert"]


def from_albert(model) -> ContinuousTransformer:
    r"""The continuous Transformer whose discrete limit is a HuggingFace ``AlbertModel``.

    Parameters
    ----------
    model : transformers.AlbertModel
        In memory, with float16, bfloat16, float32 or float64 weights (copied to float64
        exactly: every half-precision number is a float64).

    Returns
    -------
    ContinuousTransformer
        ``num_hidden_layers x inner_group_num`` post-norm blocks sharing the operators of their
        layer group; ``features = Midpoint(hidden_size)``, ``head_features =
        Midpoint(hidden_size / heads)``, ``hidden = Midpoint(intermediate_size)``.
        ``run(x, padding_mask)`` takes ``hidden_states[0]`` and returns ``last_hidden_state``.

    Raises
    ------
    TypeError
        If ``model`` is not an ``AlbertModel``, or a weight has another dtype (integer,
        quantized), named in the message.
    ValueError
        For options that are not modelled, named in the message: relative position
        embeddings (``position_embedding_type``) or an unknown activation.
    """
    from transformers import AlbertModel

    if not isinstance(model, AlbertModel):
        raise TypeError(f"from_albert needs a transformers AlbertModel, got {type(model).__qualname__}")
    cfg = model.config
    kind = getattr(cfg, "position_embedding_type", "absolute")
    if kind not in ("absolute", None):
        raise ValueError(f"position_embedding_type={kind!r} is not modelled; only 'absolute' (embeddings "
                         "outside the encoder)")
    act = cfg.hidden_act
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(f"hidden_act={act!r} is not modelled; supported: {sorted(HF_ACTIVATIONS)}")
    d, heads = int(cfg.hidden_size), int(cfg.num_attention_heads)
    if d % heads:
        raise ValueError(f"hidden_size={d} is not divisible by num_attention_heads={heads}")
    eps = float(cfg.layer_norm_eps)
    layers, groups = int(cfg.num_hidden_layers), int(cfg.num_hidden_groups)
    state = model.encoder.state_dict()

    def weight(name):
        if name not in state:
            raise ValueError(f"missing ALBERT weight encoder.{name}")
        return to_numpy(state[name], f"encoder.{name}")

    group_blocks = {}

    def blocks_of(g):
        if g not in group_blocks:
            built = []
            for j in range(len(model.encoder.albert_layer_groups[g].albert_layers)):
                p = f"albert_layer_groups.{g}.albert_layers.{j}."
                a = p + "attention."
                attention = attention_from_weights(
                    weight(a + "query.weight"), weight(a + "key.weight"), weight(a + "value.weight"),
                    weight(a + "dense.weight"), weight(a + "query.bias"), weight(a + "key.bias"),
                    weight(a + "value.bias"), weight(a + "dense.bias"), heads)
                feedforward = feedforward_from_weights(weight(p + "ffn.weight"), weight(p + "ffn.bias"),
                                                       weight(p + "ffn_output.weight"),
                                                       weight(p + "ffn_output.bias"), HF_ACTIVATIONS[act])
                norm1 = layer_norm_from_weights(weight(a + "LayerNorm.weight"), weight(a + "LayerNorm.bias"), eps)
                norm2 = layer_norm_from_weights(weight(p + "full_layer_layer_norm.weight"),
                                                weight(p + "full_layer_layer_norm.bias"), eps)
                built.append(Block(attention, feedforward, norm1, norm2, placement="post"))
            group_blocks[g] = built
        return group_blocks[g]

    blocks = []
    for i in range(layers):
        blocks.extend(blocks_of(int(i / (layers / groups))))
    d_ff = int(cfg.intermediate_size)
    return ContinuousTransformer(blocks, head_features=Midpoint(d // heads), hidden=Midpoint(d_ff),
                                 features=Midpoint(d))
