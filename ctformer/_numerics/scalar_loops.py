"""The scalar functions that the Numba kernels of :mod:`ctformer._numerics.loops` inline
(imported only when they are used).

The kernels' compile flags and decorators (``jit``, ``inline``); the bit casts, the fused
multiply-add and LLVM's ``maxnum`` (Numba intrinsics); the exponential that the compiler can
vectorize, in float64 and float32 (:func:`exp_`, and :func:`exp_nonpositive_` for a softmax's
x <= 0), each picked by the argument's precision (``_in_precision``); Horner's rule over a
short tuple; and :func:`like_`, a number rounded to another's precision. The other kernel
files import them through :mod:`ctformer._numerics.loops`.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import kernel_cache as _kernel_cache

_kernel_cache.install()  # before any kernel is defined: see kernel_cache

# 'contract' lets LLVM fuse multiply-adds; no flag that changes inf/NaN semantics.
FLAGS = frozenset({"contract"})
# float32 e^r = 1 + r + r^2 P(r) on |r| <= ln2/2, P of degree 4: the minimax fit of the relative
# error (a linear program over 4001 points; 3.1e-9, a twentieth of an ulp), within 0.996 ulp of
# e^x after rounding on 10^7 points. Cephes expf's degree-5 polynomial was no more accurate
# after rounding (1.02 ulp) and cost one multiply-add more: softmax rows took 0.89 ns an entry
# against 0.82 (float32, AVX2, AMD EPYC family 23 model 49).
EXP32_POLYNOMIAL = (1.3814613272e-03, 8.3687098241e-03, 4.1668387361e-02, 1.6666520690e-01,
                    4.9999993452e-01)
jit = njit(nogil=True, cache=True, fastmath=set(FLAGS), error_model="numpy")
inline = njit(nogil=True, cache=True, fastmath=set(FLAGS), error_model="numpy", inline="always")
f32 = np.float32


def _bitcast(source, target, target_ir):
    @intrinsic
    def cast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], target_ir)
        return target(source), codegen
    return cast


f64_from_bits = _bitcast(types.int64, types.float64, ir.DoubleType())
bits_of_f64 = _bitcast(types.float64, types.int64, ir.IntType(64))
f32_from_bits = _bitcast(types.int32, types.float32, ir.FloatType())
bits_of_f32 = _bitcast(types.float32, types.int32, ir.IntType(32))


@intrinsic
def fma64(typingctx, x, y, z):
    """x * y + z rounded once (the hardware's fused multiply-add)."""
    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float64(types.float64, types.float64, types.float64), codegen


@intrinsic
def maxnum(typingctx, x, y):
    """The larger of two floats of one type, the other where one is NaN (LLVM's ``maxnum``)."""
    def codegen(context, builder, signature, args):
        kind = args[0].type
        name = "llvm.maxnum.f32" if isinstance(kind, ir.FloatType) else "llvm.maxnum.f64"
        return builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(kind, [kind, kind]), name), args)
    if x != y or x not in (types.float32, types.float64):
        return None
    return x(x, y), codegen


# -- the exponential -------------------------------------------------------------------------
_SHIFT64 = 1.5 * 2.0**52
_SHIFT64_BITS = int(np.array(_SHIFT64).view(np.int64))
_TAYLOR = tuple(1.0 / math.factorial(i) for i in range(14))
_LN2_HI64, _LN2_LO64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_SHIFT32 = f32(1.5 * 2.0**23)
_SHIFT32_BITS = int(np.array(_SHIFT32).view(np.int32))
_POLY32 = tuple(f32(c) for c in EXP32_POLYNOMIAL)
_LN2_HI32, _LN2_LO32 = f32(0.693359375), f32(-2.12194440e-4)


@inline
def _pair(c, i, r):
    """c[i] + c[i + 1] r: one term of Estrin's scheme."""
    return c[i] + c[i + 1] * r


@inline
def _exp64_scaled(x, exponent_bias):
    """e^x / 2^(1023 - exponent_bias): the reduction x = k ln2 + r, e^r by a polynomial, and
    2^(k + exponent_bias - 1023) from its bits (valid while that power is a normal number)."""
    t = x * 1.4426950408889634 + _SHIFT64
    k = t - _SHIFT64
    r = (x - k * _LN2_HI64) - k * _LN2_LO64
    # 1 + r + r^2 H(r), H = sum_{i=2}^{13} r^(i-2)/i! by Estrin's scheme: a dependency chain of
    # 6 operations instead of Horner's 13 (out-of-order cores overlap fewer long chains; 2.1 ->
    # 1.6 ns an entry on AVX2, AMD EPYC family 23 model 49), the same 1-ulp accuracy
    r2 = r * r
    r4 = r2 * r2
    h = _pair(_TAYLOR, 2, r) + r2 * _pair(_TAYLOR, 4, r) + r4 * (
        _pair(_TAYLOR, 6, r) + r2 * _pair(_TAYLOR, 8, r)
        + r4 * (_pair(_TAYLOR, 10, r) + r2 * _pair(_TAYLOR, 12, r)))
    p = (r2 * h + r) + 1.0
    return p * f64_from_bits((bits_of_f64(t) - _SHIFT64_BITS + exponent_bias) << np.int64(52))


@inline
def exp64(x):
    # 2^(k-1) from its bits, then * 2: exact up to k = 1024 (the overflow edge)
    value = _exp64_scaled(x, np.int64(1022)) * 2.0
    if x < -707.7:  # below the smallest normal number (and -inf): 0
        return 0.0
    if x > 709.782712893384:
        return np.inf
    return value


@inline
def exp_nonpositive64(x):
    """exp64 for the x <= 0 of a softmax (a score less its row's maximum), bit for bit: 2^k
    straight from its bits, no overflow test (right up to x = 709)."""
    value = _exp64_scaled(x, np.int64(1023))
    if x < -707.7:
        return 0.0
    return value


@inline
def _exp32_scaled(x, exponent_bias):
    """e^x / 2^(127 - exponent_bias), as _exp64_scaled."""
    t = x * f32(1.4426950408889634) + _SHIFT32
    k = t - _SHIFT32
    r = (x - k * _LN2_HI32) - k * _LN2_LO32
    r2 = r * r  # the polynomial by Estrin's scheme, as exp64
    p = (_POLY32[0] * r + _POLY32[1]) * r2 + (_POLY32[2] * r + _POLY32[3])
    p = (p * r + _POLY32[4]) * r2 + r + f32(1)
    return p * f32_from_bits((bits_of_f32(t) - np.int32(_SHIFT32_BITS) + exponent_bias) << np.int32(23))


@inline
def exp32(x):
    value = _exp32_scaled(x, np.int32(126)) * f32(2)
    if x < f32(-86.6):
        return f32(0)
    if x > f32(88.72283):
        return f32(np.inf)
    return value


@inline
def exp_nonpositive32(x):
    """exp32 for x <= 0, bit for bit, as exp_nonpositive64 (right up to x = 88)."""
    value = _exp32_scaled(x, np.int32(127))
    if x < f32(-86.6):
        return f32(0)
    return value


def _in_precision(single, double):
    """Register the decorated Python function's compiled form: ``single`` for float32
    arguments, ``double`` otherwise (inlined)."""
    def register(generic):
        @overload(generic, inline="always")
        def _for(x):
            return (lambda x: single(x)) if x == types.float32 else (lambda x: double(x))
        return generic
    return register


@_in_precision(single=exp32, double=exp64)
def exp_(x):
    """The exponential in the argument's precision, for generic kernels: compiled code gets
    exp32 or exp64; called from Python it is NumPy's ``exp``, which keeps float32 as float32."""
    return np.exp(x)


@_in_precision(single=exp_nonpositive32, double=exp_nonpositive64)
def exp_nonpositive_(x):
    """The exponential of a softmax's x <= 0 (a score less its row's maximum; -inf gives 0)
    in the argument's precision: :func:`exp_` bit for bit, without the overflow test and the
    doubling that the positive range needs (softmax rows: 0.82 ns an entry against 0.89 in
    float32, AVX2, AMD EPYC family 23 model 49). Called from Python it is NumPy's ``exp``."""
    return np.exp(x)


@inline
def horner(q, x, coefficients):
    """Horner's rule continued from ``q`` over a short tuple (at most 8: LLVM unrolls it and
    the caller's loop vectorizes; a longer tuple stays a loop over memory)."""
    for c in coefficients:
        q = q * x + c
    return q


def like_(x, like):
    """``x`` rounded to the precision of ``like`` (float32 or float64; from Python, NumPy's cast)."""
    return np.asarray(x, dtype=np.asarray(like).dtype)[()]


@overload(like_, inline="always")
def _like_for(x, like):
    if like == types.float32:
        return lambda x, like: np.float32(x)
    return lambda x, like: np.float64(x)
