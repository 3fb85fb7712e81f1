"""Token weights beyond the range of the particles' dtype (float32 states, float64 weights).

SA depends on the ratios of the weights only and USA on their logarithms, so weights of 1e-50
or 1e50 with float32 states are ordinary data. Reference: the velocity of Geshkovski,
Letrouit, Polyanskiy and Rigollet written out below in float64,

    dx_i/dt = P_{x_i}^perp sum_j w_j e^{beta <x_i, x_j>} x_j / Z_i,
    Z_i = sum_j w_j e^{beta <x_i, x_j>} (SA),  Z_i = 1 (USA),

and log Z, log E_beta and the single-cluster distance computed in float64 by hand.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.particles import SelfAttentionDynamics, energy, log_partition, single_cluster_distance


def sphere_points(rng, n, d):
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def reference_velocity(x, beta, w, normalized):
    """The particle velocity in float64, term by term."""
    x = np.asarray(x, dtype=np.float64)
    scores = beta * (x @ x.T)
    top = scores.max(axis=1, keepdims=True)
    e = w * np.exp(scores - top)
    a = e @ x
    a = a / e.sum(axis=1, keepdims=True) if normalized else a * np.exp(top)
    return a - np.sum(x * a, axis=1, keepdims=True) * x


def spread_weights(rng, n, scale):
    return scale * rng.uniform(0.5, 2.0, n)


@pytest.mark.parametrize("n", [10, 100])  # the fused kernel (n <= 64) and the BLAS path
@pytest.mark.parametrize("scale", [1e-50, 1e50])
def test_sa_with_weights_beyond_float32_matches_the_formula(rng, n, scale):
    """Before: n = 100 gave NaN in every entry (the weights became 0 or inf in float32)."""
    x = sphere_points(rng, n, 3).astype(np.float32)
    w = spread_weights(rng, n, scale)
    v = SelfAttentionDynamics(2.0, weights=w).velocity(x)
    assert v.dtype == np.float32
    np.testing.assert_allclose(v, reference_velocity(x, 2.0, w, True), rtol=0, atol=2e-6)


def test_sa_torch_with_weights_beyond_float32_matches_the_formula(rng):
    """Before: NaN for torch float32 states at every n (also the small ones)."""
    torch = pytest.importorskip("torch")
    x = sphere_points(rng, 10, 3)
    w = spread_weights(rng, 10, 1e-50)
    v = SelfAttentionDynamics(2.0, weights=w).velocity(torch.from_numpy(x).float())
    assert v.dtype == torch.float32
    xf = torch.from_numpy(x).float().double().numpy()
    np.testing.assert_allclose(v.double().numpy(), reference_velocity(xf, 2.0, w, True), rtol=0, atol=2e-6)


def test_usa_with_tiny_weights_keeps_its_representable_size(rng):
    """USA at beta = 60 with weights near 1e-50: Z_i is about 1e-22, a float32 number. Before:
    NaN (log w = -inf in float32)."""
    n = 100
    x = sphere_points(rng, n, 3).astype(np.float32)
    w = spread_weights(rng, n, 1e-50)
    v = SelfAttentionDynamics(60.0, normalized=False, weights=w).velocity(x)
    ref = reference_velocity(x, 60.0, w, False)
    assert 1e-30 < np.abs(ref).max() < 1e-10
    np.testing.assert_allclose(v, ref, rtol=0, atol=1e-3 * np.abs(ref).max())


def test_weight_ratio_beyond_a_tensor_dtype_is_refused_by_name(rng):
    """torch states get the weights in their dtype: a ratio below float32's range would turn a
    token's weight into zero."""
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(sphere_points(rng, 4, 3)).float()
    w = np.array([1.0, 1e-50, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"weights span a ratio min/max = 1e-50, below the smallest normal"):
        SelfAttentionDynamics(1.0, weights=w).velocity(x)
    v = SelfAttentionDynamics(1.0, weights=w).velocity(x.double())  # float64 holds the ratio
    np.testing.assert_allclose(v.numpy(), reference_velocity(x.double().numpy(), 1.0, w, True), atol=1e-15)


def test_log_partition_and_energy_of_float32_points_with_tiny_weights(rng):
    """Before: 'weights must be positive and finite' for positive finite weights (they were cast
    to float32 first). Now log Z_i, log E_beta and the single-cluster distance of the float64
    formulas, to float32 rounding."""
    x64 = sphere_points(rng, 6, 3)
    x = x64.astype(np.float32)
    xr = x.astype(np.float64)
    w = spread_weights(rng, 6, 1e-50)
    beta = 2.0
    s = beta * (xr @ xr.T) + np.log(w)
    log_z = np.log(np.sum(np.exp(s - s.max(axis=1, keepdims=True)), axis=1)) + s.max(axis=1)
    np.testing.assert_allclose(log_partition(x, x, beta=beta, weights=w), log_z, rtol=1e-6)
    terms = log_z + np.log(w)
    log_e = terms.max() + np.log(np.sum(np.exp(terms - terms.max()))) - np.log(2 * beta)
    assert -240 < log_e < -220  # E_beta itself is below float32 (and float64) range
    assert energy(x, beta, w, log=True) == pytest.approx(log_e, rel=1e-6)
    wn = w / w.sum()
    m = wn @ xr
    z = m / np.linalg.norm(m)
    dist = np.sqrt(np.sum(wn[:, None] * (xr - z) ** 2))
    assert single_cluster_distance(x, w) == pytest.approx(dist, rel=1e-6)
