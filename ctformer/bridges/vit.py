r"""Vision transformers: a HuggingFace ``ViTModel`` as tokens on the square with a class token.

A ViT layer is pre-norm, with a final LayerNorm after the last layer:

.. math::

    u \leftarrow u + \mathrm{Attn}(N_1 u), \qquad u \leftarrow u + F(N_2 u),

with ``attention.{q,k,v,o}_proj`` in :math:`\mathrm{Attn}`, ``layernorm_before`` as :math:`N_1`,
``mlp.fc1``, the activation and ``mlp.fc2`` in :math:`F`, and ``layernorm_after`` as
:math:`N_2`. The embedding output (class token, then the patches in raster order, plus the
position embeddings: HuggingFace's ``hidden_states[0]``) is the initial state :math:`u_0`.

In the continuum the patches are a tensor-product rule on the image :math:`[0, 1]^2` and the
class token is an atom of the token measure: the discrete network is
``WithAtoms(Product(Midpoint(g), Midpoint(g)))`` (every token weighs :math:`1/(g^2 + 1)`),
and :meth:`ContinuousTransformer.run` on the ``g^2 + 1`` tokens computes exactly that.

A learned position table on the :math:`g \times g` patch grid is read as samples of a function
of :math:`x \in [0, 1]^2` at the midpoint nodes; :func:`patch_position_table` evaluates it at
the midpoint nodes of another grid by separable cubic convolution (Keys' kernel with
:math:`a = -3/4`, borders clamped), which is exactly the bicubic resampling HuggingFace uses
for ``interpolate_pos_encoding=True``. With :math:`a = -3/4` cubic convolution does not even
reproduce linear functions: it is first-order accurate (only :math:`a = -1/2` gives third
order, Keys 1981), so the interpolated position table limits any study that refines the
patches of a converted ViT to order 1.
"""
from __future__ import annotations

import math

import numpy as np


from .common import to_numpy
from .convert import convert
from .spec import ArchitectureSpec, ConfigNames, register, spec_for

__all__ = ["from_hf_vit", "patch_position_table", "cubic_convolution_matrix", "VIT", "DEIT"]

#: ViT: pre-norm encoder layers and a final LayerNorm; the class token is an atom.
VIT = register(ArchitectureSpec(
    hf_class="ViTModel", family="vit", layer="layers.{i}.", query="attention.q_proj", key="attention.k_proj",
    value="attention.v_proj", output="attention.o_proj", up="mlp.fc1", down="mlp.fc2", norm_kind="layer",
    norm1="layernorm_before", norm2="layernorm_after", final="layernorm",
    names=ConfigNames(kv_heads="num_attention_heads")))  # head_dim is read: ViTAttention reads it


def cubic_convolution_matrix(source: int, target: int, a: float = -0.75) -> np.ndarray:
    r"""Matrix ``(target, source)`` resampling cell-centred samples by cubic convolution.

    Output cell :math:`j` of ``Midpoint(target)`` sits at source coordinate
    :math:`s = (j + 1/2)\, \text{source} / \text{target} - 1/2`; with :math:`i = \lfloor s
    \rfloor`, :math:`t = s - i`, the weights of samples :math:`i - 1, \dots, i + 2` are Keys'
    cubic kernel at distances :math:`1 + t, t, 1 - t, 2 - t`, and indices outside
    :math:`0, \dots, \text{source} - 1` are clamped to the border.
    """
    if source < 1 or target < 1:
        raise ValueError(f"grid sizes must be positive, got source={source}, target={target}")

    def kernel(d):
        d = np.abs(d)
        near = ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
        far = ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
        return np.where(d <= 1.0, near, np.where(d < 2.0, far, 0.0))

    s = (np.arange(target) + 0.5) * (source / target) - 0.5
    base = np.floor(s).astype(np.int64)
    t = s - base
    out = np.zeros((target, source))
    rows = np.arange(target)
    for offset, distance in zip((-1, 0, 1, 2), (1.0 + t, t, 1.0 - t, 2.0 - t)):
        np.add.at(out, (rows, np.clip(base + offset, 0, source - 1)), kernel(distance))
    return out


def patch_position_table(table, shape) -> np.ndarray:
    r"""A learned patch position table evaluated on another patch grid.

    Parameters
    ----------
    table : array_like, shape (g * g, d) or (g, g, d)
        Position embeddings of the patches of a :math:`g \times g` grid, raster order
        (without the class token's).
    shape : tuple of int
        The new grid ``(n1, n2)``.

    Returns
    -------
    ndarray, shape (n1 * n2, d)
        :math:`P_1 T P_2^T` per feature, with the cubic-convolution matrices of
        :func:`cubic_convolution_matrix`: HuggingFace's bicubic ``interpolate_pos_encoding``.
    """
    values = np.asarray(to_numpy(table, "table"), dtype=np.float64)
    if values.ndim == 2:
        g = math.isqrt(values.shape[0])
        if g * g != values.shape[0]:
            raise ValueError(f"table has {values.shape[0]} rows, not a square patch grid")
        values = values.reshape(g, g, -1)
    if values.ndim != 3 or values.shape[0] != values.shape[1]:
        raise ValueError(f"table must have shape (g*g, d) or (g, g, d), got {values.shape}")
    n1, n2 = (int(v) for v in shape)
    p1 = cubic_convolution_matrix(values.shape[0], n1)
    p2 = cubic_convolution_matrix(values.shape[1], n2)
    return np.einsum("ia,abd,jb->ijd", p1, values, p2).reshape(n1 * n2, -1)


def from_hf_vit(model) -> ContinuousTransformer:
    r"""The continuous Transformer whose discrete limit is a HuggingFace ``ViTModel`` encoder.

    Parameters
    ----------
    model : transformers.ViTModel
        In memory, evaluation mode (no dropout), with float16, bfloat16, float32 or float64
        weights (copied to float64 exactly: every half-precision number is a float64).

    Returns
    -------
    ContinuousTransformer
        Pre-norm blocks and the final LayerNorm; ``features = Midpoint(d)``,
        ``head_features = Midpoint(d_h)``, ``hidden = Midpoint(d_ff)``. ``run(x)`` takes
        ``hidden_states[0]`` of shape ``(N, d)`` or ``(B, N, d)`` and returns
        ``last_hidden_state``.

    Raises
    ------
    TypeError
        If ``model`` is not a ``ViTModel``, or a weight has another dtype (integer,
        quantized), named in the message.
    ValueError
        For an activation the continuous model does not offer.
    """
    if spec_for(model) is not VIT:
        raise TypeError(f"from_hf_vit needs a transformers ViTModel, got {type(model).__name__}")
    return convert(VIT, model)
