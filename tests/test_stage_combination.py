"""The stage combination of the explicit Runge-Kutta schemes (ctformer.solvers.runge_kutta):
u + h sum_i w_i k_i with the same bits as the plain formula, for the discrete limit's factor
1 and for any other, in float32 and float64, never writing into u or a stage."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.solvers.runge_kutta import _combine


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("h", [1.0, 0.1, 0.37])
@pytest.mark.parametrize("shape", [(4, 5), (2, 300, 120)])           # below and above _IN_PLACE_MIN
def test_combination_has_the_bits_of_the_formula(dtype, h, shape):
    rng = np.random.default_rng(0)
    u = rng.standard_normal(shape).astype(dtype)
    ks = [rng.standard_normal(shape).astype(dtype) for _ in range(3)]
    copies = [u.copy()] + [k.copy() for k in ks]
    weights = (0.5, 0.0, 1.0 / h if h != 1 else 0.25)
    formula = u
    for w, k in zip(weights, ks):
        if w:
            formula = formula + (h * w) * k
    out = _combine(u, h, weights, ks)
    assert out.dtype == dtype and np.array_equal(out, formula)
    # and to rounding of the exact sum
    exact = u.astype(np.longdouble) + sum(np.longdouble(h * w) * k.astype(np.longdouble) for w, k in zip(weights, ks))
    assert np.max(np.abs(out - exact)) < 8 * np.finfo(dtype).eps * np.max(np.abs(exact))
    assert all(np.array_equal(a, b) for a, b in zip([u] + ks, copies))
