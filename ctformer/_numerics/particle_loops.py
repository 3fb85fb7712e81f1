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
retraction :math:`x / \|x\|` (each row divided by its largest entry before squaring).
Sums of exponentials accumulate in float64 for float32 states too.
"""
from __future__ import annotations

import numpy as np

from .loops import _sum_jit, exp_, jit, row_max, row_sum


@jit
def sa_velocity(x, beta, log_w, normalized, out):
    """out[b, i] = the velocity of particle i of system b (x, out: (B, n, d), C order;
    ``beta`` and ``log_w`` (n,) in the dtype of ``x``). Each system is transposed once into
    a (d, n) buffer, so that every loop over the tokens j runs over contiguous memory (SIMD)."""
    systems, n, d = x.shape
    xt = np.empty((d, n), dtype=x.dtype)
    s = np.empty(n, dtype=x.dtype)
    for b in range(systems):
        xb = x[b]
        for j in range(n):
            for l in range(d):
                xt[l, j] = xb[j, l]
        for i in range(n):
            xi = xb[i]
            for j in range(n):
                s[j] = log_w[j]
            for l in range(d):
                c = beta * xi[l]
                row = xt[l]
                for j in range(n):
                    s[j] += c * row[j]
            top = row_max(s, n)
            for j in range(n):
                s[j] = exp_(s[j] - top)
            total = row_sum(s, n)
            factor = 1.0 / total
            if not normalized:
                factor = np.exp(np.float64(top))  # once per particle: libm
            radial = 0.0
            for l in range(d):
                a = weighted_sum(s, xt[l], n) * factor
                out[b, i, l] = a
                radial += a * xi[l]
            for l in range(d):
                out[b, i, l] -= radial * xi[l]


@_sum_jit
def weighted_sum(p, v, end):
    """sum_j p[j] v[j] accumulated in float64, in SIMD lanes."""
    total = 0.0
    for j in range(end):
        total += np.float64(p[j]) * np.float64(v[j])
    return total


@jit
def unit_rows(x, out):
    """out[r] = x[r] / |x[r]| for the rows of 2-d ``x``, as y / sqrt(sum y^2) with
    y = x[r] / max|x[r]| (scale-safe; a zero row gives NaN)."""
    rows, d = x.shape
    for r in range(rows):
        scale = abs(x[r, 0])
        for l in range(1, d):
            scale = max(scale, abs(x[r, l]))
        squares = (x[r, 0] / scale) * (x[r, 0] / scale)
        for l in range(1, d):
            y = x[r, l] / scale
            squares += y * y
        root = np.sqrt(squares)
        for l in range(d):
            out[r, l] = (x[r, l] / scale) / root
