"""Discretizations: registry, exactness, observed orders, closed-form coefficients, batching.

References are closed forms (polynomial and trigonometric integrals, Bessel-function series
coefficients of exp) and scipy.integrate.quad; orders are fitted over four levels.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.special

import ctformer.discretizations as d
from .conftest import fitted_order

NAMES = ["midpoint", "trapezoid", "gauss-legendre", "clenshaw-curtis", "fourier", "chebyshev",
         "legendre", "p1", "p2"]
ORDERS = {"midpoint": 2, "trapezoid": 2, "gauss-legendre": math.inf, "clenshaw-curtis": math.inf,
          "fourier": math.inf, "chebyshev": math.inf, "legendre": math.inf, "p1": 2, "p2": 3}
KINDS = {"midpoint": "quadrature", "trapezoid": "quadrature", "gauss-legendre": "quadrature",
         "clenshaw-curtis": "quadrature", "fourier": "spectral", "chebyshev": "spectral",
         "legendre": "spectral", "p1": "galerkin", "p2": "galerkin"}
SPECTRAL = ["gauss-legendre", "clenshaw-curtis", "chebyshev", "legendre"]
LOW_ORDER = ["midpoint", "trapezoid", "p1", "p2"]


# smooth non-periodic test function and its integral in closed form
def f_smooth(x):
    return np.exp(x) * np.cos(3 * x + 1)


def _F(x):
    return np.exp(x) * (np.cos(3 * x + 1) + 3 * np.sin(3 * x + 1)) / 10


I_SMOOTH = _F(1.0) - _F(0.0)


# smooth periodic test function: int_0^1 exp(sin 2 pi x) dx = I_0(1)
def f_periodic(x):
    return np.exp(np.sin(2 * np.pi * x))


I_PERIODIC = float(scipy.special.i0(1.0))

# uniform check points containing the cell midpoints of all uniform levels used below
CHECK = np.linspace(0.0, 1.0, 1025)


def _n(name, n):
    return n + 1 if name == "p2" and n % 2 == 0 else n


def errors(name, f, exact, n):
    disc = d.get(name, _n(name, n))
    v = disc.sample(f)
    e_int = abs(float(disc.integrate(v)) - exact)
    e_interp = float(np.max(np.abs(disc.interpolate(v, CHECK) - f(CHECK))))
    return disc.h, e_int, e_interp


def test_available_lists_the_nine_names_in_table_order():
    assert d.available() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_attributes_and_weights_sum_to_length(name):
    disc = d.get(name, 9, domain=(-1.0, 2.0))
    assert disc.name == name and disc.kind == KINDS[name] and disc.order == ORDERS[name]
    assert disc.n == 9 and disc.domain == (-1.0, 2.0)
    assert disc.nodes.shape == (9,) and disc.weights.shape == (9,)
    assert np.all(np.diff(disc.nodes) > 0)
    assert disc.nodes[0] >= -1.0 and disc.nodes[-1] <= 2.0
    assert math.isclose(disc.weights.sum(), 3.0, rel_tol=1e-14)
    assert math.isclose(disc.quadrature_weights.sum(), 3.0, rel_tol=1e-14)
    assert disc == d.get(name, 9, domain=(-1.0, 2.0)) and hash(disc) == hash(d.get(name, 9, domain=(-1, 2)))


def test_node_formulas():
    a, b = -1.0, 2.0
    np.testing.assert_allclose(d.Midpoint(4, (a, b)).nodes, a + 3 * (np.arange(4) + 0.5) / 4, rtol=0, atol=1e-15)
    np.testing.assert_allclose(d.Trapezoid(5, (a, b)).nodes, a + 3 * np.arange(5) / 4, rtol=0, atol=1e-15)
    np.testing.assert_allclose(d.Trapezoid(5, (a, b)).weights, [3 / 8, 3 / 4, 3 / 4, 3 / 4, 3 / 8], rtol=1e-15)
    np.testing.assert_allclose(d.Fourier(6, (a, b)).nodes, a + 3 * np.arange(6) / 6, rtol=0, atol=1e-15)
    cheb = 0.5 * (a + b) - 0.5 * (b - a) * np.cos(np.pi * np.arange(7) / 6)
    np.testing.assert_allclose(d.Chebyshev(7, (a, b)).nodes, cheb, rtol=0, atol=1e-15)
    np.testing.assert_allclose(d.ClenshawCurtis(7, (a, b)).nodes, cheb, rtol=0, atol=1e-15)
    # Simpson's rule is Clenshaw-Curtis with 3 points
    np.testing.assert_allclose(d.ClenshawCurtis(3).weights, [1 / 6, 2 / 3, 1 / 6], rtol=1e-15)
    t, w = np.polynomial.legendre.leggauss(5)
    np.testing.assert_allclose(d.Legendre(5, (a, b)).nodes, 0.5 + 1.5 * t, rtol=0, atol=1e-15)
    np.testing.assert_allclose(d.Legendre(5, (a, b)).weights, 1.5 * w, rtol=1e-14)


# -- exactness ---------------------------------------------------------------------------------
def _monomial_integral(k, a, b):
    return (b ** (k + 1) - a ** (k + 1)) / (k + 1)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("name", ["gauss-legendre", "legendre"])
def test_gauss_legendre_exact_to_degree_2n_minus_1_and_not_beyond(name, n):
    a, b = -0.5, 1.5
    disc = d.get(name, n, domain=(a, b))
    for k in range(2 * n):
        assert math.isclose(float(disc.integrate(disc.nodes**k)), _monomial_integral(k, a, b), rel_tol=1e-13)
    assert abs(float(disc.integrate(disc.nodes ** (2 * n))) - _monomial_integral(2 * n, a, b)) > 1e-6


@pytest.mark.parametrize("n", [2, 3, 6, 11])
@pytest.mark.parametrize("name", ["clenshaw-curtis", "chebyshev"])
def test_clenshaw_curtis_exact_to_degree_n_minus_1(name, n):
    a, b = -0.5, 1.5
    disc = d.get(name, n, domain=(a, b))
    for k in range(n):
        assert math.isclose(float(disc.integrate(disc.nodes**k)), _monomial_integral(k, a, b), rel_tol=1e-13)


@pytest.mark.parametrize("name", SPECTRAL)
def test_polynomial_interpolation_reproduces_degree_n_minus_1(name):
    n = 9
    disc = d.get(name, n, domain=(-0.5, 1.5))
    poly = np.polynomial.Polynomial(np.linspace(1.0, -1.0, n))  # degree n - 1
    pts = np.linspace(-0.5, 1.5, 37)
    np.testing.assert_allclose(disc.interpolate(poly(disc.nodes), pts), poly(pts), rtol=0, atol=1e-12)
    np.testing.assert_allclose(disc.interpolation_matrix(pts) @ poly(disc.nodes), poly(pts), rtol=0, atol=1e-12)


@pytest.mark.parametrize("n", [7, 8])
def test_fourier_exact_for_trigonometric_polynomials(n):
    a, b = 0.5, 2.5
    disc = d.Fourier(n, (a, b))
    theta = lambda x: 2 * np.pi * (np.asarray(x) - a) / (b - a)  # noqa: E731
    pts = np.linspace(a, b, 41)
    for k in range(1, (n - 1) // 2 + 1):
        f = lambda x: 1.0 + np.cos(k * theta(x)) - 0.5 * np.sin(k * theta(x))  # noqa: E731
        assert math.isclose(float(disc.integrate(disc.sample(f))), b - a, rel_tol=1e-14)
        np.testing.assert_allclose(disc.interpolate(disc.sample(f), pts), f(pts), rtol=0, atol=1e-13)
        np.testing.assert_allclose(disc.interpolation_matrix(pts) @ disc.sample(f), f(pts), rtol=0, atol=1e-13)
    if n % 2 == 0:
        # the Nyquist mode is split between +-n/2: cos(n theta / 2) is reproduced exactly
        nyq = lambda x: np.cos(0.5 * n * theta(x))  # noqa: E731
        np.testing.assert_allclose(disc.interpolate(disc.sample(nyq), pts), nyq(pts), rtol=0, atol=1e-13)
        np.testing.assert_allclose(disc.interpolation_matrix(pts) @ disc.sample(nyq), nyq(pts), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name", ["midpoint", "trapezoid"])
def test_low_order_rules_exact_for_linear_functions(name):
    disc = d.get(name, 6, domain=(-1.0, 2.0))
    lin = lambda x: 0.3 - 2.0 * x  # noqa: E731
    pts = np.linspace(-1.0, 2.0, 23)
    assert math.isclose(float(disc.integrate(disc.sample(lin))), 0.3 * 3 - (4 - 1), rel_tol=1e-14)
    np.testing.assert_allclose(disc.interpolate(disc.sample(lin), pts), lin(pts), rtol=0, atol=1e-13)


# -- closed-form spectral coefficients ------------------------------------------------------------
def test_chebyshev_coefficients_of_exp():
    # e^t = I_0(1) + 2 sum_m I_m(1) T_m(t) on [-1, 1]; here t = 2x - 1 on [0, 1]
    n = 20
    disc = d.Chebyshev(n)
    expected = 2 * scipy.special.iv(np.arange(n), 1.0)
    expected[0] /= 2
    np.testing.assert_allclose(disc.coefficients(np.exp(2 * disc.nodes - 1)), expected, rtol=0, atol=1e-15)


def test_legendre_coefficients_of_exp():
    # e^t = sum_m (2m + 1) i_m(1) P_m(t), i_m the modified spherical Bessel function
    n = 20
    disc = d.Legendre(n, domain=(-1.0, 1.0))
    expected = (2 * np.arange(n) + 1) * scipy.special.spherical_in(np.arange(n), 1.0)
    # rounding in a_m grows like (2m + 1) eps
    np.testing.assert_allclose(disc.coefficients(np.exp(disc.nodes)), expected, rtol=0, atol=1e-14)


def test_fourier_coefficients_of_exp_cos():
    # e^{cos theta} = sum_k I_|k|(1) e^{i k theta}
    n = 32
    disc = d.Fourier(n)
    c = disc.coefficients(np.exp(np.cos(2 * np.pi * disc.nodes)))
    k = np.fft.fftfreq(n, 1.0 / n)
    np.testing.assert_allclose(c, scipy.special.iv(np.abs(k), 1.0), rtol=0, atol=1e-15)


@pytest.mark.parametrize("n", [16, 17])
def test_fourier_fft_path_matches_dirichlet_matrix(n, rng):
    disc = d.Fourier(n, (-1.0, 1.0))
    v = rng.standard_normal(n)
    pts = np.concatenate([rng.uniform(-1.0, 1.0, 20), disc.nodes[:3], [1.0]])
    np.testing.assert_allclose(disc.interpolate(v, pts), disc.interpolation_matrix(pts) @ v, rtol=0, atol=1e-12)
    # periodicity: the value at b is the value at a
    assert math.isclose(float(disc.interpolate(v, [1.0])[0]), v[0], abs_tol=1e-13)


def test_chebyshev_series_matches_barycentric_and_legendre_matches_gauss(rng):
    pts = rng.uniform(0.0, 1.0, 50)
    cheb = d.Chebyshev(33)
    v = f_smooth(cheb.nodes) + 1e-3 * rng.standard_normal(33)
    np.testing.assert_allclose(cheb.interpolate(v, pts), cheb.interpolation_matrix(pts) @ v, rtol=0, atol=1e-13)
    leg, gl = d.Legendre(33), d.GaussLegendre(33)
    v = f_smooth(leg.nodes) + 1e-3 * rng.standard_normal(33)
    np.testing.assert_allclose(leg.interpolate(v, pts), gl.interpolate(v, pts), rtol=0, atol=1e-13)


def test_quad_reference_for_the_closed_form_integrals():
    assert math.isclose(scipy.integrate.quad(f_smooth, 0, 1, epsabs=1e-15)[0], I_SMOOTH, rel_tol=1e-13)
    assert math.isclose(scipy.integrate.quad(f_periodic, 0, 1, epsabs=1e-15)[0], I_PERIODIC, rel_tol=1e-13)


# -- observed orders ----------------------------------------------------------------------------
LEVELS = {"midpoint": [16, 32, 64, 128], "trapezoid": [17, 33, 65, 129], "p1": [17, 33, 65, 129],
          "p2": [17, 33, 65, 129]}


@pytest.mark.parametrize("name", LOW_ORDER)
@pytest.mark.parametrize("which", ["smooth", "periodic"])
def test_interpolation_order(name, which):
    f = f_smooth if which == "smooth" else f_periodic
    h, _, e = zip(*(errors(name, f, 0.0, n) for n in LEVELS[name]))
    assert abs(fitted_order(h, e) - ORDERS[name]) < 0.25


@pytest.mark.parametrize("name", ["midpoint", "trapezoid"])
def test_integration_order_smooth(name):
    h, e, _ = zip(*(errors(name, f_smooth, I_SMOOTH, n) for n in [8, 16, 32, 64]))
    assert abs(fitted_order(h, e) - ORDERS[name]) < 0.25


@pytest.mark.parametrize("name, levels, gauss_order", [("p1", [3, 5, 9, 17], 6), ("p2", [3, 5, 9, 17], 8)])
def test_galerkin_integration_is_superconvergent(name, levels, gauss_order):
    # 1 lies in the FE space, so int P_h f = int f up to the q-point element Gauss rule: order 2q
    h, e, _ = zip(*(errors(name, f_smooth, I_SMOOTH, n) for n in levels))
    assert abs(fitted_order(h, e) - gauss_order) < 0.25
    disc = d.get(name, 9)
    gauss = float(disc.quadrature_weights @ f_smooth(disc.quadrature_nodes))
    assert abs(float(disc.integrate(disc.sample(f_smooth))) - gauss) < 1e-14


@pytest.mark.parametrize("name", LOW_ORDER)
def test_integration_of_periodic_data_converges_geometrically(name):
    # periodic analytic integrands: only aliased modes k = multiples of the cell count remain
    _, e1, _ = errors(name, f_periodic, I_PERIODIC, 4 if name == "midpoint" else 5)
    _, e2, _ = errors(name, f_periodic, I_PERIODIC, 32 if name == "midpoint" else 33)
    assert e1 > 1e-8 and e2 < 1e-13


def test_fourier_on_non_periodic_data_is_a_first_order_riemann_sum():
    # Euler-Maclaurin: left Riemann sum error = -h (f(1) - f(0)) / 2 + O(h^2)
    for n in [64, 128]:
        disc = d.Fourier(n)
        err = float(disc.integrate(disc.sample(f_smooth))) - I_SMOOTH
        leading = -0.5 * disc.h * (f_smooth(1.0) - f_smooth(0.0))
        assert abs(err - leading) < 2 * disc.h**2


@pytest.mark.parametrize("name", SPECTRAL)
def test_spectral_accuracy_smooth(name):
    ns = [6, 8, 10, 12]
    h, _, e_interp = zip(*(errors(name, f_smooth, I_SMOOTH, n) for n in ns))
    assert fitted_order(h, e_interp) > 15  # faster than any fixed power of h
    _, e_int40, e_interp40 = errors(name, f_smooth, I_SMOOTH, 40)
    assert e_int40 < 1e-12 and e_interp40 < 1e-12


@pytest.mark.parametrize("name", SPECTRAL + ["fourier"])
def test_spectral_accuracy_periodic(name):
    # exp(sin 2 pi x): Fourier is exact to rounding by n = 24; polynomial methods need n ~ 48
    ns = [8, 12, 16, 24]
    h, _, e_interp = zip(*(errors(name, f_periodic, I_PERIODIC, n) for n in ns))
    assert fitted_order(h, e_interp) > 8
    n_final = 24 if name == "fourier" else 48
    _, e_int_final, e_interp_final = errors(name, f_periodic, I_PERIODIC, n_final)
    assert e_int_final < 1e-12 and e_interp_final < 1e-12


# -- refinement, batching, dtype ------------------------------------------------------------------
@pytest.mark.parametrize("name, n, refined", [("midpoint", 5, 15), ("trapezoid", 5, 13), ("gauss-legendre", 5, 15),
                                              ("clenshaw-curtis", 5, 13), ("fourier", 6, 18), ("chebyshev", 5, 13),
                                              ("legendre", 5, 15), ("p1", 5, 13), ("p2", 5, 13)])
def test_refine(name, n, refined):
    disc = d.get(name, n, domain=(0.0, 2.0))
    fine = disc.refine(3)
    assert type(fine) is type(disc) and fine.n == refined and fine.domain == (0.0, 2.0)
    if name in ("trapezoid", "clenshaw-curtis", "fourier", "chebyshev", "p1", "p2"):
        # nested grids: the coarse nodes are fine nodes
        assert np.min(np.abs(disc.nodes[:, None] - fine.nodes[None, :]), axis=1).max() < 1e-14


@pytest.mark.parametrize("name", NAMES)
def test_batched_along_any_axis(name, rng):
    disc = d.get(name, 7)
    pts = np.linspace(0.0, 1.0, 5)
    values = rng.standard_normal((3, 7, 2))
    for axis in (1, -2):
        integ = disc.integrate(values, axis=axis)
        interp = disc.interpolate(values, pts, axis=axis)
        quad = disc.to_quadrature(values, axis=axis)
        back = disc.from_quadrature(quad, axis=axis)
        assert integ.shape == (3, 2) and interp.shape == (3, 5, 2)
        assert quad.shape == (3, disc.quadrature_nodes.size, 2)
        np.testing.assert_allclose(back, values, rtol=0, atol=1e-13)
        for i in range(3):
            for j in range(2):
                col = values[i, :, j]
                assert math.isclose(integ[i, j], float(disc.integrate(col)), rel_tol=1e-13, abs_tol=1e-15)
                np.testing.assert_allclose(interp[i, :, j], disc.interpolation_matrix(pts) @ col, atol=1e-13)
    moved = np.moveaxis(values, 1, 0)
    np.testing.assert_allclose(disc.integrate(moved, axis=0), disc.integrate(values, axis=1), atol=1e-14)
    if hasattr(disc, "coefficients"):
        np.testing.assert_allclose(disc.coefficients(values, axis=1),
                                   np.moveaxis(disc.coefficients(np.moveaxis(values, 1, -1)), -1, 1), atol=1e-14)


@pytest.mark.parametrize("name", NAMES)
def test_float32_stays_float32(name):
    disc = d.get(name, 9)
    v64 = disc.sample(f_periodic)
    v = v64.astype(np.float32)
    assert disc.integrate(v).dtype == np.float32
    assert disc.interpolate(v, [0.25, 0.5]).dtype == np.float32
    assert disc.from_quadrature(disc.to_quadrature(v)).dtype == np.float32
    # single-precision rounding only: compare with the float64 computation
    assert abs(float(disc.integrate(v)) - float(disc.integrate(v64))) < 1e-6
    np.testing.assert_allclose(disc.interpolate(v, [0.25, 0.5]), disc.interpolate(v64, [0.25, 0.5]), atol=1e-5)


def test_host_matrices_are_cached():
    p2 = d.P2(9)
    assert p2.mass is p2.mass and p2.quadrature_nodes is p2.quadrature_nodes
    leg = d.Legendre(9)
    assert leg.coefficient_matrix is leg.coefficient_matrix
    from ctformer.backend import get_backend

    assert p2.mass_on(get_backend("numpy")) is p2.mass_on(get_backend("numpy"))
