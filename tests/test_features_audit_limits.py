"""The feature-side fast paths at their limits (audit): RMSNorm without a gain but with eps,
and the exact GELU at -inf, on both loop engines.

References: the RMSNorm / sphere formula written out with the feature quadrature weights, and
torch's ``rms_norm`` in float64 on a midpoint grid; for GELU, SciPy's ``ndtr`` in float64
(:math:`z \\Phi(z)`) and the limit :math:`\\lim_{z \\to -\\infty} z \\Phi(z) = 0`.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.operators import Grids, RMSNorm, SphereProjection, gelu
from tests.conftest import rel_err, require

D = 7


@pytest.mark.parametrize("cls", [RMSNorm, SphereProjection])
@pytest.mark.parametrize("eps", [1e-6, 1e-12])
def test_no_gain_with_eps_on_numpy_states(cls, eps, loop_engine):
    """gain=None with eps > 0 on a float64 NumPy state: the NumPy engine raised
    "unsupported operand type(s) for *: 'float' and 'NoneType'" (the gain, absent, was
    multiplied in); now torch's float64 ``rms_norm`` to 1e-14."""
    torch = require("torch")
    u = np.random.default_rng(0).standard_normal((2, 5, D))
    expected = torch.nn.functional.rms_norm(torch.tensor(u), (D,), None, eps).numpy()
    got = cls(None, eps)(u, Grids(Midpoint(5), Midpoint(D)))
    assert rel_err(got, expected) < 1e-14


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-14), ("float32", 1e-6)])
def test_no_gain_with_eps_on_gauss_legendre_tensors(dtype, tol):
    """gain=None with eps > 0 on torch tensors over Gauss-Legendre features (the general
    path: torch's fused rms_norm needs uniform weights) raised "unsupported operand type(s)
    for *: 'Tensor' and 'NoneType'" on every engine; now the quadrature written out."""
    torch = require("torch")
    features = GaussLegendre(D)
    w = np.asarray(features.quadrature_weights) / features.length
    u = np.random.default_rng(1).standard_normal((3, D))
    eps = 1e-6
    expected = u / np.sqrt((u * u * w).sum(-1, keepdims=True) + eps)
    got = RMSNorm(None, eps)(torch.tensor(u, dtype=getattr(torch, dtype)), Grids(Midpoint(3), features))
    assert got.dtype == getattr(torch, dtype)
    assert rel_err(got.double().numpy(), expected) < tol


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("size", [6, 70_000])  # one block, and blocks (2^16 entries each)
def test_gelu_at_minus_infinity_is_its_limit(dtype, size, loop_engine):
    """gelu(-inf) of a float64 NumPy array was NaN on the NumPy engine (-inf * Phi(-inf) =
    -inf * 0) where the compiled loops and float32 gave 0, the limit; now 0 on both engines.
    inf stays inf, NaN stays NaN, and finite entries are z Phi(z) (SciPy) to 1e-13 / 1e-6."""
    z = np.resize(np.array([-np.inf, np.inf, np.nan, -1e30, -3.0, 2.0]), size).astype(dtype)
    out = gelu(z)
    assert out.dtype == z.dtype
    minus, plus, nan = np.isneginf(z), np.isposinf(z), np.isnan(z)
    assert np.all(out[minus] == 0.0)
    assert np.all(np.isposinf(out[plus]))
    assert np.all(np.isnan(out[nan]))
    finite = np.isfinite(z)
    expected = z[finite].astype(np.float64) * ndtr(z[finite].astype(np.float64))
    tol = 1e-13 if dtype == "float64" else 1e-6
    np.testing.assert_allclose(out[finite], expected, rtol=tol, atol=0)


def test_float64_gelu_is_relatively_accurate_in_the_tail(loop_engine):
    """Float64 GELU for z in [-37.5, -5], against mpmath's z Phi(z) (40 digits): the NumPy
    engine's SciPy ``ndtr`` was up to 2.3e-13 off (z = -37.1; 2.5e-14 at z = -20: its
    exp(-z^2/2) takes z^2 rounded); now below 1e-14 (the stated bound) on both engines, on [-5, 8] too."""
    mpmath = require("mpmath")
    z = np.concatenate([-np.linspace(5.0, 37.5, 131), np.linspace(-5.0, 8.0, 131)])
    with mpmath.workdps(40):
        expected = np.array([float(mpmath.mpf(x) * mpmath.ncdf(mpmath.mpf(x))) for x in z])
    np.testing.assert_allclose(gelu(z), expected, rtol=1e-14, atol=0)


def test_float32_gelu_error_is_what_the_docstring_states(loop_engine):
    """The float32 GELU's relative error against float64 z Phi(z) (SciPy), as
    :mod:`ctformer.operators.activations` states it: below 1e-6 on [-3, 3], below 1e-5 in the
    tail down to z = -13 (the exponent z^2/2 rounded to float32)."""
    rng = np.random.default_rng(3)
    for low, high, bound in ((-3.0, 3.0, 1e-6), (-13.0, -3.0, 1e-5)):
        z = rng.uniform(low, high, 200_000).astype(np.float32)
        expected = z.astype(np.float64) * ndtr(z.astype(np.float64))
        keep = np.abs(expected) >= 1e-36  # results the compiled loop keeps (it flushes below 1e-37)
        error = np.abs(gelu(z).astype(np.float64) - expected)[keep] / np.abs(expected[keep])
        assert error.max() < bound, (low, high, error.max())


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_activations_keep_the_shape_of_a_zero_dimensional_array(dtype, loop_engine):
    """gelu, gelu_tanh and silu of a 0-d NumPy array returned shape (1,) (the blockwise path
    made its input 1-d); now shape (), with the value of the 1-d call (float64: z Phi(z) by
    SciPy to 1e-15)."""
    from ctformer.operators import gelu_tanh, silu

    z = np.array(-1.5, dtype=dtype)
    for function in (gelu, gelu_tanh, silu):
        out = function(z)
        assert out.shape == () and out.dtype == z.dtype, (function.__name__, out.shape)
        assert out == function(z.reshape(1))[0]
    if dtype == "float64":
        assert abs(gelu(z) - (-1.5) * ndtr(-1.5)) <= 1e-15 * 1.5 * ndtr(-1.5)
