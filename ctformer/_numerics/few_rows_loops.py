r"""Numba kernels of :mod:`ctformer._numerics.few_rows` (imported only when they are used).

``columns`` computes the columns ``j0 <= j < j1`` of :math:`C = A W^T + b` for rows ``A``
(m x k), a matrix ``W`` (n x k) and a bias ``b`` (n,; zeros for none), all C-contiguous and
of one dtype, float64 or float32 (the sums are kept in that precision):

.. math::

    C_{ij} = \sum_{p < k} A_{ip} W_{jp} + b_j .

Tiles of four rows by four columns (sixteen sums, each over a row of ``A`` and a row of
``W``, both contiguous), then the columns left over one at a time; ``columns3`` is the same
with tiles of four rows by three columns. Each sum runs in SIMD lanes, one vector register
per sum, so a tile's sums and the operands they read must fit the CPU's vector registers:
sixteen sums do with AVX-512's 32 registers, but with AVX2's 16 they spill, and twelve sums
took 0.60-0.67 of the time of sixteen in float64 and 0.57-0.61 in float32 (AMD EPYC, family
23 model 49; one thread, 16 rows of 384 or 1536). Which tile a machine uses is measured
(:func:`ctformer._numerics.few_rows.measure`). The rows come in fours: callers pad them with
zero rows (:func:`ctformer._numerics.few_rows.padded`), so that one tile computes every row,
each with the same code. 'reassoc' lets LLVM split each sum into partial sums, an order fixed
by the compiled code and the shape, never by the thread count. ``columns_parallel`` hands
blocks of columns (multiples of the tile's width) to Numba's
threads: every entry is computed by the same code on every partition, so the bits are those
of the one-thread kernel on the whole matrix. It may also apply a feed-forward layer's
activation, :math:`\phi(C)`, to each block where it was computed: the activation's own loop,
compiled without 'reassoc', so the bits are those of the product followed by the activation.
"""
from __future__ import annotations

from numba import njit, prange

from .loops import FLAGS, activation_over

_FLAGS = set(FLAGS) | {"reassoc"}
jit = njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy", boundscheck=False)


@jit
def columns(a, w, bias, out, j0, j1):
    """out[:, j0:j1] = a @ w[j0:j1].T + bias[j0:j1] in tiles of four rows by four columns
    (module docstring; j0 and the rows multiples of 4)."""
    m, k = a.shape
    if m % 4:
        raise ValueError("columns: the rows must come in fours (pad them with zero rows)")
    zero = out.dtype.type(0)  # sums in the operands' precision, float32 or float64
    tiled = j0 + (j1 - j0) // 4 * 4
    for j in range(j0, tiled, 4):
        b0 = bias[j]
        b1 = bias[j + 1]
        b2 = bias[j + 2]
        b3 = bias[j + 3]
        for i in range(0, m, 4):
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
            s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zero
            for p in range(k):
                w0, w1, w2, w3 = w[j, p], w[j + 1, p], w[j + 2, p], w[j + 3, p]
                a0, a1, a2, a3 = a[i, p], a[i + 1, p], a[i + 2, p], a[i + 3, p]
                s00 += a0 * w0
                s01 += a0 * w1
                s02 += a0 * w2
                s03 += a0 * w3
                s10 += a1 * w0
                s11 += a1 * w1
                s12 += a1 * w2
                s13 += a1 * w3
                s20 += a2 * w0
                s21 += a2 * w1
                s22 += a2 * w2
                s23 += a2 * w3
                s30 += a3 * w0
                s31 += a3 * w1
                s32 += a3 * w2
                s33 += a3 * w3
            _store4(out, i, j, s00 + b0, s01 + b1, s02 + b2, s03 + b3)
            _store4(out, i + 1, j, s10 + b0, s11 + b1, s12 + b2, s13 + b3)
            _store4(out, i + 2, j, s20 + b0, s21 + b1, s22 + b2, s23 + b3)
            _store4(out, i + 3, j, s30 + b0, s31 + b1, s32 + b2, s33 + b3)
    _leftover(a, w, bias, out, tiled, j1)


@jit
def columns3(a, w, bias, out, j0, j1):
    """out[:, j0:j1] = a @ w[j0:j1].T + bias[j0:j1] in tiles of four rows by three columns
    (module docstring; j0 a multiple of 3, the rows of 4)."""
    m, k = a.shape
    if m % 4:
        raise ValueError("columns3: the rows must come in fours (pad them with zero rows)")
    zero = out.dtype.type(0)
    tiled = j0 + (j1 - j0) // 3 * 3
    for j in range(j0, tiled, 3):
        b0 = bias[j]
        b1 = bias[j + 1]
        b2 = bias[j + 2]
        for i in range(0, m, 4):
            s00 = s01 = s02 = s10 = s11 = s12 = s20 = s21 = s22 = s30 = s31 = s32 = zero
            for p in range(k):
                w0, w1, w2 = w[j, p], w[j + 1, p], w[j + 2, p]
                a0, a1, a2, a3 = a[i, p], a[i + 1, p], a[i + 2, p], a[i + 3, p]
                s00, s01, s02 = _row3(a0, w0, w1, w2, s00, s01, s02)
                s10, s11, s12 = _row3(a1, w0, w1, w2, s10, s11, s12)
                s20, s21, s22 = _row3(a2, w0, w1, w2, s20, s21, s22)
                s30, s31, s32 = _row3(a3, w0, w1, w2, s30, s31, s32)
            _store3(out, i, j, s00 + b0, s01 + b1, s02 + b2)
            _store3(out, i + 1, j, s10 + b0, s11 + b1, s12 + b2)
            _store3(out, i + 2, j, s20 + b0, s21 + b1, s22 + b2)
            _store3(out, i + 3, j, s30 + b0, s31 + b1, s32 + b2)
    _leftover(a, w, bias, out, tiled, j1)


@njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy", boundscheck=False, inline="always")
def _row3(x, w0, w1, w2, s0, s1, s2):
    """One row's step of a tile three columns wide: each sum plus ``x`` times its column's
    weight (the four-column tile keeps its sixteen updates written out: through a helper
    like this one LLVM vectorized it at half the speed)."""
    return s0 + x * w0, s1 + x * w1, s2 + x * w2


@njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy", boundscheck=False, inline="always")
def _leftover(a, w, bias, out, j0, j1):
    """The columns ``j0 <= j < j1`` one at a time (those a tile leaves over)."""
    m, k = a.shape
    zero = out.dtype.type(0)
    for j in range(j0, j1):
        b0 = bias[j]
        for r in range(m):
            s = zero
            for p in range(k):
                s += a[r, p] * w[j, p]
            out[r, j] = s + b0


@njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy", boundscheck=False, inline="always")
def _store3(out, i, j, c0, c1, c2):
    out[i, j], out[i, j + 1], out[i, j + 2] = c0, c1, c2


@njit(nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy", boundscheck=False, inline="always")
def _store4(out, i, j, c0, c1, c2, c3):
    out[i, j], out[i, j + 1], out[i, j + 2], out[i, j + 3] = c0, c1, c2, c3


@njit(parallel=True, nogil=True, cache=True, fastmath=_FLAGS, error_model="numpy", boundscheck=False)
def columns_parallel(a, w, bias, out, block, tile, activation):
    """``columns`` (``tile`` 4) or ``columns3`` (``tile`` 3) on all of ``out``'s columns, blocks
    of ``block`` (a multiple of ``tile``) at a time on Numba's threads; then, for
    ``activation`` >= 0, that activation's loop (:func:`ctformer._numerics.loops.activation_over`)
    over each row of the block, on the same thread, while the block is in its cache."""
    n = w.shape[0]
    flat = out.reshape(-1)
    for t in prange((n + block - 1) // block):
        j0, j1 = t * block, min(n, (t + 1) * block)
        if tile == 3:
            columns3(a, w, bias, out, j0, j1)
        else:
            columns(a, w, bias, out, j0, j1)
        if activation >= 0:
            for i in range(out.shape[0]):
                activation_over(activation, flat[i * n + j0:i * n + j1])
