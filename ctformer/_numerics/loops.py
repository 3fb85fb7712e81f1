"""The Numba kernels of :mod:`ctformer._numerics.compiled` (imported only when they are used).

Every kernel is a module-level function, or a closure over plain numbers, that calls other
kernels through module globals: Numba's on-disk cache keys a function by its code and the
values it closes over, and a compiled function held in a closure would give a new key in
every process (recompiling each time and leaving a new cache file behind).

This module imports nothing from :mod:`ctformer._numerics.compiled` (which imports it when a
kernel is first needed): the constants shared with the NumPy path of the activations live in
:mod:`ctformer._numerics.normal_tail`.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import kernel_cache as _kernel_cache
from . import normal_tail as _normal_tail
from .normal_tail import ERFC_COEFFICIENTS, TANH_GELU
# the scalar functions the kernels inline (their own module), all importable from here as
# before: the other kernel files and the tests import them from here
from .scalar_loops import (_LN2_HI32, _LN2_HI64, _LN2_LO32, _LN2_LO64, _POLY32, _SHIFT32, _SHIFT32_BITS,
                           _SHIFT64, _SHIFT64_BITS, _TAYLOR, EXP32_POLYNOMIAL, FLAGS, _bitcast,
                           _exp32_scaled, _exp64_scaled, _in_precision, _like_for, _pair, bits_of_f32,
                           bits_of_f64, exp32, exp64, exp_, exp_nonpositive32, exp_nonpositive64,
                           exp_nonpositive_, f32, f32_from_bits, f64_from_bits, fma64, horner, inline,
                           jit, like_, maxnum)

_kernel_cache.install()  # before any kernel is defined: see kernel_cache


# -- kernels -----------------------------------------------------------------------------------
@jit
def exp_array(x, out):
    for i in range(x.size):
        out[i] = exp_(x[i])


# Rows of at least this many entries take most of their maximum in SIMD lanes (see row_max).
_VECTOR_ROW = 256


@inline
def row_max(row, end):
    """max(row[:end]), end >= 1; a NaN entry is passed over unless all are NaN (the caller's
    exponential of it is NaN anyway).

    LLVM vectorizes a reduction of ``maxnum``, not one of Python's ``max`` (a compare and a
    branch), in blocks of up to 64 entries; the entries after the last block, and rows too
    short to repay the reduction of the lanes, go through eight independent scalar maxima
    (a loop left to LLVM would take them one after another). On float32 rows of 256 / 1023 /
    8192 entries: 0.081 / 0.058 / 0.035 ns an entry, against 0.116 / 0.119 / 0.114 in scalars
    alone (float64: 0.10 / 0.085 / 0.070 against 0.12; AVX2 code, AMD EPYC family 26 model 2)."""
    top = row[0]
    main = end - end % 64 if end >= _VECTOR_ROW else 0
    for j in range(main):
        top = maxnum(top, row[j])
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = top
    j = main
    while j + 8 <= end:
        a0, a1, a2, a3 = max(a0, row[j]), max(a1, row[j + 1]), max(a2, row[j + 2]), max(a3, row[j + 3])
        a4, a5, a6, a7 = max(a4, row[j + 4]), max(a5, row[j + 5]), max(a6, row[j + 6]), max(a7, row[j + 7])
        j += 8
    top = max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))
    for j in range(j, end):
        top = max(top, row[j])
    return top


# Sums of positive terms: LLVM may reorder them ('reassoc') to vectorize the loop. The order
# is fixed when the kernel is compiled (a machine's result never depends on threads or runs).
# Not inlined: Numba's inlining would compile the loop with the caller's flags (no reassoc).
_sum_jit = njit(nogil=True, cache=True, fastmath={"contract", "reassoc"}, error_model="numpy")


@_sum_jit
def row_sum(row, end):
    """sum(row[:end]) accumulated in float64 (float32 rows too), in SIMD lanes."""
    total = 0.0
    for j in range(end):
        total += np.float64(row[j])
    return total


@jit
def exp_rows(s, log_w, causal_start, period, diag_shift, sums):
    """In place: s[i, j] <- exp(s[i, j] + log_w[j] - row max), and sums[i] = sum_j s[i, j].
    With ``causal_start`` >= 0, row i is the query at position q = causal_start + i % period:
    it keeps keys j <= q (the rest 0) and its diagonal key gets ``diag_shift`` added.
    ``log_w`` of size 0 means uniform weights."""
    rows, cols = s.shape
    for i in range(rows):
        end = cols if causal_start < 0 else min(cols, causal_start + i % period + 1)
        row = s[i]
        if log_w.size:
            for j in range(end):
                row[j] += log_w[j]
        if causal_start >= 0 and diag_shift != 0:
            row[end - 1] += diag_shift
        top = row_max(row, end)
        for j in range(end):
            row[j] = exp_nonpositive_(row[j] - top)
        # the masked tail by slice assignment: a loop of stores took 20 us for the zeros of
        # 384 causal rows of 128 scores against 3 us, 40% of this kernel (AMD EPYC 23/49)
        row[end:] = 0
        sums[i] = row_sum(row, end)


@jit
def exp_rows_online(s, log_w, col0, causal_start, diag_shift, top, sums, alpha):
    """One key block of online softmax, in place. ``s`` holds the scores of keys
    ``col0 .. col0 + cols`` for each row; ``top[i]`` is row i's running maximum over the
    earlier blocks (-inf before the first) and ``sums[i]`` its running sum of exponentials
    (float64). Afterwards s[i, j] = exp(s[i, j] + log_w[col0 + j] - top_new[i]),
    ``alpha[i] = exp(top_old[i] - top_new[i])`` (the factor for what the earlier blocks
    accumulated) and ``sums[i] = alpha[i] sums[i] + sum_j s[i, j]``. With ``causal_start`` >= 0
    row i is the query at position causal_start + i: it keeps keys up to that position (the
    rest 0), and its diagonal key gets ``diag_shift`` added; a row with no key in the block
    keeps its maximum and sum (alpha 1, its scores 0)."""
    rows, cols = s.shape
    for i in range(rows):
        row = s[i]
        end = cols if causal_start < 0 else min(cols, causal_start + i + 1 - col0)
        if end > 0 and log_w.size:
            for j in range(end):
                row[j] += log_w[col0 + j]
        if end > 0 and causal_start >= 0 and diag_shift != 0 and causal_start + i - col0 < cols:
            row[end - 1] += diag_shift
        end = max(end, 0)
        new = max(row_max(row, end), top[i]) if end > 0 else top[i]
        finite = new > -np.inf  # else no key so far: nothing accumulated, nothing to rescale
        # one factor per row: libm's exp (a second inlined exp_ trips Numba's SSA check)
        a = math.exp(np.float64(top[i]) - np.float64(new)) if finite else 1.0
        for j in range(end if finite else 0):
            row[j] = exp_nonpositive_(row[j] - new)
        row[end if finite else 0:] = 0  # a slice, not a loop: see exp_rows
        sums[i] = sums[i] * a + row_sum(row, end if finite else 0)
        top[i], alpha[i] = new, a


@jit
def rescale_add(acc, t, alpha):
    """In place: acc[i, j] <- alpha[i] acc[i, j] + t[i, j] (online softmax's weighted sums)."""
    rows, e = acc.shape
    for i in range(rows):
        a = alpha[i]
        for j in range(e):
            acc[i, j] = acc[i, j] * a + t[i, j]


@jit
def add_distance(s, p, pk, slope):
    """In place: s[i, j] <- s[i, j] - slope |p[i] - pk[j]|, the distance (float64 positions)
    rounded to the scores' precision first (ALiBi's score term)."""
    rows, cols = s.shape
    for i in range(rows):
        pi = p[i]
        for j in range(cols):
            s[i, j] -= slope * abs(like_(pi - pk[j], slope))

# -- activations: one inline function of an element each, and two loops over it: into a new
# array (``name(z, out)``) and over the input (``name_over(z)``). The same loop with ``out``
# the input itself fails LLVM's runtime overlap check and runs in scalars (10.8 ns an entry
# against 1.5 for the float32 GELU, AMD EPYC family 23 model 49); ``z[i] = f(z[i])``
# vectorizes as it is.
@inline
def silu_value(x):
    return x / (like_(1.0, x) + exp_(-x))


@inline
def gelu_tanh_value(x):
    one = like_(1.0, x)
    return x / (one + exp_(-(like_(TANH_GELU, x) * x * (one + like_(0.044715, x) * x * x))))


# float32 GELU: Phi(-|z|) = erfc(|z|/sqrt 2)/2 = t exp(P(t) - z^2/2 + ln 1/2), t = 1/(1 + k|z|)
_FOLDED = tuple(f32(c) for c in (ERFC_COEFFICIENTS[0] + math.log(0.5),) + ERFC_COEFFICIENTS[1:])
_K32, _CLAMP32 = f32(0.5 * math.sqrt(0.5)), f32(1e18)


@inline
def gelu32_value(x):
    a = min(abs(x), _CLAMP32)  # z = inf: inf * 0 would be NaN; Phi(-a) is 0 there anyway
    t = f32(1) / (f32(1) + _K32 * a)
    t2 = t * t  # P(t) by Estrin's scheme, as exp64: 1.6 ns an entry, not 2.3 (the same CPU)
    t4 = t2 * t2
    p = _pair(_FOLDED, 0, t) + t2 * _pair(_FOLDED, 2, t) + t4 * (
        _pair(_FOLDED, 4, t) + t2 * _pair(_FOLDED, 6, t) + t4 * _pair(_FOLDED, 8, t))
    tail = t * exp_nonpositive32(p - f32(0.5) * x * x)  # Phi(-a) / t <= 1/2: an exponent <= ln 1/2
    return max(x, f32(0)) - a * tail


# float64 GELU: Phi(-a) = exp(-a^2/2) t G(x), G a polynomial in x (ctformer._numerics.normal_tail)
# G(x) = E(x^2) + x O(x^2): two Horner chains of 12 terms that a core overlaps, not one of 24
# (6.0 -> 4.9 ns an entry on AVX2, AMD EPYC family 23 model 49)
_EVEN, _ODD = _normal_tail.POWER[0::2][::-1], _normal_tail.POWER[1::2][::-1]  # highest first
_C, _A, _GAMMA = _normal_tail.C, _normal_tail.A, _normal_tail.GAMMA


@inline
def gelu64_value(v):
    a = min(abs(v), 1e18)  # z = inf: inf * 0 would be NaN; Phi(-a) is 0 there anyway
    b = min(a, _A)
    r = 1.0 / (_C + b)
    x = (_C - _GAMMA * b) * r
    y = x * x
    g = horner(horner(_EVEN[0], y, _EVEN[1:6]), y, _EVEN[6:]) + \
        x * horner(horner(_ODD[0], y, _ODD[1:6]), y, _ODD[6:])
    p = a * a
    e = fma64(a, a, -p)  # a^2 = p + e exactly
    # a Phi(-a) = e^(-p/2) (1 - e/2) a G t: the Gaussian factor last, so that a result near
    # the smallest normal number is not first a subnormal product (a G t is about 0.4 there)
    value = max(v, 0.0) - exp_nonpositive64(-0.5 * p) * ((1.0 - 0.5 * e) * (a * (g * _C * r)))
    return v if v != v else value  # NaN stays NaN


@_in_precision(single=gelu32_value, double=gelu64_value)
def gelu_value(x):
    """The exact GELU of a float in its precision, for generic kernels; called from Python,
    the formula x Phi(x) by ``math.erfc``."""
    return x * 0.5 * math.erfc(-x * math.sqrt(0.5))


_SILU, _GELU_TANH, _GELU = 0, 1, 2  # the activations' kinds
ACTIVATION_KINDS = {"silu": _SILU, "gelu_tanh": _GELU_TANH, "gelu": _GELU}  # by their loops' names


@inline
def activation_value(kind, x):
    """The activation ``kind`` of one element (``kind`` a constant of the calling loop: LLVM
    keeps only its branch)."""
    if kind == _SILU:
        return silu_value(x)
    if kind == _GELU_TANH:
        return gelu_tanh_value(x)
    return gelu_value(x)


def _activation_loops(kind):
    """The two loops of activation ``kind``: into a new array, and over the input. Closures
    over a plain number, which Numba's cache keys by its value (see the module docstring)."""
    @jit
    def into(z, out):
        for i in range(z.size):
            out[i] = activation_value(kind, z[i])

    @jit
    def over(z):
        for i in range(z.size):
            z[i] = activation_value(kind, z[i])

    return into, over


# the loops by the names the activations ask for (name + "32" / "64"); each serves both
# precisions (Numba compiles one version per argument type)
silu32, silu_over32 = silu64, silu_over64 = _activation_loops(_SILU)
gelu_tanh32, gelu_tanh_over32 = gelu_tanh64, gelu_tanh_over64 = _activation_loops(_GELU_TANH)
gelu32, gelu_over32 = gelu64, gelu_over64 = _activation_loops(_GELU)


@jit
def activation_over(kind, z):
    """Activation ``kind`` (``_SILU``, ``_GELU_TANH``, ``_GELU``) written over the 1-d C array
    ``z`` by its loop above: for callers compiled with other flags (the few-row products'
    'reassoc'), which would otherwise apply their flags to an inlined activation and change
    its bits."""
    if kind == _SILU:
        silu_over64(z)
    elif kind == _GELU_TANH:
        gelu_tanh_over64(z)
    else:
        gelu_over64(z)


@jit
def rotate_pairs(x, steps, cos, sin, out):
    """out = (q1 cos - q2 sin, q2 cos + q1 sin) for the halves q1, q2 of the last axis of a
    4-d ``q`` held in the 1-d C array ``x``: q[a, b, i, j] = x[a s0 + b s1 + i s2 + j] for
    ``steps`` (s0, s1, s2) (``cos``, ``sin``: (N, m); ``out``: C order, q's shape). Each row
    of q is then a contiguous slice, which LLVM vectorizes; the same loop over a strided 4-d
    view ran in scalars (float32 2.6x, float64 1.5x slower, AMD EPYC family 23 model 49)."""
    groups, heads, n, width = out.shape
    m = width // 2
    s0, s1, s2 = steps
    for a in range(groups):
        for b in range(heads):
            for i in range(n):
                start = a * s0 + b * s1 + i * s2
                q, y, c, s = x[start:start + width], out[a, b, i], cos[i], sin[i]
                for j in range(m):
                    y[j] = q[j] * c[j] - q[j + m] * s[j]
                    y[j + m] = q[j + m] * c[j] + q[j] * s[j]
