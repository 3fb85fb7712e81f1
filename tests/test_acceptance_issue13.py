"""Acceptance of "Token domains in two dimensions" (products of interval rules, atoms):
each test quotes the issue and checks its number against a closed form or a 1-D rule.
(Layout, raster order, orders of midpoint/P1/Gauss products, ViT exactness, the class token's
limits and the causal refusal are asserted in tests/test_product_tokens.py and test_vit.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import ContinuousTransformer, Grids
from ctformer.discretizations import P1, P2, GaussLegendre, Midpoint, Product, WithAtoms
from ctformer.studies import convergence


def _cubic_quadratic(x1, x2):
    return x1 ** 3 * x2 ** 2 - 2.0 * x1 * x2 + 1.0


def test_integrate_and_interpolate_take_an_axis_on_a_rectangle():
    """"`integrate(values, axis)`; `interpolate(values, points, axis)` with points of shape
    (m, 2)": on [0, 1] x [0, 2] a 4 x 3 Gauss rule is exact for x1^3 x2^2 - 2 x1 x2 + 1,
    whose integral is 1/4 * 8/3 - 2 * 1/2 * 2 + 2 = 2/3, along any axis of a batch."""
    p = Product(GaussLegendre(4), GaussLegendre(3, domain=(0.0, 2.0)))
    v = p.sample(_cubic_quadratic)
    batch = np.stack([v, -3.0 * v], axis=0)                       # token axis last
    np.testing.assert_allclose(p.integrate(batch, axis=-1), [2 / 3, -2.0], rtol=1e-14)
    np.testing.assert_allclose(p.integrate(batch.T, axis=0), [2 / 3, -2.0], rtol=1e-14)
    pts = np.array([[0.1, 1.9], [0.75, 0.3], [0.5, 1.0]])
    exact = _cubic_quadratic(pts[:, 0], pts[:, 1])
    np.testing.assert_allclose(p.interpolate(batch.T, pts, axis=0), np.stack([exact, -3 * exact], 1),
                               rtol=1e-13)
    assert p.length == 2.0 and p.domain == ((0.0, 1.0), (0.0, 2.0))


def test_q2_elements_reproduce_biquadratics_exactly():
    """"Galerkin x Galerkin as Q1/Q2 elements with Kronecker mass matrices": the L2 projection
    onto Q2 = P2 x P2 reproduces a biquadratic function, and integrates it exactly (1 + 1/4 +
    1/9 = 49/36 for 1 + x1 x2 + x1^2 x2^2)."""
    q2 = Product(P2(5), P2(7))
    assert q2.kind == "galerkin" and q2.n == 35 and q2.order == P2(5).order
    f = lambda x1, x2: 1.0 + x1 * x2 + x1 ** 2 * x2 ** 2   # noqa: E731
    c = q2.sample(f)
    pts = np.random.default_rng(3).uniform(0.0, 1.0, size=(25, 2))
    np.testing.assert_allclose(q2.interpolate(c, pts), f(pts[:, 0], pts[:, 1]), rtol=1e-13)
    assert abs(q2.integrate(c) - 49 / 36) < 1e-14


def test_mixed_nodal_and_galerkin_product_is_the_semi_discretization():
    """"say what mixed products mean or refuse them": Midpoint x P1 stores point values in x1
    and P1 coefficients in x2; a function of x2 only integrates as the P1 rule alone."""
    mixed = Product(Midpoint(4), P1(6))
    assert not mixed.nodal and mixed.kind == "galerkin"
    one = P1(6)
    g = lambda x2: np.exp(x2)                       # noqa: E731
    np.testing.assert_allclose(mixed.integrate(mixed.sample(lambda x1, x2: g(x2) + 0 * x1)),
                               one.integrate(one.sample(g)), rtol=1e-14)


def test_atoms_count_and_the_two_weight_conventions():
    """"`count` point masses placed first on the token axis; `weight=None` gives each atom the
    weight of one average token, 1/(n + count) of the total ... a float gives a fixed total
    atom mass w ... Interpolation acts on the base part; atoms are evaluated as themselves."""
    base = Product(Midpoint(3), Midpoint(3))
    vit = WithAtoms(base, count=2)
    np.testing.assert_allclose(vit.weights, np.full(11, 1 / 11), rtol=1e-15)
    fixed = WithAtoms(base, count=2, weight=0.3)
    np.testing.assert_allclose(fixed.weights[:2], [0.15, 0.15], rtol=1e-15)
    np.testing.assert_allclose(fixed.weights[2:], np.full(9, 0.7 / 9), rtol=1e-15)
    values = np.concatenate([[5.0, -7.0], base.sample(lambda x1, x2: 2.0 + x1 - 3.0 * x2)])
    pts = np.array([[0.5, 0.5], [1 / 6, 5 / 6]])
    np.testing.assert_allclose(fixed.interpolate(values, pts), [5.0, -7.0, 1.0, 2 + 1 / 6 - 2.5],
                               rtol=1e-14)
    assert vit != fixed and WithAtoms(base, count=1) != vit


def test_grids_evaluate_a_state_with_atoms_at_points_of_the_square():
    """"errors are measured at fixed points of [0, 1]^2 and at the atoms": Grids.evaluate
    returns the atoms' rows first, then the reconstruction at the points (exact here: linear
    in x and a trigonometric feature profile on Fourier features)."""
    from ctformer.discretizations import Fourier

    tokens = WithAtoms(Product(GaussLegendre(3), GaussLegendre(4)), count=2, weight=0.2,
                       locations=[[0.1, 0.2], [0.5, 0.5]])
    grids = Grids(tokens, Fourier(8))
    u = grids.sample(lambda x1, x2, y: (1.0 + x1 + 2.0 * x2) * np.cos(2 * np.pi * y))
    pts = np.array([[0.3, 0.4], [0.9, 0.05]])
    got = grids.evaluate(u, tokens=pts, features=np.array([0.0, 0.5]))
    amplitude = np.array([1.5, 2.5, 1.0 + 0.3 + 0.8, 1.0 + 0.9 + 0.1])
    np.testing.assert_allclose(got, np.outer(amplitude, [1.0, -1.0]), rtol=1e-13)
    # min_feature_std: the feature std of (a cos 2 pi y) is |a| / sqrt(2), smallest at x = nodes
    smallest = 1.0 + np.min(tokens.nodes[:, 0] + 2.0 * tokens.nodes[:, 1])
    assert abs(grids.min_feature_std(u) - smallest / np.sqrt(2)) < 1e-14


def _image(x1, x2, y):
    return np.cos(4.0 * y + 0.5 * np.sin(np.pi * x1 + 0.5) * np.cos(np.pi * x2)) + 0.3 * np.sin(np.pi * x1 * y)


def test_q1_token_refinement_of_random_smooth_has_order_two():
    """"Token refinement of `random_smooth` on `Product` tokens: ... Q1 order 2" (both factors
    refined, error at fixed points of the square; measured 1.85, 1.90 between neighbours)."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, placement="pre")
    result = convergence(model, refine="tokens", levels=[5, 9, 17, 33], tokens=Product(P1(3), P1(3)),
                         features="gauss-legendre:8", u0=_image, progress=False, fine=100)
    assert abs(result.observed_order - 2.0) < 0.2


def test_a_two_argument_u0_on_a_square_is_refused_naming_the_convention():
    """"Bad input ...: clear errors": u0(x, y) given on a product token domain (which calls
    u0(x1, x2, y)) used to fail inside the call with "takes 2 positional arguments but 3 were
    given"; now the message names the domain and the expected arguments, and the interval case
    likewise."""
    square = Grids(Product(Midpoint(3), Midpoint(3)), Midpoint(4))
    with pytest.raises(TypeError, match=r"u0\(x1, x2, y\) on the two-dimensional token domain"):
        square.sample(lambda x, y: x + y)
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    with pytest.raises(TypeError, match=r"u0\(x1, x2, y\).*Product\(Midpoint\(3\), Midpoint\(3\)\)"):
        model.solve(lambda x, y: np.cos(x + y), tokens=Product(Midpoint(3), Midpoint(3)),
                    features=Midpoint(4))
    with pytest.raises(TypeError, match=r"u0\(x, y\) on the token interval Midpoint\(3\)"):
        Grids(Midpoint(3), Midpoint(4)).sample(_image)
    # a callable with *args, or a callable object, is called as before
    u = square.sample(lambda *a: a[0] + a[1] + a[2])
    assert u.shape == (9, 4)


def test_the_issues_study_line_runs_without_u0_at_midpoint_order_two():
    """"`ctformer.studies.convergence(..., refine="tokens", tokens=Product(...))` refines both
    factors": written as the issue writes it, without u0, the default initial state takes
    (x1, x2, y) on a square (its slice x2 = 0 is the interval's state), and midpoint x midpoint
    converges at order 2 in h = 1/n1."""
    from ctformer.studies import smooth_initial_state
    x, y = np.linspace(0, 1, 7)[:, None], np.linspace(0, 1, 5)[None, :]
    np.testing.assert_array_equal(smooth_initial_state(x, 0.0 * x, y), smooth_initial_state(x, y))
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    result = convergence(model, refine="tokens", levels=[4, 8, 16, 32],
                         tokens=Product(Midpoint(2), Midpoint(2)), progress=False)
    assert abs(result.observed_order - 2.0) < 0.2
    with pytest.raises(TypeError, match=r"smooth_initial_state takes \(x, y\) or \(x1, x2, y\)"):
        smooth_initial_state(x)
