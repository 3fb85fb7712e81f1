"""Error-controlled depth against references independent of ctformer (tests/depth_reference.py):
solve_ivp DOP853 at rtol 1e-13, layer by layer, on the right-hand side written from a pre-norm
torch TransformerEncoder's own submodules, and a NumPy self-attention particle velocity.

First the references are validated against what existed before adaptive depth (the converted
module's discrete forward pass, fixed-step rk4 and its order); then evolve is measured against
them.
"""
from __future__ import annotations

import numpy as np
import pytest

from . import depth_reference as R
from .conftest import fitted_order, require

N_TOKENS, D_MODEL = 8, 16
BETA, T_PARTICLES = 4.0, 4.0


@pytest.fixture(scope="module")
def encoder_case():
    require("torch")
    from ctformer.bridges.torch import from_torch

    encoder = R.make_encoder(layers=2, d_model=D_MODEL, heads=2, d_ff=32, seed=0)
    u0 = R.smooth_tokens(N_TOKENS, D_MODEL, seed=0)
    return encoder, from_torch(encoder), u0, R.layerwise_reference(encoder, u0)


@pytest.fixture(scope="module")
def particle_case():
    x0 = R.sphere_points(32, 3, seed=0)
    times = np.linspace(0.0, T_PARTICLES, 9)
    _, states = R.sa_reference(x0, BETA, T_PARTICLES, t_eval=times)
    return x0, times, states


def _solve_encoder(model, u0, **options):
    from ctformer.discretizations import Midpoint

    return model.solve(u0, tokens=Midpoint(N_TOKENS), features=Midpoint(D_MODEL),
                       context_length=N_TOKENS, **options)


# -- the references themselves -------------------------------------------------------------------
def test_converted_encoder_is_the_module(encoder_case):
    """The converter's discrete limit (lie, one step per layer) is the torch forward pass, so the
    continuous model and the reference's right-hand side come from the same weights."""
    import torch

    encoder, model, u0, _ = encoder_case
    with torch.no_grad():
        expected = encoder(torch.from_numpy(u0)[None])[0].numpy()
    assert np.abs(model.run(u0) - expected).max() < 1e-13


def test_encoder_reference_agrees_with_fixed_step_rk4(encoder_case):
    """rk4 on ctformer's continuous model converges to the torch-written DOP853 reference with
    order 4, to 1e-9 at 64 steps per layer: the two right-hand sides are the same function."""
    _, model, u0, ref = encoder_case
    steps = [8, 16, 32, 64]
    errors = [np.abs(_solve_encoder(model, u0, scheme="rk4", steps_per_layer=k) - ref.final).max()
              for k in steps]
    assert errors[-1] < 1e-9, errors
    assert abs(fitted_order(1.0 / np.array(steps), errors) - 4.0) < 0.3, errors
    assert np.abs(ref.final - u0).max() > 0.5          # the network moves the state


def test_encoder_reference_dense_output_and_layer_boundaries(encoder_case):
    """The reference's dense output hits its own layer-boundary states, and at mid-layer depths
    it agrees with rk4 at 64 steps per layer on the layer boundaries' trajectory."""
    _, model, u0, ref = encoder_case
    assert np.abs(ref.at(np.array([0.0, 1.0, 2.0])) - ref.boundaries).max() < 1e-12
    trajectory = _solve_encoder(model, u0, scheme="rk4", steps_per_layer=64, trajectory=True)
    assert np.abs(np.stack(trajectory) - ref.boundaries).max() < 1e-9


def test_particle_velocity_and_reference(particle_case):
    """The NumPy velocity equals SelfAttentionDynamics' to rounding; rk4 converges to the DOP853
    reference with order 4 (1e-8 at dt = 1/64)."""
    from ctformer.particles import SelfAttentionDynamics

    x0, times, states = particle_case
    dynamics = SelfAttentionDynamics(beta=BETA)
    assert np.abs(dynamics.velocity(states[3]) - R.sa_velocity(states[3], BETA)).max() < 1e-14
    dts = [1 / 8, 1 / 16, 1 / 32, 1 / 64]
    errors = [np.abs(dynamics.solve(x0, T_PARTICLES, dt, scheme="rk4").final - states[-1]).max()
              for dt in dts]
    assert errors[-1] < 1e-8, errors
    assert abs(fitted_order(dts, errors) - 4.0) < 0.3, errors
    assert np.abs(np.linalg.norm(states, axis=-1) - 1).max() < 1e-11   # the flow stays on S^2


def test_cluster_event_reference_is_located():
    """solve_ivp's event: the diameter equals the threshold there, the crossing is downward, and
    tightening its tolerance moves the time by less than 1e-10."""
    x0 = R.cap_points(32, 3, seed=0)
    t_event, x_event = R.cluster_time(x0, BETA, 0.5, 20.0)
    assert abs(R.diameter(x_event) - 0.5) < 1e-12
    assert R.diameter(x0) > 1.5 and 1.0 < t_event < 10.0
    _, around = R.sa_reference(x0, BETA, t_event + 1e-4, t_eval=[t_event - 1e-4, t_event + 1e-4])
    assert R.diameter(around[0]) > 0.5 > R.diameter(around[1])
    tighter, _ = R.cluster_time(x0, BETA, 0.5, 20.0, rtol=1e-13, atol=1e-15)
    assert abs(tighter - t_event) < 1e-10


def test_scipy_rejection_count_is_consistent():
    """The rejections read from solve_ivp's counts: none on one smooth layer, and many on [0, 4]
    for a solver that does not know where the layers end (the comparison of the benchmark)."""
    require("torch")
    from scipy.integrate import solve_ivp

    encoder = R.make_encoder(layers=4, d_model=D_MODEL, heads=2, d_ff=32, seed=0)
    u0 = R.smooth_tokens(N_TOKENS, D_MODEL, seed=0)
    rejected = []
    for layers in (1, 4):
        f = R.Counted(R.depth_rhs(R.truncated(encoder, layers)), u0.shape)
        sol = solve_ivp(f, (0.0, float(layers)), u0.ravel(), method="RK45", rtol=1e-8, atol=1e-10)
        assert sol.nfev == f.calls
        rejected.append(R.scipy_rejections(sol, "RK45"))
    assert rejected[0] == 0 and rejected[1] > 10, rejected
