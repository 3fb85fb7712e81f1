r"""Building continuous operators from the weights of a discrete network (design notes, section 2).

The discrete-limit dictionary: a weight :math:`A` of an ``nn.Linear`` (``out x in``) becomes the
kernel :class:`ctformer.kernels.PiecewiseConstant` with value :math:`d_{in} A_{ij}` on cell
:math:`(i, j)`, whose midpoint matrix is :math:`A` itself; a bias or a LayerNorm weight of
length :math:`d` is the piecewise-constant function with these cell values; the score scale
:math:`1/\sqrt{d_h}` of head :math:`h` is :math:`\beta_h \int_{Y_h} q k\, d\sigma` with the
midpoint weights :math:`1/d_h`, so :math:`\beta_h = \sqrt{d_h}`.
"""
from __future__ import annotations

import math

import numpy as np

from ..kernels import PiecewiseConstant
from ..operators import Attention, FeedForward, LayerNormProjection

__all__ = ["to_numpy", "attention_from_weights", "feedforward_from_weights", "layer_norm_from_weights"]


def to_numpy(tensor, name: str) -> np.ndarray | None:
    """A host float64 copy of a torch tensor or array (``None`` stays ``None``)."""
    if tensor is None:
        return None
    if hasattr(tensor, "detach"):
        tensor = tensor.detach().cpu().double().numpy()
    arr = np.array(tensor, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"weight {name} contains NaN or inf")
    return arr


def attention_from_weights(w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, heads: int, mask=None):
    r"""Multi-head attention from stacked projection weights (``d x d``, heads along rows).

    Head :math:`h` uses rows :math:`h d_h, \dots, (h + 1) d_h - 1` of ``w_q``, ``w_k``,
    ``w_v`` (and of their biases) and the same columns of ``w_o``; :math:`\beta_h = \sqrt{d_h}`.
    """
    d_model = w_q.shape[0]
    if d_model % heads:
        raise ValueError(f"embedding size {d_model} is not divisible by the number of heads {heads}")
    d_h = d_model // heads
    rows = [slice(h * d_h, (h + 1) * d_h) for h in range(heads)]

    def split_bias(b):
        return None if b is None else [b[r] for r in rows]

    return Attention(
        [PiecewiseConstant(w_q[r]) for r in rows],
        [PiecewiseConstant(w_k[r]) for r in rows],
        [PiecewiseConstant(w_v[r]) for r in rows],
        [PiecewiseConstant(w_o[:, r]) for r in rows],
        b_Q=split_bias(b_q), b_K=split_bias(b_k), b_V=split_bias(b_v), b_O=b_o,
        beta=math.sqrt(d_h), mask=mask,
    )


def feedforward_from_weights(w_1, b_1, w_2, b_2, activation: str):
    """The feed-forward operator of two linear layers and an activation."""
    return FeedForward(PiecewiseConstant(w_1), PiecewiseConstant(w_2), b_1=b_1, b_2=b_2,
                       activation=activation)


def layer_norm_from_weights(weight, bias, eps: float):
    """LayerNorm with piecewise-constant gain and shift (none when the module has none)."""
    return LayerNormProjection(gain=weight, shift=bias, eps=float(eps))
