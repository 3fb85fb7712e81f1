"""The fused velocity of many small particle systems and the one-pass retraction and tangent
projection (ctformer._numerics.particles) against independent float64 formulas, the BLAS
path they replace, and the thread count."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer._numerics import openmp, particles as fused
from ctformer.particles import SelfAttentionDynamics

from .conftest import require

require("numba")


def sphere(rng, shape, dtype=np.float64):
    x = rng.standard_normal(shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(dtype)


def reference_velocity(x, beta, weights, normalized):
    """P_x^perp sum_j w_j e^{beta <x_i, x_j>} x_j (/ sum_j w_j e^{beta <x_i, x_j>} for SA), float64."""
    x = x.astype(np.float64)
    g = weights * np.exp(beta * np.einsum("...id,...jd->...ij", x, x))
    a = g @ x
    if normalized:
        a /= g.sum(-1, keepdims=True)
    return a - np.sum(a * x, -1, keepdims=True) * x


@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("shape", [(300, 32, 2), (5, 17, 3), (40, 2), (7, 64, 16)])
def test_fused_velocity_is_the_sa_velocity(rng, normalized, dtype, tol, shape):
    x = sphere(rng, shape, dtype)
    n = shape[-2]
    weights = rng.uniform(0.5, 1.5, n)
    weights /= weights.sum()
    dyn = SelfAttentionDynamics(2.5, weights=weights, normalized=normalized)
    velocity = fused.fused_velocity(x, 2.5, np.log(weights), normalized)
    assert velocity is not None
    got = velocity(x)
    assert got.dtype == dtype and got.shape == x.shape
    exact = reference_velocity(x, 2.5, weights, normalized)
    assert np.abs(got - exact).max() / np.abs(exact).max() < tol
    assert np.array_equal(dyn.velocity(x), got)   # what the dynamics use for these states


@pytest.mark.parametrize("shape", [(100, 64, 16), (200, 17, 3), (300, 32, 2)])
def test_float32_key_blocks_are_as_accurate_as_blas(rng, shape):
    """Float32 states sum blocks of ``KEY_BLOCK`` keys in float32, then the blocks in float64
    (a key count that is no multiple of the block too): within 7e-7 of float64, as the BLAS
    path (2e-7 to 4e-7); float32 sums over all keys had reached 1.4e-6 at d = 16."""
    from ctformer._numerics import particle_loops

    assert particle_loops.KEY_BLOCK == 8
    x = sphere(rng, shape, np.float32)
    n = shape[-2]
    weights = rng.uniform(0.5, 1.5, n)
    weights /= weights.sum()
    got = fused.fused_velocity(x, 2.5, np.log(weights), True)(x)
    exact = reference_velocity(x, 2.5, weights, True)
    assert got.dtype == np.float32
    assert np.abs(got - exact).max() / np.abs(exact).max() < 7e-7


def test_large_systems_stay_on_blas(rng):
    assert fused.fused_velocity(sphere(rng, (4, 200, 2)), 1.0, 0.0, True) is None   # many tokens
    assert fused.fused_velocity(sphere(rng, (4, 32, 20)), 1.0, 0.0, True) is None   # d = 20
    assert fused.fused_velocity(sphere(rng, (4, 32, 2), np.float16), 1.0, 0.0, True) is None


def test_the_numpy_engine_keeps_the_formulas(rng, monkeypatch):
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    fused._kernels.cache_clear()
    try:
        x = sphere(rng, (8, 16, 2))
        assert fused.fused_velocity(x, 1.0, -np.log(16), True) is None
        assert fused.unit_rows(x) is None
        assert fused.tangent_rows(x, x) is None
        exact = reference_velocity(x, 1.0, np.full(16, 1 / 16), True)
        assert np.abs(SelfAttentionDynamics(1.0).velocity(x) - exact).max() < 1e-14
    finally:
        fused._kernels.cache_clear()


def test_fused_bits_do_not_depend_on_threads(rng, monkeypatch):
    x0 = sphere(rng, (2048, 32, 2))
    finals = []
    for count in ("1", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        finals.append(SelfAttentionDynamics(1.0).solve(x0, 1.0, 0.1, scheme="euler").final)
    assert np.array_equal(finals[0], finals[1])


@pytest.mark.parametrize("d", [3, 64, 300])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 4e-16), (np.float32, 2.5e-7)])
def test_unit_rows_is_scale_safe(rng, dtype, tol, d):
    """Rows of every length, divided by their norm directly (float32 always; float64 near 1)
    or, where the squares would overflow or underflow (float64 near its limits), by their
    largest entry first: within 2 ulp of the float64 unit vectors at every scale."""
    x = rng.standard_normal((1000, d))
    exact = x / np.linalg.norm(x, axis=-1, keepdims=True)
    tiny = np.finfo(dtype).tiny * 4
    huge = np.finfo(dtype).max / (4 * np.abs(x).max())  # every scaled entry finite
    for scale in (1.0, tiny, huge):
        got = fused.unit_rows((x * scale).astype(dtype))
        assert np.abs(got - exact).max() < tol, scale
    with np.errstate(invalid="ignore"):
        assert np.isnan(fused.unit_rows(np.zeros((2, 3)))).all()   # as the NumPy formula: no direction


@pytest.mark.parametrize("dtype, tol", [(np.float64, 2e-15), (np.float32, 2e-7)])
@pytest.mark.parametrize("shape", [(1000, 64), (7, 5, 3), (4000, 2), (30, 513)])
def test_tangent_rows_is_the_tangent_projection(rng, dtype, tol, shape):
    """v - <x, v> x in one pass equals the projector I - x x^T applied in float64 (to
    rounding, relative to the largest entry), is orthogonal to x, and is what
    ``tangent_projection`` returns for NumPy arrays; other inputs take the formula."""
    from ctformer.particles import tangent_projection

    x = sphere(rng, shape, dtype)
    v = rng.standard_normal(shape).astype(dtype)
    x64, v64 = x.astype(np.float64), v.astype(np.float64)
    projector = np.eye(shape[-1]) - x64[..., :, None] * x64[..., None, :]
    exact = np.einsum("...ij,...j->...i", projector, v64)
    got = fused.tangent_rows(x, v)
    assert got.dtype == dtype and got.shape == shape
    assert np.abs(got - exact).max() / np.abs(exact).max() < tol
    radial = np.abs(np.sum(got.astype(np.float64) * x64, axis=-1)).max()
    assert radial < 8 * tol * np.abs(exact).max() * np.sqrt(shape[-1])
    assert np.array_equal(tangent_projection(x, v), got)
    assert fused.tangent_rows(x, v[..., :-1, :]) is None                       # shapes differ
    assert fused.tangent_rows(x, v.astype(np.float16)) is None                 # dtypes differ
    assert np.abs(tangent_projection(x, v.astype(np.float16)) - exact).max() < 1e-2 * np.abs(exact).max()


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_large_state_velocity_is_the_sa_velocity(rng, dtype, tol):
    """A state of 1000 particles in R^64 (streamed attention, then the one-pass tangent
    projection) moves as the float64 formula says."""
    x = sphere(rng, (1000, 64), dtype)
    got = SelfAttentionDynamics(1.5).velocity(x)
    exact = reference_velocity(x, 1.5, np.full(1000, 1e-3), True)
    assert got.dtype == dtype
    assert np.abs(got - exact).max() / np.abs(exact).max() < tol


def _velocity_in_child(x):
    return SelfAttentionDynamics(1.0).velocity(x)


def test_openmp_blocks_match_the_pool_and_survive_a_fork(rng, monkeypatch):
    """Large batches run on Numba's OpenMP threads (where that layer exists) with the bits of
    the single-thread pass; a child forked after those threads started falls back to the pool
    instead of aborting (GNU OpenMP is not fork-safe)."""
    import multiprocessing
    import os

    import numba

    x = sphere(rng, (2048, 32, 2), np.float32)
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "1")
    one = SelfAttentionDynamics(1.0).velocity(x)
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    two = SelfAttentionDynamics(1.0).velocity(x)
    assert np.array_equal(one, two)
    exact = reference_velocity(x, 1.0, np.full(32, 1 / 32), True)
    assert np.abs(two - exact).max() / np.abs(exact).max() < 2e-6
    assert openmp._OPENMP["pid"] == os.getpid()
    assert openmp._OPENMP["usable"] == (numba.threading_layer() in ("omp", "tbb"))
    with multiprocessing.get_context("fork").Pool(1) as pool:
        child = pool.apply_async(_velocity_in_child, (x,)).get(timeout=120)
    assert np.array_equal(child, two)
