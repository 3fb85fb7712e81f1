"""Mean-field equation on the circle: Bessel growth rates, quadrature of the velocity, mass,
and the particle discretization (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import integrate, optimize, special

from ctformer.particles import CircleMeanField, ResolutionWarning, SelfAttentionDynamics, linear_growth_rate


@pytest.mark.parametrize("beta", [1.0, 5.0, 9.0])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_sa_linear_growth_rate(beta, k):
    """eps cos(k theta) on the uniform density grows at k^2 I_k(beta) / (beta I_0(beta))."""
    eps, t1 = 1e-7, 0.2
    sol = CircleMeanField(beta, 48).solve(lambda th: (1 + eps * np.cos(k * th)) / (2 * np.pi), t1, 0.01)
    measured = math.log(sol.coefficients[-1, k].real / sol.coefficients[0, k].real) / t1
    expected = k**2 * special.iv(k, beta) / (beta * special.iv(0, beta))
    assert measured == pytest.approx(expected, rel=1e-6)  # the issue asks for 1%
    assert linear_growth_rate(k, beta) == pytest.approx(expected, rel=1e-13)


@pytest.mark.parametrize("beta", [0.5, 4.0])
def test_usa_linear_growth_rate(beta):
    """Without the denominator (mass one): rate k^2 I_k(beta) / beta."""
    eps, t1, k = 1e-7, 0.1, 2
    sol = CircleMeanField(beta, 48, normalized=False).solve(
        lambda th: (1 + eps * np.cos(k * th)) / (2 * np.pi), t1, 0.005)
    measured = math.log(sol.coefficients[-1, k].real / sol.coefficients[0, k].real) / t1
    assert measured == pytest.approx(k**2 * special.iv(k, beta) / beta, rel=1e-6)


def test_fastest_mode_sets_metastable_cluster_count():
    """The fastest linear mode is about sqrt(2 beta): 3 for beta = 5 (Geshkovski et al.)."""
    k = np.arange(1, 20)
    rates = k**2 * special.iv(k, 5.0) / (5.0 * special.iv(0, 5.0))
    assert int(k[np.argmax(rates)]) == 3
    assert int(k[np.argmax(linear_growth_rate(k, 5.0))]) == 3


def rho_smooth(th):
    return (1 + 0.6 * np.cos(th - 0.4) + 0.2 * np.sin(3 * th)) / (2 * np.pi)


@pytest.mark.parametrize("normalized,beta", [(True, 2.0), (True, 60.0), (True, 1e3), (False, 3.0)])
def test_velocity_matches_quadrature(normalized, beta):
    mf = CircleMeanField(beta, 3 * 160 + 1, normalized=normalized)
    theta = mf.grid[::37]
    # e^{-beta} scaling keeps the integrands finite at beta = 1e3
    num = [integrate.quad(lambda p: np.exp(beta * (np.cos(p - t) - 1)) * np.sin(p - t) * rho_smooth(p),
                          t - np.pi, t + np.pi, points=[t], epsabs=1e-13, epsrel=1e-12, limit=400)[0]
           for t in theta]
    den = [integrate.quad(lambda p: np.exp(beta * (np.cos(p - t) - 1)) * rho_smooth(p),
                          t - np.pi, t + np.pi, points=[t], epsabs=1e-13, epsrel=1e-12, limit=400)[0]
           for t in theta]
    expected = np.array(num) / np.array(den) if normalized else np.exp(beta) * np.array(num)
    got = mf.velocity(rho_smooth(mf.grid))[::37]
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_mass_conserved_to_rounding():
    # 256 modes resolve the clusters up to t = 3.2 (96 modes lose positivity at t = 2.8 and
    # warn, see tests/test_particles_core.py): an error if the density goes negative here
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResolutionWarning)
        sol = CircleMeanField(5.0, 256).solve(rho_smooth, 3.2, 0.02, save_every=20)
    mass = sol.mass
    assert mass[0] == pytest.approx(1.0, rel=1e-13)
    np.testing.assert_allclose(mass, mass[0], rtol=1e-14)
    assert np.all(sol.coefficients[:, 0] == sol.coefficients[0, 0])  # exactly, in coefficients
    assert sol.density.shape == (len(sol.times), 256) and sol.times[-1] == 3.2
    np.testing.assert_allclose(sol.grid, 2 * np.pi * np.arange(256) / 256)
    # the density has sharpened into clusters: not a vacuous run
    assert sol.density[-1].max() > 2.5 * sol.density[0].max()
    assert sol.density.min() > 0


def quantiles(n, a=0.3):
    """Angles at the midpoint quantiles of rho0 = (1 + a cos theta) / (2 pi)."""
    u = (np.arange(n) + 0.5) / n
    cdf = lambda th, ui: (th + a * np.sin(th)) / (2 * np.pi) - ui  # noqa: E731
    return np.array([optimize.brentq(cdf, 0.0, 2 * np.pi, args=(ui,), xtol=1e-15) for ui in u])


def test_particles_converge_to_mean_field():
    """Particles at the quantiles of rho0 follow the mean-field characteristics; the error
    is a midpoint rule of a smooth periodic integrand in the quantile variable, so it decays
    geometrically in n: like exp(-2 pi s n) with s = Im F(theta*) = 0.146 the half-width of
    the strip where F^{-1} is analytic (F' = 2 pi rho0 vanishes at theta* = pi + 1.874 i),
    i.e. a rate of 0.92 per particle at t = 0."""
    beta, t1, dt = 1.0, 1.0, 0.02
    mf = CircleMeanField(beta, 97)
    ns = [6, 8, 10, 12, 14, 16]
    errors = []
    for n in ns:
        theta0 = quantiles(n)
        field = mf.solve(lambda th: (1 + 0.3 * np.cos(th)) / (2 * np.pi), t1, dt, tracers=theta0)
        x0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=1)
        xt = SelfAttentionDynamics(beta).solve(x0, t1, dt).final
        gap = np.angle(np.exp(1j * (np.arctan2(xt[:, 1], xt[:, 0]) - field.tracers[-1])))
        errors.append(np.abs(gap).max())
    errors = np.array(errors)
    assert np.all(np.diff(errors) < 0)
    rate = -np.polyfit(ns, np.log(errors), 1)[0]  # errors ~ C exp(-rate n)
    y = math.acosh(1 / 0.3)
    predicted = y - 0.3 * math.sinh(y)  # 2 pi Im F(pi + i y)
    assert 0.75 < rate < predicted + 0.03, (errors, rate, predicted)
    assert errors[-1] < 1e-5


def test_errors():
    with pytest.raises(ValueError, match="n_modes must be >= 4"):
        CircleMeanField(1.0, 3)
    with pytest.raises(TypeError, match="n_modes"):
        CircleMeanField(1.0, 8.5)
    with pytest.raises(ValueError, match="beta must be finite"):
        CircleMeanField(float("inf"), 16)
    with pytest.raises(ValueError, match="beta must be finite"):
        CircleMeanField(float("nan"), 16)
    with pytest.raises(ValueError, match="USA"):
        CircleMeanField(800.0, 16, normalized=False)
    mf = CircleMeanField(1.0, 16)
    with pytest.raises(ValueError, match="16 values"):
        mf.solve(np.ones(15), 1.0, 0.1)
    with pytest.raises(ValueError, match="nonnegative"):
        mf.solve(lambda th: np.cos(th), 1.0, 0.1)
    with pytest.raises(ValueError, match="dt"):
        mf.solve(rho_smooth, 1.0, -0.1)


@pytest.mark.cupy
def test_cupy_matches_numpy():
    import cupy

    tracers = np.linspace(0, 6, 5)
    host = CircleMeanField(4.0, 64).solve(rho_smooth, 1.0, 0.02, tracers=tracers)
    device = CircleMeanField(4.0, 64, backend="cupy").solve(rho_smooth, 1.0, 0.02, tracers=tracers)
    assert isinstance(device.density, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(device.density), host.density, atol=1e-12)
    np.testing.assert_allclose(cupy.asnumpy(device.tracers), host.tracers, atol=1e-12)
