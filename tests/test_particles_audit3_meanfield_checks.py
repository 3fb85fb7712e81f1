"""The sphere and circle mean fields against independent solves (fourth audit round).

* S^2 and the zonal S^3 against weighted particles at quadrature nodes (an exact particle
  solution of the same continuity equation, moved by ``SelfAttentionDynamics``), and S^2
  against a rotated zonal solve;
* spectral convergence of the S^2 solver in the degree;
* the linear growth rates as eigenvalues of a finite-difference Jacobian of each solver's own
  right-hand side at the uniform density;
* the noise term is the generator nu * Laplacian (degree l decays as exp(-nu l (l + d - 2) t)).
"""
import numpy as np
import pytest
from scipy import special

from ctformer.backend import backend_of
from ctformer.particles import (CircleMeanField, SelfAttentionDynamics, SphericalMeanField, ZonalMeanField,
                                empirical_density, linear_growth_rate)
from ctformer.particles.sphere_basis import sphere_area


def _rho0(x):
    # a smooth non-zonal positive density of mass about one
    return np.exp(x[..., 0] + 0.5 * x[..., 1] * x[..., 2]) / 13.0


def _central_jacobian(rhs, v0, h):
    eye = np.eye(v0.size)
    return np.array([(rhs(v0 + h * e) - rhs(v0 - h * e)) / (2 * h) for e in eye]).T


def test_sphere_mean_field_matches_weighted_quadrature_particles():
    # rho0 * (Gauss weight) at the nodes of a grid is a weighted empirical measure; it solves
    # the same continuity equation exactly, so its moments are the mean field's coefficients.
    beta = 2.0
    field = SphericalMeanField(beta, 24)
    sol = field.solve(_rho0, t1=0.5, dt=0.01, save_every=25)
    nodes = SphericalMeanField(beta, 8)
    x0 = nodes.points().reshape(-1, 3)
    w = (_rho0(nodes.points()) * nodes.weights).reshape(-1)
    path = SelfAttentionDynamics(beta, weights=w).solve(x0, t1=0.5, dt=0.01, save_every=25)
    low = SphericalMeanField(beta, 4)
    keep = field.l <= 4
    for k in (1, 2):
        moments = empirical_density(path.positions[k], low, weights=w)
        assert np.max(np.abs(moments - sol.coefficients[k][keep])) < 1e-10


@pytest.mark.parametrize("normalized", [True, False])
def test_sphere_mean_field_on_rotated_zonal_data(normalized):
    # a density zonal about a tilted axis e is not zonal in the solver's coordinates; its
    # solution is the zonal (Gegenbauer) solution evaluated at <x, e>
    e = np.array([0.48, -0.6, 0.64])
    beta, degree = (3.0, 24) if normalized else (0.5, 24)
    zonal = ZonalMeanField(beta, 3, degree, normalized=normalized)
    sphere = SphericalMeanField(beta, degree, normalized=normalized)

    def f(s):
        return np.exp(s + 0.5 * s * s) / 16.0

    zs = zonal.solve(f, t1=1.0, dt=0.02, save_every=25)
    ss = sphere.solve(lambda x: f(x @ e), t1=1.0, dt=0.02, save_every=25)
    s = np.clip(sphere.points() @ e, -1.0, 1.0)
    for k in (1, 2):
        ref = zonal.basis.evaluate(zs.coefficients[k], s)
        assert np.max(np.abs(ss.density[k] - ref)) < 1e-11 * np.max(ref)
    assert np.all(ss.mass == ss.mass[0])


@pytest.mark.filterwarnings("ignore::ctformer.particles.ResolutionWarning")  # degrees 4, 8 are meant to be coarse
def test_sphere_mean_field_converges_geometrically_in_the_degree():
    beta, t1 = 2.0, 0.5
    reference = SphericalMeanField(beta, 36)
    ref = reference.solve(_rho0, t1=t1, dt=0.01, save_every=50).coefficients[-1]
    degrees = np.array([4, 8, 12, 16])
    errors = []
    for degree in degrees:
        out = SphericalMeanField(beta, degree).solve(_rho0, t1=t1, dt=0.01, save_every=50).coefficients[-1]
        padded = np.zeros_like(ref)
        index = {(l, m): j for j, (l, m) in enumerate(zip(reference.l, reference.m))}
        for l, m, a in zip(*np.broadcast_arrays(SphericalMeanField(beta, degree).l,
                                               SphericalMeanField(beta, degree).m), out):
            padded[index[(int(l), int(m))]] = a
        errors.append(np.linalg.norm(padded - ref))
    slope, intercept = np.polyfit(degrees, np.log(errors), 1)
    fitted = intercept + slope * degrees
    assert slope < -1.0                                           # at least e^-1 per degree
    assert np.max(np.abs(np.log(errors) - fitted)) < 1.0          # geometric: a straight line


@pytest.mark.parametrize("dimension", [2, 3, 4, 5])
@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_zonal_growth_rates_are_jacobian_eigenvalues(dimension, normalized, noise):
    degree = 8
    field = ZonalMeanField(4.0, dimension, degree, normalized=normalized, noise=noise)
    c0 = np.zeros(degree + 1)
    c0[0] = 1.0 / np.sqrt(sphere_area(dimension))

    def rhs(c):  # the transport of the library plus the diffusion it integrates exactly
        return field.transport(c) - field._diffusion * c

    eig = np.sort(np.linalg.eigvals(_central_jacobian(rhs, c0, 1e-6)).real)
    rates = np.sort(np.append(field.growth_rate(np.arange(1, degree + 1)), 0.0))
    assert np.max(np.abs(eig - rates)) < 1e-9 * np.max(np.abs(rates))


@pytest.mark.parametrize("beta", [0.0, 1.0, 4.0, 30.0])
def test_circle_growth_rates_are_jacobian_eigenvalues(beta):
    field = CircleMeanField(beta, 25)
    kept = field.max_wavenumber + 1
    c0 = np.fft.rfft(np.full(25, 1 / (2 * np.pi)))[:kept]
    rate, _ = field._coefficient_flow(backend_of(c0), c0)

    def rhs(v):  # real and imaginary parts of the coefficients (c_0 is real)
        out = rate(v[:kept] + 1j * np.concatenate([[0.0], v[kept:]]))
        return np.concatenate([out.real, out[1:].imag])

    v0 = np.concatenate([c0.real, c0[1:].imag])
    eig = np.sort(np.linalg.eigvals(_central_jacobian(rhs, v0, 1e-7)).real)
    k = np.arange(1, kept)
    rates = np.sort(np.concatenate([[0.0], np.repeat(linear_growth_rate(k, beta), 2)]))
    assert np.max(np.abs(eig - rates)) < 1e-10 * np.max(rates)


@pytest.mark.parametrize("normalized", [True, False])
def test_sphere_growth_rates_are_jacobian_eigenvalues(normalized):
    degree = 4
    field = SphericalMeanField(3.0, degree, normalized=normalized, noise=0.1)
    size, positive = field.l.size, field.m > 0
    a0 = np.zeros(size, dtype=complex)
    a0[0] = 1.0 / np.sqrt(4 * np.pi)

    def unpack(v):
        a = v[:size].astype(complex)
        a[positive] += 1j * v[size:]
        return a

    def rhs(v):
        out = field.transport(unpack(v)) - field._diffusion * unpack(v)
        return np.concatenate([out.real, out[positive].imag])

    v0 = np.concatenate([a0.real, a0[positive].imag])
    eig = np.sort(np.linalg.eigvals(_central_jacobian(rhs, v0, 1e-6)).real)
    l = np.arange(1, degree + 1)
    rates = np.sort(np.concatenate([[0.0], np.repeat(field.growth_rate(l), 2 * l + 1)]))
    assert np.max(np.abs(eig - rates)) < 1e-9 * np.max(np.abs(rates))


@pytest.mark.parametrize("dimension", [2, 3, 4, 5])
def test_noise_is_the_generator_nu_laplacian(dimension):
    # beta = 0, SA: X = P_x m / mass, and an even density has m = 0, so only the noise acts:
    # degree 2 decays as exp(-nu * 2 * d * t), the heat semigroup of nu * Laplacian (a
    # Brownian motion with generator nu * Laplacian: E<x(t), x(0)> = exp(-(d - 1) nu t))
    nu, t1 = 0.3, 0.7
    field = ZonalMeanField(0.0, dimension, 6, noise=nu)
    sol = field.solve(lambda s: 1.0 + 0.5 * s * s, t1=t1, dt=0.05, save_every=14)
    c = sol.coefficients
    assert np.max(np.abs(c[:, 1])) < 1e-15            # m = 0 up to the projection's rounding
    assert c[-1, 2] == pytest.approx(c[0, 2] * np.exp(-nu * 2 * dimension * t1), rel=1e-12)
    assert field.growth_rate(1) == pytest.approx((dimension - 1) / dimension - nu * (dimension - 1), rel=1e-13)


def test_zonal_mean_field_in_four_dimensions_matches_weighted_particles():
    # S^3 = {(sqrt(1 - s^2) y, s)}: Gauss-Jacobi nodes in s (weight (1 - s^2)^(1/2)) times the
    # S^2 grid in y; the weights rho0(s) q_s q_y make an exact particle solution of the equation
    d, beta = 4, 2.0

    def f(s):
        return np.exp(1.2 * s + 0.3 * s * s)

    field = ZonalMeanField(beta, d, 24)
    sol = field.solve(f, t1=0.5, dt=0.01, save_every=25)
    s, qs = special.roots_jacobi(8, 0.5, 0.5)
    grid = SphericalMeanField(beta, 6)
    y, qy = grid.points().reshape(-1, 3), grid.weights.reshape(-1)
    x0 = np.concatenate([np.sqrt(1 - s[:, None, None] ** 2) * y[None],
                         np.broadcast_to(s[:, None, None], (s.size, y.shape[0], 1))], axis=-1).reshape(-1, d)
    w = (f(s)[:, None] * qs[:, None] * qy[None]).reshape(-1)
    path = SelfAttentionDynamics(beta, weights=w).solve(x0, t1=0.5, dt=0.01, save_every=25)
    low = ZonalMeanField(beta, d, 4)
    for k in (1, 2):
        moments = empirical_density(path.positions[k], low, weights=w)
        assert np.max(np.abs(moments - sol.coefficients[k][:5])) < 2e-7 * sol.coefficients[0][0]
