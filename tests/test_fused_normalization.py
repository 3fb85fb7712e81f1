"""The one-pass normalizations (ctformer._numerics.normalize, compiled) against an independent
float64 formula with the grid's own feature weights, the NumPy engine's formulas, and the
scale-safe path they hand over to (huge, tiny and degenerate tokens)."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import Grids
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.operators import LayerNormProjection, RMSNorm, SphereProjection
from ctformer._numerics.normalize import normalized_rows, rows_plan
from ctformer.operators import normalization

from .conftest import require

require("numba")


def grids(tokens, features):
    return Grids(tokens, features)


def reference(u, weights, gain, shift, eps, centre):
    """g (u - mu) / sqrt(var + eps) + c with mu, var the weighted mean and variance, float64."""
    u = u.astype(np.float64)
    w = weights / weights.sum()
    mu = (u * w).sum(-1, keepdims=True) if centre else 0.0
    var = ((u - mu) ** 2 * w).sum(-1, keepdims=True)
    return (u - mu) / np.sqrt(var + eps) * gain + shift


CASES = [
    (lambda: LayerNormProjection(gain=lambda y: 1 + y, shift=lambda y: np.sin(3 * y), eps=1e-5), True, True),
    (lambda: LayerNormProjection(), True, False),
    (lambda: RMSNorm(gain=lambda y: 2 - y, eps=1e-6), False, True),
    (lambda: SphereProjection(), False, False),
]


@pytest.mark.parametrize("make, centre, affine", CASES)
@pytest.mark.parametrize("features", [Midpoint(24), GaussLegendre(11)])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-14), (np.float32, 1e-6)])
def test_one_pass_is_the_normalization(rng, make, centre, affine, features, dtype, tol, monkeypatch):
    op = make()
    g = grids(Midpoint(7), features)
    y = features.quadrature_nodes
    gain = (1 + y if centre else 2 - y) if affine else 1.0
    shift = np.sin(3 * y) if affine and centre else 0.0
    u = (3.0 * rng.standard_normal((2, 7, features.n)) + 0.5).astype(dtype)
    f = op.discretize(g)
    taken = []

    def planned(*args, **kwargs):  # a small state's plan (ctformer.operators.small_plans)
        plan = rows_plan(*args, **kwargs)
        return None if plan is None else lambda v: taken.append(plan(v)) or taken[-1]

    monkeypatch.setattr(normalization, "normalized_rows",
                        lambda *a, **k: taken.append(normalized_rows(*a, **k)) or taken[-1])
    monkeypatch.setattr(normalization, "rows_plan", planned)
    got = f(u)
    assert taken and taken[-1] is got    # the one pass did it
    assert got.dtype == dtype and got.shape == u.shape
    exact = reference(u, features.quadrature_weights, gain, shift, getattr(op, "eps", 0.0), centre)
    assert np.abs(got - exact).max() / np.abs(exact).max() < tol
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")   # the NumPy formulas: the same numbers
    np.testing.assert_allclose(f(u), got, rtol=0, atol=(30 if dtype == np.float32 else 1) * tol)


@pytest.mark.parametrize("scale", [2.0 ** 600, 2.0 ** -600, 1e300, 1e-300])
def test_huge_and_tiny_tokens_go_to_the_scale_safe_path(rng, scale):
    """N(c u) = N(u) for eps = 0: the kernel refuses such rows, the rescaled formula does them."""
    u = rng.standard_normal((5, 16))
    assert normalized_rows(u * scale, np.full(16, 1 / 16), 0.0, True) is None
    f = LayerNormProjection().discretize(grids(Midpoint(5), Midpoint(16)))
    np.testing.assert_allclose(f(u * scale), f(u), rtol=0, atol=1e-13)


def test_a_constant_token_is_still_named(rng):
    u = rng.standard_normal((4, 16))
    u[2] = 0.75
    f = LayerNormProjection().discretize(grids(Midpoint(4), Midpoint(16)))
    with pytest.raises(ValueError, match=r"token at index \(2,\) .* zero feature variance"):
        f(u)
    assert normalized_rows(u, np.full(16, 1 / 16), 0.0, True) is None


def test_zero_token_with_eps_is_the_shift(rng):
    """(0 - 0) / sqrt(0 + eps) g + c = c exactly: the kernel takes a zero row with eps > 0."""
    u = rng.standard_normal((3, 8))
    u[1] = 0.0
    shift = np.linspace(-1, 1, 8)
    out = normalized_rows(u, np.full(8, 1 / 8), 1e-5, True, np.full(8, 2.0), shift)
    assert out is not None and np.array_equal(out[1], shift)


def test_what_the_kernel_does_not_take(rng):
    w = np.full(8, 1 / 8)
    assert normalized_rows(rng.standard_normal((3, 8)).astype(np.float16), w, 0.0, True) is None
    assert normalized_rows(rng.standard_normal((3, 8)), np.full(7, 1 / 7), 0.0, True) is None
    assert normalized_rows(rng.standard_normal((3, 8)), w, 0.0, True, gain=np.ones(5)) is None


@pytest.mark.parametrize("scale, eps, taken", [(2.0 ** 600, 1e-5, False), (2.0 ** 300, 1e-5, True),
                                               (2.0 ** -450, 1e-200, True), (2.0 ** -450, 1e-300, False),
                                               (2.0 ** -600, 1e-300, False)])
def test_with_eps_the_kernel_tests_the_variance_after_the_sums(rng, scale, eps, taken):
    """eps > 0, float64: no largest-entry pass; a row is refused only where its squares
    overflow (2^600) or var + eps is below 2^-800 (squares may have underflowed), and either
    path gives the formula evaluated on the rescaled row v = u / s:
    N(u) = (v - mean v) / sqrt(var v + eps / s^2)."""
    u = rng.standard_normal((5, 16))
    u[3] *= scale
    w = np.full(16, 1 / 16)
    assert (normalized_rows(u, w, eps, True) is not None) == taken
    got = LayerNormProjection(eps=eps).discretize(grids(Midpoint(5), Midpoint(16)))(u)
    s = np.abs(u).max(axis=-1, keepdims=True)
    c = u / s - (u / s).mean(-1, keepdims=True)
    expected = c / np.sqrt((c * c).mean(-1, keepdims=True) + (np.sqrt(eps) / s) ** 2)
    error = np.abs(got - expected).max(axis=-1) / np.abs(expected).max(axis=-1)
    assert error.max() < 1e-13


def test_with_eps_float32_rows_of_any_finite_size_are_taken(rng):
    """Float32 rows are summed in float64, where squares of every finite float32 (subnormal
    ones included) are normal numbers: the kernel takes them all and matches float64."""
    u = rng.standard_normal((4, 32)).astype(np.float32)
    u[1] *= np.float32(2.0 ** -140)     # subnormal float32 entries
    u[2] *= np.float32(2.0 ** 125)      # near float32's largest
    w = np.full(32, 1 / 32)
    out = normalized_rows(u, w, 1e-30, True)
    assert out is not None and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(u, w, 1.0, 0.0, 1e-30, True), rtol=0, atol=2e-6)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_with_eps_a_row_holding_inf_or_nan_is_refused(rng, bad):
    u = rng.standard_normal((3, 8))
    u[1, 4] = bad
    assert normalized_rows(u, np.full(8, 1 / 8), 1e-5, True) is None
    assert normalized_rows(u.astype(np.float32), np.full(8, 1 / 8), 1e-5, False) is None
