r"""The blockwise NumPy evaluation behind :mod:`ctformer.operators.activations`: blocks, threads,
in-place passes, compiled loops, and float16 through float32.

A NumPy float32 or float64 array is cut into blocks of :math:`2^{16}` elements, each block
finished by one kernel ``kernel(z_block, out_block)`` (``_blockwise``): the compiled loop of
:mod:`ctformer._numerics.compiled` where there is one (``_loop``), else the NumPy passes
below. Arrays of at least :math:`2^{17}` elements (exact GELU) or :math:`2^{19}` (tanh GELU,
SiLU) share their blocks among threads; each element is computed alone, so the result does not
depend on the thread count; with ``over=True`` a compiled in-place loop ``kernel(z_block)``
writes each block over itself (:func:`ctformer.operators.activations.overwrite`). The NumPy
passes compute

.. math::

    \mathrm{gelu}(z) = \max(z, 0) - |z|\,\Phi(-|z|), \qquad
    \Phi(-|z|) = \tfrac12 \mathrm{erfc}(a) \approx t \exp\big(P_9(t) - z^2/2 + \ln\tfrac12\big),
    \quad a = \frac{|z|}{\sqrt 2}, \quad t = \frac{1}{1 + a/2}

in float32 (:math:`P_9` the erfc polynomial of Press et al.,
:data:`ctformer._numerics.normal_tail.ERFC_COEFFICIENTS`, with :math:`\ln\frac12` folded into
its constant term; :math:`|z|` is clamped at :math:`10^{18}` before it multiplies
:math:`\Phi(-|z|)`, so that :math:`z = \infty` gives :math:`\infty`), :math:`\mathrm{gelu}(z)
= z\,\Phi(z)` in float64 with SciPy's ``ndtr`` for :math:`z \ge -5` and below with
:func:`ctformer._numerics.normal_tail.lower_tail`, the factor :math:`z` clamped at
:math:`-10^{18}` (so that :math:`z = -\infty` gives 0, the limit, as in float32 and the
compiled loops), and

.. math::

    \mathrm{gelu\_tanh}(z) = \frac{z}{1 + e^{-s}}, \quad s = 2\sqrt{2/\pi}\,(z + 0.044715 z^3),
    \qquad \mathrm{silu}(z) = \frac{z}{1 + e^{-z}}.

:func:`via_float32` evaluates a half-precision array (:func:`is_half`: NumPy or CuPy float16,
torch float16 or bfloat16) in float32 and rounds the result once to its dtype.
"""
from __future__ import annotations

import math
import sys
import threading
from types import FunctionType

import array_api_compat
import numpy as np
from scipy.special import ndtr as _scipy_ndtr

from .._numerics import compiled as _compiled
from .._numerics import threads as _threads
from .._numerics.normal_tail import ERFC_COEFFICIENTS as _ERFC_COEFFICIENTS
from .._numerics.normal_tail import TANH_GELU as _TANH_GELU
from .._numerics.normal_tail import lower_tail as _lower_tail

__all__ = ["via_float32", "is_half", "widened"]

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
# float64 GELU: below this z, Phi(z) by ctformer._numerics.normal_tail (SciPy's ndtr: 29 ulps at -5)
_NDTR_LOWEST = -5.0


def _host_float(z) -> bool:
    return type(z) is np.ndarray and z.dtype in (np.float32, np.float64)


def _host_half(z) -> bool:
    return type(z) is np.ndarray and z.dtype == np.float16


def is_half(z) -> bool:
    """Whether ``z`` is a half-precision array that the library evaluates in float32: NumPy or
    CuPy float16, torch float16 or bfloat16 (torch's own kernels accumulate those in float32)."""
    if type(z) is np.ndarray:
        return z.dtype == np.float16
    if array_api_compat.is_torch_array(z):
        torch = sys.modules["torch"]
        return z.dtype in (torch.float16, torch.bfloat16)
    return array_api_compat.is_cupy_array(z) and z.dtype == np.float16


def widened(z):
    """``z`` as float32, in its own array library (a half-precision array, :func:`is_half`)."""
    if type(z) is np.ndarray:
        return z.astype(np.float32)
    xp = array_api_compat.array_namespace(z)
    return xp.astype(z, xp.float32)


def via_float32(function, z, name: str):
    r"""``function(z)`` for a half-precision ``z`` (:func:`is_half`): computed on float32 and
    rounded once to ``z``'s dtype.

    Float16 keeps 11 significant bits, so a float32 evaluation (24 bits) rounded once is within
    half an ulp of float16 (plus float32's own error, :math:`2^{-13}` of that ulp), where
    arithmetic in float16 itself would round at every step.

    Raises
    ------
    OverflowError
        If a finite float32 value exceeds float16's largest number, 65504 (it would round to
        inf); the message names ``name`` and the remedy (a float32 state).
    """
    if type(z) is not np.ndarray:  # torch or CuPy
        xp = array_api_compat.array_namespace(z)
        wide = function(widened(z))
        out = xp.astype(wide, z.dtype)
        # bfloat16 has float32's range; float16 ends at 65504 (one host sync, float16 only)
        if str(z.dtype).endswith("float16") and not str(z.dtype).endswith("bfloat16") \
                and not bool(xp.all(xp.isfinite(out) == xp.isfinite(wide))):
            raise OverflowError(f"{name} of a float16 state exceeds float16's largest number 65504 "
                                "(it would round to inf); use a float32 state")
        return out
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
    if isinstance(kernel, FunctionType):  # NumPy passes: exp(-z) -> inf is the right limit;
        # an inf or NaN entry's invalid operations give its documented value (the compiled loops never warn)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            kernel(z.reshape(-1), out.reshape(-1))
    else:  # a compiled loop never signals through NumPy's error state (errstate: 2 us)
        kernel(z.reshape(-1), out.reshape(-1))
    return out


def _blockwise(kernel, z, threaded_min=_THREADED_MIN, over=False):
    """``kernel(z_block, out_block)`` over cache-sized blocks of ``z``, threaded from
    ``threaded_min`` elements; with ``over``, ``kernel(z_block)`` on the C-contiguous ``z``
    itself, which it returns."""
    if not z.flags.c_contiguous:  # only then: np.ascontiguousarray makes a 0-d array 1-d
        z = np.ascontiguousarray(z)
    if z.size <= _BLOCK and not over:  # one block: no task list (small solves call this every step)
        return _one_block(kernel, z)
    out = z if over else np.empty_like(z)
    flat_z, flat_out = z.reshape(-1), out.reshape(-1)
    size = flat_z.size
    tasks = [(start, min(size, start + _BLOCK)) for start in range(0, size, _BLOCK)]

    def worker(next_task):
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # as the compiled loops: no warnings
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
        # below -5 SciPy's ndtr loses ulps as z^2 grows (its exp(-z^2/2) takes z^2 rounded: 450
        # near z = -20, 1950 near -37): there the library's tail formula, to a few ulps (few entries),
        # with z clamped at -1e18 as a factor, as the compiled loop (-inf * Phi(-inf) is NaN; 0)
        tail = np.flatnonzero(z < _NDTR_LOWEST)
        if tail.size:
            low = z[tail]
            out[tail] = np.maximum(low, -1e18) * _lower_tail(-low)
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
