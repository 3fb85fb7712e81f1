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

from .convert import convert
from .spec import ENCODER_NAMES, ArchitectureSpec, register, relative_refusal, spec_for

__all__ = ["from_albert", "ALBERT"]


def _groups(cfg, indices):
    """Layer l of num_hidden_layers runs group floor(l G / L), each of inner_group_num layers."""
    layers, groups = int(cfg.num_hidden_layers), int(cfg.num_hidden_groups)
    return [{"g": int(i / (layers / groups)), "j": j} for i in range(layers) for j in range(int(cfg.inner_group_num))]


def _small(t):
    return t.AlbertModel(t.AlbertConfig(embedding_size=8, hidden_size=16, num_hidden_layers=3,
                                        num_attention_heads=4, intermediate_size=32,
                                        max_position_embeddings=64, vocab_size=64),
                         add_pooling_layer=False)


#: ALBERT: post-norm BERT layers shared across depth by layer groups.
ALBERT = register(ArchitectureSpec(
    hf_class="AlbertModel", family="albert", prefix="encoder.", layer="albert_layer_groups.{g}.albert_layers.{j}.",
    query="attention.query", key="attention.key", value="attention.value", output="attention.dense", up="ffn",
    down="ffn_output", norm_kind="layer", norm1="attention.LayerNorm", norm2="full_layer_layer_norm",
    placement="post", layer_keys=_groups, names=ENCODER_NAMES,
    refusals=(relative_refusal("transformers.models.albert.modeling_albert"),),
    small=_small))


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
        embeddings (``position_embedding_type``) where the installed transformers computes
        them (before version 5; from version 5 ALBERT ignores the option and the converted
        model gives the same absolute-position network), or an unknown activation.
    """
    if spec_for(model) is not ALBERT:
        raise TypeError(f"from_albert needs a transformers AlbertModel, got {type(model).__qualname__}")
    return convert(ALBERT, model)
