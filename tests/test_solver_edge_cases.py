"""Edge cases of the one time loop: events sharing a step, save times on step ends, bad fixed-step
controls, a purely relative tolerance on zero entries, restarts by another scheme, dense output
after a terminal event.

References: closed forms (u' = 1 gives u = t, u' = -u gives exp(-t)), the matrix exponential
(scipy.linalg.expm) and a DOP853 reference at rtol 1e-13 (tests/depth_reference.py).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import expm

import ctformer
from ctformer import Event, SaveAt, solvers
from ctformer.discretizations import GaussLegendre
from ctformer.particles import SelfAttentionDynamics
from ctformer.solvers import Piecewise, PIController, SplitProblem

from . import depth_reference as R

CLOCK = Piecewise.single(SplitProblem([lambda u: np.ones_like(u)]), 1.0)  # u = t exactly
DECAY = Piecewise.single(SplitProblem([lambda u: -u]), 1.0)               # u = exp(-t)
ZERO = np.zeros((1, 1))


def _at(value):
    return Event(lambda t, u: float(u[0, 0]) - value, terminal=False)


# -- events ----------------------------------------------------------------------------------------
def test_events_in_one_step_are_ordered_and_none_follows_a_terminal_one():
    # one rk4 step over [0, 1] holds both crossings: u = t crosses 0.3 and 0.7 inside it
    sol = solvers.integrate(CLOCK, ZERO, 1, scheme=solvers.get("rk4"),
                            events=[_at(0.7), _at(0.3)])
    assert sol.event_index == 1 and abs(sol.event_time - 0.3) <= 1e-12    # the first in depth
    assert [i for i, _ in sol.stats["events"]] == [1, 0]
    np.testing.assert_allclose([t for _, t in sol.stats["events"]], [0.3, 0.7], rtol=0, atol=1e-12)
    # a terminal event at 0.3 ends the solve: the crossing at 0.7 never happens
    sol = solvers.integrate(CLOCK, ZERO, 1, scheme=solvers.get("rk4"),
                            events=[_at(0.7), Event(lambda t, u: float(u[0, 0]) - 0.3)])
    assert [i for i, _ in sol.stats["events"]] == [1]
    assert abs(sol.event_time - 0.3) <= 1e-12 and abs(float(sol.final[0, 0]) - 0.3) <= 1e-12


def test_dense_output_ends_at_a_terminal_event():
    event = Event(lambda t, u: float(u[0, 0]) - 0.5, direction=-1)   # exp(-t) = 1/2 at ln 2
    sol = solvers.integrate(DECAY, np.ones((1, 1)), PIController(rtol=1e-10, atol=1e-13),
                            scheme=solvers.get("tsit5"), events=[event],
                            save_at=SaveAt(dense=True))
    assert abs(sol.event_time - math.log(2)) <= 1e-10
    assert abs(float(sol.evaluate(0.5)[0, 0]) - math.exp(-0.5)) <= 1e-10
    assert abs(float(sol.evaluate(sol.event_time)[0, 0]) - 0.5) <= 1e-10
    with pytest.raises(ValueError, match="solved interval"):
        sol.evaluate(0.5 * (sol.event_time + sol.records[-1].t0 + sol.records[-1].h))


# -- saved states ----------------------------------------------------------------------------------
def test_save_times_on_step_ends_are_kept_once():
    sol = solvers.integrate(DECAY, np.ones((1, 1)), 4, scheme=solvers.get("rk4"),
                            save_at=SaveAt(times=[0.0, 0.5, 0.6, 1.0], steps=True))
    np.testing.assert_array_equal(sol.times, [0.0, 0.25, 0.5, 0.6, 0.75, 1.0])
    # at step ends rk4's stability function R(-h)^n exactly, between them within the method's error
    r = sum((-0.25) ** j / math.factorial(j) for j in range(5))
    ends = [0, 1, 2, 4, 5]
    np.testing.assert_allclose(sol.states[ends, 0, 0], r ** np.array([0, 1, 2, 3, 4]), rtol=1e-14)
    assert abs(sol.states[3, 0, 0] - math.exp(-0.6)) <= 3e-5
    # layers of an error-controlled solve: u' = A u then u' = -A u, back to u0 at depth 2
    A = np.array([[0.0, 1.0], [-1.0, 0.0]])
    problem = Piecewise.layers([SplitProblem([lambda u: A @ u]), SplitProblem([lambda u: -A @ u])])
    u0 = np.eye(2)
    sol = solvers.integrate(problem, u0, PIController(rtol=1e-10, atol=1e-12),
                            scheme=solvers.get("tsit5"),
                            save_at=SaveAt(times=[0.0, 0.5, 1.0, 2.0], layers=True))
    np.testing.assert_array_equal(sol.times, [0.0, 0.5, 1.0, 2.0])
    for t, state, exact in zip(sol.times, sol.states, [u0, expm(0.5 * A), expm(A), u0]):
        np.testing.assert_allclose(state, exact, rtol=0, atol=1e-9, err_msg=str(t))
    # a save time at a terminal event's depth: one state there
    sol = solvers.integrate(CLOCK, ZERO, 4, scheme=solvers.get("rk4"),
                            events=[Event(lambda t, u: float(u[0, 0]) - 0.3)],
                            save_at=SaveAt(times=[0.1, 0.3, 0.4], steps=True))
    np.testing.assert_allclose(sol.times, [0.0, 0.1, 0.25, 0.3], rtol=0, atol=1e-15)
    np.testing.assert_allclose(sol.states[:, 0, 0], sol.times, rtol=0, atol=1e-14)


# -- refusals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("control", [0, -1, 2.5, "4", True, None, (3, 0.5), (2, -0.5)])
def test_bad_fixed_step_controls_are_refused_by_name(control):
    with pytest.raises(ValueError, match="control"):
        solvers.integrate(CLOCK, ZERO, control, scheme=solvers.get("rk4"))


def test_fixed_step_controls_that_fit_the_interval():
    for control in (2, (2, 0.5), np.int64(2)):
        sol = solvers.integrate(CLOCK, ZERO, control, scheme=solvers.get("rk4"),
                                save_at=SaveAt(steps=True))
        np.testing.assert_array_equal(sol.times, [0.0, 0.5, 1.0])
        np.testing.assert_allclose(sol.states[:, 0, 0], [0.0, 0.5, 1.0], rtol=0, atol=1e-15)


@pytest.mark.parametrize("t1", [math.inf, math.nan])
def test_non_finite_intervals_are_refused(t1):
    with pytest.raises(ValueError, match="finite"):
        Piecewise.single(SplitProblem([lambda u: -u]), t1)
    with pytest.raises(ValueError, match="boundaries must be finite"):
        Piecewise((0.0, 1.0, t1), (SplitProblem([lambda u: -u]),) * 2)


# -- a purely relative tolerance ---------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["tsit5", "rk4", "bosh3"])
def test_atol_zero_with_zero_entries(scheme):
    # an entry that stays 0 (0/0 in the scaled error) and one that starts at 0 and moves
    z0 = np.array([[1.0], [0.0]])
    for rhs, exact in [(lambda u: np.diag([-1.0, 0.0]) @ u, [math.exp(-1), 0.0]),
                       (lambda u: np.array([[-u[0, 0]], [1.0]]), [math.exp(-1), 1.0])]:
        sol = solvers.integrate(Piecewise.single(SplitProblem([rhs]), 1.0), z0,
                                PIController(rtol=1e-8, atol=0.0), scheme=solvers.get(scheme))
        assert np.abs(sol.final.ravel() - exact).max() <= 1e-7, (scheme, sol.final)
        assert 0 < sol.stats["initial_step"] <= 1 and sol.stats["rejected"] <= 3


def test_atol_zero_norm_and_particles_in_a_plane():
    e = np.array([0.0, 1e-9])
    u = np.array([0.0, 1.0])
    assert solvers.rms(e, u, u, 1e-6, 0.0) == pytest.approx(1e-3 / math.sqrt(2), rel=1e-12)
    with np.errstate(divide="ignore"):
        assert solvers.rms(np.array([1e-9, 0.0]), u, u, 1e-6, 0.0) == math.inf
    # particles on a great circle of S^2: the third coordinate is 0 throughout
    x0 = np.zeros((6, 3))
    x0[:, 0], x0[:, 1] = np.linspace(-1, 1, 6), np.cos(np.arange(6.0))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    sol = SelfAttentionDynamics(beta=1.0).evolve(x0, 1.0, rtol=1e-9, atol=0.0)
    _, reference = R.sa_reference(x0, 1.0, 1.0)
    assert np.abs(sol.final - reference[-1]).max() <= 1e-8


# -- restarts --------------------------------------------------------------------------------------
def test_model_restart_by_another_scheme_is_refused():
    model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2)
    grids = dict(tokens=GaussLegendre(6), features=GaussLegendre(4))

    def u0(x, y):
        return np.cos(3 * y + np.sin(np.pi * x))

    full = model.evolve(u0, rtol=1e-6, scheme="rk4", save_at=SaveAt(steps=True), **grids)
    part = model.evolve(u0, rtol=1e-6, scheme="rk4", save_at=SaveAt(steps=True), **grids)
    k = len(full.times) // 2
    part.times, part.states = part.times[:k + 1], part.states[:k + 1]
    with pytest.raises(ValueError, match="solved with scheme 'rk4', this solve uses 'tsit5'"):
        model.evolve(None, rtol=1e-6, save_at=SaveAt(steps=True), initial=part, **grids)
    rest = model.evolve(None, rtol=1e-6, scheme="rk4", save_at=SaveAt(steps=True), initial=part,
                        **grids)
    np.testing.assert_array_equal(rest.times, full.times[k:])
    np.testing.assert_array_equal(rest.final, full.final)
