"""Self-attention particle dynamics on the sphere against the theorems of Geshkovski et al. (2025).

Independent references: a direct NumPy/scipy evaluation of the (SA)/(USA) velocity (explicit
score matrices, ``scipy.special.softmax``), ``scipy.integrate.solve_ivp`` for exact
trajectories and for the scalar ODE of the orthogonal start, closed forms for the energy.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.special import logsumexp, softmax

from ctformer.particles import SelfAttentionDynamics, energy, single_cluster_distance


def sphere_points(rng, *shape):
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def reference_velocity(x, beta, heads, weights=None, normalized=True, causal=False):
    """Direct evaluation of the velocity: explicit scores and scipy's softmax / logsumexp."""
    n, d = x.shape
    w = np.full(n, 1.0 / n) if weights is None else np.asarray(weights)
    total = np.zeros_like(x)
    for Q, K, V in heads:
        scores = beta * (x @ Q.T) @ (x @ K.T).T + np.log(w)[None, :]
        if causal:
            scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
        attn = softmax(scores, axis=1)
        out = attn @ (x @ V.T)
        if not normalized:
            out = np.exp(logsumexp(scores, axis=1))[:, None] * out
        total += out
    return total - np.sum(total * x, axis=1, keepdims=True) * x


def exact_solution(x0, t1, beta, heads, **kw):
    """The exact flow by DOP853 at rtol 1e-13 (the ambient ODE keeps the sphere invariant)."""
    shape = x0.shape
    sol = solve_ivp(lambda t, y: reference_velocity(y.reshape(shape), beta, heads, **kw).ravel(),
                    (0.0, t1), x0.ravel(), method="DOP853", rtol=1e-13, atol=1e-14)
    return sol.y[:, -1].reshape(shape)


# -- the vector field -------------------------------------------------------------------------
@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_velocity_matches_direct_evaluation(rng, normalized, causal):
    n, d = 9, 4
    x = sphere_points(rng, n, d)
    Q1, K1 = rng.standard_normal((3, d)), rng.standard_normal((3, d))
    V1 = rng.standard_normal((d, d))
    w = rng.random(n) + 0.2
    dyn = SelfAttentionDynamics(1.7, Q=[Q1, None], K=[K1, None], V=[V1, None], normalized=normalized,
                                weights=w, mask="causal" if causal else None)
    eye = np.eye(d)
    ref = reference_velocity(x, 1.7, [(Q1, K1, V1), (eye, eye, eye)], weights=w,
                             normalized=normalized, causal=causal)
    np.testing.assert_allclose(dyn.velocity(x), ref, rtol=1e-12, atol=1e-13)


def test_velocity_is_tangent_and_stable_at_large_beta(rng):
    x = sphere_points(rng, 20, 3)
    dyn = SelfAttentionDynamics(1e3)
    v = dyn.velocity(x)
    eye = np.eye(3)
    np.testing.assert_allclose(v, reference_velocity(x, 1e3, [(eye, eye, eye)]), atol=1e-12)
    np.testing.assert_allclose(np.sum(v * x, axis=1), 0.0, atol=1e-14)
    path = dyn.solve(x, 2.0, 0.01)
    assert np.all(np.isfinite(path.positions))
    np.testing.assert_allclose(np.linalg.norm(path.positions, axis=-1), 1.0, atol=1e-14)


def test_usa_refuses_overflowing_beta(rng):
    x = sphere_points(rng, 5, 3)
    with pytest.raises(OverflowError, match="USA"):
        SelfAttentionDynamics(1e3, normalized=False).velocity(x)
    # just inside the documented range the velocity is finite (of size e^beta)
    v = SelfAttentionDynamics(690.0, normalized=False).velocity(x)
    assert np.all(np.isfinite(v))


# -- energy: gradient ascent and monotonicity --------------------------------------------------
def test_usa_is_gradient_ascent_of_the_energy(rng):
    """dE/dt = sum_i w_i |dx_i/dt|^2 for USA with Q = K = V = I (gradient flow, metric w)."""
    beta, n, d, h = 2.0, 8, 3, 1e-3
    w = rng.random(n) + 0.5
    w /= w.sum()
    x = sphere_points(rng, n, d)
    dyn = SelfAttentionDynamics(beta, normalized=False, weights=w)
    path = dyn.solve(x, 2 * h, h)
    mid = path.positions[1]
    rate = (energy(path.positions[2], beta, w) - energy(path.positions[0], beta, w)) / (2 * h)
    v = reference_velocity(mid, beta, [(np.eye(d),) * 3], weights=w, normalized=False)
    assert rate == pytest.approx(np.sum(w * np.sum(v * v, axis=1)), rel=1e-6)


def test_sa_energy_rate_formula(rng):
    """For SA, dE/dt = sum_i w_i Z_i |dx_i/dt|^2 with Z_i = sum_j w_j e^{beta <x_i, x_j>}."""
    beta, n, d, h = 3.0, 7, 4, 1e-3
    x = sphere_points(rng, n, d)
    path = SelfAttentionDynamics(beta).solve(x, 2 * h, h)
    mid = path.positions[1]
    rate = (energy(path.positions[2], beta) - energy(path.positions[0], beta)) / (2 * h)
    v = reference_velocity(mid, beta, [(np.eye(d),) * 3])
    z = np.mean(np.exp(beta * mid @ mid.T), axis=1)
    assert rate == pytest.approx(np.sum(z * np.sum(v * v, axis=1)) / n, rel=1e-6)


@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("beta", [1.0, 4.0])
def test_energy_never_decreases(rng, normalized, beta):
    x0 = sphere_points(rng, 6, 12, 3)  # six independent draws at once
    # USA moves e^beta times faster: a smaller step keeps explicit RK4 stable
    t1, dt = (8.0, 0.05) if normalized else (2.0, 0.01)
    path = SelfAttentionDynamics(beta, normalized=normalized).solve(x0, t1, dt)
    e = np.stack([energy(p, beta) for p in path.positions])  # (T, batch)
    assert np.all(np.diff(e, axis=0) >= -1e-13 * e[1:])
    assert np.all(e[-1] > e[0])


def test_clusters_to_single_point_with_maximal_energy(rng):
    """d >= 3: almost every start collapses to one point, where E = e^beta / (2 beta)."""
    beta = 1.0
    x0 = sphere_points(rng, 10, 3)
    path = SelfAttentionDynamics(beta).solve(x0, 40.0, 0.1, save_every=400)
    assert single_cluster_distance(path.final) < 1e-6
    assert energy(path.final, beta) == pytest.approx(math.exp(beta) / (2 * beta), rel=1e-10)
    assert energy(np.tile(x0[:1], (10, 1)), beta) == pytest.approx(math.exp(beta) / (2 * beta), rel=1e-14)


# -- orthogonal start: the exact scalar ODE -----------------------------------------------------
@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("beta", [1.0, 3.0])
def test_orthogonal_start_follows_scalar_ode(normalized, beta):
    """x_i(0) = e_i, n = d: every <x_i, x_j> equals gamma(t) (Geshkovski et al.), at 13 times."""
    n = 5

    def rhs(t, g):
        common = np.exp(beta * g) * (1 - g) * ((n - 1) * g + 1)
        if normalized:
            return 2 * common / (np.exp(beta) + (n - 1) * np.exp(beta * g))
        return (2.0 / n) * common

    times = np.linspace(0.0, 3.0, 13)
    gamma = solve_ivp(rhs, (0.0, 3.0), [0.0], method="DOP853", t_eval=times, rtol=1e-12, atol=1e-14).y[0]
    dt = 0.05 if normalized else 0.01  # USA is e^beta times faster near the cluster
    path = SelfAttentionDynamics(beta, normalized=normalized).solve(np.eye(n), 3.0, dt, scheme="rk4",
                                                                     save_every=round(0.25 / dt))
    np.testing.assert_allclose(path.times, times, atol=1e-14)
    off_diagonal = ~np.eye(n, dtype=bool)
    for x, g in zip(path.positions, gamma):
        np.testing.assert_allclose((x @ x.T)[off_diagonal], g, atol=1e-6)
    assert np.any((gamma > 0.2) & (gamma < 0.8))  # the check covers the transient, not only the fixed point


# -- causal mask -------------------------------------------------------------------------------
def test_causal_mask_first_token_fixed_and_all_converge_to_it(rng):
    x0 = sphere_points(rng, 6, 3)
    x0[0] = [0.0, 0.0, 1.0]  # a coordinate vector: every operation on it is exact
    dyn = SelfAttentionDynamics(1.0, mask="causal")
    path = dyn.solve(x0, 60.0, 0.1, save_every=50)
    assert np.all(path.positions[:, 0] == x0[0])  # exactly
    assert np.max(np.linalg.norm(path.final - x0[0], axis=1)) < 1e-4

    y0 = sphere_points(rng, 6, 3)  # a generic first token moves only by rounding
    drift = dyn.solve(y0, 5.0, 0.1).positions[:, 0] - y0[0]
    assert np.max(np.abs(drift)) < 1e-14


# -- time discretization ------------------------------------------------------------------------
def test_batch_equals_separate_solves(rng):
    x0 = sphere_points(rng, 3, 5, 4)
    dyn = SelfAttentionDynamics(2.0, normalized=False, mask="causal")
    batch = dyn.solve(x0, 1.0, 0.1, save_every=3)
    for b in range(3):
        single = dyn.solve(x0[b], 1.0, 0.1, save_every=3)
        np.testing.assert_allclose(batch.positions[:, b], single.positions, rtol=0, atol=1e-14)
    np.testing.assert_allclose(batch.times, [0.0, 0.3, 0.6, 0.9, 1.0], atol=1e-15)


def test_last_step_lands_on_t1(rng):
    x0 = sphere_points(rng, 4, 3)
    path = SelfAttentionDynamics(1.0).solve(x0, 1.0, 0.3)  # 4 steps of 0.25
    np.testing.assert_allclose(path.times, [0.0, 0.25, 0.5, 0.75, 1.0], atol=1e-15)


# -- bad input -----------------------------------------------------------------------------------
def test_errors(rng):
    x = sphere_points(rng, 4, 3)
    with pytest.raises(ValueError, match="beta must be finite"):
        SelfAttentionDynamics(float("inf"))
    with pytest.raises(ValueError, match="beta must be finite"):
        SelfAttentionDynamics(float("nan"))
    with pytest.raises(ValueError, match="not on the unit sphere"):
        SelfAttentionDynamics(1.0).solve(2 * x, 1.0, 0.1)
    path = SelfAttentionDynamics(1.0).solve(2 * x, 0.1, 0.1, normalize=True)
    np.testing.assert_allclose(path.positions[0], x, atol=1e-15)
    with pytest.raises(ValueError, match=r"Q\[0\].*3 columns"):
        SelfAttentionDynamics(1.0, Q=np.eye(4), K=np.eye(4)).solve(x, 1.0, 0.1)
    with pytest.raises(ValueError, match=r"V\[0\] must be square"):
        SelfAttentionDynamics(1.0, V=np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"same number of rows"):
        SelfAttentionDynamics(1.0, Q=np.ones((2, 3)), K=np.ones((3, 3)))
    with pytest.raises(ValueError, match="same positive length"):
        SelfAttentionDynamics(1.0, Q=[np.eye(3)], K=[np.eye(3), np.eye(3)])
    with pytest.raises(ValueError, match="weights has length"):
        SelfAttentionDynamics(1.0, weights=np.ones(5)).solve(x, 1.0, 0.1)
    with pytest.raises(ValueError, match="positive"):
        SelfAttentionDynamics(1.0, weights=-np.ones(4))
    with pytest.raises(ValueError, match="mask"):
        SelfAttentionDynamics(1.0, mask="banded")
    with pytest.raises(ValueError, match="scheme"):
        SelfAttentionDynamics(1.0).solve(x, 1.0, 0.1, scheme="rk2")
    with pytest.raises(ValueError, match="shape"):
        SelfAttentionDynamics(1.0).solve(x[0], 1.0, 0.1)
    with pytest.raises(ValueError, match="dt"):
        SelfAttentionDynamics(1.0).solve(x, 1.0, 0.0)
    with pytest.raises(ValueError, match="NaN"):
        SelfAttentionDynamics(1.0).solve(np.full((4, 3), np.nan), 1.0, 0.1)


def test_boolean_mask_array_equals_causal(rng):
    x0 = sphere_points(rng, 2, 5, 3)
    tril = np.tril(np.ones((5, 5), dtype=bool))
    for normalized in (True, False):
        a = SelfAttentionDynamics(2.0, normalized=normalized, mask="causal").solve(x0, 1.0, 0.1)
        b = SelfAttentionDynamics(2.0, normalized=normalized, mask=tril).solve(x0, 1.0, 0.1)
        np.testing.assert_allclose(a.positions, b.positions, rtol=0, atol=1e-15)


@pytest.mark.cupy
def test_cupy_matches_numpy(rng):
    import cupy

    x0 = sphere_points(rng, 3, 16, 4)
    w = rng.random(16) + 0.1
    for normalized in (True, False):
        dyn = SelfAttentionDynamics(2.0, Q=rng.standard_normal((4, 4)), normalized=normalized, weights=w)
        host = dyn.solve(x0, 1.0, 0.05)
        device = dyn.solve(cupy.asarray(x0), 1.0, 0.05)
        assert isinstance(device.positions, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(device.positions), host.positions, atol=1e-12)
