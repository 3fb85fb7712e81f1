"""Bad input to discretizations raises clear ValueError/TypeError naming what was expected."""
from __future__ import annotations

import numpy as np
import pytest

import ctformer.discretizations as d

MIN_N = {"midpoint": 1, "trapezoid": 2, "gauss-legendre": 1, "clenshaw-curtis": 2, "fourier": 1,
         "chebyshev": 2, "legendre": 1, "p1": 2, "p2": 3}


@pytest.mark.parametrize("name", list(MIN_N))
def test_n_below_minimum(name):
    with pytest.raises(ValueError, match=f"n >= {MIN_N[name]}"):
        d.get(name, MIN_N[name] - 1)
    d.get(name, MIN_N[name])  # the minimum itself is accepted


@pytest.mark.parametrize("n", [2.0, "5", True, None])
def test_n_must_be_an_integer(n):
    with pytest.raises(TypeError, match="n must be an integer"):
        d.Midpoint(n)


@pytest.mark.parametrize("n", [4, 6, 10])
def test_p2_needs_odd_n(n):
    with pytest.raises(ValueError, match="odd n"):
        d.P2(n)


@pytest.mark.parametrize("domain", [(1.0, 0.0), (0.5, 0.5), (0.0, np.inf), (np.nan, 1.0), (0.0,), "ab", None])
@pytest.mark.parametrize("name", list(MIN_N))
def test_bad_domain(name, domain):
    with pytest.raises(ValueError, match="domain"):
        d.get(name, 5, domain=domain)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown discretization name 'simpson'") as info:
        d.get("simpson", 5)
    for name in MIN_N:
        assert name in str(info.value)
    with pytest.raises(ValueError, match="known names"):
        d.as_discretization("hermite", 5)
    with pytest.raises(ValueError, match="needs n"):
        d.as_discretization("p1")
    with pytest.raises(TypeError, match="expected a Discretization"):
        d.as_discretization(3.0)


def _calls(disc):
    pts = [0.5]
    calls = [
        ("integrate", lambda v: disc.integrate(v)),
        ("interpolate", lambda v: disc.interpolate(v, pts)),
    ]
    if disc.kind == "galerkin":
        calls.append(("to_quadrature", lambda v: disc.to_quadrature(v)))
    if hasattr(disc, "coefficients"):
        calls.append(("coefficients", lambda v: disc.coefficients(v)))
    return calls


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", list(MIN_N))
def test_nan_or_inf_in_values(name, bad):
    disc = d.get(name, 5)
    v = np.ones((2, 5))
    v[1, 3] = bad
    for _, call in _calls(disc):
        with pytest.raises(ValueError, match="NaN or inf"):
            call(v)
    q = np.ones(disc.quadrature_nodes.size)
    q[0] = bad
    if disc.kind == "galerkin":
        with pytest.raises(ValueError, match="NaN or inf"):
            disc.from_quadrature(q)


@pytest.mark.parametrize("name", list(MIN_N))
def test_wrong_length_along_axis(name):
    disc = d.get(name, 5)
    for _, call in _calls(disc):
        with pytest.raises(ValueError, match=r"length 6 along axis 1, expected n = 5"):
            call(np.ones((5, 6)))
    with pytest.raises(ValueError, match="out of range"):
        disc.integrate(np.ones(5), axis=1)
    with pytest.raises(ValueError, match="at least one dimension"):
        disc.integrate(np.float64(1.0))
    if disc.kind == "galerkin":
        with pytest.raises(ValueError, match="expected n = "):
            disc.from_quadrature(np.ones(5))


@pytest.mark.parametrize("name", list(MIN_N))
def test_points_outside_domain_or_malformed(name):
    disc = d.get(name, 5, domain=(-1.0, 1.0))
    v = np.ones(5)
    for pts in ([-1.1], [0.0, 1.5], [np.nan]):
        with pytest.raises(ValueError, match="points"):
            disc.interpolate(v, pts)
        with pytest.raises(ValueError, match="points"):
            disc.interpolation_matrix(pts)
    with pytest.raises(ValueError, match="1-D"):
        disc.interpolate(v, [[0.0]])
    # the closed ends are inside
    np.testing.assert_allclose(disc.interpolate(v, [-1.0, 1.0]), [1.0, 1.0], atol=1e-13)


@pytest.mark.parametrize("factor, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError),
                                           (True, TypeError)])
def test_bad_refine_factor(factor, error):
    with pytest.raises(error, match="refine factor must be a positive integer"):
        d.Chebyshev(5).refine(factor)


def test_sample_rejects_nan():
    with pytest.raises(ValueError, match="NaN or inf"):
        d.Midpoint(4).sample(lambda x: np.where(x > 0.5, np.inf, x))


def test_error_table_rejects_bad_input():
    with pytest.raises(ValueError, match="known names"):
        d.error_table(np.exp, np.e - 1, names=["simpson"])
    with pytest.raises(ValueError, match="exact_integral"):
        d.error_table(np.exp, float("nan"))
