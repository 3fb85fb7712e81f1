r"""Building continuous operators from the weights of a discrete network (design notes, section 2).

The discrete-limit dictionary: a weight :math:`A` of an ``nn.Linear`` (``out x in``) becomes the
kernel :class:`ctformer.kernels.PiecewiseConstant` with value :math:`d_{in} A_{ij}` on cell
:math:`(i, j)`, whose midpoint matrix is :math:`A` itself; a bias or a LayerNorm weight of
length :math:`d` is the piecewise-constant function with these cell values; the score scale
:math:`1/\sqrt{d_h}` of head :math:`h` is :math:`\beta_h \int_{Y_h} q k\, d\sigma` with the
midpoint weights :math:`1/d_h`, so :math:`\beta_h = \sqrt{d_h}`.

Decoders of the Llama family add grouped-query attention (:math:`H_{kv}` key/value heads, rows
:math:`g d_h, \dots, (g + 1) d_h - 1` of the key and value projections for key/value head
:math:`g`), RMSNorm (a piecewise-constant gain) and the gated feed-forward layer
``down(act(gate(u)) * up(u))`` (:func:`gated_feedforward_from_weights`).
"""
from __future__ import annotations

import importlib
import math

import numpy as np

from ..backend import to_host
from ..kernels import PiecewiseConstant
from ..operators import Attention, FeedForward, GatedFeedForward, LayerNormProjection, RMSNorm

#: What to install for the bridges (the README explains the CPU-only torch wheel).
INSTALL_HINT = 'pip install "ctformer[demo]" (install torch==2.13.0 first, see the README)'


def optional_import(module: str, caller: str):
    """Import an optional dependency of a bridge, or say which extra installs it.

    Raises
    ------
    ImportError
        Naming ``caller``, the missing package and the ``pip install`` command.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{caller} needs {module.split('.')[0]}, which is not installed: "
                          f"{INSTALL_HINT}") from exc


__all__ = ["to_numpy", "shared_weight", "ModuleWeight", "weight_kernel", "attention_from_weights",
           "grouped_attention_from_weights", "feedforward_from_weights", "gated_feedforward_from_weights",
           "layer_norm_from_weights", "rms_norm_from_weights", "state_tensors"]


#: dtypes of the weights the bridges take (float16 and bfloat16 are widened exactly).
WEIGHT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def to_numpy(tensor, name: str) -> np.ndarray | None:
    r"""A host float64 copy of a weight: a torch tensor or an array (``None`` stays ``None``).

    float16 and bfloat16 numbers (11 and 8 significant bits) are exactly representable in
    float32 and float64, so the copy is exact for every dtype of :data:`WEIGHT_DTYPES`; torch
    tensors of half precision are widened to float32 first (NumPy has no bfloat16).

    Raises
    ------
    TypeError
        For a tensor or array of another dtype (integer, boolean, complex, quantized): the
        message names the weight, its dtype and the accepted ones.
    ValueError
        If the weight contains NaN or inf.
    """
    if tensor is None:
        return None
    arr = np.array(to_host(_widen_half(tensor, name)), dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"weight {name} contains NaN or inf")
    return arr


def shared_weight(tensor, name: str, order: str = "C") -> np.ndarray | None:
    r"""The one float64 host array of a weight that a converted model holds (``None`` stays ``None``).

    A CPU float64 torch tensor (or a float64 NumPy array) is shared, not copied: the result is
    a read-only NumPy view of its memory (``tensor.detach().numpy()``), so the converted model
    and the module hold one copy of the weight between them. Any other dtype is converted
    once, exactly as :func:`to_numpy` does, into a new array of memory layout ``order``
    (``"C"``, the module's own layout, is the one the converters use: a matrix :math:`A`
    applied from the right as :math:`u A^T` is then read as the shared float64 weights are).

    A shared weight follows the module, but what the model derives from it (packed
    projections, float32 copies) does not: once the tensor is changed in place (training
    it), a solve of a model converted by :func:`ctformer.bridges.from_hf` raises
    :class:`~ctformer.shared_tensors.StaleConversionError`. Convert after training, or pass a
    copy (``copy.deepcopy(model).double()``) that nothing else changes.

    Raises
    ------
    TypeError, ValueError
        As :func:`to_numpy` (another dtype; NaN or inf).
    """
    if tensor is None:
        return None
    source = _widen_half(tensor, name)
    if hasattr(source, "detach") and hasattr(source, "cpu"):
        source = source.detach().cpu().numpy()  # a view for CPU tensors
    source = np.asarray(to_host(source))
    if source.dtype == np.float64:
        array = source.view()
    else:
        array = np.array(source, dtype=np.float64, order=order)
    # a sum is finite when every entry is (NaN and inf propagate); only an overflowing sum of
    # finite numbers takes the full check, which allocates a boolean array of the weight's size
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, or an overflowing sum
        finite = bool(np.isfinite(np.sum(array)))
    if not finite and not np.all(np.isfinite(array)):
        raise ValueError(f"weight {name} contains NaN or inf")
    array.flags.writeable = False
    return array


def _widen_half(tensor, name: str):
    """``tensor`` with a half-precision torch dtype widened to float32; other dtypes checked."""
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:  # lists, scalars: NumPy converts them
        return tensor
    kind = str(dtype).removeprefix("torch.")
    if kind not in WEIGHT_DTYPES:
        raise TypeError(f"weight {name} has dtype {kind}; the bridges take {', '.join(WEIGHT_DTYPES)} "
                        "weights (dequantize or cast the model first, e.g. model.float())")
    if kind in ("float16", "bfloat16") and hasattr(tensor, "float"):
        return tensor.detach().float()  # exact: every half-precision number is a float32
    return tensor


class ModuleWeight(PiecewiseConstant):
    """A :class:`~ctformer.kernels.PiecewiseConstant` over memory that its owner may still
    change: a float64 module's tensor (a view, not a copy), or a writable array. It is equal
    only to itself, as a kernel holding tensors is.

    Kernels are compared by their values, and equal kernels share the matrices cached for them,
    with the keys read once. After the module is trained in place, the keys of its converted
    model's kernels still describe the old values: a conversion of an untouched copy of the
    module found them equal and computed with the trained weights (0.025 to 0.041 away from its
    own network, without an error). Compared by identity, no conversion reads another's cache.
    """

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__


def _owned_elsewhere(a: np.ndarray) -> bool:
    """Whether ``a`` views memory that someone else can change: a torch tensor's (the root
    array does not own its buffer) or a writable array."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base is not None or a.flags.writeable


def weight_kernel(w: np.ndarray) -> PiecewiseConstant:
    """The kernel of a float64 weight, its memory kept (``copy=False``): a :class:`ModuleWeight`
    where that memory can change under the model, a value-compared kernel otherwise."""
    kind = ModuleWeight if type(w) is np.ndarray and _owned_elsewhere(w) else PiecewiseConstant
    return kind(w, copy=False)


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
    return FeedForward(weight_kernel(w_1), weight_kernel(w_2), b_1=b_1, b_2=b_2,
                       activation=activation)


def layer_norm_from_weights(weight, bias, eps: float):
    """LayerNorm with piecewise-constant gain and shift (none when the module has none)."""
    return LayerNormProjection(gain=weight, shift=bias, eps=float(eps))


def grouped_attention_from_weights(w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, *, heads: int, kv_heads: int,
                                   head_dim: int, beta: float | None = None, mask=None, positions=None,
                                   window=None, softcap=None):
    r"""Grouped-query attention from the weights of separate ``nn.Linear`` projections.

    Parameters
    ----------
    w_q : ndarray (heads * head_dim, d) or (heads, head_dim, d)
    w_k, w_v : ndarray (kv_heads * head_dim, d) or (kv_heads, head_dim, d)
        Rows grouped by head: head :math:`h` reads rows :math:`h d_h, \dots, (h + 1) d_h - 1`,
        or block ``[h]`` of the three-dimensional form (per-head views of a fused weight
        whose heads are not contiguous, GPT-NeoX's ``query_key_value``: no copy is made).
    w_o : ndarray (d, heads * head_dim)
    b_q, b_k, b_v, b_o : ndarray or None
        Biases of the four projections.
    heads, kv_heads, head_dim : int
        :math:`H`, :math:`H_{kv}` (dividing :math:`H`) and :math:`d_h`.
    beta : float, optional
        Inverse temperature; default :math:`\sqrt{d_h}` (score scale :math:`1/\sqrt{d_h}`).
    mask, positions, window, softcap
        Passed to :class:`ctformer.operators.Attention`.

    Raises
    ------
    ValueError
        If the weight shapes do not match the head counts.
    """
    for name, w, count in (("q", w_q, heads), ("k", w_k, kv_heads), ("v", w_v, kv_heads)):
        rows = w.shape[0] * w.shape[1] if w.ndim == 3 else w.shape[0]
        if rows != count * head_dim or (w.ndim == 3 and w.shape[1] != head_dim):
            raise ValueError(f"the {name} projection has shape {tuple(w.shape)}, expected {count * head_dim} rows "
                             f"({'heads' if name == 'q' else 'kv_heads'} x head_dim) or ({count}, {head_dim}, d)")
    if w_o.shape[1] != heads * head_dim:
        raise ValueError(f"the output projection has {w_o.shape[1]} columns, expected {heads * head_dim}")

    def blocks(count):
        return [slice(h * head_dim, (h + 1) * head_dim) for h in range(count)]

    def kernels(w, count):
        return [weight_kernel(w[h] if w.ndim == 3 else w[r]) for h, r in enumerate(blocks(count))]

    def split_bias(b, count):
        return None if b is None else [b[r] for r in blocks(count)]

    return Attention(
        kernels(w_q, heads), kernels(w_k, kv_heads), kernels(w_v, kv_heads),
        [weight_kernel(w_o[:, r]) for r in blocks(heads)],
        b_Q=split_bias(b_q, heads), b_K=split_bias(b_k, kv_heads), b_V=split_bias(b_v, kv_heads), b_O=b_o,
        beta=math.sqrt(head_dim) if beta is None else beta, mask=mask,
        kv_heads=kv_heads if kv_heads != heads else None, positions=positions, window=window,
        softcap=softcap,
    )


def gated_feedforward_from_weights(w_gate, b_gate, w_up, b_up, w_down, b_down, activation: str):
    """The gated feed-forward operator ``down(act(gate(u)) * up(u))`` of three linear layers."""
    return GatedFeedForward(weight_kernel(w_gate), weight_kernel(w_up), weight_kernel(w_down),
                            b_gate=b_gate, b_up=b_up, b_2=b_down, activation=activation)


def rms_norm_from_weights(weight, eps: float):
    """RMSNorm with a piecewise-constant gain (1 when the module has no weight)."""
    return RMSNorm(gain=1.0 if weight is None else weight, eps=float(eps))


def state_tensors(module, prefix: str = "") -> dict:
    """``name -> tensor`` of a module's parameters and persistent buffers, without ``prefix``."""
    return {name[len(prefix):]: tensor for name, tensor in module.state_dict().items()
            if name.startswith(prefix)}
