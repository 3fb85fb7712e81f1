r"""Feature maps and the feed-forward operator, acting token by token.

Feature map (design notes, section 1) with kernel :math:`W` and bias :math:`b`:

.. math::  (W u)(x, y) = \int_Y W(y, \eta)\, u(x, \eta)\, d\eta + b(y).

Feed-forward operator with activation :math:`\phi`:

.. math::  F(u)(x, y) = \int_R W_2(y, r)\, \phi\big((W_1 u)(x, r) + b_1(r)\big)\, dr + b_2(y).

Gated feed-forward operator (SwiGLU with :math:`\phi = \mathrm{silu}`, GeGLU with a GELU;
design notes, section 10): a product of two feature integral operators in the hidden variable,

.. math::

    F(u)(x, y) = \int_R W_2(y, r)\, \phi\big((W_g u)(x, r) + b_g(r)\big)
        \big((W_u u)(x, r) + b_u(r)\big)\, dr + b_2(y).

With midpoint grids and :class:`~ctformer.kernels.PiecewiseConstant` kernels these are exactly
``nn.Linear``, ``Linear -> activation -> Linear`` (design notes, section 2) and the
``down(act(gate(u)) * up(u))`` MLP of Llama-family networks.

The activations :math:`\phi` (:data:`ACTIVATIONS`: relu, gelu, gelu_tanh, silu) live in
:mod:`ctformer.operators.activations`.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import namespace
from ..kernels import Kernel
from .activations import ACTIVATIONS, gelu, gelu_tanh, get_activation, is_built_in, loop_kind, one_block, overwrite, \
    relu, silu
from .base import Constants, Grids, Operator
from .small_plans import SmallPlans
from .functions import as_feature_function, named_parameters
from .._numerics.elementwise import multiply_into
from .._numerics.few_rows import FewRowsMatrix
from .._numerics.gemm import packed_rows, rows_product, threaded_rows
from .._numerics.threads import by_row_blocks

__all__ = ["FeatureMap", "FeedForward", "GatedFeedForward", "ACTIVATIONS", "get_activation", "relu", "gelu", "gelu_tanh", "silu"]


def _activation(activation) -> tuple:
    """(name, function) of an activation given by name or as a callable."""
    name = activation if isinstance(activation, str) else getattr(activation, "__name__", "custom")
    return name, get_activation(activation)


def _pointwise(op) -> "Callable":
    r"""``op``'s activation; a custom one is wrapped to refuse an output of another shape.

    An activation acts pointwise, :math:`\phi(v)(r) = \phi(v(r))`, so its output has the
    shape of its input; the built-in ones do by construction.
    """
    phi, name = op.phi, op.activation_name
    if is_built_in(name, phi):
        return phi

    def checked(v):
        out = phi(v)
        shape = tuple(getattr(out, "shape", ()))
        if shape != tuple(v.shape):
            raise ValueError(f"activation {name!r} must act pointwise and return an array of its "
                             f"input's shape {tuple(v.shape)}, got {type(out).__name__} of shape "
                             f"{shape}; apply it elementwise (e.g. with the array's own functions)")
        return out

    return checked


def _affine(kernel, bias, out, inp):
    r"""The discretized map :math:`v \mapsto \int W(\cdot, \eta) v(\eta) d\eta + b` along the last axis.

    A dense kernel with host parameters becomes one product with its transposed matrix
    (:meth:`Kernel.transposed_matrix`: in the discrete limit a view of a
    :class:`~ctformer.kernels.PiecewiseConstant` weight, no copy), held
    by a :class:`Constants` (a dictionary lookup per use), and the bias is added in place to
    that new product; kernels with their own algorithm (FFT convolutions) or with tensor
    parameters go through :meth:`Kernel.apply`. ``bias`` is a feature function.
    """
    constants = Constants(bias=bias.evaluate(out))
    if _dense_host(kernel):
        return _DenseMap(Constants(bias=constants.host["bias"], matrix_t=kernel.transposed_matrix(out, inp)))

    def apply(v):
        z = kernel.apply(v, out, inp, axis=-1)  # may be any array: never changed in place
        bias = constants("bias", v)
        return z if bias is None else z + bias

    return apply


class _DenseMap:
    """``v -> v M + b``, a dense host kernel's map: one product, the bias added in place."""

    __slots__ = ("constants", "width")

    def __init__(self, constants):
        self.constants, self.width = constants, constants.host["matrix_t"].shape[-1]

    def __call__(self, v):
        constants = self.constants
        return rows_product(v, constants("matrix_t", v), constants("bias", v),
                            constants.prepared("matrix_t", "bias", v))

    def small(self, like):
        """This map for small NumPy rows shaped like ``like`` (:meth:`Constants.small_product`)."""
        return self.constants.small_product("matrix_t", "bias", like)


# One evaluation over many tokens keeps its hidden arrays (rows x hidden width) within about
# this many bytes: longer inputs go through the map in chunks of rows (each still in row
# blocks on the workers), so that a long sequence needs memory for its output, not for
# rows x hidden width (a GatedFeedForward of 3072 hidden nodes had taken 402 MiB beside a
# 16 MiB output at 32768 tokens, float64).
_HIDDEN_CHUNK_BYTES = 64 << 20
# ... and a chunk holds a multiple of this many rows (eight row blocks of 256: the workers').
_HIDDEN_CHUNK_MIN_ROWS = 2048


def _in_row_chunks(flow, width: int, arrays: int):
    r"""``flow``, a token-wise map, on NumPy inputs of many rows in chunks whose ``arrays``
    hidden arrays of ``width`` nodes take about ``_HIDDEN_CHUNK_BYTES`` (at least
    ``_HIDDEN_CHUNK_MIN_ROWS`` rows), written into one output; other inputs as they are.
    The map acts row by row, so the chunks change no value: its peak memory beyond the
    output is then independent of the number of tokens."""
    def chunked(u):
        if type(u) is not np.ndarray or u.ndim < 2 or not u.shape[-1]:
            return flow(u)
        rows, d = u.size // u.shape[-1], u.shape[-1]
        step = _HIDDEN_CHUNK_BYTES // max(1, width * arrays * u.dtype.itemsize)
        step = max(1, step // _HIDDEN_CHUNK_MIN_ROWS) * _HIDDEN_CHUNK_MIN_ROWS  # whole row blocks
        if rows <= step:
            return flow(u)
        flat = u.reshape(rows, d)
        first = flow(flat[:step])
        out = np.empty((rows, first.shape[-1]), dtype=first.dtype)
        out[:step] = first
        del first
        for start in range(step, rows, step):
            out[start:start + step] = flow(flat[start:start + step])
        return out.reshape(*u.shape[:-1], out.shape[-1])
    return chunked


def _hidden_like(u, width: int):
    """An array shaped as ``u`` with its last axis ``width`` wide: what a plan's second
    product and activation will see."""
    return np.empty((*u.shape[:-1], width), dtype=u.dtype)


def _activated(product, phi, hidden):
    """``v -> phi(product(v))`` for a small plan (``hidden``: the product's output, as an
    array of its shape and dtype). Where ``product`` is the compiled few-row kernel and
    ``phi`` has a compiled loop, the kernel applies it to each block of columns on the thread
    that computed the block: a 16-token float64 MiniLM layer's GELU had run on one thread
    after the product (123 us of 24,576 entries), now in halves beside it; the same bits
    (AMD EPYC, family 23 model 49)."""
    kind = loop_kind(phi)
    if kind is not None and isinstance(product, FewRowsMatrix):
        return product.then(kind)
    act = one_block(phi, hidden) or phi
    return lambda v: act(product(v))


def _dense_host(kernel) -> bool:
    return type(kernel).apply is Kernel.apply and kernel._host()


def _set_components(op, kernels: dict, biases: dict, activation) -> None:
    """Checked kernels and feature-function biases as attributes of ``op``, and its activation."""
    for name, kernel in kernels.items():
        setattr(op, name, _check_kernel(kernel, name))
    for name, bias in biases.items():
        setattr(op, name, as_feature_function(bias, name))
    op.activation_name, op.phi = _activation(activation)


class _Refusing(Operator):
    """An operator whose public call refuses a result that overflows its dtype (a solve
    evaluates the discretized map and checks its own state, so that path pays nothing)."""

    def __call__(self, u, grids: Grids, **kwargs):
        """Apply the operator (:meth:`Operator.__call__`), refusing a non-finite result.

        Raises
        ------
        FloatingPointError
            If the result is not finite although ``u`` is: an intermediate or the result
            exceeds the largest number of ``u``'s dtype (float32: 3.4e38), so the exact value
            is not representable there; the message gives ``max |u|`` and the remedy.
        """
        with np.errstate(over="ignore", invalid="ignore"):  # the exception below says it once
            out = super().__call__(u, grids, **kwargs)
        xp = namespace(out)
        if not bool(xp.all(xp.isfinite(out))):
            scale = float(xp.max(xp.abs(u))) if math.prod(u.shape) else 0.0
            dtype = str(u.dtype).removeprefix("torch.")
            wider = "" if dtype == "float64" else " or pass u as float64"
            raise FloatingPointError(
                f"{type(self).__name__} of u overflows {dtype}: with max |u| = {scale:.3g} an "
                f"intermediate or the result exceeds the largest {dtype} number, so it is not "
                f"representable; scale u (or the weights) down{wider}")
        return out


def _check_kernel(kernel, name):
    if not isinstance(kernel, Kernel):
        raise TypeError(f"{name} must be a ctformer.kernels.Kernel, got {type(kernel).__name__}")
    return kernel


class FeatureMap(_Refusing):
    r"""The feature integral operator :math:`u \mapsto \int_Y W(y, \eta) u(x, \eta) d\eta + b(y)`.

    Parameters
    ----------
    kernel : Kernel
        :math:`W`, mapping features to features.
    bias : feature function, optional
        :math:`b(y)`; see :mod:`ctformer.operators.functions`.

    Raises
    ------
    TypeError
        If ``kernel`` is not a :class:`~ctformer.kernels.Kernel`.
    """

    def __init__(self, kernel, bias=None):
        self.kernel = _check_kernel(kernel, "kernel")
        self.bias = as_feature_function(bias, "bias")

    def parameters(self) -> dict:
        """Named arrays of the kernel and the bias."""
        return named_parameters(kernel=self.kernel, bias=self.bias)

    def _discretize(self, grids: Grids):
        return _affine(self.kernel, self.bias, grids.features, grids.features)


class FeedForward(_Refusing):
    r"""The feed-forward operator :math:`F(u) = W_2\, \phi(W_1 u + b_1) + b_2` through :math:`R`.

    Parameters
    ----------
    W_1 : Kernel
        Features :math:`Y` to the hidden variable :math:`R`.
    W_2 : Kernel
        :math:`R` back to :math:`Y`.
    b_1 : feature function, optional
        Bias on :math:`R`.
    b_2 : feature function, optional
        Bias on :math:`Y`.
    activation : {"relu", "gelu", "gelu_tanh", "silu"} or callable
        :math:`\phi`; ``"gelu"`` is the exact (erf) GELU. Default ``"gelu"``. A callable
        must act elementwise: an output of another shape than its input is refused with
        :class:`ValueError` naming the activation, when the operator is applied.

    Raises
    ------
    TypeError
        If a kernel is not a :class:`~ctformer.kernels.Kernel`.
    ValueError
        If the activation name is unknown (the message lists the valid ones).
    """

    def __init__(self, W_1, W_2, b_1=None, b_2=None, activation="gelu"):
        _set_components(self, dict(W_1=W_1, W_2=W_2), dict(b_1=b_1, b_2=b_2), activation)

    def parameters(self) -> dict:
        """Named arrays of the two kernels and the two biases."""
        return named_parameters(W_1=self.W_1, W_2=self.W_2, b_1=self.b_1, b_2=self.b_2)

    def _discretize(self, grids: Grids):
        y, r = grids.features, grids.hidden
        w_1, w_2, phi = _affine(self.W_1, self.b_1, r, y), _affine(self.W_2, self.b_2, y, r), _pointwise(self)
        # a dense first map's output is a new array that only phi reads: phi may overwrite it
        fresh = _dense_host(self.W_1) and is_built_in(self.activation_name, self.phi)

        def feedforward(u):
            hidden = w_1(u)
            if fresh:
                done = overwrite(phi, hidden)
                if done is not None:
                    return w_2(done)
            return w_2(phi(hidden))

        dense = _dense_host(self.W_1) and _dense_host(self.W_2)
        general = _in_row_chunks(by_row_blocks(feedforward, whole=threaded_rows if dense else None,
                                               packed=packed_rows if dense else None), r.n, 2)
        if not dense:
            return general

        def plan(u):
            first = w_1.small(u)
            hidden = _hidden_like(u, w_1.width)
            second = None if first is None else w_2.small(hidden)
            if second is None:
                return None
            activated = _activated(first, phi, hidden)
            return lambda v: second(activated(v))

        return SmallPlans(general, plan)


class GatedFeedForward(_Refusing):
    r"""The gated feed-forward operator :math:`F(u) = W_2\,\big(\phi(W_g u + b_g) \odot (W_u u + b_u)\big) + b_2`.

    Parameters
    ----------
    W_gate : Kernel
        Features :math:`Y` to the hidden variable :math:`R`: the gate :math:`W_g`.
    W_up : Kernel
        Features :math:`Y` to :math:`R`: the linear branch :math:`W_u`.
    W_2 : Kernel
        :math:`R` back to :math:`Y` (the "down" projection).
    b_gate, b_up : feature function, optional
        Biases on :math:`R`.
    b_2 : feature function, optional
        Bias on :math:`Y`.
    activation : {"silu", "gelu", "gelu_tanh", "relu"} or callable
        :math:`\phi` of the gate: ``"silu"`` is SwiGLU (Llama, Mistral, Qwen2), ``"gelu"`` or
        ``"gelu_tanh"`` GeGLU. Default ``"silu"``. A callable must act elementwise (an
        output of another shape is refused with :class:`ValueError` when applied).

    Raises
    ------
    TypeError
        If a kernel is not a :class:`~ctformer.kernels.Kernel`.
    ValueError
        If the activation name is unknown (the message lists the valid ones).

    Notes
    -----
    The product :math:`\phi(W_g u)(r)\,(W_u u)(r)` is pointwise in :math:`r`, so on any
    discretization of :math:`R` it is the product of the node values; the :math:`r` integral
    is the hidden quadrature inside :math:`W_2`.
    """

    def __init__(self, W_gate, W_up, W_2, b_gate=None, b_up=None, b_2=None, activation="silu"):
        _set_components(self, dict(W_gate=W_gate, W_up=W_up, W_2=W_2),
                        dict(b_gate=b_gate, b_up=b_up, b_2=b_2), activation)

    def __repr__(self) -> str:
        return f"GatedFeedForward(activation={self.activation_name!r})"

    def parameters(self) -> dict:
        """Named arrays of the three kernels and the three biases."""
        return named_parameters(W_gate=self.W_gate, W_up=self.W_up, W_2=self.W_2,
                                b_gate=self.b_gate, b_up=self.b_up, b_2=self.b_2)

    def _discretize(self, grids: Grids):
        y, r = grids.features, grids.hidden
        w_gate, w_up = _affine(self.W_gate, self.b_gate, r, y), _affine(self.W_up, self.b_up, r, y)
        w_2, phi = _affine(self.W_2, self.b_2, y, r), _pointwise(self)
        fresh = is_built_in(self.activation_name, self.phi)  # returns a new array for NumPy input
        dense_gate = fresh and _dense_host(self.W_gate)  # its new output only phi reads

        def gated_feedforward(u):
            product = w_gate(u)
            gate = overwrite(phi, product) if dense_gate else None
            gate, up = phi(product) if gate is None else gate, w_up(u)
            if fresh and type(gate) is np.ndarray and type(up) is np.ndarray \
                    and gate.shape == up.shape and gate.dtype == up.dtype:
                # the activation's own new array takes the product: no third array of the
                # hidden width per evaluation (the same bits; torch's threads when large)
                return w_2(multiply_into(gate, up))
            return w_2(gate * up)

        dense = all(_dense_host(w) for w in (self.W_gate, self.W_up, self.W_2))
        general = _in_row_chunks(by_row_blocks(gated_feedforward, whole=threaded_rows if dense else None,
                                               packed=packed_rows if dense else None), r.n, 3)
        if not dense:
            return general

        def plan(u):
            gate, up = w_gate.small(u), w_up.small(u)
            hidden = _hidden_like(u, w_gate.width)
            down = None if gate is None or up is None or w_up.width != w_gate.width else w_2.small(hidden)
            if down is None:
                return None
            activated = _activated(gate, phi, hidden)
            if fresh:
                return lambda v: down(multiply_into(activated(v), up(v)))
            return lambda v: down(activated(v) * up(v))

        return SmallPlans(general, plan)
