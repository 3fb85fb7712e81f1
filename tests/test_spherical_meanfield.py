"""Mean field on S^2 in spherical harmonics (ducc0): the zonal solver on zonal data, growth rates of
m != 0 modes, the velocity against direct quadrature, mass, energy, refusals."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from ctformer import solvers
from ctformer.particles import ResolutionWarning
from ctformer.particles.spherical import SphericalMeanField
from ctformer.particles.zonal import ZonalMeanField

from .conftest import require

require("ducc0")


def index(L, l, m):
    """healpy/ducc0 position of a_lm (m >= 0)."""
    return m * (2 * L + 1 - m) // 2 + l


@pytest.mark.parametrize("normalized,beta,dt", [(True, 3.0, 0.02), (False, 2.0, 0.01)])
def test_zonal_data_match_the_zonal_solver(normalized, beta, dt):
    """A zonal density: a_l0 = c_l of ZonalMeanField(d=3) to 1e-10 at t = 1, the m != 0 stay 0."""
    L = 24
    f = lambda s: np.exp(0.8 * s - 0.5 * s**2)  # noqa: E731
    zonal = ZonalMeanField(beta, 3, L, normalized=normalized)
    z = f(zonal.grid) @ zonal.basis.weights
    sphere = SphericalMeanField(beta, L, normalized=normalized).solve(lambda x: f(x[..., 2]) / z, 1.0, dt)
    line = zonal.solve(lambda s: f(s) / z, 1.0, dt)
    assert np.max(np.abs(sphere.coefficients[-1, : L + 1] - line.coefficients[-1])) < 1e-10
    assert np.max(np.abs(sphere.coefficients[-1, L + 1:])) < 1e-14
    assert np.max(np.abs(sphere.mass - 1)) < 1e-13
    assert np.max(np.abs(np.tensordot(sphere.density, sphere.weights, axes=2) - 1)) < 1e-13


def expected_rate(l, beta, normalized, nu):
    ratio = special.iv(l + 0.5, beta) / special.iv(0.5, beta) if normalized else \
        (2 * math.pi) ** 1.5 * beta ** -0.5 * special.iv(l + 0.5, beta) / (4 * math.pi)
    return l * (l + 1) * (ratio / beta - nu)


@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("nu", [0.0, 0.05])
def test_growth_rate_does_not_depend_on_m(normalized, nu):
    """uniform + eps Y_lm (m = 0..l, l = 1..6), beta = 5: slope of log|a_lm| within 1e-8 of sigma_l."""
    beta, L, eps = 5.0, 6, 1e-30
    mf = SphericalMeanField(beta, L, normalized=normalized, noise=nu)
    problem, rk4 = mf.problem(), solvers.get("rk4")
    fastest = float(np.max(mf.growth_rate(np.arange(1, L + 1))))
    worst = 0.0
    for l in range(1, L + 1):
        for m in range(l + 1):
            a = np.zeros(mf.l.shape[0], dtype=complex)
            a[0], a[index(L, l, m)] = 1 / math.sqrt(4 * math.pi), eps * (1 + 0.5j if m else 1)
            reference = expected_rate(l, beta, normalized, nu)
            scale = abs(reference) + 2 * nu * l * (l + 1)
            t = min(0.05 / scale, 30 / fastest)
            u = np.concatenate([a, [0.0]]) if nu else a
            for _ in range(10):
                u = rk4.step(problem, u, t / 10)
            measured = math.log(abs(u[index(L, l, m)]) / abs(a[index(L, l, m)])) / t
            worst = max(worst, abs(measured - reference) / max(abs(reference), scale if nu else 0))
    assert worst <= 1e-8


@pytest.mark.parametrize("normalized", [True, False])
def test_velocity_matches_direct_quadrature(normalized):
    """X(x) = int e^{b<x,y>} P_x^perp y rho dsigma / int e^{b<x,y>} rho dsigma on a non-zonal density,
    by a fine Gauss-Legendre x trapezoid quadrature (no Funk-Hecke, no spin-1 transform)."""
    beta, L = 2.5, 16
    mf = SphericalMeanField(beta, L, normalized=normalized)

    def rho(x):
        return np.exp(0.7 * x[..., 0] - 0.4 * x[..., 1] * x[..., 2] + 0.3 * x[..., 2])

    velocity = mf.velocity(rho)  # (theta, phi) components
    fine = SphericalMeanField(beta, 60)
    y, w = fine.points().reshape(-1, 3), fine.weights.reshape(-1)
    x = mf.points().reshape(-1, 3)[::7]
    k = np.exp(beta * x @ y.T) * (w * rho(y))
    mean = k @ y
    if normalized:
        mean = mean / k.sum(axis=1, keepdims=True)
    else:
        mean = mean / (rho(y) @ w)  # mass one
    tangential = mean - np.sum(mean * x, axis=1, keepdims=True) * x
    th, ph = np.meshgrid(mf.colatitude, mf.longitude, indexing="ij")
    e_th = np.stack([np.cos(th) * np.cos(ph), np.cos(th) * np.sin(ph), -np.sin(th)], axis=-1).reshape(-1, 3)[::7]
    e_ph = np.stack([-np.sin(ph), np.cos(ph), 0 * ph], axis=-1).reshape(-1, 3)[::7]
    if not normalized:  # the solver's USA density is rho itself (mass not one): compare with the same rho
        tangential = tangential * (rho(y) @ w)
    got = velocity[0].reshape(-1)[::7, None] * e_th + velocity[1].reshape(-1)[::7, None] * e_ph
    assert np.max(np.abs(got - tangential)) < 1e-11 * max(1.0, np.max(np.abs(tangential)))


def test_energy_order_parameter_and_modes():
    """USA: energy non-decreasing; |int x dmu| by grid quadrature; the dominant mode of a planted Y_32."""
    beta, L = 3.0, 16
    mf = SphericalMeanField(beta, L, normalized=False)

    def rho(x):
        return np.exp(0.5 * x[..., 0] + 0.3 * x[..., 1] ** 2)

    z = np.sum(rho(mf.points()) * mf.weights)
    sol = mf.solve(lambda x: rho(x) / z, 0.3, 0.01, save_every=5)
    energy = mf.energy(sol.coefficients)
    assert np.all(np.diff(energy) > 0)
    first = np.tensordot(sol.density[-1], mf.weights[..., None] * mf.points(), axes=2)
    assert mf.order_parameter(sol.coefficients[-1]) == pytest.approx(np.linalg.norm(first), rel=1e-12)
    a = np.zeros(mf.l.shape[0], dtype=complex)
    a[0], a[index(L, 3, 2)], a[index(L, 5, 0)] = 0.28, 0.01j, 0.005
    assert mf.dominant_mode(a) == 3


def test_bad_input():
    with pytest.raises(ValueError, match="degree"):
        SphericalMeanField(1.0, 0)
    with pytest.raises(ValueError, match="beta"):
        SphericalMeanField(math.nan, 8)
    with pytest.raises(ValueError, match="noise"):
        SphericalMeanField(1.0, 8, noise=-1e-3)
    mf = SphericalMeanField(1.0, 8)
    with pytest.raises(ValueError, match="NaN"):
        mf.solve(lambda x: np.where(x[..., 2] > 0.5, np.nan, 1.0), 1.0, 0.1)
    with pytest.raises(ValueError, match="grid"):
        mf.solve(np.ones((3, 3)), 1.0, 0.1)
    with pytest.raises(ValueError, match="stable step"):
        mf.solve(lambda x: 1 + 0 * x[..., 0], 10.0, 1.0)
    with pytest.warns(ResolutionWarning, match="negative"):
        SphericalMeanField(5.0, 16).solve(lambda x: (1 + x[..., 0]) ** 2, 1.0, 0.02)
    with pytest.warns(ResolutionWarning, match="top degrees"):
        SphericalMeanField(10.0, 4).solve(lambda x: 1 + x[..., 1], 0.2, 0.02)


def test_empirical_density_of_a_quadrature_is_the_projection():
    """Grid points weighted by rho * quadrature weight: the harmonic moments are the solver's coefficients."""
    from ctformer.particles.sphere_particles import empirical_density

    mf = SphericalMeanField(2.0, 8)

    def rho(x):
        return np.exp(0.7 * x[..., 0] - 0.4 * x[..., 1] * x[..., 2] + 0.3 * x[..., 2])

    points = mf.points().reshape(-1, 3)
    weights = (mf.weights * rho(mf.points())).reshape(-1)
    assert np.max(np.abs(empirical_density(points, mf, weights=weights) - mf.coefficients_of(rho))) < 1e-13
    zonal = ZonalMeanField(2.0, 3, 10)
    weights = (mf.weights * np.exp(mf.points()[..., 2])).reshape(-1)
    assert np.max(np.abs(empirical_density(points, zonal, weights=weights) - zonal.coefficients_of(np.exp))) < 1e-13
    with pytest.raises(ValueError, match="unit sphere"):
        empirical_density(2 * points, mf)
    with pytest.raises(ValueError, match="shape"):
        empirical_density(points[:, :2], mf)


def test_s_distance_is_the_kolmogorov_statistic():
    """s_distance of i.i.d. tokens from e^s / Z equals scipy's kstest statistic against the closed-form CDF."""
    from scipy import stats

    from ctformer.particles.sphere_particles import s_distance, sample_zonal, zonal_cdf

    mf = ZonalMeanField(2.0, 3, 12)
    c = mf.coefficients_of(np.exp)
    exact = lambda s: (np.exp(s) - np.exp(-1)) / (np.exp(1) - np.exp(-1))  # noqa: E731
    assert zonal_cdf(mf, c, np.array([0.3]))[0] == pytest.approx(2 * np.pi * (np.exp(0.3) - np.exp(-1)), rel=1e-13)
    x = sample_zonal(mf, c, 3000, np.random.default_rng(5))
    assert np.max(np.abs(np.linalg.norm(x, axis=1) - 1)) < 1e-14
    reference = stats.kstest(x[:, 2], exact)
    assert s_distance(x, mf, c) == pytest.approx(reference.statistic, abs=1e-8)
    assert reference.pvalue > 1e-3  # the sampler draws from rho


def test_particles_follow_the_zonal_mean_field():
    """1000 i.i.d. tokens, d = 3, SA, beta = 2, t = 1: Kolmogorov distance to the mean field ~ n^{-1/2}
    (below 3 / sqrt(n), while the law itself moved by more than 5 / sqrt(n))."""
    from ctformer.particles import SelfAttentionDynamics
    from ctformer.particles.sphere_particles import s_distance, sample_zonal

    beta, n = 2.0, 1000
    mf = ZonalMeanField(beta, 3, 24)
    c0 = mf.coefficients_of(np.exp) / (mf.coefficients_of(np.exp)[0] * math.sqrt(4 * math.pi))
    c1 = mf.solve(c0 @ mf.basis.values.T, 1.0, 0.05).coefficients[-1]
    x0 = sample_zonal(mf, c0, n, np.random.default_rng(1))
    x1 = SelfAttentionDynamics(beta).solve(x0, 1.0, 0.25).positions[-1]
    assert s_distance(x1, mf, c1) < 3 / math.sqrt(n)
    assert s_distance(x1, mf, c0) > 5 / math.sqrt(n)


def test_torch_density_is_converted_on_the_host():
    """The stated fallback: a torch density gives the NumPy solution of the same values, bit for bit."""
    torch = require("torch")
    mf = SphericalMeanField(2.0, 8)
    values = np.exp(mf.points()[..., 0]) / 40
    from_torch = mf.solve(torch.from_numpy(values), 0.2, 0.05)
    assert isinstance(from_torch.density, np.ndarray)
    assert np.array_equal(from_torch.coefficients, mf.solve(values, 0.2, 0.05).coefficients)


def test_labelled_datasets_round_trip(tmp_path):
    """to_xarray/to_netcdf/to_zarr use the sphere layouts; the files give the coefficients back bit for bit
    and the stored weights integrate the density to the mass."""
    xr = require("xarray")
    zonal = ZonalMeanField(2.0, 3, 8).solve(np.exp, 0.2, 0.05)
    back = xr.open_dataset(zonal.to_netcdf(tmp_path / "zonal.nc"))
    assert back.attrs["ctformer_result"] == "ZonalSolution" and back.attrs["dimension"] == 3
    assert np.array_equal(back.coefficients.values, zonal.coefficients)
    assert np.allclose((back.density * back.node_weight).sum("node").values, zonal.mass, rtol=1e-14)
    sphere = SphericalMeanField(2.0, 6).solve(lambda x: np.exp(x[..., 0]), 0.2, 0.05)
    stored = xr.open_zarr(sphere.to_zarr(tmp_path / "sphere.zarr"))
    values = stored.coefficients.values
    assert np.array_equal(values[..., 0] + 1j * values[..., 1], sphere.coefficients)
    assert list(stored.l.values[:8]) == [0, 1, 2, 3, 4, 5, 6, 1] and list(stored.m.values[6:8]) == [0, 1]


def test_result_files_record_the_field():
    """A solve's file says which field made it: beta, noise and normalized, as the field has them
    (once left out, so a file could not tell two fields' densities apart)."""
    require("xarray")
    zonal = ZonalMeanField(2.5, 4, 6, noise=0.125, normalized=False).solve(lambda s: 1 + 0.3 * s, 0.02, 0.005)
    sphere = SphericalMeanField(-1.5, 4, noise=0.0625).solve(lambda x: 1 + 0.3 * x[..., 0], 0.1, 0.05)
    for solution, expected in ((zonal, (2.5, 0.125, 0)), (sphere, (-1.5, 0.0625, 1))):
        attrs = solution.to_xarray().attrs
        assert (attrs["beta"], attrs["noise"], attrs["normalized"]) == expected
        assert (solution.beta, solution.noise) == expected[:2]


def test_evolve_matches_solve():
    """S^2 with noise: evolve at rtol 1e-9 equals a fine RK4 solve to 1e-11."""
    mf = SphericalMeanField(2.0, 8, noise=0.1)
    evolved = mf.evolve(lambda x: np.exp(x[..., 0]), 0.5, rtol=1e-9, atol=1e-12)
    fixed = mf.solve(lambda x: np.exp(x[..., 0]), 0.5, 0.005)
    n = fixed.coefficients.shape[1]
    assert np.max(np.abs(np.asarray(evolved.states[-1])[:n] - fixed.coefficients[-1])) < 1e-11


def _prime_factors(n):
    factors, p = set(), 2
    while p * p <= n:
        while n % p == 0:
            factors.add(p)
            n //= p
        p += 1
    return factors | ({n} if n > 1 else set())


@pytest.mark.parametrize("L", [40, 64])
def test_longitudes_are_a_fast_fft_length_and_keep_the_quadrature_exact(L):
    """At least 3L + 2 longitudes (the 3/2 rule), the smallest such count whose prime factors
    are at most 11 (3L + 2 = 122 = 2 x 61 and 194 = 2 x 97 here); the grid integrates
    x_3^2 to 4 pi / 3, and the transport equals the one on exactly 3L + 2 longitudes (also an
    exact quadrature) to rounding."""
    field = SphericalMeanField(5.0, L)
    least = 3 * L + 2
    assert field.n_phi >= least and max(_prime_factors(field.n_phi)) <= 11
    assert all(max(_prime_factors(n)) > 11 for n in range(least, field.n_phi))
    assert max(_prime_factors(least)) > 11  # the case the rounding is for
    points = field.points()
    assert abs(np.sum(field.weights * points[..., 2] ** 2) - 4 * math.pi / 3) < 1e-13
    alm = field.coefficients_of(lambda x: np.exp(2.0 * x[..., 2]) * (1 + 0.1 * x[..., 0]))
    plain = SphericalMeanField(5.0, L)
    object.__setattr__(plain, "n_phi", least)  # past the fixed construction: transport reads n_phi alone
    ours, reference = field.transport(alm), plain.transport(alm)
    assert np.abs(ours - reference).max() < 1e-13 * np.abs(reference).max()
    assert np.abs(reference).max() > 0.1
