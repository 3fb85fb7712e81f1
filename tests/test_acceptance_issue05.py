"""Acceptance of issue 5 (tokens as particles; the mean field on the circle), called as the issue writes.

Items already asserted elsewhere are not repeated here: the orthogonal start against the scalar
ODE (test_particles.py::test_orthogonal_start_follows_scalar_ode), the causal mask
(::test_causal_mask_first_token_fixed_and_all_converge_to_it), energy growth and the single
cluster (::test_energy_never_decreases, ::test_clusters_to_single_point_with_maximal_energy), the
time orders (test_particles_core.py::test_particle_order_is_the_scheme_order), particles at
quantiles against the mean field (test_meanfield.py::test_particles_converge_to_mean_field) and
the refusals (test_particles.py::test_errors, test_meanfield.py::test_errors).
"""
import math

import numpy as np
import pytest
from scipy import special, stats

from ctformer.particles import (CircleMeanField, SelfAttentionDynamics, attention_matrix, attention_rank,
                                cluster_count, energy, gram, in_open_hemisphere, inner_product_histogram,
                                row_entropy)


def sphere_points(rng, *shape):
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def usa_velocity(x, beta, w):
    """(USA) with Q = K = V = I: P_x^perp sum_j w_j e^{beta <x_i, x_j>} x_j, written out."""
    drive = (w[None, :] * np.exp(beta * x @ x.T)) @ x
    return drive - np.sum(drive * x, axis=1, keepdims=True) * x


def test_usa_token_weights_default_to_one_over_n():
    """Issue 5: "token weights default to 1/n" (USA depends on their scale, not only their ratios)."""
    rng = np.random.default_rng(5)
    x = sphere_points(rng, 7, 4)
    got = SelfAttentionDynamics(1.5, normalized=False).velocity(x)
    np.testing.assert_allclose(got, usa_velocity(x, 1.5, np.full(7, 1 / 7)), rtol=1e-13, atol=1e-15)
    explicit = SelfAttentionDynamics(1.5, normalized=False, weights=np.full(7, 1 / 7)).velocity(x)
    np.testing.assert_allclose(got, explicit, rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("scheme", ["euler", "heun", "rk4"])
def test_solve_as_written_returns_times_and_positions(scheme):
    """Issue 5: "solve(x0, t1, dt, scheme="rk4", save_every=1) ... x0 shaped (n, d) or (batch, n, d)
    ... returns a trajectory with .times and .positions ... float64 by default"."""
    rng = np.random.default_rng(0)
    x0 = sphere_points(rng, 3, 5, 3)
    dyn = SelfAttentionDynamics(2.0, Q=None, K=None, V=None, normalized=True, mask=None, weights=None)
    batch = dyn.solve(x0, t1=1.0, dt=0.1, scheme=scheme, save_every=4)
    np.testing.assert_allclose(batch.times, [0.0, 0.4, 0.8, 1.0], rtol=0, atol=1e-15)
    assert batch.positions.shape == (4, 3, 5, 3) and batch.positions.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(batch.positions, axis=-1), 1.0, rtol=0, atol=1e-15)
    single = dyn.solve(x0[1].tolist(), 1.0, 0.1, scheme=scheme, save_every=4)  # a list is float64 too
    assert single.positions.dtype == np.float64
    np.testing.assert_allclose(single.positions, batch.positions[:, 1], rtol=0, atol=1e-14)


def test_energy_as_written_against_the_double_sum():
    """Issue 5: "energy(x, beta, weights=None) (E_beta = 1/(2 beta) sum_ij w_i w_j exp(beta <x_i, x_j>))"."""
    rng = np.random.default_rng(1)
    x = sphere_points(rng, 6, 3)
    w = rng.random(6) + 0.1
    direct = sum(w[i] * w[j] * math.exp(2.5 * float(x[i] @ x[j])) for i in range(6) for j in range(6)) / 5.0
    assert energy(x, 2.5, weights=w) == pytest.approx(direct, rel=1e-13)
    uniform = sum(math.exp(2.5 * float(x[i] @ x[j])) for i in range(6) for j in range(6)) / 36 / 5.0
    assert energy(x, 2.5) == pytest.approx(uniform, rel=1e-13)


def test_diagnostics_as_written_against_numpy_and_scipy():
    """Issue 5: "gram(x), inner_product_histogram(x, bins), cluster_count(x, tol), in_open_hemisphere(x),
    attention_matrix(x, ...) with its rank and row entropy"."""
    rng = np.random.default_rng(2)
    x = sphere_points(rng, 8, 3)
    np.testing.assert_allclose(gram(x), x @ x.T, rtol=0, atol=1e-15)
    counts, edges = inner_product_histogram(x, 10)
    expected, _ = np.histogram((x @ x.T)[np.triu_indices(8, 1)], bins=10, range=(-1.0, 1.0))
    np.testing.assert_array_equal(counts, expected)  # the n(n-1)/2 = 28 distinct pairs
    np.testing.assert_allclose(edges, np.linspace(-1, 1, 11), atol=1e-15)
    centres = sphere_points(rng, 3, 3)
    clusters = np.repeat(centres, 4, axis=0) + 1e-9 * rng.standard_normal((12, 3))
    assert cluster_count(clusters / np.linalg.norm(clusters, axis=1, keepdims=True), 1e-6) == 3
    assert in_open_hemisphere(np.abs(x)) and not in_open_hemisphere(np.vstack([x[:1], -x[:1]]))
    a = attention_matrix(x, 3.0)
    reference = special.softmax(3.0 * x @ x.T, axis=1)
    np.testing.assert_allclose(a, reference, rtol=1e-13, atol=1e-16)
    assert attention_rank(a) == np.linalg.matrix_rank(reference) == 8
    np.testing.assert_allclose(row_entropy(a), stats.entropy(reference, axis=1), rtol=1e-12)


def test_circle_solution_as_written():
    """Issue 5: "solve(rho0, t1, dt, save_every=1) where rho0 is a callable of the angle or grid values;
    ... .times, .grid (angles, uniform on [0, 2 pi)) and .density (one row per saved time, the last at t1)
    and conserves mass to rounding"."""
    mf = CircleMeanField(4.0, 48, normalized=True)
    rho0 = lambda theta: np.exp(np.cos(theta - 0.7)) / (2 * np.pi * special.iv(0, 1.0))  # noqa: E731
    sol = mf.solve(rho0, t1=1.3, dt=0.05, save_every=10)
    np.testing.assert_allclose(sol.grid, 2 * np.pi * np.arange(48) / 48, rtol=0, atol=1e-15)
    np.testing.assert_allclose(sol.times, [0.0, 0.5, 1.0, 1.3], rtol=0, atol=1e-15)
    assert sol.density.shape == (4, 48)
    # int e^{cos t} dt = 2 pi I_0(1): mass one, kept to rounding at every saved time
    np.testing.assert_allclose(sol.density.mean(axis=1) * 2 * np.pi, 1.0, rtol=1e-14)
    from_values = mf.solve(rho0(sol.grid), 1.3, 0.05, save_every=10)
    np.testing.assert_allclose(from_values.density, sol.density, rtol=0, atol=1e-15)


@pytest.mark.parametrize("beta", [1.0, 5.0, 9.0])
def test_circle_growth_rate_measured_in_solves(beta):
    """Issue 5: "a small perturbation eps cos(k theta) of the uniform density grows at the rate
    k^2 I_k(beta) / (beta I_0(beta)) for SA (to 1% for several k and beta)" (measured in a solve)."""
    mf = CircleMeanField(beta, 64)
    theta = mf.grid
    t1 = 0.4
    for k in (1, 2, 3, 5):
        sol = mf.solve((1 + 1e-6 * np.cos(k * theta)) / (2 * np.pi), t1, 0.01)
        amplitude = [abs(np.fft.rfft(d)[k]) for d in sol.density[[0, -1]]]
        measured = math.log(amplitude[1] / amplitude[0]) / t1
        reference = k**2 * special.iv(k, beta) / (beta * special.iv(0, beta))
        assert measured == pytest.approx(reference, rel=1e-2)
        # what the solve achieves, far inside 1%: the step error and rounding over 1e-6
        assert measured == pytest.approx(reference, rel=1e-6, abs=1e-8)
