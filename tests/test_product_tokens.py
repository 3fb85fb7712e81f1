"""Token domains in two dimensions: products of interval rules, and atoms (a class token)."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import ContinuousTransformer, Grids
from ctformer.discretizations import P1, GaussLegendre, Midpoint, Product, WithAtoms
from ctformer.studies import convergence

from .conftest import fitted_order


def f2(x1, x2):
    return np.exp(np.sin(2.0 * x1) * x2) + np.cos(3.0 * x2 - x1)


# exact integral of f2 over [0, 1]^2 by a 60 x 60 Gauss rule (exact to rounding: entire function)
_G = GaussLegendre(60)
EXACT = float(_G.weights @ f2(_G.nodes[:, None], _G.nodes[None, :]) @ _G.weights)
TEST_POINTS = np.random.default_rng(7).uniform(0.02, 0.98, size=(40, 2))


def test_product_layout_and_raster_order():
    p = Product(Midpoint(3), GaussLegendre(2))
    assert p.n == 6 and p.nodes.shape == (6, 2) and p.dimension == 2
    np.testing.assert_array_equal(p.nodes[:2, 0], [1 / 6, 1 / 6])        # first factor slow
    np.testing.assert_allclose(p.weights, np.outer(Midpoint(3).weights, GaussLegendre(2).weights).ravel())
    assert p.order == 2 and p.refine(2) == Product(Midpoint(6), GaussLegendre(4))
    # identity includes the factors: no confusion with another rule of the same n
    assert Product(Midpoint(4), Midpoint(4)) != Product(GaussLegendre(4), GaussLegendre(4))
    assert len({Product(Midpoint(4), Midpoint(4)), Product(GaussLegendre(4), Midpoint(4))}) == 2


@pytest.mark.parametrize("factor, expected", [(Midpoint, 2.0), (P1, 2.0)])
def test_product_orders_of_low_order_factors(factor, expected):
    sizes = [16, 32, 64, 128] if factor is Midpoint else [17, 33, 65, 129]
    errors, h = [], []
    for n in sizes:
        p = Product(factor(n), factor(n))
        values = p.sample(f2)
        exact = f2(TEST_POINTS[:, 0], TEST_POINTS[:, 1])
        errors.append(np.max(np.abs(p.interpolate(values, TEST_POINTS) - exact)))
        h.append(p.h)
    assert abs(fitted_order(h, errors) - expected) < 0.15
    if factor is Midpoint:
        quad = [abs(Product(Midpoint(n), Midpoint(n)).integrate(Product(Midpoint(n), Midpoint(n)).sample(f2)) - EXACT)
                for n in sizes]
        assert abs(fitted_order(h, quad) - 2.0) < 0.1


def test_gauss_legendre_product_is_spectral_and_reproduces_one_dimension():
    for n, tol in ((8, 1e-5), (16, 1e-12)):
        p = Product(GaussLegendre(n), GaussLegendre(n))
        assert abs(p.integrate(p.sample(f2)) - EXACT) < tol
    p = Product(GaussLegendre(12), GaussLegendre(5))
    values = p.sample(lambda x1, x2: np.exp(x1))             # a function of x1 only
    one = GaussLegendre(12)
    np.testing.assert_allclose(p.integrate(values), one.integrate(one.sample(np.exp)), rtol=1e-14)
    pts = np.column_stack([np.linspace(0, 1, 7), np.full(7, 0.3)])
    np.testing.assert_allclose(p.interpolate(values, pts), one.interpolate(one.sample(np.exp), pts[:, 0]),
                               rtol=1e-13)
    np.testing.assert_allclose(p.interpolation_matrix(pts) @ values, p.interpolate(values, pts), rtol=1e-13)


def test_q1_galerkin_product_uses_kronecker_projections():
    q1 = Product(P1(9), P1(9))
    assert q1.kind == "galerkin"
    coefficients = q1.sample(f2)
    # the L2 projection reproduces a bilinear function exactly
    bilinear = q1.sample(lambda x1, x2: 1.0 + 2.0 * x1 - x2 + 0.5 * x1 * x2)
    np.testing.assert_allclose(q1.interpolate(bilinear, TEST_POINTS),
                               1.0 + 2.0 * TEST_POINTS[:, 0] - TEST_POINTS[:, 1]
                               + 0.5 * TEST_POINTS[:, 0] * TEST_POINTS[:, 1], atol=1e-13)
    g = q1.to_quadrature(coefficients)
    np.testing.assert_allclose(q1.from_quadrature(g), coefficients, atol=1e-13)   # projection


def test_product_bad_input():
    p = Product(Midpoint(3), Midpoint(4))
    with pytest.raises(ValueError, match=r"shape \(m, 2\)"):
        p.interpolate(np.ones(12), np.linspace(0, 1, 5))
    with pytest.raises(TypeError, match="interval"):
        Product(p, Midpoint(2))
    with pytest.raises(ValueError, match="length 11"):
        p.integrate(np.ones(11))


def test_atoms_weights_under_both_conventions():
    base = Product(Midpoint(4), Midpoint(4))
    vit = WithAtoms(base)
    np.testing.assert_allclose(vit.weights, np.full(17, 1 / 17))          # every token 1/(P + 1)
    fixed = WithAtoms(base, weight=0.25)
    assert fixed.weights[0] == 0.25 and abs(fixed.weights.sum() - 1.0) < 1e-15
    assert vit != fixed and hash(vit) != hash(fixed)
    with pytest.raises(ValueError, match="weight"):
        WithAtoms(base, weight=1.5)
    with pytest.raises(TypeError, match="nodal"):
        WithAtoms(P1(5))


def _u0_2d(x1, x2, y):
    return np.cos(4.0 * y + 0.5 * np.sin(np.pi * x1 + 0.5) * np.cos(np.pi * x2)) + 0.3 * np.sin(np.pi * x1 * y)


def test_vit_discrete_limit_equals_uniform_tokens():
    """With weight=None and a midpoint patch rule, the class token plus 2 x 2 patches is the
    discrete network on 5 tokens (all weights equal): the same numbers as Midpoint(5)."""
    model = ContinuousTransformer.random_smooth(seed=2, layers=1, placement="pre")
    x = np.random.default_rng(1).standard_normal((5, 6))
    tokens = WithAtoms(Product(Midpoint(2), Midpoint(2)))
    np.testing.assert_allclose(model.solve(x, tokens=tokens, features=Midpoint(6)),
                               model.solve(x, tokens=Midpoint(5), features=Midpoint(6)), rtol=1e-14)


def test_token_refinement_on_products():
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, placement="pre")
    kw = dict(refine="tokens", features="gauss-legendre:8", u0=_u0_2d, progress=False, fine=100)
    mid = convergence(model, levels=[4, 8, 16, 32], tokens=Product(Midpoint(2), Midpoint(2)), **kw)
    assert abs(mid.observed_order - 2.0) < 0.25
    gl = convergence(model, levels=[8, 16, 32], tokens=Product(GaussLegendre(2), GaussLegendre(2)), **kw)
    assert gl.table[0].error / gl.table[1].error > 100.0


def test_class_token_limits_under_refinement():
    """Under refinement the class token converges with the order of the patch rule in both
    conventions: to the passive-particle limit (weight=None) and to the fixed-mass limit."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, placement="pre")
    kw = dict(refine="tokens", features="gauss-legendre:8", u0=_u0_2d, progress=False, fine=64)
    results = {}
    for weight in (None, 0.2):
        tokens = WithAtoms(Product(Midpoint(2), Midpoint(2)), weight=weight)
        results[weight] = convergence(model, levels=[4, 8, 16, 32, 64], tokens=tokens, **kw)
    # weight=None: the atom's mass 1/(n + 1) is itself an O(h^2) perturbation of the limit
    assert abs(results[None].observed_order - 2.0) < 0.3
    assert abs(results[0.2].observed_order - 2.0) < 0.3
    a = Grids(WithAtoms(Product(Midpoint(8), Midpoint(8))), Midpoint(4))
    assert a.tokens.n == 65 and a.shape == (65, 4)


def test_causal_mask_on_a_two_dimensional_token_domain_is_refused():
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, mask="causal")
    with pytest.raises(ValueError, match="two-dimensional"):
        model.solve(_u0_2d, tokens=Product(Midpoint(3), Midpoint(3)), features=Midpoint(4))


def test_random_smooth_refuses_bad_beta_and_seed():
    for beta in ("4", True, 1j):
        with pytest.raises(TypeError, match="beta"):
            ContinuousTransformer.random_smooth(beta=beta)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        ContinuousTransformer.random_smooth(seed=-1)


class _FirstAxisOnly:
    """omega(tau) of the axial rotation restricted to x1: theta^(-2 tau) below 1/2, else 0."""

    def __call__(self, tau):
        tau = np.asarray(tau, dtype=np.float64)
        return np.where(tau < 0.5, 100.0 ** (-2.0 * tau), 0.0)


def test_axial_rope_reduces_to_one_axis_when_the_other_is_constant(rng):
    """On n x 1 patches every token has the same x2 position, so the x2 rotations cancel in
    the scores: axial RoPE equals one-dimensional RoPE whose x2 pairs do not turn."""
    from ctformer.kernels import SmoothRandom
    from ctformer.operators import Attention, RoPE

    ks = [SmoothRandom(s) for s in range(4)]
    axial = Attention([ks[0]], [ks[1]], [ks[2]], [ks[3]], beta=2.0, positions=RoPE(theta=100.0))
    line = Attention([ks[0]], [ks[1]], [ks[2]], [ks[3]], beta=2.0,
                     positions=RoPE(frequencies=_FirstAxisOnly()))
    u = rng.standard_normal((6, 5))
    square = Grids(Product(Midpoint(6), Midpoint(1)), Midpoint(5), Midpoint(8), context_length=(6, 3))
    interval = Grids(Midpoint(6), Midpoint(5), Midpoint(8), context_length=6)
    np.testing.assert_allclose(axial(u, square), line(u, interval), rtol=1e-13, atol=1e-14)
    assert np.abs(axial(u, square) - axial(u, Grids(Product(Midpoint(6), Midpoint(1)), Midpoint(5),
                                                    Midpoint(8), context_length=(3, 3)))).max() > 1e-3


def test_axial_rope_token_refinement_orders():
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, positions="rope", context_length=(8, 8))
    kw = dict(refine="tokens", features="gauss-legendre:8", u0=_u0_2d, progress=False, fine=100)
    mid = convergence(model, levels=[4, 8, 16, 32, 64], tokens=Product(Midpoint(2), Midpoint(2)), **kw)
    assert abs(mid.observed_order - 2.0) < 0.2
    gl = convergence(model, levels=[8, 16, 32], tokens=Product(GaussLegendre(2), GaussLegendre(2)), **kw)
    assert gl.table[0].error / gl.table[1].error > 100.0
    with pytest.raises(ValueError, match="one context length per axis"):
        ContinuousTransformer.random_smooth(positions="rope", context_length=8).solve(
            _u0_2d, tokens=Product(Midpoint(4), Midpoint(4)), features=Midpoint(4))
