"""Audit 41: discretizations, kernels and operators checked against independent references.

Every test compares with something the library does not compute itself: closed-form integrals,
exactness degrees of the rules, SciPy, torch's float64 modules, or a direct dense evaluation.
"""
import math

import numpy as np
import pytest
import torch

import ctformer.discretizations as d
from ctformer.discretizations.gauss import gauss_legendre
from ctformer.kernels import Convolution
from ctformer.operators import (Grids, LayerNormProjection, RMSNorm, local_attention,
                                quadrature_attention, window_pattern)


def _monomial_integral(k, a, b):
    return (b ** (k + 1) - a ** (k + 1)) / (k + 1)


@pytest.mark.parametrize("name, degree", [("gauss-legendre", lambda n: 2 * n - 1),
                                          ("legendre", lambda n: 2 * n - 1),
                                          ("clenshaw-curtis", lambda n: n - 1 + (n % 2)),
                                          ("chebyshev", lambda n: n - 1 + (n % 2)),
                                          ("midpoint", lambda n: 1), ("trapezoid", lambda n: 1)])
@pytest.mark.parametrize("n", [2, 3, 4, 9])
def test_exactness_degree_on_a_shifted_domain(name, degree, n):
    disc = d.get(name, n, domain=(-0.3, 1.7))
    a, b = disc.domain
    top = degree(n)
    for k in range(top + 1):
        got = disc.integrate(disc.sample(lambda x: x ** k))
        assert got == pytest.approx(_monomial_integral(k, a, b), rel=1e-12, abs=1e-13)
    # the next degree is not integrated exactly (the declared degree is the exact one)
    miss = disc.integrate(disc.sample(lambda x: x ** (top + 1)))
    assert abs(miss - _monomial_integral(top + 1, a, b)) > 1e-10


@pytest.mark.parametrize("n", [1, 2])
def test_gauss_legendre_small_n_matches_scipy(n):
    from scipy.special import roots_legendre

    t, w = roots_legendre(n)
    disc = d.GaussLegendre(n, domain=(2.0, 5.0))
    np.testing.assert_allclose(disc.nodes, 3.5 + 1.5 * t, rtol=1e-15)
    np.testing.assert_allclose(disc.weights, 1.5 * w, rtol=1e-15)


@pytest.mark.parametrize("n", [400, 1000])
def test_large_gauss_rule_integrates_oscillations(n):
    # exact: int_{-1}^{1} cos(300 x) dx = 2 sin(300) / 300; a Gauss rule of n >= 400 points
    # resolves it to rounding
    t, w = gauss_legendre(n)
    assert w @ np.cos(300 * t) == pytest.approx(2 * math.sin(300) / 300, abs=1e-14)
    assert w.sum() == pytest.approx(2.0, rel=1e-15)


@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_fourier_reproduces_trigonometric_polynomials(n):
    disc = d.Fourier(n, domain=(-1.0, 2.0))
    pts = np.linspace(-1.0, 2.0, 11)
    for k in range(n // 2 + 1):
        f = lambda x: np.cos(2 * np.pi * k * (x + 1.0) / 3.0)  # noqa: E731
        v = disc.sample(f)
        np.testing.assert_allclose(disc.interpolate(v, pts), f(pts), atol=1e-13)
        np.testing.assert_allclose(disc.interpolation_matrix(pts) @ v, f(pts), atol=1e-13)
        assert disc.integrate(v) == pytest.approx(3.0 if k == 0 else 0.0, abs=1e-13)


def test_product_of_galerkin_factors_integrates_a_separable_function():
    prod = d.Product(d.P2(9), d.P2(9, domain=(-1.0, 0.0)))
    v = prod.sample(lambda x, y: np.exp(x) * np.cos(2 * y))
    exact = (math.e - 1.0) * math.sin(2.0) / 2.0
    assert prod.integrate(v) == pytest.approx(exact, abs=1e-11)


@pytest.mark.parametrize("call, match", [
    (lambda: d.Midpoint(3, domain=(1.0, 0.0)), "a < b"),
    (lambda: d.Midpoint(3, domain=(0.0, np.inf)), "finite interval"),
    (lambda: d.Midpoint(3.0), "n must be an integer"),
    (lambda: d.Trapezoid(1), "n >= 2"),
    (lambda: d.get("p2:4"), "odd n"),
    (lambda: d.Midpoint(3).interpolate(np.ones(3), [1.5]), "domain"),
    (lambda: d.Midpoint(3).refine(0), "refine factor"),
])
def test_bad_arguments_are_refused_by_name(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize("disc", [d.Midpoint(300, (0.0, 2.0)), d.Fourier(301, (-1.0, 1.0))])
def test_convolution_fft_matches_the_circulant_sum(disc):
    profile = lambda z: np.exp(np.cos(2 * np.pi * z))  # noqa: E731
    u = np.random.default_rng(0).standard_normal((3, disc.n))
    s = disc.nodes
    direct = profile(((s[:, None] - s[None, :]) / disc.length) % 1.0) / disc.n
    np.testing.assert_allclose(Convolution(profile).apply(u, disc, disc), u @ direct.T, atol=1e-14)


@pytest.mark.parametrize("scale", [1e-300, 1e-150, 1.0, 1e150, 1e300])
def test_normalizations_are_scale_safe_on_gauss_features(scale):
    features = d.GaussLegendre(7, (-2.0, 3.0))
    grids = Grids(d.Midpoint(3), features)
    w = features.weights / features.length
    s = (features.nodes + 2.0) / 5.0
    u = np.random.default_rng(1).standard_normal((2, 3, 7))
    centred = u - (u @ w)[..., None]
    ln_ref = centred / np.sqrt((centred ** 2) @ w)[..., None] * (1 + 0.1 * s) + np.sin(s)
    rms_ref = u / np.sqrt((u * u) @ w)[..., None] * (1 + 0.1 * s)
    ln = LayerNormProjection(gain=lambda t: 1 + 0.1 * t, shift=np.sin)
    rms = RMSNorm(gain=lambda t: 1 + 0.1 * t)
    np.testing.assert_allclose(ln(u * scale, grids), ln_ref, atol=1e-12)
    np.testing.assert_allclose(rms(u * scale, grids), rms_ref, atol=1e-12)


@pytest.mark.parametrize("scale", [1e-20, 1.0, 1e20])
def test_layer_norm_with_eps_matches_torch(scale):
    grids = Grids(d.Midpoint(5), d.Midpoint(8))
    rng = np.random.default_rng(2)
    gain, shift = rng.standard_normal(8), rng.standard_normal(8)
    u = torch.tensor(rng.standard_normal((4, 5, 8)) * scale)
    ref = torch.nn.functional.layer_norm(u, (8,), torch.tensor(gain), torch.tensor(shift), 1e-5)
    out = LayerNormProjection(gain=gain, shift=shift, eps=1e-5)(u.numpy(), grids)
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-12)


def _dense_reference(q, k, v, beta, w, keep, bias=0.0):
    s = beta * np.einsum("...id,...jd->...ij", q, k) + np.log(w) + bias
    s = np.where(keep, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    den = e.sum(-1, keepdims=True)
    return np.where(den > 0, (e @ v) / np.where(den > 0, den, 1.0), 0.0)


def test_attention_rows_without_keys_are_zero_and_the_rest_exact():
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 7, 4)), rng.standard_normal((2, 7, 3))
    w = rng.uniform(0.1, 1.0, 7)
    keep = rng.random((2, 5, 7)) < 0.5
    keep[0, 0, :] = False
    out = quadrature_attention(q, k, v, beta=0.9, weights=w, mask=keep, chunk=1)
    np.testing.assert_allclose(out, _dense_reference(q, k, v, 0.9, w, keep), atol=1e-13)
    assert np.all(out[0, 0] == 0.0)


def test_causal_half_diagonal_is_the_half_weight_quadrature():
    rng = np.random.default_rng(4)
    n = 6
    q, k, v = rng.standard_normal((n, 4)), rng.standard_normal((n, 4)), rng.standard_normal((n, 3))
    w = rng.uniform(0.1, 1.0, n)
    cell = np.tril(np.ones((n, n))) * w
    cell[np.arange(n), np.arange(n)] *= 0.5
    e = np.exp(0.7 * q @ k.T) * cell
    ref = e @ v / e.sum(1, keepdims=True)
    out = quadrature_attention(q, k, v, beta=0.7, weights=w, mask="causal", diagonal="half")
    np.testing.assert_allclose(out, ref, atol=1e-14)


def test_windowed_alibi_with_padding_matches_the_dense_sum():
    rng = np.random.default_rng(5)
    n, heads = 9, 2
    q, k, v = (rng.standard_normal((3, heads, n, c)) for c in (4, 4, 3))
    w, p = rng.uniform(0.2, 1.0, n), np.arange(n, dtype=np.float64)
    slopes = np.array([0.5, 0.25])
    diff = p[:, None] - p[None, :]
    pad = rng.random((3, 1, n)) < 0.6
    pad[0] = False  # a sequence of padding only: every row keeps no key
    keep = (diff >= 0) & (diff < 3.0) & pad[..., None, :]
    out = local_attention(q, k, v, beta=0.8, pattern=window_pattern(p, 3.0), weights=w, key_mask=pad,
                          slopes=slopes, positions=p, causal=True, check=True)
    ref = _dense_reference(q, k, v, 0.8, w, keep, -slopes[:, None, None] * np.abs(diff))
    np.testing.assert_allclose(out, ref, atol=1e-13)
    assert np.all(out[0] == 0.0)
