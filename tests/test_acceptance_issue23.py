"""Acceptance of issue 23 (tokens on the sphere in the mean-field limit), called as the issue writes.

Items already asserted elsewhere are not repeated here: growth rates measured in solves for
d = 2..16, l = 1..10 (test_zonal_meanfield.py::test_growth_rates_match_funk_hecke), m != 0 on S^2
(test_spherical_meanfield.py::test_growth_rate_does_not_depend_on_m), d = 2 against
CircleMeanField (::test_circle_is_dimension_two_on_even_densities), S^2 against zonal d = 3
(::test_zonal_data_match_the_zonal_solver), mode selection in solves (::test_mode_selection), the
noise thresholds in solves (::test_noise_threshold), the noisy USA transition
(::test_noisy_usa_transition_*), particles against the mean field
(::test_particles_follow_the_zonal_mean_field) and the bad inputs (::test_bad_input*).
"""
import math

import numpy as np
import pytest
from scipy import optimize, special

import ctformer.particles as particles
from ctformer.particles import MeanFieldSolution, SphericalMeanField, ZonalMeanField, empirical_density


def area(d):
    return 2 * math.pi ** (d / 2) / math.gamma(d / 2)


def sigma(l, beta, d, normalized, nu):
    """sigma_l = l (l + d - 2) (lambda_l / (beta lambda_0) - nu) (SA), lambda_l / (beta |S^{d-1}|) (USA), from iv."""
    if normalized:
        ratio = special.iv(l + d / 2 - 1, beta) / (beta * special.iv(d / 2 - 1, beta))
    else:  # Funk-Hecke for d sigma: lambda_l = (2 pi)^{d/2} beta^{1 - d/2} I_{l + d/2 - 1}(beta)
        ratio = (2 * math.pi) ** (d / 2) * beta ** (1 - d / 2) * special.iv(l + d / 2 - 1, beta) / (beta * area(d))
    return l * (l + d - 2) * (ratio - nu)


@pytest.mark.parametrize("normalized", [True, False])
def test_public_linear_growth_rate_extends_to_every_dimension(normalized):
    """Issue 23: "linear_growth_rate(k, beta, normalized=True, dimension=2, noise=0.0) extends to every d"
    (ctformer.particles.linear_growth_rate took no dimension or noise: TypeError)."""
    l = np.arange(1, 11)
    for d in (2, 3, 4, 8, 16):
        for beta in (1.0, 5.0, 20.0):
            for nu in (0.0, 0.03):
                got = particles.linear_growth_rate(l, beta, normalized=normalized, dimension=d, noise=nu)
                np.testing.assert_allclose(got, sigma(l, beta, d, normalized, nu), rtol=1e-10)  # measured 8.9e-13
    # on the circle without noise it is still k^2 I_k / (beta I_0), the circle's own formula
    np.testing.assert_allclose(particles.linear_growth_rate(l, 5.0, dimension=2),
                               particles.linear_growth_rate(l, 5.0), rtol=1e-13)


@pytest.mark.parametrize("d,beta,l_star", [(2, 5.0, 3), (3, 5.0, 3), (3, 20.0, 6), (8, 25.0, 5)])
def test_fastest_degree_table(d, beta, l_star):
    """Issue 23: "l* = 3 at beta = 5 for d = 2 and d = 3, 6 at beta = 20 for d = 3, 5 at beta = 25 for d = 8"."""
    l = np.arange(1, 40)
    assert int(l[np.argmax(particles.linear_growth_rate(l, beta, dimension=d))]) == l_star
    assert int(l[np.argmax(sigma(l, beta, d, True, 0.0))]) == l_star


@pytest.mark.parametrize("d", [2, 3, 8])
def test_noise_threshold_of_the_public_rate(d):
    """Issue 23: "the uniform state loses stability first at l = 1, at nu_c = I_{d/2}(beta) / (beta I_{d/2-1}(beta))
    for SA and lambda_1(beta) / beta for USA" (lambda_1 for the probability measure)."""
    beta = 5.0
    for normalized in (True, False):
        found = optimize.brentq(lambda nu: particles.linear_growth_rate(1, beta, normalized, d, nu), 0.0, 10.0,
                                xtol=1e-15, rtol=1e-14)
        assert found == pytest.approx(sigma(1, beta, d, normalized, 0.0) / (d - 1), rel=1e-12)
        above = particles.linear_growth_rate(np.arange(1, 12), beta, normalized, d, found * (1 + 1e-9))
        assert np.all(above < 0)  # l = 1 is the last degree to turn


def test_zonal_solution_as_written():
    """Issue 23: "ZonalMeanField(beta, dimension, degree, *, normalized=True, noise=0.0)" ...
    "solve(rho0, t1, dt, save_every=1, scheme="rk4") returning a MeanFieldSolution with times, grid
    (the nodes: s values for zonal), density, coefficients and mass" ... "Gauss-Jacobi nodes from
    SciPy" ... "uniform = 1/|S^{d-1}|" ... "Mass conserved to 1e-13"."""
    d, L = 5, 12
    mf = ZonalMeanField(1.5, d, L, normalized=False, noise=0.01)
    a = (d - 3) / 2
    np.testing.assert_allclose(np.sort(mf.grid), special.roots_jacobi(mf.grid.size, a, a)[0], atol=1e-15)
    assert mf.uniform == pytest.approx(1 / area(d), rel=1e-15)
    sol = mf.solve(lambda s: (1 + 0.5 * s) / area(d), 1.0, 0.025, save_every=10, scheme="rk4")
    assert isinstance(sol, MeanFieldSolution)
    np.testing.assert_allclose(sol.times, [0.0, 0.25, 0.5, 0.75, 1.0], atol=1e-15)
    assert sol.density.shape == (5, mf.grid.size) and sol.coefficients.shape == (5, L + 1)
    np.testing.assert_allclose(sol.mass, 1.0, rtol=0, atol=1e-13)
    # the density is w.r.t. d sigma: mass = |S^{d-2}| int rho(s) (1 - s^2)^{(d-3)/2} ds (Gauss-Jacobi)
    nodes, weights = special.roots_jacobi(mf.grid.size, a, a)
    order = np.argsort(mf.grid)
    np.testing.assert_allclose(area(d - 1) * sol.density[:, order] @ weights, 1.0, rtol=0, atol=1e-13)
    assert mf.velocity(sol.density[-1]).shape == mf.grid.shape


def test_spherical_solution_as_written():
    """Issue 23: "SphericalMeanField(beta, degree, *, normalized=True, noise=0.0)" ... "grid ((colatitude,
    longitude) arrays for S^2)" ... "rho0 ... as a callable of points on the sphere (S^2)"."""
    mf = SphericalMeanField(2.0, 8, normalized=True, noise=0.0)
    theta, phi = mf.grid
    np.testing.assert_allclose(np.sort(np.cos(theta)), special.roots_legendre(theta.size)[0], atol=1e-15)
    np.testing.assert_allclose(phi, 2 * np.pi * np.arange(phi.size) / phi.size, atol=1e-14)
    sol = mf.solve(lambda x: (1 + 0.3 * x[..., 0] * x[..., 1]) / (4 * np.pi), 0.5, 0.05, save_every=5)
    assert isinstance(sol, MeanFieldSolution)
    assert sol.density.shape == (3, theta.size, phi.size) and len(sol.coefficients) == 3
    np.testing.assert_allclose(sol.mass, 1.0, rtol=0, atol=1e-13)
    # mass by the grid's own quadrature, independently: Gauss-Legendre in cos(theta) x trapezoid in phi
    _, w = special.roots_legendre(theta.size)
    by_grid = (2 * np.pi / phi.size) * np.einsum("j,tjk->t", w[np.argsort(np.argsort(np.cos(theta)))],
                                                 sol.density)
    np.testing.assert_allclose(by_grid, 1.0, rtol=0, atol=1e-13)


@pytest.mark.parametrize("d", [3, 5])
def test_energy_and_order_parameter_closed_forms(d):
    """Issue 23: "the interaction energy E = (1/(2 beta)) int int e^{beta <x,y>} dmu dmu ..., an order parameter
    |int x dmu|": uniform E = Gamma(d/2) (2/beta)^{d/2-1} I_{d/2-1}(beta) / (2 beta); for rho = (1 + a s)/|S|,
    |int x dmu| = a E[s^2] = a / d."""
    beta, a = 3.0, 0.4
    mf = ZonalMeanField(beta, d, 10)
    uniform = mf.coefficients_of(np.full(mf.grid.shape, mf.uniform))
    closed = math.gamma(d / 2) * (2 / beta) ** (d / 2 - 1) * special.iv(d / 2 - 1, beta) / (2 * beta)
    assert mf.energy(uniform) == pytest.approx(closed, rel=1e-13)
    tilted = mf.coefficients_of(lambda s: (1 + a * s) / area(d))
    assert mf.order_parameter(tilted) == pytest.approx(a / d, rel=1e-13)
    if d == 3:
        sphere = SphericalMeanField(beta, 8)
        alm = sphere.coefficients_of(lambda x: (1 + a * x[..., 2]) / (4 * np.pi))
        assert sphere.order_parameter(alm) == pytest.approx(a / 3, rel=1e-13)
        assert sphere.energy(sphere.coefficients_of(lambda x: 0 * x[..., 0] + 1 / (4 * np.pi))) == pytest.approx(
            closed, rel=1e-13)


def test_empirical_density_is_the_harmonic_moments():
    """Issue 23: "empirical_density ... maps particle positions on S^{d-1} to the zonal ... representation
    (... harmonic moments)": for d = 3, c_l = (1/n) sum_i P_l(s_i) sqrt((2l + 1)/(4 pi))."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    mf = ZonalMeanField(2.0, 3, 6)
    moments = [np.mean(special.eval_legendre(l, x[:, 2])) * math.sqrt((2 * l + 1) / (4 * math.pi)) for l in range(7)]
    np.testing.assert_allclose(empirical_density(x, mf), moments, rtol=0, atol=1e-15)


def test_velocity_errors_name_its_argument():
    """Issue 23: "velocity(rho)" ... "Bad input: ... densities with NaN ...: clear errors naming the argument"
    (velocity(rho) and coefficients_of(rho) said "rho0", the argument of solve)."""
    zonal, sphere, circle = ZonalMeanField(1.0, 3, 8), SphericalMeanField(1.0, 4), particles.CircleMeanField(1.0, 16)
    with pytest.raises(ValueError, match=r"^rho has NaN"):
        zonal.velocity(np.full(zonal.grid.shape, np.nan))
    with pytest.raises(ValueError, match=r"^rho must give values on the"):
        sphere.velocity(np.ones(3))
    with pytest.raises(ValueError, match=r"^rho must give 16 values"):
        circle.velocity(np.ones(3))
    with pytest.raises(ValueError, match=r"^rho must be a nonnegative density"):
        zonal.coefficients_of(-np.ones(zonal.grid.shape))
    with pytest.raises(ValueError, match=r"^rho0 has NaN"):  # solve still names its own argument
        zonal.solve(np.full(zonal.grid.shape, np.nan), 1.0, 0.1)
    with pytest.raises(ValueError, match=r"^rho0 must give values on the"):
        sphere.evolve(np.ones(3), 1.0)


def test_empirical_density_on_s2_keeps_the_particles_energy_and_order_parameter():
    """Issue 23: "empirical_density ... maps particle positions ... to the ... S^2 representation (... harmonic
    moments)" and "the interaction energy E = (1/(2 beta)) int int e^{beta <x,y>} dmu dmu, an order parameter
    |int x dmu|": for the empirical measure these are the particles' own energy(x, beta) and |mean x|
    (beta = 1, degree 16: the Funk-Hecke tail beyond 16 is below 1e-20)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    w = rng.random(50)
    w /= w.sum()
    sphere = SphericalMeanField(1.0, 16)
    for weights in (None, w):
        alm = empirical_density(x, sphere, weights=weights)
        assert sphere.energy(alm) == pytest.approx(particles.energy(x, 1.0, weights=weights), rel=1e-13)
        mean = x.mean(axis=0) if weights is None else w @ x
        assert sphere.order_parameter(alm) == pytest.approx(np.linalg.norm(mean), rel=1e-13)


def test_particles_approach_the_zonal_mean_field_like_n_to_the_minus_half():
    """Issue 23: "Particles (n = 250 .. 16000, i.i.d. from a smooth zonal rho0, d = 3, SA, beta = 2, t = 1)
    against the zonal mean field: the distance of the s-distributions (Kolmogorov or W1) decays with slope
    -0.5 +- 0.1 in n" (n = 250, 1000, 4000, four draws each; measured -0.53)."""
    from ctformer.particles.sphere_particles import s_distance, sample_zonal

    beta = 2.0
    mf = ZonalMeanField(beta, 3, 24)
    c0 = mf.coefficients_of(np.exp)
    c0 = c0 / (c0[0] * math.sqrt(4 * math.pi))  # mass one
    c1 = mf.solve(c0 @ mf.basis.values.T, 1.0, 0.05).coefficients[-1]
    dynamics = particles.SelfAttentionDynamics(beta)
    sizes, distances = (250, 1000, 4000), []
    for n in sizes:
        runs = [dynamics.solve(sample_zonal(mf, c0, n, np.random.default_rng(seed)), 1.0, 0.5).positions[-1]
                for seed in range(4)]
        distances.append(np.mean([s_distance(x1, mf, c1) for x1 in runs]))
    slope = np.polyfit(np.log(sizes), np.log(distances), 1)[0]
    assert slope == pytest.approx(-0.5, abs=0.1)


@pytest.mark.parametrize("make", [lambda nu: ZonalMeanField(1.0, 3, 32, noise=nu),
                                  lambda nu: SphericalMeanField(1.0, 32, noise=nu)], ids=["zonal", "s2"])
def test_noise_step_keeps_the_integrating_factor_in_float64(make):
    """Issue 23: "Noise: ... treated exactly (an integrating factor ...) so it does not limit the step" and
    "an unstable dt: clear errors naming the argument". With nu L(L+d-2) dt past log(float max) = 709.8 the
    factor e^{nu L(L+d-2) tau} overflowed: a dt that stable_step accepted (0.27 at nu = 10, L = 32) ended in
    NaN. The Runge-Kutta schemes now take the noise in Lawson form (only decaying factors): their step is
    the transport's, 0.28 here, and dt = 0.07 (nu L(L+d-2) dt = 739) is finite and keeps the mass. The
    splitting schemes step the integrating-factor form: for them stable_step is at most 700/(nu L(L+d-2))
    and a larger dt is refused, naming noise."""
    nu, lap_max = 10.0, 32 * 33
    field = make(nu)
    t1 = 0.28
    bound = field.stable_step(t1, "lie")
    assert bound == pytest.approx(700.0 / (nu * lap_max), rel=1e-15)
    assert field.stable_step(t1) == make(0.0).stable_step(t1) > 0.07 > bound  # rk4: the transport's step
    rho0 = (lambda s: np.exp(3 * s)) if isinstance(field, ZonalMeanField) else (lambda x: np.exp(3 * x[..., 2]))
    with pytest.raises(ValueError, match=r"noise=10 needs nu\*L\*\(L\+d-2\)\*dt <= 700"):
        field.solve(rho0, t1, 0.07, scheme="lie")  # nu L(L+d-2) dt = 739: inf, then NaN, before
    for dt, scheme in ((bound, "lie"), (0.07, "rk4")):  # at the bound, and past it in Lawson form
        sol = field.solve(rho0, t1, dt, scheme=scheme)
        assert np.all(np.isfinite(sol.density)) and np.allclose(sol.mass, sol.mass[0], rtol=1e-13, atol=0)