"""The sphere mean field at beta = 0 and float32 sums of the fused particle velocity.

* ZonalMeanField, SphericalMeanField and sphere_basis.linear_growth_rate refused beta = 0
  ("pass a small beta such as 1e-12"): beta = 0 is uniform attention, whose velocity is the
  tangent part of the mean token (closed form); the solvers now take it, with the kernel's
  multipliers in closed form, and agree with beta = 1e-8 to 1e-8.
* The fused float32 velocity (n <= 64, d <= 16) summed in float32: relative error 5e-7 to
  9e-7 against a float64 reference (n = 32, d = 2 and n = 64, d = 4), 2-4x the batched BLAS
  path's; now the sums are float64 and the error is 1e-7 to 2e-7.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize

from ctformer._numerics import particles as fused
from ctformer.particles import SelfAttentionDynamics, SphericalMeanField, ZonalMeanField
from ctformer.particles.sphere_basis import (funk_hecke, gradient_multipliers, kernel_multipliers,
                                             linear_growth_rate, sphere_area)
from ctformer.particles.sphere_stationary import stationary_state


@pytest.mark.parametrize("d", [2, 3, 5, 40])
def test_multipliers_at_beta_zero_are_the_closed_form_and_the_limit(d):
    """lambda_l(0) = |S^{d-1}| delta_{l0}; lambda_1 / beta -> |S^{d-1}| / d (I_nu(b) ~ (b/2)^nu / Gamma(nu+1))."""
    l = np.arange(6)
    area = sphere_area(d)
    np.testing.assert_array_equal(funk_hecke(l, 0.0, d), np.where(l == 0, area, 0.0))
    np.testing.assert_array_equal(kernel_multipliers(l, 0.0, d, True), np.eye(6)[0])
    np.testing.assert_array_equal(kernel_multipliers(l, 0.0, d, False), area * np.eye(6)[0])
    for normalized, scale in ((True, 1.0), (False, area)):
        exact = gradient_multipliers(l, 0.0, d, normalized)
        np.testing.assert_allclose(exact, np.where(l == 1, scale / d, 0.0), rtol=1e-15, atol=0)
        near = gradient_multipliers(l, 1e-8, d, normalized)
        np.testing.assert_allclose(near, exact, rtol=0, atol=1e-8 * scale)
        # beta != 0: m_l / beta as the quotient of kernel_multipliers (l = 0, constant, is 0)
        np.testing.assert_allclose(gradient_multipliers(l, -2.5, d, normalized)[1:],
                                   kernel_multipliers(l, -2.5, d, normalized)[1:] / -2.5, rtol=1e-13)
        assert gradient_multipliers(l, -2.5, d, normalized)[0] == 0.0


@pytest.mark.parametrize("d", [2, 3, 6])
@pytest.mark.parametrize("normalized", [True, False])
def test_growth_rate_at_beta_zero(d, normalized):
    """sigma_1 -> (d - 1)/d - nu (d - 1), sigma_l -> -nu l (l + d - 2) otherwise."""
    l = np.arange(5)
    rate = linear_growth_rate(l, 0.0, normalized, d, noise=0.1)
    expected = np.where(l == 1, (d - 1) / d, 0.0) - 0.1 * l * (l + d - 2)
    np.testing.assert_allclose(rate, expected, rtol=1e-15, atol=0)
    np.testing.assert_allclose(linear_growth_rate(l, 1e-8, normalized, d, noise=0.1), expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("d", [2, 3, 5])
@pytest.mark.parametrize("normalized", [True, False])
def test_zonal_velocity_at_beta_zero_is_the_mean_token(d, normalized):
    """ds/dt = <e, P_x m> / M = (1 - s^2) m_e / M (SA; USA without / M), m_e = int s rho dsigma."""
    field = ZonalMeanField(0.0, d, 12, normalized=normalized)
    rho = lambda s: np.exp(1.5 * s) + 0.3 * s ** 2  # noqa: E731
    s, q = field.grid, field.basis.weights
    values = field.basis.values @ field.coefficients_of(rho)
    mass, m_e = values @ q, (s * values) @ q
    closed = (1 - s ** 2) * m_e / (mass if normalized else 1.0)
    np.testing.assert_allclose(field.velocity(rho), closed, rtol=0, atol=1e-13 * np.abs(closed).max())
    near = ZonalMeanField(1e-8, d, 12, normalized=normalized).velocity(rho)
    np.testing.assert_allclose(near, closed, rtol=0, atol=1e-7 * np.abs(closed).max())


@pytest.mark.parametrize("normalized", [True, False])
def test_zonal_solve_at_beta_zero_is_the_small_beta_limit(normalized):
    """A solve at beta = 0 and at beta = 1e-8 (d = 3, mass one) differ by O(beta)."""
    rho = lambda s: np.exp(2.0 * s) / (2 * math.pi * (math.exp(2) - math.exp(-2)) / 2)  # noqa: E731
    zero = ZonalMeanField(0.0, 3, 16, normalized=normalized).solve(rho, 0.5, 0.01)
    near = ZonalMeanField(1e-8, 3, 16, normalized=normalized).solve(rho, 0.5, 0.01)
    assert np.max(np.abs(zero.mass - 1.0)) < 1e-13
    np.testing.assert_allclose(zero.density, near.density, rtol=0, atol=1e-7)
    assert zero.density[-1].max() > 1.2 * zero.density[0].max()  # it clusters: something moved


@pytest.mark.parametrize("d", [2, 3, 7])
def test_noise_alone_decays_each_degree_at_its_laplace_eigenvalue(d):
    """At beta = 0 an even density has m_e = 0 and no transport: pure heat flow, c_l(t) =
    c_l(0) exp(-nu l (l + d - 2) t) (the generator nu Delta_S; E[x(t).x(0)] = exp(-(d-1) nu t))."""
    nu, t1 = 0.3, 0.4
    field = ZonalMeanField(0.0, d, 10, noise=nu)
    c0 = field.coefficients_of(lambda s: 1.0 + 0.5 * s ** 2 + 0.2 * s ** 4)
    assert np.max(np.abs(c0[1::2])) < 1e-15
    final = field.solve(lambda s: 1.0 + 0.5 * s ** 2 + 0.2 * s ** 4, t1, 0.05).coefficients[-1]
    l = np.arange(11)
    np.testing.assert_allclose(final, c0 * np.exp(-nu * l * (l + d - 2) * t1), rtol=0, atol=1e-15)


@pytest.mark.parametrize("normalized", [True, False])
def test_spherical_velocity_at_beta_zero_is_the_mean_token(normalized):
    """X(x) = P_x^perp m / M (SA; USA: P_x^perp m), m = int y rho dsigma, on the S^2 grid."""
    field = SphericalMeanField(0.0, 8, normalized=normalized)
    rho = lambda p: np.exp(p @ np.array([0.3, -0.5, 0.8]))  # noqa: E731
    points, w = field.points(), field.weights
    values = rho(points)
    mass, m = float(np.sum(values * w)), np.tensordot(values * w, points, 2)
    m = m / mass if normalized else m
    tangent = m - (points @ m)[..., None] * points
    th, ph = np.meshgrid(field.colatitude, field.longitude, indexing="ij")
    e_theta = np.stack([np.cos(th) * np.cos(ph), np.cos(th) * np.sin(ph), -np.sin(th)], -1)
    e_phi = np.stack([-np.sin(ph), np.cos(ph), 0 * ph], -1)
    closed = np.stack([(tangent * e_theta).sum(-1), (tangent * e_phi).sum(-1)])
    np.testing.assert_allclose(field.velocity(rho), closed, rtol=0, atol=1e-5 * np.abs(closed).max())
    near = SphericalMeanField(1e-8, 8, normalized=normalized).velocity(rho)
    np.testing.assert_allclose(field.velocity(rho), near, rtol=0, atol=1e-7 * np.abs(closed).max())


def test_energy_at_beta_zero_is_refused_by_name():
    with pytest.raises(ValueError, match=r"energy needs beta != 0.*infinite at beta = 0"):
        ZonalMeanField(0.0, 3, 4).energy(np.ones(5))
    with pytest.raises(ValueError, match=r"energy needs beta != 0"):
        SphericalMeanField(0.0, 4).energy(np.ones(15))


@pytest.mark.parametrize("normalized", [True, False])
def test_stationary_state_at_beta_zero_is_the_langevin_fixed_point(normalized):
    """beta = 0, d = 3, mass one: rho ∝ exp(<m, x>/nu) with |m| = coth(|m|/nu) - nu/|m|
    (the Langevin function; clustered below nu_c = 1/3)."""
    nu = 0.2
    field = ZonalMeanField(0.0, 3, 24, normalized=normalized, noise=nu)
    guess = field.coefficients_of(lambda s: np.exp(3 * s))
    guess = guess / (guess[0] * math.sqrt(4 * math.pi))
    c = stationary_state(field, guess)
    m = optimize.brentq(lambda m: 1 / math.tanh(m / nu) - nu / m - m, 0.1, 1.0)
    assert field.order_parameter(c) == pytest.approx(m, rel=1e-12)


@pytest.mark.parametrize("n, d, batch", [(32, 2, 4096), (64, 4, 1024)])
@pytest.mark.parametrize("normalized", [True, False])
def test_fused_float32_velocity_sums_in_float64(n, d, batch, normalized):
    """Relative error of the float32 fused velocity against float64: 5e-7..9e-7 before, <= 2e-7 now."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, n, d))
    x = (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
    assert fused.fused_velocity(x, 4.0, -math.log(n), normalized) is not None  # the fused path runs
    velocity = SelfAttentionDynamics(4.0, normalized=normalized).velocity(x).astype(np.float64)
    x64 = x.astype(np.float64)
    e = np.exp(4.0 * x64 @ np.swapaxes(x64, -1, -2)) / n
    a = e @ x64
    if normalized:
        a = a / e.sum(-1, keepdims=True)
    reference = a - (a * x64).sum(-1, keepdims=True) * x64
    assert np.abs(velocity - reference).max() / np.abs(reference).max() < 3e-7
