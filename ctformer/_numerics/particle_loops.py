r"""Numba kernels of :mod:`ctformer._numerics.particles` (imported only when they are used).

``sa_velocity`` is the whole self-attention velocity of many small particle systems in one
pass per particle, with :math:`Q = K = V = I`:

.. math::

    s_j = \beta \langle x_i, x_j \rangle + \log w_j, \qquad
    a_i = \frac{\sum_j e^{s_j - m} x_j}{\sum_j e^{s_j - m}} \ (\text{SA}), \quad
    a_i = e^{m} \sum_j e^{s_j - m} x_j \ (\text{USA}), \qquad
    \dot x_i = a_i - \langle x_i, a_i \rangle x_i,

:math:`m = \max_j s_j`: the score product, the row exponentials, the weighted sum and the
tangent projection without a score matrix in memory. ``unit_rows`` is the scale-safe
retraction :math:`x / \|x\|` and ``tangent_rows`` the tangent projection
:math:`v - \langle x, v\rangle x`, one pass per row each, for states of any size.
``sa_velocity`` sums the weights and the weighted keys in float64. Float32 states sum blocks
of ``KEY_BLOCK`` keys in float32 first, then the blocks in float64. Float32 sums over all keys
had been 2-4x less accurate than the batched BLAS path (relative error 5e-7 to 1.4e-6 against
a float64 reference where BLAS gave 2e-7 to 4e-7), and float64 sums of every term took
1.15-1.3x the kernel's time (Intel Xeon, n = 16..64, d = 2..16), as long as float64 states on
an AVX2 EPYC (family 25 model 1: 0.99 ms against 0.98-1.11 for 256 systems of 32 particles in
the plane). The blocks take 0.80 of that time there, at the BLAS path's accuracy (median
1.2e-7, 99th percentile 3.8e-7 at beta = 1; float64 sums of every term 6e-8 and 2.2e-7).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .scalar_loops import FLAGS, exp_nonpositive_, jit

#: Keys summed in the state's precision before a float64 sum, for float32 states (module notes).
KEY_BLOCK = 8


@jit
def sa_velocity(x, beta, log_w, normalized, out):
    """out[b, i] = the velocity of particle i of system b (x, out: (B, n, d), C order;
    ``beta`` and ``log_w`` (n,) in the dtype of ``x``). Every inner loop runs over the query
    particles i, which are independent: SIMD lanes without reordering any sum (the scores are
    kept as S[j, i], the keys' rows)."""
    systems, n, d = x.shape
    xt = np.empty((d, n), dtype=x.dtype)
    scores = np.empty((n, n), dtype=x.dtype)
    top = np.empty(n, dtype=x.dtype)
    total = np.empty(n, dtype=np.float64)  # float64 sums: see the module notes
    acc = np.empty((d, n), dtype=np.float64)
    blocked = x.itemsize == 4  # float32: blocks of keys summed in float32 first
    part, part_acc = np.empty(n, dtype=x.dtype), np.empty((d, n), dtype=x.dtype)
    for b in range(systems):
        xb = x[b]
        for i in range(n):
            for l in range(d):
                xt[l, i] = xb[i, l]
        for j in range(n):
            row = scores[j]
            for i in range(n):
                row[i] = log_w[j]
            for l in range(d):
                c = beta * xb[j, l]
                xl = xt[l]
                for i in range(n):
                    row[i] += c * xl[i]
        top[:] = scores[0]
        for j in range(1, n):
            row = scores[j]
            for i in range(n):
                top[i] = max(top[i], row[i])
        total[:] = 0
        acc[:] = 0
        if blocked:
            for start in range(0, n, KEY_BLOCK):
                _block_sums(scores, top, xb, start, min(n, start + KEY_BLOCK), part, part_acc, total, acc)
        for j in range(0 if blocked else n):  # float64: every term into the float64 sums
            row = scores[j]
            for i in range(n):
                e = exp_nonpositive_(row[i] - top[i])
                row[i] = e
                total[i] += np.float64(e)
            for l in range(d):
                c = np.float64(xb[j, l])
                al = acc[l]
                for i in range(n):
                    al[i] += np.float64(row[i]) * c
        for i in range(n):
            factor = 1.0 / total[i]
            if not normalized:
                factor = np.exp(np.float64(top[i]))
            radial = 0.0
            for l in range(d):
                acc[l, i] *= factor
                radial += acc[l, i] * np.float64(xt[l, i])
            for l in range(d):
                out[b, i, l] = acc[l, i] - radial * np.float64(xt[l, i])


@jit
def _block_sums(scores, top, xb, start, stop, part, part_acc, total, acc):
    """Keys ``start .. stop``: their exponentials (in place of their scores) summed, and the
    keys weighted by them, in the state's precision, the two sums then added to ``total``
    and ``acc`` in float64. Called, not inlined: a second inlined exponential in
    :func:`sa_velocity` trips Numba's SSA check."""
    n, d = scores.shape[1], acc.shape[0]
    part[:] = 0
    part_acc[:] = 0
    for j in range(start, stop):
        row = scores[j]
        for i in range(n):
            e = exp_nonpositive_(row[i] - top[i])
            row[i] = e
            part[i] += e
        for l in range(d):
            c = xb[j, l]
            pl = part_acc[l]
            for i in range(n):
                pl[i] += row[i] * c
    for i in range(n):
        total[i] += np.float64(part[i])
    for l in range(d):
        for i in range(n):
            acc[l, i] += np.float64(part_acc[l, i])


@njit(parallel=True, nogil=True, cache=True, fastmath=set(FLAGS), error_model="numpy")
def sa_velocity_blocks(x, beta, log_w, normalized, out, block):
    """:func:`sa_velocity` over blocks of ``block`` systems shared by Numba's threads. Each
    block is done whole by one thread, so the bits never depend on the thread count."""
    systems = x.shape[0]
    for t in prange((systems + block - 1) // block):
        start, stop = t * block, min(systems, (t + 1) * block)
        sa_velocity(x[start:stop], beta, log_w, normalized, out[start:stop])


# The row kernels below sum in float64 and let LLVM reorder those sums ('reassoc') to use
# SIMD lanes: the order is fixed when the kernel is compiled, so a machine's bits never depend
# on the threads or the run. Their passes are bound by memory, so the wider accumulator costs
# little here (unlike sa_velocity's exponentials).
_row_jit = njit(nogil=True, cache=True, fastmath=set(FLAGS) | {"reassoc"}, error_model="numpy")
# A row's sum of squares in this range came from squares that neither overflowed nor lost the
# row to underflow: the row is divided by its norm directly. A float32 row always is (its
# squares in float64 lie between 1e-90 and 1e77) unless it is zero or not finite.
_SQUARES_LOW, _SQUARES_HIGH = 1e-300, 1e300


@_row_jit
def unit_rows(x, out):
    """out[r] = x[r] / |x[r]| for the rows of 2-d ``x``: x[r] / sqrt(sum x^2), the squares
    summed in float64, where that sum lies in (1e-300, 1e300); otherwise (a float64 row with
    an entry beyond 1e150 or all below 1e-150, a zero or non-finite row) scale-safely, as
    y / sqrt(sum y^2) with y = x[r] / max|x[r]| (a zero row gives NaN)."""
    rows, d = x.shape
    for r in range(rows):
        row = x[r]
        squares = 0.0
        for l in range(d):
            y = np.float64(row[l])
            squares += y * y
        if _SQUARES_LOW < squares < _SQUARES_HIGH:
            root = np.sqrt(squares)
            for l in range(d):
                out[r, l] = np.float64(row[l]) / root
        else:
            _scaled_unit_row(row, out[r])


@jit
def _scaled_unit_row(row, out):
    """out = row / |row| as y / sqrt(sum y^2), y = row / max|row| (no overflow, no underflow)."""
    d = row.shape[0]
    scale = abs(row[0])
    for l in range(1, d):
        scale = max(scale, abs(row[l]))
    squares = (row[0] / scale) * (row[0] / scale)
    for l in range(1, d):
        y = row[l] / scale
        squares += y * y
    root = np.sqrt(squares)
    for l in range(d):
        out[l] = (row[l] / scale) / root


@_row_jit
def tangent_rows(x, v, out):
    """out[r] = v[r] - <x[r], v[r]> x[r], the projection of v[r] onto the tangent space of the
    sphere at x[r] (2-d ``x``, ``v``, ``out`` of one shape), the inner product in float64."""
    rows, d = x.shape
    for r in range(rows):
        dot = 0.0
        for l in range(d):
            dot += np.float64(x[r, l]) * np.float64(v[r, l])
        for l in range(d):
            out[r, l] = np.float64(v[r, l]) - dot * np.float64(x[r, l])
