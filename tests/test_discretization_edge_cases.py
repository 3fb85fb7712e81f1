"""Edge cases of discretizations and order fits, each checked against an independent number.

Reproducers of defects found in an audit (an order fitted through one abscissa, complex values
silently truncated, a wrong-shaped sample accepted, products outside the memory budget, atoms
outside the domain), plus exactness checks against closed forms and SciPy.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.special

import ctformer.discretizations as d
from ctformer.discretizations import Product, SizeTooLargeError, WithAtoms
from ctformer.studies import fit_order


# -- fit_order ------------------------------------------------------------------------------
def test_fit_order_through_one_mesh_width_is_undefined():
    """Two errors at the same h (e.g. a repeated rtol in work_precision) have no slope; the
    fit returned -0.25 here (and 1.186 for a repeated rtol), with a RankWarning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(fit_order([0.5, 0.5], [1.0, 2.0]))
        assert math.isnan(fit_order([1e-4, 1e-4, 1e-4], [3e-10, 3e-10, 4e-10]))
        # a level below the floor leaves one abscissa: undefined as well
        assert math.isnan(fit_order([0.5, 0.25, 0.25], [1e-20, 1e-3, 2e-3], floor=1e-15))


def test_fit_order_with_a_repeated_mesh_width_is_least_squares():
    h, e = [0.5, 0.5, 0.25, 0.125], [0.3, 0.2, 0.06, 0.015]
    x, y = np.log(h), np.log(e)
    slope = np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2)
    assert fit_order(h, e) == pytest.approx(slope, rel=1e-12)
    assert fit_order([0.5, 0.25, 0.125], [4e-2, 1e-2, 2.5e-3]) == pytest.approx(2.0, rel=1e-12)


# -- sample: shapes and complex values --------------------------------------------------------
def test_nodal_sample_refuses_a_result_of_another_shape():
    disc = d.Midpoint(4)
    with pytest.raises(ValueError, match=r"shape \(4,\).*got shape \(3,\)"):
        disc.sample(lambda x: np.ones(3))
    with pytest.raises(ValueError, match=r"got shape \(4, 2\)"):
        disc.sample(lambda x: np.ones((4, 2)))
    # a scalar is broadcast; a good f integrates to the closed form of the midpoint rule
    assert np.array_equal(disc.sample(lambda x: 2.0), np.full(4, 2.0))
    gl = d.GaussLegendre(3, domain=(1.0, 3.0))
    assert gl.integrate(gl.sample(lambda x: x**5)) == pytest.approx((3**6 - 1) / 6, rel=1e-14)


def test_product_and_atoms_refuse_complex_values():
    """They cast with np.asarray(..., float64): the imaginary part was dropped with a warning."""
    prod = Product(d.Midpoint(2), d.Midpoint(3))
    with pytest.raises(TypeError, match="the values of f must be real"):
        prod.sample(lambda a, b: a + 1j * b)
    atoms = WithAtoms(d.Midpoint(4))
    with pytest.raises(TypeError, match="the values of f must be real"):
        atoms.sample(lambda x: x + 1j)
    # real values are the function at the nodes, and integrate to the exact product integral
    v = prod.sample(lambda a, b: a * b)
    assert np.array_equal(v, prod.nodes[:, 0] * prod.nodes[:, 1])
    assert prod.integrate(v) == pytest.approx(0.25, rel=1e-15)  # int x1 x2 over [0, 1]^2
    w = atoms.sample(lambda x: 1.0 + x)
    assert atoms.integrate(w) == pytest.approx(0.2 * 1.0 + 0.8 * 1.5, rel=1e-15)


# -- products and the memory budget ---------------------------------------------------------
def test_product_respects_the_memory_budget(monkeypatch):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e6")
    with pytest.raises(SizeTooLargeError, match="choose smaller factors"):
        Product(d.Midpoint(300), d.Midpoint(300))      # 90000 values, 2.2 MB of nodes and weights
    with pytest.raises(SizeTooLargeError, match="choose smaller factors"):
        Product(d.P1(120), d.P1(120))                  # 119 * 3 quadrature points per factor
    prod = Product(d.Midpoint(60), d.GaussLegendre(60))  # 3600 values: within the budget
    pts = np.full((300, 2), 0.5)
    with pytest.raises(SizeTooLargeError, match="product interpolation matrix"):
        prod.interpolation_matrix(pts)                 # 300 x 3600 dense, 8.6 MB
    with pytest.raises(SizeTooLargeError):
        WithAtoms(prod).interpolation_matrix(pts)
    # the factor-wise interpolation needs no such matrix: x1 x2^3 at (0.5, 0.5) exactly
    values = prod.sample(lambda a, b: a * b**3)
    assert prod.interpolate(values, pts)[0] == pytest.approx(0.5**4, rel=1e-13)


# -- atoms ----------------------------------------------------------------------------------
def test_atom_locations_lie_in_the_domain_and_hash_like_they_compare():
    base = d.Midpoint(4, domain=(-1.0, 1.0))
    with pytest.raises(ValueError, match="locations must lie in the token domain"):
        WithAtoms(base, locations=[5.0])
    square = Product(d.Midpoint(2), d.Midpoint(2))
    with pytest.raises(ValueError, match="locations must lie in the token domain"):
        WithAtoms(square, locations=[[0.5, 1.5]])
    a, b = WithAtoms(base, locations=[0.0]), WithAtoms(base, locations=[-0.0])
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    # the atom's mass is one average token: |X| / (n + 1) = 2 / 5
    assert a.weights[0] == pytest.approx(0.4, rel=1e-15)
    assert a.weights.sum() == pytest.approx(2.0, rel=1e-15)


# -- exactness against independent references -------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 7, 150, 2000])
def test_gauss_legendre_matches_scipy_and_its_degree(n):
    rule = d.GaussLegendre(n, domain=(-1.0, 1.0))
    x, w = scipy.special.roots_legendre(n)
    assert np.max(np.abs(rule.nodes - x)) < 1e-15
    # SciPy's large-n weights lose digits near the ends; compare the interior ones
    inner = slice(n // 4, n - n // 4) if n > 100 else slice(None)
    assert np.max(np.abs(rule.weights[inner] - w[inner]) / w[inner]) < 1e-12
    if n <= 7:
        wide = d.GaussLegendre(n, domain=(2.0, 5.0))
        t = (wide.nodes - 3.5) / 1.5       # [2, 5] -> [-1, 1]
        for k in range(2 * n + 1):
            exact = 3.0 / (k + 1) if k % 2 == 0 else 0.0   # int_2^5 t^k dx
            err = abs(wide.integrate(t**k) - exact)
            assert (err < 1e-14) if k < 2 * n else (err > 1e-4)


def test_clenshaw_curtis_weights_are_the_closed_form():
    assert np.allclose(d.ClenshawCurtis(3, domain=(-1, 1)).weights, [1 / 3, 4 / 3, 1 / 3], rtol=1e-15)
    assert np.allclose(d.ClenshawCurtis(5, domain=(-1, 1)).weights,
                       np.array([1, 8, 12, 8, 1]) / 15, rtol=1e-15)


# -- kernels --------------------------------------------------------------------------------
def test_smooth_random_negative_scale_is_the_norm_with_its_sign():
    """||W||_{L2} = |scale| by a Gauss product rule of 30 x 30 points (W^2 is a sum of cosines
    of frequency at most 6 pi per variable: that rule is exact to rounding), and
    W(-scale) = -W(scale)."""
    from ctformer.kernels import SmoothRandom

    x, w = scipy.special.roots_legendre(30)
    x, w = (x + 1) / 2, w / 2
    plus, minus = SmoothRandom(3, scale=2.5), SmoothRandom(3, scale=-2.5)
    values = minus.evaluate(x[:, None], x[None, :])
    assert math.sqrt(w @ values ** 2 @ w) == pytest.approx(2.5, rel=1e-12)
    np.testing.assert_array_equal(values, -plus.evaluate(x[:, None], x[None, :]))


def test_convolution_profile_of_another_shape_is_refused():
    from ctformer.kernels import Convolution

    with pytest.raises(ValueError, match=r"map 8 points z to 8 values \(or one\), got shape \(3,\)"):
        Convolution(lambda z: np.ones(3)).symbol(d.Midpoint(8))
    # a constant profile p = 2 is the circulant with symbol 2 at frequency 0 and 0 elsewhere
    symbol = Convolution(lambda z: 2.0).symbol(d.Midpoint(8))
    np.testing.assert_allclose(symbol, [2.0, 0, 0, 0, 0], atol=1e-15)


def test_products_and_atoms_take_lists_as_the_one_variable_rules_do():
    """"list is not a supported array type" before; the values of u = x1 + 2 x2 (exact on the
    midpoint product's bilinear reconstruction at a node) and the atoms' mass."""
    p = Product(d.Midpoint(3), d.Midpoint(3))
    x = p.nodes
    values = (x[:, 0] + 2 * x[:, 1]).tolist()
    node = x[4].tolist()
    assert p.interpolate(values, [node])[0] == pytest.approx(node[0] + 2 * node[1], rel=1e-14)
    atoms = WithAtoms(d.Midpoint(3))
    assert atoms.integrate([1.0] * atoms.n) == pytest.approx(float(np.sum(atoms.weights)), rel=1e-15)
    assert atoms.interpolate([1.0, 2.0, 2.0, 2.0], [0.5])[1] == pytest.approx(2.0, rel=1e-15)
