"""Domains whose length is not representable are refused (issue 19, item 7).

A domain (a, b) is accepted when |a|, |b| are at most half the largest float64 and
b - a >= 64 ulp(max(|a|, |b|)); and n values on it only while neighbouring nodes (and the
Gauss points of finite elements) stay 4 ulp apart. Everything accepted gives finite weights
that integrate 1 to b - a and interpolants that reproduce constants and lines.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctformer.discretizations import Midpoint, Product, Trapezoid, WithAtoms, available, get
from ctformer.discretizations.base import MIN_DOMAIN_ULPS, check_domain

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
NAMES = available()[:9]
ULP1 = float(np.spacing(1.0))


def _n(name, n=4):
    return n + 1 if name == "p2" and n % 2 == 0 else n


@pytest.mark.parametrize("name", NAMES)
def test_overflowing_length_is_refused(name):
    # the user's reproducer: Midpoint(4, (-1e308, 1e308)) gave infinite weights
    with pytest.raises(ValueError, match=r"domain \(-1e\+308, 1e\+308\): endpoints must have "
                                         r"magnitude at most 8.988e\+307"):
        get(name, _n(name), domain=(-1e308, 1e308))
    with pytest.raises(ValueError, match="half the largest float64"):
        get(name, _n(name), domain=(1e308, 1.7e308))  # b - a finite, but a + b overflows


@pytest.mark.parametrize("name", NAMES)
def test_length_of_a_few_ulps_is_refused(name):
    # the user's reproducer: on (1, 1 + 4.4e-16) Trapezoid interpolated ones to [1, nan]
    with pytest.raises(ValueError, match=r"domain \(1, 1.0000000000000004\) is too short to be "
                                         r"represented: b - a = 4.44e-16 is 2 ulp of its "
                                         r"endpoints, at least 64 are needed"):
        get(name, _n(name), domain=(1, 1 + 4.4e-16))


def test_the_rule_is_exactly_64_ulp():
    a = 1.0
    assert check_domain((a, a + MIN_DOMAIN_ULPS * ULP1)) == (1.0, 1.0 + 64 * ULP1)
    with pytest.raises(ValueError, match="63 ulp"):
        check_domain((a, a + 63 * ULP1))
    # near 0 the ulp is tiny: a short domain there is representable and accepted
    disc = Midpoint(4, (0.0, 1e-300))
    np.testing.assert_allclose(disc.integrate(np.ones(4)), 1e-300, rtol=1e-15)


@pytest.mark.parametrize("name", NAMES)
def test_shortest_accepted_domain_is_exact_on_constants_and_lines(name):
    """On (1, 1 + 64 ulp) with 4 values: sum of weights = b - a, lines reproduced."""
    a, b = 1.0, 1.0 + 64 * ULP1
    disc = get(name, _n(name), domain=(a, b))
    assert np.all(np.isfinite(disc.weights))
    assert disc.integrate(disc.sample(lambda x: np.ones_like(x))) == pytest.approx(b - a, rel=1e-12)
    points = np.linspace(a, b, 5)
    np.testing.assert_allclose(disc.interpolate(disc.sample(lambda x: np.ones_like(x)), points), 1.0,
                               rtol=0, atol=1e-12)
    if name != "fourier":  # a line is not periodic
        line = lambda x: (x - a) / (b - a)  # noqa: E731
        np.testing.assert_allclose(disc.interpolate(disc.sample(line), points), line(points),
                                   rtol=0, atol=0.1)  # a line within the nodes' own rounding


@pytest.mark.parametrize("name", NAMES)
def test_too_many_values_on_a_short_domain_are_refused(name):
    """101 values on (1, 1 + 64 ulp) put nodes on the same float: whatever needs the nodes
    (sampling, interpolation, the finite elements' projection) is refused, naming n. Before the
    check, Gauss-Legendre interpolated the line (x - a)/(b - a) with an error of 4 (not 1e-16)."""
    message = (r"n = 101 values on the domain \(1.0, 1.0000000000000142\) are not 4 ulp apart in "
               r"float64; use a smaller n or a longer domain")
    disc = get(name, 101, domain=(1.0, 1.0 + 64 * ULP1))
    with pytest.raises(ValueError, match=message):
        disc.sample(np.cos)
    with pytest.raises(ValueError, match=message):
        get(name, 101, domain=(1.0, 1.0 + 64 * ULP1)).interpolate(np.ones(101), [1.0])
    if disc.kind == "galerkin":  # the projection onto the elements (identity for nodal rules)
        with pytest.raises(ValueError, match=message):
            get(name, 101, domain=(1.0, 1.0 + 64 * ULP1)).from_quadrature(
                np.ones(get(name, 101).quadrature_nodes.size))
    # the same n on (0, 1) is fine
    assert np.all(np.diff(get(name, 101).nodes) > 0)


def test_products_and_atoms_are_served_by_the_same_check():
    with pytest.raises(ValueError, match="too short to be represented"):
        Product(Midpoint(3), Trapezoid(3, (1.0, 1.0 + 4.4e-16)))
    # atoms share the base's (checked) domain; their location equals a node of Trapezoid
    atoms = WithAtoms(Trapezoid(3, (0.0, 1.0)))
    assert atoms.integrate(np.ones(4)) == pytest.approx(1.0)  # atoms share the length 1


@given(a=st.floats(-1e307, 1e307), scale=st.floats(-20, 20), name=st.sampled_from(NAMES))
@SETTINGS
def test_any_domain_is_refused_naming_it_or_integrates_exactly(a, scale, name):
    """Property: every (a, b) is either refused with a message naming the domain, or its weights
    sum to b - a (exact integration of 1, the defining property of every rule), its nodes are
    distinct and constants are reconstructed exactly."""
    b = a + abs(a) * 10.0**scale + 10.0**scale * 1e-300
    if not b > a:
        return
    try:
        disc = get(name, _n(name), domain=(a, b))
        weights = disc.weights
    except ValueError as exc:
        assert "domain" in str(exc)
        scale_ab = max(abs(a), abs(b))
        assert (not math.isfinite(b - a) or scale_ab > np.finfo(float).max / 2
                or b - a < 64 * np.spacing(scale_ab) or "4 ulp apart" in str(exc))
        return
    assert np.all(np.isfinite(weights))
    assert float(np.sum(weights)) == pytest.approx(b - a, rel=1e-10)
    # the nodes are distinct and the reconstruction of a constant is that constant
    assert np.all(np.diff(disc.nodes) > 0)
    np.testing.assert_allclose(disc.interpolate(np.ones(disc.n), [a, 0.5 * a + 0.5 * b, b]), 1.0,
                               rtol=0, atol=1e-12)
