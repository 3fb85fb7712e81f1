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
  form :math:`1 + \mathrm{erf}` cancels: in float64 with SciPy's ``ndtr`` for :math:`z \ge -5`
  and :func:`ctformer._numerics.normal_tail.lower_tail` below (``ndtr`` takes :math:`z^2`
  rounded there, 2.3e-13 relative at :math:`z = -37`): relative error below
  :math:`10^{-14}` down to the smallest normal result (against mpmath); in float32 with
  :math:`\Phi(-|z|) = \mathrm{erfc}(|z|/\sqrt 2)/2` from the erfc approximation of
  Press et al. (Numerical Recipes, 2nd ed., section 6.2: :math:`\mathrm{erfc}(a) \approx t
  \exp(-a^2 + P_9(t))`, :math:`t = 1/(1 + a/2)`, relative error below :math:`1.2 \cdot 10^{-7}`
  for every :math:`a \ge 0`), which is float32's own precision, as
  :math:`\mathrm{gelu}(z) = \max(z, 0) - |z|\,\Phi(-|z|)` (one form for both signs), in
  about 30 in-place passes over per-thread work arrays: 4-5x faster than SciPy's ``erf``.
  Its relative error against float64 (4 10^7 random points) is below :math:`10^{-6}` for
  :math:`|z| \le 3` and grows in the negative tail with :math:`z^2/2`, the exponent rounded to
  float32: 2.2e-6 on :math:`[-6, -3]`, 7.9e-6 on :math:`[-13, -10]` (the compiled loop: 1.3e-6
  and 4.2e-6, and 0 for results below about :math:`10^{-37}`, :math:`z < -13.1`);
* ``gelu_tanh`` and ``silu`` use the logistic forms above: one ``exp`` and no ``tanh``, and
  relatively accurate in both tails (the tanh form cancels for large negative ``z``) until
  :math:`e^{-z}` (:math:`e^{-s}`) overflows to inf and the result is :math:`-0`: SiLU below
  :math:`z = -88.72` in float32 (:math:`-709.78` in float64), where the exact value is at most
  2.6e-37 (3.9e-306) in magnitude, and the tanh GELU below :math:`z = -10.06` (:math:`-21.16`),
  where it is at most 3.0e-38 (1.2e-307); at :math:`z = -10^{30}` both give :math:`-0`.

Where Numba is installed (``CTFORMER_LOOP_ENGINE``, :mod:`ctformer._numerics.compiled`) the
same formulas run as one compiled pass per element, with a vectorized ``exp``: ``gelu_tanh``
and ``silu`` in both precisions and float32 GELU. Float64 GELU then uses
:math:`\Phi(-a) = e^{-a^2/2} t\, G(x(a))` of :mod:`ctformer._numerics.normal_tail`, a
degree-23 polynomial in a rational function of :math:`a` (relative error below
:math:`4 \cdot 2^{-52}` wherever the result is a normal number, against mpmath; about 10x
faster than the NumPy path).

A feed-forward operator whose first product is a new array that nothing else reads has the
activation written over it (:func:`overwrite`, compiled loops that work in place): the same
bits, and one array of the hidden width less in every layer.

Non-finite entries: NaN stays NaN. On NumPy arrays (both engines) ``gelu`` gives 0 at
:math:`-\infty` and :math:`\infty` at :math:`\infty`, its limits; ``gelu_tanh`` and ``silu``
give NaN at :math:`-\infty` (:math:`-\infty / \infty`), as torch's functions do. Torch
tensors get torch's own values (its float32 ``gelu`` is NaN at :math:`\pm\infty`, and its
vectorized CPU loop gives inf for finite :math:`z` above :math:`1.70 \cdot 10^{38}`, half
float32's largest number, where the NumPy paths give :math:`z`).

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
from typing import Callable

import array_api_compat
import numpy as np
from scipy.special import erf as _scipy_erf

from ..backend import namespace
from .._numerics import compiled as _compiled
# the blockwise NumPy evaluation, re-exported here where it was defined before
from .activation_blocks import (_BLOCK, _CLAMP, _FOLDED, _K, _SCRATCH, _SQRT_HALF,  # noqa: F401
                                _THREADED_MIN, _THREADED_MIN_CHEAP, _blockwise, _gelu_block,
                                _gelu_tanh_block, _host_float, _host_half, _logistic_times, _loop,
                                _one_block, _scratch, _silu_block, via_float32)

__all__ = ["ACTIVATIONS", "get_activation", "register_activation", "is_built_in", "loop_kind", "one_block", "overwrite",
           "relu", "gelu", "gelu_tanh", "silu"]


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
        if z.dtype.kind == "f" and z.dtype.itemsize > 8:
            raise TypeError(f"the exact GELU of a {z.dtype} (long double) state: SciPy's erf has no "
                            "long-double loop; pass the state as float64 (u.astype(np.float64)), or "
                            "use activation='gelu_tanh'")
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
