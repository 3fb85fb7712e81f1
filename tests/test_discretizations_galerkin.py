"""P1/P2 Galerkin elements: mass matrices in closed form, L2 projection (checked with
scipy.integrate.quad), reproduction of polynomials, the quadrature-point view, L2 orders."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.sparse

import ctformer.discretizations as d
from .conftest import fitted_order

DOMAIN = (-1.0, 2.0)

ELEMENT_MASS = {
    "p1": np.array([[2.0, 1.0], [1.0, 2.0]]) / 6.0,
    "p2": np.array([[4.0, 2.0, -1.0], [2.0, 16.0, 2.0], [-1.0, 2.0, 4.0]]) / 30.0,
}


def f_smooth(x):
    return np.exp(x) * np.cos(3 * x + 1)


@pytest.mark.parametrize("name, n", [("p1", 6), ("p2", 7)])
def test_mass_matrix_and_weights_closed_form(name, n):
    disc = d.get(name, n, domain=DOMAIN)
    p = disc.degree
    E = (n - 1) // p
    H = 3.0 / E
    assert disc.elements == E and math.isclose(disc.element_width, H)
    expected = np.zeros((n, n))
    for e in range(E):
        idx = np.arange(p * e, p * e + p + 1)
        expected[np.ix_(idx, idx)] += H * ELEMENT_MASS[name]
    assert scipy.sparse.issparse(disc.mass) and disc.mass.format == "csr"
    np.testing.assert_allclose(disc.mass.toarray(), expected, rtol=0, atol=1e-15)
    # integrals of the basis functions: trapezoid (P1) and Simpson (P2) weights
    if name == "p1":
        w = np.full(n, H)
        w[[0, -1]] = H / 2
    else:
        w = np.tile([H / 3, 2 * H / 3], E + 1)[:n]
        w[[0, -1]] = H / 6
    np.testing.assert_allclose(disc.weights, w, rtol=1e-14)
    np.testing.assert_allclose(disc.nodes, np.linspace(*DOMAIN, n), rtol=0, atol=1e-15)


@pytest.mark.parametrize("name, q", [("p1", 3), ("p2", 4)])
def test_quadrature_nodes_are_element_gauss_points(name, q):
    disc = d.get(name, 5, domain=DOMAIN)
    t, w = np.polynomial.legendre.leggauss(q)
    H = disc.element_width
    left = DOMAIN[0] + H * np.arange(disc.elements)
    np.testing.assert_allclose(disc.quadrature_nodes, (left[:, None] + H * (t + 1) / 2).ravel(), atol=1e-15)
    np.testing.assert_allclose(disc.quadrature_weights, np.tile(H * w / 2, disc.elements), rtol=1e-14)


@pytest.mark.parametrize("name, degree", [("p1", 1), ("p2", 2)])
def test_reproduces_polynomials_of_its_degree(name, degree):
    disc = d.get(name, 9, domain=DOMAIN)
    poly = np.polynomial.Polynomial([0.7, -1.3, 0.4][: degree + 1])
    exact = poly.integ()(DOMAIN[1]) - poly.integ()(DOMAIN[0])
    c = disc.sample(poly)
    pts = np.linspace(*DOMAIN, 31)
    np.testing.assert_allclose(c, poly(disc.nodes), rtol=0, atol=1e-13)  # coefficients = nodal values
    np.testing.assert_allclose(disc.interpolate(c, pts), poly(pts), rtol=0, atol=1e-13)
    assert abs(float(disc.integrate(c)) - exact) < 1e-13
    np.testing.assert_allclose(disc.to_quadrature(c), poly(disc.quadrature_nodes), rtol=0, atol=1e-13)
    np.testing.assert_allclose(disc.from_quadrature(poly(disc.quadrature_nodes)), c, rtol=0, atol=1e-13)
    # one degree more is not reproduced: the check above can fail
    higher = np.polynomial.Polynomial([0.0] * (degree + 1) + [1.0])
    assert np.max(np.abs(disc.interpolate(disc.sample(higher), pts) - higher(pts))) > 1e-4


@pytest.mark.parametrize("name, n, degree", [("p1", 4, 4), ("p2", 5, 5)])
def test_projection_is_l2_orthogonal_to_the_space(name, n, degree):
    # int (f - f_h) phi_j = 0 for every basis function, integrals by adaptive quadrature.
    # f is a polynomial outside the space whose products with the basis the element Gauss
    # rule (q = p + 2 points, exact to degree 2q - 1) integrates exactly, so the discrete
    # projection is the exact L2 projection.
    disc = d.get(name, n)
    f = np.polynomial.Polynomial(np.cos(np.arange(degree + 1)))
    c = disc.project(f)
    assert np.max(np.abs(c - f(disc.nodes))) > 1e-4  # not the nodal interpolant
    edges = np.linspace(0.0, 1.0, disc.elements + 1)
    for j in range(n):
        unit = np.zeros(n)
        unit[j] = 1.0

        def integrand(x, unit=unit):
            x = np.atleast_1d(x)
            return float(((f(x) - disc.interpolate(c, x)) * disc.interpolate(unit, x))[0])

        total = sum(scipy.integrate.quad(integrand, lo, hi, epsabs=1e-14)[0] for lo, hi in zip(edges[:-1], edges[1:]))
        assert abs(total) < 1e-12


@pytest.mark.parametrize("name, n", [("p1", 6), ("p2", 7)])
def test_quadrature_round_trip(name, n, rng):
    disc = d.get(name, n)
    c = rng.standard_normal((2, n, 3))
    for axis in (1, -2):
        q = disc.to_quadrature(c, axis=axis)
        assert q.shape == (2, disc.quadrature_nodes.size, 3)
        np.testing.assert_allclose(q[0, :, 1], disc.interpolate(c[0, :, 1], disc.quadrature_nodes), atol=1e-14)
        np.testing.assert_allclose(disc.from_quadrature(q, axis=axis), c, rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["p1", "p2"])
def test_l2_error_order(name):
    # || f - P_h f ||_{L2} with a 10-point Gauss rule on 64 sub-cells of every element
    t, w = np.polynomial.legendre.leggauss(10)
    errs, hs = [], []
    for n in [9, 17, 33, 65]:
        disc = d.get(name, n)
        c = disc.project(f_smooth)
        cells = np.linspace(0.0, 1.0, 513)
        x = ((cells[:-1, None] + cells[1:, None]) / 2 + (cells[1] - cells[0]) / 2 * t[None, :]).ravel()
        wx = np.tile((cells[1] - cells[0]) / 2 * w, 512)
        errs.append(math.sqrt(float(wx @ (f_smooth(x) - disc.interpolate(c, x)) ** 2)))
        hs.append(disc.h)
    assert abs(fitted_order(hs, errs) - disc.order) < 0.25


def test_project_checks_the_function():
    disc = d.P1(5)
    np.testing.assert_allclose(disc.project(lambda x: 2.5), np.full(5, 2.5), atol=1e-14)
    with pytest.raises(ValueError, match="shape"):
        disc.project(lambda x: np.ones((x.size, 2)))
    with pytest.raises(ValueError, match="NaN or inf"):
        disc.project(lambda x: np.where(x > 0.5, np.nan, x))
