r"""Gemma (``GemmaModel``) and Gemma 2 (``Gemma2Model``).

Gemma is a Llama-type decoder whose RMSNorms have the gain :math:`1 + w` (``weight`` stores
:math:`w`), with a GeGLU feed-forward (``gelu_pytorch_tanh``, the tanh GELU) and a given
``head_dim``. Its embedding layer multiplies the token embeddings by :math:`\sqrt{d}`: that is
part of the embedding (HuggingFace's ``embed_tokens`` does it), so the continuous model's
:math:`u_0` is the scaled embedding, ``inputs_embeds`` as HuggingFace passes it to the layers.
The activation is read where the installed ``GemmaMLP`` reads it: ``hidden_act``, or before
transformers 4.48 ``hidden_activation`` (``None``: the tanh GELU; :func:`mlp_reads_hidden_activation`).

Gemma 2 adds output normalizations inside the residual ("sandwich" norms),

.. math::

    u \leftarrow u + P_1\big(\mathrm{Attn}(N_1 u)\big), \qquad u \leftarrow u + P_2\big(F(N_2 u)\big),

(``input_layernorm``, ``post_attention_layernorm``, ``pre_feedforward_layernorm``,
``post_feedforward_layernorm``; :class:`~ctformer.bridges.composite.OutputNormalized`), the
score scale ``query_pre_attn_scalar`` :math:`^{-1/2}` (:math:`\beta_h = d_h\, s^{-1/2}`), and
sliding-window attention on the layers ``layer_types`` marks ``sliding_attention``.

Attention logit soft-capping :math:`s \mapsto c \tanh(s / c)` (``attn_logit_softcapping``,
50 by default) is the attention operator's ``softcap``: the kernel :math:`e^{c \tanh(s/c)}` of
the score :math:`s = \beta_h \int q k\, d\sigma`, before the key weights and masks.
``final_logit_softcapping`` acts on the language-model logits, outside ``Gemma2Model``.
"""
from __future__ import annotations

import importlib
from dataclasses import replace
from functools import lru_cache

from .spec import ArchitectureSpec, ConfigNames, Refusal, config_value, register, truthy

__all__ = ["GEMMA", "GEMMA2", "mlp_reads_hidden_activation"]


@lru_cache(maxsize=None)
def mlp_reads_hidden_activation(module: str = "transformers.models.gemma.modeling_gemma") -> bool:
    r"""Whether the installed ``GemmaMLP`` takes its activation from ``config.hidden_activation``.

    Before transformers 4.48 it did, with ``None`` meaning ``gelu_pytorch_tanh`` (the tanh GELU)
    and ``hidden_act`` unread: the official Gemma configurations carry ``hidden_act="gelu"``,
    the erf GELU, which the network was not trained with. Later versions read ``hidden_act``
    (transformers 5 rewrites ``"gelu"`` there to ``"gelu_pytorch_tanh"``). The installed code
    decides: the test is whether ``GemmaMLP.__init__`` names ``hidden_activation``.

    Parameters
    ----------
    module : str
        The dotted name of the modeling module.

    Returns
    -------
    bool
        False also when the module cannot be imported.
    """
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    init = getattr(getattr(found, "GemmaMLP", None), "__init__", None)
    return "hidden_activation" in getattr(getattr(init, "__code__", None), "co_names", ())


def _activation(cfg):
    """(key, name) of the activation the installed ``GemmaMLP`` applies."""
    if mlp_reads_hidden_activation():
        return "hidden_activation", config_value(cfg, "hidden_activation", "gelu_pytorch_tanh")
    return "hidden_act", config_value(cfg, "hidden_act")

def _small_gemma(t):
    from .rotary import float64_reference

    return float64_reference(t.GemmaModel(t.GemmaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=4, max_position_embeddings=64, vocab_size=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)))


def _small_gemma2(t):
    from .rotary import float64_reference

    return float64_reference(t.Gemma2Model(t.Gemma2Config(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=4, sliding_window=4, attn_logit_softcapping=None, max_position_embeddings=64, vocab_size=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)))


_BIDIRECTIONAL = Refusal("use_bidirectional_attention", truthy,
                         "the converted decoder is causal; set use_bidirectional_attention=None")

#: Gemma: RMSNorm with 1 + w, GeGLU (tanh GELU), RoPE, GQA, causal.
GEMMA = register(ArchitectureSpec(
    hf_class="GemmaModel", family="gemma", layer="layers.{i}.", query="self_attn.q_proj", key="self_attn.k_proj",
    value="self_attn.v_proj", output="self_attn.o_proj", gate="mlp.gate_proj", up="mlp.up_proj",
    down="mlp.down_proj", norm_kind="rms_offset", norm1="input_layernorm", norm2="post_attention_layernorm",
    final="norm", causal=True, rope=True, names=ConfigNames(eps="rms_norm_eps", activation=_activation),
    small=_small_gemma,
    refusals=(_BIDIRECTIONAL,)))


def _beta(cfg, layer, head_dim):
    """Score scale query_pre_attn_scalar^(-1/2): beta = d_h / sqrt(query_pre_attn_scalar)."""
    return head_dim / float(cfg.query_pre_attn_scalar) ** 0.5


#: Gemma 2: Gemma with output norms, query_pre_attn_scalar, alternating sliding layers.
GEMMA2 = register(replace(
    GEMMA, hf_class="Gemma2Model", family="gemma2", norm2="pre_feedforward_layernorm",
    post1="post_attention_layernorm", post2="post_feedforward_layernorm", windows=True, beta=_beta, small=_small_gemma2,
    names=ConfigNames(eps="rms_norm_eps", activation=("hidden_activation", "hidden_act")),
    softcap="attn_logit_softcapping", refusals=(_BIDIRECTIONAL,)))
