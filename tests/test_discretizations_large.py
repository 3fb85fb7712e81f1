"""Large discretizations (issue 9, item 11): Gauss-Legendre and Clenshaw-Curtis rules in O(n)
memory and near O(n) time, and sizes beyond the memory budget refused before allocating."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import scipy.special

from ctformer.discretizations import (ClenshawCurtis, GaussLegendre, Legendre, Midpoint, P1,
                                      SizeTooLargeError, get, memory_budget)
from ctformer.discretizations.gauss import RECURRENCE_N, SMALL_N, _bessel, _newton, _recurrence, gauss_legendre
from ctformer.discretizations.quadrature import clenshaw_curtis_weights
from ctformer.kernels import SmoothRandom

from .conftest import require


def _mp_node(n, theta0):
    """Gauss node and weight near angle theta0 by Newton's method in 40-digit arithmetic."""
    mpmath = require("mpmath")  # installed with sympy (a torch dependency)
    with mpmath.workdps(40):
        th = mpmath.mpf(theta0)
        for _ in range(6):
            x = mpmath.cos(th)
            p, q = mpmath.legendre(n, x), mpmath.legendre(n - 1, x)
            dp = n * (x * p - q) / mpmath.sin(th)  # dP_n(cos th)/dth
            th -= p / dp
        return float(mpmath.cos(th)), float(2 / dp**2)


@pytest.mark.parametrize("n, tol", [(SMALL_N + 1, 1e-14), (150, 1e-14), (1000, 1e-14), (2000, 2e-14)])
def test_gauss_legendre_matches_40_digit_reference(n, tol):
    t, w = gauss_legendre(n)
    # both ends (where the recurrence runs), the transition, the interior and the middle
    for i in (n - 1, n - 2, n - 4, n - 7, n - 10, n - 30, (3 * n) // 4, n // 2, n // 8, 0):
        x, weight = _mp_node(n, math.acos(t[i]))
        assert abs(t[i] - x) <= 2.5e-16, (i, t[i] - x)
        assert abs(w[i] - weight) <= tol * weight, (i, w[i] / weight - 1)


@pytest.mark.parametrize("n", [SMALL_N + 1, 257, 2000])
def test_gauss_legendre_agrees_with_the_small_n_rule_and_is_exact(n):
    t, w = gauss_legendre(n)
    tl, wl = np.polynomial.legendre.leggauss(n)
    np.testing.assert_allclose(t, tl, rtol=0, atol=1e-15)
    # leggauss's own weights are off by up to 6e-13 in the interior and 1e-8 near the ends
    # (measured against the 40-digit reference of the test above), so they are a reference
    # only to that accuracy
    inner = slice(n // 8, n - n // 8)
    np.testing.assert_allclose(w[inner], wl[inner], rtol=1e-12, atol=0)
    np.testing.assert_allclose(w, wl, rtol=5e-8, atol=0)
    # exact for Legendre polynomials of degree < 2n, not for degree 2n
    moments = w @ np.polynomial.legendre.legvander(t, 2 * n)
    np.testing.assert_allclose(moments[:2 * n], np.r_[2.0, np.zeros(2 * n - 1)], rtol=0, atol=1e-14)
    assert abs(moments[2 * n]) > 1e-3
    assert np.all(np.diff(t) > 0) and np.array_equal(t, -t[::-1]) and np.array_equal(w, w[::-1])


def test_boundary_expansions_agree_where_both_apply():
    # above RECURRENCE_N the boundary nodes use the Bessel expansion instead of the recurrence
    n = RECURRENCE_N + 1001
    rho = n + 0.5
    found = {}
    for name, evaluate in (("recurrence", _recurrence), ("bessel", _bessel)):
        theta = scipy.special.jn_zeros(0, 8) / math.sqrt(rho**2 + 1 / 12)
        dp = np.empty(8)
        _newton(lambda th: evaluate(th, n), theta, dp, np.arange(8))
        found[name] = theta, 2 / dp**2
    np.testing.assert_allclose(found["bessel"][0], found["recurrence"][0], rtol=4e-15, atol=0)
    np.testing.assert_allclose(found["bessel"][1], found["recurrence"][1], rtol=2e-14, atol=0)


def test_gauss_legendre_2000_takes_milliseconds():
    start = time.perf_counter()
    rule = GaussLegendre(2000)
    rule.weights
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, elapsed  # measured about 0.04 s (NumPy's leggauss: 2.6 s)
    np.testing.assert_allclose(rule.integrate(np.exp(rule.nodes)), math.e - 1, rtol=1e-14)


@pytest.mark.parametrize("n", [10**6, 10**6 + 1])
def test_gauss_legendre_million_points(n):
    start = time.perf_counter()
    rule = get("gauss-legendre", n, domain=(-1.0, 1.0))
    t, w = rule.nodes, rule.weights
    elapsed = time.perf_counter() - start
    assert elapsed < 20.0, elapsed  # measured about 0.6 s
    assert np.all(np.diff(t) > 0) and np.array_equal(t, -t[::-1])
    np.testing.assert_allclose(w.sum(), 2.0, rtol=2e-15)
    np.testing.assert_allclose(w @ t**10, 2 / 11, rtol=1e-14)
    np.testing.assert_allclose(w @ np.cos(3 * t), 2 * math.sin(3) / 3, rtol=1e-14)
    # the weights approach pi sqrt(1 - t^2) / rho (the arcsine density) in the interior
    mid = n // 2 + 1000
    assert abs(w[mid] * (n + 0.5) / (math.pi * math.sqrt(1 - t[mid]**2)) - 1) < 1e-9


def test_clenshaw_curtis_million_points():
    start = time.perf_counter()
    rule = ClenshawCurtis(10**6 + 1)
    t, w = rule.nodes, rule.weights
    elapsed = time.perf_counter() - start
    assert elapsed < 20.0, elapsed  # measured about 0.4 s (one DCT of length n)
    np.testing.assert_allclose(rule.integrate(np.cos(t)), math.sin(1.0), rtol=1e-14)
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-14)


@pytest.mark.parametrize("n", [9, 65, 513])
def test_clenshaw_curtis_weights_match_the_closed_form(n):
    # w_k = (c_k / N) (1 - sum_{j=1}^{N/2} b_j cos(2 j theta_k) / (4 j^2 - 1)), N even
    # (Waldvogel 2006), with b_j = 1 for j = N/2 and 2 otherwise, c_k = 1 at the ends, else 2
    N = n - 1
    assert N % 2 == 0   # the closed form below is written for even N
    theta = np.pi * np.arange(n) / N
    j = np.arange(1, N // 2 + 1)
    b = np.where(j == N // 2, 1.0, 2.0)
    w = 1 - (b / (4 * j**2 - 1)) @ np.cos(2 * np.outer(j, theta))
    w *= np.where((np.arange(n) == 0) | (np.arange(n) == N), 1.0, 2.0) / N
    np.testing.assert_allclose(clenshaw_curtis_weights(n), w[::-1], rtol=1e-14, atol=1e-16)


def test_huge_sizes_are_refused_before_allocating(monkeypatch):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e9")
    assert memory_budget() == 10**9
    start = time.perf_counter()
    with pytest.raises(SizeTooLargeError) as info:
        Midpoint(10**9 + 1)
    assert time.perf_counter() - start < 0.5
    message = str(info.value)
    assert "\n" not in message
    assert message == ("Midpoint(n=1000000001) would need 14.9 GiB, more than the memory budget "
                       "of 954 MiB (half the available memory, or CTFORMER_MEMORY_BUDGET); "
                       "choose a smaller n (argument n)")
    assert isinstance(info.value, ValueError) and isinstance(info.value, MemoryError)
    with pytest.raises(SizeTooLargeError, match=r"P1\(n=10000001\) would need 2.98 GiB"):
        P1(10**7 + 1)
    with pytest.raises(SizeTooLargeError, match=r"GaussLegendre\(n=100000000\)"):
        get("gauss-legendre", 10**8)


def test_default_budget_refuses_terabytes():
    with pytest.raises(SizeTooLargeError, match=r"GaussLegendre\(n=100000000000000\) would need 1.46e\+03 TiB"):
        GaussLegendre(10**14)


def test_dense_matrices_are_refused_beyond_the_budget(monkeypatch):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e8")
    with pytest.raises(SizeTooLargeError, match=r"the Legendre coefficient matrix of Legendre\(3000\) "
                       r"\(3000 x 3000, dense, with its refinement step\) would need 275 MiB"):
        Legendre(3000).coefficient_matrix
    with pytest.raises(SizeTooLargeError, match=r"barycentric interpolation matrix \(5000 x 4000, dense\)"):
        GaussLegendre(4000).interpolation_matrix(np.linspace(0, 1, 5000))
    with pytest.raises(SizeTooLargeError, match=r"the matrix of SmoothRandom.* \(5000 x 4000, dense\)"):
        SmoothRandom(0).matrix(Midpoint(5000), Midpoint(4000))
    with pytest.raises(ValueError, match="CTFORMER_MEMORY_BUDGET must be a positive number of bytes"):
        monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "lots")
        Midpoint(3)
