"""Particles and the circle mean field, audited against independent references.

* single_cluster_distance took sqrt(2 (1 - |m|)): 0.0 for a true distance of 1.09e-9 (40-digit
  mpmath), and 0.0 for points off the sphere whose distance is 1.685.
* Diagnostics and log_partition cast weights to the points' dtype: integer points made the
  weights 1/n zero (energy refused them, single_cluster_distance gave NaN) and 1.5 into 1.
* log_partition returned NaN for a mask row without keys and 'math domain error' for no keys.
* USA in float16 was accepted up to log Z = 700 (float64's bound): NaN velocities at beta = 30.
* linear_growth_rate refused beta = 0, where the mean field runs and its mode 1 grows at 1/2.
* A mean-field restart re-checked the saved density as a new rho0 and refused rounding dips.
* in_open_hemisphere compared s* of the raw rows with tol: points 1e-12 long were "in no open
  hemisphere".
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from ctformer.particles import (CircleMeanField, SelfAttentionDynamics, cluster_count, energy,
                                in_open_hemisphere, linear_growth_rate, log_partition,
                                single_cluster_distance)
from ctformer.particles.minilm import layer_statistics

from .conftest import require


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _distance_in_40_digits(x):
    """min_z (mean_i |x_i - z|^2)^{1/2} = (mean |x_i|^2 - 2 |m| + 1)^{1/2} for the stored floats."""
    mpmath = require("mpmath")
    mpmath.mp.dps = 40
    rows = [[mpmath.mpf(float(v)) for v in row] for row in x]
    n = len(rows)
    m = [sum(r[k] for r in rows) / n for k in range(len(rows[0]))]
    squares = sum(sum(v * v for v in r) for r in rows) / n
    return float(mpmath.sqrt(squares - 2 * mpmath.sqrt(sum(c * c for c in m)) + 1))


@pytest.mark.parametrize("spread", [1e-3, 1e-6, 1e-9])
def test_single_cluster_distance_resolves_tight_clusters(rng, spread):
    """Before: 0.0 at spread 1e-9 (true 1.09e-9), 6e-5 relative error at 1e-6; now 1e-10."""
    x = _unit(_unit(rng.standard_normal(3)) + spread * rng.standard_normal((10, 3)))
    reference = _distance_in_40_digits(x)
    assert reference > 0.5 * spread
    assert single_cluster_distance(x) == pytest.approx(reference, rel=1e-10)


def test_single_cluster_distance_off_the_sphere():
    """Points (3, 0), (0, 1): m = (1.5, 0.5), distance sqrt(5 - 2 sqrt(2.5) + 1) = 1.685 (was 0)."""
    x = np.array([[3.0, 0.0], [0.0, 1.0]])
    assert single_cluster_distance(x) == pytest.approx(math.sqrt(6 - 2 * math.sqrt(2.5)), rel=1e-15)
    assert _distance_in_40_digits(x) == pytest.approx(math.sqrt(6 - 2 * math.sqrt(2.5)), rel=1e-15)
    # antipodal pair: m = 0, every z is nearest, distance sqrt(2)
    assert single_cluster_distance(np.array([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(math.sqrt(2), rel=1e-15)


def test_diagnostics_take_integer_points():
    """Before: energy refused the integer points ('weights must be positive'), gave an
    AttributeError with weights, single_cluster_distance gave NaN (0.714 with weights 1.5, 2.5
    read as 1, 2); now the closed forms."""
    x = np.array([[1, 0], [0, 1]])
    w = [1.5, 2.5]
    assert energy(x, 1.0) == pytest.approx((math.e + 1) / 4, rel=1e-15)
    assert energy(x, 1.0, weights=w) == pytest.approx(0.5 * (8.5 * math.e + 7.5), rel=1e-15)
    assert single_cluster_distance(x) == pytest.approx(math.sqrt(2 - math.sqrt(2)), rel=1e-15)
    assert single_cluster_distance(x, weights=w) == pytest.approx(math.sqrt(2 * (1 - math.sqrt(34) / 8)),
                                                                  rel=1e-15)
    np.testing.assert_allclose(log_partition(x, x, beta=1.0, weights=w),
                               np.log([1.5 * math.e + 2.5, 1.5 + 2.5 * math.e]), rtol=1e-15)


def test_diagnostics_refuse_empty_and_complex_points():
    with pytest.raises(ValueError, match=r"n >= 1 points of dimension d >= 1, got shape \(0, 3\)"):
        energy(np.zeros((0, 3)), 1.0)  # ZeroDivisionError before
    with pytest.raises(ValueError, match="n >= 1 points"):
        cluster_count(np.zeros((0, 3)), 0.1)  # 1 cluster of no points before
    with pytest.raises(TypeError, match="x must be real"):
        energy(np.array([[1 + 1j, 0.0], [0.0, 1.0]]), 1.0)  # a ComplexWarning and a number before


def test_log_partition_needs_keys_in_every_row():
    x = np.eye(2)
    with pytest.raises(ValueError, match="mask removes every key for some query row"):
        log_partition(x, x, beta=1.0, mask=np.array([[True, False], [False, False]]))  # NaN before
    with pytest.raises(ValueError, match="mask must be None, 'causal' or a boolean array, got dtype float64"):
        log_partition(x, x, beta=1.0, mask=np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"k must hold at least one key"):
        log_partition(x, np.zeros((0, 2)), beta=1.0)  # 'math domain error' before


def _usa_loop(x, beta):
    """USA velocity by a plain float64 loop: P_{x_i}(sum_j e^{beta <x_i, x_j>} x_j / n)."""
    n = len(x)
    out = np.zeros_like(x)
    for i in range(n):
        a = sum(math.exp(beta * float(x[i] @ x[j])) * x[j] for j in range(n)) / n
        out[i] = a - (x[i] @ a) * x[i]
    return out


def test_usa_in_float16_is_bounded_by_its_range():
    """Before: beta = 30 accepted in float16 (bound 700), velocities NaN; now OverflowError. Within
    the bound (9) the float16 velocity is the float64 loop's to float16 accuracy."""
    x = np.array([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6]])
    with pytest.raises(OverflowError, match=r"beyond the float16 range \(log bound 9.0\)"):
        SelfAttentionDynamics(30.0, normalized=False).velocity(x.astype(np.float16))
    for beta in (8.9, -8.9):
        got = SelfAttentionDynamics(beta, normalized=False).velocity(x.astype(np.float16))
        reference = _usa_loop(x, beta)
        assert got.dtype == np.float16 and np.all(np.isfinite(got))
        assert np.max(np.abs(got - reference)) < 0.03 * np.max(np.abs(reference))


def test_usa_is_the_gradient_of_the_energy_by_autograd(rng):
    """dx_i/dt = grad_{x_i} E_beta / w_i projected on the tangent space, E_beta =
    (1/2beta) sum_ij w_i w_j e^{beta <x_i, x_j>} differentiated by torch in float64 (any sign)."""
    torch = require("torch")
    x = _unit(rng.standard_normal((12, 3)))
    w = rng.uniform(0.1, 1.0, 12)
    for beta in (2.0, -1.5):
        xt = torch.tensor(x, requires_grad=True)
        wt = torch.tensor(w)
        e = (wt[:, None] * wt[None, :] * torch.exp(beta * xt @ xt.T)).sum() / (2 * beta)
        (grad,) = torch.autograd.grad(e, xt)
        g = grad.numpy() / w[:, None]
        g -= np.sum(g * x, axis=1, keepdims=True) * x
        velocity = SelfAttentionDynamics(beta, normalized=False, weights=w).velocity(x)
        np.testing.assert_allclose(velocity, g, rtol=0, atol=1e-14 * np.max(np.abs(g)))


def test_cluster_count_is_single_linkage_of_scipy(rng):
    """Connected components at distance <= tol against scipy.cluster.hierarchy (single, fcluster)."""
    for _ in range(50):
        n, d = rng.integers(2, 30), rng.integers(2, 5)
        centres = rng.standard_normal((rng.integers(1, 5), d))
        x = _unit(centres[rng.integers(0, len(centres), n)] + 0.1 * rng.standard_normal((n, d)))
        tol = rng.uniform(0.02, 0.8)
        labels = fcluster(linkage(pdist(x), "single"), t=tol, criterion="distance")
        assert cluster_count(x, tol) == len(set(labels))


def test_growth_rate_at_beta_zero_is_the_measured_one():
    """Before: ValueError at beta = 0; now 1/2 for k = 1, 0 otherwise: X = -(eps/2) sin(theta) for
    rho = (1 + eps cos theta)/(2 pi), measured on CircleMeanField(0) to 1e-10."""
    np.testing.assert_array_equal(linear_growth_rate(np.arange(4), 0.0), [0.0, 0.5, 0.0, 0.0])
    np.testing.assert_array_equal(linear_growth_rate(np.arange(4), 0.0, normalized=False), [0.0, 0.5, 0.0, 0.0])
    field, eps, t = CircleMeanField(0.0, 24), 1e-8, 0.2
    for k in (1, 2):
        c = np.asarray(field.solve(lambda th: (1 + eps * np.cos(k * th)) / (2 * np.pi), t, 0.01).coefficients)
        assert abs(c[-1, k]) / abs(c[0, k]) == pytest.approx(math.exp(linear_growth_rate(k, 0.0) * t), rel=1e-10)
    with pytest.raises(OverflowError, match=r"exp\(\|beta\|\) = exp\(710.0\), beyond the float64 range"):
        linear_growth_rate(2, 710.0, normalized=False)  # a bare 'math range error' before


def test_mean_field_restart_from_a_density_touching_zero():
    """rho0 = (1 + cos theta)/(2 pi) vanishes at pi; the saved density at t = 0.1 dips to -5e-16 by
    rounding. Before: the restart refused it as a negative rho0; now it continues the
    uninterrupted solve bit for bit."""
    field = CircleMeanField(1.0, 64)
    rho = lambda th: (1 + np.cos(th)) / (2 * np.pi)  # noqa: E731
    first = field.evolve(rho, 0.1, dt=0.01)
    assert np.min(np.fft.irfft(np.asarray(first.states)[-1], n=64)) < 0
    rest = field.evolve(None, 0.3, dt=0.01, initial=first)
    whole = field.evolve(rho, 0.3, dt=0.01)
    np.testing.assert_array_equal(np.asarray(rest.states)[-1], np.asarray(whole.states)[-1])
    with pytest.raises(ValueError, match="initial must end in the 11 finite coefficients of a solve with n_modes=32"):
        CircleMeanField(1.0, 32).evolve(None, 0.3, dt=0.01, initial=first)


def test_shape_arguments_are_checked():
    x = np.eye(3)[None]
    with pytest.raises(ValueError, match=r"needs batch >= 1 systems, got shape \(0, 3, 3\)"):
        SelfAttentionDynamics(1.0).solve(np.zeros((0, 3, 3)), 1.0, 0.1)  # a NumPy reduction error before
    with pytest.raises(ValueError, match="depths must give one depth per layer: 3 layers, got 2"):
        layer_statistics(np.concatenate([x, x, x]), depths=[0, 1])  # two layers silently before


def test_open_hemisphere_depends_on_directions_only(rng):
    """On the circle: inside an open half-circle iff the largest gap between angles exceeds pi.
    Before: rows of length 1e-12 always gave False (s* <= 1e-12 < tol); now the gap answer."""
    for _ in range(20):
        angles = np.sort(rng.uniform(0, 2 * np.pi, rng.integers(2, 8)))
        gaps = np.diff(np.concatenate([angles, angles[:1] + 2 * np.pi]))
        x = np.stack([np.cos(angles), np.sin(angles)], axis=1)
        for scale in (1e-12, 1.0, 1e12):
            assert in_open_hemisphere(scale * x) == bool(np.max(gaps) > np.pi)
    assert not in_open_hemisphere(np.array([[1.0, 0.0], [0.0, 0.0]]))  # a zero row: no open hemisphere


@pytest.mark.parametrize("name, bound", [("float16", 5e-3), ("bfloat16", 5e-2)])
def test_half_precision_torch_states_solve_in_their_dtype(name, bound):
    """A torch bfloat16 state failed with "data type 'bfloat16' not understood" (NumPy has no
    bfloat16; its limits now come from torch.finfo). Reference: the float64 solve; bound: ten
    Euler steps of rounding at the dtype's eps (float16 9.8e-4, bfloat16 7.8e-3)."""
    torch = require("torch")
    x = torch.nn.functional.normalize(torch.randn(8, 3, dtype=torch.float64,
                                                  generator=torch.Generator().manual_seed(0)), dim=-1)
    dynamics = SelfAttentionDynamics(beta=1.0)
    exact = dynamics.solve(x, 1.0, 0.1).positions
    half = dynamics.solve(x.to(getattr(torch, name)), 1.0, 0.1).positions
    assert half.dtype == getattr(torch, name)
    assert float((half.double() - exact).abs().max()) < bound


def test_shape_messages_name_the_argument_given():
    """Before: solve's x0 of the wrong rank was reported as "x must have shape ..."."""
    with pytest.raises(ValueError, match=r"^x0 must have shape \(n, d\) or \(batch, n, d\), got shape \(3,\)"):
        SelfAttentionDynamics(1.0).solve(np.ones(3) / np.sqrt(3.0), 1.0, 0.1)
    with pytest.raises(ValueError, match=r"^x must have shape \(n, d\) or \(batch, n, d\), got shape \(3,\)"):
        SelfAttentionDynamics(1.0).velocity(np.ones(3) / np.sqrt(3.0))
