r"""Convert ``torch.nn.TransformerEncoderLayer`` / ``torch.nn.TransformerEncoder`` to a
:class:`ctformer.model.ContinuousTransformer` whose discrete limit is the module.

With midpoint grids of ``N`` tokens, ``d`` features, ``d_h = d / H`` head features and
``d_ff`` hidden nodes, Lie splitting and one Euler step per layer (design notes, section 2):

- ``norm_first=False`` (post-norm): :math:`u \leftarrow N_1(u + \mathrm{Attn}(u))`,
  :math:`u \leftarrow N_2(u + F(u))`;
- ``norm_first=True`` (pre-norm): :math:`u \leftarrow u + \mathrm{Attn}(N_1 u)`,
  :math:`u \leftarrow u + F(N_2 u)`;

followed by the encoder's final ``norm`` if it has one. The returned model is the module in
evaluation mode (no dropout).
"""
from __future__ import annotations

from ..discretizations import Midpoint
from ..model import Block, ContinuousTransformer
from .common import optional_import, attention_from_weights, feedforward_from_weights, layer_norm_from_weights, to_numpy

__all__ = ["from_torch", "torch_activation_name"]

SUPPORTED = "torch.nn.TransformerEncoderLayer and torch.nn.TransformerEncoder"


def torch_activation_name(activation, where: str = "activation") -> str:
    r"""Name of a torch activation in the vocabulary of :class:`ctformer.operators.FeedForward`.

    The four activations are :math:`\mathrm{relu}(z) = \max(z, 0)`, :math:`\mathrm{gelu}(z) =
    z\,\Phi(z)` (erf), its tanh form :math:`\tfrac{z}{2}\big(1 + \tanh(\sqrt{2/\pi}\,(z +
    0.044715 z^3))\big)` (``gelu_tanh``) and :math:`\mathrm{silu}(z) = z / (1 + e^{-z})`.
    Accepted: the strings ``"relu"``/``"gelu"``; the functions ``F.relu``, ``torch.relu``,
    ``F.gelu`` (also ``functools.partial(F.gelu, approximate="tanh")``), ``F.silu``; the
    modules ``nn.ReLU``, ``nn.GELU`` (``approximate="none"`` or ``"tanh"``), ``nn.SiLU``
    (a subclass that overrides ``forward`` computes something else and is refused).

    Parameters
    ----------
    activation : str, callable or torch.nn.Module
    where : str
        Names the activation in the message (``"layers[0].activation"``).

    Raises
    ------
    ValueError
        For any other activation, naming ``where``, the value, the accepted ones and the remedy.
    """
    import functools

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    name = None
    if isinstance(activation, str):
        name = activation if activation in ("relu", "gelu") else None
    elif activation is F.relu or activation is torch.relu:
        name = "relu"
    elif activation is F.gelu:
        name = "gelu"
    elif activation is F.silu:
        name = "silu"
    elif isinstance(activation, functools.partial) and activation.func is F.gelu and not activation.args \
            and set(activation.keywords) <= {"approximate"}:
        name = _GELU_FORMS.get(activation.keywords.get("approximate", "none"))
    else:
        for module, form in ((nn.ReLU, "relu"), (nn.GELU, None), (nn.SiLU, "silu")):
            if isinstance(activation, module) and type(activation).forward is module.forward:
                name = form or _GELU_FORMS.get(activation.approximate)
    if name is None:
        raise ValueError(
            f"{where}={activation!r} is not modelled: the continuous model offers relu (F.relu, torch.relu, "
            "nn.ReLU), gelu (F.gelu, nn.GELU()), gelu_tanh (nn.GELU(approximate='tanh')) and silu (F.silu, "
            "nn.SiLU); build the layer with one of these (a network trained with another activation is "
            "another network)"
        )
    return name


#: ``approximate`` of torch's GELU -> the activation's name.
_GELU_FORMS = {"none": "gelu", "tanh": "gelu_tanh"}


def from_torch(module, causal: bool = False) -> ContinuousTransformer:
    r"""The continuous Transformer whose discrete limit is ``module``.

    Parameters
    ----------
    module : torch.nn.TransformerEncoderLayer or torch.nn.TransformerEncoder
        The network (any ``norm_first``, relu/gelu/silu activation, any ``layer_norm_eps``,
        with or without biases and the encoder's final ``norm``). ``batch_first`` does not
        matter: :meth:`ContinuousTransformer.run` takes ``(B, N, d)``. Weights may be
        float16, bfloat16, float32 or float64: they are copied to float64 exactly (every
        half-precision number is a float64).
    causal : bool
        Build causal attention (:math:`m(x, x') = 1\{x' \le x\}`), the continuous form of
        running the module with ``is_causal=True`` and the square subsequent mask.

    Returns
    -------
    ContinuousTransformer
        With ``features = Midpoint(d)``, ``head_features = Midpoint(d_h)`` and
        ``hidden = Midpoint(d_ff)``.

    Raises
    ------
    TypeError
        If ``module`` is not one of the supported classes (e.g. ``TransformerDecoderLayer``),
        or a layer subclass overrides ``forward``, or its norms are not ``nn.LayerNorm``, or a
        weight has another dtype than those four (named in the message).
    ValueError
        For unsupported options: ``add_bias_kv``, ``add_zero_attn``, an activation other than
        relu/gelu/silu, or layers with different sizes.

    Notes
    -----
    Per head :math:`h`, the kernels are :class:`ctformer.kernels.PiecewiseConstant` of the row
    blocks of ``in_proj_weight`` (Q, K, V) and the column block of ``out_proj.weight``, with
    :math:`\beta_h = \sqrt{d_h}` (the scale :math:`1/\sqrt{d_h}` of torch is
    :math:`\beta_h` times the midpoint weight :math:`1/d_h`).

    The activation is the layer's ``activation``, as its ``forward`` applies it. torch's
    inference fast path (eval mode, no autograd, ``batch_first``, an even number of heads)
    runs the erf GELU for every ``nn.GELU``: a layer with ``nn.GELU(approximate="tanh")`` gives
    there a network about 1e-5 (relative) away from its ``forward``, whose network (the tanh
    GELU) is the converted model's; run the module with autograd on (or an odd number of heads)
    to compare.
    """
    nn = optional_import("torch.nn", "from_torch")

    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if isinstance(module, nn.TransformerEncoder):
        layers, final = list(module.layers), module.norm
    elif isinstance(module, nn.TransformerEncoderLayer):
        layers, final = [module], None
    else:
        raise TypeError(f"from_torch supports {SUPPORTED}; got {_qualname(module)}")
    if not layers:
        raise ValueError("the TransformerEncoder has no layers")

    blocks, sizes = [], set()
    for i, layer in enumerate(layers):
        block, size = _block(layer, causal, f"layers[{i}]")
        blocks.append(block)
        sizes.add(size)
    if len(sizes) != 1:
        raise ValueError(f"all layers must have the same (d_model, nhead, dim_feedforward); got {sorted(sizes)}")
    d_model, heads, d_ff = sizes.pop()
    final_norm = None
    if final is not None:
        _check_layer_norm(final, "norm", d_model)
        final_norm = layer_norm_from_weights(to_numpy(final.weight, "norm.weight"),
                                             to_numpy(final.bias, "norm.bias"), final.eps)
    return ContinuousTransformer(blocks, final_normalization=final_norm, head_features=Midpoint(d_model // heads),
                                 hidden=Midpoint(d_ff), features=Midpoint(d_model))


def _block(layer, causal, where):
    import torch.nn as nn

    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise TypeError(f"{where} must be a torch.nn.TransformerEncoderLayer, got {_qualname(layer)}")
    if type(layer).forward is not nn.TransformerEncoderLayer.forward:
        raise TypeError(f"{where}: {_qualname(layer)} overrides forward; only the stock layer is supported")
    attn = layer.self_attn
    if attn.bias_k is not None or attn.bias_v is not None:
        raise ValueError(f"{where}: self_attn with add_bias_kv=True is not supported")
    if attn.add_zero_attn:
        raise ValueError(f"{where}: self_attn with add_zero_attn=True is not supported")
    d_model, heads = attn.embed_dim, attn.num_heads
    if attn._qkv_same_embed_dim:
        w_q, w_k, w_v = to_numpy(attn.in_proj_weight, f"{where}.self_attn.in_proj_weight").reshape(3, d_model, -1)
    else:
        w_q, w_k, w_v = (to_numpy(getattr(attn, f"{c}_proj_weight"), f"{where}.self_attn.{c}_proj_weight")
                         for c in "qkv")
    if w_k.shape[1] != d_model or w_v.shape[1] != d_model:
        raise ValueError(f"{where}: self-attention needs kdim = vdim = d_model = {d_model}")
    b_q = b_k = b_v = None
    if attn.in_proj_bias is not None:
        b_q, b_k, b_v = to_numpy(attn.in_proj_bias, f"{where}.self_attn.in_proj_bias").reshape(3, d_model)
    attention = attention_from_weights(
        w_q, w_k, w_v, to_numpy(attn.out_proj.weight, f"{where}.self_attn.out_proj.weight"),
        b_q, b_k, b_v, to_numpy(attn.out_proj.bias, f"{where}.self_attn.out_proj.bias"),
        heads, mask="causal" if causal else None,
    )
    for name in ("linear1", "linear2"):
        if type(getattr(layer, name)) is not nn.Linear:
            raise TypeError(f"{where}.{name} must be torch.nn.Linear, got {_qualname(getattr(layer, name))}")
    feedforward = feedforward_from_weights(
        to_numpy(layer.linear1.weight, f"{where}.linear1.weight"),
        to_numpy(layer.linear1.bias, f"{where}.linear1.bias"),
        to_numpy(layer.linear2.weight, f"{where}.linear2.weight"),
        to_numpy(layer.linear2.bias, f"{where}.linear2.bias"),
        torch_activation_name(layer.activation, f"{where}.activation"),
    )
    norms = []
    for name in ("norm1", "norm2"):
        norm = getattr(layer, name)
        _check_layer_norm(norm, f"{where}.{name}", d_model)
        norms.append(layer_norm_from_weights(to_numpy(norm.weight, f"{where}.{name}.weight"),
                                             to_numpy(norm.bias, f"{where}.{name}.bias"), norm.eps))
    placement = "pre" if layer.norm_first else "post"
    block = Block(attention, feedforward, norms[0], norms[1], placement=placement)
    return block, (d_model, heads, layer.linear1.out_features)


def _check_layer_norm(norm, where, d_model):
    import torch.nn as nn

    if type(norm) is not nn.LayerNorm:
        raise TypeError(f"{where} must be torch.nn.LayerNorm, got {_qualname(norm)}")
    if tuple(norm.normalized_shape) != (d_model,):
        raise ValueError(f"{where} normalizes shape {tuple(norm.normalized_shape)}, expected ({d_model},)")


def _qualname(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}".replace("torch.nn.modules.transformer.", "torch.nn.")
