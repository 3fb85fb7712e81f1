"""The one time loop: Solution, SaveAt, events, step doubling, jump times and refusals.

References: the matrix exponential for linear problems u' = A u (scipy.linalg.expm), closed
forms of event times, and ``model.solve`` with fixed steps for the fixed path.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from scipy.linalg import expm

import ctformer
from ctformer import Event, SaveAt, solvers
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.solvers import Piecewise, PIController, SplitProblem

from .conftest import require

RNG = np.random.default_rng(3)
A = RNG.standard_normal((6, 6)) / 3 - 0.3 * np.eye(6)
B = RNG.standard_normal((6, 6)) / 3
U0 = RNG.standard_normal((6, 4))


def _linear(*matrices):
    """Layers u' = M_l u: the exact solution is the product of exponentials."""
    problems = [SplitProblem([lambda u, M=M: M @ u]) for M in matrices]
    exact = U0
    for M in matrices:
        exact = expm(M) @ exact
    return Piecewise.layers(problems), exact


def _split_linear(M1, M2):
    """One layer u' = M1 u + M2 u as two sub-flows (for the splitting schemes)."""
    return Piecewise.layers([SplitProblem([lambda u: M1 @ u, lambda u: M2 @ u])]), expm(M1 + M2) @ U0


def _relative(error, reference, rtol, atol):
    """The error relative to the tolerance, normwise: ||e|| / (atol + rtol ||u||) (RMS norms)."""
    size = float(np.sqrt(np.mean(reference ** 2)))
    return float(np.sqrt(np.mean(error ** 2))) / (atol + rtol * size)


# -- tolerance proportionality with embedded pairs and step doubling ---------------------------
@pytest.mark.parametrize("name", ["bosh3", "dopri5", "tsit5", "lie", "strang", "parallel",
                                  "euler", "heun", "rk4"])
def test_achieved_error_follows_the_tolerance(name):
    problem, exact = _split_linear(A, B) if name in ("lie", "strang", "parallel") else _linear(A, B)
    rtols = [1e-2, 3e-3, 1e-3, 3e-4] if name in ("lie", "euler", "parallel") else \
        [1e-4, 1e-5, 1e-6, 1e-7, 1e-8]
    errors = []
    for rtol in rtols:
        control = PIController(rtol=rtol, atol=rtol * 1e-3)
        sol = solvers.integrate(problem, U0, control, scheme=solvers.get(name))
        errors.append(_relative(sol.final - exact, exact, rtol, rtol * 1e-3) * rtol)
        assert errors[-1] <= 10 * rtol, (name, rtol, errors[-1])
    slope = np.polyfit(np.log(rtols), np.log(errors), 1)[0]
    assert 0.75 <= slope <= 1.25, (name, slope, errors)


def test_step_doubling_estimate_is_richardsons():
    # one step of size h against two of h/2, divided by 2^p - 1: for heun (p = 2) on u' = A u
    # the estimate matches the true error of the finer value to O(h^4)
    problem, _ = _linear(A)
    scheme = solvers.get("heun")
    stepper = solvers.steppers.stepper_for(scheme)
    for h in (0.1, 0.05):
        fine, per_unit_step, _, _ = stepper.attempt(problem.problems[0], U0, h)
        estimate = h * per_unit_step
        true = expm(h * A) @ U0 - fine
        assert np.abs(estimate - true).max() <= 2 * h ** 4 * np.abs(U0).max()
        assert np.abs(estimate).max() > 10 * np.abs(estimate - true).max()


# -- jump times -----------------------------------------------------------------------------------
def test_no_step_crosses_a_layer_boundary():
    problem, exact = _linear(A, -B, 2 * A, B)
    sol = solvers.integrate(problem, U0, PIController(rtol=1e-8, atol=1e-11),
                            scheme=solvers.get("tsit5"), save_at=SaveAt(layers=True))
    ends = sol.stats["step_times"]
    for layer in range(1, 5):
        assert layer in set(ends.tolist())
    assert np.all(np.diff(ends) > 0) and ends[-1] == 4.0
    np.testing.assert_array_equal(sol.times, [0, 1, 2, 3, 4])
    assert _relative(sol.final - exact, exact, 1e-8, 1e-11) <= 10


# -- saved states, dense output ------------------------------------------------------------------
def test_dense_output_and_save_times_match_the_exponential():
    problem, _ = _linear(A)
    times = np.sort(RNG.uniform(0, 1, 25))
    rtol = 1e-8
    sol = solvers.integrate(problem, U0, PIController(rtol=rtol, atol=1e-12),
                            scheme=solvers.get("tsit5"), save_at=SaveAt(times=times, dense=True))
    np.testing.assert_array_equal(sol.times, times)
    for t, state, dense in zip(times, sol.states, sol.evaluate(times)):
        exact = expm(t * A) @ U0
        assert _relative(state - exact, exact, rtol, 1e-12) <= 10
        np.testing.assert_allclose(dense, state, rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="solved interval"):
        sol.evaluate(1.5)


def test_save_at_steps_keeps_every_accepted_step():
    problem, _ = _linear(A, B)
    sol = solvers.integrate(problem, U0, PIController(rtol=1e-6), scheme=solvers.get("bosh3"),
                            save_at=SaveAt(steps=True))
    np.testing.assert_array_equal(sol.times[1:], sol.stats["step_times"])
    assert sol.times[0] == 0 and len(sol.states) == sol.stats["accepted"] + 1
    with pytest.raises(ValueError, match="no dense output"):
        sol.evaluate(0.5)


# -- events -------------------------------------------------------------------------------------
def test_terminal_event_located_on_the_dense_output():
    # u' = -u, u(0) = 1: u = 1/2 at t = ln 2
    problem = Piecewise.single(SplitProblem([lambda u: -u]), 5.0)
    event = Event(lambda t, u: float(u[0, 0]) - 0.5, direction=-1)
    sol = solvers.integrate(problem, np.ones((1, 1)), PIController(rtol=1e-10, atol=1e-13),
                            scheme=solvers.get("dopri5"), events=[event])
    assert abs(sol.event_time - math.log(2)) <= 1e-10
    assert abs(float(sol.final[0, 0]) - 0.5) <= 1e-10 and sol.times[-1] == sol.event_time
    # in the other direction it does not fire
    sol = solvers.integrate(problem, np.ones((1, 1)), PIController(rtol=1e-8),
                            scheme=solvers.get("tsit5"),
                            events=[Event(lambda t, u: float(u[0, 0]) - 0.5, direction=1)])
    assert sol.event_time is None and sol.times[-1] == 5.0


def test_event_with_fixed_steps_and_non_terminal():
    problem = Piecewise.single(SplitProblem([lambda u: -u]), 2.0)
    sol = solvers.integrate(problem, np.ones((1, 1)), 400, scheme=solvers.get("rk4"),
                            events=[Event(lambda t, u: float(u[0, 0]) - 0.5, terminal=False)])
    # Hermite interpolation between rk4 steps of 1/200: error O(h^4)
    assert abs(sol.event_time - math.log(2)) <= 1e-9 and sol.times[-1] == 2.0


def test_event_condition_must_return_a_scalar():
    problem = Piecewise.single(SplitProblem([lambda u: -u]), 1.0)
    with pytest.raises(ValueError, match=r"events\[0\]: condition\(t, u\) must return a real scalar"):
        solvers.integrate(problem, np.ones((2, 2)), PIController(), scheme=solvers.get("tsit5"),
                          events=[Event(lambda t, u: u)])
    with pytest.raises(TypeError, match="condition must be a callable"):
        Event(3.0)


# -- refusals --------------------------------------------------------------------------------------
MODEL = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2)
GRIDS = dict(tokens=GaussLegendre(8), features=GaussLegendre(6))


def _u0(x, y):
    return np.cos(3 * y + np.sin(np.pi * x))


@pytest.mark.parametrize("rtol, atol, match", [(-1e-6, 1e-9, "rtol"), (float("nan"), 1e-9, "rtol"),
                                               (1e-6, -1.0, "atol"), (0.0, 0.0, "both zero")])
def test_bad_tolerances_are_refused_by_name(rtol, atol, match):
    with pytest.raises(ValueError, match=match):
        MODEL.evolve(_u0, rtol=rtol, atol=atol, **GRIDS)


def test_max_steps_reached_keeps_the_solution():
    with pytest.raises(solvers.MaxStepsReached, match=r"max_steps=3 .* reached at t=") as info:
        MODEL.evolve(_u0, rtol=1e-10, max_steps=3, **GRIDS)
    sol = info.value.solution
    assert isinstance(sol, ctformer.Solution) and sol.stats["accepted"] + sol.stats["rejected"] == 3
    assert 0 < sol.stats["step_times"][-1] < 2


def test_step_size_underflow_is_refused():
    # u' = u^2 blows up at t = 1 for u(0) = 1: the step shrinks to dt_min before t = 1
    problem = Piecewise.single(SplitProblem([lambda u: u * u]), 2.0)
    with pytest.raises(solvers.StepSizeTooSmall, match="fell below dt_min") as info:
        solvers.integrate(problem, np.ones((1, 1)), PIController(rtol=1e-8, dt_min=1e-9),
                          scheme=solvers.get("tsit5"))
    assert abs(info.value.solution.stats["step_times"][-1] - 1.0) < 1e-3


def test_tolerances_refused_without_a_depth_limit():
    post = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2, placement="post")
    assert post.warns_inconsistent_depth
    with pytest.raises(ValueError, match="no continuous-depth limit|has none"):
        post.evolve(_u0, **GRIDS)
    # fixed steps are still allowed (with the warning of solve)
    sol = post.evolve(_u0, steps_per_layer=1, scheme="lie", **GRIDS)
    np.testing.assert_array_equal(post._readout(sol, False),
                                  post.solve(_u0, scheme="lie", **GRIDS))


def test_controller_that_contradicts_the_tolerances():
    with pytest.raises(ValueError, match="rtol=0.001 contradicts"):
        MODEL.evolve(_u0, rtol=1e-3, controller=PIController(rtol=1e-5), **GRIDS)


# -- the model ----------------------------------------------------------------------------------
def test_fixed_steps_are_the_solve_bit_for_bit():
    for scheme, k in (("lie", 1), ("strang", 3), ("tsit5", 2)):
        sol = MODEL.evolve(_u0, scheme=scheme, steps_per_layer=k, save_at=SaveAt(layers=True),
                           **GRIDS)
        path = MODEL.solve(_u0, scheme=scheme, steps_per_layer=k, trajectory=True, **GRIDS)
        for state, reference in zip(sol.states[:-1], path[:-1]):
            np.testing.assert_array_equal(state, reference)
        np.testing.assert_array_equal(MODEL._readout(sol, False), path[-1])
        assert sol.stats["accepted"] == 2 * k


def test_solve_with_tolerances_is_the_evolve_final():
    reference = MODEL.solve(_u0, scheme="rk4", steps_per_layer=64, **GRIDS)
    fast = MODEL.solve(_u0, scheme="tsit5", rtol=1e-9, atol=1e-12, **GRIDS)
    assert np.abs(fast - reference).max() <= 1e-8 * np.abs(reference).max()
    with pytest.raises(ValueError, match="choose fixed steps or error control"):
        MODEL.solve(_u0, rtol=1e-6, steps_per_layer=2, **GRIDS)


def test_discrete_limit_grids_with_midpoint_rules():
    x = RNG.standard_normal((5, 6))
    sol = MODEL.evolve(x, tokens=Midpoint(5), features=Midpoint(6), scheme="lie", steps_per_layer=1,
                       context_length=5)
    np.testing.assert_array_equal(MODEL._readout(sol, False), MODEL.run(x))


@functools.lru_cache(maxsize=1)
def _fine_gradient(torch):
    """The exact gradient of sum(u(T)^2) for a fine rk4 solve (its error ~1e-10 at 128 steps)."""
    from ctformer import adjoint

    u0 = torch.tensor(np.cos(np.arange(48.0).reshape(8, 6) / 7), dtype=torch.float64)
    return adjoint.gradient(MODEL, u0, lambda u: (u ** 2).sum(), scheme="rk4",
                            steps_per_layer=128, route="autograd", **GRIDS)


def test_torch_evolve_is_differentiable():
    torch = require("torch")
    u0 = torch.tensor(np.cos(np.arange(48.0).reshape(8, 6) / 7), dtype=torch.float64,
                      requires_grad=True)
    adaptive = MODEL._readout(MODEL.evolve(u0, rtol=1e-10, atol=1e-13, **GRIDS),
                              False).square().sum()
    (g_adaptive,) = torch.autograd.grad(adaptive, u0)
    g_fixed = _fine_gradient(torch)
    # step sizes are constants of the graph: the gradient is that of the adaptive solve's map,
    # which approximates the exact gradient within the tolerance
    assert float((g_adaptive - g_fixed).abs().max()) <= 1e-8 * float(g_fixed.abs().max())


def test_adjoint_gradient_with_tolerances():
    torch = require("torch")
    from ctformer import adjoint

    u0 = torch.tensor(np.cos(np.arange(48.0).reshape(8, 6) / 7), dtype=torch.float64)

    def loss(u):
        return (u ** 2).sum()

    reference = _fine_gradient(torch)
    scale = float(reference.abs().max())
    for rtol in (1e-5, 1e-7):
        for route in ("adjoint", "autograd"):
            g = adjoint.gradient(MODEL, u0, loss, scheme="tsit5", rtol=rtol, atol=rtol * 1e-3,
                                 route=route, **GRIDS)
            assert float((g - reference).abs().max()) <= 10 * rtol * scale, (route, rtol)
    with pytest.raises(ValueError, match="choose fixed steps or error control"):
        adjoint.gradient(MODEL, u0, loss, rtol=1e-6, steps_per_layer=4, **GRIDS)


def test_work_precision_study_refines_the_tolerance():
    from ctformer.studies import work_precision

    rtols = (1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
    study = work_precision(MODEL, _u0, tokens=GaussLegendre(12), features=GaussLegendre(8),
                           schemes=("bosh3", "strang"), rtols=rtols)
    for scheme in ("bosh3", "strang (heun)"):
        levels = study.of(scheme)
        assert [lv.rtol for lv in levels] == list(rtols)
        assert all(lv.error <= 10 * lv.rtol for lv in levels)
        evaluations = [lv.rhs_evaluations for lv in levels]
        assert evaluations == sorted(evaluations) and evaluations[-1] > 3 * evaluations[0]
        assert 0.7 <= study.slope(scheme) <= 1.25, (scheme, study.table())
    require("xarray")
    ds = study.to_xarray()
    assert ds["error"].dims == ("scheme", "rtol")
    np.testing.assert_array_equal(ds["error"].sel(scheme="bosh3").values,
                                  [lv.error for lv in study.of("bosh3")])


def test_a_retraction_keeps_the_nominal_order():
    # particles: the retraction onto the sphere moves a step by its local error only
    # (observed orders in test_particles_core); a post-norm projection lowers every order to 1
    from ctformer.particles import SelfAttentionDynamics

    problem = SelfAttentionDynamics(beta=1.0).problem(np.eye(3))
    assert problem.has_projections and problem.retraction
    assert solvers.get("rk4").order(problem) == 4.0 and solvers.get("tsit5").order(problem) == 5.0
    post = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=1, placement="post")
    assert solvers.get("rk4").order(post) == 1.0
