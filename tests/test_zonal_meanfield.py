"""Zonal mean field on S^{d-1}: Funk-Hecke growth rates, mode selection, noise thresholds, the circle
for d = 2, mass, energy, diagnostics and refusals."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import optimize, special

from ctformer import solvers
from ctformer.particles import CircleMeanField, ResolutionWarning
from ctformer.particles.sphere_basis import GegenbauerBasis
from ctformer.particles.zonal import ZonalMeanField, linear_growth_rate


def area(d):
    return 2 * math.pi ** (d / 2) / special.gamma(d / 2)


def expected_rate(l, beta, d, normalized, nu):
    """sigma_l from the Bessel functions I_nu (scipy.special.iv, unscaled): the independent reference."""
    lam = (2 * math.pi) ** (d / 2) * beta ** (1 - d / 2) * special.iv(l + d / 2 - 1, beta)
    lam0 = (2 * math.pi) ** (d / 2) * beta ** (1 - d / 2) * special.iv(d / 2 - 1, beta)
    ratio = lam / lam0 if normalized else lam / area(d)
    return l * (l + d - 2) * (ratio / beta - nu)


def measured_rate(mf, l, eps=1e-30, steps=10):
    """Slope of log c_l over a short time T from uniform + eps phi_l; returns (rate, scale, T).

    T = min(0.05 / scale, 30 / sigma_max): the mode changes by 5% at most, and modes seeded by
    rounding or by the eps^2 nonlinearity grow by at most e^30 (eps = 1e-30 keeps both far below
    1e-16 of c_l). Ten RK4 steps of the solver's own split problem (the state is (c, tau) with
    noise): tiny rates need T beyond the worst-case stable-step guard of solve, although about the
    uniform state the transport is O(eps).
    """
    c = np.zeros(mf.degree + 1)
    c[0], c[l] = 1 / math.sqrt(area(mf.dimension)), eps
    damping = mf.noise * l * (l + mf.dimension - 2)
    scale = abs(mf.growth_rate(l) + damping) + damping
    fastest = max(float(np.max(mf.growth_rate(np.arange(1, mf.degree + 1)))), 1e-300)
    t = min(0.05 / scale, 30 / fastest)
    u = np.concatenate([c, [0.0]]) if mf.noise else c
    problem, rk4 = mf.problem(), solvers.get("rk4")
    for _ in range(steps):
        u = rk4.step(problem, u, t / steps)
    return math.log(u[l] / eps) / t, scale, t


@pytest.mark.parametrize("d", [2, 3, 4, 8, 16])
def test_growth_rates_match_funk_hecke(d):
    """Measured sigma_l (l = 1..10, beta = 1, 5, 20, SA/USA, nu = 0 and 0.05) within 1e-8 of the formula.

    The relative error is taken against |sigma_l| (with noise: against the larger of |sigma_l| and
    the two terms it is the difference of). Where the mode changes by less than 1e-6 in T
    (sigma_l / sigma_max < 3e-8: beta = 1, d >= 8, l >= 9) the float64 log-slope has fewer than 8
    digits (a floor of ~1e-15 / (sigma_l T)); there the assertion is that floor, on
    |measured - sigma_l| T.
    """
    worst, floor_cases = 0.0, 0
    for beta in (1.0, 5.0, 20.0):
        for normalized in (True, False):
            for nu in (0.0, 0.05):
                mf = ZonalMeanField(beta, d, 10, normalized=normalized, noise=nu)
                formula = linear_growth_rate(np.arange(1, 11), beta, normalized, d, nu)
                for l in range(1, 11):
                    reference = expected_rate(l, beta, d, normalized, nu)
                    assert formula[l - 1] == pytest.approx(reference, rel=1e-12, abs=1e-300)
                    measured, scale, t = measured_rate(mf, l)
                    if scale * t < 1e-6:
                        floor_cases += 1
                        assert abs(measured - reference) * t < 2e-14
                        continue
                    worst = max(worst, abs(measured - reference) / max(abs(reference), scale if nu else 0))
    assert worst <= 1e-8
    assert floor_cases <= 8


def test_solve_measures_the_same_rate():
    """solve itself (stable steps) gives the rate too: d = 3, beta = 5, l = 3, SA with noise."""
    mf = ZonalMeanField(5.0, 3, 12, noise=0.02)
    eps, l = 1e-9, 3
    c = np.zeros(13)
    c[0], c[l] = 1 / math.sqrt(4 * math.pi), eps
    sol = mf.solve(c @ mf.basis.values.T, 0.5, 0.01)
    measured = math.log(sol.coefficients[-1, l] / sol.coefficients[0, l]) / 0.5  # from the projected start
    assert measured == pytest.approx(expected_rate(l, 5.0, 3, True, 0.02), rel=1e-8)


def test_circle_is_dimension_two_on_even_densities():
    """d = 2: ZonalMeanField equals CircleMeanField on an even density to 1e-12 at t = 1."""
    beta, L = 3.0, 28
    f = lambda s: np.exp(1.5 * s + 0.5 * s**2)  # noqa: E731
    z = 2 * math.pi * np.mean(f(np.cos(2 * np.pi * np.arange(4096) / 4096)))
    zonal = ZonalMeanField(beta, 2, L).solve(lambda s: f(s) / z, 1.0, 0.02)
    circle = CircleMeanField(beta, 3 * L + 1).solve(lambda th: f(np.cos(th)) / z, 1.0, 0.02)
    values = zonal_basis(2, L).evaluate(zonal.coefficients[-1], np.cos(circle.grid))
    assert np.max(np.abs(values - circle.density[-1])) <= 1e-12


def zonal_basis(d, L):
    return GegenbauerBasis.build(d, L, (3 * L + 2) // 2)


def test_basis_is_orthonormal_gegenbauer():
    """phi_l is proportional to scipy's Gegenbauer C_l^a and orthonormal for d sigma."""
    for d in (3, 5, 16):
        b = GegenbauerBasis.build(d, 30, 60)
        assert np.max(np.abs(b.values.T @ (b.weights[:, None] * b.values) - np.eye(31))) < 1e-12
        ratio = b.values[:, 7] / special.eval_gegenbauer(7, (d - 2) / 2, b.nodes)
        assert np.ptp(ratio) < 1e-12 * abs(ratio[0])


@pytest.mark.parametrize("d,beta,l_star", [(2, 5.0, 3), (3, 5.0, 3), (3, 20.0, 6), (8, 25.0, 5)])
def test_mode_selection(d, beta, l_star):
    """The fastest degree, from the formula and from a solve of uniform + 1e-6 in every degree 1..12."""
    l = np.arange(1, 30)
    assert int(l[np.argmax(expected_rate(l, beta, d, True, 0.0))]) == l_star
    assert int(l[np.argmax(linear_growth_rate(l, beta, True, d))]) == l_star
    mf = ZonalMeanField(beta, d, 16)
    c = np.zeros(17)
    c[0], c[1:13] = 1 / math.sqrt(area(d)), 1e-6
    t1 = math.log(100) / mf.growth_rate(l_star)
    sol = mf.solve(c @ mf.basis.values.T, t1, mf.stable_step(t1) / 2, save_every=1000)
    grown = np.max(np.abs(sol.coefficients[-1, 1:])) / 1e-6
    assert 90 < grown < 110
    assert mf.dominant_mode(sol.coefficients[-1]) == l_star


@pytest.mark.parametrize("d", [2, 3, 8])
@pytest.mark.parametrize("normalized", [True, False])
def test_noise_threshold(d, normalized):
    """nu_c from the sign change of the measured l = 1 rate: I_{d/2}/(beta I_{d/2-1}) (SA), lambda_1/(beta|S|) (USA)."""
    beta = 5.0

    def rate(nu):
        return measured_rate(ZonalMeanField(beta, d, 2, normalized=normalized, noise=nu), 1)[0]

    if normalized:
        nu_c = special.iv(d / 2, beta) / (beta * special.iv(d / 2 - 1, beta))
    else:
        nu_c = (2 * math.pi) ** (d / 2) * beta ** (1 - d / 2) * special.iv(d / 2, beta) / (beta * area(d))
    found = optimize.brentq(rate, 0.5 * nu_c, 2 * nu_c, xtol=1e-12, rtol=1e-12)
    assert found == pytest.approx(nu_c, rel=1e-6)


def test_mass_energy_and_order_parameter():
    """Mass to 1e-13 in a clustering USA solve; energy non-decreasing; E and |int x dmu| by independent quadrature."""
    d, beta = 3, 4.0
    mf = ZonalMeanField(beta, d, 24, normalized=False)
    rho0 = lambda s: np.exp(0.8 * s - 0.6 * s**2)  # noqa: E731
    z = rho0(mf.grid) @ mf.basis.weights
    sol = mf.solve(lambda s: rho0(s) / z, 0.25, mf.stable_step(0.25) / 2, save_every=5)
    assert np.max(np.abs(sol.mass - 1)) < 1e-13
    energy = mf.energy(sol.coefficients)
    assert np.all(np.diff(energy) > 0) and energy[-1] > 1.2 * energy[0]
    # independent: <x, y> = s t + sqrt(1-s^2) sqrt(1-t^2) cos(phi), Gauss-Legendre in s, t and phi
    rho = sol.density[-1]
    s, q = mf.grid, mf.basis.weights / (2 * np.pi)
    phi, w_phi = np.polynomial.legendre.leggauss(64)
    phi, w_phi = np.pi * (phi + 1), np.pi * w_phi
    inner = s[:, None, None] * s[None, :, None] + np.sqrt(np.outer(1 - s**2, 1 - s**2))[..., None] * np.cos(phi)
    kernel = np.exp(beta * inner) @ w_phi * 2 * np.pi  # integrate both azimuths (one by symmetry)
    reference = (rho * q) @ kernel @ (rho * q) / (2 * beta)
    assert energy[-1] == pytest.approx(reference, rel=1e-10)
    assert mf.order_parameter(sol.coefficients[-1]) == pytest.approx(abs((s * rho) @ mf.basis.weights), rel=1e-12)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="dimension"):
        ZonalMeanField(1.0, 1, 8)
    with pytest.raises(TypeError, match="dimension"):
        ZonalMeanField(1.0, 3.0, 8)
    with pytest.raises(ValueError, match="degree"):
        ZonalMeanField(1.0, 3, 0)
    for beta in (math.inf, math.nan):  # 0.0 is uniform attention (test_particles_audit2_beta_zero.py)
        with pytest.raises(ValueError, match="beta"):
            ZonalMeanField(beta, 3, 8)
    with pytest.raises(ValueError, match="noise"):
        ZonalMeanField(1.0, 3, 8, noise=-0.1)
    with pytest.raises(ValueError, match="beta"):
        ZonalMeanField(800.0, 3, 8, normalized=False)
    mf = ZonalMeanField(1.0, 3, 8)
    with pytest.raises(ValueError, match="NaN"):
        mf.solve(lambda s: np.where(s > 0, np.nan, 1.0), 1.0, 0.1)
    with pytest.raises(ValueError, match="nonnegative"):
        mf.solve(lambda s: s, 1.0, 0.1)
    with pytest.raises(ValueError, match="values"):
        mf.solve(np.ones(5), 1.0, 0.1)
    with pytest.raises(ValueError, match="stable step"):
        mf.solve(lambda s: 1 + 0 * s, 10.0, 1.0)
    with pytest.raises(ValueError, match="dimension"):
        linear_growth_rate(1, 1.0, dimension=1)
    with pytest.raises(ValueError, match="noise"):
        linear_growth_rate(1, 1.0, noise=-1.0)


def test_resolution_warnings():
    """A density vanishing at the antipode (exactly zero there for all t) goes negative at degree 16; a
    cluster too narrow for degree 4 leaves undecayed top degrees; a smooth solve does not warn."""
    mf = ZonalMeanField(5.0, 3, 16)
    with pytest.warns(ResolutionWarning, match="negative"):
        mf.solve(lambda s: (1 + s) ** 2, 1.0, 0.02)
    with pytest.warns(ResolutionWarning, match="top degrees"):
        ZonalMeanField(10.0, 3, 4).solve(lambda s: 1 + s, 0.2, 0.02)
    mf = ZonalMeanField(1.0, 3, 8)
    c = np.zeros(9)
    c[0], c[8] = 1 / math.sqrt(4 * math.pi), 0.005
    with pytest.warns(ResolutionWarning, match="top degrees"):
        mf.solve(c @ mf.basis.values.T, 0.1, 0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResolutionWarning)
        mf.solve(lambda s: np.exp(s), 0.5, 0.05)


@pytest.mark.parametrize("scheme,order", [("euler", 1), ("heun", 2), ("bosh3", 3), ("rk4", 4)])
def test_noise_by_integrating_factor_keeps_the_order(scheme, order):
    """With nu = 0.3 the observed order in dt (0.1 vs 0.05) is the scheme's nominal order:
    the diffusion is integrated exactly (scheme.order(problem) says 1, because of the reset)."""
    mf = ZonalMeanField(4.0, 3, 12, noise=0.3)

    def rho(s):
        return np.exp(s + 0.3 * s**2)

    reference = mf.solve(rho, 1.0, 0.005, scheme="rk4").coefficients[-1]
    errors = [np.max(np.abs(mf.solve(rho, 1.0, dt, scheme=scheme).coefficients[-1] - reference)) for dt in (0.1, 0.05)]
    assert abs(math.log2(errors[0] / errors[1]) - order) < 0.15


def usa_nu_c(beta, d=3):
    return (2 * math.pi) ** (d / 2) * beta ** (1 - d / 2) * special.iv(d / 2, beta) / (beta * area(d))


def test_noisy_usa_transition_is_continuous_below_beta_star():
    """d = 3, beta = 1 < beta*(3) = 1.8162: the Gibbs branch meets the uniform state at nu_c like
    sqrt(nu_c - nu) (ratio of order parameters at 1 - 0.04 and 1 - 0.01: 2 within 5%)."""
    from ctformer.particles.sphere_stationary import stationary_state

    beta = 1.0
    assert optimize.brentq(lambda b: special.iv(2.5, b) / special.iv(1.5, b) - 1 / 3, 0.5, 5) == pytest.approx(
        1.8162, abs=1e-4)
    guess, order = None, {}
    for f in (0.8, 0.9, 0.96, 0.99):
        mf = ZonalMeanField(beta, 3, 24, normalized=False, noise=f * usa_nu_c(beta))
        guess = mf.coefficients_of(lambda s: np.exp(3 * s)) if guess is None else guess
        guess = stationary_state(mf, guess / (guess[0] * math.sqrt(4 * math.pi)))
        order[f] = mf.order_parameter(guess)
    assert order[0.96] / order[0.99] == pytest.approx(2.0, rel=0.05)


def test_noisy_usa_transition_jumps_above_beta_star():
    """d = 3, beta = 4: at nu = 1.2 nu_c the uniform state is linearly stable (sigma_1 < 0) and a
    clustered Gibbs state with |int x dmu| > 0.85 is stationary under solve: bistable, so the
    order parameter jumps."""
    from ctformer.particles.sphere_stationary import stationary_state

    beta, nu_c = 4.0, usa_nu_c(4.0)
    guess = None
    for f in (0.9, 1.05, 1.2):
        nu = f * nu_c
        mf = ZonalMeanField(beta, 3, 40, normalized=False, noise=nu)
        if guess is None:
            guess = mf.coefficients_of(lambda s: np.exp((np.exp(beta * s) - np.exp(beta)) / (beta * nu)))
            guess = guess / (guess[0] * math.sqrt(4 * math.pi))
        guess = stationary_state(mf, guess)
    assert mf.growth_rate(1) < 0
    assert mf.order_parameter(guess) > 0.85
    # the integrating factor does not keep steady states exactly: its error carries
    # (nu l(l+2) dt)^4 (drift 1e-5, 7e-7, 5e-8 at dt = h, h/2, h/4 with h the stable step)
    after = mf.solve(guess @ mf.basis.values.T, 0.5, mf.stable_step(0.5) / 4).coefficients[-1]
    assert np.max(np.abs(after - guess)) < 1e-7


def test_sa_gibbs_state_is_a_steady_state_of_the_solver():
    """SA, d = 3, beta = 5, nu = 0.9 nu_c: rho = G^{1/(beta nu)} / Z makes the Galerkin right-hand side
    (transport minus diffusion) vanish to 1e-11, with a nonzero order parameter."""
    from ctformer.particles.sphere_stationary import stationary_state

    beta = 5.0
    nu_c = special.iv(1.5, beta) / (beta * special.iv(0.5, beta))
    mf = ZonalMeanField(beta, 3, 32, noise=0.9 * nu_c)
    guess = mf.coefficients_of(lambda s: np.exp(3 * s))
    c = stationary_state(mf, guess / (guess[0] * math.sqrt(4 * math.pi)))
    rhs = mf.transport(c) - mf.noise * np.arange(33) * (np.arange(33) + 1) * c
    assert np.max(np.abs(rhs)) < 1e-11
    assert mf.order_parameter(c) > 0.4
    with pytest.raises(ValueError, match="noise"):
        stationary_state(ZonalMeanField(beta, 3, 8), c[:9])


@pytest.mark.parametrize("beta", [-3.0, 0.5, 7.0])
@pytest.mark.parametrize("normalized", [True, False])
def test_growth_rate_extends_the_circle(beta, normalized):
    """dimension=2 is the circle's linear_growth_rate (k^2 I_k / (beta I_0), k^2 I_k / beta), negative beta included."""
    from ctformer.particles import linear_growth_rate as circle_rate

    k = np.arange(15)
    assert np.allclose(linear_growth_rate(k, beta, normalized, 2), circle_rate(k, beta, normalized), rtol=1e-14, atol=0)


@pytest.mark.parametrize("nu", [0.0, 0.2])
def test_evolve_with_error_control(nu):
    """evolve (tsit5) at rtol 1e-6 and 1e-9 against a fine fixed-step RK4 solve: errors below 1e3 rtol,
    falling with rtol; a fixed dt above the stable step is refused."""
    mf = ZonalMeanField(4.0, 3, 16, noise=nu)

    def rho(s):
        return np.exp(s + 0.3 * s**2)

    reference = mf.solve(rho, 1.0, 0.002).coefficients[-1]
    errors = []
    for rtol in (1e-6, 1e-9):
        final = np.asarray(mf.evolve(rho, 1.0, rtol=rtol, atol=rtol * 1e-3).states[-1])[:17]
        errors.append(np.max(np.abs(final - reference)))
        assert errors[-1] < 1e3 * rtol * np.max(np.abs(reference))
    assert errors[1] < 1e-2 * errors[0]
    with pytest.raises(ValueError, match="stable step"):
        mf.evolve(rho, 10.0, dt=1.0, scheme="rk4")
