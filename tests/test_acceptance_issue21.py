"""Acceptance of issue 21 (error-controlled depth) where no earlier test asserts it.

References: closed forms (event depths of conditions in t, u' = -u, the blow-up of u' = u^2 at
t = 1), the theorem that a weighted RMS with equal weights is the plain RMS, and the issue's
own signature and defaults.
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import ctformer
from ctformer import Event, SaveAt, solvers
from ctformer.particles import SelfAttentionDynamics
from ctformer.solvers import Piecewise, PIController, SplitProblem

from .conftest import require

DECAY = Piecewise.single(SplitProblem([lambda u: -u]), 1.0)   # u' = -u on [0, 1]
ONE = np.ones((1, 1))


def _in_t(centre, half_gap, **options):
    """An event whose condition depends on t only: roots at centre -/+ half_gap exactly."""
    return Event(lambda t, u: (t - centre) ** 2 - half_gap ** 2, terminal=False, **options)


def _fixed(event, steps=4):
    return solvers.integrate(DECAY, ONE, steps, scheme=solvers.get("rk4"), events=[event])


def test_an_event_fires_where_the_sign_changes_between_step_ends():
    """Issue 21: "a sign change is located on the dense output to 1e-10 in t": (t - 0.5)^2 -
    1e-6 with fixed steps of 0.25 changes sign across the step end 0.5, so both roots fire."""
    sol = _fixed(_in_t(0.5, 1e-3))
    np.testing.assert_allclose(sol.t_events[0], [0.499, 0.501], rtol=0, atol=1e-10)


def test_a_root_pair_inside_one_step_is_missed_as_documented():
    """The documented limit: no sign change between a step's ends, no occurrence. (t - 0.4)^2 -
    1e-6 has both roots inside the fixed step [0.25, 0.5], and inside one controlled step."""
    assert _fixed(_in_t(0.4, 1e-3)).stats["events"] == []
    sol = solvers.integrate(DECAY, ONE, PIController(rtol=1e-6, atol=1e-9),
                            scheme=solvers.get("tsit5"), events=[_in_t(0.4, 1e-3)])
    ends = sol.stats["step_times"]
    assert not np.any((ends > 0.399) & (ends < 0.401))       # no step end between the roots
    assert sol.stats["events"] == [] and sol.event_time is None


def test_samples_inside_a_step_find_a_root_pair_farther_apart_than_their_spacing():
    """``Event(samples=m)``: the condition also at m depths inside each step, so two crossings
    more than h/(m+1) apart are found; closer ones are still missed, as documented."""
    sol = _fixed(_in_t(0.4, 1e-2, samples=24))                  # spacing 0.01 < gap 0.02
    np.testing.assert_allclose(sol.t_events[0], [0.39, 0.41], rtol=0, atol=1e-10)
    # roots 0.404, 0.406: no sample (0.26, 0.27, ..., 0.49) between them
    assert _fixed(_in_t(0.405, 1e-3, samples=24)).stats["events"] == []
    # on the dense output of controlled steps: u = e^{-t} crosses e^{-0.4} -/+ 0.01
    level, gap = math.exp(-0.4), 0.01
    event = Event(lambda t, u: (float(u[0, 0]) - level) ** 2 - gap ** 2, terminal=False,
                  samples=50)
    sol = solvers.integrate(DECAY, ONE, PIController(rtol=1e-10, atol=1e-12),
                            scheme=solvers.get("tsit5"), events=[event])
    exact = [-math.log(level + gap), -math.log(level - gap)]
    np.testing.assert_allclose(sol.t_events[0], exact, rtol=0, atol=1e-9)


@pytest.mark.parametrize("samples", [-1, 1.5, "3"])
def test_bad_samples_are_refused_by_name(samples):
    with pytest.raises(ValueError, match="Event: samples must be a count m >= 0"):
        Event(lambda t, u: 0.0, samples=samples)


def test_the_default_smallest_step_is_1e_14_times_the_depth():
    """Issue 21: "Bad input gets a clear error ...: a step underflowing 1e-14 T". u' = u^2,
    u(0) = 1 blows up at t = 1; on [0, 2] the default dt_min is 2e-14."""
    problem = Piecewise.single(SplitProblem([lambda u: u * u]), 2.0)
    with pytest.raises(solvers.StepSizeTooSmall, match=r"fell below dt_min=2e-14 at t=1") as info:
        solvers.integrate(problem, ONE, PIController(rtol=1e-8), scheme=solvers.get("tsit5"))
    assert abs(info.value.solution.stats["step_times"][-1] - 1.0) < 1e-6


def _sphere_points(n, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_particles_weigh_one_over_n_so_both_norms_take_the_same_steps():
    """Issue 21: "the weighted RMS with the grids' quadrature weights ... weight 1/n per particle
    for particles": equal weights make it the plain RMS (norm="rms"), step for step."""
    x0 = _sphere_points(12, 3, seed=1)
    dynamics = SelfAttentionDynamics(beta=2.0)
    l2 = dynamics.evolve(x0, 3.0, controller=PIController(rtol=1e-7, atol=1e-9))
    rms = dynamics.evolve(x0, 3.0, controller=PIController(rtol=1e-7, atol=1e-9, norm="rms"))
    assert l2.stats["accepted"] == rms.stats["accepted"] > 3
    np.testing.assert_allclose(l2.stats["step_times"], rms.stats["step_times"], rtol=1e-12)


def test_the_issues_signature_defaults_and_solution_fields():
    """Issue 21: "model.evolve(u0, *, tokens, features, head_features=None, hidden=None,
    scheme="tsit5", rtol=1e-6, atol=1e-9, steps_per_layer=None, save_at=None, events=(),
    max_steps=100_000, padding_mask=None, context_length=None)", "(default: the final state
    only)", "Event(condition, terminal=True, direction=0)", "PIController(rtol=1e-6,
    atol=1e-9, ...)"."""
    params = inspect.signature(ctformer.ContinuousTransformer.evolve).parameters
    issue = dict(head_features=None, hidden=None, scheme="tsit5", rtol=1e-6, atol=1e-9,
                 steps_per_layer=None, save_at=None, events=(), max_steps=100_000,
                 padding_mask=None, context_length=None)
    assert {k: params[k].default for k in issue} == issue
    event = Event(lambda t, u: 1.0)
    assert event.terminal is True and event.direction == 0
    control = PIController()
    assert (control.rtol, control.atol) == (1e-6, 1e-9)
    sol = SelfAttentionDynamics(beta=1.0).evolve(_sphere_points(6, 3, seed=2), 1.5)
    assert isinstance(sol, ctformer.Solution) and list(sol.times) == [1.5]
    assert sol.states.shape == (1, 6, 3) and np.array_equal(sol.states[0], sol.final)
    assert sol.event_time is None and sol.event_state is None
    assert {"accepted", "rejected", "rhs_evaluations", "step_times"} <= set(sol.stats)


def test_states_keep_the_namespace_and_dtype_of_u0():
    """Issue 21: "`.states` (stacked, in u0's namespace, device and dtype)": float32 torch
    particles, against the float64 NumPy solve to float32's tolerance."""
    require("torch")
    import torch

    x0 = _sphere_points(6, 3, seed=3)
    dynamics = SelfAttentionDynamics(beta=1.0)
    save = SaveAt(times=[0.5, 1.0])
    sol = dynamics.evolve(torch.tensor(x0, dtype=torch.float32), 1.0, rtol=1e-5, atol=1e-7,
                          save_at=save)
    ref = dynamics.evolve(x0, 1.0, rtol=1e-10, atol=1e-12, save_at=save)
    assert isinstance(sol.states, torch.Tensor) and sol.states.dtype == torch.float32
    assert tuple(sol.states.shape) == (2, 6, 3) and sol.final.dtype == torch.float32
    assert np.abs(sol.states.numpy() - ref.states).max() < 1e-4
