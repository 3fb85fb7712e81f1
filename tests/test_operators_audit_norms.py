"""LayerNorm and RMSNorm with eps > 0 on tiny tokens (audit of the operators).

Reference: torch's own ``layer_norm`` and ``rms_norm`` in float64 (for tokens of size 1e-200
the variance underflows to zero there, and the result is (u - mean) / sqrt(eps) to rounding).
The scale-safe path raised the power-of-two scale s of a token in eps / s^2 only, not in the
rescaled values, so a token below sqrt(eps / R) came out multiplied by about 1e44.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.operators import Grids, LayerNormProjection, RMSNorm
from tests.conftest import require

D = 16


def _relative(got, expected):
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return np.max(np.abs(got - expected)) / np.max(np.abs(expected))


@pytest.mark.parametrize("dtype, scale, tol", [("float64", 1e-200, 1e-14), ("float64", 1e-300, 1e-14),
                                               ("float32", 1e-30, 1e-6), ("float32", 1e-25, 1e-6)])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_tiny_tokens_with_eps_match_torch(dtype, scale, tol, eps):
    """Float64 tokens of size 1e-200, eps=1e-5: LayerNorm gave about 2.9e-154 where torch gives
    9.1e-198 (relative error 3.7e43); float32 tokens of size 1e-30: 2.1e-19 for 3e-28."""
    torch = require("torch")
    functional = torch.nn.functional
    rng = np.random.default_rng(0)
    u = torch.tensor(rng.standard_normal((3, 5, D)) * scale, dtype=getattr(torch, dtype))
    grids = Grids(Midpoint(5), Midpoint(D))
    u64 = u.double()
    layer = functional.layer_norm(u64, (D,), eps=eps)
    rms = functional.rms_norm(u64, (D,), eps=eps)
    assert _relative(LayerNormProjection(1.0, 0.0, eps)(u, grids), layer) < tol
    assert _relative(RMSNorm(1.0, eps)(u, grids), rms) < tol
    # the same numbers from a NumPy state
    assert _relative(LayerNormProjection(1.0, 0.0, eps)(u.numpy(), grids), layer) < tol
    assert _relative(RMSNorm(1.0, eps)(u.numpy(), grids), rms) < tol


def test_tiny_tokens_on_gauss_legendre_features_match_the_written_out_quadrature():
    """Non-uniform feature weights take the scale-safe path for every array kind; written out:
    mean and variance with the Gauss-Legendre weights of [0, 1], then the LayerNorm formula."""
    torch = require("torch")
    features = GaussLegendre(D)
    grids = Grids(Midpoint(4), features)
    w = np.asarray(features.quadrature_weights) / features.length
    y = np.asarray(features.quadrature_nodes)
    gain = 1.0 + 0.5 * np.sin(3.0 * y)
    u = np.random.default_rng(1).standard_normal((2, 4, D)) * 1e-200
    eps = 1e-6
    mean = (u * w).sum(-1, keepdims=True)
    var = ((u - mean) ** 2 * w).sum(-1, keepdims=True)   # underflows to 0, as it should
    expected = gain * (u - mean) / np.sqrt(var + eps)
    norm = LayerNormProjection(lambda s: 1.0 + 0.5 * np.sin(3.0 * s), None, eps)
    assert _relative(norm(u, grids), expected) < 1e-14
    assert _relative(norm(torch.tensor(u), grids).numpy(), expected) < 1e-14
    rms = RMSNorm(lambda s: 1.0 + 0.5 * np.sin(3.0 * s), eps)
    expected_rms = gain * u / np.sqrt((u * u * w).sum(-1, keepdims=True) + eps)
    assert _relative(rms(torch.tensor(u), grids).numpy(), expected_rms) < 1e-14
