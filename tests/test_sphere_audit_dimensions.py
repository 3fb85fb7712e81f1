"""The sphere mean field in high dimension, against 40-digit Bessel functions (mpmath).

* linear_growth_rate formed lambda_l from (2 pi)^{d/2} beta^{1-d/2} and ive(l + d/2 - 1, beta)
  separately: at d = 768, beta = 1 the second underflows and the rates came back NaN; at d = 64,
  beta = 1e-10 the first overflowed (OverflowError).
* ZonalMeanField at d = 300, beta = 0.5 turned NaN in its first step (lambda_0 = 0), and from
  d = 344 on raised a bare "math range error" from math.gamma.
* stationary_state took a guess of the wrong length to a NumPy broadcast error.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from ctformer import solvers
from ctformer.particles.sphere_basis import linear_growth_rate, log_ive, sphere_area
from ctformer.particles.sphere_stationary import stationary_state
from ctformer.particles.zonal import ZonalMeanField

from .conftest import require

mpmath = require("mpmath")
mpmath.mp.dps = 40


def reference_rate(l, beta, d, normalized):
    """l (l + d - 2) lambda_l / (beta lambda_0) (SA) or / (beta |S^{d-1}|) (USA), in 40 digits."""
    half = mpmath.mpf(d) / 2
    lam = (2 * mpmath.pi) ** half * mpmath.mpf(beta) ** (1 - half) * mpmath.besseli(l + half - 1, beta)
    if normalized:
        norm = (2 * mpmath.pi) ** half * mpmath.mpf(beta) ** (1 - half) * mpmath.besseli(half - 1, beta)
    else:
        norm = 2 * mpmath.pi ** half / mpmath.gamma(half)
    return float(l * (l + d - 2) * lam / (beta * norm))


def test_log_ive_matches_mpmath_where_ive_underflows():
    """log(I_nu(x) e^{-x}) to 1e-13 (relative to max(1, |value|)), also where scipy's ive is 0."""
    worst = 0.0
    for nu in (0.0, 0.5, 20.5, 149.0, 383.0, 990.0, 2047.0):
        for x in (1e-8, 0.5, 5.0, 100.0, 700.0, 2000.0):
            reference = float(mpmath.log(mpmath.besseli(nu, x)) - x)
            worst = max(worst, abs(float(log_ive(nu, x)) - reference) / max(1.0, abs(reference)))
    assert worst < 1e-13


@pytest.mark.parametrize("d", [64, 300, 768, 4096])
@pytest.mark.parametrize("normalized", [True, False])
def test_growth_rates_in_transformer_dimensions(d, normalized):
    """Before: NaN at d = 768, beta = 1 (OverflowError at d = 64, beta = 1e-10); now the
    40-digit value to 5e-12, 2e-11 at d = 4096 (a ratio of Bessel functions taken as a difference
    of logarithms carries eps |log I_nu|, and log I_2047(1e-10) = -6.2e4)."""
    l = np.arange(6)
    for beta in (1e-10, 1.0, 25.0):
        got = linear_growth_rate(l, beta, normalized, d)
        reference = np.array([reference_rate(k, beta, d, normalized) for k in l])
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, reference, rtol=2e-11 if d > 1000 else 5e-12, atol=0)


def test_zonal_solver_at_dimension_300_and_small_beta():
    """Before: FloatingPointError (NaN) in the first step; now the measured rate of l = 1, 2 is the
    40-digit formula to 1e-10 and the mass is kept."""
    d, beta = 300, 0.5
    field = ZonalMeanField(beta, d, 6)
    area = sphere_area(d)
    for l in (1, 2):
        eps = 1e-30 / math.sqrt(area)
        c = np.zeros(7)
        c[0], c[l] = 1 / math.sqrt(area), eps
        t = 0.05 / field.growth_rate(l)
        u, problem = c, field.problem()
        for _ in range(10):
            u = solvers.get("rk4").step(problem, u, t / 10)
        assert math.log(u[l] / eps) / t == pytest.approx(reference_rate(l, beta, d, True), rel=1e-10)
    rho = np.exp(3 * field.grid)
    solution = field.solve(rho / (rho @ field.basis.weights), 0.5, 0.05)
    assert np.all(np.isfinite(solution.coefficients))
    assert np.max(np.abs(solution.mass - 1)) < 1e-12


def test_zonal_solver_names_its_largest_dimension():
    """d = 374 works (the l = 1 rate as the 40-digit formula); d = 400 is refused naming the
    dimension and the largest one (before: OverflowError 'math range error' from d = 344)."""
    field = ZonalMeanField(1.0, 374, 4, normalized=False)
    assert field.growth_rate(1) == pytest.approx(reference_rate(1, 1.0, 374, False), rel=1e-11)
    with pytest.raises(ValueError, match=r"dimension=400 is beyond .* use dimension <= 374"):
        ZonalMeanField(1.0, 400, 8)


def test_stationary_state_checks_the_guess():
    field = ZonalMeanField(1.0, 3, 8, normalized=False, noise=0.3)
    with pytest.raises(ValueError, match=r"guess must be the 9 finite Gegenbauer coefficients .* got shape \(3,\)"):
        stationary_state(field, np.zeros(3))
    with pytest.raises(ValueError, match="NaN or infinite"):
        stationary_state(field, np.full(9, np.nan))
    # above nu_c the uniform state is the fixed point: c_0 = |S^2|^{-1/2}, the rest 0
    uniform = stationary_state(field, np.zeros(9))
    np.testing.assert_allclose(uniform, np.eye(9)[0] / math.sqrt(4 * math.pi), rtol=0, atol=1e-15)


def test_beta_zero_is_its_continuous_limit():
    """beta = 0 was refused as "nothing moves", then with a pointer to a tiny beta; it is now
    taken in closed form: on the circle mode 1 grows at 1/2, the limit of a tiny beta."""
    from ctformer.particles.zonal import ZonalMeanField, linear_growth_rate

    assert ZonalMeanField(0.0, 3, 8).growth_rate(1) == pytest.approx(2 / 3, rel=1e-15)
    assert linear_growth_rate(1, 0.0, dimension=2) == pytest.approx(0.5, rel=1e-15)
    assert linear_growth_rate(1, 1e-12, dimension=2) == pytest.approx(0.5, rel=1e-12)
