"""layer_statistics reads unit vectors only: raw hidden states are refused by name.

Reference: the mean pairwise cosine of the states, computed here by hand. Before, raw states
of norm about 5 gave a "mean inner product" of 2.42 (no pair of unit vectors has one above 1)
where the cosines average 0.131, and a histogram clipped to [-1, 1].
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.particles.minilm import layer_statistics, project_to_sphere


def test_raw_states_are_refused_and_projected_ones_give_the_cosines():
    rng = np.random.default_rng(0)
    h = 3 * rng.standard_normal((2, 5, 4))
    with pytest.raises(ValueError, match=r"states must be unit vectors \(max \| \|x_i\| - 1 \| = 7.24 > 1e-6\); "
                                         r"project them first with project_to_sphere\(states\)"):
        layer_statistics(h)
    x = h / np.linalg.norm(h, axis=-1, keepdims=True)
    cosines = (x[0] @ x[0].T)[np.triu_indices(5, 1)]
    stats, _ = layer_statistics(project_to_sphere(h))
    assert stats[0].mean_inner_product == pytest.approx(cosines.mean(), rel=1e-14)
    assert stats[0].mean_inner_product == pytest.approx(0.1308, abs=1e-4)


def test_states_normalized_in_float32_are_accepted():
    rng = np.random.default_rng(1)
    h = rng.standard_normal((1, 6, 8))
    x = (h / np.linalg.norm(h, axis=-1, keepdims=True)).astype(np.float32)
    stats, _ = layer_statistics(x)
    xr = x[0].astype(np.float64)
    assert stats[0].mean_inner_product == pytest.approx((xr @ xr.T)[np.triu_indices(6, 1)].mean(), rel=1e-12)
