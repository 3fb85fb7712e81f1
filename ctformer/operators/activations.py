r"""Pointwise activations :math:`\phi` of the feed-forward operator, in any array namespace.

.. math::

    \mathrm{relu}(z) = \max(z, 0), \qquad
    \mathrm{gelu}(z) = z\,\Phi(z) = \tfrac{z}{2}\big(1 + \mathrm{erf}(z / \sqrt{2})\big),

    \mathrm{gelu\_tanh}(z) = \tfrac{z}{2}\Big(1 + \tanh\big(\sqrt{2/\pi}\,(z + 0.044715 z^3)\big)\Big)
        = z\,\sigma\big(2\sqrt{2/\pi}\,(z + 0.044715 z^3)\big),
    \qquad \mathrm{silu}(z) = z\,\sigma(z) = \frac{z}{1 + e^{-z}},

with :math:`\Phi` the standard normal distribution function and :math:`\sigma` the logistic
function. ReLU is the projection onto :math:`\{v \ge 0\}` (Tai et al.).

Torch tensors use torch's fused functions (``torch.nn.functional.gelu``, ``silu``, ``relu``:
one pass each, where the formulas as tensor operations took four to six; a 128-token MiniLM
forward on torch tensors spent 1.3x HuggingFace's time), CuPy arrays their library's ``erf``.
torch's GELU is the form :math:`\tfrac{z}{2}(1 + \mathrm{erf}(z/\sqrt2))`, which cancels in
the negative tail: accurate there to :math:`\epsilon |z|` absolutely, not relatively (as the
HuggingFace modules compute it); the NumPy path below is relatively accurate everywhere. NumPy arrays take a faster path
whose results are the same to rounding: the array is cut into blocks that stay in cache, each
block is finished with a few in-place passes, and large arrays share the blocks among threads
(NumPy's element-wise loops release the GIL; the result does not depend on the thread count,
each element being computed alone). On NumPy:

* ``gelu`` is :math:`z\,\Phi(z)`, relatively accurate in the negative tail, where the
  form :math:`1 + \mathrm{erf}` cancels: in float64 with SciPy's ``ndtr``; in float32 with
  :math:`\Phi(-|z|) = \mathrm{erfc}(|z|/\sqrt 2)/2` from the erfc approximation of
  Press et al. (Numerical Recipes, 2nd ed., section 6.2: :math:`\mathrm{erfc}(a) \approx t
  \exp(-a^2 + P_9(t))`, :math:`t = 1/(1 + a/2)`, relative error below :math:`1.2 \cdot 10^{-7}`
  for every :math:`a \ge 0`), which is float32's own precision, as
  :math:`\mathrm{gelu}(z) = \max(z, 0) - |z|\,\Phi(-|z|)` (one form for both signs), in
  about 30 in-place passes over per-thread work arrays: 4-5x faster than SciPy's ``erf``;
* ``gelu_tanh`` and ``silu`` use the logistic forms above: one ``exp`` and no ``tanh``, and
  relatively accurate in both tails (the tanh form cancels for large negative ``z``).

Where Numba is installed (``CTFORMER_LOOP_ENGINE``, :mod:`ctformer._numerics.compiled`) the
same formulas run as one compiled pass per element, with a vectorized ``exp``: ``gelu_tanh``
and ``silu`` in both precisions and float32 GELU. Float64 GELU then uses
:math:`\Phi(-a) = e^{-a^2/2} t\, G(x(a))` of :mod:`ctformer._numerics.normal_tail`, a
degree-23 polynomial in a rational function of :math:`a` (relative error below 3 ulp over the
whole range, against SciPy's ``ndtr`` on the NumPy path; about 10x faster).

A feed-forward operator whose first product is a new array that nothing else reads has the
activation written over it (:func:`overwrite`, compiled loops that work in place): the same
bits, and one array of the hidden width less in every layer.

Every activation returns an array of its input's dtype. NumPy float16 arrays are evaluated in
float32 by the paths above and rounded once to float16: over all 63488 finite float16 inputs
the result is within 0.5002 float16 ulp of the exact value (float16 arithmetic would round at
each step of a formula: SiLU computed in float16 was up to 8.5 ulps off, the tanh form of the
tanh GELU up to 2000 ulps in its cancelling negative tail).

The registry. :data:`ACTIVATIONS` maps each name a model, a bridge or the command line accepts
(``FeedForward(..., activation="gelu")``, ``ctformer study --activation gelu``) to its
function. A new activation is one function plus one call of :func:`register_activation`::

    def softplus(z):
        xp = array_api_compat.array_namespace(z)
        return xp.logaddexp(z, xp.zeros_like(z))

    register_activation("softplus", softplus)

after which ``"softplus"`` is a valid name everywhere the registry is read (the command line's
``--activation`` choices included). Its output must have its input's shape (a feed-forward
operator refuses any other, naming the activation, when applied).
"""
from __future__ import annotations

import math
import threading
from types import FunctionType
from typing import Callable

import array_api_compat
import numpy as np
from scipy.special import erf as _scipy_erf
from scipy.special import ndtr as _scipy_ndtr

from ..backend import namespace
from .._numerics import compiled as _compiled
from .._numerics import threads as _threads
from .._numerics.normal_tail import ERFC_COEFFICIENTS as _ERFC_COEFFICIENTS
from .._numerics.normal_tail import TANH_GELU as _TANH_GELU

__all__ = ["ACTIVATIONS", "get_activation", "register_activation", "is_built_in", "loop_kind", "one_block", "overwrite",
           "relu", "gelu", "gelu_tanh", "silu"]

# Elements per block: 256-512 KiB, so the passes of a block stay in L2, and long enough that
# two threads do not queue for the GIL between passes (smaller blocks were 2x slower threaded).
_BLOCK = 1 << 16
# Arrays with fewer elements run on the calling thread only: a pass of the pool costs a
# wake-up of its threads (45-60 us on a virtual AMD EPYC, family 26 model 2), which the cheap
# activations (one exponential per element) win back only from about 2^19 elements (a tanh
# GELU of 128 x 1536 float32 values took 88 us on two threads, 46 on one; SiLU of 384 x
# 1536, 136 against 104), the exact GELU (a polynomial and an exponential) from 2^17.
_THREADED_MIN = 1 << 17
_THREADED_MIN_CHEAP = 1 << 19
_SQRT_HALF = math.sqrt(0.5)


def _host_float(z) -> bool:
    return type(z) is np.ndarray and z.dtype in (np.float32, np.float64)


def _host_half(z) -> bool:
    return type(z) is np.ndarray and z.dtype == np.float16


def via_float32(function, z, name: str):
    r"""``function(z)`` for a NumPy float16 ``z``: computed on float32 and rounded once to float16.

    Float16 keeps 11 significant bits, so a float32 evaluation (24 bits) rounded once is within
    half an ulp of float16 (plus float32's own error, :math:`2^{-13}` of that ulp), where
    arithmetic in float16 itself would round at every step.

    Raises
    ------
    OverflowError
        If a finite float32 value exceeds float16's largest number, 65504 (it would round to
        inf); the message names ``name`` and the remedy (a float32 state).
    """
    wide = function(z.astype(np.float32))
    with np.errstate(over="ignore"):
        out = wide.astype(np.float16)
    if not np.isfinite(out).all() and (np.isfinite(out) != np.isfinite(wide)).any():
        largest = float(np.abs(wide[np.isfinite(wide)]).max())
        raise OverflowError(f"{name} of a float16 state reaches {largest:.6g}, beyond float16's "
                            "largest number 65504 (it would round to inf); use a float32 state")
    return out


def _loop(name, numpy_kernel, dtype):
    """The compiled loop ``name`` for ``dtype`` where there is one, else ``numpy_kernel``."""
    made = _compiled.kernels()
    if made is None:
        return numpy_kernel
    return getattr(made, name + ("32" if dtype == np.float32 else "64"), numpy_kernel)


def _one_block(kernel, z):
    """``kernel`` on the C-contiguous ``z`` of at most ``_BLOCK`` elements: a new array."""
    out = np.empty_like(z)
    if isinstance(kernel, FunctionType):  # NumPy passes: exp(-z) -> inf is the right limit
        with np.errstate(over="ignore", under="ignore"):
            kernel(z.reshape(-1), out.reshape(-1))
    else:  # a compiled loop never signals through NumPy's error state (errstate: 2 us)
        kernel(z.reshape(-1), out.reshape(-1))
    return out


def _blockwise(kernel, z, threaded_min=_THREADED_MIN, over=False):
    """``kernel(z_block, out_block)`` over cache-sized blocks of ``z``, threaded from
    ``threaded_min`` elements; with ``over``, ``kernel(z_block)`` on the C-contiguous ``z``
    itself, which it returns."""
    z = z if over else np.ascontiguousarray(z)
    if z.size <= _BLOCK and not over:  # one block: no task list (small solves call this every step)
        return _one_block(kernel, z)
    out = z if over else np.empty_like(z)
    flat_z, flat_out = z.reshape(-1), out.reshape(-1)
    size = flat_z.size
    tasks = [(start, min(size, start + _BLOCK)) for start in range(0, size, _BLOCK)]

    def worker(next_task):
        with np.errstate(over="ignore", under="ignore"):  # exp(-z) -> inf is the right limit
            while (task := next_task()) is not None:
                a, b = task
                if over:
                    kernel(flat_z[a:b])
                else:
                    kernel(flat_z[a:b], flat_out[a:b])

    threads = _threads.num_threads() if size >= threaded_min else 1
    _threads.run_workers(worker, tasks, threads)
    return out


# The float32 GELU below folds constants into the coefficients: with a = |z| / sqrt(2),
# t = 1 / (1 + a / 2) = 1 / (1 + k |z|) and Phi(-|z|) = erfc(a) / 2 = t exp(P(t) - z^2 / 2 + ln 1/2).
_K = 0.5 * _SQRT_HALF
_FOLDED = (np.float32(_ERFC_COEFFICIENTS[0] + math.log(0.5)),) + tuple(
    np.float32(c) for c in _ERFC_COEFFICIENTS[1:])
_SCRATCH = threading.local()
# |z| is clamped here before it multiplies Phi(-|z|) = 0, so that z = inf gives inf, not NaN.
_CLAMP = np.float32(1e18)


def _scratch(size):
    """Three float32 work arrays of ``size`` for this thread (kept between calls)."""
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None or buffers[0].size < size:
        buffers = _SCRATCH.buffers = tuple(np.empty(max(size, _BLOCK), np.float32) for _ in range(3))
    return tuple(b[:size] for b in buffers)


def _gelu_block(z, out):
    if z.dtype == np.float64:
        _scipy_ndtr(z, out=out)
        out *= z
        return
    # gelu(z) = max(z, 0) - |z| Phi(-|z|): one form for both signs, no cancellation for z < 0
    size, t, square = _scratch(z.size)
    np.abs(z, out=size)
    np.minimum(size, _CLAMP, out=size)
    np.multiply(size, np.float32(_K), out=t)
    t += np.float32(1)
    np.reciprocal(t, out=t)
    np.multiply(t, _FOLDED[-1], out=out)
    for c in _FOLDED[-2:0:-1]:
        out += c
        out *= t
    out += _FOLDED[0]
    np.multiply(z, z, out=square)
    square *= np.float32(0.5)
    out -= square
    np.exp(out, out=out)
    out *= t                               # Phi(-|z|), relatively accurate
    out *= size
    np.maximum(z, np.float32(0), out=square)
    np.subtract(square, out, out=out)


def _logistic_times(z, out):
    """``out = z / (1 + exp(-s))`` for the ``s`` that ``out`` holds on entry."""
    np.negative(out, out=out)
    np.exp(out, out=out)
    out += 1
    np.divide(z, out, out=out)


def _gelu_tanh_block(z, out):
    np.square(z, out=out)
    out *= z.dtype.type(0.044715)
    out += 1
    out *= z
    out *= z.dtype.type(_TANH_GELU)
    _logistic_times(z, out)


def _silu_block(z, out):
    np.copyto(out, z)
    _logistic_times(z, out)


def relu(z):
    r""":math:`\max(z, 0)`; NaN stays NaN (as torch's ``relu``), so a NaN born in a solve is
    still reported rather than hidden as zero."""
    if array_api_compat.is_torch_array(z):
        return _torch_functional().relu(z)
    xp = namespace(z)
    return xp.where(z < 0, xp.zeros_like(z), z)


def _torch_functional():
    """``torch.nn.functional``: torch tensors take torch's own fused activations (one pass,
    computed in float32 for half-precision tensors, differentiable to any order), as the
    HuggingFace modules do; the formulas are the ones above."""
    import torch.nn.functional as functional

    return functional


def _erf(z):
    """The error function in the namespace of ``z`` (scipy, cupyx or torch.special)."""
    if type(z) is np.ndarray:
        return _scipy_erf(z)
    if array_api_compat.is_cupy_array(z):
        import cupyx.scipy.special as special
    elif array_api_compat.is_torch_array(z):
        import torch.special as special
    else:
        import scipy.special as special
    return special.erf(z)


def gelu(z):
    r"""Exact GELU, :math:`z\,\Phi(z) = \frac{z}{2}(1 + \mathrm{erf}(z / \sqrt{2}))` (torch's default).

    NumPy float32 arrays use an erfc approximation accurate to float32's precision (module
    docstring), float16 ones the float32 path rounded to float16 (the result is float16);
    every other array uses the library's ``erf``.
    """
    if _host_float(z):
        return _blockwise(_loop("gelu", _gelu_block, z.dtype), z)
    if _host_half(z):
        return via_float32(gelu, z, "gelu")
    if array_api_compat.is_torch_array(z):
        return _torch_functional().gelu(z)
    return z * 0.5 * (1.0 + _erf(z * _SQRT_HALF))


def gelu_tanh(z):
    r"""Tanh GELU, :math:`\frac{z}{2}(1 + \tanh(\sqrt{2/\pi}(z + 0.044715 z^3)))`, in ``z``'s dtype
    (NumPy float16: evaluated in float32, rounded once)."""
    if _host_float(z):
        return _blockwise(_loop("gelu_tanh", _gelu_tanh_block, z.dtype), z, _THREADED_MIN_CHEAP)
    if _host_half(z):
        return via_float32(gelu_tanh, z, "gelu_tanh")
    if array_api_compat.is_torch_array(z):
        return _torch_functional().gelu(z, approximate="tanh")
    xp = namespace(z)
    return 0.5 * z * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z * z * z)))


def silu(z):
    r"""SiLU, :math:`z / (1 + e^{-z})`, evaluated without overflow, in ``z``'s dtype (NumPy
    float16: evaluated in float32, rounded once)."""
    if _host_float(z):
        return _blockwise(_loop("silu", _silu_block, z.dtype), z, _THREADED_MIN_CHEAP)
    if _host_half(z):
        return via_float32(silu, z, "silu")
    if array_api_compat.is_torch_array(z):
        return _torch_functional().silu(z)
    xp = namespace(z)
    e = xp.exp(-xp.abs(z))  # in (0, 1]: no overflow for any z
    return z * xp.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# the built-in activations with a loop per dtype: its name among the compiled kernels, its
# NumPy passes, and the elements from which it runs on the threads
_LOOPS = {gelu: ("gelu", _gelu_block, _THREADED_MIN), gelu_tanh: ("gelu_tanh", _gelu_tanh_block, _THREADED_MIN_CHEAP),
          silu: ("silu", _silu_block, _THREADED_MIN_CHEAP)}


def overwrite(function, z):
    """``function(z)`` written over ``z``, for the built-in GELU, tanh GELU and SiLU on a
    C-contiguous, writable NumPy float32 or float64 ``z`` that the caller owns (a product's
    new output that nothing else reads): the same bits, without a second array of ``z``'s
    size. Returns ``z``, or None where that does not apply (another activation or array, or
    the NumPy engine, whose passes read ``z`` after writing the result); the caller then
    calls ``function(z)``.

    A feed-forward layer's hidden values are the largest arrays of a forward: a float32
    MiniLM forward of 8 x 128 tokens, alone in a process, made and freed one more of 3 MiB per
    layer and group, and the C library gave the memory back to the system and faulted it in
    again (9 000 faults a forward); over the product's output, none (AMD EPYC, family 23
    model 49)."""
    entry = _LOOPS.get(function)
    if entry is None or not _host_float(z) or not z.flags.c_contiguous or not z.flags.writeable:
        return None
    made = _compiled.kernels()
    if made is None:
        return None
    name, _, threaded_min = entry
    kernel = getattr(made, name + "_over" + ("32" if z.dtype == np.float32 else "64"))
    return _blockwise(kernel, z, threaded_min, over=True)


def loop_kind(function):
    """The kind of ``function``'s compiled loop (:func:`ctformer._numerics.loops.activation_over`)
    for a built-in GELU, tanh GELU or SiLU where the compiled engine is on; None otherwise. A
    kernel that computes the activation's input may then apply it where it computed it."""
    entry = _LOOPS.get(function)
    if entry is None or _compiled.kernels() is None:
        return None
    from .._numerics.loops import ACTIVATION_KINDS

    return ACTIVATION_KINDS[entry[0]]


def one_block(function, like):
    """What ``function`` (an activation) computes for NumPy arrays of ``like``'s dtype and
    size, as a callable ``z -> new array`` without the per-call dispatch: for the built-in
    GELU, tanh GELU and SiLU on float32 or float64 arrays of one cache block (a small state's
    hidden values), the loop chosen now (``CTFORMER_LOOP_ENGINE``), run on C-contiguous input;
    the same bits as ``function(z)``. None for other activations, dtypes and sizes."""
    entry = _LOOPS.get(function)
    if entry is None or not _host_float(like) or like.size > _BLOCK:
        return None
    kernel = _loop(*entry[:2], like.dtype)
    return lambda v: _one_block(kernel, v)


#: The registry of activations by name (extend it with :func:`register_activation`).
ACTIVATIONS: dict[str, Callable] = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}
_BUILT_IN = dict(ACTIVATIONS)


def register_activation(name: str, function: Callable) -> Callable:
    r"""Add the pointwise activation ``function`` to :data:`ACTIVATIONS` under ``name``.

    Parameters
    ----------
    name : str
        A new, non-empty name (models and studies record activations by name, so a name
        stands for one function: a registered name is never rebound).
    function : callable
        :math:`\phi`, applied to arrays of any namespace; it must act elementwise and return
        an array of its input's shape and dtype.

    Returns
    -------
    callable
        ``function`` itself.

    Raises
    ------
    TypeError
        If ``name`` is not a string or ``function`` is not callable.
    ValueError
        If ``name`` is empty or already registered (to a different function).
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    if not callable(function):
        raise TypeError(f"function must be callable, got {type(function).__name__}")
    if not name:
        raise ValueError("name must be a non-empty string")
    if ACTIVATIONS.get(name, function) is not function:
        raise ValueError(f"activation {name!r} is already registered (to {ACTIVATIONS[name]!r}); "
                         "choose another name")
    ACTIVATIONS[name] = function
    return function


def is_built_in(name: str, function: Callable) -> bool:
    """Whether ``function`` is the library's own activation ``name`` (elementwise by construction)."""
    return _BUILT_IN.get(name) is function


def get_activation(name) -> Callable:
    """The activation function called ``name`` (or ``name`` itself if it is callable).

    Parameters
    ----------
    name : str or callable
        A name of :data:`ACTIVATIONS`: ``"relu"``, ``"gelu"`` (erf), ``"gelu_tanh"``,
        ``"silu"``, or one added by :func:`register_activation`.

    Returns
    -------
    callable

    Raises
    ------
    ValueError
        If the name is unknown; the message lists the valid names.
    """
    if callable(name):
        return name
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid activations: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]
