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


# -- evolve against the references -------------------------------------------------------------
RTOLS = [10.0 ** -k for k in range(3, 11)]            # 1e-3 .. 1e-10
# Step doubling controls the error per unit step of a second-order scheme: h ~ rtol^(1/2), so
# strang on this encoder takes about 2e4 steps per unit depth at rtol 1e-10 (2342 at 1e-8);
# it is measured on 1e-3 .. 1e-6.
SCHEME_RTOLS = {"bosh3": RTOLS, "dopri5": RTOLS, "tsit5": RTOLS, "strang": RTOLS[:4]}
ATOL_RATIO = 1e-3                                     # atol = 1e-3 rtol: the norm is relative


def _evolve_encoder(model, u0, **options):
    from ctformer.discretizations import Midpoint

    return model.evolve(u0, tokens=Midpoint(N_TOKENS), features=Midpoint(D_MODEL),
                        context_length=N_TOKENS, **options)


def _evolve_particles(x0, t1, **options):
    from ctformer.particles import SelfAttentionDynamics

    return SelfAttentionDynamics(beta=BETA).evolve(x0, t1, **options)


def _proportionality(final_of_rtol, reference, rtols):
    errors = []
    for rtol in rtols:
        u = np.asarray(final_of_rtol(rtol, ATOL_RATIO * rtol))
        errors.append(R.relative_error(u, reference, rtol, ATOL_RATIO * rtol))
    ratios = np.array(errors) / np.array(rtols)
    return R.loglog_slope(rtols, errors), ratios, errors


@pytest.mark.parametrize("scheme", ["bosh3", "dopri5", "tsit5", "strang"])
def test_tolerance_proportionality_on_the_encoder(encoder_case, scheme):
    """Achieved error against rtol 1e-3 .. 1e-10 (strang 1e-3 .. 1e-6) on the converted encoder: slope in [0.8, 1.2]
    and at most 10 rtol in the controller's relative norm (midpoint weights are uniform)."""
    _, model, u0, ref = encoder_case
    slope, ratios, errors = _proportionality(
        lambda r, a: _evolve_encoder(model, u0, scheme=scheme, rtol=r, atol=a).final, ref.final,
        SCHEME_RTOLS[scheme])
    assert 0.8 <= slope <= 1.2, (slope, errors)
    assert ratios.max() <= 10.0, (ratios, errors)


@pytest.mark.parametrize("scheme", ["bosh3", "dopri5", "tsit5", "strang"])
def test_tolerance_proportionality_on_particles(particle_case, scheme):
    """The same on SA particles (n = 32, d = 3, beta = 4, t in [0, 4]) against the NumPy
    velocity's DOP853 solution."""
    x0, _, states = particle_case
    slope, ratios, errors = _proportionality(
        lambda r, a: _evolve_particles(x0, T_PARTICLES, scheme=scheme, rtol=r, atol=a).final,
        states[-1], SCHEME_RTOLS[scheme])
    assert 0.8 <= slope <= 1.2, (slope, errors)
    assert ratios.max() <= 10.0, (ratios, errors)


def test_dense_output_at_random_depths(encoder_case, particle_case):
    """Solution.evaluate at 100 random depths (across the layer boundary) is within 10 rtol of
    the references' own dense output, for the encoder and for particles."""
    import ctformer

    rng = np.random.default_rng(7)
    rtol = 1e-7
    atol = ATOL_RATIO * rtol
    _, model, u0, ref = encoder_case
    sol = _evolve_encoder(model, u0, rtol=rtol, atol=atol, save_at=ctformer.SaveAt(dense=True))
    depths = rng.uniform(0.0, 2.0, 100)
    values = np.asarray(sol.evaluate(depths))
    assert values.shape == (100, N_TOKENS, D_MODEL)
    errors = [R.relative_error(v, r, rtol, atol) for v, r in zip(values, ref.at(depths))]
    assert max(errors) <= 10 * rtol, max(errors)
    x0, _, _ = particle_case
    times = np.sort(rng.uniform(0.0, T_PARTICLES, 100))
    _, exact = R.sa_reference(x0, BETA, T_PARTICLES, t_eval=times)
    sol = _evolve_particles(x0, T_PARTICLES, rtol=rtol, atol=atol,
                            save_at=ctformer.SaveAt(dense=True))
    values = np.asarray(sol.evaluate(times))
    errors = [R.relative_error(v, r, rtol, atol) for v, r in zip(values, exact)]
    assert max(errors) <= 10 * rtol, max(errors)


def test_layer_boundaries_cost_no_rejections():
    """Rejected steps on 1, 2, 4, 8 layers do not grow with the layer count (at most one more
    than on one layer), while solve_ivp on [0, 8], unaware of the boundaries, rejects many."""
    from scipy.integrate import solve_ivp
    from ctformer.bridges.torch import from_torch

    deep = R.make_encoder(layers=8, d_model=D_MODEL, heads=2, d_ff=32, seed=0)
    u0 = R.smooth_tokens(N_TOKENS, D_MODEL, seed=0)
    rtol, atol = 1e-8, 1e-11
    rejected, accepted = [], []
    for layers in (1, 2, 4, 8):
        sol = _evolve_encoder(from_torch(R.truncated(deep, layers)), u0, rtol=rtol, atol=atol)
        rejected.append(sol.stats["rejected"])
        accepted.append(sol.stats["accepted"])
        assert np.all(np.isin(np.arange(1, layers + 1), np.round(sol.stats["step_times"], 12)))
    assert all(r <= rejected[0] + 1 for r in rejected), rejected
    generic = solve_ivp(R.Counted(R.depth_rhs(deep), u0.shape), (0.0, 8.0), u0.ravel(),
                        method="RK45", rtol=rtol, atol=atol)
    assert R.scipy_rejections(generic, "RK45") > 10 * max(rejected[-1], 1), rejected


def _smooth(x, y):
    return np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def test_accepted_steps_do_not_depend_on_the_token_resolution(capsys):
    """ContinuousTransformer.random_smooth(seed=0) from a smooth u0 on GaussLegendre 8 .. 64
    tokens x Chebyshev features: accepted steps vary by at most 10% with the default (weighted)
    norm (atol = rtol: a scale atol << rtol |u| is dominated by the nodes nearest a zero of u,
    which move with n); the plain RMS counts are reported for comparison. The first step, a
    continuous function of the norm, has converged to 1e-4 from 16 to 64 tokens."""
    from ctformer import ContinuousTransformer
    from ctformer.discretizations import Chebyshev, GaussLegendre
    from ctformer.solvers import PIController

    model = ContinuousTransformer.random_smooth(seed=0)
    counts, first = {"l2": [], "rms": []}, {"l2": [], "rms": []}
    for n in (8, 16, 32, 64):
        for norm in counts:
            sol = model.evolve(_smooth, tokens=GaussLegendre(n), features=Chebyshev(9),
                               controller=PIController(1e-8, 1e-8, norm=norm))
            counts[norm].append(sol.stats["accepted"])
            first[norm].append(sol.stats["initial_step"])
    spread = {k: (max(v) - min(v)) / min(v) for k, v in counts.items()}
    drift = {k: abs(v[-1] / v[1] - 1) for k, v in first.items()}      # 16 -> 64 tokens
    with capsys.disabled():
        print(f"\naccepted steps on GaussLegendre 8/16/32/64 tokens: weighted {counts['l2']} "
              f"(spread {spread['l2']:.1%}), rms {counts['rms']} (spread {spread['rms']:.1%}); "
              f"first step 16 -> 64 tokens: weighted {drift['l2']:.2e}, rms {drift['rms']:.2e}")
    assert spread["l2"] <= 0.10, counts
    assert drift["l2"] < 1e-4, first          # the weighted norm has converged in n


def test_cluster_formation_event_time_matches_solve_ivp():
    """The first time the diameter of SA particles in a cap drops below 0.5: ctformer's event
    against solve_ivp's event location at rtol 1e-12, |difference| <= 1e-8."""
    import ctformer

    x0 = R.cap_points(32, 3, seed=0)
    expected, _ = R.cluster_time(x0, BETA, 0.5, 20.0)
    event = ctformer.Event(lambda t, x: R.diameter(np.asarray(x)) - 0.5, terminal=True,
                           direction=-1)
    sol = _evolve_particles(x0, 20.0, rtol=1e-11, atol=1e-13, events=(event,))
    assert sol.event_time is not None and abs(sol.event_time - expected) <= 1e-8, \
        (sol.event_time, expected)
    assert abs(R.diameter(np.asarray(sol.event_state)) - 0.5) < 1e-8


def test_the_docs_page_runs():
    """The Python blocks of docs/adaptive_depth.rst run in order and their asserts hold."""
    from .test_docs_pages import python_blocks

    blocks = python_blocks("adaptive_depth.rst")
    assert len(blocks) >= 4
    namespace = {}
    for block in blocks:
        exec(compile(block, "docs/adaptive_depth.rst", "exec"), namespace)
