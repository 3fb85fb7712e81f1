"""Quadrature weights and mixed dtypes at the checked entries of attention.

The reference is written out in float64 with SciPy's softmax, on the inputs as they were given
(float32 queries rounded to float32 first). Before: a checked call cast float64 weights and an
array beta to float32 queries' dtype although the result was float64 (9.3e-9 and 3.0e-8
relative), and refused float64 weights of 1e-50 beside float32 inputs as "not positive"; ALiBi
over every key returned NaN rows for them.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

from ctformer.operators.local_attention import local_attention
from ctformer.operators.quadrature_attention import quadrature_attention

RNG = np.random.default_rng(0)
Q, K, V = (RNG.standard_normal((5, 4)) for _ in range(3))


def _reference(q, k, v, beta, w, bias=0.0):
    s = beta * np.einsum("...id,...jd->...ij", q, k) + np.log(w) + bias
    return np.einsum("...ij,...jd->...id", softmax(s, axis=-1), v)


@pytest.mark.parametrize("beta", [0.5, np.array(0.3)])
def test_mixed_dtypes_take_weights_and_beta_in_the_promoted_dtype(beta):
    w = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    q32 = Q.astype(np.float32)
    expected = _reference(q32.astype(np.float64), K, V, float(beta), w)
    out = quadrature_attention(q32, K, V, beta=beta, weights=w, check=True)
    assert out.dtype == np.float64
    assert np.abs(out - expected).max() / np.abs(expected).max() < 1e-14


@pytest.mark.parametrize("check", [True, False])
def test_float64_weights_below_float32_range_beside_float32_inputs(check):
    w = np.array([1e-50, 1e-50, 2e-50, 1e-50, 3e-50])
    q, k, v = (a.astype(np.float32) for a in (Q, K, V))
    expected = _reference(*(a.astype(np.float64) for a in (q, k, v)), 0.5, w)
    out = quadrature_attention(q, k, v, beta=0.5, weights=w, check=check)
    assert out.dtype == np.float32 and np.abs(out - expected).max() < 1e-5


def test_float64_weights_below_float32_range_for_torch_inputs():
    torch = pytest.importorskip("torch")
    w = np.array([1e-50, 1e-50, 2e-50, 1e-50, 3e-50])
    q, k, v = (torch.tensor(a, dtype=torch.float32) for a in (Q, K, V))
    expected = _reference(*(a.double().numpy() for a in (q, k, v)), 0.5, w)
    out = quadrature_attention(q, k, v, beta=0.5, weights=w, check=True)
    assert out.dtype == torch.float32 and np.abs(out.numpy() - expected).max() < 1e-5


@pytest.mark.parametrize("check", [True, False])
def test_alibi_over_every_key_keeps_tiny_float64_weights(check):
    n = 6
    q, k, v = (RNG.standard_normal((2, n, 4)).astype(np.float32) for _ in range(3))
    w = np.full(n, 1e-50) * (1 + np.arange(n))
    slopes, pos = np.array([0.5, 0.25]), np.arange(n)
    bias = -slopes[:, None, None] * np.abs(pos[:, None] - pos[None, :])
    expected = _reference(*(a.astype(np.float64) for a in (q, k, v)), 0.5, w, bias)
    out = local_attention(q, k, v, beta=0.5, weights=w, slopes=slopes, positions=pos, check=check)
    assert np.all(np.isfinite(out)) and np.abs(out - expected).max() < 1e-5
