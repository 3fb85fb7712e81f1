"""The core discretization methods on array_api_strict arrays (no NumPy-only shortcuts)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special

import array_api_strict as xps

import ctformer.discretizations as d

NAMES = ["midpoint", "trapezoid", "gauss-legendre", "clenshaw-curtis", "fourier", "chebyshev",
         "legendre", "p1", "p2"]


def f_periodic(x):
    return np.exp(np.sin(2 * np.pi * x))


I_PERIODIC = float(scipy.special.i0(1.0))
TOL = {"midpoint": 1e-12, "trapezoid": 1e-12, "gauss-legendre": 1e-9, "clenshaw-curtis": 1e-9,
       "fourier": 1e-12, "chebyshev": 1e-9, "legendre": 1e-9, "p1": 1e-8, "p2": 1e-8}


@pytest.mark.parametrize("name", NAMES)
def test_core_methods_on_strict_arrays(name):
    disc = d.get(name, 33)
    host = disc.sample(f_periodic)
    # batch of two functions (f and 2 f) along axis 0, values along axis 1
    values = xps.asarray(np.stack([host, 2 * host]))
    integral = disc.integrate(values, axis=1)
    assert isinstance(integral, type(values)) and integral.shape == (2,)
    np.testing.assert_allclose(np.asarray(integral), [I_PERIODIC, 2 * I_PERIODIC], rtol=0, atol=2 * TOL[name])

    pts = np.linspace(0.0, 1.0, 17)
    interp = disc.interpolate(values, pts, axis=1)
    assert isinstance(interp, type(values)) and interp.shape == (2, 17)
    # O(h^2) / O(h^3) reconstruction errors at n = 33 (measured 1.3e-2, 0, 8.8e-3, 1.5e-3)
    tol = {"midpoint": 2e-2, "trapezoid": 2e-2, "p1": 2e-2, "p2": 3e-3}.get(name, 1e-8)
    np.testing.assert_allclose(np.asarray(interp)[0], f_periodic(pts), rtol=0, atol=tol)
    np.testing.assert_allclose(np.asarray(interp), disc.interpolate(np.asarray(values), pts, axis=1), atol=1e-13)

    quad = disc.to_quadrature(values, axis=1)
    assert isinstance(quad, type(values)) and quad.shape == (2, disc.quadrature_nodes.size)
    back = disc.from_quadrature(quad, axis=1)
    assert float(xps.max(xps.abs(back - values))) < 1e-13
    integral_q = xps.sum(quad * xps.asarray(disc.quadrature_weights), axis=1)
    assert math.isclose(float(integral_q[0]), float(integral[0]), rel_tol=1e-13)


@pytest.mark.parametrize("name", ["fourier", "chebyshev", "legendre"])
def test_coefficients_on_strict_arrays(name):
    disc = d.get(name, 16)
    host = disc.sample(f_periodic)
    coef = disc.coefficients(xps.asarray(host[:, None] * np.array([1.0, -1.0])[None, :]), axis=0)
    assert isinstance(coef, type(xps.asarray(1.0))) and coef.shape == (16, 2)
    np.testing.assert_allclose(np.asarray(coef)[:, 0], disc.coefficients(host), rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.asarray(coef)[:, 1], -disc.coefficients(host), rtol=0, atol=1e-14)


def test_strict_errors():
    disc = d.P1(5)
    with pytest.raises(ValueError, match="NaN or inf"):
        disc.integrate(xps.asarray([1.0, 2.0, float("nan"), 0.0, 1.0]))
    with pytest.raises(ValueError, match="expected n = 5"):
        disc.to_quadrature(xps.ones((4,)))
