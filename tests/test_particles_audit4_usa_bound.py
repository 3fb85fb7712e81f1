"""The USA overflow guard counts the value matrices and the heads.

The USA velocity is :math:`P^\\perp_{x_i} \\sum_h Z^h_i (\\mathrm{SA})^h_i` with
:math:`|(\\mathrm{SA})^h_i| \\le \\|V_h\\|_2` (a convex combination of the :math:`V_h x_j`), so
its size is bounded by :math:`\\sum_h e^{b_h}\\|V_h\\|_2`,
:math:`b_h = |\\beta|\\,\\|Q_h\\|_2\\|K_h\\|_2 + \\log\\sum_j w_j`. The guard looked at
:math:`\\max_h b_h` only: large values gave NaN velocities instead of the OverflowError.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from ctformer.particles import SelfAttentionDynamics


def sphere_points(rng, n, d):
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("dtype, beta, scale, bound", [
    (np.float64, 699.0, 1e10, 699.0 + 10 * math.log(10)),  # before: NaN velocities
    (np.float32, 79.0, 1e5, 79.0 + 5 * math.log(10)),       # before: NaN velocities
])
def test_usa_with_large_values_is_refused_by_name(rng, dtype, beta, scale, bound):
    x = sphere_points(rng, 5, 3).astype(dtype)
    dyn = SelfAttentionDynamics(beta, V=scale * np.eye(3), normalized=False)
    with pytest.raises(OverflowError, match=rf"sum_h Z_h \|V_h\| .* up to exp\({bound:.1f}\), beyond the "
                                            rf"{np.dtype(dtype)} range .* or smaller V"):
        dyn.velocity(x)


def test_usa_heads_add_up_in_the_bound(rng):
    """Two identity heads at beta = 699.5: velocities up to 2 e^699.5 = e^700.19, past the
    float64 limit 700 (one head is accepted)."""
    x = sphere_points(rng, 5, 3)
    one = SelfAttentionDynamics(699.5, normalized=False).velocity(x)
    assert np.all(np.isfinite(one))
    with pytest.raises(OverflowError, match=r"up to exp\(700.2\)"):
        SelfAttentionDynamics(699.5, Q=[None, None], K=[None, None], V=[None, None],
                              normalized=False).velocity(x)


def test_usa_with_small_values_keeps_the_normalizer_bound(rng):
    """Small V shrink the velocity but not Z_i = exp(log Z_i), computed on its own: the bound
    stays |beta| + log sum w = 700, accepted, and the velocity is that of the formula."""
    x = sphere_points(rng, 4, 3)
    v = SelfAttentionDynamics(700.0, V=1e-3 * np.eye(3), normalized=False).velocity(x)
    scores = 700.0 * (x @ x.T)
    a = (np.exp(scores - scores.max(axis=1, keepdims=True)) / 4) @ (1e-3 * x)
    a *= np.exp(scores.max(axis=1, keepdims=True))
    ref = a - np.sum(x * a, axis=1, keepdims=True) * x
    np.testing.assert_allclose(v, ref, rtol=1e-12, atol=1e-12 * np.abs(a).max())
    with pytest.raises(OverflowError, match=r"up to exp\(701.0\)"):
        SelfAttentionDynamics(701.0, V=1e-3 * np.eye(3), normalized=False).velocity(x)
