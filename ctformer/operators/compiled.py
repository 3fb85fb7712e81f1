r"""Fused loops compiled by Numba for the NumPy path (optional; NumPy stays the reference).

A NumPy expression such as ``exp(s - max(s))`` or the erfc approximation inside GELU is a
sequence of passes, each reading and writing the whole block; these kernels do the same
arithmetic in one pass per element, in SIMD registers. Two pieces make that possible:

* an exponential that the compiler can vectorize. With :math:`k = \mathrm{round}(x/\ln 2)`
  and :math:`r = x - k \ln 2` (Cody-Waite: :math:`\ln 2` split into a head and a tail so that
  :math:`k \ln 2_{\mathrm{head}}` is exact), :math:`e^x = 2^k e^r`, :math:`|r| \le \ln 2 / 2`.
  :math:`e^r` is a polynomial (Taylor, degree 13 in float64; Cephes-style minimax, degree 7
  in float32), :math:`2^k` is built from its bits, and :math:`k` is read from the low bits of
  :math:`x/\ln 2 + 1.5 \cdot 2^{52}` (no float-to-integer conversion, which AVX2 lacks for
  64-bit integers). Relative error at most one ulp in float64 and 1.5 ulp in float32 over the
  whole range (tested against 50-digit arithmetic); results below the smallest normal number
  (:math:`x < -707.7` in float64, :math:`-86.6` in float32) are flushed to zero, above
  :math:`\ln(\text{max})` they are ``inf``, and NaN stays NaN;
* per-row kernels: the numerator of quadrature attention,
  :math:`p_{ij} = \exp(s_{ij} + \log w_j - \max_l (s_{il} + \log w_l))`, with the causal mask
  applied by the loop bounds, and the activations of :mod:`ctformer.operators.activations`
  with the same formulas as its NumPy path.

``CTFORMER_LOOP_ENGINE`` chooses: ``auto`` (the default: Numba when it is installed, else
NumPy), ``numba`` (required: an ImportError if it is missing) or ``numpy``. The two engines
agree to rounding (a few ulps), not bit for bit. Each kernel is compiled on first use (about
a second, then cached on disk by Numba) and releases the GIL, so the callers' worker threads
run it in parallel; results never depend on the thread count.
"""
from __future__ import annotations

import math
import os
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

from . import normal_tail as _normal_tail

__all__ = ["loop_engine", "kernels"]

_ENGINES = ("auto", "numba", "numpy")
# 'contract' lets LLVM fuse multiply-adds; no flag that changes inf/NaN semantics.
_FLAGS = {"contract"}


def loop_engine() -> str:
    """``"numba"`` or ``"numpy"``: who runs the fused loops, from ``CTFORMER_LOOP_ENGINE``."""
    engine = os.environ.get("CTFORMER_LOOP_ENGINE", "auto").strip().lower() or "auto"
    if engine not in _ENGINES:
        raise ValueError(f"CTFORMER_LOOP_ENGINE must be one of {', '.join(_ENGINES)}, got {engine!r}")
    if engine == "numpy":
        return "numpy"
    try:
        import numba  # noqa: F401
    except ImportError:
        if engine == "numba":
            raise ImportError("CTFORMER_LOOP_ENGINE=numba needs Numba: pip install 'ctformer[fast]'")
        return "numpy"
    return "numba"


def kernels():
    """The compiled kernels (a namespace), or ``None`` when the NumPy engine is in use."""
    return _build() if loop_engine() == "numba" else None


# Numerical Recipes' erfcc coefficients (Press et al., 2nd ed., section 6.2), shared with the
# NumPy path of the activations.
ERFC_COEFFICIENTS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                     0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)
TANH_GELU = 2.0 * math.sqrt(2.0 / math.pi)
# float32 e^r on |r| <= ln2/2: Cephes expf's minimax coefficients (relative error 1.2e-7 ulp-level)
_EXP32 = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1)


@lru_cache(maxsize=None)
def _build() -> SimpleNamespace:
    """Compile nothing yet (Numba compiles lazily per signature); return the dispatchers."""
    from numba import njit, types
    from numba.extending import intrinsic
    from llvmlite import ir

    def bitcast(source, target, target_ir):
        @intrinsic
        def cast(typingctx, x):
            def codegen(context, builder, signature, args):
                return builder.bitcast(args[0], target_ir)
            return target(source), codegen
        return cast

    f64_from_bits = bitcast(types.int64, types.float64, ir.DoubleType())
    bits_of_f64 = bitcast(types.float64, types.int64, ir.IntType(64))
    f32_from_bits = bitcast(types.int32, types.float32, ir.FloatType())
    bits_of_f32 = bitcast(types.float32, types.int32, ir.IntType(32))

    @intrinsic
    def fma64(typingctx, x, y, z):
        """x * y + z rounded once (the hardware's fused multiply-add)."""
        def codegen(context, builder, signature, args):
            return builder.fma(*args)
        return types.float64(types.float64, types.float64, types.float64), codegen
    jit = njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy")
    inline = njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy", inline="always")

    shift64 = 1.5 * 2.0**52
    shift64_bits = int(np.array(shift64).view(np.int64))
    taylor = tuple(1.0 / math.factorial(i) for i in range(14))
    ln2_hi64, ln2_lo64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10

    @inline
    def exp64(x):
        t = x * 1.4426950408889634 + shift64
        k = t - shift64
        r = (x - k * ln2_hi64) - k * ln2_lo64
        p = taylor[13]
        for c in taylor[12::-1]:  # unrolled by Numba (a tuple of constants)
            p = p * r + c
        # 2^(k-1) from its bits, then * 2: exact up to k = 1024 (the overflow edge)
        scale = f64_from_bits((bits_of_f64(t) - shift64_bits + np.int64(1022)) << np.int64(52))
        value = p * scale * 2.0
        if x < -707.7:  # below the smallest normal number (and -inf): 0
            return 0.0
        if x > 709.782712893384:
            return np.inf
        return value

    f32 = np.float32
    shift32 = f32(1.5 * 2.0**23)
    shift32_bits = int(np.array(shift32).view(np.int32))
    poly32 = tuple(f32(c) for c in _EXP32)
    ln2_hi32, ln2_lo32 = f32(0.693359375), f32(-2.12194440e-4)

    @inline
    def exp32(x):
        t = x * f32(1.4426950408889634) + shift32
        k = t - shift32
        r = (x - k * ln2_hi32) - k * ln2_lo32
        p = poly32[0]
        for c in poly32[1:]:
            p = p * r + c
        p = p * r * r + r + f32(1)
        scale = f32_from_bits((bits_of_f32(t) - np.int32(shift32_bits) + np.int32(126)) << np.int32(23))
        value = p * scale * f32(2)
        if x < f32(-86.6):
            return f32(0)
        if x > f32(88.72283):
            return f32(np.inf)
        return value

    @inline
    def row_max(row, end):
        """max(row[:end]), end >= 1, with eight independent maxima (a chain of one is 2x slower)."""
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = row[0]
        j = 0
        while j + 8 <= end:
            a0, a1, a2, a3 = max(a0, row[j]), max(a1, row[j + 1]), max(a2, row[j + 2]), max(a3, row[j + 3])
            a4, a5, a6, a7 = max(a4, row[j + 4]), max(a5, row[j + 5]), max(a6, row[j + 6]), max(a7, row[j + 7])
            j += 8
        top = max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))
        for j in range(j, end):
            top = max(top, row[j])
        return top

    exps = {np.float32: exp32, np.float64: exp64}
    made = SimpleNamespace(exp32=exp32, exp64=exp64)
    for ftype, exp in exps.items():
        suffix = "32" if ftype is np.float32 else "64"
        setattr(made, "exp_array" + suffix, _exp_array(jit, exp))
        setattr(made, "exp_rows" + suffix, _exp_rows(jit, exp, row_max, ftype))
        setattr(made, "silu" + suffix, _silu(jit, exp, ftype))
        setattr(made, "gelu_tanh" + suffix, _gelu_tanh(jit, exp, ftype))
    made.gelu32 = _gelu32(jit, exp32)
    made.gelu64 = _gelu64(jit, inline, exp64, fma64)
    return made


def _exp_array(jit, exp):
    @jit
    def exp_array(x, out):
        for i in range(x.size):
            out[i] = exp(x[i])
    return exp_array


def _exp_rows(jit, exp, row_max, ftype):
    zero = ftype(0)

    @jit
    def exp_rows(s, log_w, causal_start, period, diag_shift):
        """In place: s[i, j] <- exp(s[i, j] + log_w[j] - row max). With ``causal_start`` >= 0
        row i is the query at position q = causal_start + i % period: it keeps keys j <= q
        (the rest 0) and its diagonal key gets ``diag_shift`` added. ``log_w`` of size 0
        means uniform weights."""
        rows, cols = s.shape
        for i in range(rows):
            end = cols if causal_start < 0 else min(cols, causal_start + i % period + 1)
            row = s[i]
            if log_w.size:
                for j in range(end):
                    row[j] += log_w[j]
            if causal_start >= 0 and diag_shift != zero:
                row[end - 1] += diag_shift
            top = row_max(row, end)
            for j in range(end):
                row[j] = exp(row[j] - top)
            for j in range(end, cols):
                row[j] = zero
    return exp_rows


def _silu(jit, exp, ftype):
    one = ftype(1)

    @jit
    def silu(z, out):
        for i in range(z.size):
            out[i] = z[i] / (one + exp(-z[i]))
    return silu


def _gelu_tanh(jit, exp, ftype):
    one, cubic, scale = ftype(1), ftype(0.044715), ftype(TANH_GELU)

    @jit
    def gelu_tanh(z, out):
        for i in range(z.size):
            x = z[i]
            out[i] = x / (one + exp(-(scale * x * (one + cubic * x * x))))
    return gelu_tanh


def _gelu32(jit, exp32):
    f32 = np.float32
    # Phi(-|z|) = erfc(|z|/sqrt 2)/2 = t exp(P(t) - z^2/2 + ln 1/2), t = 1/(1 + |z|/(2 sqrt 2))
    folded = (f32(ERFC_COEFFICIENTS[0] + math.log(0.5)),) + tuple(f32(c) for c in ERFC_COEFFICIENTS[1:])
    k, half, zero, one, clamp = f32(0.5 * math.sqrt(0.5)), f32(0.5), f32(0), f32(1), f32(1e18)

    @jit
    def gelu32(z, out):
        for i in range(z.size):
            x = z[i]
            a = min(abs(x), clamp)  # z = inf: inf * 0 would be NaN; Phi(-a) is 0 there anyway
            t = one / (one + k * a)
            p = folded[9]
            for c in folded[8::-1]:
                p = p * t + c
            tail = t * exp32(p - half * x * x)
            out[i] = max(x, zero) - a * tail
    return gelu32


def _horner(inline, coefficients):
    """An inlined ``h(q, x)``: Horner's rule continued from ``q`` over ``coefficients`` (highest
    power first). The tuple is walked in pieces of at most 8: LLVM unrolls those, and the
    caller's loop vectorizes; a longer tuple stays a loop over memory and nothing vectorizes."""
    head, rest = coefficients[:8], coefficients[8:]
    after = _horner(inline, rest) if rest else None

    @inline
    def piece(q, x):
        for c in head:
            q = q * x + c
        return q

    if after is None:
        return piece

    @inline
    def chain(q, x):
        return after(piece(q, x), x)
    return chain


def _gelu64(jit, inline, exp64, fma64):
    # Phi(-a) = exp(-a^2/2) t G(x), G a polynomial in x (ctformer.operators.normal_tail)
    power = _normal_tail.POWER[::-1]
    horner = _horner(inline, power[1:])
    top, c, big, gamma, clamp = power[0], _normal_tail.C, _normal_tail.A, _normal_tail.GAMMA, 1e18

    @jit
    def gelu64(z, out):
        for i in range(z.size):
            v = z[i]
            a = min(abs(v), clamp)  # z = inf: inf * 0 would be NaN; Phi(-a) is 0 there anyway
            b = min(a, big)
            r = 1.0 / (c + b)
            g = horner(top, (c - gamma * b) * r)
            p = a * a
            e = fma64(a, a, -p)  # a^2 = p + e exactly
            tail = exp64(-0.5 * p) * (1.0 - 0.5 * e) * (g * c * r)
            value = max(v, 0.0) - a * tail
            out[i] = v if v != v else value  # NaN stays NaN
    return gelu64
